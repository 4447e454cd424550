"""Experiment trackers (``execution.loggers``) and Optuna's learning curves, on real runs.

A tiny study (3 seeds in bundles of 2) runs through the CLI on a real local Ray with
``loggers: [tensorboard]``; its event files are read back with TensorBoard's own
``EventAccumulator`` and compared with the ``metrics`` Parquet table (one run per seed,
every split x metric at every epoch). A restored trial is driven directly through Tune's
Trainable API: its seeds' runs start afresh and hold each epoch once. A tiny tuning study
names its objective in Optuna and reports every candidate's per-epoch objective as
intermediate values, equal to the mean over its seeds in Parquet. Bad ``loggers`` are
refused before Ray starts.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests_support import TINY_STUDY

from analysis.db import connect

LOGGED: dict[str, Any] = {
    **TINY_STUDY,
    "name": "tracked",
    "train": {**TINY_STUDY["train"], "curve_splits": ["val", "val_ood"]},
    "execution": {**TINY_STUDY["execution"], "bundle_size": 2, "loggers": ["tensorboard"]},
}


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    keep = ("HOME", "PYTHONPATH", "VIRTUAL_ENV", "LANG", "PATH")
    env = {"RAY_USAGE_STATS_ENABLED": "0", **{k: v for k, v in os.environ.items() if k in keep}}
    res = subprocess.run(
        [sys.executable, "-m", "study.cli", *args], capture_output=True, text=True, timeout=600, env=env
    )
    if check and res.returncode != 0:
        raise AssertionError(f"study {' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


def parquet_curves(out: Path, study: str) -> dict[tuple[str, int], dict[str, dict[int, float]]]:
    """(trial_id, seed) -> ``split/metric`` -> epoch -> value, from the committed metrics."""
    con = connect(out, studies=[study])
    try:
        rows = con.execute(
            "SELECT trial_id, seed, split, metric, epoch, value FROM metrics WHERE study = ?", [study]
        ).fetchall()
    finally:
        con.close()
    curves: dict[tuple[str, int], dict[str, dict[int, float]]] = {}
    for trial_id, seed, split, metric, epoch, value in rows:
        curves.setdefault((trial_id, seed), {}).setdefault(f"{split}/{metric}", {})[epoch] = value
    return curves


def event_curves(logdir: Path) -> dict[str, dict[int, float]]:
    """``tag`` -> step -> value of one TensorBoard run folder (every step once, else fail)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    curves: dict[str, dict[int, float]] = {}
    for tag in acc.Tags()["scalars"]:
        events = acc.Scalars(tag)
        steps = [e.step for e in events]
        assert len(steps) == len(set(steps)), f"{logdir} logs a step of {tag} twice: {steps}"
        curves[tag] = {e.step: e.value for e in events}
    return curves


def assert_same_curves(logged: dict[str, dict[int, float]], committed: dict[str, dict[int, float]]) -> None:
    assert set(logged) == set(committed), "the tracker run lacks (or adds) a split/metric"
    for tag, by_epoch in committed.items():
        assert sorted(logged[tag]) == sorted(by_epoch), tag
        for epoch, value in by_epoch.items():  # TensorBoard stores float32
            assert logged[tag][epoch] == pytest.approx(value, rel=1e-6, abs=1e-7), (tag, epoch)


# ------------------------------------------------------------------- a real study via the CLI
@pytest.fixture(scope="module")
def tracked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trackers")
    cfg, out = root / "tracked.yaml", root / "results"
    cfg.write_text(yaml.safe_dump(LOGGED))
    cli("run", str(cfg), "--out", str(out), "--num-cpus", "2")
    return out


def test_tensorboard_holds_one_run_per_seed_equal_to_parquet(tracked: Path) -> None:
    committed = parquet_curves(tracked, "tracked")
    assert sorted(seed for _, seed in committed) == [0, 1, 2]
    (trial_id,) = {t for t, _ in committed}
    root = tracked / "tracked" / "tensorboard"
    assert sorted(p.name for p in root.iterdir()) == [trial_id], "runs are grouped by config"
    runs = sorted(p.name for p in (root / trial_id).iterdir())
    assert runs == ["seed-0", "seed-1", "seed-2"], "one run per seed, not per bundle"
    for seed in (0, 1, 2):
        logdir = root / trial_id / f"seed-{seed}"
        assert len(list(logdir.glob("events.out.tfevents.*"))) == 1
        logged = event_curves(logdir)
        assert_same_curves(logged, committed[(trial_id, seed)])
        assert sorted(logged["val/accuracy"]) == [1, 2]  # max_epochs 2: every epoch
        assert {"train/objective", "val/loss", "val_ood/accuracy", "val_ood/exact"} <= set(logged)


def test_tensorboard_run_is_tagged_with_its_seed_sources(tracked: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    con = connect(tracked, studies=["tracked"])
    try:
        run = con.execute(
            "SELECT trial_id, init_seed, order_seed, data_seed FROM runs WHERE seed = 1"
        ).fetchone()
    finally:
        con.close()
    assert run is not None
    acc = EventAccumulator(str(tracked / "tracked" / "tensorboard" / run[0] / "seed-1"))
    acc.Reload()
    (tag,) = acc.Tags()["tensors"]
    text = acc.Tensors(tag)[0].tensor_proto.string_val[0].decode()
    for needle in (f"| fineline.init_seed | {run[1]} |", f"| fineline.order_seed | {run[2]} |",
                   f"| fineline.data_seed | {run[3]} |", "| fineline.task | symbol_rewriting |",
                   "| fineline.model | seq2seq |", "| fineline.study | tracked |", "| seed | 1 |"):
        assert needle in text, needle


# ------------------------------------------------------------------- a restored trial
@pytest.fixture()
def trainables(torch_threads: None) -> Iterator[list[Any]]:
    made: list[Any] = []
    yield made
    for t in made:
        t.stop()
        shutil.rmtree(t.logdir, ignore_errors=True)


def test_restored_trial_starts_its_seed_runs_afresh(tmp_path: Path, trainables: list[Any]) -> None:
    from study.config import parse
    from study.plan import plan_units, unit_payload
    from trainables.trainable import FinelineTrainable

    raw = {**LOGGED, "name": "restored", "seeds": {**LOGGED["seeds"], "count": 2}}
    raw["train"] = {**raw["train"], "max_epochs": 3, "selection": {"early_stop": False}}
    cfg, out = parse(raw), tmp_path / "results"
    (out / "restored").mkdir(parents=True)  # the driver creates OUT/<study> before launching
    (unit,) = [unit_payload(u, cfg, out, "restored", "cpu", {}) for u in plan_units(cfg, out, "restored", "cpu", 1)[0]]
    assert [lg["name"] for lg in unit["loggers"]] == ["tensorboard"]
    unit = {**unit, "report_every_s": 0.001}  # one epoch per step

    first = FinelineTrainable(config={"unit": unit})
    trainables.append(first)
    first.train()
    saved = first.save(str(tmp_path / "checkpoint"))
    first.train()  # epoch 2 is logged, then the trial dies before its next checkpoint
    first.stop()
    logdir = out / "restored" / "tensorboard" / unit["trial_id"] / "seed-0"
    assert sorted(event_curves(logdir)["val/accuracy"]) == [1, 2]

    second = FinelineTrainable(config={"unit": unit})  # a fresh actor, as after a crash
    trainables.append(second)
    second.restore(saved)
    while not second.train().get("done"):
        pass
    committed = parquet_curves(out, "restored")
    for seed in (0, 1):
        logdir = out / "restored" / "tensorboard" / unit["trial_id"] / f"seed-{seed}"
        assert len(list(logdir.glob("events.out.tfevents.*"))) == 1, "the crashed run's file was kept"
        logged = event_curves(logdir)  # every step once
        assert sorted(logged["val/accuracy"]) == [1, 2, 3]
        assert_same_curves(logged, committed[(unit["trial_id"], seed)])


# ------------------------------------------------------------------- refusals before Ray
MISSING = next((n for n in ("aim", "wandb", "mlflow") if importlib.util.find_spec(n) is None), None)


@pytest.mark.parametrize(
    ("loggers", "needles"),
    [
        (["tensorbord"], ["execution.loggers", "unknown logger 'tensorbord'", "tensorboard, wandb"]),
        pytest.param(
            [MISSING or "aim"], ["execution.loggers", f"pip install {MISSING}", "not installed"],
            marks=pytest.mark.skipif(MISSING is None, reason="aim, wandb and mlflow are all installed"),
        ),
    ],
)
def test_bad_loggers_are_refused_before_ray(tmp_path: Path, loggers: list[str], needles: list[str]) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump({**LOGGED, "execution": {**LOGGED["execution"], "loggers": loggers}}))
    out = tmp_path / "results"
    res = cli("run", str(cfg), "--out", str(out), check=False)
    assert res.returncode == 2, res.stderr
    assert "Fix:" in res.stderr and all(n in res.stderr for n in needles), res.stderr
    assert "ray" not in res.stderr.lower().replace("array", "")
    assert not out.exists()


# ------------------------------------------------------------------- Optuna learning curves
@pytest.mark.slow  # ~16 s: a tuning study; trackers of a seed study stay in the default run
def test_tuning_names_its_objective_and_reports_learning_curves(tmp_path: Path) -> None:
    import optuna

    from study import manifest
    from study.tuning import storage_url

    raw = {
        **LOGGED, "name": "curves",
        "execution": {**LOGGED["execution"], "report_every_s": 0.001},  # a result per epoch
        "train": {**LOGGED["train"], "max_epochs": 3, "selection": {"early_stop": False}},
        "tune": {
            "space": {"train.lr": {"low": 0.01, "high": 1.0, "log": True}},
            "objective": {"split": "val_ood", "metric": "loss"},
            "seeds_per_candidate": 2, "trials": 2, "sequential": True,
        },
    }
    cfg, out = tmp_path / "curves.yaml", tmp_path / "results"
    cfg.write_text(yaml.safe_dump(raw))
    cli("tune", str(cfg), "--out", str(out), "--num-cpus", "1")
    study = optuna.load_study(study_name="curves", storage=storage_url(out, "curves"))
    assert study.metric_names == ["val_ood/loss (mean over seeds)"]
    committed = parquet_curves(out, "curves")
    done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(done) == 2
    for t in done:
        trial_id = t.user_attrs["trial_id"]
        per_seed = [committed[(trial_id, s)]["val_ood/loss"] for s in (0, 1)]
        assert sorted(t.intermediate_values) == [1, 2, 3]
        for epoch, value in t.intermediate_values.items():
            assert value == pytest.approx((per_seed[0][epoch] + per_seed[1][epoch]) / 2, rel=1e-12)
        # each candidate's seeds are tracker runs too, grouped by the candidate's config
        seeds = sorted(p.name for p in (out / "curves" / "tensorboard" / trial_id).iterdir())
        assert seeds == ["seed-0", "seed-1"]
    recorded = manifest.read(out, "curves")
    assert recorded is not None and recorded["config"]["execution"]["loggers"] == ["tensorboard"]


def test_searcher_reports_each_curve_step_once_pruned_candidates_included(tmp_path: Path) -> None:
    """In-process (the searcher only sees results): a restored trial resends its curve, and a
    candidate ASHA stops gets its last points from the result Tune hands on_trial_complete."""
    import optuna

    from study.config import parse
    from study.tuning import candidate_template, ray_classes, storage_url, tune_block

    raw = {**LOGGED, "name": "searched", "tune": {"space": {"train.lr": {"low": 0.01, "high": 1.0}},
                                                  "objective": {"split": "val_ood", "metric": "loss"}}}
    cfg = parse(raw)
    block = tune_block(cfg)
    (tmp_path / "searched").mkdir()
    storage = optuna.storages.RDBStorage(storage_url(tmp_path, "searched"))
    search_cls, _ = ray_classes()
    searcher = search_cls(block, candidate_template(cfg, block, "searched", tmp_path), storage)
    searcher.suggest("a")
    searcher.on_trial_result("a", {"objective": 3.0, "objective_curve": [[1, 3.0], [2, 2.5]]})
    restored = {"objective": 2.0, "objective_curve": [[1, 3.0], [2, 2.5], [3, 2.0]]}
    searcher.on_trial_result("a", restored)  # a restored actor sends its whole curve again
    searcher.on_trial_complete("a", {"objective": 1.5, "epoch": 4, "objective_curve": [[4, 1.5]]})
    (trial,) = optuna.load_study(study_name="searched", storage=storage).get_trials()
    assert trial.state == optuna.trial.TrialState.PRUNED
    assert trial.intermediate_values == {1: 3.0, 2: 2.5, 3: 2.0, 4: 1.5}
