"""Decision surfaces of the 2-D toy: the declaration, the grid layout, the contour, the chart;
and learning curves that put grid points (``task.setting`` A and B) side by side."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from tests_support import open_report

from analysis.boundary import contour_segments, grid_axis, point_grids, surface, surface_cells
from analysis.demo import write_demo_study
from analysis.errors import AnalysisError
from analysis.manifest import BoundaryDecl, parse_declarations, parse_manifest
from analysis.report import Report, build_report, to_spec

GRID = (-1.0, 1.0, 11)
SETTINGS = [{"task.setting": "A"}, {"task.setting": "B"}]
N_SEEDS = 3


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    o = tmp_path_factory.mktemp("toy_results")
    write_demo_study(
        o, "toy", n_seeds=N_SEEDS, points=SETTINGS, decision_grid=GRID, epochs=5, n_examples=50
    )
    return o


@pytest.fixture(scope="module")
def report(out: Path) -> Report:
    return build_report(out, "toy", n_boot=200, quiet=True)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def test_toy2d_declaration_and_rendered_predictions_map_onto_its_grid() -> None:
    """What the real task declares and renders is read back at the task's own coordinates."""
    from trainables.tasks.toy2d import Toy2D, Toy2DConfig

    task = Toy2D(Toy2DConfig(grid=(-2.0, 1.5, 7)))  # asymmetric: a swapped axis would show
    decl = parse_declarations(task.analysis())
    assert decl.unknown == ()
    d = decl.decision_boundary
    assert d == BoundaryDecl(-2.0, 1.5, 7, split="grid", metric="p_y1", axes=("x1", "x2"))
    split = task.build(data_seed=0).splits[d.split]
    x = split.data.x  # (49, 2)
    p = _sigmoid(3 * x[:, 0] - x[:, 1] + 0.2)  # depends on both axes, differently
    preds = pd.DataFrame(
        {
            "trial_id": "t",
            "point": "default",
            "seed": 0,
            "example_id": split.data.ids,
            "prediction": [task.render(split, np.array([1 - q, q])) for q in p],
        }
    )
    cells, dropped = surface_cells(preds, d)
    assert dropped == 0 and len(cells) == 49
    np.testing.assert_allclose(cells[["x1", "x2"]].to_numpy(), x, atol=1e-6)
    np.testing.assert_allclose(cells["p"], p, atol=1e-6)
    arr = surface(preds, d)  # [i1, i2] at (g[i1], g[i2])
    g = grid_axis(d)
    i1, i2 = 5, 1
    assert arr[i1, i2] == pytest.approx(_sigmoid(3 * g[i1] - g[i2] + 0.2), abs=1e-6)


def test_declaration_forms_defaults_and_errors() -> None:
    d = parse_declarations({"charts": [{"type": "decision_boundary", "grid": [0, 2, 5]}]})
    assert d.decision_boundary == BoundaryDecl(0.0, 2.0, 5) and d.unknown == ()
    for bad in ([1, 1, 5], [0, 1, 1], [0, 1], "0..1", [0, 1, 2.5]):
        with pytest.raises(AnalysisError, match="low < high and an integer n >= 2"):
            parse_declarations({"decision_boundary": {"grid": bad}})
    with pytest.raises(AnalysisError, match=r"expected \{'grid'"):
        parse_declarations({"decision_boundary": [0, 1, 5]})
    m = parse_manifest(
        {
            "analysis": {"decision_boundary": {"grid": [-1, 1, 41]}},
            "points": [
                {"trial_id": "a", "point": {"task.grid": [-2, 2, 21]}},
                {"trial_id": "b", "point": {"model.hidden": 8}},
            ],
        }
    )
    decl = m.declarations.decision_boundary
    assert decl is not None
    grids = point_grids(m, decl)
    assert list(grids) == ["a"] and (grids["a"].low, grids["a"].n) == (-2.0, 21)


def test_contour_of_a_linear_surface_is_its_level_line() -> None:
    axis = np.linspace(-1.0, 1.0, 9)
    g1, g2 = np.meshgrid(axis, axis, indexing="ij")
    values = 0.5 + 0.2 * (g1 - 0.4 * g2 - 0.1)  # level 0.5 on x1 = 0.1 + 0.4 x2
    seg = contour_segments(values, axis)
    assert seg.shape[1] == 4 and len(seg) >= 8  # crosses every row of cells
    for a, b in ((0, 1), (2, 3)):
        np.testing.assert_allclose(seg[:, a] - 0.4 * seg[:, b] - 0.1, 0, atol=1e-12)
    length = np.hypot(seg[:, 2] - seg[:, 0], seg[:, 3] - seg[:, 1]).sum()
    assert length == pytest.approx(2 * np.hypot(1, 0.4))  # x2 from -1 to 1, unclipped
    assert contour_segments(values + 1, axis).shape == (0, 4)
    holed = values.copy()
    holed[4, 4] = np.nan  # at (0, 0), next to the line: the cells around it lose theirs
    cut = contour_segments(holed, axis)
    assert 0 < len(cut) < len(seg) and np.isfinite(cut).all()


def _unordered(seg: np.ndarray) -> set[frozenset[tuple[float, float]]]:
    return {frozenset({(s[0], s[1]), (s[2], s[3])}) for s in np.round(seg, 9).tolist()}


def test_saddle_cells_get_two_segments_paired_by_the_centre() -> None:
    axis = np.array([0.0, 1.0])
    seg = contour_segments(np.array([[0.0, 1.0], [1.0, 0.0]]), axis)  # centre 0.5: above
    # corners (0, 0) and (1, 1) are below, unlike the centre: each is cut off alone
    assert _unordered(seg) == _unordered(np.array([[0.5, 0, 0, 0.5], [0.5, 1, 1, 0.5]]))
    seg = contour_segments(np.array([[1.0, 0.0], [0.0, 1.0]]), axis)  # centre 0.5: above
    # now (0, 1) and (1, 0) are the corners below
    assert _unordered(seg) == _unordered(np.array([[0, 0.5, 0.5, 1], [1, 0.5, 0.5, 0]]))


# One [rects, rules] per facet panel (the items of a facet's ``*_cell`` group mark).
FACET_CELLS_JS = """() => {
  const cells = Array.from(document.querySelectorAll('#charts svg g.mark-group'))
    .filter(g => /_cell( |$)/.test(g.getAttribute('class')))
    .flatMap(g => Array.from(g.children).filter(c => c.tagName === 'g'));
  return cells.map(c => [
    c.querySelectorAll('.mark-rect path').length,
    c.querySelectorAll('.mark-rule line, .mark-rule path').length,
  ]);
}"""


def _tooltip(label: str) -> dict[str, str]:
    """A mark's aria-label as a dict (d3-format writes the minus sign as U+2212)."""
    return dict(part.split(": ", 1) for part in label.replace("\u2212", "-").split("; "))


@pytest.mark.slow  # ~10 s: Chromium (test_report.py renders every chart kind in the default run)
def test_report_draws_the_decision_boundary_per_seed_in_chromium(
    out: Path, report: Report, browser: Any
) -> None:
    assert "decision-boundary" in [p.name for p in report.panels]
    page, errors = open_report(browser, report.save(out / "toy.html"))
    try:
        assert page.evaluate("window.fineline.error") is None
        n = GRID[2]
        cells = page.evaluate(FACET_CELLS_JS)
        assert len(cells) == len(SETTINGS) * N_SEEDS, cells  # one panel per (setting, seed)
        assert all(rects == n * n and rules > 0 for rects, rules in cells), cells
        labels = page.evaluate(
            "() => Array.from(document.querySelectorAll('#charts .mark-rect path'))"
            ".map(e => e.getAttribute('aria-label') || '').filter(l => l.includes('p_y1: '))"
        )
        assert len(labels) == len(SETTINGS) * N_SEEDS * n * n
        # a tooltip's value is the stored prediction at example i1 * n + i2 of its seed
        preds = pq.read_table(out / "tables" / "predictions" / "study=toy").to_pandas()
        g = np.linspace(*GRID)
        for label in labels[:: len(labels) // 7]:
            tip = _tooltip(label)
            i1 = int(np.argmin(np.abs(g - float(tip["x1"]))))
            i2 = int(np.argmin(np.abs(g - float(tip["x2"]))))
            trial = {"setting=A": "toy-t00", "setting=B": "toy-t01"}[tip["point"]]
            row = preds[
                (preds["trial_id"] == trial)
                & (preds["seed"] == int(tip["seed"]))
                & (preds["split"] == "grid")
                & (preds["example_id"] == i1 * n + i2)
            ]
            assert float(row["prediction"].iloc[0]) == pytest.approx(float(tip["p_y1"]), abs=6e-4)
        # clicking a cell selects its seed for every chart
        rect = page.locator("#charts .mark-rect path[aria-label*='p_y1: ']").nth(n * n + 3)
        seed = int(_tooltip(rect.get_attribute("aria-label") or "")["seed"])
        rect.click()
        page.wait_for_timeout(300)
        store = page.evaluate("window.fineline.view.data('seed_pick_store')")
        assert [s["values"] for s in store] == [[seed]]
        assert errors == []
    finally:
        page.close()


def test_learning_curves_compare_settings_per_split(out: Path, report: Report) -> None:
    """One panel per curve split; in each, one mean line and 95% bootstrap band per setting."""
    panel = next(p for p in report.panels if p.name == "curves-accuracy")
    spec = to_spec(panel.chart, report.store)
    metrics = pq.read_table(out / "tables" / "metrics" / "study=toy").to_pandas()
    acc = metrics[metrics["metric"] == "accuracy"]
    assert [sorted(set(acc["split"]))] == [["test", "train_eval"]]
    panels = spec["hconcat"]
    titles = [p["title"]["text"] for p in panels]
    assert [re.match(r"(\w+) accuracy", t).group(1) for t in titles] == ["train_eval", "test"]
    assert all(p["title"]["subtitle"][0].startswith("mean and 95% bootstrap band") for p in panels)
    for split, p in zip(["train_eval", "test"], panels, strict=True):
        band = next(layer for layer in p["layer"] if layer["mark"]["type"] == "area")
        assert band["encoding"]["color"]["field"] == "point"
        assert band["encoding"]["y"]["field"] == "low" and band["encoding"]["y2"]["field"] == "high"
        rows = pd.DataFrame(spec["datasets"][band["data"]["name"]])
        assert set(rows["split"]) == {split} and set(rows["point"]) == {"setting=A", "setting=B"}
        sub = acc[acc["split"] == split]
        trial_point = {"toy-t00": "setting=A", "toy-t01": "setting=B"}
        expected = (
            sub.assign(point=sub["trial_id"].map(trial_point))
            .groupby(["point", "step"])["value"]
            .agg(["mean", "min", "max"])
        )
        got = rows.set_index(["point", "step"])[["mean", "low", "high"]].sort_index()
        np.testing.assert_allclose(got["mean"], expected["mean"], rtol=1e-9)
        assert (expected["min"] <= got["low"] + 1e-12).all()
        assert (got["low"] <= got["mean"] + 1e-12).all() and (
            got["mean"] <= got["high"] + 1e-12
        ).all()
        assert (got["high"] <= expected["max"] + 1e-12).all()
        assert len(got) == 2 * 5  # two settings x five logged steps
    assert spec["resolve"]["scale"]["y"] == "shared"
    # whole-number steps on x; legend swatches drawn as the mean lines, not the pale bands
    line = next(layer for layer in panels[0]["layer"] if layer["mark"]["type"] == "line")
    assert line["encoding"]["x"]["axis"] == {"format": ",d", "tickMinStep": 1}
    assert line["encoding"]["color"]["legend"]["symbolType"] == "stroke"


def test_loss_panels_get_their_own_y_axis() -> None:
    """Rates in [0, 1] share one y axis across splits; a loss gets one per split."""
    from analysis.charts import ChartData
    from analysis.curve_charts import learning_curves

    def agg(scale: float) -> pd.DataFrame:
        rows = [(p, s, step, m * scale, m * scale * 0.9, m * scale * 1.1)
                for p in ("lr=0.1", "lr=1") for s, m in (("train", 0.05), ("long", 0.8))
                for step in (1, 2)]  # fmt: skip
        return pd.DataFrame(rows, columns=["point", "split", "step", "mean", "low", "high"])

    store = ChartData()
    shared = to_spec(learning_curves(store, agg(1.0), None, "accuracy", ["train", "long"]), store)
    own = to_spec(learning_curves(store, agg(3.0), None, "loss", ["train", "long"]), store)
    assert shared["resolve"]["scale"]["y"] == "shared" and own["resolve"]["scale"]["y"] == "independent"


def test_boundary_data_caps_seeds_and_drops_unusable_rows(out: Path) -> None:
    from analysis.boundary import boundary_data
    from analysis.db import connect
    from analysis.queries import split_predictions

    con = connect(out, studies=["toy"])
    try:
        preds = split_predictions(con, "toy", "grid")
    finally:
        con.close()
    n = GRID[2]
    assert len(preds) == len(SETTINGS) * N_SEEDS * n * n
    bad = preds.iloc[:2].assign(example_id=[n * n, 5], prediction=["0.5", "1 (p=0.9)"])
    decl = BoundaryDecl(*GRID)
    data = boundary_data(pd.concat([preds, bad], ignore_index=True), decl, max_seeds=2)
    kept = data.cells.groupby("point")["seed"].unique()
    assert {p: sorted(s) for p, s in kept.items()} == {"setting=A": [0, 1], "setting=B": [0, 1]}
    assert len(data.cells) == 2 * 2 * n * n
    assert any("2 runs left out" in note for note in data.notes), data.notes
    assert any("2 predictions on split 'grid' dropped" in note for note in data.notes)
    half = 1 / (n - 1)
    assert data.extent == pytest.approx((-1 - half, 1 + half))
    assert set(data.segments["seed"]) <= {0, 1} and len(data.segments) > 0
