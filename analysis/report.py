"""``study report``: one self-contained HTML page of a study's charts (or PNG/SVG/PDF).

The page inlines the Vega, Vega-Lite and vega-embed JavaScript that vl-convert-python
ships (no CDN is needed or contacted), a short header (study, task, model, runs, seeds,
git SHA, dates), the verdict (:mod:`analysis.verdict`: does the config or the seed
decide?), the resolved config per grid point, and one Vega-Lite view holding every
chart, so a seed clicked in one chart is highlighted in all of them.

Charts: per-split distribution of the primary metric across seeds (one dot per seed, the
mean with its 95% bootstrap interval); for a grid, rliable-style probability of
improvement and performance profile on the headline split; the seed scatter between two
test splits (declared, else the first two) with fitted line and Pearson r with its
bootstrap interval; learning curves against the unit training used (epoch or step),
mean and 95% bootstrap band over a fixed set of seeds (min-max with ``band="minmax"``),
with one band per grid point in a panel per split when the study has several points;
the decision surface per seed of a task that declares ``decision_boundary`` (heatmap
with its 0.5 contour); for tuning studies the objective by trial and against each
``param_*``; the task's declared histograms and regressions; the declared aggregates
(:mod:`analysis.aggregates`: tables under the verdict, their charts last, and each declared
baseline as a labelled rule on every chart of its metric); last the Kaplan-Meier curves of
the task's declared events, the seed-count chart and a grid's power chart
(:mod:`analysis.seed_charts`). Runs that are not ``ok``
(diverged, not_learned) are left out of means and bands and counted in the verdict.
Each metric's definition (declared by the task) is written under its charts.

:func:`write_report` is the one-call entry point; :func:`build_report` returns a
:class:`Report` that can be saved in several formats without recomputing it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import altair as alt

from analysis import bands, charts, compare_charts, curve_charts
from analysis import queries as q
from analysis import verdict as vd
from analysis.aggregates import StudyAggregates, study_aggregates
from analysis.analyze import analyze, declared_regressions, scatter_data
from analysis.boundary import boundary_data, point_grids
from analysis.context import StudyContext, axis_label, open_study
from analysis.errors import AnalysisError
from analysis.report_page import definition, header_html, header_lines, render_html, vl_version
from analysis.seed_charts import question_panels
from analysis.verdict_axis import axis_values

__all__ = ["Panel", "Report", "analyze", "build_report", "write_report"]
"""``analyze`` lives in :mod:`analysis.analyze`; it is re-exported here for the CLI."""

MAX_SEED_CURVE_ROWS = 30_000
"""Per-seed curve lines are embedded (for the seed highlight) up to this many rows."""

MAX_CURVE_POINTS = 6
"""Learning curves get one band per grid point up to this many points; beyond, pooled."""

MAX_BOUNDARY_SEEDS = 12
"""Decision-boundary panels drawn per grid point (the lowest seed indices)."""

IMAGE_SUFFIXES = (".png", ".svg", ".pdf")

@contextmanager
def _progress(quiet: bool, total: int) -> Iterator[Any]:
    """A rich progress bar on stderr when it is a terminal (in a log or a pipe a transient
    bar only leaves a blank line); yields ``step(description)``."""
    from rich.console import Console

    console = Console(stderr=True)
    if quiet or not console.is_terminal:
        yield lambda _msg: None
        return
    from rich.progress import Progress

    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("report", total=total)

        def step(msg: str) -> None:
            bar.update(task, advance=1, description=msg)

        yield step


@dataclass(frozen=True)
class Panel:
    """One chart of the report; ``wide`` charts get a row of their own."""

    name: str
    chart: Any
    wide: bool = False


def _ok_runs(ctx: StudyContext) -> set[tuple[str, int]]:
    runs = ctx.run_seeds()
    ok = runs[runs["status"].fillna("ok") == "ok"]
    return set(zip(ok["trial_id"], ok["seed"].astype(int), strict=True))


def _curves(
    ctx: StudyContext,
    store: charts.ChartData,
    metric: str,
    ok: set[tuple[str, int]],
    *,
    band: str = "ci",
    n_boot: int = 1000,
    seed: int = 0,
) -> Panel:
    per_seed = q.curve_values(ctx.con, ctx.name, metric, labels=ctx.labels)
    keep = [(t, int(s)) in ok for t, s in zip(per_seed["trial_id"], per_seed["seed"], strict=True)]
    if not all(keep):
        ctx.notes.append(f"{metric} curves: runs not ok (diverged, not_learned...) left out")
        per_seed = per_seed[keep]
    unit = "step"
    per_run = per_seed.groupby(["trial_id", "seed", "split"])
    if (
        per_seed["epoch"].notna().all()
        and (per_run["epoch"].nunique() == per_run["step"].nunique()).all()
    ):
        per_seed = per_seed.assign(step=per_seed["epoch"])
        unit = "epoch"
    if per_seed["point"].nunique() > MAX_CURVE_POINTS:
        ctx.notes.append(
            f"{metric} curves: {per_seed['point'].nunique()} grid points pooled into one band "
            f"(more than {MAX_CURVE_POINTS})"
        )
        per_seed["point"] = "all configs"
    agg, notes = bands.curve_bands(per_seed, band=band, n_boot=n_boot, seed=seed, unit=unit)
    ctx.notes.extend(f"{metric} curves: {n}" for n in notes)
    name = "95% bootstrap band of the mean" if band == "ci" else "min-max band"
    args = dict(band=name, unit=unit, definition=definition(ctx, metric))
    if len(per_seed) > MAX_SEED_CURVE_ROWS:
        ctx.notes.append(f"{metric} curves: per-seed lines left out ({len(per_seed)} rows)")
        chart = curve_charts.learning_curves(store, agg, None, metric, ctx.splits, **args)  # type: ignore[arg-type]
    else:
        chart = curve_charts.learning_curves(store, agg, per_seed, metric, ctx.splits, **args)  # type: ignore[arg-type]
    return Panel(f"curves-{metric}", chart, wide=agg["point"].nunique() > 1)


def _verdict_charts(ctx: StudyContext, store: charts.ChartData, v: vd.Verdict) -> list[Panel]:
    """rliable-style probability of improvement and performance profile (a grid verdict)."""
    if v.design != "grid" or v.metric is None:
        return []
    split = v.splits[0]
    out = []
    cmp = v.comparisons[v.comparisons["split"] == split]
    if not cmp.empty:
        out.append(Panel("improvement", compare_charts.improvement_chart(store, cmp, split, v.metric)))
    e = ctx.evals
    ok = e[e["status"].fillna("ok") == "ok"]
    vals = axis_values(ok, v.axis) if v.axis else ok.iloc[0:0]
    vals = vals[vals["split"] == split]
    prof = bands.performance_profile(vals, higher_is_better=v.higher_is_better)
    if not prof.empty:
        chart = compare_charts.performance_profile_chart(
            store, prof, split, v.metric, higher_is_better=v.higher_is_better
        )
        out.append(Panel("performance-profile", chart))
    return out


def _boundary(ctx: StudyContext, store: charts.ChartData) -> Panel | None:
    """The declared decision surface per seed, or ``None`` (with a note) without data."""
    decl = ctx.manifest.declarations.decision_boundary if ctx.manifest else None
    if decl is None:
        return None
    preds = q.split_predictions(ctx.con, ctx.name, decl.split, labels=ctx.labels)
    if preds.empty:
        ctx.notes.append(
            f"decision boundary skipped: no predictions on split {decl.split!r} "
            "(the study writes them unless train.predictions is off)"
        )
        return None
    data = boundary_data(preds, decl, point_grids(ctx.manifest, decl), max_seeds=MAX_BOUNDARY_SEEDS)
    ctx.notes.extend(data.notes)
    if data.cells.empty:
        ctx.notes.append(
            f"decision boundary skipped: the predictions on split {decl.split!r} are not numbers"
        )
        return None
    chart = charts.decision_boundary(
        store,
        data.cells,
        data.segments,
        extent=data.extent,
        axes=decl.axes,
        metric=decl.metric,
        split=decl.split,
        multi=data.cells["point"].nunique() > 1,
    )
    return Panel("decision-boundary", chart, wide=True)


def _maximize(ctx: StudyContext) -> bool:
    """Tuning direction from the manifest (see :func:`analysis.verdict.maximize`)."""
    return vd.maximize(ctx.manifest)


def build_charts(
    ctx: StudyContext,
    store: charts.ChartData,
    *,
    n_boot: int = 2000,
    seed: int = 0,
    band: str = "ci",
    verdict: vd.Verdict | None = None,
    aggregates: StudyAggregates | None = None,
) -> list[Panel]:
    """The study's charts, in page order (see the module docstring); rows go to ``store``.

    ``band``: ``ci`` (95% bootstrap bands of the mean) or ``minmax`` (range over seeds,
    and min-max boxes beside the per-split dots). ``aggregates``: the declared aggregates
    (:func:`analysis.aggregates.study_aggregates`, computed here when not given): their
    charts, and their baselines beside every chart of the baseline's metric."""
    if band not in bands.BANDS:
        raise AnalysisError(f"band {band!r} is not one of {', '.join(bands.BANDS)}")
    agg = study_aggregates(ctx) if aggregates is None else aggregates
    out: list[Panel] = []
    e = ctx.evals
    if ctx.primary is not None:
        shown = [s for s in ctx.splits if ctx.roles.get(s) != "train"] or ctx.splits
        values = e[(e["metric"] == ctx.primary) & e["split"].isin(shown)]
        values = values[values["status"].fillna("ok") == "ok"]
        ci = bands.split_intervals(values, n_boot=n_boot, seed=seed)
        chart = charts.split_distribution(
            store, values, ctx.primary, shown, multi=ctx.multi, intervals=ci,
            show_range=band == "minmax", definition=definition(ctx, ctx.primary),
        )  # fmt: skip
        n_points = values["point"].nunique()
        out.append(Panel("distribution", chart, wide=len(shown) * n_points > 6))
    if verdict is not None:
        out += _verdict_charts(ctx, store, verdict)
    sc = scatter_data(ctx, n_boot=n_boot, seed=seed)
    if sc is not None and ctx.scatter is not None and not sc[0].empty:
        pairs, fits, corrs = sc
        x, y = (axis_label(a) for a in ctx.scatter)
        out.append(
            Panel("scatter", charts.seed_scatter(store, pairs, x, y, fits, corrs, multi=ctx.multi))
        )
    curve_metrics = q.metrics_of(ctx.con, ctx.name, "metrics")
    declared = ctx.manifest.declarations.curve_metrics if ctx.manifest else ()
    wanted = dict.fromkeys([ctx.primary, *declared, "loss"])
    ok = _ok_runs(ctx)
    for metric in [m for m in wanted if m in curve_metrics]:
        out.append(_curves(ctx, store, metric, ok, band=band, n_boot=min(n_boot, 1000), seed=seed))
    boundary = _boundary(ctx, store)
    if boundary is not None:
        out.append(boundary)
    trials = q.tuning_trials(ctx.con, ctx.name)
    has_objective = bool(trials["objective"].notna().any())
    if has_objective:
        out.append(
            Panel("objective", compare_charts.objective_by_trial(store, trials, maximize=_maximize(ctx)))
        )
        params = [c for c in trials.columns if c.startswith("param_") and trials[c].notna().any()]
        if params:
            out.append(
                Panel(
                    "objective-params",
                    compare_charts.objective_by_param(store, trials, params),
                    wide=len(params) > 1,
                )
            )
    elif ctx.kind == "tune":
        ctx.notes.append("tuning study without objective values: no tuning charts")
    for h in ctx.histograms:
        values = e[(e["split"] == h.split) & (e["metric"] == h.metric)]
        chart = charts.histogram(
            store, values, h.split, h.metric, multi=ctx.multi, baseline=agg.baseline_for(h.split, h.metric)
        )  # fmt: skip
        out.append(Panel(f"histogram-{h.split}-{h.metric}", chart))
    for r in declared_regressions(ctx):
        if r.pairs.empty:
            ctx.notes.append(
                f"regression {axis_label(r.decl.y)} on {axis_label(r.decl.x)}: no finite pairs"
            )
            continue
        chart = charts.regression_chart(
            store,
            r.pairs,
            axis_label(r.decl.x),
            axis_label(r.decl.y),
            r.fits,
            r.decl.over,
            multi=ctx.multi,
            baseline=agg.baseline_for(r.decl.y.split, r.decl.y.metric),
        )
        out.append(Panel(f"regression-{r.decl.over}-{r.decl.y.split}-{r.decl.y.metric}", chart))
    for res in agg.results:
        for name, chart, wide in res.decl.panels(res, store, agg.baselines, multi=ctx.multi):
            out.append(Panel(name, chart, wide=wide))
    out += [Panel(n, c, wide=w) for n, c, w in question_panels(ctx, store, verdict)]
    return out


def to_spec(chart: Any, store: charts.ChartData) -> dict[str, Any]:
    """A chart as a validated Vega-Lite dict with its datasets embedded."""
    with charts.merging_selections():
        spec: dict[str, Any] = chart.to_dict()
    return store.embed(spec)


def _row(charts_in_row: list[Any]) -> Any:
    """Charts side by side, each with its own colour legend."""
    return alt.hconcat(*charts_in_row, spacing=40).resolve_scale(color="independent")


def page_spec(panels: list[Panel], store: charts.ChartData) -> dict[str, Any]:
    """Every chart in one view, so the seed selection links them all: narrow charts two
    to a row, wide ones alone."""
    rows: list[Any] = []
    pending: list[Any] = []
    with charts.merging_selections():
        for p in panels:
            if p.wide:
                if pending:
                    rows.append(_row(pending))
                    pending = []
                rows.append(p.chart)
            else:
                pending.append(p.chart)
                if len(pending) == 2:
                    rows.append(_row(pending))
                    pending = []
        if pending:
            rows.append(_row(pending))
        combined = alt.vconcat(*rows, spacing=40).resolve_scale(color="independent")
        combined = combined.configure_view(stroke=None).configure_title(anchor="start")
        return to_spec(combined, store)


@functools.cache
def check_target(target: Path, folder: bool = False) -> None:
    """Raise :class:`AnalysisError` unless ``target`` is a .html/.png/.svg/.pdf path or a folder
    (``folder``: named as one, e.g. ``charts.v2/``)."""
    suffix = target.suffix.lower()
    if not (folder or target.is_dir() or suffix in ("", ".html", ".htm", *IMAGE_SUFFIXES)):
        raise AnalysisError(
            f"cannot write a report to {target}: use a .html, .png, .svg or .pdf file or a directory"
        )


@dataclass(frozen=True)
class Report:
    """A built report: the header and the charts, ready to save in any format."""

    study: str
    header: str
    """The page header (HTML)."""
    panels: tuple[Panel, ...]
    store: charts.ChartData
    header_lines: tuple[str, ...] = ()
    """The header as text lines, drawn above the charts in PNG/SVG/PDF exports."""
    verdict: vd.Verdict | None = None

    def spec(self) -> dict[str, Any]:
        """Every chart in one Vega-Lite spec (see :func:`page_spec`)."""
        return page_spec(list(self.panels), self.store)

    def image_spec(self) -> dict[str, Any]:
        """:meth:`spec` with the header (metadata, verdict sentence, warnings) above it."""
        top = [Panel("header", charts.header_chart(self.header_lines), wide=True)]
        return page_spec(top + list(self.panels), self.store)

    def html(self) -> str:
        return render_html(self.study, self.header, self.spec())

    def save(self, to: Path, folder: bool = False) -> Path:
        """Write to ``to`` (format by suffix, as in :func:`write_report`; ``folder``: the
        header with the verdict, then one PNG per chart, inside it, whatever its suffix);
        returns ``to``."""
        import vl_convert as vlc

        to = Path(to)
        check_target(to, folder)
        suffix = to.suffix.lower()
        if folder or to.is_dir() or suffix == "":
            to.mkdir(parents=True, exist_ok=True)
            header = page_spec([Panel("header", charts.header_chart(self.header_lines), wide=True)], self.store)
            (to / "00-verdict.png").write_bytes(vlc.vegalite_to_png(header, vl_version=vl_version(), scale=1.5))
            for i, p in enumerate(self.panels, start=1):
                png = vlc.vegalite_to_png(
                    to_spec(p.chart, self.store), vl_version=vl_version(), scale=1.5
                )
                (to / f"{i:02d}-{p.name}.png").write_bytes(png)
            return to
        to.parent.mkdir(parents=True, exist_ok=True)
        if suffix == ".png":
            png = vlc.vegalite_to_png(self.image_spec(), vl_version=vl_version(), scale=1.5)
            to.write_bytes(png)
        elif suffix == ".svg":
            to.write_text(vlc.vegalite_to_svg(self.image_spec(), vl_version=vl_version()))
        elif suffix == ".pdf":
            to.write_bytes(vlc.vegalite_to_pdf(self.image_spec(), vl_version=vl_version()))
        else:
            to.write_text(self.html(), encoding="utf-8")
        return to


def build_report(
    out: Path,
    study: str,
    *,
    n_boot: int = 2000,
    seed: int = 0,
    quiet: bool = False,
    band: str = "ci",
    verdict_metric: str | None = None,
    verdict_splits: list[str] | None = None,
) -> Report:
    """Load ``study`` from ``out`` and build its verdict and charts (statistics included).

    ``band``: ``ci`` (95% bootstrap bands of means) or ``minmax`` (see :func:`build_charts`);
    ``verdict_metric`` / ``verdict_splits``: what the verdict speaks about
    (:func:`analysis.verdict.study_axis`).

    Raises :class:`AnalysisError` for an unknown study or one without committed evals.
    """
    with _progress(quiet, total=3) as step:
        step(f"loading study {study}")
        ctx = open_study(Path(out), study)
        try:
            if ctx.evals.empty:
                raise AnalysisError(
                    f"study {study!r} has no committed evals yet; wait for runs to finish "
                    "(see `study ls`) and retry"
                )
            axis = vd.study_axis(ctx, verdict_metric, verdict_splits)
            step("computing statistics and charts")
            verdict = vd.study_verdict(ctx, n_boot=n_boot, seed=seed, axis=axis)
            store = charts.ChartData()
            agg = study_aggregates(ctx)
            panels = build_charts(
                ctx, store, n_boot=n_boot, seed=seed, band=band, verdict=verdict, aggregates=agg
            )
            step("done")
            return Report(
                study,
                header_html(ctx, verdict, agg.results),
                tuple(panels),
                store,
                header_lines(ctx, verdict),
                verdict,
            )
        finally:
            ctx.close()


def write_report(
    out: Path,
    study: str,
    to: Path | None = None,
    *,
    n_boot: int = 2000,
    seed: int = 0,
    quiet: bool = False,
    band: str = "ci",
    verdict_metric: str | None = None,
    verdict_splits: list[str] | None = None,
    folder: bool = False,
) -> Path:
    """Write the report of ``study`` (results in ``out``) and return where it went.

    ``to``: ``None`` -> ``OUT/<study>/report.html``; a ``.html`` path -> that page; a
    ``.png``, ``.svg`` or ``.pdf`` path -> the header (metadata, verdict sentence,
    warnings) and every chart in one image or document (vl-convert); an existing
    directory, a path without suffix, or any path with ``folder`` (``study report --to
    DIR/``) -> the header (metadata, verdict sentence, warnings) as ``00-verdict.png``, then
    one PNG per chart inside it (``01-distribution.png``...). Bootstrap intervals use ``n_boot`` replicates from
    ``default_rng(seed)``; ``band``: ``ci`` (95% bootstrap bands of means, the default) or
    ``minmax``; ``verdict_metric`` / ``verdict_splits`` as for :func:`build_report`.
    Progress goes to stderr unless ``quiet``. Raises
    :class:`AnalysisError` for an unknown study, an unknown suffix, or a study without
    any committed evals.
    """
    target = Path(out) / study / "report.html" if to is None else Path(to)
    check_target(target, folder)
    report = build_report(out, study, n_boot=n_boot, seed=seed, quiet=quiet, band=band,
                          verdict_metric=verdict_metric, verdict_splits=verdict_splits)  # fmt: skip
    if not quiet:
        from rich.console import Console

        with Console(stderr=True).status(f"writing {target}"):
            return report.save(target, folder)
    return report.save(target, folder)
