"""``study analyze``: a study's numbers as text or JSON.

:func:`analyze` prints the verdict (does the config or the seed decide? see
:mod:`analysis.verdict`), the summary across seeds per (point, split, metric) with
bootstrap intervals of the mean (inside the metric's range), the correlation matrix of the test splits (primary metric, Pearson, with the
number of runs per pair), the declared seed scatter's correlation with bootstrap
intervals, and every regression the task declared. The helpers here compute the same
numbers the report draws, so text and charts agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis import queries as q
from analysis import stats
from analysis import verdict as vd
from analysis.aggregates import aggregates_text, study_aggregates
from analysis.context import StudyContext, axis_label, open_study
from analysis.db import list_studies
from analysis.errors import AnalysisError
from analysis.formatting import jsonable, records, text_table
from analysis.manifest import RegressionDecl
from analysis.seed_questions import questions_json, questions_text, resolve_events, study_questions


@dataclass
class RegressionResult:
    """One declared regression: the (transformed) data and a fit per grid point."""

    decl: RegressionDecl
    pairs: pd.DataFrame
    """Columns trial_id, point, seed, x, y (transformed), plus step/epoch for checkpoints."""
    fits: dict[str, stats.Regression]


MAX_POINT_FITS = 4
"""Fit lines and correlations per grid point up to this many points; beyond, pool runs."""

POOLED = "all runs"


SUMMARY_COLUMNS = (
    "point",
    "split",
    "role",
    "metric",
    "n",
    "mean",
    "std",
    "min",
    "median",
    "max",
    "ci_low",
    "ci_high",
    "ci_method",
    "excluded",
    "warn",
)
"""Columns of the per-split summary table."""


def fit_groups(pairs: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The groups to fit separately: each grid point when there are 2..MAX_POINT_FITS
    points with at least 3 runs each, else every run pooled (one group)."""
    groups = [(str(p), sub) for p, sub in pairs.groupby("point", sort=False)]
    if len(groups) == 1 or (
        len(groups) <= MAX_POINT_FITS and all(len(sub) >= 3 for _, sub in groups)
    ):
        return groups
    return [(POOLED, pairs)]


def _runs_behind(pairs: pd.DataFrame, point: str) -> int:
    """Distinct runs (trial_id, seed) in the fit of ``point`` (:data:`POOLED`: every run)."""
    sub = pairs if point == POOLED else pairs[pairs["point"].astype(str) == point]
    return int(sub[["trial_id", "seed"]].drop_duplicates().shape[0])


def declared_regressions(ctx: StudyContext) -> list[RegressionResult]:
    """Fit every regression the task declared, per grid point, over the ok runs."""
    out = []
    for r in ctx.regressions:
        fetch = q.run_pairs if r.over == "runs" else q.checkpoint_pairs
        pairs = ctx.ok_only(fetch(ctx.con, ctx.name, r.x, r.y, labels=ctx.labels))
        pairs["x"] = stats.apply_transform(pairs["x"], r.x.transform)
        pairs["y"] = stats.apply_transform(pairs["y"], r.y.transform)
        pairs = pairs.dropna(subset=["x", "y"]).reset_index(drop=True)
        fits = {p: stats.regress(sub["x"], sub["y"]) for p, sub in fit_groups(pairs)}
        out.append(RegressionResult(r, pairs, fits))
    return out


def scatter_data(
    ctx: StudyContext, *, n_boot: int = 2000, seed: int = 0
) -> tuple[pd.DataFrame, dict[str, stats.Regression], dict[str, stats.Correlation]] | None:
    """The seed scatter's pairs (trial_id, point, seed, x, y) with a fit and Pearson r
    (bootstrap interval) per point, ok runs only; ``None`` when the study has no scatter axes."""
    if ctx.scatter is None:
        return None
    ax, ay = ctx.scatter
    pairs = ctx.ok_only(q.run_pairs(ctx.con, ctx.name, ax, ay, labels=ctx.labels))
    fits, corrs = {}, {}
    for p, sub in fit_groups(pairs):
        fits[p] = stats.regress(sub["x"], sub["y"])
        corrs[p] = stats.correlate(sub["x"], sub["y"], n_boot=n_boot, seed=seed)
    return pairs, fits, corrs


def summary_table(
    ctx: StudyContext, level: float = 0.95, *, n_boot: int = 2000, seed: int = 0
) -> pd.DataFrame:
    """Per (point, split, metric) over the ok runs: n, mean, std, min, median, max and a
    bootstrap interval of the mean (BCa, scipy; inside [min, max], so inside the metric's
    range). ``excluded``: runs of that point with a value but another status (diverged,
    not_learned...), left out; ``warn``: ``n<10`` when fewer than 10 runs."""
    e = ctx.evals
    if e.empty:
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    rows = []
    split_rank = {s: i for i, s in enumerate(ctx.splits)}
    is_ok = e["status"].fillna("ok") == "ok"
    for (point, split, metric), sub in e.groupby(["point", "split", "metric"], sort=False):
        good = sub.loc[is_ok.loc[sub.index], "value"]
        d = stats.describe(good)
        ci = iv.mean_interval(good, level=level, n_boot=n_boot, seed=seed)
        rows.append(
            (point, split, ctx.roles.get(split), metric, d["n"], d["mean"], d["std"], d["min"],
             d["median"], d["max"], ci.low, ci.high, ci.method, len(sub) - len(good),
             iv.seed_warning(int(d["n"])))
        )  # fmt: skip
    df = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
    df["_r"] = df["split"].map(split_rank)
    return df.sort_values(["point", "_r", "metric"], kind="stable").drop(columns="_r")


def test_correlations(ctx: StudyContext) -> list[tuple[str, stats.CorrelationMatrix]]:
    """Per grid point with ok runs: the Pearson matrix of the test splits on the primary metric."""
    if ctx.primary is None or len(ctx.test_splits) < 2:
        return []
    wide = ctx.ok_only(q.seed_table(ctx.con, ctx.name, metric=ctx.primary, labels=ctx.labels))
    cols = [s for s in ctx.test_splits if s in wide.columns]
    return [
        (str(p), stats.correlation_matrix(sub, cols))
        for p, sub in wide.groupby("point", sort=False)
    ]


def _matrix_text(m: stats.CorrelationMatrix) -> str:
    n_values = set(m.n.to_numpy()[np.triu_indices(len(m.columns), 1)].tolist())
    r = m.r.map(lambda v: f"{v:.3f}" if np.isfinite(v) else "nan").reset_index(names="split")
    text = text_table(r).rsplit("\n", 1)[0]
    if len(n_values) == 1:
        return text + f"\n(n = {n_values.pop()} runs per pair)"
    return text + "\n" + text_table(m.n.reset_index(names="n runs")).rsplit("\n", 1)[0]


SCHEMA = "fineline.analyze/2"
"""Name and version of the JSON document :func:`analyze` prints (docs/analysis.md)."""


def _pct_cell(v: float) -> str:
    return vd.pct(v) + "%" if v is not None and np.isfinite(v) else ""


def verdict_text(v: vd.Verdict) -> list[str]:
    """The verdict as text lines (sentence, shares, seed sources, comparisons, excluded runs)."""
    lines = ["Verdict: does the config or the seed decide?", v.sentence]
    lines += [f"({line})" for line in (v.axis.pooled_text() if v.axis else ())]
    if v.reason and v.reason not in v.sentence:  # ("No verdict: REASON." says it already)
        lines.append(f"({'model: ' if v.design == 'grid' else ''}{v.reason})")
    if not v.shares.empty:
        t = v.shares.assign(
            between=v.shares["between"].map(_pct_cell),
            interval=[f"[{vd.pct(a)}, {vd.pct(b)}]" if pd.notna(a) else "no variance"
                      for a, b in zip(v.shares["low"], v.shares["high"], strict=True)],
            seeds_share=v.shares["seeds_share"].map(_pct_cell),
            icc1=[vd.pct_interval(a, b, c) if pd.notna(a) else ""
                  for a, b, c in zip(v.shares["icc1"], v.shares["icc1_low"], v.shares["icc1_high"], strict=True)],
        )[["split", "configs", "runs", "seeds_min", "between", "interval", "seeds_share", "icc1", "F", "p", "warn"]]  # fmt: skip
        title = f"Share of {v.metric} variance between configs (omega^2, 95% noncentral-F interval)"
        lines += ["", title, text_table(t)]
    if not v.sources.empty:
        t = v.sources.assign(
            share=v.sources["share"].map(_pct_cell),
            interval=[vd.source_interval(r) for _, r in v.sources.iterrows()],
        )[["source", "configs", "runs", "var", "share", "interval", "warn"]]  # fmt: skip
        lines += ["", f"Seed variance by seed source ({v.splits[0]} {v.metric}; 95% bootstrap interval)", text_table(t)]  # fmt: skip
    if not v.comparisons.empty:
        c = v.comparisons
        t = c.assign(
            diff_ci=[f"[{a:.3g}, {b:.3g}]" for a, b in zip(c["diff_low"], c["diff_high"], strict=True)],
            a12_ci=[vd.a12_cell(a, b) for a, b in zip(c["a12_low"], c["a12_high"], strict=True)],
        )[["split", "better", "worse", "mean_better", "mean_worse", "diff", "diff_ci", "hedges_g", "a12", "a12_ci", "p_holm", "warn"]]  # fmt: skip
        title = (
            "Config vs config (diff of means with 95% Welch t interval, unadjusted: it excludes 0 when Welch p < 0.05; Hedges g; "
            "a12 = P(improvement) with bootstrap interval, '-' where every resample gives the same a12 "
            "(complete separation, or no variance); Welch p, Holm-adjusted over the rows that have one)"
        )
        lines += ["", title, text_table(t)]
    if not v.expected_max.empty:
        em = v.expected_max
        ns = sorted({1, *[2**i for i in range(1, 12) if 2**i < len(em)], len(em)})
        lines += ["", "Expected best objective vs number of candidates (Dodge et al. 2019)",
                  text_table(em[em["n"].isin(ns)])]  # fmt: skip
    ex = v.excluded
    if not ex.empty and (ex["ok"] < ex["runs"]).any():
        t = ex.assign(
            excluded=ex["excluded_share"].map(_pct_cell),
            interval=[f"[{vd.pct(a)}, {vd.pct(b)}]" for a, b in zip(ex["low"], ex["high"], strict=True)],
        )[["point", "runs", "ok", "not_learned", "diverged", "failed", "other", "excluded", "interval"]]  # fmt: skip
        lines += [
            "",
            "Runs left out of every number (share with 95% Wilson interval)",
            text_table(t),
        ]
    lines += [f"warning: {w}" for w in v.warnings]
    return lines


def verdict_json(v: vd.Verdict) -> dict[str, Any]:
    """The verdict as a JSON-safe dict (schema in docs/analysis.md)."""
    return {
        "design": v.design,
        "metric": v.metric,
        "higher_is_better": v.higher_is_better,
        "splits": v.splits,
        "pooled_splits": {s.name: list(s.parts) for s in v.axis.splits if s.pooled} if v.axis else {},
        "axis_from": v.axis.source if v.axis else "default",
        "sentence": v.sentence,
        "model": v.model,
        "reason": v.reason,
        "level": 0.95,
        "shares": records(v.shares),
        "seed_sources": records(v.sources),
        "comparisons": records(v.comparisons),
        "comparison_family": "all rows (Holm)",
        "expected_best": records(v.expected_max),
        "excluded": records(v.excluded),
        "warnings": v.warnings,
    }


def analyze(
    out: Path,
    study: str,
    fmt: str = "table",
    *,
    n_boot: int = 2000,
    seed: int = 0,
    events: list[str] | None = None,
    half_width: float | None = None,
    difference: float | None = None,
    verdict_metric: str | None = None,
    verdict_splits: list[str] | None = None,
) -> str:
    """The numbers of ``study`` in ``out`` as ``table`` text or ``json``.

    Sections: status (runs done/failed/diverged), the verdict (:mod:`analysis.verdict`),
    the summary across seeds per (point, split, metric) with 95% bootstrap intervals of
    the mean (ok runs only), the test-split correlation matrix (primary metric, Pearson r,
    with n), the seed scatter's Pearson and Spearman r with bootstrap intervals, and the
    declared regressions and aggregates (:mod:`analysis.aggregates`). Bootstraps use
    ``n_boot`` replicates from ``default_rng(seed)``.
    Numbers from fewer than 10 runs carry ``n<10`` in their ``warn`` column. Then the
    seed-study questions (:mod:`analysis.seed_questions`): time to each event (``events``:
    ``"val accuracy >= 0.5"`` texts, else the task's declared events), seeds needed for a
    mean to +-``half_width`` and for a ``difference`` (defaults by the metric's range), and
    the Multi-Bootstrap over seeds and test examples. ``verdict_metric`` /
    ``verdict_splits`` (split specs, :mod:`analysis.verdict_axis`) choose what the verdict
    and the seed counts speak about instead of the task's declaration.
    """
    if fmt not in ("table", "json"):
        raise AnalysisError(f"analyze prints 'table' or 'json', not {fmt!r}; pick one of those")
    ctx = open_study(out, study)
    try:
        evs = resolve_events(ctx, events)  # a bad --event fails before any statistics
        axis = vd.study_axis(ctx, verdict_metric, verdict_splits)  # so does a bad axis
        info = next(iter(list_studies(out, only=[study])), None)
        verdict = vd.study_verdict(ctx, n_boot=n_boot, seed=seed, axis=axis)
        summary = summary_table(ctx, n_boot=n_boot, seed=seed)
        mats = test_correlations(ctx)
        scatter = scatter_data(ctx, n_boot=n_boot, seed=seed)
        regs = declared_regressions(ctx)
        agg = study_aggregates(ctx)
        questions = study_questions(ctx, verdict, events=evs, half_width=half_width,
                                    difference=difference, n_boot=n_boot, seed=seed)  # fmt: skip
        spearman: dict[str, stats.Correlation] = {}
        if scatter is not None:
            for p, sub in fit_groups(scatter[0]):
                spearman[p] = stats.correlate(
                    sub["x"], sub["y"], "spearman", n_boot=n_boot, seed=seed
                )
    finally:
        ctx.close()
    reg_rows = pd.DataFrame(
        [
            {
                "point": p,
                "y": axis_label(r.decl.y),
                "x": axis_label(r.decl.x),
                "over": r.decl.over,
                **{
                    k: v
                    for k, v in f.as_dict().items()
                    if k in ("n", "slope", "intercept", "r2", "p")
                },
                "runs": _runs_behind(r.pairs, p),
                "warn": iv.seed_warning(_runs_behind(r.pairs, p)),
            }
            for r in regs
            for p, f in r.fits.items()
        ],
        columns=["point", "y", "x", "over", "n", "runs", "slope", "intercept", "r2", "p", "warn"],
    )
    scatter_records = []
    if scatter is not None and ctx.scatter is not None:
        x_label, y_label = (axis_label(a) for a in ctx.scatter)
        for corr in (scatter[2], spearman):
            for p, c in corr.items():
                scatter_records.append(
                    {"point": p, "x": x_label, "y": y_label, "method": c.method, "n": c.n,
                     "r": c.r, "p": c.p, "low": c.low, "high": c.high,
                     "interval": "bootstrap-percentile", "warn": iv.seed_warning(c.n)}
                )  # fmt: skip
    scatter_rows = pd.DataFrame(
        scatter_records,
        columns=["point", "x", "y", "method", "n", "r", "p", "low", "high", "interval", "warn"],
    )
    status = info.as_dict() if info else {"name": study}
    few = int((summary["warn"] != "").sum()) if not summary.empty else 0
    warnings = list(verdict.warnings) + questions.warnings
    if few and not any("fewer than" in w for w in warnings):
        warnings.append(f"{few} summary rows rest on fewer than {iv.MIN_SEEDS} runs (warn n<10)")
    if fmt == "json":
        doc: dict[str, Any] = {
            "schema": SCHEMA,
            "study": status,
            "primary_metric": ctx.primary,
            "verdict": verdict_json(verdict),
            "summary": records(summary),
            "correlations": [
                {
                    "point": p,
                    "metric": ctx.primary,
                    "method": m.method,
                    "splits": list(m.columns),
                    "r": m.r.to_numpy().tolist(),
                    "p": m.p.to_numpy().tolist(),
                    "n": m.n.to_numpy().tolist(),
                }
                for p, m in mats
            ],
            "scatter": records(scatter_rows),
            "regressions": records(reg_rows),
            "aggregates": [r.as_json() for r in agg.results],
            **questions_json(questions),
            "warnings": warnings,
            "notes": ctx.notes,
        }
        return json.dumps(jsonable(doc), indent=1)
    head = f"Study {study}"
    if info:
        head += (
            f" ({info.kind or '?'}; task {info.task or '?'}, model {info.model or '?'}): "
            f"{info.done} runs done of {info.planned if info.planned is not None else '?'} "
            f"planned ({info.statuses()})"
        )
    parts = [head, "", *verdict_text(verdict), ""]
    parts += [
        "Summary across ok runs (ci = 95% bootstrap interval of the mean; warn n<10: fewer than 10 runs)",
        text_table(summary),
    ]
    for p, m in mats:
        title = f"Correlation across seeds of test-split {ctx.primary} (Pearson r)"
        parts += ["", title + (f" - point {p}" if ctx.multi else ""), _matrix_text(m)]
    pooled_note = (f"({POOLED!r}: the runs of every config fit together (more than {MAX_POINT_FITS} "
                   "configs, or one with under 3 runs), so r also holds the differences between "
                   "configs, not only the seeds')")
    if not scatter_rows.empty:
        parts += ["", "Seed scatter correlation (95% bootstrap interval)", text_table(scatter_rows)]
        if ctx.multi and (scatter_rows["point"] == POOLED).any():
            parts.append(pooled_note)
    if not reg_rows.empty:
        parts += ["", "Regressions declared by the task", text_table(reg_rows)]
        if ctx.multi and (reg_rows["point"] == POOLED).any():
            parts.append(pooled_note)
        if (reg_rows["over"] == "checkpoints").any():
            parts.append("(over checkpoints, n counts (run, checkpoint) pairs: p treats them as "
                         "independent, so it is smaller than the runs behind it support; warn "
                         "counts runs)")
    parts += aggregates_text(agg, text_table)
    parts += questions_text(questions, text_table)
    if questions.warnings:
        parts += ["", *[f"warning: {w}" for w in questions.warnings]]
    if ctx.notes:
        parts += ["", "Notes:", *[f"- {n}" for n in ctx.notes]]
    return "\n".join(parts)
