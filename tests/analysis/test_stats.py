"""analysis.stats and analysis.variance on tiny tables worked out by hand, and against scipy."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from analysis import stats
from analysis.errors import AnalysisError


def test_describe_of_1234_by_hand() -> None:
    d = stats.describe([1, 2, 3, 4, np.nan])
    assert d["n"] == 4
    assert d["mean"] == 2.5
    # sample variance: (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3
    assert d["std"] == pytest.approx(math.sqrt(5 / 3))
    assert (d["min"], d["max"], d["median"]) == (1, 4, 2.5)
    assert math.isnan(stats.describe([7.0])["std"])


def test_t_interval_by_hand_and_scipy() -> None:
    ci = stats.t_interval([1, 2, 3, 4], level=0.95)
    half = 3.182446305284263 * math.sqrt(5 / 3) / 2  # t_{0.975, 3} * s / sqrt(n)
    assert ci.low == pytest.approx(2.5 - half)
    assert ci.high == pytest.approx(2.5 + half)
    lo, hi = sps.t.interval(0.95, 3, loc=2.5, scale=sps.sem([1, 2, 3, 4]))
    assert (ci.low, ci.high) == pytest.approx((lo, hi))
    assert math.isnan(stats.t_interval([3.0]).low)


def test_bootstrap_is_seeded_reproducible_and_close_to_scipy() -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(10, 2, size=40)
    a = stats.bootstrap_interval(x, n_boot=4000, seed=1)
    b = stats.bootstrap_interval(x, n_boot=4000, seed=1)
    c = stats.bootstrap_interval(x, n_boot=4000, seed=2)
    assert a == b
    assert (a.low, a.high) != (c.low, c.high)
    assert a.low < x.mean() < a.high
    ref = sps.bootstrap(
        (x,), np.mean, n_resamples=20000, method="percentile", rng=np.random.default_rng(0)
    )
    width = ref.confidence_interval.high - ref.confidence_interval.low
    assert a.low == pytest.approx(ref.confidence_interval.low, abs=0.1 * width)
    assert a.high == pytest.approx(ref.confidence_interval.high, abs=0.1 * width)


def test_bootstrap_of_constant_values_is_a_point() -> None:
    ci = stats.bootstrap_interval([3.0, 3.0, 3.0], n_boot=100)
    assert (ci.estimate, ci.low, ci.high) == (3.0, 3.0, 3.0)


def test_group_intervals_per_group() -> None:
    df = pd.DataFrame({"g": ["a"] * 4 + ["b"] * 3, "value": [1, 2, 3, 4, 10, 10, 10]})
    out = stats.group_intervals(df, ["g"], n_boot=200)
    assert out["g"].tolist() == ["a", "b"]
    assert out["n"].tolist() == [4, 3]
    assert out["mean"].tolist() == [2.5, 10.0]
    assert out.loc[1, "boot_low"] == out.loc[1, "boot_high"] == 10.0


def test_pearson_of_perfectly_linear_data_is_one() -> None:
    x = np.arange(6.0)
    c = stats.correlate(x, 3 * x + 2, n_boot=500, seed=0)
    assert c.r == pytest.approx(1.0)
    assert c.p < 1e-6
    assert c.low == pytest.approx(1.0) and c.high == pytest.approx(1.0)
    assert stats.correlate(x, -x, n_boot=0).r == pytest.approx(-1.0)


def test_spearman_of_monotone_data_is_one_and_matches_scipy() -> None:
    x = np.array([1.0, 2, 3, 4, 5])
    assert stats.correlate(x, np.exp(x), "spearman", n_boot=0).r == pytest.approx(1.0)
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=30), rng.normal(size=30)
    mine = stats.correlate(a, b, "spearman", n_boot=0)
    ref = sps.spearmanr(a, b)
    assert (mine.r, mine.p) == pytest.approx((ref.statistic, ref.pvalue))
    mine = stats.correlate(a, b, "pearson", n_boot=0)
    ref = sps.pearsonr(a, b)
    assert (mine.r, mine.p) == pytest.approx((ref.statistic, ref.pvalue))


def test_correlation_drops_incomplete_pairs_and_handles_constants() -> None:
    c = stats.correlate([1, 2, np.nan, 4, 5], [2, 4, 6, np.nan, 10], n_boot=0)
    assert c.n == 3
    assert c.r == pytest.approx(1.0)
    assert math.isnan(stats.correlate([1, 1, 1, 1], [1, 2, 3, 4], n_boot=0).r)
    with pytest.raises(AnalysisError, match="pearson or spearman"):
        stats.correlate([1, 2, 3], [1, 2, 3], "kendall")


def test_correlation_bootstrap_interval_covers_r() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=50)
    y = x + rng.normal(scale=0.5, size=50)
    c = stats.correlate(x, y, n_boot=1000, seed=4)
    assert c.low < c.r < c.high
    assert c == stats.correlate(x, y, n_boot=1000, seed=4)


def test_correlation_matrix_and_pairwise() -> None:
    wide = pd.DataFrame({"a": [1.0, 2, 3, 4], "b": [2.0, 4, 6, 8], "c": [4.0, 3, 2, np.nan]})
    m = stats.correlation_matrix(wide)
    assert m.r.loc["a", "b"] == pytest.approx(1.0)
    assert m.r.loc["a", "c"] == pytest.approx(-1.0)
    assert m.n.loc["a", "c"] == 3 and m.n.loc["a", "b"] == 4 and m.n.loc["c", "c"] == 3
    assert np.allclose(m.r.to_numpy(), m.r.to_numpy().T)
    pairs = stats.pairwise_correlations(wide)
    assert list(zip(pairs["x"], pairs["y"], strict=True)) == [("a", "b"), ("a", "c"), ("b", "c")]
    assert pairs["n"].tolist() == [4, 3, 3]
    assert m.r.loc["a", "a"] == 1.0 and m.p.loc["a", "a"] == 0.0
    # a split every seed scores the same (test accuracy 1.0): undefined with itself too
    flat = stats.correlation_matrix(wide.assign(d=1.0))
    assert np.isnan(flat.r.loc["d", "d"]) and np.isnan(flat.p.loc["d", "d"])
    assert np.isnan(flat.r.loc["a", "d"]) and flat.n.loc["d", "d"] == 4
    one = stats.correlation_matrix(wide.head(1)[["a"]])  # a single run
    assert np.isnan(one.r.loc["a", "a"])


def test_regression_by_hand_with_neglog_transform() -> None:
    # y = 2 * (-log x) + 1 exactly
    x = np.array([1.0, np.e**-1, np.e**-2, np.e**-3])
    y = 2 * np.array([0.0, 1, 2, 3]) + 1
    r = stats.regress(x, y, x_transform="neglog")
    assert (r.slope, r.intercept, r.r2) == pytest.approx((2.0, 1.0, 1.0))
    assert r.n == 4
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=20), rng.normal(size=20)
    ref = sps.linregress(a, b)
    mine = stats.regress(a, b)
    assert (mine.slope, mine.intercept, mine.p) == pytest.approx(
        (ref.slope, ref.intercept, ref.pvalue)
    )
    assert mine.r2 == pytest.approx(ref.rvalue**2)
    # a constant y (very-long FPF 119.8 at every checkpoint): a flat line, slope exactly 0 and
    # its sign "0", not the +-1e-28 of least squares; r2 and p undefined
    from analysis.aggregates import slope_sign

    flat = stats.regress(-np.log([0.3, 0.2, 0.11, 0.05, 0.04]), np.full(5, 119.8))
    assert (flat.slope, flat.intercept, flat.n) == (0.0, 119.8, 5) and slope_sign(flat.slope) == "0"
    assert np.isnan(flat.r2) and np.isnan(flat.p)


def test_transform_drops_invalid_values_and_rejects_unknown_names() -> None:
    r = stats.regress([0.0, 1.0, 2.0, 3.0, 4.0], [9.0, 1.0, 2.0, 3.0, 4.0], x_transform="log")
    assert r.n == 4  # log(0) dropped
    assert r.slope == pytest.approx(np.polyfit(np.log([1, 2, 3, 4]), [1, 2, 3, 4], 1)[0])
    with pytest.raises(AnalysisError, match="neglog"):
        stats.apply_transform([1.0], "sqrtlog")


def test_oneway_anova_by_hand_and_against_scipy() -> None:
    df = pd.DataFrame({"g": ["a", "a", "b", "b"], "value": [1.0, 3.0, 5.0, 7.0]})
    res = stats.oneway_anova(df, "g")
    # grand mean 4; group means 2, 6: SSB = 2*4 + 2*4 = 16; SSW = 1+1+1+1 = 4
    assert (res.ss_between, res.ss_within) == (16.0, 4.0)
    assert res.f_stat == pytest.approx(8.0)  # MSB / MSW = 16 / (4 / 2)
    assert res.eta2 == pytest.approx(0.8)
    # ICC(1) = (MSB - MSW) / (MSB + (k-1) MSW) = (16 - 2) / (16 + 2)
    assert res.icc1 == pytest.approx(14 / 18)
    rng = np.random.default_rng(0)
    groups = [rng.normal(m, 1, size=n) for m, n in ((0, 5), (1, 7), (0.5, 6))]
    long = pd.DataFrame(
        {"trial_id": np.repeat(["x", "y", "z"], [5, 7, 6]), "value": np.concatenate(groups)}
    )
    mine = stats.between_within(long)
    ref = sps.f_oneway(*groups)
    assert (mine.f_stat, mine.p) == pytest.approx((ref.statistic, ref.pvalue))


def test_two_way_anova_2x2_by_hand() -> None:
    # cells (a, b): (0,0) 1,3  (0,1) 5,7  (1,0) 2,4  (1,1) 8,10; grand mean 5
    df = pd.DataFrame(
        {
            "a": [0, 0, 0, 0, 1, 1, 1, 1],
            "b": [0, 0, 1, 1, 0, 0, 1, 1],
            "value": [1.0, 3, 5, 7, 2, 4, 8, 10],
        }
    )
    t = stats.two_way_anova(df, "a", "b").set_index("source")
    # a means 4, 6 -> SSA = 2*2*(1+1) = 8; b means 2.5, 7.5 -> SSB = 4*(6.25*2) = 50
    # interaction residuals +-0.5 -> SSAB = 2 * 4 * 0.25 = 2; within cells +-1 -> SSE = 8
    assert t.loc["a", "ss"] == pytest.approx(8)
    assert t.loc["b", "ss"] == pytest.approx(50)
    assert t.loc["a:b", "ss"] == pytest.approx(2)
    assert t.loc["residual", "ss"] == pytest.approx(8)
    assert t.loc["total", "ss"] == pytest.approx(68)
    assert t.loc["b", "F"] == pytest.approx(25.0)  # 50 / (8 / 4)
    assert t.loc["b", "p"] == pytest.approx(sps.f.sf(25.0, 1, 4))
    assert t.loc["b", "share"] == pytest.approx(50 / 68)
    with pytest.raises(AnalysisError, match="balanced"):
        stats.two_way_anova(df.iloc[1:], "a", "b")


def test_seed_source_anova_on_a_crossed_design() -> None:
    # 2 init seeds x 2 order seeds, init adds 2, order adds 1: shares 16/20 and 4/20
    runs = pd.DataFrame(
        {
            "init_seed": [1, 1, 2, 2],
            "order_seed": [5, 6, 5, 6],
            "dropout_seed": [0] * 4,
            "data_seed": [0] * 4,
            "value": [1.0, 2.0, 3.0, 4.0],
        }
    )
    t = stats.seed_source_anova(runs).set_index("source")
    assert list(t.index) == ["init_seed", "order_seed"]
    assert t.loc["init_seed", "share"] == pytest.approx(0.8)
    assert t.loc["order_seed", "share"] == pytest.approx(0.2)
    assert t.loc["init_seed", "confounded_with"] == ""
    # init and order following the same index are confounded
    joint = runs.assign(order_seed=runs["init_seed"] + 10)
    t = stats.seed_source_anova(joint).set_index("source")
    assert t.loc["init_seed", "confounded_with"] == "order_seed"


def test_source_variance_shares_for_separately_varied_sources() -> None:
    runs = pd.DataFrame(
        {
            "study": ["A"] * 3 + ["B"] * 3,
            "init_seed": [1, 2, 3, 9, 9, 9],
            "order_seed": [7, 7, 7, 1, 2, 3],
            "value": [1.0, 2, 3, 1, 3, 5],
        }
    )
    t = stats.source_variance_shares(runs).set_index("group")
    assert t.loc["A", "varied"] == "init" and t.loc["B", "varied"] == "order"
    assert (t.loc["A", "var"], t.loc["B", "var"]) == (1.0, 4.0)
    assert (t.loc["A", "share"], t.loc["B", "share"]) == pytest.approx((0.2, 0.8))


def test_expected_max_by_hand() -> None:
    t = stats.expected_max([3.0, 1.0, 2.0])
    # n=2: P(max = v_(i)) = (i/3)^2 - ((i-1)/3)^2 = 1/9, 3/9, 5/9
    assert t["expected_max"].tolist() == pytest.approx([2.0, 22 / 9, (1 * 1 + 2 * 7 + 3 * 19) / 27])
    assert t["std"].iloc[0] == pytest.approx(np.std([1, 2, 3]))
    big = stats.expected_max([0.1, 0.5, 0.9], n_max=200)
    assert big["expected_max"].iloc[-1] == pytest.approx(0.9, abs=1e-6)
    assert np.all(np.diff(big["expected_max"]) >= -1e-12)


def test_compare_two_configs_by_hand_and_scipy() -> None:
    a, b = [1.0, 2.0, 3.0, 4.0], [3.0, 4.0, 5.0, 6.0]
    c = stats.compare(a, b, n_boot=2000, seed=0)
    assert c.diff == -2.0
    # equal variances 5/3: pooled sd sqrt(5/3) -> d = -2 / sqrt(5/3)
    assert c.cohen_d == pytest.approx(-2 / math.sqrt(5 / 3))
    assert c.hedges_g == pytest.approx(c.cohen_d * (1 - 3 / (4 * 8 - 9)))
    # pairs with a > b: (4,3) only; ties (3,3), (4,4) count 1/2 -> U = 2, A12 = 2/16
    assert c.mwu_u == 2.0
    assert c.a12 == pytest.approx(2 / 16)
    ref = sps.ttest_ind(a, b, equal_var=False)
    assert (c.welch_t, c.welch_p) == pytest.approx((ref.statistic, ref.pvalue))
    assert c.mwu_p == pytest.approx(sps.mannwhitneyu(a, b, alternative="two-sided").pvalue)
    assert c.diff_low < -2.0 < c.diff_high
    assert c == stats.compare(a, b, n_boot=2000, seed=0)
    with pytest.raises(AnalysisError, match="at least 2"):
        stats.compare([1.0], b)


def test_accuracy_bootstrap_matches_resampling_examples() -> None:
    correct = np.array([True] * 30 + [False] * 10)
    preds = pd.DataFrame({"trial_id": "t", "seed": 0, "split": "test", "correct": correct})
    out = stats.accuracy_bootstrap(preds, n_boot=20000, seed=0)
    assert out["n"].tolist() == [40] and out["correct"].tolist() == [30]
    assert out["accuracy"].iloc[0] == 0.75
    # explicit resampling of the examples gives the same interval (up to Monte Carlo error)
    rng = np.random.default_rng(1)
    reps = correct[rng.integers(0, 40, size=(20000, 40))].mean(axis=1)
    lo, hi = np.quantile(reps, [0.025, 0.975])
    assert out["low"].iloc[0] == pytest.approx(lo, abs=0.026)
    assert out["high"].iloc[0] == pytest.approx(hi, abs=0.026)
    again = stats.accuracy_bootstrap(preds, n_boot=20000, seed=0)
    pd.testing.assert_frame_equal(out, again)
    counts = pd.DataFrame(
        {"trial_id": ["t"], "seed": [0], "split": ["test"], "n": [40], "correct": [30]}
    )
    pd.testing.assert_frame_equal(stats.accuracy_bootstrap(counts, n_boot=20000, seed=0), out)
