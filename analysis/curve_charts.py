"""Learning curves: the mean of a metric over a fixed set of seeds with a band, per split
and grid point, and each seed's own curve on selection (:func:`learning_curves`).

Part of the report's charts (:mod:`analysis.charts`: :class:`~analysis.charts.ChartData`,
the shared seed selection)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import altair as alt
import numpy as np
import pandas as pd

from analysis.charts import (
    CURVE_WIDTH,
    ChartData,
    TopChart,
    merging_selections,
    run_tooltip,
    seed_selection,
    wrapped,
)


def _curve_panel(
    store: ChartData,
    agg: pd.DataFrame,
    per_seed: pd.DataFrame | None,
    metric: str,
    color: alt.Color,
    title: str | alt.TitleParams,
    unit: str = "step",
) -> TopChart:
    """Bands (``low``-``high``), mean lines and selectable per-seed lines of one curve panel."""
    cols = [c for c in ("point", "split", "step", "mean", "low", "high", "count") if c in agg]
    # steps and epochs are whole numbers: no 1.5-epoch ticks
    x = alt.X("step:Q", title=unit, axis=alt.Axis(tickMinStep=1, format=",d"))
    base = alt.Chart(store.add(agg[cols])).encode(x=x, color=color)
    band = base.mark_area(opacity=0.18).encode(y=alt.Y("low:Q", title=metric), y2="high:Q")
    tooltip: list[Any] = [
        alt.Tooltip("point:N", title="point"),
        "split:N",
        alt.Tooltip("step:Q", title=unit),
        alt.Tooltip("mean:Q", format=".4g"),
        alt.Tooltip("low:Q", format=".4g", title="band low"),
        alt.Tooltip("high:Q", format=".4g", title="band high"),
    ]
    if "count" in agg:
        tooltip.append(alt.Tooltip("count:Q", title="seeds"))
    line = base.mark_line().encode(y="mean:Q", detail="point:N", tooltip=tooltip)
    layers: list[alt.Chart] = [band, line]
    if per_seed is not None:
        sel = seed_selection()
        s = per_seed[["trial_id", "point", "seed", "split", "step", "value"]]
        seeds = (
            alt.Chart(store.add(s))
            .mark_line(strokeWidth=1.5)
            .encode(
                x=x,
                y="value:Q",
                color=color,
                detail=["trial_id:N", "seed:N"],
                opacity=alt.when(sel, empty=False).then(alt.value(0.95)).otherwise(alt.value(0)),
                tooltip=run_tooltip("split:N", "step:Q", alt.Tooltip("value:Q", format=".4g")),
            )
            .add_params(sel)
        )
        layers.append(seeds)
    return alt.layer(*layers).properties(width=CURVE_WIDTH, height=220, title=title)


def learning_curves(
    store: ChartData,
    agg: pd.DataFrame,
    per_seed: pd.DataFrame | None,
    metric: str,
    splits: Sequence[str],
    *,
    per_row: int = 3,
    band: str = "95% bootstrap band",
    unit: str = "step",
    definition: str | None = None,
) -> TopChart:
    """Mean of ``metric`` over a fixed set of seeds with a band, per split and grid point.

    ``band`` names what ``low``-``high`` is (e.g. ``95% bootstrap band`` or ``min-max``);
    ``unit``: what the x axis counts (``step``, or ``epoch``); ``definition``: the
    metric's definition, shown under the title.

    One grid point: one panel, one band per split. Several grid points: one panel per
    split (``per_row`` to a row) with one band per point, so points (e.g. ``task.setting``
    A and B) are compared at each step on the same axes. The panels share one y axis when
    every value lies in [0, 1] (a rate such as accuracy, read against 0-1 everywhere);
    otherwise (a loss) each split gets its own, so a split whose values are 10x smaller
    is not drawn flat. Legend swatches are the mean lines, not the pale bands.

    ``agg``: columns point, split, step (the x value, in ``unit``), mean, low, high, and
    optionally count (seeds at that step); one row per (point, split, step). ``per_seed`` (optional): columns
    trial_id, point, seed, split, step, value; drawn as thin lines that appear when their
    seed is selected.
    """
    points = sorted(set(agg["point"]))
    legend = alt.Legend(symbolType="stroke", symbolOpacity=1, symbolStrokeWidth=2.5)
    if len(points) == 1:
        color = alt.Color("split:N", sort=list(splits), title="split", legend=legend)
        sub = wrapped(definition, CURVE_WIDTH) if definition else []
        title = alt.TitleParams(
            f"{metric} learning curves: mean and {band} over seeds", subtitle=sub
        )
        return _curve_panel(store, agg, per_seed, metric, color, title, unit)
    color = alt.Color("point:N", scale=alt.Scale(domain=points), title="grid point", legend=legend)
    values = agg[["low", "high", "mean"]].to_numpy(dtype=float)
    values = values[np.isfinite(values)]
    y: Literal["shared", "independent"] = (
        "shared" if values.size and values.min() >= 0 and values.max() <= 1 else "independent"
    )
    shown = [s for s in splits if s in set(agg["split"])]
    shown += sorted(set(agg["split"]) - set(shown))
    panels: list[Any] = []
    for split in shown:
        seeds = None if per_seed is None else per_seed[per_seed["split"] == split]
        # a short title: a panel's title wider than the panel widens the row past the page
        sub = wrapped(f"mean and {band}" + (f"; {metric}: {definition}" if definition and not panels else ""),
                      CURVE_WIDTH)  # fmt: skip
        title = alt.TitleParams(f"{split} {metric} per grid point", subtitle=sub)
        panels.append(
            _curve_panel(store, agg[agg["split"] == split], seeds, metric, color, title, unit)
        )
    with merging_selections():
        rows = [
            alt.hconcat(*panels[i : i + per_row]).resolve_scale(y=y, color="shared")
            for i in range(0, len(panels), per_row)
        ]
        if len(rows) == 1:
            return rows[0]
        return alt.vconcat(*rows).resolve_scale(y=y, color="shared")
