"""Declared aggregates: a paper's own summaries, declared by the task, computed from the tables.

A task lists them in ``analysis()["aggregates"]`` (written into the study manifest, see
docs/analysis.md); every entry names a ``kind``. Each kind is a frozen dataclass in the
registry :data:`KINDS` that parses its declaration (:meth:`Aggregate.parse`), computes one
table from a study (:meth:`Aggregate.compute`) and draws its charts (:meth:`Aggregate.panels`);
``study analyze`` prints the tables (JSON key ``aggregates``) and ``study report`` shows
tables and charts. Kinds:

* ``best_k``: ``{"k", "by": {split, metric}, "mode": "min"|"max", "of": [{split, metric}]}``
  - per grid point, the summary of the ``of`` values over the ``k`` runs with the lowest
  (``min``) or highest ``by`` value, beside the mean over every run (El-Naggar et al.'s
  "10 ReLU runs with the lowest validation loss");
* ``checkpoint_regression``: ``{"y": {split, metric, transform?}, "x": [{split, metric,
  transform?}], "runs"?: {"k", "by", "mode"}}`` - per grid point and x, OLS of y on x over
  every (run, checkpoint) pair in ``metrics`` (the epochs where both were logged, i.e. the
  snapshot epochs), optionally over the best-k runs only: n, slope, its sign, R^2, p;
* ``baseline``: ``{"metric", "baseline", "label"?}`` - ``baseline`` is a metric the runs
  record from their own data (e.g. Dyck-1's ``fpf_trivial``, the FPF of the predictor that
  says "depth > 0" everywhere); per (point, split) its value beside the runs' ``metric``
  and how many runs beat it. Every chart and table of ``metric`` on a split shows it.
* ``extreme_sb`` and ``ensemble_auc`` (Shah et al. 2020's simplicity bias and ensembles
  of seeds): see :mod:`analysis.ensembles`, registered when this module loads.

The statistics are pure functions on DataFrames whose docstrings state the table shapes
(:func:`best_k_runs`, :func:`subset_summary`, :func:`checkpoint_fits`,
:func:`baseline_summary`). Only runs with status ``ok`` enter a number, as everywhere in
the analysis. A declaration naming values the study lacks is skipped with a note; an
unknown kind is named in a note; a malformed declaration is an :class:`AnalysisError`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis import queries as q
from analysis import stats
from analysis.context import StudyContext, axis_label
from analysis.errors import AnalysisError
from analysis.formatting import records
from analysis.manifest import Axis
from analysis.manifest import _axis as parse_axis
from analysis.verdict import pct_interval

MODES = ("min", "max")
"""Ranking directions of a run subset: keep the lowest (``min``) or highest values."""


# ---------------------------------------------------------------------------- pure functions


def best_k_runs(ranking: pd.DataFrame, k: int, mode: str = "min") -> pd.DataFrame:
    """The ``k`` runs of each grid point with the lowest (``mode="min"``) or highest value.

    ``ranking``: one row per run, columns point, trial_id, seed, value. Runs whose value
    is NaN are never kept; ties go to the lower seed, then the lower trial_id. A point
    with fewer than ``k`` ranked runs keeps them all. Returns the kept rows, columns
    point, trial_id, seed, value, rank (1 = best), runs (ranked runs of the point),
    sorted by point (first appearance) then rank.
    """
    if k < 1 or mode not in MODES:
        raise AnalysisError(f"best_k_runs: k={k}, mode={mode!r}; use k >= 1 and mode min or max")
    cols = ["point", "trial_id", "seed", "value", "rank", "runs"]
    df = ranking.dropna(subset=["value"])
    out = []
    for _, sub in df.groupby("point", sort=False):
        order = sub.sort_values(
            ["value", "seed", "trial_id"], ascending=[mode == "min", True, True], kind="stable"
        )
        kept = order.head(k).assign(rank=np.arange(1, min(k, len(order)) + 1), runs=len(order))
        out.append(kept[cols])
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=cols)


SUBSET_COLUMNS = ("point", "split", "metric", "kept", "runs", "mean", "std", "min", "median",
                  "max", "mean_all")  # fmt: skip


def subset_summary(values: pd.DataFrame, kept: pd.DataFrame) -> pd.DataFrame:
    """Per (point, split, metric): the summary over the kept runs, beside every run's mean.

    ``values``: one row per (run, split, metric), columns point, trial_id, seed, split,
    metric, value. ``kept``: the runs to keep, columns point, trial_id, seed (e.g.
    :func:`best_k_runs`). Returns one row per (point, split, metric) in order of first
    appearance, columns point, split, metric, kept (kept runs with a value), runs (every
    run with a value), mean, std (ddof 1), min, median, max over the kept runs, mean_all
    over every run. NaN values are left out.
    """
    keys = set(zip(kept["trial_id"], kept["seed"].astype(int), strict=True))
    v = values.dropna(subset=["value"])
    rows = []
    for (point, split, metric), sub in v.groupby(["point", "split", "metric"], sort=False):
        mask = [(t, int(s)) in keys for t, s in zip(sub["trial_id"], sub["seed"], strict=True)]
        d = stats.describe(sub.loc[mask, "value"])
        rows.append((point, split, metric, d["n"], len(sub), d["mean"], d["std"], d["min"],
                     d["median"], d["max"], float(sub["value"].mean())))  # fmt: skip
    return pd.DataFrame(rows, columns=list(SUBSET_COLUMNS))


FIT_COLUMNS = ("point", "x", "n", "runs", "slope", "sign", "intercept", "r2", "p", "stderr")


def slope_sign(slope: float) -> str:
    """``+`` or ``-`` for a slope's sign, ``0`` for a flat line, ``""`` when undefined."""
    if slope is None or not np.isfinite(slope):
        return ""
    return "+" if slope > 0 else "-" if slope < 0 else "0"


def checkpoint_fits(pairs: pd.DataFrame) -> pd.DataFrame:
    """OLS of ``y`` on ``x`` per (point, x) over every (run, checkpoint) pair.

    ``pairs``: one row per (point, x, trial_id, seed, step), columns point, x (the name of
    the regressor, e.g. ``-log(val loss)``), trial_id, seed, x_value, y (transforms
    already applied); pairs holding a non-finite value are dropped. Returns one row per
    (point, x) in order of first appearance, columns point, x, n (pairs used), runs
    (distinct runs among them), slope, sign (:func:`slope_sign`), intercept, r2, p (two-
    sided, slope = 0), stderr: :func:`scipy.stats.linregress` via :func:`analysis.stats.regress`
    (NaN numbers for n < 3 or a constant x).
    """
    rows = []
    for (point, x), sub in pairs.groupby(["point", "x"], sort=False):
        keep = np.isfinite(sub["x_value"].to_numpy(float)) & np.isfinite(sub["y"].to_numpy(float))
        used = sub[keep]
        fit = stats.regress(used["x_value"], used["y"])
        runs = len(set(zip(used["trial_id"], used["seed"], strict=True)))
        rows.append((point, x, fit.n, runs, fit.slope, slope_sign(fit.slope), fit.intercept,
                     fit.r2, fit.p, fit.stderr))  # fmt: skip
    return pd.DataFrame(rows, columns=list(FIT_COLUMNS))


BASELINE_COLUMNS = ("point", "split", "metric", "baseline", "baseline_min", "baseline_max",
                    "runs", "mean", "beat", "share_beat")  # fmt: skip


def baseline_summary(values: pd.DataFrame, metric: str, baseline: str, *, higher_is_better: bool = True) -> pd.DataFrame:
    """The runs' ``metric`` against a baseline the runs recorded from their own data.

    ``values``: one row per (run, split, metric), columns point, trial_id, seed, split,
    metric, value, holding both ``metric`` and ``baseline`` rows. Per (point, split) with
    both (order of first appearance): baseline (mean over the runs of each run's baseline
    value), baseline_min, baseline_max (equal when the runs share their data), runs (runs
    with both values), mean (of ``metric``), beat (runs whose ``metric`` beats their own
    baseline: above it, or below it where lower is better, ``higher_is_better``: the
    metric's declaration), share_beat (beat / runs). Returns columns point, split, metric
    (= ``metric``), baseline, baseline_min, baseline_max, runs, mean, beat, share_beat.
    """
    key = ["point", "split", "trial_id", "seed"]
    a = values[values["metric"] == metric][[*key, "value"]].dropna(subset=["value"])
    b = values[values["metric"] == baseline][[*key, "value"]].dropna(subset=["value"])
    both = a.merge(b, on=key, suffixes=("", "_base"), sort=False)
    rows = []
    for (point, split), sub in both.groupby(["point", "split"], sort=False):
        beat = int((sub["value"] > sub["value_base"] if higher_is_better else sub["value"] < sub["value_base"]).sum())
        rows.append((point, split, metric, float(sub["value_base"].mean()),
                     float(sub["value_base"].min()), float(sub["value_base"].max()), len(sub),
                     float(sub["value"].mean()), beat, beat / len(sub)))  # fmt: skip
    return pd.DataFrame(rows, columns=list(BASELINE_COLUMNS))


# ---------------------------------------------------------------------------- declarations


def _fail(where: str, problem: str) -> AnalysisError:
    return AnalysisError(
        f"analysis declaration {where}: {problem}. Fix the task's analysis() declaration "
        "(see docs/analysis.md, 'Declared aggregates')"
    )


def _axis_dict(a: Axis) -> dict[str, Any]:
    return {k: v for k, v in asdict(a).items() if v is not None}


@dataclass(frozen=True)
class RunSubset:
    """Per grid point, the ``k`` runs with the lowest (``min``) or highest ``by`` value."""

    k: int
    """Runs kept per grid point (all of them where a point has fewer)."""
    by: Axis
    """The final (evals) value runs are ranked by, e.g. val loss."""
    mode: str = "min"
    """``min``: keep the lowest values; ``max``: the highest."""

    @classmethod
    def parse(cls, raw: Any, where: str) -> RunSubset:
        if not isinstance(raw, dict) or "k" not in raw or "by" not in raw:
            raise _fail(where, f"expected {{'k': int, 'by': {{split, metric}}, 'mode'?}}, got {raw!r}")
        k, mode = raw["k"], str(raw.get("mode", "min"))
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise _fail(f"{where}.k", f"{k!r} is not an integer >= 1")
        if mode not in MODES:
            raise _fail(f"{where}.mode", f"{mode!r} is not 'min' or 'max'")
        return cls(k, parse_axis(raw["by"], f"{where}.by"), mode)

    def describe(self) -> str:
        """``best 10 by lowest val loss``."""
        return f"best {self.k} by {'lowest' if self.mode == 'min' else 'highest'} {axis_label(self.by)}"

    def kept(self, values: pd.DataFrame) -> pd.DataFrame:
        """:func:`best_k_runs` of ``values`` (an evals-like table, every metric)."""
        by = values[(values["split"] == self.by.split) & (values["metric"] == self.by.metric)]
        return best_k_runs(by[["point", "trial_id", "seed", "value"]], self.k, self.mode)


@dataclass
class AggregateResult:
    """One computed declaration: its table (printed and embedded in JSON) and the rows
    behind its charts."""

    decl: Aggregate
    title: str
    table: pd.DataFrame
    detail: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Per-run (best_k) or per-checkpoint (checkpoint_regression) rows for the charts."""
    more: tuple[tuple[str, pd.DataFrame], ...] = ()
    """Further (title, table) pairs printed under the table (length_generalization: its seed
    sources)."""

    def as_json(self) -> dict[str, Any]:
        """``{kind, title, declaration, rows, more: [{title, rows}]}`` (rows JSON-safe: NaN -> None)."""
        return {"kind": self.decl.kind, "title": self.title, "declaration": self.decl.declaration(),
                "rows": records(self.table), "more": [{"title": t, "rows": records(m)} for t, m in self.more]}  # fmt: skip


Panels = list[tuple[str, Any, bool]]
"""(name, Altair chart, wide) per chart an aggregate draws."""


class Aggregate(ABC):
    """A declared aggregate kind (subclasses are frozen dataclasses in :data:`KINDS`)."""

    kind: ClassVar[str]

    @classmethod
    @abstractmethod
    def parse(cls, raw: dict[str, Any], where: str) -> Aggregate:
        """The typed declaration from its manifest dict (AnalysisError naming ``where``)."""

    @abstractmethod
    def needs(self) -> list[tuple[Axis, str]]:
        """(axis, table) pairs the study must hold for :meth:`compute` (evals or metrics)."""

    @abstractmethod
    def compute(self, ctx: StudyContext, baselines: pd.DataFrame) -> AggregateResult:
        """The table; ``baselines``: :func:`baseline_values` of the study."""

    def declaration(self) -> dict[str, Any]:
        """The declaration as JSON-safe data (echoed in ``study analyze --format json``)."""
        return {"kind": self.kind}

    def baselines(self, ctx: StudyContext) -> pd.DataFrame:
        """Per (point, split, metric) a baseline value this declaration provides (label,
        value); empty for kinds that provide none."""
        return pd.DataFrame(columns=list(BASELINE_VALUE_COLUMNS))

    def panels(
        self, result: AggregateResult, store: Any, baselines: pd.DataFrame, *, multi: bool
    ) -> Panels:
        """Charts of the result (default: none; the table is shown)."""
        return []


KINDS: dict[str, type[Aggregate]] = {}
"""Aggregate kinds by the name a declaration gives as ``kind``."""


def register(cls: type[Aggregate]) -> type[Aggregate]:
    """Class decorator: add an aggregate kind to :data:`KINDS` under its ``kind``."""
    if cls.kind in KINDS:
        raise AnalysisError(f"aggregate kind {cls.kind!r} is registered twice")
    KINDS[cls.kind] = cls
    return cls


BASELINE_VALUE_COLUMNS = ("point", "split", "metric", "value", "label")


def baseline_for(baselines: pd.DataFrame, split: str, metric: str) -> pd.DataFrame:
    """Rows of ``baselines`` (point, value, label) for ``split`` and ``metric``."""
    if baselines.empty:
        return baselines
    sel = (baselines["split"] == split) & (baselines["metric"] == metric)
    return baselines.loc[sel, ["point", "value", "label"]].reset_index(drop=True)


def _ok(ctx: StudyContext) -> pd.DataFrame:
    e = ctx.evals
    return e[e["status"].fillna("ok") == "ok"]


def _with_baseline(table: pd.DataFrame, baselines: pd.DataFrame, split: str | None = None,
                   metric: str | None = None) -> pd.DataFrame:  # fmt: skip
    """``table`` with a ``baseline`` column: the declared baseline of its (point, split,
    metric), or of the given ``split``/``metric`` for tables that lack those columns."""
    b = baselines.rename(columns={"value": "baseline"})[["point", "split", "metric", "baseline"]]
    b = b.drop_duplicates(["point", "split", "metric"])
    t = table.assign(**({"split": split} if split else {}), **({"metric": metric} if metric else {}))
    out = t.merge(b, on=["point", "split", "metric"], how="left", sort=False)
    return out.drop(columns=[c for c, v in (("split", split), ("metric", metric)) if v])


@register
@dataclass(frozen=True)
class BestK(Aggregate):
    """Per grid point, the ``of`` values over the best ``subset.k`` runs (see the module docstring)."""

    kind: ClassVar[str] = "best_k"
    subset: RunSubset
    """Which runs are kept."""
    of: tuple[Axis, ...]
    """The final values summarised over the kept runs."""

    @classmethod
    def parse(cls, raw: dict[str, Any], where: str) -> BestK:
        of = raw.get("of")
        if not isinstance(of, list | tuple) or not of:
            raise _fail(f"{where}.of", f"expected a non-empty list of {{split, metric}}, got {of!r}")
        axes = tuple(parse_axis(a, f"{where}.of[{i}]") for i, a in enumerate(of))
        return cls(RunSubset.parse(raw, where), axes)

    def needs(self) -> list[tuple[Axis, str]]:
        return [(self.subset.by, "evals"), *((a, "evals") for a in self.of)]

    def declaration(self) -> dict[str, Any]:
        s = self.subset
        return {"kind": self.kind, "k": s.k, "by": _axis_dict(s.by), "mode": s.mode,
                "of": [_axis_dict(a) for a in self.of]}  # fmt: skip

    def compute(self, ctx: StudyContext, baselines: pd.DataFrame) -> AggregateResult:
        ok = _ok(ctx)
        kept = self.subset.kept(ok)
        wanted = pd.DataFrame(
            [(a.split, a.metric, i) for i, a in enumerate(self.of)], columns=["split", "metric", "_o"]
        )
        values = ok.merge(wanted, on=["split", "metric"]).sort_values(["point", "_o"], kind="stable")
        table = _with_baseline(subset_summary(values, kept), baselines)
        table["selected"] = table["kept"] < table["runs"]
        table["warn"] = [iv.seed_warning(int(n)) for n in table["kept"]]
        keys = set(zip(kept["trial_id"], kept["seed"].astype(int), strict=True))
        detail = values[["trial_id", "point", "seed", "split", "metric", "value"]].assign(
            kept=[(t, int(s)) in keys for t, s in zip(values["trial_id"], values["seed"], strict=True)]
        )
        title = f"Per grid point, the {self.subset.describe()} (mean_all: every ok run)"
        return AggregateResult(self, title, table.reset_index(drop=True), detail)

    def panels(
        self, result: AggregateResult, store: Any, baselines: pd.DataFrame, *, multi: bool
    ) -> Panels:
        from analysis import charts

        out: Panels = []
        d = result.detail
        for a in self.of:
            sub = d[(d["split"] == a.split) & (d["metric"] == a.metric)]
            if sub.empty:
                continue
            chart = charts.subset_strip(
                store, sub, f"{a.split} {a.metric}", self.subset.describe(),
                baseline=baseline_for(baselines, a.split, a.metric),
            )  # fmt: skip
            out.append((f"best-k-{a.split}-{a.metric}", chart, False))
        return out


@register
@dataclass(frozen=True)
class CheckpointRegression(Aggregate):
    """Per grid point and x, OLS of ``y`` on ``x`` over checkpoints (see the module docstring)."""

    kind: ClassVar[str] = "checkpoint_regression"
    y: Axis
    """The response, e.g. very_long fpf at each snapshot epoch."""
    xs: tuple[Axis, ...]
    """One regression per regressor, e.g. -log(train / val / long loss)."""
    runs: RunSubset | None = None
    """Only these runs' checkpoints (None: every ok run)."""

    @classmethod
    def parse(cls, raw: dict[str, Any], where: str) -> CheckpointRegression:
        xs = raw.get("x")
        if isinstance(xs, dict):
            xs = [xs]
        if not isinstance(xs, list | tuple) or not xs or "y" not in raw:
            raise _fail(where, f"expected 'y' and 'x' (one or a list of {{split, metric, transform?}}), got {raw!r}")
        runs = raw.get("runs")
        return cls(
            parse_axis(raw["y"], f"{where}.y"),
            tuple(parse_axis(x, f"{where}.x[{i}]") for i, x in enumerate(xs)),
            None if runs is None else RunSubset.parse(runs, f"{where}.runs"),
        )

    def needs(self) -> list[tuple[Axis, str]]:
        need = [(self.y, "metrics"), *((x, "metrics") for x in self.xs)]
        return need + ([(self.runs.by, "evals")] if self.runs else [])

    def declaration(self) -> dict[str, Any]:
        r = self.runs
        runs = None if r is None else {"k": r.k, "by": _axis_dict(r.by), "mode": r.mode}
        return {"kind": self.kind, "y": _axis_dict(self.y), "x": [_axis_dict(x) for x in self.xs],
                "runs": runs}  # fmt: skip

    def compute(self, ctx: StudyContext, baselines: pd.DataFrame) -> AggregateResult:
        ok = _ok(ctx)
        runs = ok if self.runs is None else self.runs.kept(ok)
        keys = set(zip(runs["trial_id"], runs["seed"].astype(int), strict=True))
        parts = []
        for x in self.xs:
            p = q.checkpoint_pairs(ctx.con, ctx.name, x, self.y, labels=ctx.labels)
            p = p[[(t, int(s)) in keys for t, s in zip(p["trial_id"], p["seed"], strict=True)]]
            parts.append(
                p.assign(
                    x=axis_label(x),
                    x_value=stats.apply_transform(p["x"], x.transform),
                    y=stats.apply_transform(p["y"], self.y.transform),
                )
            )
        pairs = pd.concat(parts, ignore_index=True)
        table = checkpoint_fits(pairs).sort_values("point", kind="stable")  # x order kept
        table.insert(1, "y", axis_label(self.y))
        table = _with_baseline(table, baselines, self.y.split, self.y.metric)
        table = table.rename(columns={"baseline": "y_baseline"})
        table["warn"] = [iv.seed_warning(int(n)) for n in table["runs"]]
        who = self.runs.describe() if self.runs else "every ok run"
        title = (f"OLS of {axis_label(self.y)} on each x over (run, snapshot epoch) checkpoints, "
                 f"per grid point; runs: {who}")  # fmt: skip
        return AggregateResult(self, title, table.reset_index(drop=True), pairs)

    def panels(
        self, result: AggregateResult, store: Any, baselines: pd.DataFrame, *, multi: bool
    ) -> Panels:
        from analysis import charts

        out: Panels = []
        base = baseline_for(baselines, self.y.split, self.y.metric)
        for x in self.xs:
            sub = result.detail[result.detail["x"] == axis_label(x)]
            sub = sub.assign(x=sub["x_value"]).dropna(subset=["x", "y"])
            if sub.empty:
                continue
            fits = {str(p): stats.regress(g["x"], g["y"]) for p, g in sub.groupby("point", sort=False)}
            chart = charts.regression_chart(
                store, sub, axis_label(x), axis_label(self.y), fits, "checkpoints", multi=multi,
                baseline=base,
            )  # fmt: skip
            out.append((f"checkpoint-regression-{x.split}-{x.metric}", chart, False))
        return out


@register
@dataclass(frozen=True)
class Baseline(Aggregate):
    """A baseline metric the runs record beside ``metric`` (see the module docstring)."""

    kind: ClassVar[str] = "baseline"
    metric: str
    """The runs' metric, e.g. fpf."""
    baseline: str
    """The metric holding the baseline's value on the same data, e.g. fpf_trivial."""
    label: str = "baseline"
    """What the baseline is, drawn beside its line."""

    @classmethod
    def parse(cls, raw: dict[str, Any], where: str) -> Baseline:
        if not isinstance(raw.get("metric"), str) or not isinstance(raw.get("baseline"), str):
            raise _fail(where, f"a baseline needs 'metric' and 'baseline' metric names, got {raw!r}")
        return cls(raw["metric"], raw["baseline"], str(raw.get("label") or raw["baseline"]))

    def needs(self) -> list[tuple[Axis, str]]:
        return []  # the splits with both metrics are found in the data

    def declaration(self) -> dict[str, Any]:
        return {"kind": self.kind, "metric": self.metric, "baseline": self.baseline,
                "label": self.label}  # fmt: skip

    def baselines(self, ctx: StudyContext) -> pd.DataFrame:
        t = baseline_summary(_ok(ctx), self.metric, self.baseline, higher_is_better=ctx.sense(self.metric).higher_is_better)
        return pd.DataFrame({"point": t["point"], "split": t["split"], "metric": self.metric,
                             "value": t["baseline"], "label": self.label})  # fmt: skip

    def compute(self, ctx: StudyContext, baselines: pd.DataFrame) -> AggregateResult:
        hib = ctx.sense(self.metric).higher_is_better
        t = baseline_summary(_ok(ctx), self.metric, self.baseline, higher_is_better=hib)
        rank = {s: i for i, s in enumerate(ctx.splits)}
        t = t.sort_values(["point", "split"], key=lambda c: c.map(rank) if c.name == "split" else c,
                          kind="stable")  # fmt: skip
        t.insert(3, "baseline_metric", self.baseline)
        t["warn"] = [iv.seed_warning(int(n)) for n in t["runs"]]
        title = (f"{self.metric} of the {self.label} ({self.baseline}, from each run's data) beside "
                 f"the runs' {self.metric}; beat: runs {'above' if hib else 'below'} it")  # fmt: skip
        return AggregateResult(self, title, t.reset_index(drop=True))


# ---------------------------------------------------------------------------- a study's


def parse_aggregates(raw: Sequence[Any], notes: list[str] | None = None) -> list[Aggregate]:
    """The typed declarations of a manifest's ``aggregates`` list; an unknown ``kind`` is
    named in ``notes`` and skipped, a malformed entry raises AnalysisError."""
    out: list[Aggregate] = []
    for i, entry in enumerate(raw):
        where = f"aggregates[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("kind"), str):
            raise _fail(where, f"expected an object with a 'kind', got {entry!r}")
        cls = KINDS.get(entry["kind"])
        if cls is None:
            if notes is not None:
                notes.append(f"{where}: aggregate kind {entry['kind']!r} not understood "
                             f"(known: {', '.join(KINDS)}); ignored")  # fmt: skip
            continue
        out.append(cls.parse(entry, where))
    return out


def baseline_values(ctx: StudyContext, decls: Sequence[Aggregate]) -> pd.DataFrame:
    """Every declared baseline per (point, split, metric): columns point, split, metric,
    value, label."""
    parts = [d.baselines(ctx) for d in decls]
    parts = [p for p in parts if not p.empty]
    if not parts:
        return pd.DataFrame(columns=list(BASELINE_VALUE_COLUMNS))
    return pd.concat(parts, ignore_index=True)


@dataclass
class StudyAggregates:
    """A study's computed aggregates and its baselines (for every chart of their metric)."""

    results: list[AggregateResult]
    baselines: pd.DataFrame
    """Columns point, split, metric, value, label (:func:`baseline_values`)."""

    def baseline_for(self, split: str, metric: str) -> pd.DataFrame:
        return baseline_for(self.baselines, split, metric)


def study_aggregates(ctx: StudyContext) -> StudyAggregates:
    """Parse and compute every aggregate the study's task declared (notes go to ``ctx.notes``)."""
    raw = ctx.manifest.declarations.aggregates if ctx.manifest else ()
    decls = parse_aggregates(raw, ctx.notes)
    usable: list[Aggregate] = []
    for d in decls:
        missing = [f"{table} {a.split} {a.metric}" for a, table in d.needs() if not ctx.has(a, table)]
        if missing:
            ctx.notes.append(f"{d.kind} aggregate skipped: no {', '.join(missing)} rows")
        else:
            usable.append(d)
    baselines = baseline_values(ctx, usable)
    results = []
    for d in usable:
        r = d.compute(ctx, baselines)
        if r.table.empty:
            ctx.notes.append(f"{d.kind} aggregate skipped: no ok runs hold its values")
        else:
            results.append(r)
    return StudyAggregates(results, baselines)


TextTable = Callable[[pd.DataFrame], str]


def aggregates_text(agg: StudyAggregates, text_table: TextTable) -> list[str]:
    """The aggregates as text lines for ``study analyze`` (columns all NaN left out)."""
    lines: list[str] = []
    for r in agg.results:
        lines += ["", f"Declared aggregate ({r.decl.kind}): {r.title}", text_table(_shown(r.table))]
        for title, table in r.more:
            lines += [title, text_table(_shown(table))]
    return lines


def _shown(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` without its all-NaN columns; a share with its interval (columns share,
    low, high) as one percent cell, ``48% [35, 56]``."""
    t = table.loc[:, [c for c in table.columns if not table[c].isna().all()]]
    if {"share", "low", "high"} <= set(t.columns):
        cells = [pct_interval(a, lo, hi) for a, lo, hi in t[["share", "low", "high"]].to_numpy()]
        t = t.drop(columns=["low", "high"]).assign(share=cells)
    return t


# more kinds, registered on import (kept in their own modules)
from analysis import ensembles as _ensembles  # noqa: E402,F401  (extreme_sb, ensemble_auc)
from analysis import length_gen as _length_gen  # noqa: E402,F401  (length_generalization)
