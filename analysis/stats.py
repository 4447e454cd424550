"""Statistics over seeds and configs: pure functions on numpy arrays and DataFrames.

Every function states the shapes it takes and returns. ``values`` arguments are 1-D
(``(n,)``: one value per run, usually per seed); NaNs are dropped and the returned ``n``
counts what was used. Randomness (bootstrap) comes only from
``numpy.random.default_rng(seed)`` with the ``seed`` argument, so results are
reproducible. Where scipy has the routine (t quantiles, Pearson/Spearman, linear
regression, Welch's t, Mann-Whitney U, F distribution) it is used.

Variance decompositions (one-way and two-way ANOVA, seed-source attribution) live in
:mod:`analysis.variance` and are re-exported here.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

from analysis.errors import AnalysisError
from analysis.variance import (
    Anova,
    between_within,
    oneway_anova,
    seed_source_anova,
    source_variance_shares,
    two_way_anova,
)

__all__ = [
    "TRANSFORMS",
    "Anova",
    "Comparison",
    "Correlation",
    "CorrelationMatrix",
    "Interval",
    "Regression",
    "accuracy_bootstrap",
    "apply_transform",
    "between_within",
    "bootstrap_interval",
    "compare",
    "correlate",
    "correlation_matrix",
    "describe",
    "expected_max",
    "group_intervals",
    "oneway_anova",
    "pairwise_correlations",
    "regress",
    "seed_source_anova",
    "source_variance_shares",
    "t_interval",
    "two_way_anova",
]

_CHUNK = 2_000_000
"""Most resampled values held in memory at once by the bootstrap."""


def _clean(values: Any) -> np.ndarray:
    """``values`` as a float array (n,) without NaNs."""
    a = np.asarray(values, dtype=float).ravel()
    return a[~np.isnan(a)]


def _pairs(x: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    """``x`` and ``y`` (n,) with every pair holding a non-finite value dropped."""
    a = np.asarray(x, dtype=float).ravel()
    b = np.asarray(y, dtype=float).ravel()
    if a.shape != b.shape:
        raise AnalysisError(f"paired values differ in length: {a.size} vs {b.size}")
    keep = np.isfinite(a) & np.isfinite(b)
    return a[keep], b[keep]


def _check_level(level: float) -> None:
    if not 0 < level < 1:
        raise AnalysisError(f"confidence level must be in (0, 1), got {level}; e.g. 0.95")


def _resample(
    arrays: Sequence[np.ndarray],
    statistic: Callable[..., np.ndarray],
    n_boot: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Bootstrap replicates (n_boot,) of ``statistic`` over rows resampled jointly.

    ``arrays``: equal-length (n,) arrays resampled with the same indices (paired);
    ``statistic(*samples)`` maps (m, n) samples to (m,) values.
    """
    n = len(arrays[0])
    out = np.empty(n_boot)
    step = max(1, _CHUNK // max(n, 1))
    for start in range(0, n_boot, step):
        m = min(step, n_boot - start)
        idx = rng.integers(0, n, size=(m, n))  # (m, n)
        out[start : start + m] = statistic(*(a[idx] for a in arrays))
    return out


def _percentile(reps: np.ndarray, level: float) -> tuple[float, float]:
    """Percentile interval of bootstrap replicates, ignoring NaN replicates."""
    reps = reps[~np.isnan(reps)]
    if reps.size == 0:
        return float("nan"), float("nan")
    lo, hi = np.quantile(reps, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


@dataclass(frozen=True)
class Interval:
    """A point estimate with a confidence interval."""

    estimate: float
    low: float
    high: float
    level: float
    method: str
    """``t`` or ``bootstrap-percentile``."""
    n: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def describe(values: Any) -> dict[str, float]:
    """n, mean, std (sample, ddof 1; NaN for n < 2), min, max, median of ``values`` (n,)."""
    a = _clean(values)
    if a.size == 0:
        nan = float("nan")
        return {"n": 0, "mean": nan, "std": nan, "min": nan, "max": nan, "median": nan}
    return {
        "n": int(a.size),
        "mean": float(a.mean()),
        "std": float(a.std(ddof=1)) if a.size > 1 else float("nan"),
        "min": float(a.min()),
        "max": float(a.max()),
        "median": float(np.median(a)),
    }


def t_interval(values: Any, level: float = 0.95) -> Interval:
    """Student-t interval of the mean: mean +- t_{(1+level)/2, n-1} * s / sqrt(n).

    ``values``: (n,). NaN bounds for n < 2.
    """
    _check_level(level)
    a = _clean(values)
    mean = float(a.mean()) if a.size else float("nan")
    if a.size < 2:
        return Interval(mean, float("nan"), float("nan"), level, "t", int(a.size))
    half = float(sps.t.ppf((1 + level) / 2, a.size - 1) * a.std(ddof=1) / np.sqrt(a.size))
    return Interval(mean, mean - half, mean + half, level, "t", int(a.size))


def bootstrap_interval(
    values: Any,
    statistic: Callable[..., Any] = np.mean,
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Percentile bootstrap interval of ``statistic`` over ``values`` (n,).

    ``statistic(x, axis=-1)`` must reduce along ``axis`` (``np.mean``, ``np.median``,
    ``np.std``...). Resampling uses ``default_rng(seed)``. NaN bounds for n < 2.
    """
    _check_level(level)
    a = _clean(values)
    est = float(statistic(a, axis=-1)) if a.size else float("nan")
    if a.size < 2:
        return Interval(est, float("nan"), float("nan"), level, "bootstrap-percentile", int(a.size))
    rng = np.random.default_rng(seed)
    reps = _resample([a], lambda s: statistic(s, axis=-1), n_boot, rng)
    lo, hi = _percentile(reps, level)
    return Interval(est, lo, hi, level, "bootstrap-percentile", int(a.size))


def group_intervals(
    df: pd.DataFrame,
    by: Sequence[str],
    value: str = "value",
    *,
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> pd.DataFrame:
    """Per group of ``by``: n, mean, std, t interval and bootstrap interval of the mean.

    ``df``: long table, one row per run. Returns columns ``*by, n, mean, std, t_low,
    t_high, boot_low, boot_high``, one row per group (sorted by ``by``). The g-th group
    (0-based, sorted order) is bootstrapped with ``default_rng(seed + g)``.
    """
    rows = []
    for g, (key, sub) in enumerate(df.groupby(list(by), sort=True, dropna=False)):
        key = key if isinstance(key, tuple) else (key,)
        d = describe(sub[value])
        t = t_interval(sub[value], level)
        b = bootstrap_interval(sub[value], n_boot=n_boot, level=level, seed=seed + g)
        rows.append((*key, d["n"], d["mean"], d["std"], t.low, t.high, b.low, b.high))
    cols = [*by, "n", "mean", "std", "t_low", "t_high", "boot_low", "boot_high"]
    return pd.DataFrame(rows, columns=cols)


# ---------------------------------------------------------------------------- correlation


def _pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson r of each row pair: (m, n), (m, n) -> (m,); NaN where a row is constant."""
    xc = x - x.mean(axis=-1, keepdims=True)
    yc = y - y.mean(axis=-1, keepdims=True)
    num = (xc * yc).sum(axis=-1)
    den = np.sqrt((xc * xc).sum(axis=-1) * (yc * yc).sum(axis=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = num / den
    return np.where(den > 0, r, np.nan)


def _spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman rho of each row pair (Pearson on average ranks): (m, n) x2 -> (m,)."""
    return _pearson_rows(sps.rankdata(x, axis=-1), sps.rankdata(y, axis=-1))


_ROW_CORR = {"pearson": _pearson_rows, "spearman": _spearman_rows}


@dataclass(frozen=True)
class Correlation:
    """A correlation across runs with its p-value and bootstrap interval."""

    method: str
    r: float
    p: float
    low: float
    high: float
    level: float
    n: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


EXACT_SPEARMAN_N = 8
"""Up to this many pairs, Spearman's p is exact (every one of the n! pairings; 40,320 at 8):
scipy's t approximation gave p = 0 for rho = 1 with 4 seeds, where the exact p is 2/24."""


def _r_p(a: np.ndarray, b: np.ndarray, method: str) -> tuple[float, float]:
    if a.size < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan"), float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = sps.pearsonr(a, b) if method == "pearson" else sps.spearmanr(a, b)
    if method == "spearman" and a.size <= EXACT_SPEARMAN_N:
        return float(res.statistic), exact_spearman_p(a, b)
    return float(res.statistic), float(res.pvalue)


def exact_spearman_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p of Spearman's rho of ``a``, ``b`` (n,) over all n! pairings of ``b``'s
    ranks with ``a``'s: the share whose |rho| reaches the observed one (ties: average ranks).
    What ``scipy.stats.permutation_test(..., permutation_type="pairings")`` computes exactly,
    without its per-pairing Python calls (tested equal to it)."""
    ra, rb = sps.rankdata(a), sps.rankdata(b)
    perms = np.array(list(itertools.permutations(range(a.size))))  # (n!, n)
    shuffled = rb[perms] - rb.mean()  # (n!, n)
    ca = ra - ra.mean()  # (n,)
    rho = shuffled @ ca / np.sqrt((shuffled**2).sum(1) * (ca**2).sum())  # (n!,)
    observed = rho[0]  # the identity pairing comes first
    return float(np.mean(np.abs(rho) >= abs(observed) - 1e-12))


def correlate(
    x: Any,
    y: Any,
    method: str = "pearson",
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> Correlation:
    """Pearson or Spearman correlation of paired ``x``, ``y`` (n,) across runs.

    r and p from scipy; the interval is a percentile bootstrap over resampled pairs
    (replicates where a resample is constant are dropped). ``n_boot=0`` skips it.
    NaN r and p for n < 3 or a constant input.
    """
    if method not in _ROW_CORR:
        raise AnalysisError(f"unknown correlation method {method!r}; use pearson or spearman")
    _check_level(level)
    a, b = _pairs(x, y)
    r, p = _r_p(a, b, method)
    lo = hi = float("nan")
    if n_boot > 0 and not np.isnan(r):
        reps = _resample([a, b], _ROW_CORR[method], n_boot, np.random.default_rng(seed))
        lo, hi = _percentile(reps, level)
    return Correlation(method, r, p, lo, hi, level, int(a.size))


def pairwise_correlations(
    wide: pd.DataFrame,
    columns: Sequence[str] | None = None,
    method: str = "pearson",
    *,
    n_boot: int = 0,
    level: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Correlation of every pair of ``columns`` of a seed-by-split wide table.

    ``wide``: one row per run, one column per split (NaN where missing; pairwise
    complete rows are used). Returns one row per pair i < j with columns x, y, n, r, p,
    low, high (bootstrap bounds only when ``n_boot > 0``).
    """
    cols = list(columns) if columns is not None else list(wide.columns)
    rows = []
    for i, cx in enumerate(cols):
        for cy in cols[i + 1 :]:
            c = correlate(wide[cx], wide[cy], method, n_boot=n_boot, level=level, seed=seed)
            rows.append((cx, cy, c.n, c.r, c.p, c.low, c.high))
    return pd.DataFrame(rows, columns=["x", "y", "n", "r", "p", "low", "high"])


@dataclass(frozen=True)
class CorrelationMatrix:
    """Square (k, k) matrices over k columns: r, p and n (pairwise-complete counts)."""

    columns: tuple[str, ...]
    r: pd.DataFrame
    p: pd.DataFrame
    n: pd.DataFrame
    method: str


def correlation_matrix(
    wide: pd.DataFrame, columns: Sequence[str] | None = None, method: str = "pearson"
) -> CorrelationMatrix:
    """Correlation matrix of ``columns`` of a wide table (rows = runs, columns = splits).

    Diagonal: r = 1, p = 0, n = non-missing count of that column; NaN r and p where the
    column has fewer than 2 values or never varies (a correlation with itself is then as
    undefined as with any other column).
    """
    cols = list(columns) if columns is not None else list(wide.columns)
    k = len(cols)
    r, p, n = np.eye(k), np.zeros((k, k)), np.zeros((k, k), dtype=int)
    for i, cx in enumerate(cols):
        n[i, i] = int(wide[cx].notna().sum())
        if n[i, i] < 2 or np.ptp(wide[cx].dropna().to_numpy(dtype=float)) == 0:
            r[i, i] = p[i, i] = np.nan
        for j in range(i + 1, k):
            a, b = _pairs(wide[cx], wide[cols[j]])
            rr, pp = _r_p(a, b, method)
            r[i, j] = r[j, i] = rr
            p[i, j] = p[j, i] = pp
            n[i, j] = n[j, i] = a.size
    frame = lambda m: pd.DataFrame(m, index=cols, columns=cols)  # noqa: E731
    return CorrelationMatrix(tuple(cols), frame(r), frame(p), frame(n), method)


# ---------------------------------------------------------------------------- regression

TRANSFORMS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "identity": lambda v: v,
    "neglog": lambda v: -np.log(v),
    "log": np.log,
    "neg": np.negative,
}
"""Axis transforms by name: ``neglog`` is -log(x) (e.g. of a validation loss)."""


def apply_transform(values: Any, name: str | None) -> np.ndarray:
    """``values`` (n,) through the transform ``name`` (``None``: identity); non-positive
    inputs to ``log``/``neglog`` give NaN."""
    if name is None:
        name = "identity"
    if name not in TRANSFORMS:
        raise AnalysisError(
            f"unknown transform {name!r}; use one of: {', '.join(TRANSFORMS)} "
            "(fix the 'transform' of the task's analysis declaration)"
        )
    a = np.asarray(values, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = TRANSFORMS[name](a)
    return np.where(np.isfinite(out), out, np.nan)


@dataclass(frozen=True)
class Regression:
    """Least-squares line y = slope * x + intercept (after transforms)."""

    slope: float
    intercept: float
    r: float
    r2: float
    p: float
    """Two-sided p-value of slope = 0 (Wald t test, scipy.stats.linregress)."""
    stderr: float
    n: int
    x_transform: str | None = None
    y_transform: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def regress(
    x: Any, y: Any, *, x_transform: str | None = None, y_transform: str | None = None
) -> Regression:
    """Regress ``y`` on ``x`` (paired (n,) arrays) after optional transforms.

    Pairs where either side is non-finite after its transform are dropped. NaN results
    for n < 3 or constant x. A constant y is a flat line: slope exactly 0 and intercept y,
    with r, R^2 and p undefined (NaN); least squares would give a slope of +-1e-28 whose
    sign is rounding.
    """
    a, b = _pairs(apply_transform(x, x_transform), apply_transform(y, y_transform))
    nan = float("nan")
    if a.size < 3 or np.ptp(a) == 0:
        return Regression(nan, nan, nan, nan, nan, nan, int(a.size), x_transform, y_transform)
    if np.ptp(b) == 0:
        return Regression(0.0, float(b[0]), nan, nan, nan, 0.0, int(a.size), x_transform, y_transform)
    res = sps.linregress(a, b)
    r = float(res.rvalue)
    return Regression(
        float(res.slope),
        float(res.intercept),
        r,
        r * r,
        float(res.pvalue),
        float(res.stderr),
        int(a.size),
        x_transform,
        y_transform,
    )


# ---------------------------------------------------------------------------- over seeds


def expected_max(values: Any, n_max: int | None = None) -> pd.DataFrame:
    """Expected maximum performance of n runs drawn from ``values`` (Dodge et al., 2019).

    With the empirical CDF of the N observed values sorted v_(1) <= ... <= v_(N),
    E[max of n] = sum_i v_(i) * ((i/N)^n - ((i-1)/N)^n) (draws with replacement); ``std``
    is the standard deviation of that maximum. ``values``: (N,). Returns one row per n in
    1..n_max (default N): columns n, expected_max, std.
    """
    v = np.sort(_clean(values))
    if v.size == 0:
        raise AnalysisError("expected_max needs at least one value; no runs have this metric")
    N = v.size
    n_max = N if n_max is None else int(n_max)
    ns = np.arange(1, n_max + 1)  # (n_max,)
    i = np.arange(1, N + 1) / N  # (N,)
    w = i[None, :] ** ns[:, None] - (i[None, :] - 1 / N) ** ns[:, None]  # (n_max, N)
    mean = w @ v
    var = np.maximum(w @ (v * v) - mean**2, 0.0)
    return pd.DataFrame({"n": ns, "expected_max": mean, "std": np.sqrt(var)})


@dataclass(frozen=True)
class Comparison:
    """Two configs compared across their seeds (a vs b; diff = mean_a - mean_b)."""

    n_a: int
    n_b: int
    mean_a: float
    mean_b: float
    diff: float
    diff_low: float
    diff_high: float
    level: float
    welch_t: float
    welch_df: float
    welch_p: float
    mwu_u: float
    """Mann-Whitney U of ``a`` (the number of (a, b) pairs with a > b, ties count 1/2)."""
    mwu_p: float
    cohen_d: float
    """(mean_a - mean_b) / pooled sample standard deviation."""
    hedges_g: float
    """Cohen's d times the small-sample correction 1 - 3 / (4 (n_a + n_b) - 9)."""
    a12: float
    """Vargha-Delaney A12 = P(a > b) + P(a = b) / 2 (common-language effect size)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(
    a: Any, b: Any, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> Comparison:
    """Compare two configs' per-seed values ``a`` (n_a,) and ``b`` (n_b,).

    Welch's t test and Mann-Whitney U (two-sided, scipy), a percentile bootstrap interval
    of mean_a - mean_b (each group resampled independently, ``default_rng(seed)``), and
    effect sizes. Needs at least 2 values per group.
    """
    _check_level(level)
    x, y = _clean(a), _clean(b)
    if x.size < 2 or y.size < 2:
        raise AnalysisError(
            f"compare needs at least 2 runs per config, got {x.size} and {y.size}; run more seeds"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = sps.ttest_ind(x, y, equal_var=False)
        u = sps.mannwhitneyu(x, y, alternative="two-sided")
    rng = np.random.default_rng(seed)
    ia = rng.integers(0, x.size, size=(n_boot, x.size))  # (B, n_a)
    ib = rng.integers(0, y.size, size=(n_boot, y.size))  # (B, n_b)
    lo, hi = _percentile(x[ia].mean(axis=1) - y[ib].mean(axis=1), level)
    pooled = np.sqrt(
        ((x.size - 1) * x.var(ddof=1) + (y.size - 1) * y.var(ddof=1)) / (x.size + y.size - 2)
    )
    diff = float(x.mean() - y.mean())
    d = diff / pooled if pooled > 0 else float("nan")
    g = d * (1 - 3 / (4 * (x.size + y.size) - 9))
    return Comparison(
        n_a=int(x.size),
        n_b=int(y.size),
        mean_a=float(x.mean()),
        mean_b=float(y.mean()),
        diff=diff,
        diff_low=lo,
        diff_high=hi,
        level=level,
        welch_t=float(t.statistic),
        welch_df=float(getattr(t, "df", np.nan)),
        # neither config varies: Welch's t is undefined (scipy's t = inf gives p = 0, a certainty
        # three seeds cannot carry), so no p, as a row of compare_configs promises
        welch_p=float("nan") if np.ptp(x) == 0 and np.ptp(y) == 0 else float(t.pvalue),
        mwu_u=float(u.statistic),
        mwu_p=float(u.pvalue),
        cohen_d=float(d),
        hedges_g=float(g),
        a12=float(u.statistic) / (x.size * y.size),
    )


# ---------------------------------------------------------------------------- over examples


def accuracy_bootstrap(
    data: pd.DataFrame,
    *,
    by: Sequence[str] | None = None,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Bootstrap over test examples of each run's accuracy (the variance of the test set).

    ``data`` is either the predictions table (one row per example, boolean ``correct``)
    or its counts (columns ``n`` and ``correct``: see
    :func:`analysis.queries.prediction_counts`). ``by`` defaults to the present columns of
    (study, trial_id, seed, split). Resampling n examples with replacement from a run with
    k correct makes the resampled accuracy Binomial(n, k/n) / n exactly, so replicates are
    drawn that way (``default_rng(seed)``, groups in sorted order). Returns columns ``*by,
    n, correct, accuracy, low, high``.
    """
    _check_level(level)
    if by is None:
        by = [c for c in ("study", "trial_id", "seed", "split") if c in data.columns]
    by = list(by)
    if "n" in data.columns:
        counts = data[[*by, "n", "correct"]].groupby(by, sort=True, as_index=False).sum()
    elif "correct" in data.columns:
        counts = (
            data.assign(_c=data["correct"].astype(bool))
            .groupby(by, sort=True)["_c"]
            .agg(n="size", correct="sum")
            .reset_index()
        )
    else:
        raise AnalysisError(
            "accuracy_bootstrap needs a boolean 'correct' column (predictions table) "
            "or 'n' and 'correct' counts"
        )
    rng = np.random.default_rng(seed)
    n = counts["n"].to_numpy(dtype=np.int64)
    k = counts["correct"].to_numpy(dtype=np.int64)
    acc = np.where(n > 0, k / np.maximum(n, 1), np.nan)
    reps = rng.binomial(n[:, None], np.nan_to_num(acc)[:, None], size=(n.size, n_boot))  # (G, B)
    reps = reps / np.maximum(n, 1)[:, None]
    lo, hi = np.quantile(reps, [(1 - level) / 2, (1 + level) / 2], axis=1)
    out = counts.copy()
    out["accuracy"] = acc
    out["low"] = np.where(n > 0, lo, np.nan)
    out["high"] = np.where(n > 0, hi, np.nan)
    return out
