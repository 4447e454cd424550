"""Three questions of a seed study, as ``study analyze`` sections: *when* does a run learn
(time to an event), *how many* seeds does a study need, and how do seeds and test
examples together bound a difference (Multi-Bootstrap).

* :func:`study_events`: each event (declared by the task as ``analysis()["events"]``,
  or given as ``study analyze NAME --event "val accuracy >= 0.5"``, which replaces the
  declared ones) read from the ``metrics`` curves: per grid point the Kaplan-Meier
  estimate (median time with its interval, share reached by the budget), censoring by
  kind, diverged runs apart (:mod:`analysis.survival`); and, where configs varied the
  seed sources one at a time, each source's share of the seed variance of the (restricted)
  time to the event and of whether it happened (:func:`analysis.verdict.source_shares`);
* :func:`study_seed_counts`: from the primary metric's spread on the verdict's splits,
  seeds to estimate each mean to +-h and to detect a difference, and the power of each
  config comparison the verdict makes, with a warning when it is under 80%
  (:mod:`analysis.seedcount`);
* :func:`study_multiboot`: from the ``predictions`` table, the difference between two
  configs on a test split and between two test splits of a config, seeds and examples
  resampled together (:mod:`analysis.multiboot`).

:func:`questions_text` and :func:`questions_json` render them (JSON keys ``events``,
``seed_counts``, ``multi_bootstrap``: docs/analysis.md). Only committed runs enter; only
``ok`` runs enter the seed counts and the Multi-Bootstrap, as everywhere in the analysis;
the time to an event reads every run (runs that never learned are its censored runs).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis import multiboot as mb
from analysis import seedcount as sc
from analysis import survival as sv
from analysis import verdict as vd
from analysis.context import StudyContext
from analysis.errors import AnalysisError
from analysis.formatting import records
from analysis.verdict_axis import axis_values

# ---------------------------------------------------------------------------- events


@dataclass
class EventResult:
    """One event's time-to-event analysis."""

    event: sv.Event
    unit: str
    """``epoch`` or ``step``: what a time counts."""
    outcomes: pd.DataFrame
    """:func:`analysis.survival.run_outcomes` (one row per run)."""
    summary: pd.DataFrame
    """:func:`analysis.survival.event_summary`'s summary (one row per grid point)."""
    curves: pd.DataFrame
    """The Kaplan-Meier table per grid point (:data:`analysis.survival.CURVE_COLUMNS`)."""
    sources: pd.DataFrame = field(default_factory=pd.DataFrame)
    """:func:`event_sources`: each seed source's share of the seed variance of the time and
    of whether the event happened (empty unless sources were varied one at a time)."""
    warnings: list[str] = field(default_factory=list)


def logged_pairs(ctx: StudyContext) -> list[tuple[str, str]]:
    """(split, metric) pairs with learning-curve rows in ``metrics``, sorted."""
    rows = ctx.con.execute(
        "SELECT DISTINCT split, metric FROM metrics WHERE study = ? ORDER BY split, metric",
        [ctx.name],
    ).fetchall()
    return [(str(a), str(b)) for a, b in rows]


def resolve_events(ctx: StudyContext, texts: Sequence[str] | None = None) -> list[sv.Event]:
    """The events to analyse: ``texts`` (``--event``) if given, else the task's declared
    ``events``. A given event naming a curve the study lacks is an :class:`AnalysisError`
    listing the valid ``split metric`` pairs; a declared one is skipped with a note."""
    logged = logged_pairs(ctx)
    if texts:
        events = [sv.parse_event(t) for t in texts]
        for e in events:
            for part in (e, e.after):  # the event's curve and its precondition's
                if part is None or (part.split, part.metric) in logged:
                    continue
                choices = (
                    ", ".join(f"'{s} {m}'" for s, m in logged)
                    or "(none: the study logged no curves)"
                )
                raise AnalysisError(
                    f"--event {e.label!r}: study {ctx.name!r} logged no {part.split} {part.metric} curve; "
                    f"use one of its SPLIT METRIC pairs: {choices}"
                )
        return events
    raw = ctx.manifest.declarations.events if ctx.manifest else ()
    out = []
    for i, value in enumerate(raw):
        e = sv.event_from_declaration(value, f"events[{i}]")
        if (e.split, e.metric) in logged and (e.after is None or (e.after.split, e.after.metric) in logged):
            out.append(e)
        else:
            ctx.notes.append(f"declared event {e.label!r} skipped: no {e.split} {e.metric} curve")
    return out


def _train_config(config_json: Any) -> dict[str, Any]:
    try:
        cfg = json.loads(config_json) if isinstance(config_json, str) else {}
    except json.JSONDecodeError:
        cfg = {}
    train = cfg.get("train") if isinstance(cfg, dict) else None
    return train if isinstance(train, dict) else {}


def run_budgets(ctx: StudyContext, unit: str) -> pd.DataFrame:
    """Committed runs with their budget and whether they could stop early, from each
    trial's resolved config (``train.max_epochs`` or ``max_steps``; ``selection.early_stop``
    with a mode other than ``last``). Columns point, trial_id, seed, status, budget,
    early_stop."""
    runs = ctx.run_seeds()
    configs = ctx.con.execute(
        "SELECT trial_id, any_value(config_json) FROM trials WHERE study = ? GROUP BY trial_id",
        [ctx.name],
    ).fetchall()
    budget, early = {}, {}
    for tid, cj in configs:
        t = _train_config(cj)
        b = t.get("max_epochs") if unit == "epoch" else t.get("max_steps")
        budget[tid] = float(b) if isinstance(b, int | float) else np.nan
        found = t.get("selection")
        sel: dict[str, Any] = found if isinstance(found, dict) else {}
        early[tid] = bool(sel.get("early_stop", True)) and sel.get("mode") != "last"
    return pd.DataFrame({
        "point": [ctx.labels.get(t, t) for t in runs["trial_id"]],
        "trial_id": runs["trial_id"], "seed": runs["seed"].astype(int), "status": runs["status"],
        "budget": [budget.get(t, np.nan) for t in runs["trial_id"]],
        "early_stop": [early.get(t, True) for t in runs["trial_id"]],
    })  # fmt: skip


def event_curves(ctx: StudyContext, event: sv.Event) -> tuple[pd.DataFrame, str]:
    """The event's curve per run (columns trial_id, seed, time, value) and its unit:
    ``epoch`` when every row has one, else ``step``."""
    df = ctx.con.execute(
        "SELECT trial_id, seed, epoch, step, value FROM metrics WHERE study = ? AND split = ? "
        "AND metric = ? ORDER BY trial_id, seed, step",
        [ctx.name, event.split, event.metric],
    ).df()
    unit = "epoch" if not df.empty and df["epoch"].notna().all() else "step"
    return df.assign(time=df[unit].astype(float))[["trial_id", "seed", "time", "value"]], unit


def event_sources(
    outcomes: pd.DataFrame, runs: pd.DataFrame, *, level: float = 0.95, n_boot: int = 2000, seed: int = 0
) -> pd.DataFrame:
    """Each seed source's share of the seed variance of an event, where configs varied one
    source each (:func:`analysis.verdict.source_shares`, bootstrap interval).

    ``outcomes``: :func:`analysis.survival.run_outcomes`; ``runs``: one row per run with
    trial_id, seed and the seed-source columns. Two rows per source: ``of`` ``time`` (the
    restricted time to the event, :func:`analysis.survival.restricted_times`: censored runs
    at their censoring time, so "never" and "late" both count) and ``reached`` (0/1: whether
    it happened). Columns: of, then :func:`analysis.verdict.source_shares`'s. Empty when
    fewer than two sources were varied alone or the event has no seed variance.
    """
    return vd.outcome_sources(sv.restricted_times(outcomes), ("time", "reached"), runs, level=level,
                              n_boot=n_boot, seed=seed)  # fmt: skip


def study_events(
    ctx: StudyContext, events: Sequence[sv.Event], *, level: float = 0.95
) -> list[EventResult]:
    """Each event's time-to-event analysis (see the module docstring)."""
    out = []
    runs = ctx.run_seeds()
    points = list(dict.fromkeys(ctx.labels.get(t, t) for t in runs["trial_id"]))
    for e in events:
        curves, unit = event_curves(ctx, e)
        after = event_curves(ctx, e.after)[0] if e.after is not None else None
        outcomes = sv.run_outcomes(curves, run_budgets(ctx, unit), e, after)
        summary, km = sv.event_summary(outcomes, level=level, points=points)
        res = EventResult(e, unit, outcomes, summary, km, event_sources(outcomes, runs, level=level))
        early = int((outcomes["outcome"] == "early_stop").sum())
        if early:
            res.warnings.append(
                f"{early} of {len(outcomes)} runs stopped early (early stopping) before "
                f"{e.label}: informative censoring (the stopping rule read the same curves), "
                f"so the times and shares reached are biased; {sv.EARLY_STOP_FIX}"
            )
        div = int((outcomes["outcome"] == "diverged").sum())
        if div:
            res.warnings.append(
                f"{div} runs diverged before {e.label}: a competing outcome, left out of the "
                "Kaplan-Meier estimate and counted apart (reached_all: share of all runs, "
                "Aalen-Johansen)"
            )
        out.append(res)
    return out


# ---------------------------------------------------------------------------- seed counts


def compared_points(verdict: vd.Verdict) -> set[str] | None:
    """For a tuning study, the candidates its verdict compares (winner and runner-up): seed
    counts and the Multi-Bootstrap speak about those only; ``None`` (every config) otherwise."""
    if verdict.design != "tune":
        return None
    c = verdict.comparisons
    return set(c["better"]) | set(c["worse"]) if not c.empty else set()


@dataclass
class SeedCounts:
    """How many seeds: per (point, split) and per config comparison."""

    metric: str | None
    half_width: float
    difference: float
    targets: str
    """How the half-width and difference were chosen (given, or the defaults)."""
    table: pd.DataFrame
    """:func:`analysis.seedcount.seed_count_table`."""
    power: pd.DataFrame
    """:func:`analysis.seedcount.power_table` (grid comparisons)."""
    warnings: list[str] = field(default_factory=list)


def study_seed_counts(
    ctx: StudyContext,
    verdict: vd.Verdict,
    *,
    half_width: float | None = None,
    difference: float | None = None,
    level: float = 0.95,
) -> SeedCounts:
    """Seed counts for the verdict's metric and splits (ok runs only); ``half_width`` and
    ``difference`` default by the metric's range (:func:`analysis.seedcount.default_targets`)."""
    e = ctx.evals
    metric = verdict.metric
    ok = e[e["status"].fillna("ok") == "ok"]
    ok = axis_values(ok, verdict.axis) if verdict.axis else ok.iloc[0:0]
    shown = compared_points(verdict)
    if shown is not None:
        ok = ok[ok["point"].isin(shown)]
    # a share of the mean is the headline split's: pooled, a split with errors 700x smaller
    # than another's got a target 7x its own mean
    head = ok[ok["split"] == verdict.splits[0]] if verdict.splits and "split" in ok.columns else ok
    h0, d0, how = (
        sc.default_targets((head if not head.empty else ok)["value"], ctx.sense(metric) if metric else None)
        if not ok.empty
        else (sc.UNIT_HALF_WIDTH, sc.UNIT_DIFFERENCE, "")
    )
    h = h0 if half_width is None else float(half_width)
    d = d0 if difference is None else float(difference)
    targets = f"half-width {h:.4g}, difference {d:.4g} " + (
        "(given)" if half_width is not None and difference is not None else f"(defaults: {how})"
    )
    out = SeedCounts(metric, h, d, targets, pd.DataFrame(columns=list(sc.SEED_COLUMNS)),
                     pd.DataFrame(columns=list(sc.POWER_COLUMNS)))  # fmt: skip
    if ok.empty:
        return out
    out.table = sc.seed_count_table(ok, half_width_target=h, difference=d, level=level)
    if verdict.design == "grid" and not verdict.comparisons.empty:
        out.power = sc.power_table(ok, verdict.comparisons[["split", "better", "worse"]], difference=d)
        weak = out.power[out.power["underpowered"]]
        for r in weak.head(3).itertuples(index=False):
            need = (
                "more than a reachable number of" if r.seeds_needed is None or pd.isna(r.seeds_needed)
                else f"{int(r.seeds_needed)}"
            )
            out.warnings.append(
                f"underpowered: {r.better} vs {r.worse} on {r.split} has power {r.power:.2f} "
                f"with {r.n_better}/{r.n_worse} seeds to detect a difference of {r.difference:.3g}; "
                f"{need} seeds per config give {sc.POWER:.0%}"
            )
        if len(weak) > 3:
            out.warnings.append(
                f"underpowered: {len(weak) - 3} more comparisons (see the power table of `study analyze`)"
            )
    return out


# ---------------------------------------------------------------------------- Multi-Bootstrap

MULTIBOOT_COLUMNS = (
    "kind", "where", "a", "b", "seeds_a", "seeds_b", "examples_a", "examples_b", "paired_seeds",
    "paired_examples", "mean_a", "mean_b", "diff", "low", "high", "p", "warn",
)  # fmt: skip
"""``kind``: ``configs`` (``where`` = the split, ``a``/``b`` points) or ``splits``
(``where`` = the point, ``a``/``b`` splits)."""


@dataclass
class _Table:
    """One config's correctness on one split: (seeds, examples)."""

    x: np.ndarray
    seeds: tuple[int, ...]
    examples: tuple[int, ...]


def prediction_tables(ctx: StudyContext, splits: Sequence[str]) -> dict[tuple[str, str], _Table]:
    """(point, split) -> the ok runs' correctness matrix, examples every run scored."""
    if not splits:
        return {}
    marks = ",".join("?" * len(splits))
    df = ctx.con.execute(
        "SELECT p.trial_id, p.seed, p.split, p.example_id, p.correct FROM predictions p "
        "JOIN runs r USING (study, trial_id, seed) WHERE p.study = ? AND coalesce(r.status, 'ok') = 'ok' "
        f"AND p.correct IS NOT NULL AND p.split IN ({marks})",
        [ctx.name, *splits],
    ).df()
    out = {}
    for (tid, split), sub in df.groupby(["trial_id", "split"]):  # sorted: rows come in any order
        wide = sub.pivot_table(
            index="seed", columns="example_id", values="correct", aggfunc="first"
        )
        wide = wide.dropna(axis=1).sort_index().sort_index(axis=1)
        if wide.shape[1]:
            out[(ctx.labels.get(tid, tid), split)] = _Table(
                wide.to_numpy(dtype=float), tuple(int(s) for s in wide.index),
                tuple(int(c) for c in wide.columns),
            )  # fmt: skip
    return out


PAIR_SHARE = 0.8
"""Two configs' runs are drawn as seed pairs when the seeds both ran (same indices and seed
values) are at least this share of each config's runs, and at least 2."""


def _pairable(shared: int, n_a: int, n_b: int) -> bool:
    """Whether ``shared`` seeds common to configs of ``n_a`` and ``n_b`` ok runs pair them
    (:data:`PAIR_SHARE`): pairing drops the runs without a partner, worth it for a few."""
    return shared >= 2 and shared >= PAIR_SHARE * max(n_a, n_b)


def _positions(keys: tuple[int, ...], wanted: Sequence[int]) -> list[int]:
    """Where each of ``wanted`` sits in ``keys`` (a dict: ``keys.index`` per item is
    quadratic, and test splits have thousands of examples)."""
    at = {k: i for i, k in enumerate(keys)}
    return [at[w] for w in wanted]


def _seed_values(ctx: StudyContext) -> dict[str, dict[int, tuple[Any, ...]]]:
    runs = ctx.run_seeds()
    out: dict[str, dict[int, tuple[Any, ...]]] = {}
    for r in runs.itertuples(index=False):
        point = ctx.labels.get(r.trial_id, r.trial_id)
        out.setdefault(point, {})[int(r.seed)] = (
            r.init_seed,
            r.order_seed,
            r.dropout_seed,
            r.data_seed,
        )
    return out


def _example_sets(ctx: StudyContext, splits: Sequence[str]) -> dict[tuple[str, str], str]:
    """(point, split) -> a digest of its test examples (each ``example_id`` with its input
    and target, from the predictions of its first seed): two configs share their examples
    only where these agree (a grid over ``task.kind`` names different examples by the same
    ids, on the same data seed)."""
    if not splits:
        return {}
    marks = ",".join("?" * len(splits))
    rows = ctx.con.execute(
        "WITH first AS (SELECT trial_id, split, min(seed) AS seed FROM predictions WHERE study = ? "
        f"AND split IN ({marks}) GROUP BY ALL) "
        "SELECT p.trial_id, p.split, md5(string_agg(p.example_id::VARCHAR || chr(31) || coalesce(p.input, '') "
        "|| chr(31) || coalesce(p.target, ''), chr(30) ORDER BY p.example_id)) "
        "FROM predictions p JOIN first f USING (trial_id, split, seed) WHERE p.study = ? GROUP BY ALL",
        [ctx.name, *splits, ctx.name],
    ).fetchall()
    return {(ctx.labels.get(tid, tid), str(split)): str(h) for tid, split, h in rows}


def study_multiboot(
    ctx: StudyContext,
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
    points: set[str] | None = None,
) -> pd.DataFrame:
    """The Multi-Bootstrap rows of :data:`MULTIBOOT_COLUMNS`: every pair of configs on each
    test split (up to :data:`analysis.verdict.MAX_ALL_PAIRS` configs, else each against the
    best) and every pair of test splits of each config, the higher mean first. ``points``:
    only these configs (all when ``None``)."""
    tables = prediction_tables(ctx, ctx.test_splits)
    primary = ctx.sense(ctx.primary) if ctx.primary else None
    if (not tables and primary is not None and primary.declared and not (primary.unit and primary.higher_is_better)
            and (ctx.con.execute("SELECT count(*) FROM predictions WHERE study = ?", [ctx.name]).fetchone() or (0,))[0]):
        note = (f"Multi-Bootstrap: none, as the primary metric {ctx.primary} is no share of correct examples "
                "(predictions.correct is null)")
        if note not in ctx.notes:
            ctx.notes.append(note)
    if points is not None:
        tables = {k: v for k, v in tables.items() if k[0] in points}
    seeds = _seed_values(ctx)
    examples = _example_sets(ctx, ctx.test_splits)
    varied = [p for p, s in seeds.items() if len({v[3] for v in s.values()}) > 1]
    if varied:
        ctx.notes.append(
            f"Multi-Bootstrap skipped for {', '.join(varied)}: its runs vary the data seed, so "
            "an example id names a different example in each run"
        )
        tables = {k: v for k, v in tables.items() if k[0] not in varied}
    rows: list[tuple[Any, ...]] = []

    def add(kind: str, where: str, ka: tuple[str, str], kb: tuple[str, str], paired_seeds: bool,
            paired_examples: bool, a: np.ndarray, b: np.ndarray) -> None:  # fmt: skip
        if a.mean() < b.mean():
            ka, kb, a, b = kb, ka, b, a
        r = mb.multi_bootstrap(a, b, paired_seeds=paired_seeds, paired_examples=paired_examples,
                               n_boot=n_boot, level=level, seed=seed + len(rows))  # fmt: skip
        names = (ka[0], kb[0]) if kind == "configs" else (ka[1], kb[1])
        rows.append((kind, where, *names, a.shape[0], b.shape[0], a.shape[1], b.shape[1],
                     paired_seeds, paired_examples, r.mean_a, r.mean_b, r.estimate, r.low,
                     r.high, r.p, iv.seed_warning(min(a.shape[0], b.shape[0]))))  # fmt: skip

    for split in ctx.test_splits:
        here = sorted(
            ((p, t) for (p, s), t in tables.items() if s == split), key=lambda x: (-x[1].x.mean(), x[0])
        )  # ties in config order, whatever order the rows were read in
        if len(here) <= vd.MAX_ALL_PAIRS:
            pairs = [(here[i], here[j]) for i in range(len(here)) for j in range(i + 1, len(here))]
        else:
            pairs = [(here[0], o) for o in here[1:]]
        for (pa, ta), (pb, tb) in pairs:
            in_b = set(tb.seeds)
            shared = [s for s in ta.seeds if s in in_b and seeds[pa].get(s) == seeds[pb].get(s)]
            same_seeds = _pairable(len(shared), len(ta.seeds), len(tb.seeds))
            xa, xb = ta.x, tb.x
            if same_seeds and len(shared) < max(len(ta.seeds), len(tb.seeds)):
                # a run left out (diverged, not learned) leaves its partner without one
                xa, xb = ta.x[_positions(ta.seeds, shared)], tb.x[_positions(tb.seeds, shared)]
                note = (f"Multi-Bootstrap pairs {pa} and {pb} on the {len(shared)} seeds both ran ok; "
                        "runs without a partner are left out of those rows")
                if note not in ctx.notes:
                    ctx.notes.append(note)
            common = sorted(set(ta.examples) & set(tb.examples))
            same_data = ({v[3] for v in seeds[pa].values()} == {v[3] for v in seeds[pb].values()}
                         and examples.get((pa, split)) == examples.get((pb, split)))  # fmt: skip
            if same_data and common:
                ia, ib = _positions(ta.examples, common), _positions(tb.examples, common)
                add("configs", split, (pa, split), (pb, split), same_seeds, True, xa[:, ia], xb[:, ib])
            else:
                add("configs", split, (pa, split), (pb, split), same_seeds, False, xa, xb)
    for point in dict.fromkeys(p for p, _ in tables):
        mine = [(s, tables[(point, s)]) for s in ctx.test_splits if (point, s) in tables]
        for i in range(len(mine)):
            for j in range(i + 1, len(mine)):
                (sa, ta), (sb, tb) = mine[i], mine[j]
                both = sorted(set(ta.seeds) & set(tb.seeds))
                if len(both) < 2:
                    continue
                ra, rb = _positions(ta.seeds, both), _positions(tb.seeds, both)
                add("splits", point, (point, sa), (point, sb), True, False, ta.x[ra], tb.x[rb])
    return pd.DataFrame(rows, columns=list(MULTIBOOT_COLUMNS))


# ---------------------------------------------------------------------------- rendering


@dataclass
class Questions:
    """The three sections of one study."""

    events: list[EventResult]
    seeds: SeedCounts
    multiboot: pd.DataFrame
    n_boot: int
    level: float = 0.95

    @property
    def warnings(self) -> list[str]:
        return [w for e in self.events for w in e.warnings] + self.seeds.warnings


def study_questions(
    ctx: StudyContext,
    verdict: vd.Verdict,
    *,
    events: Sequence[sv.Event] = (),
    half_width: float | None = None,
    difference: float | None = None,
    n_boot: int = 2000,
    seed: int = 0,
) -> Questions:
    """All three sections of an open study (``events``: from :func:`resolve_events`)."""
    evs = study_events(ctx, events)
    counts = study_seed_counts(ctx, verdict, half_width=half_width, difference=difference)
    boot = study_multiboot(ctx, n_boot=n_boot, seed=seed, points=compared_points(verdict))
    return Questions(evs, counts, boot, n_boot)


def _ci(a: float, lo: float, hi: float, digits: str = ".3g") -> str:
    def f(v: float) -> str:
        return "-" if v is None or not np.isfinite(v) else format(v, digits)

    return f"{f(a)} [{f(lo)}, {f(hi)}]"


TextTable = Callable[[pd.DataFrame], str]


def questions_text(qs: Questions, text_table: Callable[..., str]) -> list[str]:
    """The three sections as text lines for ``study analyze``."""
    lines: list[str] = []
    for r in qs.events:
        s = r.summary
        t = s.assign(
            median=[_ci(a, b, c, "g") for a, b, c in zip(s["median"], s["median_low"], s["median_high"], strict=True)],
            reached=[vd.pct_interval(a, b, c) for a, b, c in zip(s["reached"], s["reached_low"], s["reached_high"], strict=True)],
            reached_all=s["reached_all"].map(lambda v: f"{vd.pct(v)}%"),
        )[["point", "runs", "events", "censored_budget", "censored_early_stop", "censored_other",
           "diverged", "budget", "median", "reached", "reached_all", "warn"]]  # fmt: skip
        lines += [
            "",
            f"Time to event {r.event.label} (in {r.unit}s; Kaplan-Meier, 95% log-log band; median "
            "interval where the band crosses 0.5, '-': not reached; reached: share of runs that "
            "did not diverge, by the budget; reached_all: share of all runs, divergence competing)",
            text_table(t),
        ]
        for p, km in r.curves.groupby("point", sort=False):
            k = km.assign(interval=[f"[{vd.pct(1 - h)}, {vd.pct(1 - lo)}]" for lo, h in zip(km["low"], km["high"], strict=True)],
                          reached=km["reached"].map(lambda v: f"{vd.pct(v)}%"))  # fmt: skip
            k = k[["time", "at_risk", "events", "censored", "reached", "interval"]].rename(
                columns={"time": r.unit}
            )
            lines += [f"Share reached by each {r.unit}" + (f" - point {p}" if len(r.summary) > 1 else ""),
                      text_table(k, max_rows=40)]  # fmt: skip
        if not r.sources.empty:
            src = r.sources.assign(share=[f"{vd.pct(x['share'])}% {vd.source_interval(x)}" for _, x in r.sources.iterrows()])
            lines += [f"Seed sources of {r.event.label}, varied one at a time: each source's share of the seed "
                      f"variance of the time ({r.unit}s; censored runs at their censoring time) and of whether it "
                      "happened (95% percentile bootstrap, runs resampled within each config)",
                      text_table(src[["of", "source", "configs", "runs", "var", "share", "warn"]])]  # fmt: skip
    c = qs.seeds
    if not c.table.empty:
        t = c.table.copy()
        defined = np.isfinite(t["sd"].astype(float))  # n < 2: no sd, so no count either
        for col in ("seeds_needed", "seeds_needed_sd_upper", "seeds_per_config"):
            t[col] = [_count(v, d) for v, d in zip(t[col], defined, strict=True)]
        lines += [
            "",
            f"How many seeds ({c.metric}; {c.targets}): seeds_needed to estimate the mean to "
            "+-half_width (95% t interval; with sd at its 95% upper bound beside it), "
            f"seeds_per_config to detect the difference with {sc.POWER:.0%} power",
            f"(assumptions: {sc.ASSUMPTIONS})",
            text_table(t),
        ]
        if not c.power.empty:
            p = c.power.assign(seeds_needed=[
                _count(v, bool(d)) for v, d in zip(c.power["seeds_needed"], c.power["difference"] != 0, strict=True)
            ])
            lines += [f"Power of each config comparison at its seeds, to detect the difference {c.difference:.4g} "
                      f"(two-sided Welch t, alpha {sc.ALPHA}; underpowered: power < {sc.POWER})",
                      text_table(p)]  # fmt: skip
    if not qs.multiboot.empty:
        m = qs.multiboot.assign(
            diff_ci=[_ci(a, b, c, ".4f") for a, b, c in zip(qs.multiboot["diff"], qs.multiboot["low"], qs.multiboot["high"], strict=True)]
        )[["kind", "where", "a", "b", "seeds_a", "seeds_b", "examples_a", "examples_b", "paired_seeds",
           "paired_examples", "mean_a", "mean_b", "diff_ci", "p", "warn"]]  # fmt: skip
        m["p"] = [f"< {1 / qs.n_boot:.2g}" if v == 0 else f"{v:.3g}" for v in m["p"]]  # 0 of n_boot replicates
        lines += [
            "",
            f"Multi-Bootstrap over seeds and test examples (share correct; {qs.n_boot} replicates, "
            "95% percentile interval, p: two-sided bootstrap share; configs: same examples drawn "
            "for both where they share their test examples (paired_examples), seeds together when both ran "
            "the same; splits: seeds together, examples per split)",
            text_table(m),
        ]
    return lines


def questions_json(qs: Questions) -> dict[str, Any]:
    """The three sections as JSON-safe values (keys ``events``, ``seed_counts``,
    ``multi_bootstrap``; schema in docs/analysis.md)."""
    c = qs.seeds
    return {
        "events": [
            {"event": r.event.as_dict(), "unit": r.unit, "level": qs.level,
             "method": "Kaplan-Meier (scipy.stats.ecdf), log-log band; median interval where the band "
                       "crosses 0.5 (Brookmeyer-Crowley); diverged runs competing (Aalen-Johansen)",
             "summary": records(r.summary), "curves": records(r.curves), "runs": records(r.outcomes),
             "sources": records(r.sources), "warnings": r.warnings}
            for r in qs.events
        ],
        "seed_counts": {
            "metric": c.metric, "level": qs.level, "half_width": c.half_width,
            "difference": c.difference, "targets": c.targets, "power": sc.POWER, "alpha": sc.ALPHA,
            "assumptions": sc.ASSUMPTIONS, "estimate": records(c.table),
            "comparisons": records(c.power), "warnings": c.warnings,
        },
        "multi_bootstrap": {
            "n_boot": qs.n_boot, "level": qs.level, "statistic": "share of correct predictions",
            "interval": "bootstrap-percentile", "rows": records(qs.multiboot),
        },
    }  # fmt: skip


def _count(v: Any, defined: bool) -> str:
    """A seed count as text: blank where it is undefined (one run: no sd; no difference),
    ``>100000`` where it is above :data:`analysis.seedcount.MAX_SEEDS`."""
    if v is not None and not pd.isna(v):
        return str(int(v))
    return f">{sc.MAX_SEEDS}" if defined else ""
