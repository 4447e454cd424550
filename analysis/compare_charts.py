"""Charts that compare configs: a tuning study's objective by candidate and by parameter,
the improvement of each config over the baseline config, and rliable-style performance
profiles.

Part of the report's charts (:mod:`analysis.charts`: :class:`~analysis.charts.ChartData`)."""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import pandas as pd

from analysis.charts import ChartData, TopChart


def objective_by_trial(
    store: ChartData, trials: pd.DataFrame, *, maximize: bool = True
) -> TopChart:
    """Tuning: objective of each candidate (Optuna trial) in start order, with the running best.

    ``trials``: columns trial_number, trial_id, seeds, objective (NULL rows dropped).
    """
    df = trials.dropna(subset=["objective"])[["trial_number", "trial_id", "seeds", "objective"]]
    best = df["objective"].cummax() if maximize else df["objective"].cummin()
    df = df.assign(best=best)
    base = alt.Chart(store.add(df)).encode(x=alt.X("trial_number:Q", title="candidate (start order)"))
    dots = base.mark_circle(size=60).encode(
        y=alt.Y("objective:Q", scale=alt.Scale(zero=False)),
        tooltip=[
            alt.Tooltip("trial_id:N", title="config (trial_id)"),
            alt.Tooltip("seeds:N", title="seeds"),
            "trial_number:Q",
            alt.Tooltip("objective:Q", format=".4g"),
        ],
    )
    line = base.mark_line(interpolate="step-after", color="#999").encode(
        y=alt.Y("best:Q", title="objective")
    )
    title = f"Objective by candidate (line: best so far, {'max' if maximize else 'min'}imized)"
    return alt.layer(line, dots).properties(width=320, height=220, title=title)


def objective_by_param(store: ChartData, trials: pd.DataFrame, params: Sequence[str]) -> TopChart:
    """Tuning: objective against each ``param_*`` column (one panel per parameter)."""
    df = trials.dropna(subset=["objective"])
    panels = []
    for p in params:
        sub = df[["trial_number", "trial_id", "seeds", "objective", p]].rename(columns={p: "param"})
        panels.append(
            alt.Chart(store.add(sub))
            .mark_circle(size=60)
            .encode(
                x=alt.X("param:Q", title=p.removeprefix("param_"), scale=alt.Scale(zero=False)),
                y=alt.Y("objective:Q", scale=alt.Scale(zero=False)),
                tooltip=[
                    alt.Tooltip("trial_id:N", title="config (trial_id)"),
                    alt.Tooltip("seeds:N", title="seeds"),
                    alt.Tooltip("param:Q", title=p, format=".4g"),
                    alt.Tooltip("objective:Q", format=".4g"),
                ],
            )
            .properties(width=220, height=200, title=f"Objective vs {p.removeprefix('param_')}")
        )
    return alt.hconcat(*panels)


def improvement_chart(
    store: ChartData, comparisons: pd.DataFrame, split: str, metric: str
) -> TopChart:
    """rliable-style probability of improvement: one bar per config pair, P(a run of
    ``better`` beats one of ``worse``) with its 95% bootstrap interval, on [0, 1].

    ``comparisons``: rows of :func:`analysis.verdict.compare_configs` for one split
    (columns better, worse, a12, a12_low, a12_high, p_holm, warn).
    """
    df = comparisons[["better", "worse", "a12", "a12_low", "a12_high", "p_holm", "warn"]].copy()
    df["pair"] = df["better"].astype(str) + " vs " + df["worse"].astype(str)
    y = alt.Y("pair:N", sort=list(df["pair"]), title=None)
    scale = alt.Scale(domain=[0, 1])
    tip = ["pair:N", alt.Tooltip("a12:Q", format=".3f", title="P(improvement)"),
           alt.Tooltip("a12_low:Q", format=".3f", title="95% low"),
           alt.Tooltip("a12_high:Q", format=".3f", title="95% high"),
           alt.Tooltip("p_holm:Q", format=".2g", title="Holm p"), "warn:N"]  # fmt: skip
    base = alt.Chart(store.add(df)).encode(y=y)
    bars = base.mark_bar(height=10, opacity=0.35, color="#4c78a8").encode(
        x=alt.X("a12_low:Q", scale=scale, title="P(X beats Y)"), x2="a12_high:Q", tooltip=tip
    )
    dots = base.mark_point(filled=True, color="black", size=50).encode(x="a12:Q", tooltip=tip)
    half = alt.Chart(store.add(pd.DataFrame({"x": [0.5]}))).mark_rule(
        strokeDash=[4, 3], color="#999"
    )
    title = alt.TitleParams(
        f"Probability of improvement: {split} {metric}",
        subtitle=["P(a run of X beats a run of Y), 95% bootstrap interval; 0.5: no difference"],
    )
    return alt.layer(half.encode(x="x:Q"), bars, dots).properties(
        width=300, height=max(60, 26 * len(df)), title=title
    )


def performance_profile_chart(
    store: ChartData, profile: pd.DataFrame, split: str, metric: str, *, higher_is_better: bool
) -> TopChart:
    """rliable-style performance profile: per config, the fraction of runs scoring above
    tau (below, for a loss) against tau. ``profile``: columns point, tau, fraction
    (:func:`analysis.bands.performance_profile`)."""
    word = "above" if higher_is_better else "below"
    chart = (
        alt.Chart(store.add(profile))
        .mark_line(interpolate="step-after" if higher_is_better else "step-before")
        .encode(
            x=alt.X("tau:Q", title=f"{split} {metric} threshold tau", scale=alt.Scale(zero=False),
                    axis=alt.Axis(tickCount=6)),  # 300 px: ten ticks' labels run together
            y=alt.Y("fraction:Q", title=f"fraction of runs {word} tau", scale=alt.Scale(domain=[0, 1])),
            color=alt.Color("point:N", title="grid point"),
            tooltip=[alt.Tooltip("point:N"), alt.Tooltip("tau:Q", format=".4g"),
                     alt.Tooltip("fraction:Q", format=".3f")],
        )
    )  # fmt: skip
    return chart.properties(
        width=300, height=220, title=f"Performance profile: {split} {metric} (runs per config)"
    )
