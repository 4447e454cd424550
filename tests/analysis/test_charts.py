"""Chart specs that must hold whatever the data: a task's long metric definition is wrapped
into subtitle lines that fit the chart instead of widening it (and the page)."""

from __future__ import annotations

import pandas as pd

from analysis import charts

DEFINITION = (
    "validity: share of inputs whose output rewrites every symbol as one token of each "
    "sub-alphabet with the symbol's number, in any order (the paper's accuracy)"
)


def _subtitle(spec: dict) -> list[str]:
    sub = spec["title"]["subtitle"]
    return [sub] if isinstance(sub, str) else list(sub)


def test_a_long_definition_is_wrapped_to_the_chart_width() -> None:
    values = pd.DataFrame({
        "trial_id": "t", "point": "default", "seed": [0, 1, 0, 1], "split": ["a", "a", "b", "b"],
        "role": "test", "value": [0.1, 0.2, 0.3, 0.4],
    })  # fmt: skip
    chart = charts.split_distribution(charts.ChartData(), values, "accuracy", ["a", "b"], multi=False,
                                      definition=DEFINITION)  # fmt: skip
    spec = chart.to_dict()
    width = spec["width"]
    lines = _subtitle(spec)
    wrapped = [ln for ln in lines if ln not in lines[:1]]  # after the legend line
    assert len(wrapped) >= 3  # 160 characters at width 220
    assert all(len(ln) <= max(40, width // 6) for ln in lines), (width, lines)  # ~6 px a character
    assert " ".join(wrapped) == f"accuracy: {DEFINITION}"  # every word kept, in order


def test_wrapped_keeps_short_text_on_one_line() -> None:
    assert charts.wrapped("cross-entropy per token", 300) == ["cross-entropy per token"]
    assert charts.wrapped("word " * 30, 240) == ["word " * 7 + "word"] * 3 + ["word " * 5 + "word"]


def test_many_splits_and_configs_stay_within_a_page() -> None:
    # a length-generalization study: 23 splits x 2 configs would be 3,220 px at 70 px each
    splits = [f"len_{i}" for i in range(1, 24)]
    values = pd.DataFrame([
        {"trial_id": t, "point": t, "seed": s, "split": sp, "role": "test", "value": 0.5}
        for t in ("a", "b") for s in (0, 1) for sp in splits
    ])  # fmt: skip
    chart = charts.split_distribution(charts.ChartData(), values, "exact", splits, multi=True)
    assert chart.to_dict()["width"] == charts.PAGE_WIDTH
    few = charts.split_distribution(charts.ChartData(), values[values["split"] == "len_1"], "exact",
                                    ["len_1"], multi=True)  # fmt: skip
    assert few.to_dict()["width"] == 220


def _find(node: object, key: str) -> list:
    """Every value under ``key`` anywhere in a spec."""
    if isinstance(node, dict):
        return ([node[key]] if key in node else []) + [v for x in node.values() for v in _find(x, key)]
    if isinstance(node, list):
        return [v for x in node for v in _find(x, key)]
    return []


def test_the_histogram_bins_every_run_as_the_chart_stores_it() -> None:
    # test accuracies of 481 pairs (grokking_cpu, fraction 0.5): 200/481 = 0.415800415800416 is
    # stored with 12 digits as 0.4158004158, below the exact minimum; Vega's bin sends a value
    # below the first edge to -Infinity, so the lowest run had no bar
    values = pd.DataFrame({"trial_id": "t", "point": "default", "seed": [0, 1, 2, 3],
                           "value": [200 / 481, 236 / 481, 347 / 481, 458 / 481]})  # fmt: skip
    store = charts.ChartData()
    spec = charts.histogram(store, values, "test", "accuracy", multi=False).to_dict()
    (extent,) = [b["extent"] for b in _find(spec, "bin") if isinstance(b, dict) and "extent" in b]
    (name,) = {d["name"] for d in _find(spec, "data") if isinstance(d, dict) and "name" in d}
    stored = [r["value"] for r in store.values[name]]
    assert stored[0] < 200 / 481  # the rounding that hid the bar
    # Vega's bin: v < start -> -Infinity, v > stop -> +Infinity (no bar); every run inside
    assert all(extent[0] <= v <= extent[1] for v in stored), (extent, stored)
