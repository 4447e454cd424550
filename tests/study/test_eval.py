"""Kept weights and ``study eval`` through the real CLI: each committed seed keeps its selected
parameters (named by its runs row), the kept weights reproduce the committed numbers exactly,
and test splits added or changed in code since training are evaluated without retraining,
each evaluation committed on its own and never duplicated."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from tests_support import TINY_STUDY

from analysis.db import connect

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "grow_task.py"
NO_EXTRA = "EXTRA_TEST_SPLITS: dict[str, float] = {}"
GROW: dict[str, Any] = {
    "name": "grow",
    "plugins": ["grow_task"],
    "task": {"name": "grow_blobs", "n": 64},
    "model": {"name": "mlp_plain", "hidden": [8], "dropout": 0.1},
    "train": {"optimizer": "adam", "lr": 0.02, "batch_size": 16, "max_epochs": 3},
    "seeds": {"count": 3, "root": 2},
    "execution": {"bundle_size": 3},
}


def study(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k in ("HOME", "PYTHONPATH", "VIRTUAL_ENV", "LANG")}
    # a plugin edited within one second keeps its size: never run a stale cached .pyc of it
    env |= {"RAY_USAGE_STATS_ENABLED": "0", "PYTHONDONTWRITEBYTECODE": "1",
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    res = subprocess.run([sys.executable, "-m", "study.cli", *args], capture_output=True, text=True,
                         timeout=600, env=env)
    if check and res.returncode != 0:
        raise AssertionError(f"study {' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


def in_process(capsys: Any, *args: str) -> tuple[int, str, str]:
    """``study ARGS`` in this process (torch is imported already): (exit code, stdout, stderr)."""
    from study.cli import cli_main

    capsys.readouterr()
    code = cli_main(list(args))
    got = capsys.readouterr()
    return code, got.out, got.err


def query(out: Path, sql: str) -> list[tuple[Any, ...]]:
    con = connect(out)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def files(out: Path) -> dict[str, float]:
    """Every file under ``out/tables`` -> its modification time."""
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in (out / "tables").rglob("*.parquet")}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("eval-tiny")
    (root / "tiny.yaml").write_text(yaml.safe_dump(TINY_STUDY))
    out = root / "results"
    study("run", str(root / "tiny.yaml"), "--out", str(out), "--num-cpus", "1")
    return out


def test_each_committed_seed_keeps_its_selected_weights_named_by_its_runs_row(tiny: Path) -> None:
    from trainables.weights import load_weights

    runs = query(tiny, "SELECT trial_id, seed, unit_id, selected_epoch, weights FROM runs ORDER BY seed")
    assert [r[1] for r in runs] == [0, 1, 2]
    bundles = dict(query(tiny, "SELECT unit_id, seeds FROM trials"))
    for trial_id, seed, unit_id, epoch, weights in runs:
        assert weights == f"tiny/weights/{trial_id}/seed-{seed}.pt"
        state, meta = load_weights(tiny / weights)
        assert (meta["trial_id"], meta["seed"], meta["unit_id"]) == (trial_id, seed, unit_id)
        assert meta["selected_epoch"] == epoch and meta["model"] == "seq2seq"
        assert [s["index"] for s in meta["bundle"]] == list(bundles[unit_id])
        assert meta["bundle"][meta["member"]]["index"] == seed
        assert set(meta["split_hashes"]) == {"standard", "repeat", "short", "long"}
        assert state and all(t.device.type == "cpu" and t.dim() >= 1 for t in state.values())
    assert not list((tiny / "tiny" / "weights").rglob("*.tmp")), "no temporary file left behind"


def test_kept_weights_reproduce_the_committed_numbers_exactly(tiny: Path, capsys: Any) -> None:
    before = files(tiny)
    code, said, _ = in_process(capsys, "eval", "tiny", "--out", str(tiny), "--split", "standard", "--split", "long")
    assert code == 0 and "6 evaluations committed (long: 3 requested; standard: 3 requested)" in said
    # the evaluations' rows replace the training-time rows of those splits in the views ...
    shown = query(tiny, "SELECT trial_id, seed, split, metric, value, eval_id FROM evals "
                        "WHERE split IN ('standard', 'long') ORDER BY ALL")
    assert len(shown) == 3 * 2 * 3 and all(r[5] == f"eval-{r[2]}-{r[0]}-{r[1]}" for r in shown)
    # ... with exactly the numbers training committed (read from its files)
    trained = []
    for name in before:
        if name.startswith("tables/evals/") and "/eval-" not in name:
            trained += [(r["trial_id"], r["seed"], r["split"], r["metric"], r["value"])
                        for r in pq.read_table(tiny / name).to_pylist() if r["split"] in ("standard", "long")]
    assert sorted(trained) == [r[:5] for r in shown]
    assert any(r[3] == "loss" and r[4] > 0 for r in shown)  # a float that must match bit for bit
    preds = query(tiny, "SELECT trial_id, seed, split, example_id, input, target, prediction, correct "
                        "FROM predictions WHERE split = 'long' AND eval_id IS NOT NULL ORDER BY ALL")
    trained_preds = sorted(
        tuple(r[c] for c in ("trial_id", "seed", "split", "example_id", "input", "target", "prediction", "correct"))
        for name in before if name.startswith("tables/predictions/")
        for r in pq.read_table(tiny / name).to_pylist() if r["split"] == "long"
    )
    assert preds == trained_preds and len(preds) == 3 * 40
    # one row per (trial, seed, split, metric): nothing duplicated
    assert query(tiny, "SELECT count(*), count(DISTINCT (trial_id, seed, split, metric)) FROM evals") == [(63, 63)]
    marks = query(tiny, "SELECT split, count(*), count(DISTINCT data_hash) FROM evaluations GROUP BY split ORDER BY 1")
    assert marks == [("long", 3, 1), ("standard", 3, 1)]
    # idempotent: re-running (with or without --split) writes nothing
    written = files(tiny)
    for args in (["--split", "standard"], []):
        code, said, _ = in_process(capsys, "eval", "tiny", "--out", str(tiny), *args)
        assert code == 0 and "up to date (nothing written)" in said
    assert files(tiny) == written


def test_eval_refuses_a_split_that_is_not_a_test_split(tiny: Path, capsys: Any) -> None:
    written = files(tiny)
    for split, problem in (
        ("val", "split 'val' has role 'val', and study eval evaluates test splits"),
        ("nope", "the task has no split 'nope'"),
    ):
        code, _, err = in_process(capsys, "eval", "tiny", "--out", str(tiny), "--split", split)
        assert code == 2
        assert err.strip() == (
            f"error: --split: {problem}. Fix: name one of its test splits: long, repeat, short, standard"
        ), err
    assert files(tiny) == written


def test_missing_kept_weights_are_refused_naming_the_repair(tiny: Path, tmp_path: Path, capsys: Any) -> None:
    """A seed's kept weights deleted: the refusal names `study check --repair` (which trains
    exactly that seed again, weights included), not only a backup."""
    out = tmp_path / "copy"
    shutil.copytree(tiny, out)
    victim = sorted((out / "tiny" / "weights").glob("*/seed-*.pt"))[0]
    victim.unlink()
    code, _, err = in_process(capsys, "eval", "tiny", "--out", str(out))
    assert code == 2, err
    assert err.startswith(f"error: kept weights {victim} are missing. Fix: restore {victim} from a backup"), err
    assert f"or `study check tiny --repair --out {out}`, which trains exactly that seed again" in err, err


def test_kept_weights_changed_inside_are_refused_not_evaluated(tiny: Path, tmp_path: Path, capsys: Any) -> None:
    """One byte of a tensor flipped in a kept-weights file: torch.load reads it without a
    word (the zip's CRC is not checked), so study eval evaluated the altered parameters and
    committed their numbers; it now checks the file against its commit's sha256 first."""
    import zipfile

    import torch

    out = tmp_path / "copy"
    shutil.copytree(tiny, out)
    victim = sorted((out / "tiny" / "weights").glob("*/seed-*.pt"))[0]
    with zipfile.ZipFile(victim) as z:
        entry = next(i for i in z.infolist() if "/data/" in i.filename and i.file_size >= 16)
    raw = bytearray(victim.read_bytes())
    header = entry.header_offset
    start = header + 30 + int.from_bytes(raw[header + 26 : header + 28], "little") + int.from_bytes(
        raw[header + 28 : header + 30], "little")
    raw[start + 2] ^= 0x40  # inside the first float of that tensor
    victim.write_bytes(bytes(raw))
    torch.load(victim, weights_only=True)  # reads: the damage is silent to torch
    written = files(out)
    code, _, err = in_process(capsys, "eval", "tiny", "--out", str(out), "--split", "long")
    assert code == 2, err
    assert err.startswith(f"error: kept weights {victim} are damaged (content differs from what its commit "
                          "wrote (sha256))"), err
    assert "study check tiny --repair" in err, err
    assert files(out) == written  # nothing evaluated, nothing written


@pytest.mark.slow  # ~34 s: a study and eight CLI calls
def test_a_split_added_then_changed_in_code_is_evaluated_without_retraining(tmp_path: Path) -> None:
    home = tmp_path / "study"
    home.mkdir()
    plugin = home / PLUGIN.name
    source = PLUGIN.read_text()
    assert NO_EXTRA in source
    plugin.write_text(source)
    (home / "grow.yaml").write_text(yaml.safe_dump(GROW))
    out = tmp_path / "results"
    study("run", str(home / "grow.yaml"), "--out", str(out), "--num-cpus", "1")
    trained = query(out, "SELECT seed, split, metric, value FROM evals ORDER BY ALL")
    assert {r[1] for r in trained} == {"train", "val", "val_ood", "test"}

    def edit(extra: str) -> None:
        plugin.write_text(source.replace(NO_EXTRA, f"EXTRA_TEST_SPLITS: dict[str, float] = {extra}"))
        shutil.rmtree(home / "__pycache__", ignore_errors=True)

    # a test split added in code: evaluated for every kept seed, visible in `study sql`
    edit('{"far": 2.5}')
    res = study("eval", "grow", "--out", str(out))
    assert "3 evaluations committed (far: 3 new), 3 up to date" in res.stdout, res.stdout
    rows = json.loads(study("sql", "--out", str(out), "--format", "json",
                            "SELECT seed, role, metric, value FROM evals WHERE split = 'far' ORDER BY seed, metric").stdout)
    assert [(r["seed"], r["metric"]) for r in rows] == [(s, m) for s in (0, 1, 2) for m in ("accuracy", "loss")]
    assert all(r["role"] == "test" for r in rows)
    assert all(0.0 <= r["value"] <= 1.0 for r in rows if r["metric"] == "accuracy")
    assert query(out, "SELECT count(*) FROM predictions WHERE split = 'far'") == [(3 * 64,)]
    # training's rows stay as they were
    assert query(out, "SELECT seed, split, metric, value FROM evals WHERE split <> 'far' ORDER BY ALL") == trained
    written = files(out)
    assert "up to date (nothing written)" in study("eval", "grow", "--out", str(out)).stdout
    assert files(out) == written

    # an evaluation whose marker is missing (a crash before it) shows nothing, and is redone
    marker = out / "tables" / "evaluations" / "study=grow"
    lost = next(p for p in marker.glob("eval-far-*-1.parquet"))
    lost.unlink()
    assert query(out, "SELECT DISTINCT seed FROM evals WHERE split = 'far' ORDER BY 1") == [(0,), (2,)]
    assert query(out, "SELECT DISTINCT seed FROM predictions WHERE split = 'far' ORDER BY 1") == [(0,), (2,)]
    res = study("eval", "grow", "--out", str(out))
    assert "1 evaluation committed (far: 1 new), 5 up to date" in res.stdout, res.stdout
    assert query(out, "SELECT count(*) FROM evals WHERE split = 'far'") == [(6,)]

    # the split's data changed in code: re-evaluated under its name, replacing the old rows
    old_hash = query(out, "SELECT DISTINCT data_hash FROM evaluations")
    edit('{"far": 0.25}')
    res = study("eval", "grow", "--out", str(out))
    assert "3 evaluations committed (far: 3 changed), 3 up to date" in res.stdout, res.stdout
    new_hash = query(out, "SELECT DISTINCT data_hash FROM evaluations")
    assert len(old_hash) == len(new_hash) == 1 and old_hash != new_hash
    assert query(out, "SELECT count(*), count(DISTINCT (seed, metric)) FROM evals WHERE split = 'far'") == [(6, 6)]
    assert query(out, "SELECT count(*) FROM predictions WHERE split = 'far'") == [(3 * 64,)]
    # a plain DuckDB over the files (analysis.db.outside_views_sql) shows the same rows
    import duckdb

    from analysis.db import outside_views_sql

    plain = duckdb.connect()
    plain.execute(outside_views_sql(out))
    for table in ("evals", "predictions"):
        sql = f"SELECT trial_id, seed, split, eval_id FROM {table} ORDER BY ALL"
        assert plain.execute(sql).fetchall() == query(out, sql), table


def test_keep_weights_false_keeps_none_and_eval_says_so(tmp_path: Path, torch_threads: None, capsys: Any) -> None:
    from study import manifest
    from study.config import parse
    from study.plan import plan_units, unit_payload
    from study.runner import check_before_ray
    from trainables.trainable import FinelineTrainable

    raw = {**TINY_STUDY, "name": "nokeep", "seeds": {"count": 2, "root": 5},
           "train": {**TINY_STUDY["train"], "max_epochs": 1},
           "execution": {"bundle_size": 2, "keep_weights": False}}
    cfg = parse(raw)
    out = tmp_path / "results"
    manifest.prepare(out, "nokeep", cfg, "seeds", check_before_ray(cfg))
    units, _, _ = plan_units(cfg, out, "nokeep", "cpu", 1)
    for unit in units:  # the trainable as a Ray worker drives it (no Ray needed)
        t = FinelineTrainable(config={"unit": unit_payload(unit, cfg, out, "nokeep", "cpu", {})})
        try:
            while not t.train().get("done"):
                pass
        finally:
            t.stop()
            shutil.rmtree(t.logdir, ignore_errors=True)
    assert query(out, "SELECT seed, weights FROM runs ORDER BY seed") == [(0, None), (1, None)]
    assert not (out / "nokeep" / "weights").exists()
    code, _, text = in_process(capsys, "eval", "nokeep", "--out", str(out))
    assert code == 2
    err = text.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: study 'nokeep' kept no weights"), err
    assert "Fix: train it again under a new name with execution.keep_weights: true" in err[0]
    assert not (out / "tables" / "evaluations").exists()
