"""Ensembles of seeds and extreme simplicity bias (analysis.ensembles) on hand-made tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.aggregates import KINDS, parse_aggregates
from analysis.ensembles import EnsembleAUC, ExtremeSB, auc, ensemble_aucs, extreme_sb
from analysis.errors import AnalysisError


def test_auc_hand_cases() -> None:
    # positives 0.35 (beats 0.1: 1 of 3 negatives) and 0.8 (beats 0.1, 0.4, ties 0.8: 2.5 of 3)
    assert auc([0.1, 0.4, 0.35, 0.8, 0.8], [False, False, True, True, False]) == pytest.approx(
        3.5 / 6
    )
    assert auc([2.0, 1.0], [True, False]) == 1.0
    assert auc([1.0, 2.0], [True, False]) == 0.0
    assert auc([5.0, 5.0, 5.0], [True, False, True]) == 0.5
    assert auc([np.inf, 3.0, -np.inf], [True, True, False]) == 1.0  # saturated margins still rank
    assert auc([np.nan, 1.0, 0.0], [False, True, False]) == 1.0  # NaN scores are left out
    assert np.isnan(auc([1.0, 2.0], [True, True]))


def _runs(rows: list[tuple[str, int, float, float, float]]) -> pd.DataFrame:
    return pd.DataFrame(
        [(p, f"t-{p}", s, std, sr, scr) for p, s, std, sr, scr in rows],
        columns=["point", "trial_id", "seed", "std", "s_rand", "sc_rand"],
    )


def test_extreme_sb_counts_runs_that_rely_on_s_alone() -> None:
    runs = _runs([
        ("a", 0, 1.00, 0.50, 1.00),   # extreme
        ("a", 1, 1.00, 0.56, 1.00),   # S-randomized above s_max: not extreme
        ("a", 2, 1.00, 0.51, 0.97),   # S^c randomizing costs 0.03 > 0.02: not extreme
        ("a", 3, 0.95, 0.49, 0.94),   # extreme (within 0.02 of its own standard AUC)
        ("b", 0, 0.99, 0.70, 0.80),
        ("b", 1, np.nan, 0.5, 1.0),   # missing a value: left out
    ])  # fmt: skip
    t = extreme_sb(runs, s_max=0.55, sc_tolerance=0.02)
    assert list(t["point"]) == ["a", "b"]
    a = t.iloc[0]
    assert (a["runs"], a["extreme"], a["fraction"]) == (4, 2, 0.5)
    assert a["low"] < 0.5 < a["high"]  # Wilson
    assert (a["std_min"], a["std_max"], a["s_rand_max"], a["sc_rand_min"]) == (
        0.95,
        1.0,
        0.56,
        0.94,
    )
    assert a["std_mean"] == pytest.approx(0.9875)
    b = t.iloc[1]
    assert (b["runs"], b["extreme"], b["fraction"]) == (1, 0, 0.0)


def _preds(
    scores: dict[tuple[str, int], list[float]], positive: list[bool], split: str = "test"
) -> pd.DataFrame:
    rows = []
    for (point, seed), values in scores.items():
        for i, (v, y) in enumerate(zip(values, positive, strict=True)):
            rows.append((point, f"t-{point}", seed, split, i, y, v))
    return pd.DataFrame(
        rows, columns=["point", "trial_id", "seed", "split", "example_id", "positive", "score"]
    )


def test_ensemble_auc_averages_scores_over_seeds() -> None:
    positive = [True, True, False, False]
    # each seed ranks one negative above one positive (AUC 0.75); their mean margin ranks all right
    scores = {
        ("p", 0): [2.0, 0.5, 1.0, -3.0],
        ("p", 1): [0.5, 2.0, -3.0, 1.0],
        ("p", 2): [1.0, 1.0, 0.0, 0.0],  # AUC 1
        ("p", 3): [0.0, 0.0, 0.0, 0.0],  # AUC 0.5
    }
    t = ensemble_aucs(_preds(scores, positive), sizes=[2, 3])
    (row,) = t.to_dict("records")
    assert (row["point"], row["split"], row["seeds"]) == ("p", "test", 4)
    # all four: means (0.875, 0.875, -0.5, -0.5) -> AUC 1
    assert row["ensemble_auc"] == 1.0
    assert (row["member_min"], row["member_max"]) == (0.5, 1.0)
    assert row["member_mean"] == pytest.approx((0.75 + 0.75 + 1 + 0.5) / 4)
    # pairs in seed order: {0, 1} -> AUC 1; {2, 3} -> means (0.5, 0.5, 0, 0) -> AUC 1
    assert (row["ens2_n"], row["ens2_mean"], row["ens2_min"]) == (2, 1.0, 1.0)
    # one group of three {0, 1, 2} (seed 3 left over)
    assert row["ens3_n"] == 1 and row["ens3_mean"] == 1.0


def test_ensemble_auc_keeps_points_and_splits_apart_and_drops_unreadable_scores() -> None:
    positive = [True, False, True, False]
    a = _preds({("x", 0): [1.0, 0.0, 1.0, 0.0], ("y", 0): [0.0, 1.0, 0.0, 1.0]}, positive)
    b = _preds({("x", 0): [np.nan, 0.0, 1.0, 2.0]}, positive, split="test_s_rand")
    t = ensemble_aucs(pd.concat([a, b]), sizes=[5])
    got = {
        (r["point"], r["split"]): (r["seeds"], r["ensemble_auc"], r["ens5_n"])
        for r in t.to_dict("records")
    }
    assert got[("x", "test")] == (1, 1.0, 0) and got[("y", "test")] == (1, 0.0, 0)
    assert got[("x", "test_s_rand")] == (1, 0.5, 0)  # the NaN example is left out: 1 pos vs 2 neg


def test_declarations_parse_and_refuse_bad_ones() -> None:
    assert {"extreme_sb", "ensemble_auc"} <= set(KINDS)
    decls = parse_aggregates([
        {"kind": "extreme_sb", "metric": "auc", "standard": "test", "s_randomized": "s",
         "sc_randomized": "sc"},
        {"kind": "ensemble_auc", "splits": ["test", "s"], "sizes": [3]},
    ])  # fmt: skip
    assert decls[0] == ExtremeSB("auc", "test", "s", "sc", 0.55, 0.02)
    assert decls[1] == EnsembleAUC(("test", "s"), (3,), "1")
    assert decls[1].declaration() == {
        "kind": "ensemble_auc",
        "splits": ["test", "s"],
        "sizes": [3],
        "positive": "1",
    }
    with pytest.raises(AnalysisError, match=r"aggregates\[0\].*extreme_sb needs"):
        parse_aggregates([{"kind": "extreme_sb", "metric": "auc"}])
    with pytest.raises(AnalysisError, match=r"aggregates\[0\]\.s_max"):
        parse_aggregates([{"kind": "extreme_sb", "metric": "auc", "standard": "t", "s_randomized": "s",
                           "sc_randomized": "c", "s_max": "high"}])  # fmt: skip
    with pytest.raises(AnalysisError, match=r"aggregates\[0\]\.sizes"):
        parse_aggregates([{"kind": "ensemble_auc", "splits": ["test"], "sizes": [0]}])
    with pytest.raises(AnalysisError, match=r"aggregates\[0\]\.splits"):
        parse_aggregates([{"kind": "ensemble_auc", "splits": []}])
