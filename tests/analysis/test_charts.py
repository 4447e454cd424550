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
