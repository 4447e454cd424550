"""Time to an event, seed counts and the Multi-Bootstrap on synthetic studies (no training)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from analysis.analyze import analyze
from analysis.demo import write_demo_study
from analysis.errors import AnalysisError
from analysis.report import build_report, to_spec


def _rewrite(out: Path, study: str, table: str, **columns: object) -> None:
    """Set ``columns`` on every row of ``study``'s ``table`` files."""
    for path in (out / "tables" / table / f"study={study}").glob("*.parquet"):
        t = pq.read_table(path).to_pandas()
        for k, v in columns.items():
            t[k] = v
        pq.write_table(pq.read_table(path).from_pandas(t, preserve_index=False), path)


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    o = tmp_path_factory.mktemp("questions")
    points = [{"model.cell": "lstm"}, {"model.cell": "gru"}]
    write_demo_study(o, "grid", n_seeds=12, points=points, seed=21)
    manifest = o / "grid" / "study.json"
    m = json.loads(manifest.read_text())
    m["analysis"]["events"] = ["learns: val accuracy >= 0.6", "nope accuracy >= 0.5"]
    manifest.write_text(json.dumps(m))
    # six epochs logged of a budget of ten, early stopping on: runs that never reach an
    # event were censored by early stopping
    write_demo_study(o, "stopped", n_seeds=6, seed=22)
    cfg = json.dumps(
        {"train": {"max_epochs": 10, "selection": {"early_stop": True, "mode": "max"}}}
    )
    _rewrite(o, "stopped", "trials", config_json=cfg)
    return o


def test_declared_event_is_read_and_a_bad_one_noted(out: Path) -> None:
    doc = json.loads(analyze(out, "grid", "json", n_boot=200))
    (ev,) = doc["events"]
    assert ev["event"]["label"] == "learns: val accuracy >= 0.6" and ev["unit"] == "epoch"
    assert any("nope accuracy" in n and "skipped" in n for n in doc["notes"])
    for s in ev["summary"]:
        runs = [r for r in ev["runs"] if r["point"] == s["point"]]
        assert s["runs"] == len(runs) == 12
        assert s["events"] + s["censored_budget"] == 12  # the demo runs train to their budget
        # no censoring before the budget: the KM share reached is the plain share
        assert s["reached"] == pytest.approx(s["events"] / 12)


def test_event_option_replaces_declared_and_is_checked(out: Path) -> None:
    doc = json.loads(analyze(out, "grid", "json", n_boot=200, events=["short loss <= 0.3"]))
    assert [e["event"]["label"] for e in doc["events"]] == ["short loss <= 0.3"]
    with pytest.raises(AnalysisError) as err:
        analyze(out, "grid", "json", n_boot=200, events=["val accurcy >= 0.5"])
    msg = str(err.value)
    assert "--event" in msg and "'val accuracy'" in msg and "'very_long fpf'" in msg
    with pytest.raises(AnalysisError, match="SPLIT METRIC OP THRESHOLD"):
        analyze(out, "grid", events=["val accuracy => 0.5"])


def test_early_stopped_runs_are_informative_censoring(out: Path) -> None:
    doc = json.loads(analyze(out, "stopped", "json", n_boot=200, events=["val accuracy >= 0.999"]))
    (ev,) = doc["events"]
    assert {r["outcome"] for r in ev["runs"]} == {"early_stop"}
    assert ev["summary"][0]["censored_early_stop"] == 6 and ev["summary"][0]["budget"] == 10
    assert ev["summary"][0]["median"] is None and ev["summary"][0]["reached"] == 0
    (w,) = [w for w in doc["warnings"] if "informative censoring" in w]
    assert "6 of 6 runs" in w and "early_stop: false" in w


def test_diverged_runs_are_a_competing_outcome(out: Path, tmp_path: Path) -> None:
    o = tmp_path / "div"
    write_demo_study(o, "div", n_seeds=4, seed=23)
    path = o / "tables" / "runs" / "study=div" / "div-t00-1.parquet"
    t = pq.read_table(path).to_pandas().assign(status="diverged")
    pq.write_table(pq.read_table(path).from_pandas(t, preserve_index=False), path)
    doc = json.loads(analyze(o, "div", "json", n_boot=200, events=["val accuracy >= 0.999"]))
    (ev,) = doc["events"]
    s = ev["summary"][0]
    assert (s["runs"], s["diverged"], s["censored_budget"], s["events"]) == (4, 1, 3, 0)
    assert any("diverged before" in w and "competing" in w for w in doc["warnings"])


def test_seed_counts_and_power_warning(out: Path) -> None:
    doc = json.loads(analyze(out, "grid", "json", n_boot=200, half_width=0.05))
    c = doc["seed_counts"]
    assert c["half_width"] == 0.05 and c["difference"] == 0.05 and "Welch" in c["assumptions"]
    assert {(r["point"], r["split"]) for r in c["estimate"]} == {
        (p, s) for p in ("cell=lstm", "cell=gru") for s in ("short", "long", "very_long")
    }
    assert len(c["comparisons"]) == len(doc["verdict"]["comparisons"]) == 3
    weak = [r for r in c["comparisons"] if r["underpowered"]]
    assert weak and all(r["power"] < 0.8 for r in weak)
    assert any(w.startswith("underpowered:") for w in doc["warnings"])


def test_multiboot_rows_of_configs_and_splits(out: Path) -> None:
    doc = json.loads(analyze(out, "grid", "json", n_boot=300))
    rows = doc["multi_bootstrap"]["rows"]
    configs = [r for r in rows if r["kind"] == "configs"]
    splits = [r for r in rows if r["kind"] == "splits"]
    assert len(configs) == 3 and len(splits) == 2 * 3
    preds = pq.read_table(out / "tables" / "predictions" / "study=grid").to_pandas()
    for r in configs:
        assert r["paired_seeds"] and r["paired_examples"] and r["examples_a"] == 40
        assert r["low"] <= r["diff"] <= r["high"] and r["mean_a"] >= r["mean_b"]
        tid = {"cell=lstm": "grid-t00", "cell=gru": "grid-t01"}[r["a"]]
        sub = preds[(preds["trial_id"] == tid) & (preds["split"] == r["where"])]
        assert r["mean_a"] == pytest.approx(sub["correct"].mean())


def test_report_draws_km_and_seed_count_charts(out: Path) -> None:
    rep = build_report(out, "grid", n_boot=200, quiet=True)
    names = [p.name for p in rep.panels]
    assert {"time-to-val-accuracy", "seed-count", "seed-power"} <= set(names)
    spec = rep.spec()
    assert spec["datasets"]
    doc = json.loads(analyze(out, "grid", "json", n_boot=200))
    panels = {p.name: to_spec(p.chart, rep.store) for p in rep.panels}
    # every half-width curve runs past the seeds its split needs, so it crosses the target
    counts = panels["seed-count"]
    curves = pd.DataFrame(counts["datasets"][counts["layer"][0]["data"]["name"]])
    needed = [r["seeds_needed"] for r in doc["seed_counts"]["estimate"] if r["seeds_needed"]]
    assert needed and curves.groupby("group")["n"].max().min() >= max(needed)
    target = doc["seed_counts"]["estimate"][0]["half_width"]
    assert (curves.groupby("group")["half_width"].min() < target).all()
    # round ticks on the log axes, none past the axis' end
    for name in ("seed-count", "seed-power"):
        x = panels[name]["layer"][0]["encoding"]["x"]
        top = x["scale"]["domain"][1]
        ticks = x["axis"]["values"]
        assert ticks[:3] in ([1, 2, 5], [1, 10, 100]) and max(ticks) <= top
        assert all(str(t)[0] in "125" and set(str(t)[1:]) <= {"0"} for t in ticks)


def test_the_seed_count_chart_leaves_out_splits_where_every_seed_agrees() -> None:
    # a length study: every mode seed has exact 1.0 on len_15 (sd 0, a half-width of 0 at
    # every n); on a log axis that 0 left the whole chart without lines or ticks
    import pandas as pd

    from analysis import seedcount as sc
    from analysis.charts import ChartData
    from analysis.seed_charts import seed_count_chart

    values = pd.DataFrame({"point": ["kind=mode"] * 3 + ["kind=count"] * 3, "split": "len_15",
                           "value": [1.0, 1.0, 1.0, 0.2, 0.3, 0.25]})  # fmt: skip
    table = sc.seed_count_table(values, half_width_target=0.02, difference=0.05)
    assert table.set_index("point").loc["kind=mode", "sd"] == 0
    store = ChartData()
    spec = store.embed(seed_count_chart(store, table, "exact").to_dict())
    widths = [r[c] for rows in spec["datasets"].values() for r in rows
              for c in ("half_width", "half_width_now") if c in r]  # fmt: skip
    assert widths and all(w > 0 for w in widths)  # every value a log axis can place
    groups = {r["group"] for rows in spec["datasets"].values() for r in rows if "group" in r}
    assert groups == {"kind=count: len_15"}
    assert "not drawn, every seed the same (sd 0): kind=mode: len_15" in " ".join(spec["title"]["subtitle"])


def test_multiboot_pairs_examples_only_between_configs_of_one_task(tmp_path: Path) -> None:
    # a grid over task.kind (count, mode) on one data seed: example 3 of count's len_15 is
    # not example 3 of mode's, so each config draws its own examples; a grid over train.lr
    # (the same examples) shares them
    import pandas as pd

    out = tmp_path / "results"
    for name in ("kinds", "lrs"):
        write_demo_study(out, name, n_seeds=4, points=[{"p": 0}, {"p": 1}], seed=5)
    for path in (out / "tables" / "predictions" / "study=kinds").glob("kinds-t01-*.parquet"):
        t = pq.read_table(path).to_pandas()  # the second task's inputs and targets
        t = t.assign(input="mode " + t["input"], target="m" + t["target"], prediction="m" + t["prediction"])
        pq.write_table(pq.read_table(path).from_pandas(t, preserve_index=False), path)
    rows = {name: pd.DataFrame(json.loads(analyze(out, name, "json", n_boot=100))["multi_bootstrap"]["rows"])
            for name in ("kinds", "lrs")}  # fmt: skip
    configs = {name: r[r["kind"] == "configs"] for name, r in rows.items()}
    assert len(configs["kinds"]) == len(configs["lrs"]) == 3  # the three test splits
    assert not configs["kinds"]["paired_examples"].any() and configs["kinds"]["paired_seeds"].all()
    assert configs["lrs"]["paired_examples"].all()
    assert "paired_examples" in analyze(out, "kinds", "table", n_boot=100)


def test_symbol_rewriting_declares_when_it_learns() -> None:
    from analysis.survival import event_from_declaration
    from trainables.tasks.symbol_rewriting import SymbolRewriting, SymbolRewritingConfig

    task = SymbolRewriting(SymbolRewritingConfig())
    (decl,) = task.analysis()["events"]
    e = event_from_declaration(decl, "events[0]")
    assert e.label == "learns: val accuracy >= 0.5"
    assert task.split_roles()[e.split] == "val" and e.metric == task.primary_metric


def test_tuning_study_speaks_about_winner_and_runner_up(tmp_path: Path) -> None:
    points = [{"train.lr": 0.01 * i} for i in range(1, 7)]
    write_demo_study(tmp_path, "tune", n_seeds=3, points=points, kind="tune", seed=24)
    doc = json.loads(analyze(tmp_path, "tune", "json", n_boot=200))
    first = doc["verdict"]["comparisons"][0]
    pair = {first["better"], first["worse"]}
    assert {r["point"] for r in doc["seed_counts"]["estimate"]} == pair
    rows = doc["multi_bootstrap"]["rows"]
    assert rows and {r["a"] for r in rows if r["kind"] == "configs"} <= pair
    assert {r["where"] for r in rows if r["kind"] == "splits"} == pair


def test_the_km_chart_bands_the_runs_censored_at_the_budget() -> None:
    # 20 runs, none grokked by the budget 3000 (grokking_cpu at fraction 0.4): the table says
    # 0% reached, at most 16.8% (exact bound); the chart drew a flat 0 without a band
    import pandas as pd
    from scipy import stats as sps

    from analysis import survival as sv
    from analysis.charts import ChartData
    from analysis.seed_charts import km_chart

    outcomes = pd.DataFrame({"point": "p", "trial_id": "t", "seed": range(20), "status": "ok", "time": 3000.0,
                             "last_time": 3000.0, "budget": 3000.0, "outcome": "budget"})  # fmt: skip
    summary, curves = sv.event_summary(outcomes)
    high = sps.binomtest(0, 20).proportion_ci(method="exact").high
    assert summary["reached_high"].iloc[0] == pytest.approx(high)
    store = ChartData()
    spec = store.embed(km_chart(store, curves, "groks", "step", 3000.0).to_dict())
    (rows,) = [r for r in spec["datasets"].values() if r and "r_high" in r[0]]
    # step-after from 0 to the budget: the band the table gives, then the budget's own row
    assert [(r["time"], r["reached"], r["r_low"]) for r in rows] == [(0, 0, 0), (3000, 0, 0)]
    assert [r["r_high"] for r in rows] == pytest.approx([high, high], abs=1e-9)
    # titles wrapped to the chart (Vega does not wrap): grokking's event label in one line
    # and the one-line subtitle (about 100 characters, 560 px) drew the chart and the one beside
    # it 1,389 px wide, past a 1280 px window
    from analysis.seed_charts import TITLE_PX

    long = "groks: test accuracy >= 0.95 after train accuracy >= 0.99"
    title = km_chart(store, curves, long, "step", 3000.0).to_dict()["title"]
    lines = [*title["text"], *title["subtitle"]]
    assert len(title["text"]) == 2 and len(title["subtitle"]) >= 2
    assert max(len(line) for line in lines) <= TITLE_PX / 6
