"""The verdict on whole (synthetic) studies: analyze text/JSON, the report, readable tables."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests_support import CELL_MARKS_JS
from tests_support import open_report as _open

from analysis.analyze import SCHEMA, analyze
from analysis.db import connect, outside_views_sql
from analysis.demo import write_demo_study
from analysis.report import build_report


def _set_status(out: Path, study: str, stem: str, status: str) -> None:
    path = out / "tables" / "runs" / f"study={study}" / f"{stem}.parquet"
    t = pq.read_table(path).to_pandas()
    t["status"] = status
    pq.write_table(pq.read_table(path).from_pandas(t, preserve_index=False), path)


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    o = tmp_path_factory.mktemp("verdict")
    points = [{"model.cell": "lstm"}, {"model.cell": "gru"}, {"model.cell": "relu"}]
    write_demo_study(o, "grid", n_seeds=12, points=points, seed=21)
    _set_status(o, "grid", "grid-t00-3", "not_learned")  # one lstm run never learned
    write_demo_study(o, "small", n_seeds=4, points=points[:2], seed=22)
    write_demo_study(o, "one", n_seeds=5, seed=23)
    write_demo_study(o, "tune", n_seeds=3, points=[{"train.lr": 0.01 * i} for i in range(1, 7)],
                     kind="tune", seed=24)  # fmt: skip
    return o


def test_grid_verdict_in_json(out: Path) -> None:
    doc = json.loads(analyze(out, "grid", "json", n_boot=400))
    assert doc["schema"] == SCHEMA
    v = doc["verdict"]
    assert v["design"] == "grid" and v["model"] == "fixed" and "fixed-effects" in v["reason"]
    assert v["splits"] == ["short", "long", "very_long"]
    shares = {s["split"]: s for s in v["shares"]}
    long = shares["long"]
    assert 0 <= long["low"] <= long["between"] <= long["high"] <= 1
    assert long["configs"] == 3 and long["runs"] == 35 and long["seeds_min"] == 11
    assert long["seeds_share"] == pytest.approx(1 - long["between"])
    assert "the grid point (model.cell) explains" in v["sentence"].lower()
    assert f"{100 * shares['short']['between']:.0f}%" in v["sentence"]
    assert len(v["comparisons"]) == 9  # 3 pairs x 3 splits, one Holm family
    assert all(c["p_holm"] >= c["p"] for c in v["comparisons"])
    (lstm,) = [e for e in v["excluded"] if e["point"] == "cell=lstm"]
    assert (lstm["runs"], lstm["ok"], lstm["not_learned"]) == (12, 11, 1)
    assert any("1 never learned" in w for w in v["warnings"])
    # the not_learned run is left out of the summary, and counted apart
    row = next(
        r for r in doc["summary"]
        if (r["point"], r["split"], r["metric"]) == ("cell=lstm", "long", "accuracy")
    )  # fmt: skip
    assert (row["n"], row["excluded"], row["warn"]) == (11, 1, "")


def test_intervals_stay_in_range_near_one(out: Path) -> None:
    doc = json.loads(analyze(out, "grid", "json", n_boot=400))
    acc = [r for r in doc["summary"] if r["metric"] == "accuracy"]
    assert any(r["mean"] > 0.97 for r in acc)  # the train split: accuracies near 1
    for r in acc:
        assert 0 <= r["min"] <= r["ci_low"] <= r["mean"] <= r["ci_high"] <= r["max"] <= 1
        assert r["ci_method"].startswith("bootstrap") or r["ci_method"] == "constant"


def test_few_seeds_are_flagged_and_single_config_has_no_verdict(out: Path) -> None:
    text = analyze(out, "small", n_boot=300)
    assert "n<10" in text and "indicative only" in text
    doc = json.loads(analyze(out, "small", "json", n_boot=300))
    assert all(r["warn"] == "n<10" for r in doc["summary"])
    assert all(c["warn"] == "n<10" for c in doc["verdict"]["comparisons"])
    assert all(s["warn"] == "n<10" for s in doc["scatter"])
    one = json.loads(analyze(out, "one", "json", n_boot=300))["verdict"]
    assert one["design"] == "single" and "one config" in one["reason"]
    # only the seed moves a one-config study: its sentence says by how much (headline split)
    runs = pq.read_table(out / "tables" / "evals" / "study=one").to_pandas()
    head = runs[(runs["split"] == one["splits"][0]) & (runs["metric"] == one["metric"])]["value"]
    assert len(head) == 5 and head.nunique() == 5
    assert one["sentence"].startswith("One config, so only the seed moves the result: across 5 seeds")
    assert f"runs from {head.min():.4g} to {head.max():.4g} (sd {head.std():.2g}), mean {head.mean():.4g}" in one["sentence"]
    assert "Fewer than 10 seeds" in one["sentence"]


def test_tuning_verdict_has_expected_best_and_winner_vs_runner_up(out: Path) -> None:
    doc = json.loads(analyze(out, "tune", "json", n_boot=300))
    v = doc["verdict"]
    assert v["design"] == "tune" and v["shares"] == [] and "adaptively" in v["reason"]
    em = pd.DataFrame(v["expected_best"])
    assert em["n"].tolist() == list(range(1, 7))
    assert em["expected_best"].is_monotonic_increasing
    trials = pq.read_table(out / "tables" / "trials" / "study=tune").to_pandas()
    assert em["expected_best"].iloc[-1] <= trials["objective"].max() + 1e-12
    assert em["expected_best"].iloc[0] == pytest.approx(trials["objective"].mean())
    first = v["comparisons"][0]
    assert first["split"] == "val_ood accuracy (objective)"
    assert "Best of 6 candidates" in v["sentence"] and "Winner vs runner-up" in v["sentence"]
    # the winner is named as the comparisons name it (its parameters), and sits in their better column
    named = v["sentence"].split("Best of 6 candidates: ")[1].split(" (objective")[0]
    assert first["better"] == named and first["worse"] != named, (named, first)


def test_analyze_text_shows_the_verdict_first(out: Path) -> None:
    text = analyze(out, "grid", n_boot=300)
    head = text.split("Summary across ok runs")[0]
    assert "Verdict: does the config or the seed decide?" in head
    assert "Share of accuracy variance between configs" in head
    assert "Config vs config" in head and "Runs left out of every number" in head


def _with_study_column(src: Path, dst: Path) -> None:
    """Copy ``src``'s tables as older fineline wrote them: each file with a ``study`` column."""
    for f in (src / "tables").rglob("*.parquet"):
        to = dst / f.relative_to(src)
        to.parent.mkdir(parents=True, exist_ok=True)
        t = pq.read_table(f, partitioning=None)
        study = f.parent.name.removeprefix("study=")
        pq.write_table(t.add_column(0, "study", pa.array([study] * len(t), pa.string())), to)


def test_tables_read_directly_by_pandas_and_duckdb(out: Path, tmp_path: Path) -> None:
    # the files hold no study column (the study= folder names it): pandas and the DuckDB
    # recipe read them with every default
    direct = pd.read_parquet(out / "tables" / "evals")
    assert set(direct["study"].astype(str)) == {"grid", "small", "one", "tune"}
    con = duckdb.connect()
    con.execute(outside_views_sql(out))
    counts = dict(con.execute("SELECT study, count(*) FROM evals GROUP BY study").fetchall())
    assert counts == direct.groupby("study", observed=True).size().to_dict()
    # files of older versions carry the column as well: pandas reads them with
    # partitioning=None, and fineline's own views read both layouts alike
    old = tmp_path / "old"
    _with_study_column(out, old)
    assert len(pd.read_parquet(old / "tables" / "evals", partitioning=None)) == len(direct)
    a, b = connect(out), connect(old)
    q = "SELECT study, split, round(sum(value), 9) FROM evals GROUP BY ALL ORDER BY ALL"
    assert a.execute(q).fetchall() == b.execute(q).fetchall()


def test_outside_views_hide_uncommitted_rows(out: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "tables" / "runs" / "study=one" / "one-t00-0.parquet").unlink()  # uncommit seed 0
    con = duckdb.connect()
    con.execute(outside_views_sql(copy))
    seeds = {
        r[0] for r in con.execute("SELECT DISTINCT seed FROM evals WHERE study='one'").fetchall()
    }
    assert seeds == {1, 2, 3, 4}
    raw = pd.read_parquet(copy / "tables" / "evals")
    assert 0 in set(raw[raw["study"] == "one"]["seed"])  # the leftover rows are still on disk


@pytest.fixture(scope="module")
def grid_report(out: Path) -> Any:
    return build_report(out, "grid", n_boot=300, quiet=True)


def test_report_shows_the_verdict_and_rliable_charts_in_chromium(
    grid_report: Any, browser: Any, tmp_path: Path
) -> None:
    page_path = grid_report.save(tmp_path / "grid.html")
    names = [p.name for p in grid_report.panels]
    assert names[:3] == ["distribution", "improvement", "performance-profile"]
    page, errors = _open(browser, page_path)
    try:
        assert page.evaluate("window.fineline.error") is None
        verdict = page.inner_text("#verdict")
        assert grid_report.verdict.sentence in verdict
        assert "between configs (omega², 95%)" in verdict and "P(improvement)" in verdict
        assert "never learned" in verdict and "warning:" in verdict
        cells = page.evaluate(CELL_MARKS_JS)
        assert not [c for c, marks in cells if marks == 0], cells
        assert errors == []
        text = page.inner_text("body")
        assert "resolved config per grid point" in text
        # the page fits a laptop's 1280 px window (the seed-count and power charts' one-line
        # subtitles, side by side, drew it wider; a Kaplan-Meier chart's beside either, 1,389 px)
        page.set_viewport_size({"width": 1280, "height": 1000})
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    finally:
        page.close()


@pytest.mark.slow  # ~6 s: vl-convert renders PNG, SVG and PDF (test_report.py exports SVG in the default run)
def test_image_exports_keep_the_header(grid_report: Any, tmp_path: Path) -> None:
    svg = grid_report.save(tmp_path / "grid.svg").read_text()
    assert "fineline study report: grid" in svg and "verdict: " in svg
    pdf = grid_report.save(tmp_path / "grid.pdf").read_bytes()
    assert pdf[:5] == b"%PDF-" and len(pdf) > 10_000


def test_a_no_verdict_reason_is_said_once(tmp_path: Path) -> None:
    write_demo_study(tmp_path, "lone", n_seeds=1, seed=4)  # one config, one seed: no verdict
    text = analyze(tmp_path, "lone", n_boot=50)
    assert "No verdict: one config: nothing to compare between configs" in text
    assert text.count("nothing to compare between configs") == 1, text[:600]
