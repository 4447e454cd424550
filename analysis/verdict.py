"""The answer at a glance: does the config or the seed decide a study's results?

Pure functions on long DataFrames (one row per run), plus :func:`study_verdict` that feeds
them a study. ``values``: columns ``trial_id``, ``point`` (label), ``seed``, ``split``,
``value`` (one metric), committed runs with status ``ok`` only: runs that diverged, failed
or never learned (``not_learned``) are counted apart (:func:`excluded_runs`), never
averaged in.

Sections (see docs/analysis.md for the JSON schema):

* **shares** (a grid: several configs, several seeds each): per split, the share of the
  metric's variance between configs, with an interval
  (:func:`analysis.variance.variance_share`). Model: one-way *fixed* effects (omega^2,
  noncentral-F interval), because a grid's configs are chosen, not drawn from a population
  of configs; ICC(1) of the random-effects model is given beside it for readers who treat
  the configs as a sample.
* **seed sources**: where configs varied different seed sources (``seeds.vary``), each
  source's share of the seed variance (:func:`source_shares`, bootstrap interval).
* **comparisons**: config vs config per split: difference of means (Welch t interval,
  so it agrees with the Welch p beside it), Hedges g, A12 = probability of improvement (bootstrap interval), Welch p
  and Holm-adjusted p over every comparison in the table (one family).
* **tuning** (candidates chosen adaptively, where no variance share applies): expected
  best objective vs number of candidates (Dodge et al. 2019) and winner vs runner-up.
* **sentence**: one quotable line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd
import scipy.stats as sps

from analysis import intervals as iv
from analysis import stats
from analysis.manifest import candidate_rank
from analysis.schema import SEED_SOURCES
from analysis.variance import variance_share
from analysis.verdict_axis import VerdictAxis, axis_values, resolve_axis

MAX_ALL_PAIRS = 6
"""Up to this many configs every pair is compared; beyond, each config against the best."""

MODEL_REASON = (
    "one-way fixed-effects ANOVA (omega^2, noncentral-F interval): the grid's configs were "
    "chosen, not drawn from a population of configs, so the share is about these configs; "
    "ICC(1) of the random-effects model is listed beside it"
)

COMPARISON_COLUMNS = (
    "split", "better", "worse", "n_better", "n_worse", "mean_better", "mean_worse", "diff",
    "diff_low", "diff_high", "diff_method", "hedges_g", "a12", "a12_low", "a12_high", "p",
    "p_holm", "warn",
)  # fmt: skip
SHARE_COLUMNS = (
    "split", "configs", "runs", "seeds_min", "between", "low", "high", "seeds_share", "method",
    "icc1", "icc1_low", "icc1_high", "F", "p", "warn",
)  # fmt: skip


@dataclass
class Verdict:
    """A study's verdict; ``design`` is ``grid``, ``tune`` or ``single`` (no verdict)."""

    design: str
    metric: str | None
    higher_is_better: bool
    splits: list[str]
    sentence: str
    reason: str = ""
    model: str | None = None
    shares: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=SHARE_COLUMNS))
    sources: pd.DataFrame = field(default_factory=pd.DataFrame)
    comparisons: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=COMPARISON_COLUMNS)
    )
    excluded: pd.DataFrame = field(default_factory=pd.DataFrame)
    expected_max: pd.DataFrame = field(default_factory=pd.DataFrame)
    warnings: list[str] = field(default_factory=list)
    axis: VerdictAxis | None = None
    """The metric and splits spoken about (pooled splits included): :mod:`analysis.verdict_axis`."""


def pct(v: float) -> str:
    """A share as a whole percent (``41``), ``-`` when undefined."""
    return "-" if v is None or not np.isfinite(v) else f"{100 * v:.0f}"


def pct_interval(a: float, lo: float, hi: float) -> str:
    """A share with its interval in whole percents: ``48% [35, 56]``; ``-`` when the share
    is undefined (e.g. a config whose runs all diverged)."""
    if a is None or not np.isfinite(a):
        return "-"
    return f"{pct(a)}% [{pct(lo)}, {pct(hi)}]"


def a12_cell(low: float, high: float) -> str:
    """A12's interval as a table cell: ``[0.61, 0.93]``, ``-`` when the bootstrap gives none."""
    return f"[{low:.2f}, {high:.2f}]" if np.isfinite(low) and np.isfinite(high) else "-"


def source_interval(r: pd.Series) -> str:
    """A seed source's share interval, ``[40, 99]``, naming the resamples it leaves out:
    ``[100, 100] (33% of resamples without variance left out)``."""
    out = f"[{pct(r['low'])}, {pct(r['high'])}]"
    u = float(r.get("undefined", 0.0) or 0.0)
    return out + (f" ({pct(u)}% of resamples without variance left out)" if u > 0 else "")


def grid_shares(values: pd.DataFrame, splits: list[str], *, level: float = 0.95) -> pd.DataFrame:
    """Per split: the between-config share (fixed effects) and ICC(1) (random) with intervals.

    ``values``: one row per ok run and split (columns trial_id, split, value). Returns
    :data:`SHARE_COLUMNS`, one row per split with at least 2 configs.
    """
    rows = []
    for split in splits:
        sub = values[values["split"] == split].dropna(subset=["value"])
        sizes = sub.groupby("trial_id").size()
        if len(sizes) < 2:
            continue
        fx = variance_share(sub, "trial_id", model="fixed", level=level)
        rx = variance_share(sub, "trial_id", model="random", level=level)
        rows.append((split, fx.n_groups, fx.n, int(sizes.min()), fx.estimate, fx.low, fx.high,
                     1 - fx.estimate, fx.method, rx.estimate, rx.low, rx.high, fx.f_stat, fx.p,
                     iv.seed_warning(int(sizes.min()))))  # fmt: skip
    return pd.DataFrame(rows, columns=list(SHARE_COLUMNS))


def compare_configs(
    values: pd.DataFrame,
    splits: list[str],
    *,
    higher_is_better: bool = True,
    span: float | Literal["guess"] | None = "guess",
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> pd.DataFrame:
    """Config vs config per split; every pair up to :data:`MAX_ALL_PAIRS` configs, else
    each config against the best one.

    ``values``: columns point, split, value (ok runs). Each row names the ``better`` config
    (higher mean, or lower for a loss) first: ``diff`` = mean_better - mean_worse with
    Welch's t interval (kept within +-``span``, the metric's declared high - low, None:
    unbounded; ``"guess"``, for a study whose task declared no range: +-1 when every value
    of both lies in [0, 1]), Hedges g, ``a12`` = P(a run of ``better`` beats one of ``worse``)
    with a bootstrap interval (NaN bounds where every resample gives the same a12), Welch's
    p and Holm's adjustment over every row that has a p (one family; rows where neither
    config varies have none).
    Returns :data:`COMPARISON_COLUMNS`.
    """
    rows = []
    for split in splits:
        sub = values[values["split"] == split].dropna(subset=["value"])
        groups = {p: g["value"].to_numpy(dtype=float) for p, g in sub.groupby("point", sort=True)}
        groups = {p: v for p, v in groups.items() if v.size >= 2}
        sign = 1.0 if higher_is_better else -1.0
        ranked = sorted(groups, key=lambda p: -sign * groups[p].mean())
        if len(ranked) <= MAX_ALL_PAIRS:
            pairs = [(a, b) for i, a in enumerate(ranked) for b in ranked[i + 1 :]]
        else:
            pairs = [(ranked[0], b) for b in ranked[1:]]
        for j, (a, b) in enumerate(pairs):
            x, y = groups[a], groups[b]
            c = stats.compare(x, y, n_boot=0)
            within = (1.0 if min(x.min(), y.min()) >= 0 and max(x.max(), y.max()) <= 1 else None) if span == "guess" else span
            d = iv.diff_interval(x, y, level=level, n_boot=n_boot, seed=seed + j, span=within)
            u, w = (x, y) if higher_is_better else (-x, -y)
            pi = iv.a12_interval(u, w, level=level, n_boot=n_boot, seed=seed + j)
            g = c.hedges_g if higher_is_better else -c.hedges_g
            rows.append((split, a, b, x.size, y.size, c.mean_a, c.mean_b, c.diff, d.low, d.high,
                         d.method, g, pi.estimate, pi.low, pi.high, c.welch_p, np.nan,
                         iv.seed_warning(min(x.size, y.size))))  # fmt: skip
    df = pd.DataFrame(rows, columns=list(COMPARISON_COLUMNS))
    if not df.empty:
        df["p_holm"] = iv.holm(df["p"].to_numpy())
    return df


def source_shares(
    values: pd.DataFrame, *, level: float = 0.95, n_boot: int = 2000, seed: int = 0
) -> pd.DataFrame:
    """Share of the seed variance per seed source, where configs varied one source each.

    ``values``: one row per ok run of one split (columns trial_id, value and the seed-source
    columns). A config (trial) whose runs vary exactly one source estimates that source's
    variance (sample variance across its seeds; configs varying the same source are
    pooled by averaging). share = var(source) / sum of the sources' variances, with a
    percentile bootstrap interval resampling runs within each config (scipy's resamples).
    A resample without any variance has no share: it is left out of the interval, and
    ``undefined`` is the fraction of resamples left out (a bound made of them would be
    invented). Empty unless at least two different sources were varied alone, and when no
    source moves the value (every variance 0: there is nothing to split). Columns: source,
    configs, runs, var, share, low, high, undefined, warn.
    """
    src = stats.source_variance_shares(values, group="trial_id")
    single = src[~src["varied"].str.contains(r"\+|none", regex=True) & src["var"].notna()]
    if single["varied"].nunique() < 2 or not (single["var"] > 0).any():
        return pd.DataFrame()
    names = sorted(single["varied"].unique())
    samples = tuple(
        values.loc[values["trial_id"] == g, "value"].dropna().to_numpy(dtype=float)
        for g in single["group"]
    )
    owner = np.array([names.index(v) for v in single["varied"]])

    def share(*s: np.ndarray, axis: int = -1) -> np.ndarray:
        var = np.stack([np.var(x, axis=axis, ddof=1) for x in s], axis=0)  # (groups, ...)
        per = np.stack([var[owner == i].mean(axis=0) for i in range(len(names))])
        total = per.sum(axis=0)  # (...,): 0 in a resample without any variance -> NaN share
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(total > 0, per / np.where(total > 0, total, 1.0), np.nan)

    est = share(*samples)
    lows, highs = np.full(len(names), np.nan), np.full(len(names), np.nan)
    undefined = np.zeros(len(names))
    for i in range(len(names)):
        dist = iv.bootstrap_distribution(
            samples, lambda *s, axis=-1, i=i: share(*s, axis=axis)[i], n_boot=n_boot, seed=seed
        )  # (n_boot,)
        ok = dist[np.isfinite(dist)]
        undefined[i] = 1 - ok.size / dist.size
        if ok.size:
            lows[i], highs[i] = np.percentile(ok, [50 * (1 - level), 50 * (1 + level)])
    per_var = [float(single.loc[single["varied"] == n, "var"].mean()) for n in names]
    runs = [int(single.loc[single["varied"] == n, "n"].sum()) for n in names]
    configs = [int((single["varied"] == n).sum()) for n in names]
    warn = [iv.seed_warning(int(single.loc[single["varied"] == n, "n"].min())) for n in names]
    return pd.DataFrame({"source": names, "configs": configs, "runs": runs, "var": per_var, "share": est,
                         "low": lows, "high": highs, "undefined": undefined, "warn": warn})  # fmt: skip


def outcome_sources(
    outcomes: pd.DataFrame, of: Sequence[str], runs: pd.DataFrame, *, level: float = 0.95,
    n_boot: int = 2000, seed: int = 0,
) -> pd.DataFrame:
    """Each seed source's share of the seed variance of several per-run outcomes, where
    configs varied one source each (:func:`source_shares` per outcome).

    ``outcomes``: one row per run, columns trial_id, seed and each name in ``of``; ``runs``:
    one row per run with trial_id, seed and the seed-source columns
    (:func:`analysis.queries.run_seeds`). Rows per (outcome, source) for each outcome with
    seed variance, in ``of``'s order: column ``of`` (the outcome's name), then
    :func:`source_shares`'s. Empty when fewer than two sources were varied alone or no
    outcome varies between seeds.
    """
    parts = []
    for name in of:
        vals = runs_with_seeds(outcomes[["trial_id", "seed"]].assign(value=outcomes[name].astype(float)), runs)
        shares = source_shares(vals, level=level, n_boot=n_boot, seed=seed)
        if not shares.empty:
            parts.append(shares.assign(of=name))
    if not parts:
        return pd.DataFrame()
    out = pd.concat(parts, ignore_index=True)
    return out[["of", *[c for c in out.columns if c != "of"]]]


def excluded_runs(runs: pd.DataFrame, labels: dict[str, str] | None = None) -> pd.DataFrame:
    """Committed runs per config by status, with the share not ``ok`` (Wilson interval).

    ``runs``: one row per committed run (columns trial_id, status; NULL status counts as
    ok). Returns columns point, trial_id, runs, ok, not_learned, diverged, failed (recorded
    by ``study resume --skip-failed``), other, excluded_share, low, high: one row per config.
    """
    rows = []
    for tid, sub in runs.groupby("trial_id", sort=True):
        st = sub["status"].fillna("ok")
        n, ok = len(st), int((st == "ok").sum())
        nl, dv, fl = (int((st == s).sum()) for s in ("not_learned", "diverged", "failed"))
        ci = iv.proportion_interval(n - ok, n, method="wilson")
        rows.append(((labels or {}).get(tid, tid), tid, n, ok, nl, dv, fl, n - ok - nl - dv - fl,
                     ci.estimate, ci.low, ci.high))  # fmt: skip
    cols = ["point", "trial_id", "runs", "ok", "not_learned", "diverged", "failed", "other",
            "excluded_share", "low", "high"]  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


def left_out_text(trial_ids: list[str], excluded: pd.DataFrame, values: pd.DataFrame,
                  splits: list[str]) -> str:
    """``lr=1 (0 of 6 runs ok: 6 never learned)``, for configs a verdict cannot compare.

    ``excluded``: :func:`excluded_runs`' table; ``values``: the verdict's ok values (columns
    trial_id, split, value), to say so when ok runs lack the verdict's splits."""
    parts = []
    for tid in trial_ids:
        row = excluded[excluded["trial_id"] == tid]
        if row.empty:
            parts.append(str(tid))
            continue
        r = row.iloc[0]
        why = [f"{int(r[k])} {w}" for k, w in (("not_learned", "never learned"), ("diverged", "diverged"),
                                                ("failed", "failed"), ("other", "other")) if int(r[k])]
        has = values[values["trial_id"] == tid].groupby("split").size()
        short = [sp for sp in splits if has.get(sp, 0) < 2]
        if int(r["ok"]) >= 2 and short:
            why.append(f"fewer than 2 values of {', '.join(short)}")
        parts.append(f"{r['point']} ({int(r['ok'])} of {int(r['runs'])} runs ok"
                     + (f": {', '.join(why)}" if why else "") + ")")
    return "; ".join(parts)


def grid_sentence(
    shares: pd.DataFrame, comparisons: pd.DataFrame, metric: str, factor: str, headline: str
) -> str:
    """The quotable line of a grid verdict (headline split first)."""
    row = shares[shares["split"] == headline]
    if row.empty:
        return (
            f"Not enough configs with several ok runs to say whether {factor} or the seed decides."
        )
    r = row.iloc[0]
    cmp = comparisons[comparisons["split"] == headline]
    constant = (
        not cmp.empty
        and pd.isna(r["F"])
        and bool((cmp[["diff", "diff_low", "diff_high"]].abs().to_numpy() == 0).all())
    )
    if constant:  # no variance at all: a share of it, or a "best" config, would say nothing
        s = (
            f"{headline} {metric} is {cmp.iloc[0]['mean_better']:.4g} in every run of every config "
            f"({r['configs']} configs, at least {r['seeds_min']} seeds each): neither {factor} "
            "nor the seed moves it."
        )
    else:
        s = (
            f"{factor[0].upper() + factor[1:]} explains {pct(r['between'])}% "
            f"[{pct(r['low'])}, {pct(r['high'])}] of the variance of {headline} {metric} "
            f"({r['configs']} configs, at least {r['seeds_min']} seeds each); the seeds the rest."
        )
    others = shares[shares["split"] != headline]
    if not others.empty:
        parts = ", ".join(
            f"{x['split']} {pct(x['between'])}%" if pd.notna(x["between"]) else f"{x['split']} no variance"
            for _, x in others.iterrows()
        )
        s += f" Other splits: {parts}."
    if not cmp.empty and not constant:
        s += best_clause(cmp)
        if (cmp["p_holm"] >= 0.05).any() and not (cmp["p_holm"] < 0.05).any():
            s += " No difference between configs is significant after Holm's correction."
    if int(r["seeds_min"]) < iv.MIN_SEEDS:
        s += f" (Fewer than {iv.MIN_SEEDS} seeds per config: indicative only.)"
    return s


def grid_caveats(head: pd.DataFrame, excluded: pd.DataFrame, points: list[dict[str, Any]], split: str) -> list[str]:
    """What the grid verdict's share and comparisons assume that this study may break, as
    warnings. ``head``: the headline split's ok values (columns trial_id, point, value);
    ``excluded``: :func:`excluded_runs` of the compared configs; ``points``: the manifest's
    grid points.

    - The share (omega^2, its F interval) assumes every config spreads alike; the pairwise
      Welch rows do not. Checked with the Brown-Forsythe test (``scipy.stats.levene``,
      median-centred) at 0.05.
    - A ``seeds.*`` grid axis makes configs that share every hyperparameter: the gap between
      them is seed variance, which the share counts as the grid point's.
    - Configs that kept different shares of their runs (runs that never learned, diverged or
      failed are left out) are compared among their survivors, which favours a config that
      loses its worse runs."""
    out = []
    groups = [g["value"].to_numpy(dtype=float) for _, g in head.groupby("trial_id")]
    groups = [g for g in groups if g.size >= 2]
    if len(groups) >= 2 and any(np.ptp(g) > 0 for g in groups):
        p = float(sps.levene(*groups, center="median").pvalue)
        if p < 0.05:
            sds = [float(g.std(ddof=1)) for g in groups]
            out.append(f"the configs' spreads on {split} differ (Brown-Forsythe p = {p:.2g}; sd {min(sds):.2g} to "
                       f"{max(sds):.2g}): the variance share assumes equal spreads (the pairwise Welch rows do not)")
    seeds_axes = sorted({k for p in points for k in p if str(k).startswith("seeds.")})
    if seeds_axes:
        out.append(f"the grid varies {', '.join(seeds_axes)}: configs that differ only there share every "
                   "hyperparameter, so part of the grid point's share is seed variance (the seed sources "
                   "split it by source)")
    kept = excluded.assign(share=excluded["ok"] / excluded["runs"])
    if len(kept) >= 2 and kept["share"].nunique() > 1:
        each = ", ".join(f"{r['point']} {int(r['ok'])} of {int(r['runs'])}" for _, r in kept.iterrows())
        out.append(f"configs kept different shares of their runs ({each} ok): they are compared among the runs "
                   "that were kept, which favours a config that loses its worse runs")
    return out


def _lower(r: pd.Series) -> str:
    """`` (lower is better)`` after a comparison whose better config has the lower mean: its
    difference is negative."""
    return " (lower is better)" if r["mean_better"] < r["mean_worse"] else ""


def _span(sense: Any) -> float | Literal["guess"] | None:
    """The bound of a difference of two means of a metric (:class:`analysis.manifest.MetricSense`):
    its declared high - low (None: unbounded); ``"guess"`` where the task declared nothing."""
    return sense.span if sense is not None and sense.declared else "guess"


def best_clause(cmp: pd.DataFrame) -> str:
    """`` Best: A over B by d [lo, hi], P(improvement) a, Holm p = q.`` for the headline
    split's comparisons (:func:`compare_configs`, best config first). Configs whose mean
    equals the best one's tie with it: they are named together, and the next config is the
    one compared. Holm's p is left out where Welch's test has none (no variance in either)."""
    lead = cmp.iloc[0]["better"]
    own = cmp[cmp["better"] == lead]
    tied = own[own["diff"] == 0]
    rest = own[own["diff"] != 0]

    def by(r: pd.Series) -> str:
        holm = f", Holm p = {r['p_holm']:.2g}" if pd.notna(r["p_holm"]) else ""
        holm += " (not significant)" if not r["p_holm"] < 0.05 else ""  # NaN included: no test
        return (f"by {r['diff']:.3g} [{r['diff_low']:.3g}, {r['diff_high']:.3g}]{_lower(r)}, "
                f"P(improvement) {r['a12']:.2f}{holm}")  # fmt: skip

    if tied.empty:
        r = own.iloc[0]
        return f" Best: {lead} over {r['worse']} {by(r)}."
    names = " and ".join([str(lead), *tied["worse"].astype(str)])
    s = f" Best: {names} tie (mean {own.iloc[0]['mean_better']:.4g} each)"
    if rest.empty:
        return s + "."
    r = rest.iloc[0]
    return s + f"; the next, {r['worse']}, is behind {by(r)}."


def factor_name(points: list[dict[str, Any]]) -> str:
    """What differs between configs, e.g. ``the grid point (model.cell)``."""
    keys = sorted({k for p in points for k in p if len({str(q.get(k)) for q in points}) > 1})
    return f"the grid point ({', '.join(keys)})" if keys else "the config"


def tuning_section(
    trials: pd.DataFrame, *, maximize: bool = True
) -> tuple[pd.DataFrame, list[str]]:
    """Expected best objective of n candidates (n = 1..N; Dodge et al. 2019) from the
    trials' objectives, and the ids of the winner and runner-up.

    ``trials``: columns trial_id, objective (NaN rows dropped). Returns (table with
    columns n, expected_best, std; [winner, runner_up]). For a minimized objective the
    expected minimum is given.
    """
    t = trials.dropna(subset=["objective"])
    if t.empty:
        return pd.DataFrame(columns=["n", "expected_best", "std"]), []
    sign = 1.0 if maximize else -1.0
    em = stats.expected_max(sign * t["objective"].to_numpy(dtype=float))
    em = em.rename(columns={"expected_max": "expected_best"})
    em["expected_best"] *= sign
    std = t["objective_std"] if "objective_std" in t.columns else pd.Series(0.0, index=t.index)
    keys = [candidate_rank(o, s, i, maximize=maximize) for o, s, i in zip(t["objective"], std, t["trial_id"], strict=True)]
    order = [str(i) for _, i in sorted(zip(keys, t["trial_id"], strict=True))]
    return em, order[:2]


def runs_with_seeds(evals: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """``evals`` rows joined with the runs' seed-source columns (on trial_id, seed)."""
    cols = ["trial_id", "seed", *[s for s in SEED_SOURCES if s in runs.columns]]
    return evals.merge(runs[cols], on=["trial_id", "seed"], how="left")


# ---------------------------------------------------------------------------- one study


def maximize(manifest: Any) -> bool:
    """Tuning direction from a manifest (``objective.direction``, ``direction``, ``mode``,
    or the config's ``tune.direction``/``tune.mode``); default maximize."""
    if manifest is None:
        return True
    found = manifest.config.get("tune")
    tune: dict[str, Any] = found if isinstance(found, dict) else {}
    objective = manifest.raw.get("objective")
    for value in (
        objective.get("direction") if isinstance(objective, dict) else None,
        manifest.raw.get("direction"),
        manifest.raw.get("mode"),
        tune.get("direction"),
        tune.get("mode"),
    ):
        if isinstance(value, str):
            return not value.lower().startswith("min")
    return True


def study_axis(
    ctx: Any, metric: str | None = None, splits: Sequence[str] | None = None
) -> VerdictAxis:
    """The verdict's metric and splits for an open study: ``metric`` / ``splits`` (split
    specs, :func:`analysis.verdict_axis.parse_split`) when given, else the task's declared
    ``verdict``, else the primary metric on the test splits. Raises AnalysisError for a
    given metric or split the study lacks; a declaration it cannot honour becomes a note."""
    decl = ctx.manifest.declarations if ctx.manifest else None
    axis, notes = resolve_axis(
        primary=ctx.primary, splits=ctx.splits, roles=ctx.roles, tests=ctx.test_splits,
        metrics=set(ctx.evals["metric"]), declared_metric=decl.verdict_metric if decl else None,
        declared_splits=decl.verdict_splits if decl else (), metric=metric, split_specs=splits,
    )  # fmt: skip
    ctx.notes.extend(n for n in notes if n not in ctx.notes)
    return axis


def study_verdict(
    ctx: Any,
    *,
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
    axis: VerdictAxis | None = None,
) -> Verdict:
    """The verdict of an open study (:class:`analysis.context.StudyContext`) about ``axis``
    (default :func:`study_axis`: the task's declaration, else the primary metric on the test
    splits)."""
    axis = axis or study_axis(ctx)
    metric, splits = axis.metric, axis.names
    sense = ctx.sense(metric) if metric else None
    hib = sense.higher_is_better if sense else True
    runs = ctx.run_seeds()
    excluded = excluded_runs(runs, ctx.labels)
    e = ctx.evals
    ok = e[e["status"].fillna("ok") == "ok"]
    values = axis_values(ok, axis)
    values = values[values["value"].notna()]  # an ok run without this value is not a seed of it
    v = Verdict("single", metric, hib, splits, "", excluded=excluded, axis=axis)
    if sense is not None and not sense.declared:  # a study written before the declarations
        v.warnings.append(f"the study declares no direction for {metric}: {'higher' if hib else 'lower'} is "
                          "better was guessed from its name (a study run since declares it from its task)")
    n_out = int(excluded["runs"].sum() - excluded["ok"].sum()) if not excluded.empty else 0
    if n_out:
        nl = int(excluded["not_learned"].sum())
        v.warnings.append(
            f"{n_out} of {int(excluded['runs'].sum())} runs left out of every number "
            f"({nl} never learned, {int(excluded['diverged'].sum())} diverged, {int(excluded['failed'].sum())} "
            f"failed, {int(excluded['other'].sum())} other); see the excluded runs table"
        )
    sizes = values.groupby(["trial_id", "split"]).size()
    per_config = sizes.groupby(level="trial_id").min() if not sizes.empty else pd.Series(dtype=int)
    # a config with no ok seed at all is the fewest (it counted only configs with values)
    seeds_min = min([int(per_config.get(t, 0)) for t in set(runs["trial_id"]) | set(per_config.index)] or [0])
    if (seeds_min or len(per_config)) and seeds_min < iv.MIN_SEEDS:
        v.warnings.append(
            f"some configs have fewer than {iv.MIN_SEEDS} ok seeds (fewest: {seeds_min}): "
            "numbers marked n<10 are indicative only"
        )
    if metric is None or values.empty:
        v.sentence = "No committed evals with status ok: no verdict."
        return v
    if ctx.kind == "tune":
        return _tune_verdict(ctx, v, ok, level=level, n_boot=n_boot, seed=seed)
    configs = sorted(set(runs["trial_id"]) | set(values["trial_id"]))
    fewest = sizes.groupby(level="trial_id").min() if not sizes.empty else pd.Series(dtype=int)
    compared = [t for t in configs if fewest.get(t, 0) >= 2]
    left_out = left_out_text([t for t in configs if t not in compared], excluded, values, splits)
    if len(configs) < 2 or len(compared) < 2:
        v.reason = (
            "one config: nothing to compare between configs (the spread across seeds is in "
            "the summary)"
            if len(configs) < 2
            else f"fewer than 2 configs have 2 or more ok seeds ({left_out})"
        )
        v.sentence = f"No verdict: {v.reason}."
        head = values.loc[values["split"] == splits[0], "value"]
        if len(configs) == 1 and head.size >= 2:
            v.sentence = seed_spread_sentence(head, metric, splits[0], n_boot=n_boot, seed=seed)
        return v
    values = values[values["trial_id"].isin(compared)]
    v.design, v.model = "grid", "fixed"
    v.reason = MODEL_REASON
    v.shares = grid_shares(values, splits, level=level)
    v.comparisons = compare_configs(
        values, splits, higher_is_better=hib, span=_span(sense), level=level, n_boot=n_boot, seed=seed
    )
    head = values[values["split"] == splits[0]]
    v.sources = source_shares(runs_with_seeds(head, runs), level=level, n_boot=n_boot, seed=seed)
    points = [dict(p.get("point", {})) for p in ctx.manifest.points] if ctx.manifest else []
    v.warnings += grid_caveats(head, excluded[excluded["trial_id"].isin(compared)], points, splits[0])
    v.sentence = grid_sentence(v.shares, v.comparisons, metric, factor_name(points), splits[0])
    if left_out:
        v.sentence += f" Not compared, with fewer than 2 ok seeds: {left_out}."
    if not v.sources.empty:
        v.sentence = sources_sentence(v.sources, metric, splits[0]) + " " + v.sentence
    return v


def seed_spread_sentence(
    values: pd.Series, metric: str | None, split: str, *, n_boot: int = 2000, seed: int = 0
) -> str:
    """The quotable line of a one-config study: only the seed moves its result, by this much.

    ``values``: the headline split's value per ok run (>= 2). Mean with its 95% bootstrap
    interval (:func:`analysis.intervals.mean_interval`), range and sample sd across seeds."""
    a = values.dropna().to_numpy(dtype=float)
    what = f"{split} {metric}"
    if np.ptp(a) == 0:
        return (
            f"One config: {what} is {a[0]:.4g} for every one of its {a.size} seeds; the seed does "
            "not move it either."
        )
    m = iv.mean_interval(a, n_boot=n_boot, seed=seed)
    s = (
        f"One config, so only the seed moves the result: across {a.size} seeds {what} runs from "
        f"{a.min():.4g} to {a.max():.4g} (sd {a.std(ddof=1):.2g}), mean {m.estimate:.4g} "
        f"[{m.low:.4g}, {m.high:.4g}] (95% bootstrap)."
    )
    if a.size < iv.MIN_SEEDS:
        s += f" (Fewer than {iv.MIN_SEEDS} seeds: indicative only"
        if a.size < 6:  # an interval inside the range of n values covers the mean <= 1 - 2 / 2^n
            s += f"; an interval inside the range of {a.size} seeds covers at most {1 - 2 * 0.5**a.size:.0%}"
        s += ".)"
    return s


def sources_sentence(sources: pd.DataFrame, metric: str, split: str) -> str:
    """The quotable line of a seed-source split: each source's share of the seed variance."""
    parts = ", ".join(
        f"{r['source']} {pct(r['share'])}% {source_interval(r)}"
        for _, r in sources.iterrows()
    )
    return (
        f"Of the seed variance of {split} {metric}, the seed sources varied one at a time "
        f"explain: {parts}."
    )


def _tune_verdict(
    ctx: Any, v: Verdict, ok: pd.DataFrame, *, level: float, n_boot: int, seed: int
) -> Verdict:
    from analysis import queries as q

    v.design = "tune"
    v.reason = (
        "candidates were chosen adaptively by the search, so they are neither a designed grid "
        "nor a random sample: no variance share; expected best vs number of candidates and "
        "winner vs runner-up instead"
    )
    up = maximize(ctx.manifest)
    trials = q.tuning_trials(ctx.con, ctx.name)
    v.expected_max, top = tuning_section(trials, maximize=up)
    if not top:
        v.sentence = "Tuning study without objective values: no verdict."
        return v
    obj = ctx.manifest.raw.get("objective") if ctx.manifest else None
    obj_split = obj.get("split") if isinstance(obj, dict) else None
    obj_metric = obj.get("metric") if isinstance(obj, dict) else None
    pair = ok[ok["trial_id"].isin(top)]
    parts = []  # (values, the way they are better, their span): the objective, then the verdict's axis
    if obj_split and obj_metric:
        o = pair[(pair["split"] == obj_split) & (pair["metric"] == obj_metric)]
        parts.append((o.assign(split=f"{obj_split} {obj_metric} (objective)"), up, _span(ctx.sense(obj_metric))))
    axis = axis_values(pair, v.axis) if v.axis else pair.iloc[0:0]
    parts.append((axis, v.higher_is_better, _span(ctx.sense(v.metric)) if v.metric else "guess"))
    # each part compared the way its own metric is better (an objective on the loss, a verdict on
    # accuracy); Holm's adjustment then over every row, one family as in a grid study
    cmp = [compare_configs(vals, list(dict.fromkeys(vals["split"])), higher_is_better=hib, span=sp, level=level,
                           n_boot=n_boot, seed=seed) for vals, hib, sp in parts if not vals.empty]  # fmt: skip
    v.comparisons = pd.concat(cmp, ignore_index=True) if cmp else compare_configs(pair.iloc[0:0], [])
    if not v.comparisons.empty:
        v.comparisons["p_holm"] = iv.holm(v.comparisons["p"].to_numpy())
    best = trials.set_index("trial_id").loc[top[0], "objective"]
    mine = ok.loc[ok["trial_id"] == top[0], "point"] if "point" in ok.columns else pd.Series(dtype=object)
    label = str(mine.iloc[0]) if len(mine) else ctx.labels.get(top[0], top[0])  # as the comparisons name it
    em = v.expected_max
    n = len(em)
    s = (
        f"Best of {n} candidates: {label} (objective {best:.4g}). The expected best of n "
        f"randomly drawn candidates goes from {em['expected_best'].iloc[0]:.4g} (n=1) to "
        f"{em['expected_best'].iloc[-1]:.4g} (n={n})."
    )
    if len(top) > 1 and not v.comparisons.empty and v.comparisons.iloc[0]["diff_low"] == v.comparisons.iloc[0]["diff_high"] == 0:
        c = v.comparisons.iloc[0]
        s += f" Winner and runner-up tie on {c['split']} (every seed of both scores the same)."
    elif len(top) > 1 and not v.comparisons.empty:
        c = v.comparisons.iloc[0]
        # the comparison ranks by the mean; an objective aggregated otherwise (median, IQM) may
        # rank the runner-up's mean ahead: say so rather than call the runner-up the winner
        ahead = "winner" if c["better"] == label else "runner-up, by its mean (the objective's aggregate ranks it second)"
        s += (
            f" Winner vs runner-up on {c['split']}: {c['better']} ({ahead}) ahead by {c['diff']:.3g} "
            f"[{c['diff_low']:.3g}, {c['diff_high']:.3g}]{_lower(c)}, P(improvement) {c['a12']:.2f}, "
            f"Holm p = {c['p_holm']:.2g}" + (f" ({c['warn']} seeds)." if c["warn"] else ".")
        )
    else:
        s += " Winner and runner-up have too few ok seeds each to be compared."
    v.sentence = s
    return v
