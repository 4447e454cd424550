"""Charts of the seed-study questions (:mod:`analysis.seed_questions`) for the report.

* :func:`km_chart`: per grid point, the Kaplan-Meier share of runs that reached an event
  against time (``1 - S(t)``, a step line with its 95% band), a tick where runs were
  censored, and a dashed rule at the budget;
* :func:`seed_count_chart`: the 95% half-width of a mean against the number of seeds,
  from each (point, split)'s spread, with the target half-width and the study's seeds;
* :func:`power_chart`: the power of each config comparison against seeds per config, to
  detect the target difference (:func:`analysis.seedcount.power_table`), with the 80% line.

:func:`question_panels` builds them for a study as ``(name, chart, wide)`` rows, which
:func:`analysis.report.build_charts` appends to the page.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import numpy as np
import pandas as pd

from analysis import seedcount as sc
from analysis.charts import ChartData, TopChart, wrapped
from analysis.context import StudyContext

TITLE_PX = 400
"""How wide these charts' titles may run (a 300 px plot and its legend), in pixels."""

Panels = list[tuple[str, Any, bool]]


def _steps(curves: pd.DataFrame, end: float, level: float = 0.95) -> pd.DataFrame:
    """Per point, the KM table with a leading row at time 0 (nothing reached yet) and, where
    it ends before ``end`` (the budget), a trailing copy of its last row there: a step-after
    line and band are drawn up to the next row, so the last step (often the only one) had
    no width and its band did not show. The leading row's band is the exact bound of no
    event among the n runs followed (:func:`analysis.survival.kaplan_meier`: at most
    ``1 - ((1 - level) / 2) ** (1 / n)`` reached), as the table gives it before the first
    event: a point whose runs were all censored at the budget (its only row) drew a flat 0
    with no band, where its table says 0% [0, 17] for 20 runs."""
    parts = []
    for p, sub in curves.groupby("point", sort=False):
        n = int(sub["at_risk"].iloc[0])
        start = pd.DataFrame({"point": [p], "time": [0.0], "reached": [0.0], "r_low": [0.0],
                              "r_high": [1 - ((1 - level) / 2) ** (1 / n)], "at_risk": [n],
                              "events": [0], "censored": [0]})  # fmt: skip
        body = sub.assign(r_low=1 - sub["high"], r_high=1 - sub["low"])[list(start.columns)]
        parts += [start, body]
        if float(body["time"].iloc[-1]) < end:
            parts.append(body.tail(1).assign(time=float(end), events=0, censored=0))
    return pd.concat(parts, ignore_index=True)


def km_chart(
    store: ChartData, curves: pd.DataFrame, label: str, unit: str, budget: float, level: float = 0.95
) -> TopChart:
    """Kaplan-Meier curves of one event, one colour per grid point.

    ``curves``: :data:`analysis.survival.CURVE_COLUMNS` (point, time, at_risk, events,
    censored, survival, low, high, reached, reached_all). ``label``: the event
    (``val accuracy >= 0.5``); ``unit``: ``epoch`` or ``step``; ``budget``: the largest
    budget, drawn as a dashed rule; ``level``: the band's (:func:`_steps`).
    """
    df = _steps(curves, budget, level)
    color = alt.Color("point:N", title="grid point")
    x = alt.X("time:Q", title=unit, scale=alt.Scale(domainMin=0))
    tip = [alt.Tooltip("point:N"), alt.Tooltip("time:Q", title=unit),
           alt.Tooltip("reached:Q", format=".1%", title="reached"),
           alt.Tooltip("r_low:Q", format=".1%", title="95% low"),
           alt.Tooltip("r_high:Q", format=".1%", title="95% high"),
           alt.Tooltip("at_risk:Q", title="at risk"), alt.Tooltip("events:Q"),
           alt.Tooltip("censored:Q")]  # fmt: skip
    base = alt.Chart(store.add(df)).encode(x=x, color=color)
    band = base.mark_area(opacity=0.15, interpolate="step-after").encode(
        y=alt.Y("r_low:Q", title="share of runs that reached it", scale=alt.Scale(domain=[0, 1])),
        y2="r_high:Q",
    )
    line = base.mark_line(interpolate="step-after").encode(y="reached:Q", tooltip=tip)
    ticks = (
        base.transform_filter("datum.censored > 0")
        .mark_tick(thickness=2, size=12, orient="vertical")
        .encode(y="reached:Q", tooltip=tip)
    )
    rule = (
        alt.Chart(store.add(pd.DataFrame({"budget": [budget]})))
        .mark_rule(strokeDash=[4, 3], color="#999")
        .encode(x="budget:Q")
    )
    # wrapped to the plot and its legend: Vega does not wrap titles, and a one-line subtitle
    # (560 px) made this chart and the one beside it wider than a 1280 px window
    title = alt.TitleParams(
        wrapped(f"Time to {label} (Kaplan-Meier)", TITLE_PX, bold=True),
        subtitle=wrapped(f"share of runs that reached it by each {unit}, 95% log-log band; ticks: "
                         "censored runs; dashed: the budget; diverged runs left out", TITLE_PX),
    )  # fmt: skip
    # the budget rule under the line and ticks: runs censored at the budget sit on it
    layers = [band, rule, line, *([ticks] if (df["censored"] > 0).any() else [])]  # an empty layer: Vega warns
    return alt.layer(*layers).properties(width=300, height=220, title=title)


def seed_count_chart(store: ChartData, table: pd.DataFrame, metric: str) -> TopChart:
    """The 95% half-width of the mean against the number of seeds per (point, split).

    ``table``: :func:`analysis.seedcount.seed_count_table` (point, split, n, sd,
    half_width_now, half_width, ...). A dashed rule marks the target half-width, a dot
    each (point, split)'s present seeds and half-width. A (point, split) whose seeds all
    agree (sd 0: its half-width is 0 at every n, which a log axis cannot place; one such
    row left the whole chart without lines or ticks) is named in the subtitle instead.
    """
    multi = table["point"].nunique() > 1
    flat = table[table["sd"] == 0]
    table = table[np.isfinite(table["sd"].astype(float)) & (table["sd"] > 0)]
    # the curves run past the most seeds any split needs, so each one crosses the target
    needed = pd.to_numeric(table["seeds_needed"], errors="coerce")
    needed = needed[np.isfinite(needed)]
    top = int(min(sc.MAX_SEEDS, 2 * needed.max())) if len(needed) else None
    rows = []
    for r in table.itertuples(index=False):
        c = sc.curve_points(r.sd, int(r.n), top=top).assign(
            group=f"{r.point}: {r.split}" if multi else r.split
        )
        rows.append(c)
    curves = (
        pd.concat(rows, ignore_index=True)
        if rows
        else pd.DataFrame(columns=["n", "half_width", "group"])
    )
    now = table.assign(group=[f"{p}: {s}" if multi else s
                              for p, s in zip(table["point"], table["split"], strict=True)])  # fmt: skip
    color = alt.Color("group:N", title="split")
    x = seeds_axis("seeds", float(curves["n"].max()) if len(curves) else 100)
    lines = alt.Chart(store.add(curves)).mark_line().encode(
        x=x, y=alt.Y("half_width:Q", title=f"95% half-width of mean {metric}", scale=alt.Scale(type="log")),
        color=color, tooltip=["group:N", "n:Q", alt.Tooltip("half_width:Q", format=".4f")],
    )  # fmt: skip
    dots = alt.Chart(store.add(now[["group", "n", "half_width_now", "seeds_needed"]])).mark_point(
        filled=True, size=60
    ).encode(x="n:Q", y="half_width_now:Q", color=color,
             tooltip=["group:N", alt.Tooltip("n:Q", title="seeds now"),
                      alt.Tooltip("half_width_now:Q", format=".4f"), "seeds_needed:Q"])  # fmt: skip
    target = float((table if not table.empty else flat)["half_width"].iloc[0])
    rule = (
        alt.Chart(store.add(pd.DataFrame({"h": [target]})))
        .mark_rule(strokeDash=[4, 3], color="#999")
        .encode(y="h:Q")
    )
    same = [f"{p}: {s}" if multi else str(s) for p, s in zip(flat["point"], flat["split"], strict=True)]
    note = wrapped(f"not drawn, every seed the same (sd 0): {', '.join(same)}", 300) if same else []
    title = alt.TitleParams(
        wrapped(f"How many seeds: {metric} mean to +-{target:.3g}", TITLE_PX, bold=True),
        subtitle=[*wrapped("t interval from this study's spread per split; dots: the seeds it has; "
                           "dashed: the target", TITLE_PX), *note],
    )  # fmt: skip
    return alt.layer(lines, dots, rule).properties(width=300, height=220, title=title)


def seeds_axis(title: str, top: float) -> alt.X:
    """A log x axis of seed counts from 1 to ``top`` with round ticks (1, 2, 5, 10, ...;
    decades only past 1,000), so the labels do not run into each other."""
    steps = (1, 2, 5) if top <= 1000 else (1,)
    ticks = [m * 10**k for k in range(int(np.ceil(np.log10(max(top, 10)))) + 1) for m in steps]
    return alt.X("n:Q", title=title, scale=alt.Scale(type="log", domain=[1, top], nice=False),
                 axis=alt.Axis(values=[t for t in ticks if t <= top], format=",d"))  # fmt: skip


def power_chart(store: ChartData, power: pd.DataFrame, metric: str, top: int = 6) -> TopChart:
    """Power against seeds per config for each comparison (the ``top`` least powered).

    ``power``: :func:`analysis.seedcount.power_table` (split, better, worse, sd_better,
    sd_worse, difference: the target, power, n_better, n_worse, ...)."""
    rows = []
    for r in power.sort_values("power", kind="stable").head(top).itertuples(index=False):
        needed = int(r.seeds_needed) if r.seeds_needed is not None and np.isfinite(r.seeds_needed) else 0
        hi = max(100, 2 * needed, 4 * max(r.n_better, r.n_worse))
        ns = np.unique(np.round(np.geomspace(2, hi, 50)).astype(int))
        name = f"{r.split}: {r.better} vs {r.worse}"
        rows += [
            (name, int(n), sc.welch_power(r.difference, r.sd_better, r.sd_worse, int(n), int(n)))
            for n in ns
        ]
    df = pd.DataFrame(rows, columns=["comparison", "n", "power"])
    line = (
        alt.Chart(store.add(df))
        .mark_line()
        .encode(
            x=seeds_axis("seeds per config", float(df["n"].max()) if len(df) else 100),
            y=alt.Y("power:Q", title="power", scale=alt.Scale(domain=[0, 1])),
            color=alt.Color("comparison:N"),
            tooltip=["comparison:N", "n:Q", alt.Tooltip("power:Q", format=".2f")],
        )
    )
    rule = (
        alt.Chart(store.add(pd.DataFrame({"p": [sc.POWER]})))
        .mark_rule(strokeDash=[4, 3], color="#999")
        .encode(y=alt.Y("p:Q", title="power"))
    )
    title = alt.TitleParams(
        wrapped(f"Power to detect a {metric} difference of {float(power['difference'].iloc[0]):.3g}" if len(power)
                else f"Power to detect a {metric} difference", TITLE_PX, bold=True),
        subtitle=wrapped(
            f"two-sided Welch t at alpha {sc.ALPHA}, this study's spreads; dashed: {sc.POWER:.0%}", TITLE_PX
        ),
    )
    return alt.layer(line, rule).properties(width=300, height=220, title=title)


def question_panels(ctx: StudyContext, store: ChartData, verdict: Any) -> Panels:
    """The report's panels: a Kaplan-Meier chart per declared event, the seed-count chart,
    and the power chart of a grid's comparisons."""
    from analysis.seed_questions import resolve_events, study_events, study_seed_counts

    out: Panels = []
    for r in study_events(ctx, resolve_events(ctx)):
        if r.curves.empty:
            continue
        chart = km_chart(store, r.curves, r.event.label, r.unit, float(r.summary["budget"].max()))
        out.append((f"time-to-{r.event.split}-{r.event.metric}", chart, False))
        ctx.notes.extend(r.warnings)
    if verdict is None or verdict.metric is None:
        return out
    counts = study_seed_counts(ctx, verdict)
    if not counts.table.empty and (counts.table["sd"] > 0).any():  # else nothing to draw on a log axis
        out.append(("seed-count", seed_count_chart(store, counts.table, str(counts.metric)), False))
    if not counts.power.empty:
        out.append(("seed-power", power_chart(store, counts.power, str(counts.metric)), False))
    ctx.notes.extend(counts.warnings)
    return out
