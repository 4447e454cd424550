"""Declared aggregates (best-k subset, checkpoint regression, baseline) on tiny tables worked
out by hand, the regression against statsmodels, and the declarations' parsing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.aggregates import (
    KINDS,
    Baseline,
    BestK,
    CheckpointRegression,
    baseline_summary,
    best_k_runs,
    checkpoint_fits,
    parse_aggregates,
    slope_sign,
    subset_summary,
)
from analysis.errors import AnalysisError
from analysis.manifest import Axis, parse_declarations


def _runs(point: str, values: list[float], trial: str = "t") -> pd.DataFrame:
    return pd.DataFrame(
        {"point": point, "trial_id": trial, "seed": range(len(values)), "value": values}
    )


def test_best_k_runs_by_hand() -> None:
    ranking = pd.concat([_runs("A", [0.5, 0.1, 0.3, 0.1]), _runs("B", [0.2, math.nan], "u")])
    low = best_k_runs(ranking, 2, "min")
    # A: seeds 1 and 3 tie at 0.1 -> the lower seed ranks first; B: its NaN run is never kept
    assert low[["point", "seed", "rank", "runs"]].values.tolist() == [
        ["A", 1, 1, 4], ["A", 3, 2, 4], ["B", 0, 1, 1],
    ]  # fmt: skip
    high = best_k_runs(ranking, 2, "max")
    assert high.loc[high["point"] == "A", "seed"].tolist() == [0, 2]  # 0.5, 0.3
    assert best_k_runs(ranking, 10, "min").groupby("point").size().to_dict() == {"A": 4, "B": 1}
    with pytest.raises(AnalysisError, match="k >= 1"):
        best_k_runs(ranking, 0)


def test_subset_summary_by_hand() -> None:
    values = _runs("A", [10.0, 20.0, 30.0, 40.0]).assign(split="very_long", metric="fpf")
    kept = pd.DataFrame({"point": "A", "trial_id": "t", "seed": [1, 3]})
    (row,) = subset_summary(values, kept).to_dict("records")
    assert (row["kept"], row["runs"]) == (2, 4)
    # kept 20, 40: mean 30, sample std sqrt((10^2 + 10^2) / 1), median 30; every run: mean 25
    assert row["mean"] == 30.0 and row["std"] == pytest.approx(math.sqrt(200))
    assert (row["min"], row["median"], row["max"], row["mean_all"]) == (20.0, 30.0, 40.0, 25.0)


def _pairs(point: str, x: str, xy: list[tuple[float, float]], seeds: list[int]) -> pd.DataFrame:
    return pd.DataFrame(
        {"point": point, "x": x, "trial_id": "t", "seed": seeds,
         "x_value": [a for a, _ in xy], "y": [b for _, b in xy]}
    )  # fmt: skip


def test_checkpoint_fits_by_hand() -> None:
    a = _pairs("A", "-log(val loss)", [(0, 1), (1, 2), (2, 2), (3, 4), (math.nan, 9)], [0, 0, 1, 1, 2])
    b = _pairs("B", "-log(val loss)", [(0, 4), (1, 3), (2, 2)], [0, 1, 2])
    fits = checkpoint_fits(pd.concat([a, b])).set_index("point")
    # A: mean x 1.5, mean y 2.25, Sxx = 5, Sxy = 4.5, SST = 4.75 -> slope 0.9, intercept 0.9,
    # R^2 = 0.9 * 4.5 / 4.75; the NaN pair is dropped (n = 4, runs = seeds 0 and 1)
    ra = fits.loc["A"]
    assert (ra["n"], ra["runs"], ra["sign"]) == (4, 2, "+")
    assert ra["slope"] == pytest.approx(0.9) and ra["intercept"] == pytest.approx(0.9)
    assert ra["r2"] == pytest.approx(4.05 / 4.75)
    # t^2 = (n - 2) R^2 / (1 - R^2) = 2 * 4.05 / 0.7; with 2 degrees of freedom the t CDF is
    # 1/2 + t / (2 sqrt(2 + t^2)), so the two-sided p is 1 - t / sqrt(2 + t^2) (about 0.077)
    t = math.sqrt(2 * 4.05 / 0.7)
    assert ra["p"] == pytest.approx(1 - t / math.sqrt(2 + t * t))
    rb = fits.loc["B"]
    assert (rb["slope"], rb["sign"], rb["r2"]) == (pytest.approx(-1.0), "-", pytest.approx(1.0))
    assert [slope_sign(v) for v in (2.0, -0.1, 0.0, math.nan)] == ["+", "-", "0", ""]


def test_checkpoint_fits_match_statsmodels_ols() -> None:
    sm = pytest.importorskip("statsmodels.api")
    rng = np.random.default_rng(7)
    x = rng.normal(size=60)
    y = 300 * x + rng.normal(scale=400, size=60) + 500
    pairs = _pairs("cell=relu", "-log(val loss)", list(zip(x, y, strict=True)), [i // 6 for i in range(60)])
    (row,) = checkpoint_fits(pairs).to_dict("records")
    ols = sm.OLS(y, sm.add_constant(x)).fit()
    assert (row["n"], row["runs"]) == (60, 10)
    assert row["intercept"] == pytest.approx(ols.params[0])
    assert row["slope"] == pytest.approx(ols.params[1])
    assert row["stderr"] == pytest.approx(ols.bse[1])
    assert row["r2"] == pytest.approx(ols.rsquared)
    assert row["p"] == pytest.approx(ols.pvalues[1])


def test_baseline_summary_by_hand() -> None:
    fpf = _runs("A", [150.0, 90.0, 120.0]).assign(split="very_long", metric="fpf")
    # seed 2 ran on other data (another data_seed): its own baseline is 120
    base = _runs("A", [100.0, 100.0, 120.0]).assign(split="very_long", metric="fpf_trivial")
    only_fpf = _runs("A", [5.0]).assign(split="zigzag", metric="fpf")  # no baseline: no row
    (row,) = baseline_summary(pd.concat([fpf, base, only_fpf]), "fpf", "fpf_trivial").to_dict("records")
    assert (row["point"], row["split"], row["metric"], row["runs"]) == ("A", "very_long", "fpf", 3)
    assert row["baseline"] == pytest.approx(320 / 3)
    assert (row["baseline_min"], row["baseline_max"], row["mean"]) == (100.0, 120.0, 120.0)
    # 150 > 100 beats it; 90 < 100 does not; 120 == its own 120 does not
    assert (row["beat"], row["share_beat"]) == (1, pytest.approx(1 / 3))


def test_declarations_parse_into_typed_kinds() -> None:
    loss = {"split": "val", "metric": "loss"}
    raw = [
        {"kind": "best_k", "k": 3, "by": loss, "of": [{"split": "long", "metric": "fpf"}]},
        {"kind": "checkpoint_regression", "y": {"split": "long", "metric": "fpf"},
         "x": {**loss, "transform": "neglog"}, "runs": {"k": 3, "by": loss, "mode": "min"}},
        {"kind": "baseline", "metric": "fpf", "baseline": "fpf_trivial", "label": "trivial"},
        {"kind": "from_the_future", "anything": 1},
    ]  # fmt: skip
    decl = parse_declarations({"aggregates": raw})
    assert not decl.unknown and len(decl.aggregates) == 4
    notes: list[str] = []
    best, reg, base = parse_aggregates(decl.aggregates, notes)
    assert isinstance(best, BestK) and best.subset.k == 3 and best.of == (Axis("long", "fpf"),)
    assert isinstance(reg, CheckpointRegression) and reg.xs == (Axis("val", "loss", "neglog"),)
    assert reg.runs is not None and reg.runs.describe() == "best 3 by lowest val loss"
    assert base == Baseline("fpf", "fpf_trivial", "trivial")
    assert len(notes) == 1 and "from_the_future" in notes[0] and "best_k" in notes[0]
    assert set(KINDS) >= {"best_k", "checkpoint_regression", "baseline"}
    assert json.loads(json.dumps(best.declaration()))["of"] == [{"split": "long", "metric": "fpf"}]


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ({"kind": "best_k", "k": 0, "by": {"split": "val", "metric": "loss"}, "of": [["a", "b"]]}, "aggregates[0].k"),
        ({"kind": "best_k", "k": 2, "by": {"split": "val", "metric": "loss"}, "mode": "lowest", "of": [["a", "b"]]}, "aggregates[0].mode"),
        ({"kind": "best_k", "k": 2, "by": {"split": "val", "metric": "loss"}}, "aggregates[0].of"),
        ({"kind": "checkpoint_regression", "x": []}, "aggregates[0]"),
        ({"kind": "baseline", "metric": "fpf"}, "'baseline'"),
        ({"no_kind": 1}, "'kind'"),
    ],
)
def test_malformed_declarations_name_where_and_fix(entry: dict, needle: str) -> None:
    with pytest.raises(AnalysisError) as err:
        parse_aggregates([entry])
    assert needle in str(err.value) and "Fix the task's analysis() declaration" in str(err.value)


def test_best_k_and_checkpoint_regression_on_a_synthetic_grid(tmp_path: Path) -> None:
    """12 seeds per point, k = 10: the selection is real (10 of 12), as for the paper's ReLU."""
    from scipy import stats as sps

    from analysis.analyze import analyze
    from analysis.demo import write_demo_study

    path = write_demo_study(tmp_path, "g", n_seeds=12, points=[{"model.cell": "lstm"}, {"model.cell": "relu"}], seed=3)
    manifest = json.loads(path.read_text())
    loss = {"split": "val", "metric": "loss"}
    fpf = {"split": "very_long", "metric": "fpf"}
    manifest["analysis"]["aggregates"] = [
        {"kind": "best_k", "k": 10, "by": loss, "mode": "min", "of": [fpf]},
        {"kind": "checkpoint_regression", "y": fpf, "x": [{**loss, "transform": "neglog"}],
         "runs": {"k": 10, "by": loss}},
    ]  # fmt: skip
    path.write_text(json.dumps(manifest))
    doc = json.loads(analyze(tmp_path, "g", "json", n_boot=100))
    best, reg = doc["aggregates"]
    evals = pd.read_parquet(tmp_path / "tables" / "evals", partitioning=None)
    metrics = pd.read_parquet(tmp_path / "tables" / "metrics", partitioning=None)
    for p_idx, label in enumerate(["cell=lstm", "cell=relu"]):
        ev = evals[evals["trial_id"] == f"g-t{p_idx:02d}"]
        by_loss = ev[(ev["split"] == "val") & (ev["metric"] == "loss")].nsmallest(10, "value")
        kept = set(by_loss["seed"])
        vl = ev[(ev["split"] == "very_long") & (ev["metric"] == "fpf")]
        (row,) = [r for r in best["rows"] if r["point"] == label]
        assert (row["kept"], row["runs"], row["selected"]) == (10, 12, True)
        assert row["mean"] == pytest.approx(vl[vl["seed"].isin(kept)]["value"].mean())
        assert row["mean_all"] == pytest.approx(vl["value"].mean())
        m = metrics[(metrics["trial_id"] == f"g-t{p_idx:02d}") & metrics["seed"].isin(kept)]
        x = m[(m["split"] == "val") & (m["metric"] == "loss")].set_index(["seed", "step"])["value"]
        y = m[(m["split"] == "very_long") & (m["metric"] == "fpf")].set_index(["seed", "step"])["value"]
        fit = sps.linregress(-np.log(x.sort_index()), y.sort_index())
        (r,) = [r for r in reg["rows"] if r["point"] == label]
        assert (r["n"], r["runs"], r["x"]) == (60, 10, "-log(val loss)")  # 6 epochs x 10 runs
        assert r["slope"] == pytest.approx(fit.slope) and r["p"] == pytest.approx(fit.pvalue)
        assert r["r2"] == pytest.approx(fit.rvalue**2) and r["sign"] == ("+" if fit.slope > 0 else "-")
    text = analyze(tmp_path, "g", n_boot=100)
    assert "Declared aggregate (best_k)" in text and "Declared aggregate (checkpoint_regression)" in text
