"""Altair charts of a study: one function per chart, DataFrames in, charts out.

Every chart that draws runs draws one mark per seed, with a tooltip naming the seed and
the trial, and takes part in one shared selection, :func:`seed_selection` (click a run
to highlight that seed in every chart of the report; double-click to clear). When a
study has several grid points, marks are coloured by ``point``.

The DataFrames come from :mod:`analysis.queries`; column names are stated per function.
Learning curves are in :mod:`analysis.curve_charts`, charts that compare configs in
:mod:`analysis.compare_charts`, the seed questions' in :mod:`analysis.seed_charts`.

Every function takes a :class:`ChartData` that holds the rows; :meth:`ChartData.embed`
puts them into the finished spec, so charts have no row limit and need no server.
"""

from __future__ import annotations

import hashlib
import json
import textwrap
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import altair as alt
import numpy as np
import pandas as pd

from analysis.stats import Correlation, Regression

TopChart = alt.TopLevelMixin
"""Any Altair top-level chart (layer, concat...): what every function here returns."""

SELECTION = "seed_pick"
"""Name of the shared seed selection parameter."""

GOLDEN = 0.6180339887498949
CURVE_WIDTH = 300
"""Width in pixels of a learning-curve panel."""
PAGE_WIDTH = 840
"""The widest a chart's plot is drawn, in pixels: with its axis and legend it fits a laptop's 1280 px window."""


def wrapped(text: str, width_px: int, bold: bool = False) -> list[str]:
    """``text`` as title or subtitle lines that fit a chart ``width_px`` wide (Vega does not
    wrap titles: a task's long metric definition would widen its chart, and the page,
    instead). About 6 px a character in a subtitle, 7.5 in a (bold, larger) title."""
    return textwrap.wrap(text, max(40, int(width_px / (7.5 if bold else 6))))


def seed_selection() -> alt.Parameter:
    """The seed selection shared by every chart (same name, so Altair merges them)."""
    return alt.selection_point(fields=["seed"], name=SELECTION, on="click", clear="dblclick")


@contextmanager
def merging_selections() -> Iterator[None]:
    """Altair warns when it merges the shared seed selection of composed charts: expected."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*deduplicated selection parameter.*")
        yield


class ChartData:
    """The datasets of a set of charts, kept out of Altair and embedded by name.

    Charts refer to their data as ``alt.NamedData(name)``; :meth:`embed` adds the rows
    to a finished spec's top-level ``datasets``. This keeps Altair from validating and
    copying every row (seconds for a few tens of thousands of rows) and stores a
    dataset used by several charts once.
    """

    def __init__(self) -> None:
        self.values: dict[str, list[dict[str, Any]]] = {}

    def add(self, df: pd.DataFrame) -> alt.NamedData:
        """Keep ``df``'s rows (numbers to 12 significant digits) and name them."""
        text = df.to_json(orient="records", date_format="iso", double_precision=12)
        key = "d" + hashlib.sha1(text.encode()).hexdigest()[:16]
        if key not in self.values:
            self.values[key] = json.loads(text)
        return alt.NamedData(name=key)

    def embed(self, spec: dict[str, Any]) -> dict[str, Any]:
        """``spec`` with the datasets it refers to added under ``datasets``."""
        names: set[str] = set()

        def walk(node: Any) -> None:
            if isinstance(node, dict):
                data = node.get("data")
                if isinstance(data, dict) and isinstance(data.get("name"), str):
                    names.add(data["name"])
                for v in node.values():
                    walk(v)
            elif isinstance(node, list):
                for v in node:
                    walk(v)

        walk(spec)
        datasets = dict(spec.get("datasets", {}))
        datasets |= {k: self.values[k] for k in sorted(names) if k in self.values}
        return {**spec, "datasets": datasets}


def _fmt(v: float, digits: int = 3) -> str:
    return "nan" if v is None or not np.isfinite(v) else f"{v:.{digits}g}"


def _run_encodings(sel: alt.Parameter, multi: bool) -> dict[str, Any]:
    """Colour, opacity and size channels shared by per-run marks."""
    enc: dict[str, Any] = {
        "opacity": alt.when(sel).then(alt.value(0.9)).otherwise(alt.value(0.2)),
        "size": alt.when(sel, empty=False).then(alt.value(160)).otherwise(alt.value(45)),
        "stroke": alt.when(sel, empty=False).then(alt.value("black")).otherwise(alt.value(None)),
    }
    if multi:
        enc["color"] = alt.Color("point:N", title="grid point")
    return enc


def run_tooltip(*extra: alt.Tooltip | str) -> list[Any]:
    return [
        alt.Tooltip("seed:O", title="seed"),
        alt.Tooltip("trial_id:N", title="config (trial_id)"),
        alt.Tooltip("point:N", title="point"),
        *extra,
    ]


def split_distribution(
    store: ChartData,
    values: pd.DataFrame,
    metric: str,
    splits: Sequence[str],
    *,
    multi: bool,
    intervals: pd.DataFrame | None = None,
    show_range: bool = False,
    definition: str | None = None,
) -> TopChart:
    """Per-split distribution of ``metric`` across seeds: one dot per seed, the mean with
    its 95% bootstrap interval (black tick and bar), and optionally a min-max box.

    ``values``: one row per (trial, seed, split) with columns trial_id, point, seed, split,
    role, value. ``intervals``: one row per (point, split) with columns point, split, n,
    mean, low, high, warn (:func:`analysis.bands.split_intervals`). ``splits``: x-axis
    order. Grid points sit side by side within a split. ``definition``: the metric's
    definition, shown under the title.
    """
    sel = seed_selection()
    df = values[["trial_id", "point", "seed", "split", "role", "value"]].copy()
    df["jitter"] = (df["seed"].to_numpy() * GOLDEN) % 1.0
    base = alt.Chart(store.add(df))
    x = alt.X("split:N", sort=list(splits), title=None, axis=alt.Axis(labelAngle=-30))
    y = alt.Y("value:Q", title=metric, scale=alt.Scale(zero=False))
    box_enc: dict[str, Any] = {"x": x, "y": y}
    dot_enc: dict[str, Any] = {"x": x, "y": y}
    if multi:
        box_enc |= {"xOffset": "point:N", "color": alt.Color("point:N", title="grid point")}
        dot_enc["xOffset"] = "point:N"
    else:
        dot_enc["xOffset"] = alt.XOffset("jitter:Q", scale=alt.Scale(domain=[-0.6, 1.6]))
    layers: list[Any] = []
    if show_range:
        layers.append(base.mark_boxplot(extent="min-max", opacity=0.25, size=22).encode(**box_enc))
    dots = (
        base.mark_circle()
        .encode(
            **dot_enc,
            **_run_encodings(sel, multi),
            tooltip=run_tooltip("split:N", "role:N", alt.Tooltip("value:Q", format=".4g")),
        )
        .add_params(sel)
    )
    layers.append(dots)
    if intervals is not None and not intervals.empty:
        ci = intervals[["point", "split", "n", "mean", "low", "high", "warn"]]
        ci_enc: dict[str, Any] = {"x": x}
        if multi:
            ci_enc["xOffset"] = "point:N"
        tip = [alt.Tooltip("point:N"), "split:N", alt.Tooltip("mean:Q", format=".4g"),
               alt.Tooltip("low:Q", format=".4g", title="95% low"),
               alt.Tooltip("high:Q", format=".4g", title="95% high"),
               alt.Tooltip("n:Q", title="runs"), alt.Tooltip("warn:N")]  # fmt: skip
        cbase = alt.Chart(store.add(ci)).encode(**ci_enc)
        layers.append(
            cbase.mark_rule(color="black", strokeWidth=2).encode(
                y="low:Q", y2="high:Q", tooltip=tip
            )
        )
        layers.append(
            cbase.mark_tick(color="black", thickness=2, size=16).encode(y="mean:Q", tooltip=tip)
        )
    # 70 px a split (and grid point) up to a page's width: a length-generalization study's
    # 20 lengths x 2 configs would otherwise draw a chart 3,400 px wide
    width = min(PAGE_WIDTH, max(220, 70 * len(splits) * (df["point"].nunique() if multi else 1)))
    subtitle = [
        "black: mean with 95% bootstrap interval" + ("; box: min-max" if show_range else "")
    ]
    if intervals is not None and (intervals["warn"] != "").any():
        subtitle.append("fewer than 10 seeds behind some means (n<10): indicative only")
    if definition:
        subtitle += wrapped(f"{metric}: {definition}", width)
    title = alt.TitleParams(
        f"{metric} per split across seeds (one dot per seed)", subtitle=subtitle
    )
    return alt.layer(*layers).properties(width=width, height=260, title=title)


def _line(df: pd.DataFrame, fits: dict[str, Regression]) -> pd.DataFrame:
    """Endpoints of each fitted line over its points' x range: columns point, x, y.

    A fit whose label is not a grid point (pooled runs) spans every row.
    """
    rows = []
    points = set(df["point"])
    for point, fit in fits.items():
        sub = (df[df["point"] == point] if point in points else df)["x"].dropna()
        if sub.empty or not np.isfinite(fit.slope):
            continue
        for xv in (float(sub.min()), float(sub.max())):
            rows.append({"point": point, "x": xv, "y": fit.slope * xv + fit.intercept})
    return pd.DataFrame(rows, columns=["point", "x", "y"])


def _scatter_with_fit(
    store: ChartData,
    pairs: pd.DataFrame,
    fits: dict[str, Regression],
    x_title: str,
    y_title: str,
    title: str | alt.TitleParams,
    *,
    multi: bool,
    extra_tooltip: Sequence[str] = (),
    baseline: pd.DataFrame | None = None,
) -> TopChart:
    sel = seed_selection()
    cols = ["trial_id", "point", "seed", "x", "y", *extra_tooltip]
    dots = (
        alt.Chart(store.add(pairs[cols]))
        .mark_circle()
        .encode(
            x=alt.X("x:Q", title=x_title, scale=alt.Scale(zero=False)),
            y=alt.Y("y:Q", title=y_title, scale=alt.Scale(zero=False)),
            **_run_encodings(sel, multi),
            tooltip=run_tooltip(
                *(f"{c}:Q" for c in extra_tooltip),
                alt.Tooltip("x:Q", title=x_title, format=".4g"),
                alt.Tooltip("y:Q", title=y_title, format=".4g"),
            ),
        )
        .add_params(sel)
    )
    line_df = _line(pairs, fits)
    layers: list[alt.Chart] = []
    if not line_df.empty:
        line_enc: dict[str, Any] = {"x": "x:Q", "y": "y:Q", "detail": "point:N"}
        if multi and set(line_df["point"]) <= set(pairs["point"]):
            line_enc["color"] = alt.Color("point:N", title="grid point")
        line = alt.Chart(store.add(line_df)).mark_line(strokeDash=[6, 3], color="#555")
        layers.append(line.encode(**line_enc))
    layers += baseline_rules(store, baseline, "y")
    return alt.layer(*layers, dots).properties(width=320, height=280, title=title)


BASELINE_COLOR = "#c0392b"


def baseline_rules(store: ChartData, baseline: pd.DataFrame | None, channel: str) -> list[Any]:
    """A labelled dashed rule at each distinct baseline value, across ``channel`` (``x``:
    a vertical rule at an x value; ``y``: a horizontal one). ``baseline``: rows with
    columns point, value, label (:func:`analysis.aggregates.baseline_for`); none or
    empty: no layers. Points sharing a value share one rule (its tooltip names them)."""
    if baseline is None or baseline.empty:
        return []
    df = (
        baseline.dropna(subset=["value"])
        .groupby(["value", "label"], as_index=False, sort=True)
        .agg(points=("point", lambda p: ", ".join(map(str, p))))
    )
    df["text"] = [f"{lab}: {_fmt(v, 4)}" for v, lab in zip(df["value"], df["label"], strict=True)]
    base = alt.Chart(store.add(df))
    enc = {channel: alt.X("value:Q") if channel == "x" else alt.Y("value:Q")}
    tip = [alt.Tooltip("label:N", title="baseline"), alt.Tooltip("value:Q", format=".4g"),
           alt.Tooltip("points:N", title="grid points")]  # fmt: skip
    rule = base.mark_rule(color=BASELINE_COLOR, strokeDash=[4, 3], strokeWidth=2).encode(**enc, tooltip=tip)
    if channel == "x":
        text = base.mark_text(color=BASELINE_COLOR, align="left", baseline="top", dx=3, y=2, fontSize=10)
    else:
        text = base.mark_text(color=BASELINE_COLOR, align="left", baseline="bottom", x=2, dy=-2, fontSize=10)
    return [rule, text.encode(**enc, text="text:N")]


def subset_strip(
    store: ChartData,
    values: pd.DataFrame,
    title: str,
    subset: str,
    *,
    baseline: pd.DataFrame | None = None,
) -> TopChart:
    """One metric per grid point over runs: the kept runs of a subset filled, the others
    hollow, with the declared baseline as a labelled rule.

    ``values``: one row per run, columns trial_id, point, seed, value, kept (bool).
    ``subset``: what was kept (e.g. ``best 10 by lowest val loss``).
    """
    sel = seed_selection()
    df = values[["trial_id", "point", "seed", "value", "kept"]].copy()
    df["runs"] = np.where(df["kept"], "kept", "other")
    df["jitter"] = (df["seed"].to_numpy() * GOLDEN) % 1.0
    enc = _run_encodings(sel, False)
    enc.pop("size")
    dots = (
        alt.Chart(store.add(df))
        .mark_point(size=60, filled=True)
        .encode(
            x=alt.X("point:N", title=None, axis=alt.Axis(labelAngle=-30)),
            xOffset=alt.XOffset("jitter:Q", scale=alt.Scale(domain=[-0.6, 1.6])),
            y=alt.Y("value:Q", title=title, scale=alt.Scale(zero=False)),
            shape=alt.Shape("runs:N", title=subset, scale=alt.Scale(domain=["kept", "other"],
                                                                    range=["circle", "triangle"])),
            color=alt.Color("runs:N", title=subset, scale=alt.Scale(domain=["kept", "other"],
                                                                    range=["#1f77b4", "#bbbbbb"])),
            **enc,
            tooltip=run_tooltip("runs:N", alt.Tooltip("value:Q", format=".4g")),
        )
        .add_params(sel)
    )
    width = max(220, 90 * df["point"].nunique())
    head = alt.TitleParams(f"{title}: {subset} per grid point", subtitle=["one mark per run"])
    return alt.layer(dots, *baseline_rules(store, baseline, "y")).properties(
        width=width, height=260, title=head
    )


def seed_scatter(
    store: ChartData,
    pairs: pd.DataFrame,
    x_label: str,
    y_label: str,
    fits: dict[str, Regression],
    corrs: dict[str, Correlation],
    *,
    multi: bool,
) -> TopChart:
    """Seed scatter between two splits with a fitted line per grid point.

    ``pairs``: one row per run, columns trial_id, point, seed, x, y. ``fits`` and
    ``corrs``: per point label, the least-squares line and Pearson r with its bootstrap
    interval, shown in the title.
    """
    parts = [
        (f"{p}: " if multi else "")
        + (
            f"r = {_fmt(c.r)} [{_fmt(c.low)}, {_fmt(c.high)}] (n={c.n})"
            if c.r is not None and np.isfinite(c.r)
            else f"r undefined: too few seeds, or a split without variation (n={c.n})"
        )
        for p, c in corrs.items()
    ]
    title = alt.TitleParams(
        f"{y_label} vs {x_label} across seeds",
        subtitle=[*parts, f"{int(100 * next(iter(corrs.values())).level)}% bootstrap CI"]
        if corrs
        else [],
    )
    return _scatter_with_fit(store, pairs, fits, x_label, y_label, title, multi=multi)


def histogram(
    store: ChartData,
    values: pd.DataFrame,
    split: str,
    metric: str,
    *,
    multi: bool,
    bins: int = 20,
    baseline: pd.DataFrame | None = None,
) -> TopChart:
    """Histogram of ``metric`` on ``split`` over runs, above a strip of one tick per seed.

    ``values``: one row per run, columns trial_id, point, seed, value. ``baseline``:
    see :func:`baseline_rules` (a labelled rule at each value, inside the axis range).
    """
    sel = seed_selection()
    df = values[["trial_id", "point", "seed", "value"]]
    data = store.add(df)
    # the edges from the values as the chart stores them (12 digits): an edge at the exact
    # minimum lay above its rounded value (200/481 = 0.41580041580041...), and Vega's bin
    # sends a value below the first edge to -Infinity, so the lowest run's bar was not drawn
    stored = [float(r["value"]) for r in store.values[str(data.name)] if r.get("value") is not None]
    lo, hi = (min(stored), max(stored)) if stored else (0.0, 0.0)
    if baseline is not None and not baseline.empty:
        lo, hi = min(lo, float(baseline["value"].min())), max(hi, float(baseline["value"].max()))
    if not hi > lo:
        lo, hi = lo - 0.5, hi + 0.5
    # Bins of exactly (hi - lo) / bins from lo, the scale one bin past hi (bins are half-open,
    # so the largest value has one of its own): Vega's rounded edges ran past a fixed scale
    # and drew bars over the axis.
    step = (hi - lo) / bins
    scale = alt.Scale(domain=[lo, hi + step], zero=False, nice=False)
    binning = alt.Bin(extent=[lo, hi + step], step=step, nice=False)
    x = alt.X("value:Q", bin=binning, scale=scale, title=f"{split} {metric}",
              axis=alt.Axis(format=".3~g", labelOverlap="greedy"))
    bar_enc: dict[str, Any] = {"x": x, "y": alt.Y("count():Q", title="runs", axis=alt.Axis(tickMinStep=1))}
    if multi:
        bar_enc["color"] = alt.Color("point:N", title="grid point")
    bars = alt.Chart(data).mark_bar(opacity=0.8).encode(**bar_enc)
    strip_enc = _run_encodings(sel, multi)
    strip_enc.pop("size")
    strip = (
        alt.Chart(data)
        .mark_tick(thickness=2, size=14)
        .encode(
            x=alt.X("value:Q", scale=scale, title=f"{split} {metric} (one tick per seed)"),
            **strip_enc,
            tooltip=run_tooltip(alt.Tooltip("value:Q", format=".4g")),
        )
        .add_params(sel)
    )
    rules = baseline_rules(store, baseline, "x")
    with merging_selections():
        return alt.vconcat(
            alt.layer(bars, *rules).properties(width=320, height=180, title=f"Histogram of {split} {metric}"),
            alt.layer(strip, *rules[:1]).properties(width=320, height=24),
        )


def regression_chart(
    store: ChartData,
    pairs: pd.DataFrame,
    x_label: str,
    y_label: str,
    fits: dict[str, Regression],
    over: str,
    *,
    multi: bool,
    baseline: pd.DataFrame | None = None,
) -> TopChart:
    """Declared regression: one dot per run (or per checkpoint) and the fitted line.

    ``pairs``: columns trial_id, point, seed, x, y (already transformed), plus ``step``
    when ``over == "checkpoints"``. The title gives slope, R^2, p and n per point.
    ``baseline``: a labelled rule at y's baseline (see :func:`baseline_rules`).
    """
    parts = [
        (f"{p}: " if multi else "")
        + f"slope = {_fmt(f.slope)}, R² = {_fmt(f.r2)}, p = {_fmt(f.p, 2)}, n = {f.n}"
        for p, f in fits.items()
    ]
    title = alt.TitleParams(f"{y_label} on {x_label} (over {over})", subtitle=parts)
    extra = ("step",) if over == "checkpoints" and "step" in pairs.columns else ()
    return _scatter_with_fit(
        store, pairs, fits, x_label, y_label, title, multi=multi, extra_tooltip=extra,
        baseline=baseline,
    )  # fmt: skip


def decision_boundary(
    store: ChartData,
    cells: pd.DataFrame,
    segments: pd.DataFrame,
    *,
    extent: tuple[float, float],
    axes: tuple[str, str] = ("x1", "x2"),
    metric: str = "p_y1",
    split: str = "grid",
    level: float = 0.5,
    multi: bool,
    columns: int = 6,
) -> TopChart:
    """A 2-D decision surface per seed: a heatmap with the ``level`` contour on top.

    ``cells``: one row per (run, grid point), columns trial_id, point, seed, x1, x2, p,
    half (the cell spans ``x1 +- half``, ``x2 +- half``). ``segments``: the contour, one
    row per line segment, columns trial_id, point, seed, x1, x2, x1_end, x2_end (see
    :mod:`analysis.boundary`). One panel per seed (wrapped into rows of ``columns``);
    with several grid points (``multi``) one row of panels per point. The diverging
    colour scale is centred at ``level`` (white there), so the boundary shows even
    without the black contour line; the seed selection dims the other seeds' panels.
    """
    sel = seed_selection()
    c = cells[["point", "seed", "x1", "x2", "p", "half"]].assign(kind="cell")
    s = segments[["point", "seed", "x1", "x2", "x1_end", "x2_end"]]
    df = pd.concat([c, s.assign(kind="contour")], ignore_index=True)
    scale = alt.Scale(domain=list(extent), nice=False, zero=False)
    x_title, y_title = axes
    base = alt.Chart(store.add(df))
    colours = alt.Scale(scheme="redblue", domain=[0, 1], domainMid=level)
    heat = (
        base.transform_filter(alt.datum.kind == "cell")
        .transform_calculate(
            x_lo=alt.datum.x1 - alt.datum.half,
            x_hi=alt.datum.x1 + alt.datum.half,
            y_lo=alt.datum.x2 - alt.datum.half,
            y_hi=alt.datum.x2 + alt.datum.half,
            # the screen-reader label (else built from the encodings: cell edges as "x1")
            desc=f"'seed: ' + datum.seed + '; point: ' + datum.point + '; {x_title}: ' + "
            f"format(datum.x1, '.3g') + '; {y_title}: ' + format(datum.x2, '.3g') + "
            f"'; {metric}: ' + format(datum.p, '.3f')",
        )
        .mark_rect(strokeWidth=0.6)  # stroked in its own colour: no seams between cells
        .encode(
            x=alt.X("x_lo:Q", scale=scale, title=x_title),
            x2="x_hi:Q",
            y=alt.Y("y_lo:Q", scale=scale, title=y_title),
            y2="y_hi:Q",
            color=alt.Color("p:Q", title=metric, scale=colours),
            stroke=alt.Stroke("p:Q", scale=colours, legend=None),
            opacity=alt.when(sel).then(alt.value(1.0)).otherwise(alt.value(0.25)),
            description="desc:N",
            tooltip=[
                alt.Tooltip("seed:O", title="seed"),
                alt.Tooltip("point:N", title="point"),
                alt.Tooltip("x1:Q", title=x_title, format=".3g"),
                alt.Tooltip("x2:Q", title=y_title, format=".3g"),
                alt.Tooltip("p:Q", title=metric, format=".3f"),
            ],
        )
        .add_params(sel)
    )
    contour = (
        base.transform_filter(alt.datum.kind == "contour")
        .mark_rule(color="black", strokeWidth=1.5)
        .encode(x="x1:Q", y="x2:Q", x2="x1_end:Q", y2="x2_end:Q")
    )
    layered = alt.layer(heat, contour).properties(width=150, height=150)
    title = alt.TitleParams(
        f"Decision boundary per seed: {metric} over ({x_title}, {y_title}) on split {split}",
        subtitle=[f"black line: {metric} = {level:g}; red below, blue above"],
    )
    if multi:
        chart = layered.facet(
            row=alt.Row("point:N", title="grid point"),
            column=alt.Column("seed:O", title="seed"),
        )
    else:
        n_seeds = int(cells["seed"].nunique())
        chart = layered.facet(
            facet=alt.Facet("seed:O", title="seed"), columns=max(1, min(columns, n_seeds))
        )
    return chart.properties(title=title)


HEADER_CHARS = 150
"""Characters per line of an exported header (12 px text); longer lines wrap, never cut."""


def header_chart(lines: Sequence[str], *, width: int = 700) -> TopChart:
    """The report's header as text marks, placed above the charts in PNG/SVG/PDF exports.
    Each line wraps at :data:`HEADER_CHARS` (continuations indented): a verdict sentence
    was cut at the mark's width limit, losing its caveats."""
    import textwrap

    wrapped = [part for line in lines for part in textwrap.wrap(line, HEADER_CHARS, subsequent_indent="    ") or [""]]
    df = pd.DataFrame({"i": range(len(wrapped)), "text": wrapped})
    return (
        alt.Chart(alt.InlineData(values=df.to_dict(orient="records")))
        .mark_text(align="left", baseline="top", fontSize=12)
        .encode(
            x=alt.value(0),
            y=alt.Y("i:O", axis=None),
            text="text:N",
        )
        .properties(width=width, height=16 * len(wrapped))
    )
