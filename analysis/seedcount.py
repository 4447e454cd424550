"""How many seeds? Seed counts from a study's own spread.

Two questions, answered from the spread across seeds the study measured (sample standard
deviation ``s`` of the ok runs' final values, one value per run):

* **Estimate a mean to +-h**: the smallest n with ``t_{1-a/2, n-1} * s / sqrt(n) <= h``
  (the half-width of the t interval of the mean; n is found by search since the t
  quantile depends on n). Because ``s`` itself is uncertain, the count is also given
  with ``s`` at its one-sided upper ``level`` bound ``s * sqrt((n-1) / chi2_{1-level, n-1})``.
* **Detect a difference d between two configs**: seeds per config (equal counts) for a
  two-sided Welch t-test at ``alpha`` to reach ``power``. Power is computed from the
  noncentral t distribution: ``T ~ t'(df, ncp)`` with ``ncp = d / sqrt(s_a^2/n_a +
  s_b^2/n_b)`` and the Welch-Satterthwaite ``df``; ``power = P(T > t_c) + P(T < -t_c)``,
  ``t_c = t_{1-alpha/2, df}`` (checked against a simulation of the test in the tests).

Assumptions (printed with the numbers, :data:`ASSUMPTIONS`): runs are independent draws
(one per seed) of a roughly normal metric; the study's standard deviations stand in for
the true ones; configs get equal seed counts. Bounded metrics near 0 or 1 (accuracy
close to 100%) are far from normal: treat counts there as rough.

Pure functions; :func:`seed_count_table` and :func:`power_table` take long tables whose
shapes their docstrings state.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd
from scipy import stats as sps

from analysis import intervals as iv
from analysis.manifest import MetricSense

MAX_SEEDS = 100_000
"""Search cap: a count above this is reported as ``None`` (not reachable in practice)."""

POWER = 0.8
"""Target power of the seed counts for a difference, and the underpowered threshold."""

ALPHA = 0.05
"""Two-sided significance level of the tests the counts plan for."""

UNIT_HALF_WIDTH = 0.02
"""Default half-width for metrics within [0, 1] (two points of accuracy)."""

UNIT_DIFFERENCE = 0.05
"""Default difference to detect for metrics within [0, 1] (five points)."""

RELATIVE = 0.02, 0.05
"""Defaults for other metrics, as fractions of the mean's magnitude (half-width, difference)."""

ASSUMPTIONS = (
    "seeds are independent draws of a roughly normal metric; the study's standard deviations "
    "stand in for the true ones (see the sd-upper column); mean: t interval at 95%; "
    f"difference: two-sided Welch t-test at alpha {ALPHA}, {POWER:.0%} power, equal seeds per config"
)


def half_width(sd: float, n: int, level: float = 0.95) -> float:
    """Half-width of the ``level`` t interval of a mean of ``n`` values with sd ``sd``."""
    if n < 2 or not np.isfinite(sd):
        return float("nan")
    return float(sps.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n))


def sd_upper(sd: float, n: int, level: float = 0.95) -> float:
    """One-sided upper ``level`` bound of a standard deviation estimated from ``n`` values."""
    if n < 2 or not np.isfinite(sd):
        return float("nan")
    return float(sd * math.sqrt((n - 1) / sps.chi2.ppf(1 - level, n - 1)))


def _smallest(ok: Callable[[int], bool], start: int = 2, cap: int = MAX_SEEDS) -> int | None:
    """The smallest n >= start with ``ok(n)``, for ``ok`` false then true (monotone)."""
    if ok(start):
        return start
    lo, hi = start, start * 2
    while not ok(hi):
        if hi >= cap:
            return None
        lo, hi = hi, min(hi * 2, cap)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def seeds_for_half_width(sd: float, target: float, level: float = 0.95) -> int | None:
    """Seeds to estimate a mean to +-``target`` at ``level`` (t interval), sd ``sd``:
    the smallest n >= 2 with :func:`half_width` <= target; ``None`` if above
    :data:`MAX_SEEDS` or undefined."""
    if not (np.isfinite(sd) and np.isfinite(target)) or target <= 0:
        return None
    return _smallest(lambda n: half_width(sd, n, level) <= target)


def welch_power(
    diff: float, sd_a: float, sd_b: float, n_a: int, n_b: int, alpha: float = ALPHA
) -> float:
    """Power of the two-sided Welch t-test at ``alpha`` to detect a true difference
    ``diff`` between means of groups with sds ``sd_a``, ``sd_b`` and ``n_a``, ``n_b`` runs
    (noncentral t; see the module docstring). NaN when undefined."""
    if n_a < 2 or n_b < 2 or not all(np.isfinite([diff, sd_a, sd_b])):
        return float("nan")
    va, vb = sd_a**2 / n_a, sd_b**2 / n_b
    se = math.sqrt(va + vb)
    if se == 0:
        return 1.0 if diff != 0 else float("nan")
    df = (va + vb) ** 2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1))
    tc = sps.t.ppf(1 - alpha / 2, df)
    ncp = abs(diff) / se
    return float(sps.nct.sf(tc, df, ncp) + sps.nct.cdf(-tc, df, ncp))


def seeds_for_power(
    diff: float, sd_a: float, sd_b: float, power: float = POWER, alpha: float = ALPHA
) -> int | None:
    """Seeds per config (both configs the same count) for :func:`welch_power` >= ``power``;
    ``None`` for no difference, undefined sds, or a count above :data:`MAX_SEEDS`."""
    if not all(np.isfinite([diff, sd_a, sd_b])) or diff == 0:
        return None
    return _smallest(lambda n: welch_power(diff, sd_a, sd_b, n, n, alpha) >= power)


def default_targets(values: pd.Series, sense: MetricSense | None = None) -> tuple[float, float, str]:
    """(half-width, difference, how they were chosen) for a metric's values: +-0.02 and
    0.05 (2 and 5 points) for a metric within [0, 1], else 2% and 5% of |mean|. The range
    is the task's declaration (``sense``); without one, values all within [0, 1] count as
    such a metric."""
    v = values.dropna()
    unit = sense.unit if sense is not None and sense.declared else v.empty or (v.min() >= 0 and v.max() <= 1)
    if unit:
        return UNIT_HALF_WIDTH, UNIT_DIFFERENCE, "points of a [0, 1] metric"
    scale = abs(float(v.mean())) or 1.0
    return RELATIVE[0] * scale, RELATIVE[1] * scale, "2% / 5% of the headline split's mean"


SEED_COLUMNS = (
    "point", "split", "n", "mean", "sd", "half_width_now", "half_width", "seeds_needed",
    "sd_upper", "seeds_needed_sd_upper", "difference", "seeds_per_config", "warn",
)  # fmt: skip


def seed_count_table(
    values: pd.DataFrame,
    *,
    half_width_target: float,
    difference: float,
    level: float = 0.95,
    power: float = POWER,
    alpha: float = ALPHA,
) -> pd.DataFrame:
    """Per (point, split): the seeds needed to estimate the mean to +-``half_width_target``
    and to detect ``difference`` against a config of the same spread.

    ``values``: one row per ok run, columns point, split, value. Returns
    :data:`SEED_COLUMNS`: n runs, mean, sd, the half-width the study has now, the target,
    seeds needed (with sd and with sd at its upper bound), the difference and the seeds
    per config to detect it (:func:`seeds_for_power`, both configs with this sd).
    """
    rows = []
    for (point, split), sub in values.groupby(["point", "split"], sort=False):
        v = sub["value"].dropna().to_numpy(dtype=float)
        n = v.size
        sd = float(np.std(v, ddof=1)) if n >= 2 else float("nan")
        up = sd_upper(sd, n, level)
        rows.append((point, split, n, float(v.mean()) if n else float("nan"), sd,
                     half_width(sd, n, level), half_width_target,
                     seeds_for_half_width(sd, half_width_target, level), up,
                     seeds_for_half_width(up, half_width_target, level), difference,
                     seeds_for_power(difference, sd, sd, power, alpha), iv.seed_warning(n)))  # fmt: skip
    return pd.DataFrame(rows, columns=list(SEED_COLUMNS))


POWER_COLUMNS = (
    "split", "better", "worse", "n_better", "n_worse", "sd_better", "sd_worse", "diff", "difference",
    "power", "seeds_needed", "underpowered",
)  # fmt: skip


def power_table(
    values: pd.DataFrame, pairs: pd.DataFrame, *, difference: float, power: float = POWER, alpha: float = ALPHA
) -> pd.DataFrame:
    """Power of each config comparison at its seed counts, to detect a true difference of
    ``difference`` (the size worth finding, chosen before looking: ``--difference``, or the
    metric's default).

    ``values``: one row per ok run, columns point, split, value. ``pairs``: columns split,
    better, worse (points; e.g. :func:`analysis.verdict.compare_configs`' rows). Returns
    :data:`POWER_COLUMNS`: the observed difference of means (for reference), the target
    ``difference``, the Welch power to detect it with the seeds and spreads the study has,
    the seeds per config that would give ``power``, and ``underpowered`` (power < ``power``).
    Not power at the observed difference: that is a function of the comparison's p and says
    nothing more (Hoenig and Heisey 2001).
    """
    rows = []
    groups = {
        k: g["value"].dropna().to_numpy(dtype=float) for k, g in values.groupby(["split", "point"])
    }
    for r in pairs.itertuples(index=False):
        a, b = groups.get((r.split, r.better)), groups.get((r.split, r.worse))
        if a is None or b is None or a.size < 2 or b.size < 2:
            continue
        sa, sb = float(np.std(a, ddof=1)), float(np.std(b, ddof=1))
        d = float(a.mean() - b.mean())
        pw = welch_power(difference, sa, sb, a.size, b.size, alpha)
        rows.append((r.split, r.better, r.worse, a.size, b.size, sa, sb, d, difference, pw,
                     seeds_for_power(difference, sa, sb, power, alpha), bool(pw < power)))  # fmt: skip
    return pd.DataFrame(rows, columns=list(POWER_COLUMNS))


def curve_points(
    sd: float, n_now: int, level: float = 0.95, top: int | None = None
) -> pd.DataFrame:
    """The half-width against the number of seeds, n = 2 up to the largest of ``top``, 4x
    the seeds the study has and 100, for the seed-count chart. Columns n, half_width."""
    top = max(100, 4 * n_now, top or 0)
    ns = np.unique(np.round(np.geomspace(2, top, 60)).astype(int))
    return pd.DataFrame({"n": ns, "half_width": [half_width(sd, int(n), level) for n in ns]})
