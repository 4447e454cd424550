"""The verdict's statistics on tiny tables worked out by hand, and against scipy/statsmodels."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from analysis import intervals as iv
from analysis import stats
from analysis.bands import curve_bands, performance_profile
from analysis.variance import variance_share
from analysis.verdict import (
    best_clause,
    compare_configs,
    excluded_runs,
    grid_sentence,
    grid_shares,
    source_shares,
)


def test_mean_interval_is_scipys_bca_and_stays_inside_the_range() -> None:
    acc = np.array([1.0, 1.0, 1.0, 0.9, 1.0, 0.95])
    t = stats.t_interval(acc)
    assert t.high > 1.0  # the t interval runs past an accuracy's range
    ci = iv.mean_interval(acc, n_boot=3000, seed=3)
    assert 0.9 <= ci.low <= ci.estimate <= ci.high <= 1.0
    ref = sps.bootstrap(  # scipy's BCa on the sorted values (mean_interval sorts them)
        (np.sort(acc),), np.mean, n_resamples=3000, method="BCa", rng=np.random.default_rng(3)
    )
    assert (ci.low, ci.high) == pytest.approx(
        (ref.confidence_interval.low, ref.confidence_interval.high)
    )
    assert ci.method == "bootstrap-bca"
    again = iv.mean_interval(acc[::-1], n_boot=3000, seed=3)  # one interval per set of values
    assert (again.low, again.high) == (ci.low, ci.high)
    const = iv.mean_interval([0.5, 0.5, 0.5])
    assert (const.low, const.high, const.method) == (0.5, 0.5, "constant")
    single = iv.mean_interval([0.3])
    assert math.isnan(single.low) and single.method == "none"  # nothing was bootstrapped


def test_diff_interval_matches_scipys_two_sample_bootstrap() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(1, 1, 12), rng.normal(0, 1, 10)
    d = iv.diff_interval(a, b, n_boot=2000, seed=5, method="BCa")
    ref = sps.bootstrap(
        (a, b),
        lambda x, y, axis=-1: x.mean(axis=axis) - y.mean(axis=axis),
        n_resamples=2000,
        method="BCa",
        rng=np.random.default_rng(5),
    )
    assert d.estimate == pytest.approx(a.mean() - b.mean())
    assert (d.low, d.high) == pytest.approx(
        (ref.confidence_interval.low, ref.confidence_interval.high)
    )


def test_diff_interval_is_welchs_and_agrees_with_its_p() -> None:
    # a = [1, 2, 3], b = [0, 0, 1]: diff 5/3, var_a/3 + var_b/3 = 1/3 + 1/9 = 4/9, se 2/3;
    # Welch df = (4/9)^2 / ((1/3)^2/2 + (1/9)^2/2) = 3.2; half-width t_{0.975, 3.2} * 2/3
    d = iv.diff_interval([1, 2, 3], [0, 0, 1])
    half = sps.t.ppf(0.975, 3.2) * 2 / 3
    assert d.method == "welch-t" and (d.low, d.high) == pytest.approx((5 / 3 - half, 5 / 3 + half))
    # the case a bootstrap got wrong: 3 runs each, the interval excluded 0 while p was 0.25
    rng = np.random.default_rng(4)
    for _ in range(50):
        x, y = rng.normal(0.5, 0.2, 3), rng.normal(0.4, 0.2, 3)
        p = sps.ttest_ind(x, y, equal_var=False).pvalue
        ci = iv.diff_interval(x, y)
        assert (ci.low > 0 or ci.high < 0) == (p < 0.05)


def test_a_difference_of_two_unit_metrics_stays_within_minus_one_and_one() -> None:
    """Runs near 1 against runs near 0 (the probe's case: 0.951 [0.879, 1.02]): Welch's
    upper bound passes 1, the most two [0, 1] means can differ; with ``unit`` it is 1, the
    lower bound and the estimate unchanged, and the verdict's comparisons pass ``unit``
    exactly when every value lies in [0, 1]."""
    a, b = np.array([1.0, 0.9, 1.0]), np.array([0.0, 0.05, 0.0])
    free, kept = iv.diff_interval(a, b), iv.diff_interval(a, b, span=1.0)
    assert free.high > 1.0 and kept.high == 1.0
    assert (kept.low, kept.estimate) == (free.low, free.estimate)
    runs = pd.DataFrame({"point": ["a"] * 3 + ["b"] * 3, "split": "test", "value": [*a, *b]})
    assert compare_configs(runs, ["test"]).loc[0, "diff_high"] == 1.0
    loss = runs.assign(value=runs["value"] * 3)  # a loss reaches past 1: its interval is Welch's own
    assert compare_configs(loss, ["test"]).loc[0, "diff_high"] == pytest.approx(iv.diff_interval(a * 3, b * 3).high)


def test_diff_interval_with_one_constant_sample_is_exact_and_silent() -> None:
    """Every run of one config at 1.0: its variance is 0, so Welch's se is the other's alone,
    sqrt(var_b / 3), with df = n_b - 1 = 2. scipy flagged it "precision loss" and that
    RuntimeWarning reached `study analyze`'s terminal."""
    import warnings

    b = np.array([0.32, 0.14, 0.28])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = iv.diff_interval([1.0, 1.0, 1.0], b)
    half = sps.t.ppf(0.975, 2) * np.sqrt(b.var(ddof=1) / 3)
    assert (d.low, d.high) == pytest.approx((1 - b.mean() - half, 1 - b.mean() + half))


def test_a12_by_hand_and_as_mann_whitney() -> None:
    # a = [1, 2, 3] vs b = [2, 2]: 2 of 6 pairs a > b, 2 ties -> 2/6 + (2/6)/2 = 0.5
    assert iv.a12([1, 2, 3], [2, 2]) == pytest.approx(0.5)
    assert iv.a12([3, 4], [1, 2]) == 1.0
    rng = np.random.default_rng(2)
    a, b = rng.integers(0, 5, 9).astype(float), rng.integers(0, 5, 7).astype(float)
    u = sps.mannwhitneyu(a, b).statistic
    assert iv.a12(a, b) == pytest.approx(u / (a.size * b.size))
    ci = iv.a12_interval(a, b, n_boot=500)
    assert 0.0 <= ci.low <= ci.estimate <= ci.high <= 1.0
    # complete separation (6 vs 6 seeds, every run of one above every run of the other):
    # every resample gives 1, so there is no interval, not a certain [1.00, 1.00]
    sep = iv.a12_interval([0.9, 0.91, 0.95, 0.97, 0.99, 1.0], [0.5, 0.52, 0.6, 0.61, 0.7, 0.8])
    assert sep.estimate == 1.0 and np.isnan(sep.low) and np.isnan(sep.high) and sep.method == "none"
    from analysis.verdict import a12_cell

    assert a12_cell(sep.low, sep.high) == "-" and a12_cell(ci.low, ci.high).startswith("[0.")


def test_proportion_intervals_by_hand() -> None:
    # 0 of 12 runs: Wilson upper = z^2 / (n + z^2); Clopper-Pearson upper = 1 - 0.025^(1/12)
    z2 = sps.norm.ppf(0.975) ** 2
    w = iv.proportion_interval(0, 12)
    assert (w.estimate, w.low) == (0.0, 0.0)
    assert w.high == pytest.approx(z2 / (12 + z2))
    cp = iv.proportion_interval(0, 12, method="clopper-pearson")
    assert cp.high == pytest.approx(1 - 0.025 ** (1 / 12))
    mid = iv.proportion_interval(3, 10)
    assert 0 < mid.low < 0.3 < mid.high < 1


def test_share_interval_resampling_runs_only_is_scipys_percentile_bootstrap() -> None:
    rng = np.random.default_rng(5)
    values = rng.uniform(0.5, 1.0, 20)
    hits = (values >= 0.9).astype(float)
    ci = iv.share_interval(values, 0.9, n_boot=20000)
    ref = sps.bootstrap((hits,), np.mean, n_resamples=20000, method="percentile",
                        rng=np.random.default_rng(1)).confidence_interval  # fmt: skip
    assert ci.estimate == hits.mean() and ci.method == "bootstrap-percentile"
    # both bounds are shares k/20; independent draws of the same distribution may differ by one step
    assert abs(ci.low - ref.low) <= 1 / 20 + 1e-12 and abs(ci.high - ref.high) <= 1 / 20 + 1e-12


def test_share_interval_redraws_each_run_from_its_test_examples() -> None:
    # every run far from the level: every redraw agrees, a point interval (Wilson gives the width)
    top, bottom = iv.share_interval([1.0] * 10, 0.9, 300), iv.share_interval([0.1] * 10, 0.9, 300)
    assert (top.low, top.high, bottom.low, bottom.high) == (1.0, 1.0, 0.0, 0.0)
    # every run exactly at the level: the observed share is 1 and seeds alone cannot move it ...
    at = iv.share_interval([0.9] * 10, 0.9)
    assert (at.estimate, at.low, at.high) == (1.0, 1.0, 1.0)
    # ... but each run's 300 examples redrawn reach 270 hits with P = sf(269; 300, 0.9) ~ 0.54,
    # so the share of 10 runs is Binomial(10, 0.54) / 10 and its 95% range is wide
    p = sps.binom.sf(269, 300, 0.9)
    two = iv.share_interval([0.9] * 10, 0.9, 300, n_boot=20000)
    lo, hi = sps.binom.ppf([0.025, 0.975], 10, p) / 10
    assert two.method == "bootstrap-percentile-2level" and hi < 1.0
    # the redraws' upper end lies below the observed share 1.0: the interval reaches up to it
    assert (two.low, two.high) == (pytest.approx(lo), 1.0)
    # just above the level (20 runs at 0.91, 300 examples): the redraw centres near 0.75,
    # and its percentile interval [0.55, 0.95] left out the observed 1.0
    near = iv.share_interval([0.91] * 20, 0.9, 300)
    assert near.estimate == 1.0 and near.low < 0.7 and near.high == 1.0
    # a pooled share that rounds below the level still reaches it: 135 of 150 as a mean of thirds
    pooled = np.mean([41 / 50, 47 / 50, 47 / 50])
    assert pooled < 0.9 and iv.share_interval([pooled] * 3, 0.9).estimate == 1.0


def test_holm_by_hand_and_against_statsmodels() -> None:
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> running max
    p = [0.01, 0.04, 0.03, 0.005]
    assert iv.holm(p).tolist() == pytest.approx([0.03, 0.06, 0.06, 0.02])
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    rng = np.random.default_rng(4)
    q = rng.uniform(0, 0.2, 15)
    ref = multitest.multipletests(q, method="holm")[1]
    assert iv.holm(q) == pytest.approx(ref)
    assert math.isnan(iv.holm([0.1, np.nan])[1])


def _groups(*groups: list[float]) -> pd.DataFrame:
    return pd.DataFrame(
        {"trial_id": [f"g{i}" for i, g in enumerate(groups) for _ in g],
         "value": [v for g in groups for v in g]}
    )  # fmt: skip


def test_fixed_effects_share_by_hand_with_noncentral_f_bounds() -> None:
    # [1, 2, 3] vs [4, 5, 6]: SSB 13.5, SSW 4, MSW 1, F 13.5; omega^2 = (13.5 - 1) / (17.5 + 1)
    s = variance_share(_groups([1, 2, 3], [4, 5, 6]), model="fixed")
    assert s.f_stat == pytest.approx(13.5)
    assert s.estimate == pytest.approx(12.5 / 18.5)
    lam_lo, lam_hi = 6 * s.low / (1 - s.low), 6 * s.high / (1 - s.high)  # share = lam / (lam + N)
    assert sps.ncf.cdf(13.5, 1, 4, lam_lo) == pytest.approx(0.975, abs=1e-6)
    assert sps.ncf.cdf(13.5, 1, 4, lam_hi) == pytest.approx(0.025, abs=1e-6)
    assert 0 <= s.low < s.estimate < s.high <= 1
    none = variance_share(_groups([1, 2, 3], [2, 1, 3]), model="fixed")
    assert none.estimate == 0.0 and none.low == 0.0  # no between-config variance: clipped at 0


def test_icc1_matches_shrout_fleiss_1979() -> None:
    # Shrout & Fleiss (1979), Table 2: 6 targets x 4 judges; ICC(1,1) = .17, 95% [-.13, .72]
    data = [[9, 2, 5, 8], [6, 1, 3, 2], [8, 4, 6, 8], [7, 1, 2, 6], [10, 5, 6, 9], [6, 2, 4, 7]]
    s = variance_share(_groups(*data), model="random")
    assert s.estimate == pytest.approx(0.166, abs=1e-3)
    assert s.low == 0.0  # -0.13, clipped: a share is never negative
    assert s.high == pytest.approx(0.72, abs=5e-3)


def test_icc1_components_match_statsmodels_mixedlm() -> None:
    smf = pytest.importorskip("statsmodels.formula.api")
    rng = np.random.default_rng(7)
    means = rng.normal(0, 1.0, 6)
    df = pd.DataFrame(
        {"trial_id": np.repeat([f"c{i}" for i in range(6)], 10),
         "value": np.repeat(means, 10) + rng.normal(0, 0.8, 60)}
    )  # fmt: skip
    s = variance_share(df, model="random")
    fit = smf.mixedlm("value ~ 1", df, groups=df["trial_id"]).fit(reml=True)
    between, within = float(fit.cov_re.iloc[0, 0]), float(fit.scale)
    assert s.var_between == pytest.approx(between, rel=1e-3)
    assert s.var_within == pytest.approx(within, rel=1e-3)
    assert s.estimate == pytest.approx(between / (between + within), rel=1e-3)


def test_compare_configs_orders_better_first_and_holm_adjusts_every_row() -> None:
    df = pd.DataFrame(
        {"point": ["a"] * 4 + ["b"] * 4 + ["c"] * 4, "split": "test",
         "value": [0.9, 0.8, 0.85, 0.95, 0.5, 0.6, 0.55, 0.65, 0.7, 0.75, 0.8, 0.72]}
    )  # fmt: skip
    c = compare_configs(df, ["test"], n_boot=500)
    assert list(zip(c["better"], c["worse"], strict=True)) == [("a", "c"), ("a", "b"), ("c", "b")]
    welch = sps.ttest_ind([0.9, 0.8, 0.85, 0.95], [0.5, 0.6, 0.55, 0.65], equal_var=False).pvalue
    assert c.loc[1, "p"] == pytest.approx(welch)
    assert c["p_holm"].tolist() == pytest.approx(iv.holm(c["p"]).tolist())
    assert c.loc[1, "a12"] == 1.0 and (c["warn"] == "n<10").all()
    loss = compare_configs(df, ["test"], higher_is_better=False, n_boot=200)
    assert loss.loc[0, "better"] == "b" and loss.loc[0, "diff"] < 0


def test_source_shares_by_hand() -> None:
    # init varies alone: [0, 2, 1] var 1; order varies alone: [0, 1, 0.5] var 0.25 -> 80% / 20%
    runs = pd.DataFrame(
        {"trial_id": ["i"] * 3 + ["o"] * 3, "value": [0, 2, 1, 0, 1, 0.5],
         "init_seed": [1, 2, 3, 1, 1, 1], "order_seed": [5, 5, 5, 6, 7, 8],
         "dropout_seed": 0, "data_seed": 0}
    )  # fmt: skip
    s = source_shares(runs, n_boot=300)
    assert s["source"].tolist() == ["init", "order"]
    assert s["share"].tolist() == pytest.approx([0.8, 0.2])
    assert ((s["low"] >= 0) & (s["high"] <= 1)).all()
    together = runs.assign(order_seed=runs["init_seed"] + 10, init_seed=runs["init_seed"])
    assert source_shares(together.assign(init_seed=[1, 2, 3, 4, 5, 6])).empty
    # every run alike (len_10 exact 1 everywhere): no variance to split, not an even 50/50
    assert source_shares(runs.assign(value=1.0)).empty


def test_source_share_intervals_leave_out_resamples_without_variance() -> None:
    # probe E's xor: every init-varied run reached the event (no variance in any resample);
    # 5 of 6 data-varied runs did. A resample drawing the data config's six 1s has no
    # variance at all (probability (5/6)^6 = 0.335): it has no share, so it is left out and
    # counted, not scored 50/50 (which made the data share's interval [50, 100])
    runs = pd.DataFrame(
        {"trial_id": ["i"] * 6 + ["d"] * 6, "value": [1.0] * 6 + [1.0] * 5 + [0.0],
         "init_seed": [1, 2, 3, 4, 5, 6] + [0] * 6, "data_seed": [0] * 6 + [1, 2, 3, 4, 5, 6],
         "order_seed": 0, "dropout_seed": 0}
    )  # fmt: skip
    s = source_shares(runs, n_boot=2000).set_index("source")
    assert s.loc["data", "share"] == 1.0 and s.loc["init", "share"] == 0.0
    assert (s.loc["data", "low"], s.loc["data", "high"]) == (1.0, 1.0)
    assert (s.loc["init", "low"], s.loc["init", "high"]) == (0.0, 0.0)
    assert s.loc["data", "undefined"] == pytest.approx((5 / 6) ** 6, abs=0.04)
    from analysis.verdict import source_interval

    assert source_interval(s.loc["data"]).startswith("[100, 100] (3")
    assert "% of resamples without variance left out)" in source_interval(s.loc["data"])


def test_excluded_runs_count_not_learned_apart() -> None:
    runs = pd.DataFrame(
        {"trial_id": ["a"] * 5 + ["b"] * 2,
         "status": ["ok", "not_learned", "ok", None, "failed", "diverged", "ok"]}
    )  # fmt: skip
    ex = excluded_runs(runs, {"a": "lr=1"}).set_index("trial_id")
    assert ex.loc["a", "point"] == "lr=1"
    assert ex.loc["a", ["runs", "ok", "not_learned", "diverged", "failed", "other"]].tolist() == [5, 3, 1, 0, 1, 0]
    assert ex.loc["a", "excluded_share"] == 0.4
    assert ex.loc["b", "diverged"] == 1 and ex.loc["b", "high"] <= 1


def test_curve_bands_use_a_fixed_seed_set_and_say_when_seeds_stopped() -> None:
    rows = [("t", "p", s, "val", step, float(s + step)) for s in range(3) for step in (1, 2, 3)]
    rows = [r for r in rows if not (r[2] == 2 and r[4] == 3)]  # seed 2 stopped after step 2
    df = pd.DataFrame(rows, columns=["trial_id", "point", "seed", "split", "step", "value"])
    agg, notes = curve_bands(df, n_boot=200)
    assert agg["step"].tolist() == [1, 2]  # step 3 would average 2 of 3 seeds
    assert agg["mean"].tolist() == pytest.approx([2.0, 3.0])
    assert ((agg["low"] >= agg["mean"] - 1) & (agg["high"] <= agg["mean"] + 1)).all()
    assert notes and "1 of 3 seeds stopped before step 3" in notes[0]
    _, in_epochs = curve_bands(df, n_boot=200, unit="epoch")  # the report's curves by epoch
    assert "stopped before epoch 3; the mean and band end at epoch 2" in in_epochs[0]
    mm, _ = curve_bands(df, band="minmax")
    assert mm["low"].tolist() == [1.0, 2.0] and mm["high"].tolist() == [3.0, 4.0]


def test_performance_profile_fractions() -> None:
    df = pd.DataFrame({"point": ["a"] * 4, "value": [0.1, 0.2, 0.3, 0.4]})
    prof = performance_profile(df)
    assert prof["fraction"].tolist() == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])


def test_grid_sentence_of_a_metric_every_run_scores_the_same() -> None:
    # 3 configs x 4 seeds, test AUC 1.0 everywhere (the simplicity-bias studies): no variance
    # to share out and no best config; another split with a spread keeps its share
    df = pd.DataFrame(
        {"point": np.repeat(["a", "b", "c"], 8), "trial_id": np.repeat(["a", "b", "c"], 8),
         "split": np.tile(["test"] * 4 + ["s_rand"] * 4, 3),
         "value": [1.0] * 4 + [0.4, 0.5, 0.6, 0.5] + [1.0] * 4 + [0.5, 0.6, 0.5, 0.4] + [1.0] * 4 + [0.6, 0.4, 0.5, 0.5]}
    )  # fmt: skip
    shares = grid_shares(df, ["test", "s_rand"])
    cmp = compare_configs(df, ["test", "s_rand"], n_boot=200)
    s = grid_sentence(shares, cmp, "auc", "the grid point (train.lr)", "test")
    assert s.startswith(
        "test auc is 1 in every run of every config (3 configs, at least 4 seeds each)"
    )
    assert "neither the grid point (train.lr) nor the seed moves it" in s
    assert "Best:" not in s and "Other splits: s_rand 0%." in s
    df.loc[0, "value"] = 0.9  # one run differs: back to a share and a best config
    s = grid_sentence(grid_shares(df, ["test", "s_rand"]), compare_configs(df, ["test", "s_rand"], n_boot=200),
                      "auc", "the grid point (train.lr)", "test")  # fmt: skip
    assert s.startswith("The grid point (train.lr) explains") and "Best:" in s
    # b and c score 1.0 in every seed: they tie (no "b over c by 0", no "Holm p = nan"), and
    # the next config, a (mean 0.975), is the one compared
    assert "Best: b and c tie (mean 1 each); the next, a, is behind by 0.025 [" in s
    assert "nan" not in s and " over " not in s


def test_splits_without_spread_within_configs_are_all_between_or_have_no_share() -> None:
    # length studies: count scores 0 and mode 1 on len_20 in every seed (no spread within a
    # config: every bit of the variance lies between them); on len_21 every run scores 0
    # (no variance at all: nothing to share out, not "0% between, the seeds 100%")
    v = pd.DataFrame({"trial_id": ["a"] * 3 + ["b"] * 3, "point": ["kind=count"] * 3 + ["kind=mode"] * 3})
    df = pd.concat([v.assign(split="band", value=[0.1, 0.2, 0.15, 1.0, 0.95, 0.97]),
                    v.assign(split="len_20", value=[0.0] * 3 + [1.0] * 3),
                    v.assign(split="len_21", value=[0.0] * 6)])  # fmt: skip
    shares = grid_shares(df, ["band", "len_20", "len_21"]).set_index("split")
    assert shares.loc["len_20", ["between", "low", "high", "seeds_share"]].tolist() == [1.0, 1.0, 1.0, 0.0]
    assert shares.loc["len_21", ["between", "low", "high", "seeds_share", "icc1"]].isna().all()
    s = grid_sentence(shares.reset_index(), compare_configs(df, ["band", "len_20", "len_21"], n_boot=100),
                      "exact", "the grid point (task.kind)", "band")  # fmt: skip
    assert "Other splits: len_20 100%, len_21 no variance." in s


def test_a_one_config_sentence_gives_the_seed_spread() -> None:
    from analysis.verdict import seed_spread_sentence

    s = seed_spread_sentence(pd.Series([0.5, 0.7, 0.9, np.nan]), "acc", "test", n_boot=200)
    assert "across 3 seeds test acc runs from 0.5 to 0.9 (sd 0.2), mean 0.7 [" in s
    lo, hi = (float(x) for x in s.split("mean 0.7 [")[1].split("]")[0].split(", "))
    assert 0.5 <= lo < 0.7 < hi <= 0.9 and "indicative only" in s
    same = seed_spread_sentence(pd.Series([1.0] * 12), "exact", "len_10")
    assert same == "One config: len_10 exact is 1 for every one of its 12 seeds; the seed does not move it either."


def test_tied_candidates_rank_by_spread_then_trial_id_everywhere() -> None:
    """The verdict's winner and runner-up follow :func:`analysis.manifest.candidate_rank`,
    the order of `study tune`'s ranking SQL and `--from-best` (before: the first maximum in
    table order, so three parts of the tool named three different best candidates)."""
    import duckdb

    from analysis.manifest import candidate_rank
    from analysis.verdict import tuning_section

    trials = pd.DataFrame({"trial_id": ["feb7", "0d59", "aaaa", "zzzz"], "objective": [1.0, 1.0, 1.0, 0.5],
                           "objective_std": [0.0, 0.0, 0.2, 0.0]})
    _, top = tuning_section(trials, maximize=True)
    assert top == ["0d59", "feb7"]
    _, low = tuning_section(trials, maximize=False)
    assert low == ["zzzz", "0d59"]
    assert [r[0] for r in duckdb.sql("SELECT trial_id FROM trials ORDER BY objective DESC, objective_std, trial_id")
            .fetchall()][:2] == top
    assert candidate_rank(1.0, float("nan"), "a", maximize=True) > candidate_rank(1.0, 3.0, "b", maximize=True)



def test_an_undefined_share_prints_as_a_dash() -> None:
    # an event table row for a config whose runs all diverged: no share, no interval
    from analysis.verdict import pct, pct_interval

    assert pct_interval(float("nan"), float("nan"), float("nan")) == "-"
    assert pct_interval(0.5, 0.2, float("nan")) == "50% [20, -]" and pct(0.416) == "42"


# ----------------------------------------------------------------- the statistics probe's findings
def test_two_constant_configs_have_no_p_and_their_best_clause_says_so() -> None:
    """[1, 1, 1] against [0.9, 0.9, 0.9]: Welch's t is 0.1 / 0 (scipy: p = 0, which entered
    Holm's family as a certainty). Now no p, as the docs promised."""
    from analysis.stats import compare

    assert np.isnan(compare([1, 1, 1], [0.9, 0.9, 0.9], n_boot=10).welch_p)
    runs = pd.DataFrame({"point": ["a"] * 3 + ["b"] * 3, "split": "test", "value": [1, 1, 1, 0.9, 0.9, 0.9]})
    row = compare_configs(runs, ["test"], n_boot=50).iloc[0]
    assert np.isnan(row["p"]) and np.isnan(row["p_holm"])
    assert best_clause(compare_configs(runs, ["test"], n_boot=50)).endswith("P(improvement) 1.00 (not significant).")


def test_a_best_config_not_significantly_ahead_is_said_to_be_so() -> None:
    """Holm p 0.54 for the top pair while another pair is significant: "Best" alone read as a win."""
    runs = pd.DataFrame({"point": ["a"] * 4 + ["b"] * 4 + ["c"] * 4, "split": "test",
                         "value": [0.9, 0.8, 0.85, 0.95, 0.8, 0.9, 0.82, 0.88, 0.1, 0.12, 0.11, 0.09]})  # fmt: skip
    cmp = compare_configs(runs, ["test"], n_boot=50)
    top = cmp.iloc[0]
    assert (top["better"], top["worse"]) == ("a", "b") and top["p_holm"] >= 0.05 > cmp["p_holm"].min()
    assert f"Holm p = {top['p_holm']:.2g} (not significant)." in best_clause(cmp)


def test_spearman_p_is_exact_for_a_few_seeds() -> None:
    """rho = 1 with 4 seeds: scipy's t approximation says p = 0; over the 24 pairings, 2 reach
    |rho| = 1, so p = 1/12. With ties, equal to scipy's exact permutation test."""
    from analysis.stats import EXACT_SPEARMAN_N, correlate, exact_spearman_p

    c = correlate([0.1, 0.2, 0.3, 0.4], [1.0, 3.0, 4.0, 9.0], "spearman", n_boot=0)
    assert (c.r, c.p) == (1.0, pytest.approx(2 / 24))
    a, b = np.array([0.3, 0.1, 0.5, 0.2, 0.2]), np.array([1.0, 3.0, 2.0, 5.0, 4.0])
    want = sps.permutation_test((a, b), lambda u, v: sps.spearmanr(u, v).statistic,
                                permutation_type="pairings", n_resamples=np.inf).pvalue  # fmt: skip
    assert exact_spearman_p(a, b) == pytest.approx(want)
    many = np.arange(EXACT_SPEARMAN_N + 1, dtype=float)  # past the exact limit: scipy's p
    assert correlate(many, many**2, "spearman", n_boot=0).p == pytest.approx(sps.spearmanr(many, many**2).pvalue)


def test_grid_caveats_name_unequal_spreads_a_seeds_axis_and_uneven_survivors() -> None:
    """Hand-made: config b spreads 10x config a (Brown-Forsythe p from scipy < 0.05); a
    seeds.vary axis; a kept 4 of 4 runs, b 4 of 6."""
    from analysis.verdict import grid_caveats

    a, b = [0.50, 0.51, 0.49, 0.50], [0.2, 0.8, 0.3, 0.7]
    head = pd.DataFrame({"trial_id": ["ta"] * 4 + ["tb"] * 4, "value": a + b})
    p = sps.levene(np.array(a), np.array(b), center="median").pvalue
    assert p < 0.05
    excluded = pd.DataFrame({"point": ["a", "b"], "trial_id": ["ta", "tb"], "runs": [4, 6], "ok": [4, 4]})
    points = [{"seeds.vary": ["init"], "task.flip": 0.1}, {"seeds.vary": ["data"], "task.flip": 0.1}]
    out = grid_caveats(head, excluded, points, "test")
    assert out[0].startswith(f"the configs' spreads on test differ (Brown-Forsythe p = {p:.2g}; sd 0.0082 to 0.29)")
    assert out[1].startswith("the grid varies seeds.vary: configs that differ only there share every hyperparameter")
    assert out[2].startswith("configs kept different shares of their runs (a 4 of 4, b 4 of 6 ok)")
    even = excluded.assign(runs=[4, 4])
    assert grid_caveats(head.assign(value=[*a, 0.3, 0.31, 0.29, 0.3]), even, [{"x": 1}], "test") == []
