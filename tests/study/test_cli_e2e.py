"""End to end through the real CLI: a tiny study on a real local Ray -> Parquet -> SQL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from tests_support import TINY_STUDY

from trainables.runtime import cpu_model

TINY = TINY_STUDY


def study(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(
        [sys.executable, "-m", "study.cli", *args], capture_output=True, text=True, timeout=600,
        env={"RAY_USAGE_STATS_ENABLED": "0", "PATH": "/usr/bin:/bin", **_py_env()},
    )
    if check and res.returncode != 0:
        raise AssertionError(f"study {' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


def _py_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k in ("HOME", "PYTHONPATH", "VIRTUAL_ENV", "LANG")}


def sql(out: Path, query: str) -> list[dict]:
    return json.loads(study("sql", "--out", str(out), "--format", "json", query).stdout)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("e2e")
    cfg = root / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    out = root / "results"
    study("run", str(cfg), "--out", str(out), "--num-cpus", "2")
    return cfg, out


def test_run_lands_one_eval_row_per_seed_split_metric(finished: tuple[Path, Path]) -> None:
    _, out = finished
    rows = sql(out, "SELECT seed, split, metric, value FROM evals WHERE study = 'tiny'")
    splits = {"train", "val", "val_ood", "standard", "repeat", "short", "long"}
    keys = {(r["seed"], r["split"], r["metric"]) for r in rows}
    assert len(keys) == len(rows), "duplicate evals rows"
    assert {r["seed"] for r in rows} == {0, 1, 2}
    assert {r["split"] for r in rows} == splits
    assert len(rows) == 3 * len(splits) * 3  # loss, accuracy, exact
    assert all(0.0 <= r["value"] <= 1.0 for r in rows if r["metric"] == "accuracy")
    runs = sql(out, "SELECT seed, status, selected_epoch, init_seed, data_seed FROM runs ORDER BY seed")
    assert [r["seed"] for r in runs] == [0, 1, 2]
    assert len({r["init_seed"] for r in runs}) == 3 and len({r["data_seed"] for r in runs}) == 1
    trials = sql(out, "SELECT unit_id, node, bundle_size, train_lr, dropout_masks, numerics FROM trials "
                      "WHERE study = 'tiny'")  # fmt: skip
    assert sorted(t["bundle_size"] for t in trials) == [1, 2] and all(t["node"] for t in trials)
    assert all(t["train_lr"] == 0.125 and t["dropout_masks"] == "generator" for t in trials)
    here = f"{cpu_model()}; torch {torch.backends.cpu.get_cpu_capability()}; "
    assert all(t["numerics"].startswith(here) and t["numerics"].endswith("; 1 thread") for t in trials)
    # where each unit's time went, each part measured (> 0), the runs' wall_s their training part
    timed = sql(out, "SELECT t.unit_id, t.train_s, t.eval_s, t.final_eval_s, max(r.wall_s) AS wall_s, "
                     "min(r.wall_s) AS wall_min FROM trials t JOIN runs r USING (study, unit_id) GROUP BY ALL")
    assert len(timed) == 2 and all(min(t["train_s"], t["eval_s"], t["final_eval_s"]) > 0 for t in timed), timed
    assert all(t["wall_s"] == t["wall_min"] and t["wall_s"] == pytest.approx(t["train_s"] + t["eval_s"]) for t in timed)
    curves = sql(out, "SELECT DISTINCT epoch FROM metrics WHERE split = 'val' AND metric = 'accuracy' ORDER BY 1")
    assert [c["epoch"] for c in curves] == [1, 2]
    preds = sql(out, "SELECT split, count(*) AS n FROM predictions WHERE seed = 0 GROUP BY split ORDER BY split")
    assert {p["split"]: p["n"] for p in preds} == {"long": 40, "repeat": 40, "short": 40, "standard": 40}


def test_rerun_and_growth_never_duplicate(finished: tuple[Path, Path]) -> None:
    cfg, out = finished
    before = sql(out, "SELECT count(*) AS n FROM metrics")[0]["n"]
    res = study("run", str(cfg), "--out", str(out), "--num-cpus", "2")
    assert "already committed" in res.stderr + res.stdout
    assert sql(out, "SELECT count(*) AS n FROM metrics")[0]["n"] == before
    study("run", str(cfg), "--out", str(out), "--num-cpus", "2", "--seeds", "4")
    runs = sql(out, "SELECT seed, count(*) AS n FROM runs GROUP BY seed ORDER BY seed")
    assert [(r["seed"], r["n"]) for r in runs] == [(0, 1), (1, 1), (2, 1), (3, 1)]
    status = json.loads(study("status", "tiny", "--out", str(out), "--format", "json").stdout)
    assert status[0]["planned"] == 4 and status[0]["done"] == 4 and status[0]["pending"] == 0
    # fewer seeds than the study has remove none, and say so (it was silent); a seed of the
    # kept ones not committed (here: seed 3's commit marker gone) runs, as `study resume` would
    # run it (before: planned at 2 seeds, "all 2 runs already committed", exit 0, one pending)
    (marker,) = (out / "tables" / "runs" / "study=tiny").glob("*-3.parquet")
    marker.unlink()
    res = study("run", str(cfg), "--out", str(out), "--num-cpus", "2", "--seeds", "2")
    assert "note: study 'tiny' already plans 4 seeds for 1 of its configs; asking for 2 removes none" in res.stderr
    assert "4/4 runs committed (1 run now)" in res.stdout, res.stdout
    assert sql(out, "SELECT count(*) AS n FROM runs")[0]["n"] == 4
    # `study resume --seeds` grows it from its manifest: no study file or overrides to retype
    study("resume", "tiny", "--out", str(out), "--num-cpus", "2", "--seeds", "5")
    runs = sql(out, "SELECT seed, count(*) AS n FROM runs GROUP BY seed ORDER BY seed")
    assert [(r["seed"], r["n"]) for r in runs] == [(s, 1) for s in range(5)]
    status = json.loads(study("status", "tiny", "--out", str(out), "--format", "json").stdout)
    assert status[0]["planned"] == 5 and status[0]["pending"] == 0


def test_changed_config_under_same_name_is_refused(finished: tuple[Path, Path], tmp_path: Path) -> None:
    _, out = finished
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump({**TINY, "train": {**TINY["train"], "lr": 0.5}}))
    res = study("run", str(changed), "--out", str(out), check=False)
    assert res.returncode == 2 and "different config" in res.stderr and "--name" in res.stderr


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ({"model": {"name": "seq2seq", "hiden_size": 8}}, "model.hiden_size"),
        ({"task": {"name": "symbol_rewrite"}}, "task.name"),
        ({"train": {"batch_size": "big"}}, "train.batch_size"),
        ({"task": {"name": "symbol_rewriting", "data_dir": "/nonexistent/dir"}}, "task.data_dir"),
    ],
)
def test_bad_input_fails_before_ray_and_touches_nothing(tmp_path: Path, patch: dict, needle: str) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump({**TINY, **patch}))
    out = tmp_path / "results"
    res = study("run", str(cfg), "--out", str(out), check=False)
    assert res.returncode == 2, res.stderr
    assert needle in res.stderr and "Fix:" in res.stderr
    assert "ray" not in res.stderr.lower().replace("array", "")
    assert not out.exists()


def test_sql_is_read_only(finished: tuple[Path, Path]) -> None:
    _, out = finished
    for query in ("CREATE TABLE x AS SELECT 1", "COPY evals TO 'x.csv'", "DROP VIEW evals"):
        res = study("sql", "--out", str(out), query, check=False)
        assert res.returncode == 2 and "read-only" in res.stderr, (query, res.stderr)


def test_report_and_analyze_of_a_real_study_render(finished: tuple[Path, Path], browser: object, tmp_path: Path) -> None:
    from tests_support import CELL_MARKS_JS, open_report

    _, out = finished
    res = study("analyze", "tiny", "--out", str(out), "--format", "json")
    summary = json.loads(res.stdout)
    assert summary, "analyze printed nothing"
    res = study("report", "tiny", "--out", str(out))
    page_path = out / "tiny" / "report.html"
    assert page_path.is_file() and str(page_path) in res.stdout
    html = page_path.read_text()
    assert "<script src=\"http" not in html and "cdn." not in html
    page, errors = open_report(browser, page_path)
    try:
        cells = page.evaluate(CELL_MARKS_JS)
        assert len(cells) >= 3 and all(marks > 0 for _, marks in cells), cells
        assert errors == []
        page.screenshot(path=str(tmp_path / "tiny-report.png"), full_page=True)
    finally:
        page.close()


@pytest.mark.slow  # ~16 s: a grid study, interrupted and resumed
def test_resume_keeps_each_grid_points_own_seed_count(tmp_path: Path) -> None:
    """A grid whose points ask for different seed counts: `study resume` plans each point's
    own count (not the largest one for every point)."""
    grid = {**TINY, "name": "percount", "train": {**TINY["train"], "max_epochs": 1},
            "seeds": {"count": 1, "root": 5},
            "grid": {"model.hidden_size": {6: {"seeds.count": 1}, 8: {"seeds.count": 2}}}}
    cfg = tmp_path / "percount.yaml"
    cfg.write_text(yaml.safe_dump(grid))
    out = tmp_path / "results"
    study("run", str(cfg), "--out", str(out), "--num-cpus", "2")
    res = study("resume", "percount", "--out", str(out), "--num-cpus", "2")
    assert "3/3 runs committed" in res.stdout, res.stdout + res.stderr
    counts = sql(out, "SELECT count(*) AS n FROM runs WHERE study = 'percount'")
    assert counts == [{"n": 3}]


@pytest.mark.slow  # ~16 s: a second study with counter masks (a GPU setting; contract-tested in the default run)
def test_counter_masks_are_recorded_and_change_the_run(finished: tuple[Path, Path]) -> None:
    """``execution.cuda_graphs`` on a CPU: no graph, but the counter-based masks (another
    stream), said in each unit's trials row; the same seeds then train differently."""
    cfg, out = finished
    study("run", str(cfg), "execution.cuda_graphs=true", "--name", "tiny_counter", "--out", str(out), "--num-cpus", "2")
    masks = sql(out, "SELECT study, dropout_masks, count(*) AS n FROM trials GROUP BY ALL ORDER BY study")
    assert [(m["study"], m["dropout_masks"]) for m in masks] == [("tiny", "generator"), ("tiny_counter", "counter")]
    loss = "SELECT value FROM evals WHERE study = '{}' AND seed = 0 AND split = 'train' AND metric = 'loss'"
    assert sql(out, loss.format("tiny"))[0]["value"] != sql(out, loss.format("tiny_counter"))[0]["value"]

