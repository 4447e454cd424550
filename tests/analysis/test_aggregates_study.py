"""El-Naggar et al.'s declared aggregates end to end: a tiny real Dyck-1 study (2 cells x 2
seeds, 3 epochs, short strings) on a real local Ray through the CLI, then
``study analyze --format json`` and the report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats as sps

from trainables.tasks.dyck import Dyck1, Dyck1Config, trivial_failure

pytestmark = pytest.mark.slow  # a study through the CLI, minutes: run with -m slow

TASK = {"name": "dyck1", "train_size": 48, "val_size": 24, "min_len": 2, "max_len": 20,
        "long_size": 12, "long_min_len": 22, "long_max_len": 40, "very_long_size": 4,
        "very_long_len": 120, "zigzag_len": 120, "zigzag_js": [60, 10]}  # fmt: skip
STUDY: dict[str, Any] = {
    "name": "dyck_tiny",
    "task": TASK,
    "model": {"name": "rnn_tagger", "hidden_size": 1},
    "train": {"optimizer": "adam", "lr": 0.01, "batch_size": 1, "clip_norm": None,
              "loss_reduction": "mean", "max_epochs": 3, "curve_splits": ["train", "val", "long"],
              "snapshot_epochs": [1, 2, 3], "selection": {"split": "val", "metric": "loss", "mode": "min"}},
    "grid": {"model.cell": {"lstm": {}, "relu": {}}},
    "seeds": {"count": 2, "root": 3},
    "execution": {"bundle_size": "auto"},
}  # fmt: skip
SPLITS = ("train", "val", "long", "very_long", "zigzag")


def study(*args: str) -> str:
    keep = ("HOME", "PYTHONPATH", "VIRTUAL_ENV", "LANG")
    env = {"RAY_USAGE_STATS_ENABLED": "0", "PATH": "/usr/bin:/bin"}
    env |= {k: v for k, v in __import__("os").environ.items() if k in keep}
    res = subprocess.run([sys.executable, "-m", "study.cli", *args], capture_output=True,
                         text=True, timeout=600, env=env)  # fmt: skip
    assert res.returncode == 0, f"study {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}"
    return res.stdout


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dyck_aggregates")
    cfg = root / "dyck_tiny.yaml"
    cfg.write_text(yaml.safe_dump(STUDY))
    study("run", str(cfg), "--out", str(root / "results"), "--num-cpus", "2")
    return root / "results"


def _table(out: Path, name: str) -> pd.DataFrame:
    return pd.read_parquet(out / "tables" / name, partitioning=None)


def _trivial(out: Path) -> dict[str, float]:
    """The trivial predictor's FPF per split, computed here from the study's own data."""
    (data_seed,) = set(_table(out, "runs")["data_seed"])
    built = Dyck1(Dyck1Config(**{k: v for k, v in TASK.items() if k != "name"})).build(int(data_seed))
    return {s: float(trivial_failure(built.splits[s].data.y).mean()) for s in SPLITS}


def test_analyze_json_holds_the_three_aggregates(out: Path) -> None:
    doc = json.loads(study("analyze", "dyck_tiny", "--out", str(out), "--format", "json"))
    best, reg, base = doc["aggregates"]
    assert [best["kind"], reg["kind"], base["kind"]] == ["best_k", "checkpoint_regression", "baseline"]
    trivial = _trivial(out)
    evals = _table(out, "evals").merge(
        _table(out, "trials")[["trial_id", "model_cell"]].drop_duplicates(), on="trial_id"
    )
    evals["point"] = "cell=" + evals["model_cell"]
    fpf = evals[evals["metric"] == "fpf"]
    # baseline: the trivial FPF per (cell, split), recomputed from the data, and who beats it
    assert {(r["point"], r["split"]) for r in base["rows"]} == {
        (p, s) for p in ("cell=lstm", "cell=relu") for s in SPLITS
    }
    for r in base["rows"]:
        assert r["baseline"] == pytest.approx(trivial[r["split"]])
        assert r["baseline_min"] == r["baseline_max"] == pytest.approx(r["baseline"])  # one dataset
        runs = fpf[(fpf["point"] == r["point"]) & (fpf["split"] == r["split"])]["value"]
        assert r["runs"] == 2 and r["mean"] == pytest.approx(runs.mean())
        assert r["beat"] == int((runs > trivial[r["split"]]).sum())
        assert 0 <= r["mean"] <= {"long": 40, "very_long": 120, "zigzag": 120}.get(r["split"], 20)
    # best k: k = 10 of 2 runs keeps both; the FPF rows carry the trivial FPF beside them
    rows = {(r["point"], r["split"], r["metric"]): r for r in best["rows"]}
    assert len(rows) == 2 * 5
    for (point, split, metric), r in rows.items():
        assert (r["kept"], r["runs"], r["selected"]) == (2, 2, False)
        sel = evals[(evals["point"] == point) & (evals["split"] == split) & (evals["metric"] == metric)]
        assert r["mean"] == pytest.approx(sel["value"].mean()) == pytest.approx(r["mean_all"])
        expected = trivial[split] if metric == "fpf" else None
        assert r["baseline"] == (None if expected is None else pytest.approx(expected))
    # checkpoint regression: per cell and x, 2 runs x 3 snapshot epochs, checked against scipy
    metrics = _table(out, "metrics").merge(
        _table(out, "trials")[["trial_id", "model_cell"]].drop_duplicates(), on="trial_id"
    )
    assert [(r["point"], r["x"]) for r in reg["rows"]] == [
        (p, f"-log({s} loss)") for p in ("cell=lstm", "cell=relu") for s in ("train", "val", "long")
    ]
    for r in reg["rows"]:
        assert (r["n"], r["runs"], r["y"]) == (6, 2, "very_long fpf")
        assert r["y_baseline"] == pytest.approx(trivial["very_long"])
        m = metrics[metrics["model_cell"] == r["point"].removeprefix("cell=")]
        split = r["x"].removeprefix("-log(").removesuffix(" loss)")
        x = m[(m["split"] == split) & (m["metric"] == "loss")].set_index(["seed", "step"])["value"]
        y = m[(m["split"] == "very_long") & (m["metric"] == "fpf")].set_index(["seed", "step"])["value"]
        x, y = x.loc[y.index], y  # the snapshot epochs: where very_long was evaluated
        fit = sps.linregress(-np.log(x.to_numpy()), y.to_numpy())
        assert r["slope"] == pytest.approx(fit.slope, abs=1e-9)
        assert r["sign"] == ("+" if fit.slope > 0 else "-" if fit.slope < 0 else "0")
        if np.ptp(y.to_numpy()) > 0:
            assert r["r2"] == pytest.approx(fit.rvalue**2) and r["p"] == pytest.approx(fit.pvalue)
    text = study("analyze", "dyck_tiny", "--out", str(out))
    for kind in ("best_k", "checkpoint_regression", "baseline"):
        assert f"Declared aggregate ({kind})" in text


def test_report_shows_the_aggregates_and_the_trivial_fpf_beside_fpf_charts(out: Path) -> None:
    from analysis.report import build_report

    report = build_report(out, "dyck_tiny", n_boot=200, quiet=True)
    assert "id='aggregates'" in report.header and "fpf_trivial" in report.header
    names = [p.name for p in report.panels]
    for name in ("histogram-very_long-fpf", "best-k-very_long-fpf", "checkpoint-regression-val-loss"):
        assert name in names
    label = f"trivial predictor (depth > 0 at every step): {_trivial(out)['very_long']:.4g}"
    for p in report.panels:
        if "very_long-fpf" in p.name or p.name.startswith("checkpoint-regression"):
            spec = json.dumps(report.store.embed(p.chart.to_dict()))
            assert label in spec, p.name  # a labelled rule at the trivial FPF
