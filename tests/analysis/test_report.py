"""The HTML report opened in headless Chromium, image export, and ``analyze``."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from scipy import stats as sps
from tests_support import CELL_MARKS_JS
from tests_support import open_report as _open

from analysis.analyze import analyze
from analysis.demo import write_demo_study
from analysis.errors import AnalysisError
from analysis.report import Report, build_report, write_report


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    o = tmp_path_factory.mktemp("results")
    write_demo_study(o, "demo", n_seeds=5, seed=11)  # 3 test splits, 5 seeds, curves
    write_demo_study(
        o, "grid", n_seeds=4, points=[{"model.cell": "lstm"}, {"model.cell": "gru"}], seed=12
    )
    write_demo_study(
        o,
        "tune",
        n_seeds=2,
        points=[{"train.lr": 0.01 * i} for i in range(1, 6)],
        kind="tune",
        seed=13,
    )
    return o


@pytest.fixture(scope="module")
def reports(out: Path) -> dict[str, Report]:
    """Each study's report, built once and saved in several formats by the tests."""
    return {s: build_report(out, s, n_boot=500, quiet=True) for s in ("grid", "tune")}


@pytest.fixture(scope="module")
def pages(out: Path, reports: dict[str, Report]) -> dict[str, Path]:
    """The HTML page of each study (demo's through write_report, at its default place)."""
    written = {"demo": write_report(out, "demo", n_boot=500)}  # with progress on stderr
    for study, report in reports.items():
        written[study] = report.save(out / f"{study}.html")
    return written


@pytest.mark.parametrize(
    ("study", "min_charts"),
    [("demo", 7), ("grid", 7), ("tune", 9)],
)
def test_report_renders_every_chart_in_chromium(
    pages: dict[str, Path], browser: Any, tmp_path: Path, study: str, min_charts: int
) -> None:
    page, errors = _open(browser, pages[study])
    try:
        assert page.evaluate("window.fineline.error") is None
        cells = page.evaluate(CELL_MARKS_JS)
        assert len(cells) >= min_charts, cells
        empty = [name for name, marks in cells if marks == 0]
        assert not empty, f"charts without marks: {empty}"
        assert errors == []
        shot = tmp_path / f"{study}.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        page.close()


def test_clicking_a_seed_highlights_it_in_other_charts(
    pages: dict[str, Path], browser: Any
) -> None:
    page, errors = _open(browser, pages["demo"])
    try:
        dots = page.locator("#charts .mark-symbol path")
        target = next(
            i
            for i in range(dots.count())
            if "seed: 3;" in (dots.nth(i).get_attribute("aria-label") or "")
        )
        dots.nth(target).click()
        page.wait_for_timeout(300)
        store = page.evaluate("window.fineline.view.data('seed_pick_store')")
        assert [s["values"] for s in store] == [[3]]
        labels = page.evaluate(
            "() => Array.from(document.querySelectorAll('#charts .mark-symbol path'))"
            ".map(e => [e.getAttribute('aria-label') || '', e.getAttribute('opacity')])"
        )
        seed3 = [op for label, op in labels if "seed: 3;" in label]
        others = [op for label, op in labels if "seed: " in label and "seed: 3;" not in label]
        assert len(seed3) >= 5 and set(seed3) == {"0.9"}  # every chart's dot of seed 3
        assert others and set(others) == {"0.2"}
        assert errors == []
    finally:
        page.close()


def test_report_is_self_contained_with_header(out: Path, pages: dict[str, Path]) -> None:
    path = pages["demo"]
    assert path == out / "demo" / "report.html"
    text = path.read_text()
    assert not re.search(r"<script[^>]*\bsrc=", text), "scripts must be inlined"
    assert not re.search(r"<link[^>]*\bhref=[\"']https?:", text)
    assert "vegaEmbed" in text
    for expected in (
        "demo_task",
        "demo_model",
        "0000000",
        "5 done of 5 planned",
        "resolved config",
    ):
        assert expected in text


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_png_export(out: Path, tmp_path: Path) -> None:
    path = write_report(out, "demo", tmp_path / "charts.png", n_boot=100, quiet=True)
    assert path == tmp_path / "charts.png"
    width, height = _png_size(path.read_bytes())
    assert width > 500 and height > 1000


@pytest.mark.slow  # 15-20 s of subprocess study; CI's default run keeps under 15 minutes
def test_svg_and_directory_export(reports: dict[str, Report], tmp_path: Path) -> None:
    report = reports["grid"]
    svg = report.save(tmp_path / "charts.svg")
    assert svg.read_text().lstrip().startswith("<svg")
    folder = report.save(tmp_path / "images")
    files = sorted(p.name for p in folder.iterdir())
    assert len(files) == len(report.panels) + 1
    # the verdict first, as in every other form of the report (before: the charts alone)
    assert files[:2] == ["00-verdict.png", "01-distribution.png"] and any("scatter" in f for f in files)
    assert all(_png_size((folder / f).read_bytes())[0] > 100 for f in files)
    verdict = report.save(tmp_path / "verdict.svg")  # the same header, as text in an SVG
    assert " ".join(report.verdict.sentence.split()[:3]) in verdict.read_text()  # its first words
    # a folder named with a suffix (`study report --to figs.v2/`, `--to figs.png/`): one PNG
    # per chart inside it, not one image called figs.png (Path() drops the trailing slash)
    for name in ("figs.v2", "figs.png"):
        named = report.save(tmp_path / name, folder=True)
        assert named.is_dir() and sorted(p.name for p in named.iterdir()) == files


def test_report_errors_are_clear(out: Path, tmp_path: Path) -> None:
    with pytest.raises(AnalysisError, match="known: demo, grid, tune"):
        write_report(out, "nope", tmp_path / "x.html", quiet=True)
    with pytest.raises(AnalysisError, match=r"\.html, \.png, \.svg or \.pdf"):
        write_report(out, "demo", tmp_path / "x.txt", quiet=True)


def test_analyze_text_and_json_agree_with_scipy(out: Path) -> None:
    evals = pq.read_table(out / "tables" / "evals" / "study=demo").to_pandas()
    acc = evals[evals["metric"] == "accuracy"].pivot(index="seed", columns="split", values="value")
    expected = sps.pearsonr(acc["short"], acc["long"]).statistic
    doc = json.loads(analyze(out, "demo", "json", n_boot=200))
    (matrix,) = doc["correlations"]
    assert matrix["splits"] == ["short", "long", "very_long"]
    r = np.array(matrix["r"])
    assert r[0, 1] == pytest.approx(expected) and np.allclose(r, r.T)
    assert matrix["n"][0][1] == 5
    summary = {(s["split"], s["metric"]): s for s in doc["summary"]}
    assert summary[("long", "accuracy")]["mean"] == pytest.approx(acc["long"].mean())
    assert summary[("long", "accuracy")]["n"] == 5
    assert [r["over"] for r in doc["regressions"]] == ["runs", "checkpoints"]
    fpf = evals[(evals["split"] == "very_long") & (evals["metric"] == "fpf")].set_index("seed")[
        "value"
    ]
    loss = evals[(evals["split"] == "val") & (evals["metric"] == "loss")].set_index("seed")["value"]
    fit = sps.linregress(-np.log(loss.sort_index()), fpf.sort_index())
    assert doc["regressions"][0]["slope"] == pytest.approx(fit.slope)
    assert doc["regressions"][0]["r2"] == pytest.approx(fit.rvalue**2)
    text = analyze(out, "demo")
    assert "Summary across ok runs" in text and "Regressions declared by the task" in text
    assert f"{expected:.3f}" in text and "(n = 5 runs per pair)" in text
    with pytest.raises(AnalysisError, match="table' or 'json"):
        analyze(out, "demo", "csv")


def test_analyze_without_manifest(out: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "results"
    shutil.copytree(out / "tables", copy / "tables")
    text = analyze(copy, "grid")
    assert "cell=gru" in text and "cell=lstm" in text  # points from the trials table
    assert "Correlation across seeds of test-split accuracy" in text
