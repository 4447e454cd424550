"""analysis.seedcount by hand, against statsmodels, and the power formula against a simulation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from analysis import seedcount as sc


def test_seeds_for_half_width_by_hand() -> None:
    # sd 0.05, +-0.02 at 95%: t_{.975,25} 0.05 / sqrt(26) = 2.0595 * 0.009806 = 0.02020 > 0.02,
    # t_{.975,26} 0.05 / sqrt(27) = 2.0555 * 0.009623 = 0.01978 <= 0.02: 27 seeds
    assert sc.half_width(0.05, 26) == pytest.approx(0.020196, abs=1e-5)
    assert sc.half_width(0.05, 27) == pytest.approx(0.019781, abs=1e-5)
    assert sc.seeds_for_half_width(0.05, 0.02) == 27
    assert sc.seeds_for_half_width(0.0, 0.02) == 2
    assert sc.seeds_for_half_width(1.0, 1e-9) is None  # beyond MAX_SEEDS
    assert sc.seeds_for_half_width(float("nan"), 0.02) is None


def test_sd_upper_by_hand() -> None:
    # sd 1 from 10 runs: sqrt(9 / chi2_{0.05, 9}) = sqrt(9 / 3.3251) = 1.6452
    assert sc.sd_upper(1.0, 10) == pytest.approx(1.6452, abs=1e-4)
    assert math.isnan(sc.sd_upper(1.0, 1))


def test_power_matches_statsmodels_for_equal_spreads() -> None:
    from statsmodels.stats.power import TTestIndPower

    ref = TTestIndPower()
    for d, n in [(0.5, 64), (0.8, 10), (1.2, 5), (0.2, 200)]:
        assert sc.welch_power(d, 1.0, 1.0, n, n) == pytest.approx(
            ref.power(effect_size=d, nobs1=n, alpha=0.05, ratio=1.0), abs=1e-6
        )
    # the textbook case: half a standard deviation at 80% takes 64 per group (63.8 rounded up)
    assert ref.solve_power(effect_size=0.5, power=0.8, alpha=0.05) == pytest.approx(63.77, abs=0.01)
    assert sc.seeds_for_power(0.5, 1.0, 1.0) == 64


def test_power_formula_against_a_simulation_of_the_welch_test() -> None:
    rng = np.random.default_rng(3)
    for diff, sa, sb, na, nb in [
        (1.0, 1.0, 1.5, 10, 14),
        (0.03, 0.02, 0.05, 8, 8),
        (0.0, 1.0, 2.0, 6, 12),
    ]:
        sims = 20_000
        a = rng.normal(diff, sa, size=(sims, na))
        b = rng.normal(0.0, sb, size=(sims, nb))
        p = sps.ttest_ind(a, b, axis=1, equal_var=False).pvalue
        simulated = float(np.mean(p < 0.05))
        predicted = sc.welch_power(diff, sa, sb, na, nb) if diff else 0.05
        assert simulated == pytest.approx(predicted, abs=0.015), (diff, sa, sb, na, nb)


def test_seeds_for_power_is_the_first_count_reaching_it() -> None:
    n = sc.seeds_for_power(0.02, 0.03, 0.04)
    assert n is not None and n > 2
    assert (
        sc.welch_power(0.02, 0.03, 0.04, n, n)
        >= 0.8
        > sc.welch_power(0.02, 0.03, 0.04, n - 1, n - 1)
    )
    assert sc.seeds_for_power(0.0, 1.0, 1.0) is None
    assert sc.seeds_for_power(0.1, 0.0, 0.0) == 2


def test_seed_count_table_and_defaults() -> None:
    vals = pd.DataFrame({"point": "p", "split": "long", "value": [0.80, 0.82, 0.84, 0.86, 0.88]})
    h, d, how = sc.default_targets(vals["value"])
    assert (h, d) == (0.02, 0.05) and "[0, 1]" in how
    t = sc.seed_count_table(vals, half_width_target=h, difference=d)
    r = t.iloc[0]
    sd = math.sqrt(np.var([0.80, 0.82, 0.84, 0.86, 0.88], ddof=1))  # 0.0316
    assert (r["n"], r["mean"], r["sd"]) == (5, pytest.approx(0.84), pytest.approx(sd))
    assert r["half_width_now"] == pytest.approx(sps.t.ppf(0.975, 4) * sd / math.sqrt(5))
    assert r["seeds_needed"] == sc.seeds_for_half_width(sd, 0.02)
    assert r["seeds_needed_sd_upper"] >= r["seeds_needed"]
    assert r["seeds_per_config"] == sc.seeds_for_power(0.05, sd, sd)
    assert r["warn"] == "n<10"
    big = pd.Series([100.0, 120.0, 140.0])
    assert sc.default_targets(big)[:2] == pytest.approx((2.4, 6.0))


def test_power_table_flags_underpowered_comparisons() -> None:
    rng = np.random.default_rng(0)
    rows = [("a", "test", v) for v in 0.80 + 0.05 * rng.standard_normal(5)]
    rows += [("b", "test", v) for v in 0.78 + 0.05 * rng.standard_normal(5)]
    rows += [("c", "test", v) for v in 0.20 + 0.01 * rng.standard_normal(5)]
    vals = pd.DataFrame(rows, columns=["point", "split", "value"])
    pairs = pd.DataFrame({"split": "test", "better": ["a", "a"], "worse": ["b", "c"]})
    t = sc.power_table(vals, pairs, difference=0.05).set_index("worse")
    # a and b spread 0.05 each: 5 seeds find a true 0.05 with power below 0.8; a and c spread
    # less, so the same 0.05 is found almost surely; power is for the target, not the observed 0.6
    assert bool(t.loc["b", "underpowered"]) and t.loc["b", "seeds_needed"] > 5
    assert t.loc["b", "power"] == pytest.approx(sc.welch_power(0.05, t.loc["b", "sd_better"], t.loc["b", "sd_worse"], 5, 5))
    assert not t.loc["c", "underpowered"] and t.loc["c", "power"] > 0.9 and t.loc["c", "diff"] > 0.5
    assert (t["difference"] == 0.05).all()
