"""Runs that are not ``ok`` stay out of every number, and configs the verdict cannot
compare are named: demo studies whose runs' statuses (and values) are edited by hand."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis import analyze as an
from analysis.context import open_study
from analysis.demo import write_demo_study
from analysis.verdict import study_verdict

POINTS = [{"train.lr": 0.1}, {"train.lr": 0.3}, {"train.lr": 1.0}]


def edit(out: Path, table: str, name: str, change: Callable[[dict[str, Any]], None]) -> None:
    for f in (out / "tables" / table / f"study={name}").glob("*.parquet"):
        t = pq.read_table(f, partitioning=None)
        rows = t.to_pylist()
        for r in rows:
            change(r)
        pq.write_table(pa.Table.from_pylist(rows, schema=t.schema), f)


def make(out: Path, name: str, n_seeds: int, statuses: dict[tuple[str, int], str]) -> None:
    write_demo_study(out, name, n_seeds=n_seeds, points=POINTS, seed=3)

    def status(r: dict[str, Any]) -> None:
        r["status"] = statuses.get((r["trial_id"], r["seed"]), r["status"])

    edit(out, "runs", name, status)


def verdict_of(out: Path, name: str) -> Any:
    ctx = open_study(out, name)
    try:
        return study_verdict(ctx, n_boot=50)
    finally:
        ctx.close()


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    o = tmp_path_factory.mktemp("excluded")
    # lr=1 never learns (6 of 6); seed 0 of lr=0.1 diverged
    make(o, "g3", 6, {**{("g3-t02", s): "not_learned" for s in range(6)}, ("g3-t00", 0): "diverged"})
    # lr=1 has one ok run of 4
    make(o, "one1", 4, {("one1-t02", s): "not_learned" for s in range(1, 4)})
    return o


def test_correlations_scatter_and_regressions_count_ok_runs_only(out: Path) -> None:
    ctx = open_study(out, "g3")
    try:
        corr = dict(an.test_correlations(ctx))
        assert set(corr) == {"lr=0.1", "lr=0.3"}  # lr=1 has no ok run: no matrix
        n = corr["lr=0.1"].n.to_numpy()
        assert (n[~(n == 0)] <= 5).all() and n.max() == 5  # seed 0 diverged: 5 runs per pair
        sc = an.scatter_data(ctx, n_boot=50)
        assert sc is not None
        pairs = sc[0]
        assert set(pairs["point"]) == {"lr=0.1", "lr=0.3"} and (pairs["trial_id"].eq("g3-t00") & pairs["seed"].eq(0)).sum() == 0
        for reg in an.declared_regressions(ctx):
            assert "lr=1" not in reg.fits
            assert reg.pairs.loc[reg.pairs["point"] == "lr=0.1", "seed"].nunique() == 5
    finally:
        ctx.close()


def test_a_config_without_ok_runs_is_named_not_dropped_silently(out: Path) -> None:
    v = verdict_of(out, "g3")
    assert v.design == "grid" and "(2 configs, at least 5 seeds each)" in v.sentence
    assert v.sentence.endswith("Not compared, with fewer than 2 ok seeds: lr=1 (0 of 6 runs ok: 6 never learned).")


def test_a_config_with_one_ok_run_no_longer_cancels_the_verdict(out: Path) -> None:
    v = verdict_of(out, "one1")
    assert v.design == "grid", v.sentence  # it was "No verdict: configs with fewer than 2 ok seeds"
    assert "lr=1 (1 of 4 runs ok: 3 never learned)" in v.sentence


def test_missing_values_do_not_count_as_seeds(tmp_path: Path) -> None:
    write_demo_study(tmp_path, "nan", n_seeds=3, points=POINTS[:2], seed=5)
    headline = "short"

    def blank(r: dict[str, Any]) -> None:  # 2 of lr=0.1's 3 runs lack the headline value
        if r["trial_id"] == "nan-t00" and r["seed"] in (0, 1) and r["split"] == headline:
            r["value"] = None

    edit(tmp_path, "evals", "nan", blank)
    v = verdict_of(tmp_path, "nan")
    assert v.splits[0] == headline
    assert v.design == "single" and "fewer than 2 configs have 2 or more ok seeds" in v.sentence
    assert "lr=0.1 (3 of 3 runs ok: fewer than 2 values of short)" in v.sentence


def test_an_undefined_seed_count_is_blank_not_above_the_cap(out: Path) -> None:
    text = an.analyze(out, "one1", n_boot=50)
    block = text[text.index("How many seeds"):]
    row = next(ln for ln in block.splitlines() if ln.startswith("lr=1 ") and " short " in ln)
    assert ">100000" not in row  # one ok run: no sd, so no count (it read ">100000")


def test_splits_without_variance_say_so_beside_the_headline(tmp_path: Path) -> None:
    write_demo_study(tmp_path, "sat", n_seeds=5, points=POINTS[:2], seed=3)

    def saturate(r: dict[str, Any]) -> None:  # every test accuracy 1.0
        if r["metric"] == "accuracy" and r["role"] == "test":
            r["value"] = 1.0

    edit(tmp_path, "evals", "sat", saturate)
    v = verdict_of(tmp_path, "sat")
    others = v.sentence[v.sentence.index("Other splits: "):]
    assert "0%" not in others and others.count("no variance") == len(v.splits) - 1, v.sentence


def test_the_one_config_sentence_says_how_little_few_seeds_cover() -> None:
    import pandas as pd

    from analysis.verdict import seed_spread_sentence

    three = seed_spread_sentence(pd.Series([0.7, 0.8, 0.95]), "accuracy", "test", n_boot=200)
    assert "an interval inside the range of 3 seeds covers at most 75%" in three  # 1 - 2 / 2^3
    eight = seed_spread_sentence(pd.Series([0.7, 0.8, 0.95, 0.9, 0.85, 0.6, 0.75, 0.8]), "accuracy", "test", n_boot=200)
    assert "covers at most" not in eight and "indicative only" in eight


def test_a_scatter_pooled_over_configs_says_so(tmp_path: Path) -> None:
    write_demo_study(tmp_path, "g5", n_seeds=4, points=[{"train.lr": v} for v in (0.1, 0.2, 0.3, 0.4, 0.5)], seed=2)
    text = an.analyze(tmp_path, "g5", n_boot=50)
    scatter = text[text.index("Seed scatter correlation"):text.index("Regressions declared")]
    assert "all runs " in scatter and "r also holds the differences between configs" in scatter
    write_demo_study(tmp_path, "g2", n_seeds=4, points=POINTS[:2], seed=2)  # fitted per config
    text = an.analyze(tmp_path, "g2", n_boot=50)
    assert "r also holds the differences between configs" not in text


def test_a_left_out_seed_keeps_the_multi_bootstrap_paired_on_the_rest(out: Path) -> None:
    """lr=0.1 lost seed 0 (diverged): 5 of lr=0.3's 6 seeds still have a partner (>= 80%)."""
    import json

    doc = json.loads(an.analyze(out, "g3", "json", n_boot=50))
    mb = doc["multi_bootstrap"]
    rows = [r for r in (mb["rows"] if isinstance(mb, dict) else mb) if r["kind"] == "configs"]
    assert rows and all(r["paired_seeds"] and r["seeds_a"] == r["seeds_b"] == 5 for r in rows)
    assert any("pairs lr=0.3 and lr=0.1 on the 5 seeds both ran ok" in n for n in doc["notes"])


def test_seed_pairing_needs_most_runs_to_have_a_partner() -> None:
    from analysis.seed_questions import _pairable

    assert _pairable(5, 5, 6) and _pairable(10, 10, 10)
    assert not _pairable(10, 10, 50)  # pairing would drop 40 runs
    assert not _pairable(1, 1, 1)


def test_an_exported_header_wraps_the_verdict_instead_of_cutting_it() -> None:
    from analysis.charts import HEADER_CHARS, header_chart

    sentence = "verdict: " + " ".join(f"clause{i} says something" for i in range(40)) + " (indicative only.)"
    chart = header_chart(["fineline study report: g", sentence])
    texts = [row["text"] for row in chart.data.values]  # type: ignore[union-attr]
    assert len(texts) > 2 and all(len(t) <= HEADER_CHARS for t in texts)
    assert " ".join(t.strip() for t in texts[1:]) == sentence  # every word drawn, in order
    assert chart.to_dict()["mark"].get("limit") is None  # no ellipsis at a width limit


def test_histogram_bins_stay_inside_the_axis() -> None:
    """Bins of exactly (max - min) / bins from the smallest value, and the scale one bin past
    the largest: Vega's default nice edges (13 to 29 for values 13.77..28.9) drew bars
    outside the fixed scale, over the axis labels."""
    import pandas as pd

    from analysis.charts import ChartData, histogram

    values = pd.DataFrame({"trial_id": "t", "point": "p", "seed": range(6),
                           "value": [13.77, 13.9, 20.1, 21.3, 24.0, 28.9]})
    spec = histogram(ChartData(), values, "very_long", "fpf", multi=False, bins=10).to_dict()
    x = spec["vconcat"][0]["layer"][0]["encoding"]["x"]
    step = (28.9 - 13.77) / 10
    assert x["bin"]["nice"] is False and x["bin"]["step"] == pytest.approx(step)
    assert x["bin"]["extent"][0] == pytest.approx(13.77)
    assert x["scale"]["domain"] == pytest.approx([13.77, 28.9 + step])  # the last bin's end


def test_a_kaplan_meier_step_reaches_the_budget_so_its_band_shows() -> None:
    """Two runs that both reached the event at step 100 of a 300-step budget: the curve's
    last (only) step had no width, so its 95% band was never drawn."""
    import pandas as pd

    from analysis import survival as sv
    from analysis.charts import ChartData
    from analysis.seed_charts import _steps, km_chart

    km = sv.kaplan_meier([100, 100], [True, True])
    curves = km.assign(point="p", reached=1 - km["survival"])
    steps = _steps(curves, 300.0)
    assert steps["time"].tolist() == [0.0, 100.0, 300.0]
    last = steps.iloc[-1]
    assert (last["reached"], last["events"], last["censored"]) == (1.0, 0, 0) and last["r_low"] < 1.0
    layers = km_chart(ChartData(), curves, "groks", "step", 300.0).to_dict()["layer"]
    assert len(layers) == 3  # band, budget, line: no empty layer of censored ticks
    assert pd.Series([m["mark"]["type"] for m in layers]).tolist() == ["area", "rule", "line"]
