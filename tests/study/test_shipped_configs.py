"""Every study file shipped in configs/ parses, validates and plans."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from study.config import parse
from study.plan import plan_units
from trainables.registry import MODELS

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_there_are_shipped_configs() -> None:
    assert {"quickstart.yaml", "weber2018.yaml", "elnaggar2022.yaml", "sutskever2014.yaml"} <= {
        c.name for c in CONFIGS
    }


@pytest.mark.parametrize("path", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_config_parses_and_plans(path: Path, tmp_path: Path) -> None:
    raw = yaml.safe_load(path.read_text())
    cfg = parse(raw)
    assert cfg.points, "a study needs at least one point"
    for point in cfg.points:
        point.spec.make_task()  # the task accepts its config
        assert MODELS.get(point.spec.model_name).data_kind == type(point.spec.make_task()).data_kind
    units, planned, _ = plan_units(cfg, tmp_path, path.stem, "cpu", 2)
    assert planned == sum(p.seeds.count for p in cfg.points)
    assert sum(len(u.seeds) for u in units) == planned
