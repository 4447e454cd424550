"""The report page around its charts: the header, the verdict box, the HTML shell.

:func:`render_html` writes one self-contained page (the Vega, Vega-Lite and vega-embed
JavaScript that vl-convert-python ships, inlined); :func:`header_lines` is the same header
as text, drawn above exported images; :func:`definition` is what a metric measures.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from analysis import verdict as vd
from analysis.aggregates import AggregateResult
from analysis.context import StudyContext
from analysis.db import list_studies

GENERIC_DEFINITIONS = {
    "accuracy": "fraction of examples the model gets right (generic; the task declared no definition)",
    "loss": "the training objective averaged over the split's examples (generic; the task declared no definition)",
}
"""Shown where a metric is drawn when the task declares no ``metric_definitions``."""


def definition(ctx: StudyContext, metric: str) -> str | None:
    """What ``metric`` measures: the task's declaration, else a generic line, else None."""
    declared = ctx.manifest.declarations.metric_definitions if ctx.manifest else {}
    return declared.get(metric) or GENERIC_DEFINITIONS.get(metric)


def _js_bundle() -> str:
    """vega + vega-lite + vega-embed, bundled by vl-convert (about 0.9 MB, built once)."""
    import vl_convert as vlc

    # The stub marks ``snippet`` required; omitted, it defaults to exposing vegaEmbed.
    return str(vlc.javascript_bundle(vl_version=vl_version()))  # type: ignore[call-arg]


def vl_version() -> str:
    from altair.utils._importers import vl_version_for_vl_convert

    return str(vl_version_for_vl_convert())


def _script_json(obj: Any) -> str:
    """JSON safe to place inside a <script> element."""
    return json.dumps(obj).replace("</", "<\\/").replace("<!--", "<\\!--")


def _header_rows(ctx: StudyContext) -> list[tuple[str, str]]:
    m = ctx.manifest
    info = next(iter(list_studies(ctx.out, only=[ctx.name])), None)
    rows: list[tuple[str, str]] = [("study", ctx.name), ("kind", ctx.kind)]
    rows += [("task", (m and m.task) or (info and info.task) or "?")]
    rows += [("model", (m and m.model) or (info and info.model) or "?")]
    if info:
        planned = "?" if info.planned is None else str(info.planned)
        left_out = info.done - info.ok
        rows.append(
            (
                "runs",
                f"{info.done} done of {planned} planned: {info.statuses()}"
                + (f"; {left_out} not ok, left out of every number" if left_out else ""),
            )
        )
    seeds = seeds_row(m)
    if seeds:
        rows.append(seeds)
    points = sorted(set(ctx.evals["point"])) if not ctx.evals.empty else []
    if len(points) > 1:
        rows.append(("grid points", "; ".join(points)))
    rows.append(("primary metric", ctx.primary or "-"))
    code = "; ".join(f"{sha[:12]} ({n} runs)" for sha, n in ctx.code) if len(ctx.code) > 1 else None
    rows += [("git sha", code or (m and m.git_sha) or "?"), ("created", (m and m.created_at) or "?")]
    if m and m.tuned_from:
        rows.append(("tuned from", json.dumps(m.tuned_from)))
    rows.append(("report written", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")))
    return rows


def seeds_row(m: Any) -> tuple[str, str] | None:
    """The header's seed count: a tuning study's seeds per candidate (``tune.seeds_per_candidate``,
    not its ``seeds.count``); a seed study's seeds per config (grid point), each point's own
    count when they differ; None when the manifest says nothing."""
    if m is None:
        return None
    tune = m.raw.get("tune")
    if m.kind == "tune" and isinstance(tune, dict) and tune.get("seeds_per_candidate") is not None:
        return "seeds per candidate", str(tune["seeds_per_candidate"])
    labels = m.point_labels()
    counts = {labels.get(str(p.get("trial_id")), "?"): p.get("seeds", m.seeds) for p in m.points}
    if len(set(counts.values())) > 1:
        return "seeds per config", "; ".join(f"{label}: {n}" for label, n in counts.items())
    n = next(iter(counts.values()), m.seeds)
    return ("seeds per config", str(n)) if n is not None else None


def resolved_configs(ctx: StudyContext) -> dict[str, Any]:
    """Per grid point, the resolved config (every default filled in) the trials ran with,
    from ``trials.config_json``; empty when the trials table has none."""
    rows = ctx.con.execute(
        "SELECT trial_id, any_value(config_json ORDER BY started_at) FROM trials "
        "WHERE study = ? GROUP BY trial_id ORDER BY trial_id",
        [ctx.name],
    ).fetchall()
    out: dict[str, Any] = {}
    for tid, text in rows:
        if not text:
            continue
        try:
            out[ctx.labels.get(tid, tid)] = json.loads(text)
        except ValueError:
            continue
    return out


def _html_table(df: Any, cols: list[tuple[str, str]], cls: str = "verdict") -> str:
    """``df``'s ``cols`` (column, heading) as an HTML table; floats to 3 significant digits."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "" if v != v else f"{v:.3g}"
        return html.escape(str(v))

    head = "".join(f"<th>{html.escape(h)}</th>" for _, h in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{cell(r[c])}</td>" for c, _ in cols) + "</tr>"
        for _, r in df.iterrows()
    )
    return f"<table class='{cls}'><tr>{head}</tr>{body}</table>"


def verdict_html(v: vd.Verdict, definition_text: str | None = None) -> str:
    """The verdict section at the top of the report (id ``verdict``)."""
    parts = ["<section id='verdict'><h2>Verdict: does the config or the seed decide?</h2>"]
    parts.append(f"<p class='sentence'>{html.escape(v.sentence)}</p>")
    if definition_text and v.metric:
        parts.append(f"<p class='hint'>{html.escape(v.metric)}: {html.escape(definition_text)}</p>")
    for line in v.axis.pooled_text() if v.axis else ():
        parts.append(f"<p class='hint pooled'>{html.escape(line)}</p>")
    if v.reason and v.reason not in v.sentence:
        parts.append(f"<p class='hint'>Model: {html.escape(v.reason)}.</p>")
    if not v.shares.empty:
        t = v.shares.assign(
            share=[vd.pct_interval(a, b, c) if pd.notna(a) else "no variance"
                   for a, b, c in v.shares[["between", "low", "high"]].to_numpy()],
            icc=[vd.pct_interval(a, b, c) if pd.notna(a) else "" for a, b, c in v.shares[["icc1", "icc1_low", "icc1_high"]].to_numpy()],
            seeds=v.shares["seeds_share"].map(lambda x: f"{vd.pct(x)}%" if pd.notna(x) else ""),
        )  # fmt: skip
        parts.append(_html_table(t, [("split", "split"), ("configs", "configs"), ("seeds_min", "seeds (fewest)"),
                                     ("share", "between configs (omega², 95%)"), ("seeds", "seeds"),
                                     ("icc", "ICC(1), 95%"), ("p", "p (F test)"), ("warn", "warning")]))  # fmt: skip
    if not v.sources.empty:
        t = v.sources.assign(
            share=[
                vd.pct_interval(a, b, c) for a, b, c in v.sources[["share", "low", "high"]].to_numpy()
            ]
        )
        parts.append("<p>Seed variance by seed source (configs that varied one source each):</p>")
        parts.append(_html_table(t, [("source", "source"), ("runs", "runs"), ("var", "variance"),
                                     ("share", "share (95% bootstrap)"), ("warn", "warning")]))  # fmt: skip
    if not v.comparisons.empty:
        c = v.comparisons.assign(
            diff_ci=[f"{a:.3g} [{b:.3g}, {d:.3g}]" for a, b, d in v.comparisons[["diff", "diff_low", "diff_high"]].to_numpy()],
            a12_ci=[f"{a:.2f} {vd.a12_cell(b, d)}" for a, b, d in v.comparisons[["a12", "a12_low", "a12_high"]].to_numpy()],
        )  # fmt: skip
        parts.append(
            "<p>Config vs config (diff: 95% Welch t interval; P(improvement): 95% bootstrap interval; p: Welch, Holm-adjusted over the rows that have one; '-': every resample alike, no interval):</p>"
        )
        parts.append(_html_table(c, [("split", "split"), ("better", "better"), ("worse", "worse"),
                                     ("diff_ci", "difference of means"), ("hedges_g", "Hedges g"),
                                     ("a12_ci", "P(improvement)"), ("p_holm", "Holm p"), ("warn", "warning")]))  # fmt: skip
    if not v.expected_max.empty:
        em = v.expected_max
        ns = sorted({1, *[2**i for i in range(1, 12) if 2**i < len(em)], len(em)})
        parts.append("<p>Expected best objective vs number of candidates (Dodge et al. 2019):</p>")
        parts.append(_html_table(em[em["n"].isin(ns)], [("n", "candidates"), ("expected_best", "expected best"), ("std", "std")]))  # fmt: skip
    ex = v.excluded
    if not ex.empty and (ex["ok"] < ex["runs"]).any():
        t = ex.assign(
            share=[
                vd.pct_interval(a, b, c) for a, b, c in ex[["excluded_share", "low", "high"]].to_numpy()
            ]
        )
        parts.append("<p>Runs left out of every number (share with 95% Wilson interval):</p>")
        parts.append(_html_table(t, [("point", "config"), ("runs", "runs"), ("ok", "ok"), ("not_learned", "never learned"),
                                     ("diverged", "diverged"), ("failed", "failed"), ("other", "other"),
                                     ("share", "left out")]))  # fmt: skip
    parts += [f"<p class='warning'>warning: {html.escape(w)}</p>" for w in v.warnings]
    return "".join(parts) + "</section>"


def aggregates_html(results: Sequence[AggregateResult]) -> str:
    """The task's declared aggregates (id ``aggregates``): one table each, under its title."""
    if not results:
        return ""
    parts = ["<section id='aggregates'><h2>Declared by the task</h2>"]
    for r in results:
        for title, table in ((r.title, r.table), *r.more):
            cols = [(c, c) for c in table.columns if not table[c].isna().all()]
            parts.append(f"<p>{html.escape(title)}:</p>" + _html_table(table, cols))
    return "".join(parts) + "</section>"


def header_html(
    ctx: StudyContext, v: vd.Verdict | None = None, aggregates: Sequence[AggregateResult] = ()
) -> str:
    m = ctx.manifest
    cells = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
        for k, v in _header_rows(ctx)
    )
    resolved = resolved_configs(ctx)
    if resolved:
        config = html.escape(json.dumps(resolved, indent=2, sort_keys=True))
        what = "resolved config per grid point (every default filled in, as the trials ran)"
    else:
        config = html.escape(json.dumps(m.config if m else {}, indent=2, sort_keys=True))
        what = "config as written in the study file (the trials table holds no resolved config)"
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in ctx.notes)
    return (
        f"<h1>fineline study report: {html.escape(ctx.name)}</h1>"
        f"<table class='meta'>{cells}</table>"
        + (verdict_html(v, definition(ctx, v.metric) if v.metric else None) if v else "")
        + aggregates_html(aggregates)
        + f"<details><summary>{what}</summary><pre>{config}</pre></details>"
        + (f"<p>Notes:</p><ul class='notes'>{notes}</ul>" if notes else "")
        + "<p class='hint'>Hover a dot for its seed and config (trial_id); click a dot to highlight that "
        "seed in every chart, double-click to clear.</p>"
    )


def header_lines(ctx: StudyContext, v: vd.Verdict | None = None) -> tuple[str, ...]:
    """The header as plain lines for image exports: title, metadata, the verdict sentence
    and warnings."""
    lines = [f"fineline study report: {ctx.name}"]
    lines += [f"{k}: {val}" for k, val in _header_rows(ctx)]
    if v is not None:
        lines += [f"verdict: {v.sentence}", *[f"warning: {w}" for w in v.warnings]]
    return tuple(lines)


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 12px; }
table.meta { border-collapse: collapse; font-size: 13px; margin-bottom: 8px; }
table.meta th { text-align: left; padding: 2px 12px 2px 0; color: #555; font-weight: 600; }
table.meta td { padding: 2px 0; }
#verdict { border: 1px solid #ccc; padding: 8px 14px; margin: 12px 0; max-width: 1200px; }
#verdict h2 { font-size: 16px; margin: 4px 0 8px; }
#aggregates { margin: 12px 0; max-width: 1400px; overflow-x: auto; }
#aggregates h2 { font-size: 16px; margin: 4px 0 8px; }
#verdict .sentence { font-size: 15px; font-weight: 600; }
table.verdict { border-collapse: collapse; font-size: 12px; margin: 4px 0 10px; }
table.verdict th, table.verdict td { border-bottom: 1px solid #e4e4e4; padding: 2px 8px; text-align: left; }
.warning { color: #a15c00; font-size: 13px; }
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
