"""The README's by-hand SQL of the Transformer studies, run on tiny tables worked out by
hand, beside what ``study analyze`` computes from the same rows."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from analysis import survival as sv
from analysis.db import connect
from analysis.demo import _run_row, _trial_row, _write

README = Path(__file__).resolve().parents[2] / "README.md"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def sql_block_after(marker: str) -> str:
    text = README.read_text()
    match = re.search(r"```sql\n(.*?)```", text[text.index(marker):], re.S)
    assert match, f"no sql block after {marker!r}"
    return match.group(1)


def _study(out: Path, name: str, points: list[tuple[dict[str, Any], dict[str, Any]]],
           rows: dict[tuple[int, int], dict[str, list[dict[str, Any]]]]) -> None:
    """Point i: (its grid point, its flattened config columns); rows[(i, seed)]: its
    ``metrics`` and ``evals`` rows (study, trial_id, seed added here)."""
    for i, (point, columns) in enumerate(points):
        tid = f"{name}-t{i}"
        seeds = sorted(s for p, s in rows if p == i)
        _write(out, "trials", name, f"{tid}-u0", [_trial_row(name, tid, i, point, len(seeds), T0, "t", "m") | columns])
        for s in seeds:
            for table, rs in rows[(i, s)].items():
                _write(out, table, name, f"{tid}-{s}", [{"study": name, "trial_id": tid, "seed": s} | r for r in rs])
            _write(out, "runs", name, f"{tid}-{s}", [_run_row(name, tid, i, s, None, 0, T0)])


def _evals(values: dict[str, tuple[float, float]]) -> dict[str, list[dict[str, Any]]]:
    """exact and oracle_exact per split (role test)."""
    return {"evals": [{"split": sp, "role": "test", "metric": m, "value": v}
                      for sp, pair in values.items() for m, v in zip(("exact", "oracle_exact"), pair, strict=True)]}  # fmt: skip


def test_the_length_headline_query_gives_a_row_per_task_of_a_study(tmp_path: Path) -> None:
    # one study, the grid over task.kind (as configs/zhou2023_length_cpu.yaml runs it whole):
    # N = 2, the band len_3..len_4; (exact, oracle_exact) per split
    out = tmp_path / "results"
    cols = {"task_train_lengths": "[1, 2]"}
    rows = {
        # count: seed 0 band exact (1 + 0.8) / 2 = 0.9 -> generalizes (at the level); seed 1 0.5
        (0, 0): _evals({"len_2": (1, 1), "len_3": (1, 1), "len_4": (0.8, 1)}),
        (0, 1): _evals({"len_2": (1, 1), "len_3": (0.5, 1), "len_4": (0.5, 0.5)}),
        # mode: 1.0 and 0.95, both; len_2 (1N) is outside the band
        (1, 0): _evals({"len_2": (0, 0), "len_3": (1, 1), "len_4": (1, 1)}),
        (1, 1): _evals({"len_2": (0, 0), "len_3": (1, 1), "len_4": (0.9, 1)}),
    }
    _study(out, "zhou2023_tiny_cpu", [({"task.kind": "count"}, cols | {"task_kind": "count"}),
                                      ({"task.kind": "mode"}, cols | {"task_kind": "mode"})], rows)  # fmt: skip
    got = connect(out).sql(sql_block_after("The headline table by hand")).df()
    assert len(got) == 4, got  # (task, decoding); the two tasks were one row of 4 seeds per decoding
    table = {(r.kind, r.metric): (r.seeds, r.generalize, r.share, r.mean_band_exact, r.seeds_that_do)
             for r in got.itertuples()}  # fmt: skip
    assert table[("count", "exact")] == (2, 1, 0.5, 0.7, "0")
    assert table[("count", "oracle_exact")] == (2, 1, 0.5, 0.875, "0")
    assert table[("mode", "exact")] == (2, 2, 1.0, 0.975, "0 1")
    assert table[("mode", "oracle_exact")] == (2, 2, 1.0, 1.0, "0 1")


def _curve(split: str, values: list[float]) -> list[dict[str, Any]]:
    return [{"epoch": None, "step": 50 * (k + 1), "split": split, "role": split, "metric": "accuracy", "value": v}
            for k, v in enumerate(values)]  # fmt: skip


def test_the_grokking_query_and_the_analysis_agree_on_a_hand_table(tmp_path: Path) -> None:
    # train and test accuracy at steps 50, 100, 150, 200 (the budget)
    curves = {
        0: ([0.5, 1.0, 1.0, 1.0], [0.96, 0.5, 0.97, 0.99]),  # test >= 0.95 at 50 before memorizing: groks at 150
        1: ([0.5, 0.99, 1.0, 1.0], [0.1, 0.2, 0.3, 0.4]),  # memorizes at 100, never groks: censored at 200
        2: ([0.5, 0.9, 0.98, 0.98], [0.2, 0.5, 0.9, 0.96]),  # never memorizes: no grokking
        3: ([0.99, 1.0, 1.0, 1.0], [0.5, 0.95, 0.9, 0.99]),  # memorizes at 50, groks at 100 (exactly 0.95)
    }
    rows = {(0, s): {"metrics": _curve("train", tr) + _curve("test", te)} for s, (tr, te) in curves.items()}
    cols = {"train_weight_decay": 1.0, "task_train_fraction": 0.5, "train_max_steps": 200}
    _study(out := tmp_path / "results", "grokking_cpu", [({"train.weight_decay": 1.0}, cols)], rows)
    got = connect(out).sql(sql_block_after("By hand, each run's grokking")).df()
    assert got[["wd", "frac", "seeds", "grokked", "share", "median_step_if_grokked"]].values.tolist() == [
        [1.0, 0.5, 4, 2, 0.5, 125.0]]  # fmt: skip
    # the analysis: the declared event, the same rows
    memorized = {"split": "train", "metric": "accuracy", "op": ">=", "threshold": 0.99}
    groks = sv.event_from_declaration({"name": "groks", "split": "test", "metric": "accuracy", "op": ">=",
                                       "threshold": 0.95, "after": memorized}, "events[1]")  # fmt: skip
    m = connect(out).sql("SELECT trial_id, seed, split, step AS time, value FROM metrics").df()
    runs = pd.DataFrame({"point": "p", "trial_id": "grokking_cpu-t0", "seed": range(4), "status": "ok",
                         "budget": 200.0, "early_stop": False})  # fmt: skip
    o = sv.run_outcomes(m[m["split"] == "test"], runs, groks, m[m["split"] == "train"])
    assert {r.seed: (r.outcome, r.time) for r in o.itertuples()} == {
        0: ("event", 150), 1: ("budget", 200), 2: ("budget", 200), 3: ("event", 100)}  # fmt: skip
    summary, _ = sv.event_summary(o)
    # KM: S(100) = 3/4, S(150) = 3/4 * 2/3 = 1/2: the median counts the censored runs (150,
    # where the SQL's median among the runs that grokked is 125); half reached by the budget
    assert (summary["median"].iloc[0], summary["reached"].iloc[0]) == (150.0, pytest.approx(0.5))
    assert summary["censored_budget"].tolist() == [2]
