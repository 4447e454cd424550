"""``study report``: one self-contained HTML page of a study's charts (or PNG/SVG files).

The page inlines the Vega, Vega-Lite and vega-embed JavaScript that vl-convert-python
ships (no CDN is needed or contacted), a short header (study, task, model, config,
seeds, git SHA, dates) and one Vega-Lite view holding every chart, so a seed clicked in
one chart is highlighted in all of them.

Charts: per-split distribution of the primary metric across seeds; the seed scatter
between two test splits (declared, else the first two) with fitted line and Pearson r
with its bootstrap interval; learning curves (mean and min-max band over seeds) of the
primary metric and the loss, with one band per grid point in a panel per split when the
study has several points; the decision surface per seed of a task that declares
``decision_boundary`` (heatmap with its 0.5 contour); for tuning studies the objective by trial and against each
``param_*``; the task's declared histograms and regressions.

:func:`write_report` is the one-call entry point; :func:`build_report` returns a
:class:`Report` that can be saved in several formats without recomputing it.
"""

from __future__ import annotations

import functools
import html
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import altair as alt

from analysis import charts
from analysis import queries as q
from analysis.analyze import analyze, declared_regressions, scatter_data
from analysis.boundary import boundary_data, point_grids
from analysis.context import StudyContext, axis_label, open_study
from analysis.db import list_studies
from analysis.errors import AnalysisError

__all__ = ["Panel", "Report", "analyze", "build_report", "write_report"]
"""``analyze`` lives in :mod:`analysis.analyze`; it is re-exported here for the CLI."""

MAX_SEED_CURVE_ROWS = 30_000
"""Per-seed curve lines are embedded (for the seed highlight) up to this many rows."""

MAX_CURVE_POINTS = 6
"""Learning curves get one band per grid point up to this many points; beyond, pooled."""

MAX_BOUNDARY_SEEDS = 12
"""Decision-boundary panels drawn per grid point (the lowest seed indices)."""

IMAGE_SUFFIXES = (".png", ".svg")


@contextmanager
def _progress(quiet: bool, total: int) -> Iterator[Any]:
    """A rich progress bar on stderr; yields ``step(description)``."""
    if quiet:
        yield lambda _msg: None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
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


def _curves(ctx: StudyContext, store: charts.ChartData, metric: str) -> Panel:
    per_seed = q.curve_values(ctx.con, ctx.name, metric, labels=ctx.labels)
    if per_seed["point"].nunique() > MAX_CURVE_POINTS:
        ctx.notes.append(
            f"{metric} curves: {per_seed['point'].nunique()} grid points pooled into one band "
            f"(more than {MAX_CURVE_POINTS})"
        )
        per_seed["point"] = "all trials"
    agg = (
        per_seed.groupby(["point", "split", "step"], sort=False)["value"]
        .agg(["mean", "min", "max", "count"])
        .reset_index()
        .sort_values(["point", "split", "step"], kind="stable")
    )
    if len(per_seed) > MAX_SEED_CURVE_ROWS:
        ctx.notes.append(f"{metric} curves: per-seed lines left out ({len(per_seed)} rows)")
        chart = charts.learning_curves(store, agg, None, metric, ctx.splits)
    else:
        chart = charts.learning_curves(store, agg, per_seed, metric, ctx.splits)
    return Panel(f"curves-{metric}", chart, wide=agg["point"].nunique() > 1)


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
    """Tuning direction from the manifest (``objective.direction``, ``direction``, or the
    config's ``tune.direction``/``tune.mode``), default maximize."""
    m = ctx.manifest
    if m is None:
        return True
    found = m.config.get("tune")
    tune: dict[str, Any] = found if isinstance(found, dict) else {}
    objective = m.raw.get("objective")
    for value in (
        objective.get("direction") if isinstance(objective, dict) else None,
        m.raw.get("direction"),
        m.raw.get("mode"),
        tune.get("direction"),
        tune.get("mode"),
    ):
        if isinstance(value, str):
            return not value.lower().startswith("min")
    return True


def build_charts(
    ctx: StudyContext, store: charts.ChartData, *, n_boot: int = 2000, seed: int = 0
) -> list[Panel]:
    """The study's charts, in page order (see the module docstring); rows go to ``store``."""
    out: list[Panel] = []
    e = ctx.evals
    if ctx.primary is not None:
        shown = [s for s in ctx.splits if ctx.roles.get(s) != "train"] or ctx.splits
        values = e[(e["metric"] == ctx.primary) & e["split"].isin(shown)]
        chart = charts.split_distribution(store, values, ctx.primary, shown, multi=ctx.multi)
        n_points = values["point"].nunique()
        out.append(Panel("distribution", chart, wide=len(shown) * n_points > 6))
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
    for metric in [m for m in wanted if m in curve_metrics]:
        out.append(_curves(ctx, store, metric))
    boundary = _boundary(ctx, store)
    if boundary is not None:
        out.append(boundary)
    trials = q.tuning_trials(ctx.con, ctx.name)
    has_objective = bool(trials["objective"].notna().any())
    if has_objective:
        out.append(
            Panel("objective", charts.objective_by_trial(store, trials, maximize=_maximize(ctx)))
        )
        params = [c for c in trials.columns if c.startswith("param_") and trials[c].notna().any()]
        if params:
            out.append(
                Panel(
                    "objective-params",
                    charts.objective_by_param(store, trials, params),
                    wide=len(params) > 1,
                )
            )
    elif ctx.kind == "tune":
        ctx.notes.append("tuning study without objective values: no tuning charts")
    for h in ctx.histograms:
        values = e[(e["split"] == h.split) & (e["metric"] == h.metric)]
        chart = charts.histogram(store, values, h.split, h.metric, multi=ctx.multi)
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
        )
        out.append(Panel(f"regression-{r.decl.over}-{r.decl.y.split}-{r.decl.y.metric}", chart))
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
def _js_bundle() -> str:
    """vega + vega-lite + vega-embed, bundled by vl-convert (about 0.9 MB, built once)."""
    import vl_convert as vlc

    # The stub marks ``snippet`` required; omitted, it defaults to exposing vegaEmbed.
    return str(vlc.javascript_bundle(vl_version=_vl_version()))  # type: ignore[call-arg]


def _vl_version() -> str:
    from altair.utils._importers import vl_version_for_vl_convert

    return str(vl_version_for_vl_convert())


def _script_json(obj: Any) -> str:
    """JSON safe to place inside a <script> element."""
    return json.dumps(obj).replace("</", "<\\/").replace("<!--", "<\\!--")


def _header(ctx: StudyContext) -> str:
    m = ctx.manifest
    info = next(iter(list_studies(ctx.out, only=[ctx.name])), None)
    rows: list[tuple[str, str]] = [("study", ctx.name), ("kind", ctx.kind)]
    rows += [("task", (m and m.task) or (info and info.task) or "?")]
    rows += [("model", (m and m.model) or (info and info.model) or "?")]
    if info:
        planned = "?" if info.planned is None else str(info.planned)
        rows.append(
            (
                "runs",
                f"{info.done} done of {planned} planned: {info.ok} ok, "
                f"{info.failed} failed, {info.diverged} diverged",
            )
        )
    if m and m.seeds is not None:
        rows.append(("seeds per point", str(m.seeds)))
    points = sorted(set(ctx.evals["point"])) if not ctx.evals.empty else []
    if len(points) > 1:
        rows.append(("grid points", "; ".join(points)))
    rows.append(("primary metric", ctx.primary or "-"))
    rows += [("git sha", (m and m.git_sha) or "?"), ("created", (m and m.created_at) or "?")]
    if m and m.tuned_from:
        rows.append(("tuned from", json.dumps(m.tuned_from)))
    rows.append(("report written", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")))
    cells = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows
    )
    config = html.escape(json.dumps(m.config if m else {}, indent=2, sort_keys=True))
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in ctx.notes)
    return (
        f"<h1>fineline study report: {html.escape(ctx.name)}</h1>"
        f"<table class='meta'>{cells}</table>"
        f"<details><summary>resolved config</summary><pre>{config}</pre></details>"
        + (f"<p>Notes:</p><ul class='notes'>{notes}</ul>" if notes else "")
        + "<p class='hint'>Hover a dot for its seed and trial; click a dot to highlight that "
        "seed in every chart, double-click to clear.</p>"
    )


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 12px; }
table.meta { border-collapse: collapse; font-size: 13px; margin-bottom: 8px; }
table.meta th { text-align: left; padding: 2px 12px 2px 0; color: #555; font-weight: 600; }
table.meta td { padding: 2px 0; }
details pre { font-size: 12px; background: #f6f6f6; padding: 8px; max-height: 320px; overflow: auto; }
.hint, .notes { font-size: 13px; color: #555; }
"""


def render_html(title: str, header: str, spec: dict[str, Any]) -> str:
    """The self-contained page: inlined JS bundle, header HTML, and the embedded spec."""
    bundle = _js_bundle()
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>fineline report: {html.escape(title)}</title>
<style>{_STYLE}</style>
<script type="text/javascript">
{bundle}
</script>
</head>
<body>
<header>{header}</header>
<div id="charts"></div>
<script type="text/javascript">
const spec = {_script_json(spec)};
window.fineline = {{ ready: false, error: null, view: null }};
vegaEmbed("#charts", spec, {{ renderer: "svg", actions: {{ export: true, source: false, compiled: false, editor: false }} }})
  .then(function (result) {{ window.fineline.view = result.view; window.fineline.ready = true; }})
  .catch(function (err) {{
    window.fineline.error = String(err); window.fineline.ready = true;
    console.error(err);
    document.getElementById("charts").textContent = "Could not draw the charts: " + err;
  }});
</script>
</body>
</html>
"""


def check_target(target: Path) -> None:
    """Raise :class:`AnalysisError` unless ``target`` is a .html/.png/.svg path or a folder."""
    suffix = target.suffix.lower()
    if not (target.is_dir() or suffix in ("", ".html", ".htm", *IMAGE_SUFFIXES)):
        raise AnalysisError(
            f"cannot write a report to {target}: use a .html, .png or .svg file or a directory"
        )


@dataclass(frozen=True)
class Report:
    """A built report: the header and the charts, ready to save in any format."""

    study: str
    header: str
    """The page header (HTML)."""
    panels: tuple[Panel, ...]
    store: charts.ChartData

    def spec(self) -> dict[str, Any]:
        """Every chart in one Vega-Lite spec (see :func:`page_spec`)."""
        return page_spec(list(self.panels), self.store)

    def html(self) -> str:
        return render_html(self.study, self.header, self.spec())

    def save(self, to: Path) -> Path:
        """Write to ``to`` (format by suffix, as in :func:`write_report`); returns ``to``."""
        import vl_convert as vlc

        to = Path(to)
        check_target(to)
        suffix = to.suffix.lower()
        if to.is_dir() or suffix == "":
            to.mkdir(parents=True, exist_ok=True)
            for i, p in enumerate(self.panels):
                png = vlc.vegalite_to_png(
                    to_spec(p.chart, self.store), vl_version=_vl_version(), scale=1.5
                )
                (to / f"{i:02d}-{p.name}.png").write_bytes(png)
            return to
        to.parent.mkdir(parents=True, exist_ok=True)
        if suffix == ".png":
            to.write_bytes(vlc.vegalite_to_png(self.spec(), vl_version=_vl_version(), scale=1.5))
        elif suffix == ".svg":
            to.write_text(vlc.vegalite_to_svg(self.spec(), vl_version=_vl_version()))
        else:
            to.write_text(self.html(), encoding="utf-8")
        return to


def build_report(
    out: Path, study: str, *, n_boot: int = 2000, seed: int = 0, quiet: bool = False
) -> Report:
    """Load ``study`` from ``out`` and build its charts (statistics included).

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
            step("computing statistics and charts")
            store = charts.ChartData()
            panels = build_charts(ctx, store, n_boot=n_boot, seed=seed)
            step("done")
            return Report(study, _header(ctx), tuple(panels), store)
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
) -> Path:
    """Write the report of ``study`` (results in ``out``) and return where it went.

    ``to``: ``None`` -> ``OUT/<study>/report.html``; a ``.html`` path -> that page; a
    ``.png`` or ``.svg`` path -> every chart in one image (vl-convert); an existing
    directory or a path without suffix -> one PNG per chart inside it
    (``00-distribution.png``...). Bootstrap intervals use ``n_boot`` replicates from
    ``default_rng(seed)``. Progress goes to stderr unless ``quiet``. Raises
    :class:`AnalysisError` for an unknown study, an unknown suffix, or a study without
    any committed evals.
    """
    target = Path(out) / study / "report.html" if to is None else Path(to)
    check_target(target)
    report = build_report(out, study, n_boot=n_boot, seed=seed, quiet=quiet)
    if not quiet:
        from rich.console import Console

        with Console(stderr=True).status(f"writing {target}"):
            return report.save(target)
    return report.save(target)
