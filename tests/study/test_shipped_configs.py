"""Every study file shipped in configs/ parses, validates and plans."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from study.config import parse
from study.plan import plan_units
from study.runner import check_device, resolve_device, unused_gpu_note
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
    check_device(cfg)  # a cuda study asks Ray for GPUs
    units, planned, _ = plan_units(cfg, tmp_path, path.stem, "cpu", 2)
    assert planned == sum(p.seeds.count for p in cfg.points)
    assert sum(len(u.seeds) for u in units) == planned


# The studies written for a GPU (their comments say which published scale they follow).
GPU_STUDIES = ["grokking_gpu", "zhou2023_length_gpu", "zhou2023_hints_gpu"]


@pytest.mark.parametrize("name", GPU_STUDIES)
def test_a_gpu_study_trains_on_gpus_scheduled_by_ray(name: str) -> None:
    """``device: auto`` without ``gpus_per_trial`` resolves to the CPU, and ``device: cuda``
    without it is refused: a GPU study must say both."""
    cfg = parse(yaml.safe_load((CONFIGS[0].parent / f"{name}.yaml").read_text()))
    assert resolve_device(cfg) == "cuda"
    assert cfg.execution.gpus_per_trial > 0


def test_gpus_ray_has_but_an_auto_study_leaves_unused_are_noted() -> None:
    raw = yaml.safe_load((CONFIGS[0].parent / "quickstart.yaml").read_text())
    raw["execution"]["device"] = "auto"
    cfg = parse(raw)
    assert resolve_device(cfg) == "cpu"
    note = unused_gpu_note(cfg, {"CPU": 16, "GPU": 2})
    assert note is not None and "2 GPU(s)" in note and "execution.gpus_per_trial=1" in note
    assert unused_gpu_note(cfg, {"CPU": 16}) is None  # no GPU: nothing to say
    raw["execution"]["gpus_per_trial"] = 1
    assert resolve_device(parse(raw)) == "cuda"
    assert unused_gpu_note(parse(raw), {"CPU": 16, "GPU": 2}) is None
    raw["execution"].update(device="cpu", gpus_per_trial=0)
    assert unused_gpu_note(parse(raw), {"CPU": 16, "GPU": 2}) is None  # the CPU chosen on purpose


def test_the_plugin_docs_study_file_parses() -> None:
    """docs/plugins.md's shortened study file of the example plugin (installed by .ci/run)."""
    import re

    from trainables.registry import TASKS

    if "parity" not in {t.name for t in TASKS}:
        pytest.skip("the example plugin (examples/parity_plugin) is not installed")
    doc = (CONFIGS[0].parents[1] / "docs" / "plugins.md").read_text()
    block = re.search(r"```yaml\n(name: parity\n.*?)```", doc, re.S)
    assert block, "no study file of the example in docs/plugins.md"
    cfg = parse(yaml.safe_load(block.group(1)))
    assert [p.spec.train.lr for p in cfg.points] == [0.001, 0.003]
    assert (cfg.points[0].spec.task_name, cfg.points[0].spec.model_name) == ("parity", "parity_mlp")


def test_a_study_whose_plugin_is_gone_names_where_it_came_from() -> None:
    """``study resume`` / ``eval`` / ``run --from-best`` parse the recorded config: a task
    no longer registered is refused with the source the manifest recorded."""
    from study.manifest import parse_recorded
    from trainables.errors import ConfigError

    raw = yaml.safe_load((CONFIGS[0].parent / "quickstart.yaml").read_text())
    raw["task"] = {"name": "gone_task"}
    m = {"plugins": {"task gone_task": "gone.Task (entry point 'gone' of gone-pkg 1.0)",
                     "model seq2seq": "trainables.models.seq2seq.Seq2Seq (entry point 'seq2seq' of fineline 0.1.0)"}}
    with pytest.raises(ConfigError) as err:
        parse_recorded(m, raw, None)
    assert err.value.field == "task.name"
    assert "this study ran task gone_task from gone.Task (entry point 'gone' of gone-pkg 1.0)" in str(err.value)
    assert "seq2seq" not in err.value.problem.split("this study ran")[1]  # still registered: not named
    assert "install that package again" in err.value.fix
