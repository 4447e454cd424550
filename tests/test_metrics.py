"""Declared metrics (trainables.metrics): how a metric reads decides selection, the tuning
direction, the analysis's "better" and the range an interval stays in.

Before, a task could not say that lower is better: an ``mse`` was maximised by ``study
tune``, kept at its worst epoch by ``selection: {metric: mse}`` (mode max by default), and
the verdict named the config with 6x the error "Best" (the plugin probe's findings)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from analysis.manifest import guessed_sense, parse_declarations
from analysis.verdict import best_clause, compare_configs
from study.config import parse
from study.tuning_config import tune_block
from trainables.errors import ConfigError
from trainables.metrics import LOSS, Metric, check_values, declared
from trainables.plugins import PluginError
from trainables.registry import TASKS
from trainables.spec import RunSpec

PLUGINS = Path(__file__).resolve().parent / "plugins"


@pytest.fixture()
def misses() -> Iterator[Any]:
    """The ``misses`` task (tests/plugins/misses_task.py) registered in this process, then removed."""
    sys.path.insert(0, str(PLUGINS))
    try:
        yield importlib.import_module("misses_task")
    finally:
        TASKS._items.pop("misses", None)
        sys.modules.pop("misses_task", None)
        sys.path.remove(str(PLUGINS))


def spec(task: str, model: str = "mlp", **train: Any) -> RunSpec:
    return RunSpec.from_dict({"task": {"name": task}, "model": {"name": model, "hidden": [4]}, "train": train})


# --------------------------------------------------------------------------- declarations
def test_a_bare_name_is_a_share_and_an_error_like_bare_name_is_refused() -> None:
    d = declared(["accuracy", "loss", Metric("mse", better="lower", high=None)])
    assert d["accuracy"] == Metric("accuracy") and d["accuracy"].share and d["accuracy"].mode == "max"
    assert d["loss"] == LOSS and (LOSS.mode, LOSS.direction) == ("min", "minimize")
    assert not d["mse"].share and d["mse"].direction == "minimize"
    for bare in ("mse", "val_error", "word-err"):
        with pytest.raises(PluginError, match=rf"metric '{bare}' is a bare name.*Metric\('{bare}', better='lower'"):
            declared([bare])
    with pytest.raises(PluginError, match="declared twice"):
        declared(["accuracy", Metric("accuracy")])
    with pytest.raises(PluginError, match="low 1 is not below high 0"):
        Metric("x", low=1, high=0)


def test_values_outside_the_declared_range_are_named_with_the_fix() -> None:
    d = declared(["accuracy", Metric("margin", low=None, high=None)])
    assert check_values(d, "accuracy", np.array([0.0, 1.0, np.nan]), "split 'val'") is None  # NaN: a divergence
    assert check_values(d, "margin", np.array([-40.0, 9.0]), "split 'val'") is None
    line = check_values(d, "accuracy", np.array([0.5, 2.25, -1.0]), "split 'val'")
    assert line is not None and line.startswith("split 'val': metric 'accuracy' gave 2.25, -1 (2 value(s)) outside "
                                                "its range [0, 1]. Fix: declare it in the task's `metrics` as Metric(")


def test_a_task_registering_an_undeclared_error_or_a_primary_outside_its_metrics_is_refused(misses: Any) -> None:
    class Bare(misses.Misses):
        name = "bare_mse"
        primary_metric = "mse"
        metrics = ("mse",)

    class Lost(misses.Misses):
        name = "lost_primary"
        primary_metric = "accuracy"

    with pytest.raises(PluginError, match="metric 'mse' is a bare name"):
        TASKS.register(Bare)
    with pytest.raises(PluginError, match=r"primary_metric 'accuracy' is not in its metrics \(miss, margin\)"):
        TASKS.register(Lost)
    assert "bare_mse" not in TASKS.names() and "lost_primary" not in TASKS.names()


# --------------------------------------------------------------------------- selection and tuning
def test_selection_follows_the_declared_metric_and_refuses_its_worst_epoch(misses: Any) -> None:
    sel = spec("misses").train.selection  # no accuracy: the primary metric, the way it is better
    assert (sel.metric, sel.mode) == ("miss", "min")
    assert spec("misses", selection={"metric": "margin"}).train.selection.mode == "max"
    assert spec("misses", selection={"metric": "loss"}).train.selection.mode == "min"
    with pytest.raises(ConfigError) as info:
        spec("misses", selection={"metric": "miss", "mode": "max"})
    assert info.value.field == "train.selection.mode"
    assert str(info.value) == ("train.selection.mode: max keeps the epoch where miss is worst: misses with mlp "
                               "declares that lower miss is better. Fix: use mode: min, or leave mode unset "
                               "(it follows the metric)")
    # a task with accuracy resolves as before (the trial_ids of shipped configs are pinned elsewhere)
    sel = RunSpec.from_dict({"task": {"name": "symbol_rewriting"}, "model": {"name": "seq2seq"}}).train.selection
    assert (sel.metric, sel.mode) == ("accuracy", "max")


def test_tuning_minimises_a_declared_error_by_default_and_refuses_to_maximise_it(misses: Any) -> None:
    base = {"name": "t", "task": {"name": "misses"}, "model": {"name": "mlp", "hidden": [4]},
            "tune": {"objective": {"split": "val_ood", "metric": "miss"}, "trials": 2,
                     "space": {"train.lr": {"low": 0.001, "high": 0.1, "log": True}}}}  # fmt: skip
    assert tune_block(parse(base)).direction == "minimize"
    bare = {**base, "tune": {**base["tune"], "objective": {"split": "val_ood"}}}  # no accuracy: the primary metric
    assert (tune_block(parse(bare)).objective.metric, tune_block(parse(bare)).direction) == ("miss", "minimize")
    margin = {**base, "tune": {**base["tune"], "objective": {"split": "val_ood", "metric": "margin"}}}
    assert tune_block(parse(margin)).direction == "maximize"
    with pytest.raises(ConfigError) as info:
        tune_block(parse({**base, "tune": {**base["tune"], "direction": "maximize"}}))
    assert info.value.field == "tune.direction" and "maximize would search for the worst config" in str(info.value)


# --------------------------------------------------------------------------- analysis
def test_the_manifest_declaration_decides_which_config_is_better_and_the_range() -> None:
    """Worked by hand: mse of two configs, 3 runs each. Declared lower-better, the config with
    the smaller mean is better; the name alone ("mse" has no loss-like part) guessed the other
    way. Declared unbounded, the difference's interval is Welch's own; a [0, 1] metric's is
    clipped to +-1."""
    decl = parse_declarations({"metrics": {"mse": {"better": "lower", "low": 0.0, "high": None},
                                           "acc": {"better": "higher", "low": 0, "high": 1},
                                           "wrongness": {"better": "lower", "low": 0, "high": None}}})  # fmt: skip
    mse, acc = decl.sense("mse"), decl.sense("acc")
    assert not mse.higher_is_better and mse.declared
    # the declaration wins over the name's guess (a name no list knows is guessed higher-better)
    assert guessed_sense("wrongness").higher_is_better and not decl.sense("wrongness").higher_is_better
    assert (mse.span, acc.span, acc.unit) == (None, 1.0, True)
    assert decl.sense("val_loss") == guessed_sense("val_loss") and not decl.sense("val_loss").higher_is_better
    bad = parse_declarations({"metrics": {"x": {"better": "up"}}})
    assert bad.metrics == {} and bad.unknown == ("metrics.x (not {better, low, high})",)

    runs = pd.DataFrame({"point": ["small"] * 3 + ["large"] * 3, "split": "test",
                         "value": [0.02, 0.03, 0.025, 0.14, 0.15, 0.13]})  # fmt: skip
    row = compare_configs(runs, ["test"], higher_is_better=mse.higher_is_better, span=mse.span).iloc[0]
    assert (row["better"], row["worse"]) == ("small", "large")
    assert row["diff"] == pytest.approx(0.025 - 0.14)
    assert best_clause(compare_configs(runs, ["test"], higher_is_better=False, span=None)).startswith(
        " Best: small over large by -0.115 [") and "(lower is better)" in best_clause(
        compare_configs(runs, ["test"], higher_is_better=False, span=None))
    far = pd.DataFrame({"point": ["a"] * 3 + ["b"] * 3, "split": "test", "value": [1.0, 0.9, 1.0, 0.0, 0.05, 0.0]})
    assert compare_configs(far, ["test"], span=1.0).loc[0, "diff_high"] == 1.0
    assert compare_configs(far, ["test"], span=None).loc[0, "diff_high"] > 1.0  # an unbounded metric: not clipped


# --------------------------------------------------------------------------- regression
def test_a_regression_task_takes_a_regressor_and_says_which_when_given_a_classifier() -> None:
    """Before, a real-valued target was refused ("labels that are not whole numbers"), and the
    plugin probe carried it as the last input column; now a task says ``data_kind = "regress"``."""
    with pytest.raises(ConfigError) as info:
        RunSpec.from_dict({"task": {"name": "sine"}, "model": {"name": "mlp"}})
    assert info.value.field == "model.name" and "use a model for this task: mlp_regressor" in str(info.value)
    s = RunSpec.from_dict({"task": {"name": "sine"}, "model": {"name": "mlp_regressor"}})
    assert (s.train.selection.metric, s.train.selection.mode) == ("mse", "min")
    task = s.make_task()
    data = task.build(3)
    split = data.splits["test_ood"]
    x, y = split.data.x, split.data.y  # type: ignore[union-attr]
    assert x.shape == (256, 1) and y.dtype == np.float32 and np.allclose(y, np.sin(x[:, 0]), atol=1e-6)
    assert (x.min() >= 4.0, x.max() <= 5.0) == (True, True)
    assert task.render_example(data, split, 0) == ("", f"{float(y[0]):.4g}")
    scored = task.score(split, [np.array([v + 0.5], dtype=np.float32) for v in y])  # every output 0.5 too high
    assert np.allclose(scored["mse"], 0.25) and np.allclose(scored["mae"], 0.5)


def test_the_profile_and_a_baseline_read_a_lower_is_better_metric_its_way() -> None:
    """By hand: errors 0.1, 0.2, 0.4 of one config. Fraction below tau: 0 at 0.1, 1/3 at 0.2,
    2/3 at 0.4, then 1 just past the worst (before, the 1 came first and the curve ended at
    2/3). Against a baseline error of 0.3 each, two runs beat it (below), not one (above)."""
    from analysis.aggregates import baseline_summary
    from analysis.bands import performance_profile
    from analysis.queries import higher_is_better

    vals = pd.DataFrame({"point": "p", "value": [0.4, 0.1, 0.2]})
    prof = performance_profile(vals, higher_is_better=False)
    assert list(zip(prof["tau"], prof["fraction"], strict=True)) == [
        (0.1, 0.0), (0.2, pytest.approx(1 / 3)), (0.4, pytest.approx(2 / 3)), (0.4, 1.0)]
    up = performance_profile(vals, higher_is_better=True)
    assert list(up["fraction"])[:2] == [1.0, pytest.approx(2 / 3)] and list(up["tau"])[:2] == [0.1, 0.1]
    runs = pd.DataFrame({"point": "p", "split": "test", "trial_id": "t", "seed": [0, 1, 2] * 2,
                         "metric": ["mse"] * 3 + ["mse_trivial"] * 3, "value": [0.4, 0.1, 0.2, 0.3, 0.3, 0.3]})  # fmt: skip
    low = baseline_summary(runs, "mse", "mse_trivial", higher_is_better=False).iloc[0]
    assert (low["beat"], low["share_beat"]) == (2, pytest.approx(2 / 3))
    assert baseline_summary(runs, "mse", "mse_trivial").iloc[0]["beat"] == 1
    assert not higher_is_better("test_mse") and not higher_is_better("mae") and higher_is_better("accuracy")
