"""Where does the variance come from? ANOVA between configs and between seed sources.

Pure functions on long DataFrames (one row per run, a ``value`` column and grouping
columns). Re-exported by :mod:`analysis.stats`.

Seed-source attribution, documented choice. A study can vary one seed source (init,
order, dropout, data) while holding the others fixed. Two designs are handled:

* **separate** (:func:`source_variance_shares`): each group of runs (a study, or a grid
  point) varies exactly one source. Its variance across seeds estimates that source's
  variance; a source's *share* is its variance over the sum of the single-source
  variances. This assumes the sources act independently and additively.
* **crossed** (:func:`seed_source_anova`, :func:`two_way_anova`): one group of runs in
  which several sources vary and their seeds repeat across runs (e.g. 5 init seeds x 5
  order seeds). Each source's share is eta^2 = SS_between(source) / SS_total of a one-way
  ANOVA grouping the runs by that source's seed; in a balanced crossed design these main
  effects are orthogonal and the remainder (1 - their sum) is interaction plus noise.
  :func:`two_way_anova` gives the full two-factor table including the interaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

from analysis.errors import AnalysisError
from analysis.schema import SEED_SOURCES


@dataclass(frozen=True)
class Anova:
    """One-way ANOVA of a value across groups, with ICC(1).

    ``icc1 = (ms_between - ms_within) / (ms_between + (k0 - 1) ms_within)``, where k0 is
    the (adjusted mean) group size; ``var_between = max(0, (ms_between - ms_within) / k0)``
    and ``var_within = ms_within`` are the variance components.
    """

    n: int
    n_groups: int
    k0: float
    ss_between: float
    ss_within: float
    df_between: int
    df_within: int
    ms_between: float
    ms_within: float
    f_stat: float
    p: float
    eta2: float
    icc1: float
    var_between: float
    var_within: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def oneway_anova(df: pd.DataFrame, group: str, value: str = "value") -> Anova:
    """One-way ANOVA of ``value`` across the levels of ``group``.

    ``df``: (N runs, ...) long table. Rows with NaN ``value`` are dropped. F and p are NaN
    when there are fewer than 2 groups or no within-group replication.
    """
    d = df[[group, value]].dropna(subset=[value])
    if d.empty:
        raise AnalysisError(f"oneway_anova: no values in column {value!r}")
    grand = float(d[value].mean())
    g = d.groupby(group, sort=True)[value]
    sizes = g.size().to_numpy(dtype=float)  # (G,)
    means = g.mean().to_numpy(dtype=float)  # (G,)
    n, k = int(sizes.sum()), int(sizes.size)
    ssb = float((sizes * (means - grand) ** 2).sum())
    ssw = float(((d[value] - g.transform("mean")) ** 2).sum())
    dfb, dfw = k - 1, n - k
    msb = ssb / dfb if dfb > 0 else float("nan")
    msw = ssw / dfw if dfw > 0 else float("nan")
    nan = float("nan")
    F = msb / msw if dfb > 0 and dfw > 0 and msw > 0 else nan
    p = float(sps.f.sf(F, dfb, dfw)) if not np.isnan(F) else nan
    k0 = (n - float((sizes**2).sum()) / n) / dfb if dfb > 0 else nan
    icc = (msb - msw) / (msb + (k0 - 1) * msw) if not np.isnan(F) else nan
    sst = ssb + ssw
    return Anova(
        n=n,
        n_groups=k,
        k0=float(k0),
        ss_between=ssb,
        ss_within=ssw,
        df_between=dfb,
        df_within=dfw,
        ms_between=float(msb),
        ms_within=float(msw),
        f_stat=float(F),
        p=p,
        eta2=ssb / sst if sst > 0 else nan,
        icc1=float(icc),
        var_between=max(0.0, (msb - msw) / k0) if not np.isnan(F) else nan,
        var_within=float(msw),
    )


def between_within(df: pd.DataFrame, group: str = "trial_id", value: str = "value") -> Anova:
    """Between-config vs within-seed variance: one-way ANOVA with configs as groups.

    ``df``: one row per run with the config key ``group`` (default ``trial_id``) and
    ``value``. A large F (small p) and ICC(1) near 1 say the config matters more than
    the seed; ICC(1) near 0 says the seed dominates.
    """
    return oneway_anova(df, group, value)


def two_way_anova(df: pd.DataFrame, a: str, b: str, value: str = "value") -> pd.DataFrame:
    """Balanced two-way ANOVA of ``value`` on factors ``a`` and ``b``.

    ``df``: one row per run; every (a, b) cell must hold the same number r >= 1 of runs.
    With r > 1 the table has rows ``a``, ``b``, ``a:b`` (interaction) and ``residual``;
    with r = 1 the interaction is the residual. A ``total`` row closes it. Columns:
    source, ss, df, ms, F, p, share (= ss / ss_total).
    """
    d = df[[a, b, value]].dropna()
    cells = d.groupby([a, b], sort=True)[value]
    counts = cells.size()
    n_a, n_b = d[a].nunique(), d[b].nunique()
    if n_a < 2 or n_b < 2 or len(counts) != n_a * n_b or counts.nunique() != 1:
        raise AnalysisError(
            f"two_way_anova needs a balanced crossed design: every ({a}, {b}) pair with the "
            f"same number of runs; got {n_a} x {n_b} levels and cell sizes "
            f"{sorted(set(counts.tolist()))} over {len(counts)} cells. Use seed_source_anova "
            "for unbalanced data"
        )
    r = int(counts.iloc[0])
    m = float(d[value].mean())
    ma = d.groupby(a)[value].mean()
    mb = d.groupby(b)[value].mean()
    ssa = float(n_b * r * ((ma - m) ** 2).sum())
    ssb = float(n_a * r * ((mb - m) ** 2).sum())
    sst = float(((d[value] - m) ** 2).sum())
    rows: list[tuple[str, float, int]] = [(a, ssa, n_a - 1), (b, ssb, n_b - 1)]
    if r > 1:
        mab = cells.mean()
        inter = mab - ma.reindex(mab.index.get_level_values(0)).to_numpy()
        inter = inter - mb.reindex(mab.index.get_level_values(1)).to_numpy() + m
        ssab = float(r * (inter**2).sum())
        sse = float(((d[value] - cells.transform("mean")) ** 2).sum())
        rows += [(f"{a}:{b}", ssab, (n_a - 1) * (n_b - 1)), ("residual", sse, n_a * n_b * (r - 1))]
    else:
        rows.append(("residual", sst - ssa - ssb, (n_a - 1) * (n_b - 1)))
    res_ss, res_df = rows[-1][1], rows[-1][2]
    mse = res_ss / res_df if res_df > 0 else float("nan")
    out = []
    for source, ss, dof in rows:
        ms = ss / dof
        is_res = source == "residual"
        F = float("nan") if is_res or not mse > 0 else ms / mse
        p = float("nan") if np.isnan(F) else float(sps.f.sf(F, dof, res_df))
        out.append((source, ss, dof, ms, F, p, ss / sst if sst > 0 else float("nan")))
    out.append(("total", sst, len(d) - 1, float("nan"), float("nan"), float("nan"), 1.0))
    return pd.DataFrame(out, columns=["source", "ss", "df", "ms", "F", "p", "share"])


def _same_partition(x: pd.Series, y: pd.Series) -> bool:
    """True when grouping by x and by y splits the rows identically."""
    pairs = len(pd.MultiIndex.from_arrays([x, y]).unique())
    return pairs == x.nunique() == y.nunique()


def seed_source_anova(
    runs: pd.DataFrame, value: str = "value", sources: Sequence[str] = SEED_SOURCES
) -> pd.DataFrame:
    """Share of variance explained by each varying seed source (crossed design).

    ``runs``: one row per run with ``value`` and the seed-source columns (as in the
    ``runs`` table joined with a metric). For every source with more than one distinct
    seed: a one-way ANOVA grouping runs by that source's seed. Returns one row per varying
    source with columns source, levels, runs_per_level, share (eta^2), F, p,
    confounded_with (other sources splitting the runs identically: their shares are not
    separable). A source whose every seed appears once has share 1 by construction and
    NaN F: such a study varied it jointly with the noise; use the separate design
    (:func:`source_variance_shares`) instead.
    """
    d = runs.dropna(subset=[value])
    present = [s for s in sources if s in d.columns and d[s].nunique() > 1]
    rows = []
    for s in present:
        res = oneway_anova(d, s, value)
        conf = [o for o in present if o != s and _same_partition(d[s], d[o])]
        rows.append(
            (s, res.n_groups, res.n / res.n_groups, res.eta2, res.f_stat, res.p, ", ".join(conf))
        )
    cols = ["source", "levels", "runs_per_level", "share", "F", "p", "confounded_with"]
    return pd.DataFrame(rows, columns=cols)


def source_variance_shares(
    runs: pd.DataFrame,
    value: str = "value",
    group: str = "study",
    sources: Sequence[str] = SEED_SOURCES,
) -> pd.DataFrame:
    """Variance per varied seed source when groups varied sources separately.

    ``runs``: one row per run with ``value``, the ``group`` column (e.g. study or
    trial_id) and the seed-source columns. Per group, the sources with more than one
    distinct seed are its *varied* sources. Returns one row per group with columns group,
    varied (source names joined by ``+``; ``none`` if nothing varies), n, mean, var
    (sample variance), std, share: var over the sum of var of the groups that varied
    exactly one source (NaN for the other groups).
    """
    rows = []
    for key, sub in runs.dropna(subset=[value]).groupby(group, sort=True):
        varied = [s.removesuffix("_seed") for s in sources if s in sub and sub[s].nunique() > 1]
        v = sub[value].to_numpy(dtype=float)
        var = float(v.var(ddof=1)) if v.size > 1 else float("nan")
        rows.append((key, "+".join(varied) or "none", v.size, float(v.mean()), var, len(varied)))
    df = pd.DataFrame(rows, columns=["group", "varied", "n", "mean", "var", "_k"])
    single = (df["_k"] == 1) & df["var"].notna()
    total = float(df.loc[single, "var"].sum())
    df["std"] = np.sqrt(df["var"])
    df["share"] = np.where(single & (total > 0), df["var"] / (total if total > 0 else 1), np.nan)
    return df.drop(columns="_k")[["group", "varied", "n", "mean", "var", "std", "share"]]


# ---------------------------------------------------------------------------- shares with intervals


@dataclass(frozen=True)
class VarianceShare:
    """The share of a value's variance that lies between groups (configs), with its interval.

    ``model`` ``fixed``: omega^2 of a one-way fixed-effects ANOVA, the share of the total
    variance due to differences between *these* configs (a designed grid: the configs are
    chosen, not drawn). Point estimate ``dfb (F - 1) / (dfb (F - 1) + N)`` (= omega^2);
    interval by inverting the noncentral F distribution (Steiger 2004): the noncentrality
    ``lam`` whose F cdf at the observed F is (1 + level) / 2 resp. (1 - level) / 2, mapped to
    ``lam / (lam + N)``.

    ``model`` ``random``: ICC(1) of a one-way random-effects model (configs drawn at random
    from a population, e.g. a random search); F-based interval (Shrout & Fleiss 1979,
    McGraw & Wong 1996).

    Both are clipped to [0, 1] (a negative estimate means "no detectable between-config
    variance": 0); ``within`` = 1 - ``estimate`` is what the seeds explain.
    """

    model: str
    estimate: float
    low: float
    high: float
    level: float
    method: str
    n: int
    n_groups: int
    k0: float
    f_stat: float
    p: float
    var_between: float
    var_within: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ncf_lambda(f_obs: float, dfb: int, dfw: int, target: float) -> float:
    """The noncentrality lam >= 0 with ``ncf.cdf(f_obs, dfb, dfw, lam) == target`` (0 if none)."""
    from scipy.optimize import brentq

    def g(lam: float) -> float:
        cdf = sps.f.cdf(f_obs, dfb, dfw) if lam == 0 else sps.ncf.cdf(f_obs, dfb, dfw, lam)
        return float(cdf) - target

    if g(0.0) <= 0:
        return 0.0
    hi = max(10.0, 4 * dfb * f_obs)
    while g(hi) > 0:
        hi *= 2
        if hi > 1e9:
            return float("inf")
    return float(brentq(g, 0.0, hi, xtol=1e-10))


def variance_share(
    df: pd.DataFrame,
    group: str = "trial_id",
    value: str = "value",
    *,
    model: str = "fixed",
    level: float = 0.95,
) -> VarianceShare:
    """Share of the variance of ``value`` between the levels of ``group`` (see :class:`VarianceShare`).

    ``df``: one row per run (N rows), ``group`` the config key. Needs at least 2 groups
    and within-group replication; NaN otherwise.
    """
    if model not in ("fixed", "random"):
        raise AnalysisError(f"variance_share: model {model!r} is not 'fixed' or 'random'")
    a = oneway_anova(df, group, value)
    nan = float("nan")
    method = "noncentral-F (Steiger 2004)" if model == "fixed" else "F (Shrout & Fleiss 1979)"
    if np.isnan(a.f_stat):
        # no spread within configs: all of the variance lies between them, or there is none
        # to share (every run the same value: NaN, not "0% between, the seeds 100%")
        degenerate = a.n_groups >= 2 and a.df_within > 0 and a.ms_within == 0
        est = (1.0 if a.ms_between > 0 else nan) if degenerate else nan
        return VarianceShare(model, est, est, est, level, "degenerate" if degenerate else method,
                             a.n, a.n_groups, a.k0, a.f_stat, a.p, a.var_between, a.var_within)  # fmt: skip
    F, dfb, dfw, N = a.f_stat, a.df_between, a.df_within, a.n
    if model == "fixed":
        lam_hat = dfb * (F - 1)
        est = lam_hat / (lam_hat + N)
        lam_lo = _ncf_lambda(F, dfb, dfw, (1 + level) / 2)
        lam_hi = _ncf_lambda(F, dfb, dfw, (1 - level) / 2)
        low = lam_lo / (lam_lo + N)
        high = 1.0 if np.isinf(lam_hi) else lam_hi / (lam_hi + N)
    else:
        k0 = a.k0
        est = a.icc1
        fl = F / sps.f.ppf((1 + level) / 2, dfb, dfw)
        fu = F * sps.f.ppf((1 + level) / 2, dfw, dfb)
        low = (fl - 1) / (fl + k0 - 1)
        high = (fu - 1) / (fu + k0 - 1)
    clip = lambda v: float(min(1.0, max(0.0, v)))  # noqa: E731
    return VarianceShare(model, clip(est), clip(low), clip(high), level, method, N, a.n_groups,
                         a.k0, F, a.p, a.var_between, a.var_within)  # fmt: skip
