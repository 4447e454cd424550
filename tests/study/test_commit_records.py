"""The commit protocol records what it wrote, ``trials`` is derived from committed seeds, and
damage is found and quarantined: real commits through ``trainables.results.commit_seed``,
real views (``analysis.db``) and the real check (``study.check``), no Ray."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from analysis.db import connect, outside_views_sql
from study.check import check_study, quarantine, quarantine_damaged
from study.manifest import write
from trainables.results import (
    commit_evaluation,
    commit_seed,
    committed,
    file_digest,
    table_dir,
    write_rows,
)

T0 = dt.datetime(2025, 3, 1, tzinfo=dt.UTC)
TID = "a1b2c3d4e5f60718"


def unit_row(study: str, unit: str, *, status: str = "ok", minute: int = 0, **extra: Any) -> dict[str, Any]:
    """A unit's trials row, as the trainable writes it into each seed's commit."""
    return {
        "study": study, "trial_id": TID, "unit_id": unit, "task": "blobs", "model": "mlp",
        "config_hash": "h", "config_json": "{}", "point_json": "{}", "status": status,
        "started_at": T0, "ended_at": T0 + dt.timedelta(minutes=minute), "node": "n0",
        "bundle_size": 2, "model_cell": "lstm", **extra,
    }


def commit(out: Path, study: str, unit: str, seed: int, *, status: str = "ok", minute: int = 0,
           weights: bool = False, trials: bool = True) -> list[dict[str, Any]]:
    """Commit one seed of ``unit`` the way the trainable does (evals, metrics, predictions,
    its trials row, optionally kept weights, then the runs row)."""
    base = {"study": study, "trial_id": TID, "seed": seed}
    tables: dict[str, list[dict[str, Any]]] = {
        "metrics": [base | {"epoch": 1, "step": 1, "split": "val", "role": "val", "metric": "loss", "value": 1.0}],
        "evals": [base | {"split": s, "role": "test", "metric": "accuracy", "value": seed / 10} for s in ("a", "b")],
        "predictions": [base | {"split": "a", "example_id": i, "correct": True} for i in range(5)],
    }
    if trials:
        tables["trials"] = [unit_row(study, unit, minute=minute) | {"seed": seed}]
    rel = f"{study}/weights/{TID}/seed-{seed}.pt" if weights else None

    def keep() -> None:
        path = out / str(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"weights of seed %d" % seed)

    run = {"study": study, "trial_id": TID, "unit_id": unit, "seed": seed, "status": status,
           "committed_at": T0 + dt.timedelta(minutes=minute, seconds=seed), "weights": rel}
    return commit_seed(out, study, TID, seed, tables, run, keep=keep if weights else None)


def write_manifest(out: Path, study: str, seeds: int) -> None:
    """The study's manifest, as ``study run`` writes it before any commit (``study check``
    calls a study with results but no manifest damaged)."""
    write(out, study, {"name": study, "kind": "seeds", "config": {"name": study}, "seeds": seeds,
                       "points": [{"trial_id": TID, "point": {}, "seeds": seeds}]})


def rows(out: Path, sql: str) -> list[tuple[Any, ...]]:
    con = connect(out)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


# ------------------------------------------------------------------ the record
def test_a_commit_records_each_file_with_rows_bytes_and_sha256(tmp_path: Path) -> None:
    files = commit(tmp_path, "s", "u1", 0, weights=True)
    assert [f["table"] for f in files] == ["metrics", "evals", "predictions", "trials", "weights"]
    for f in files:
        path = tmp_path / f["path"]
        assert path.is_file() and file_digest(path) == {"bytes": f["bytes"], "sha256": f["sha256"]}
        if f["table"] != "weights":
            assert pq.read_table(path).num_rows == f["rows"]
    assert [f["rows"] for f in files[:4]] == [1, 2, 5, 1]
    (recorded,) = rows(tmp_path, "SELECT files FROM runs")
    assert json.loads(recorded[0]) == files
    assert not list(tmp_path.rglob("*.tmp"))


def test_an_evaluation_records_its_files_in_its_marker(tmp_path: Path) -> None:
    commit(tmp_path, "s", "u1", 0)
    marker = {"study": "s", "trial_id": TID, "seed": 0, "split": "a", "role": "test",
              "eval_id": f"eval-a-{TID}-0", "evaluated_at": T0 + dt.timedelta(hours=1)}
    evals = [{"study": "s", "trial_id": TID, "seed": 0, "split": "a", "role": "test", "metric": "accuracy",
              "value": 0.9}]
    files = commit_evaluation(tmp_path, "s", {"evals": evals, "predictions": []}, marker)
    (recorded,) = rows(tmp_path, "SELECT files FROM evaluations")
    assert json.loads(recorded[0]) == files and [f["rows"] for f in files] == [1, 0]
    assert check_study(tmp_path, "s").evaluations == 1


# ------------------------------------------------------------ trials and configs
def test_trials_after_a_crash_mid_bundle_and_a_rerun_count_each_seed_once(tmp_path: Path) -> None:
    out = tmp_path
    commit(out, "s", "u01", 0)  # the bundle [0, 1] committed seed 0, then the driver died
    write_rows(out, "s", "trials", f"{TID}-1", [unit_row("s", "u01") | {"seed": 1}])  # seed 1's leftover
    assert committed(out, "s") == {(TID, 0)}
    assert rows(out, "SELECT unit_id, seeds FROM trials") == [("u01", [0])]
    commit(out, "s", "u1", 1, minute=5)  # the re-run trains seed 1 alone
    trials = rows(out, "SELECT unit_id, seeds, status, bundle_size FROM trials ORDER BY unit_id")
    assert trials == [("u01", [0], "ok", 2), ("u1", [1], "ok", 2)]
    per_seed = rows(out, "SELECT s, count(*) FROM (SELECT unnest(seeds) AS s FROM trials) GROUP BY s ORDER BY s")
    assert per_seed == [(0, 1), (1, 1)]
    assert rows(out, "SELECT trial_id, bundles, runs, ok, diverged, model_cell, status FROM configs") == [
        (TID, 2, 2, 2, 0, "lstm", "ok")
    ]


def test_older_per_unit_trials_files_count_only_their_committed_seeds(tmp_path: Path) -> None:
    out = tmp_path
    # the layout before: one trials file per unit, written before its seeds' commits
    write_rows(out, "s", "trials", "u012", [unit_row("s", "u012") | {"seeds": [0, 1, 2]}])
    commit(out, "s", "u012", 0, trials=False)
    commit(out, "s", "u012", 1, trials=False, status="diverged")
    commit(out, "s", "u2", 2, minute=3)  # seed 2 committed later by another unit (new layout)
    trials = rows(out, "SELECT unit_id, seeds, status FROM trials ORDER BY unit_id")
    assert trials == [("u012", [0, 1], "partial"), ("u2", [2], "ok")]
    assert rows(out, "SELECT runs, ok, diverged, status FROM configs") == [(3, 2, 1, "partial")]


def test_a_pruned_candidate_shows_until_its_unit_commits(tmp_path: Path) -> None:
    out = tmp_path
    pruned = unit_row("s", "u01", status="pruned") | {"seeds": [0, 1], "objective": None, "pruned_epoch": 2}
    write_rows(out, "s", "trials", "u01", [pruned])
    assert rows(out, "SELECT unit_id, seeds, status, pruned_epoch FROM trials") == [("u01", [], "pruned", 2)]
    assert rows(out, "SELECT bundles, runs, status FROM configs") == [(0, 0, "pruned")]
    commit(out, "s", "u01", 0, minute=9)  # re-queued and trained after all
    assert rows(out, "SELECT unit_id, seeds, status FROM trials") == [("u01", [0], "ok")]
    assert rows(out, "SELECT bundles, runs, status FROM configs") == [(1, 1, "ok")]


def test_outside_views_agree_with_the_connection(tmp_path: Path) -> None:
    out = tmp_path
    write_rows(out, "s", "trials", "u012", [unit_row("s", "u012") | {"seeds": [0, 1, 2]}])
    commit(out, "s", "u012", 0, trials=False)
    commit(out, "s", "u2", 2, minute=3)
    commit(out, "s", "u2", 3, minute=3)
    con = duckdb.connect()
    con.execute(outside_views_sql(out))
    for q in ("SELECT unit_id, seeds, status FROM trials ORDER BY unit_id",
              "SELECT trial_id, bundles, runs, ok, status FROM configs"):
        assert con.execute(q).fetchall() == rows(out, q), q


# --------------------------------------------------------------- damage and check
def test_a_damaged_file_is_left_out_of_the_views_with_a_warning(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path
    for seed in (0, 1):
        commit(out, "s", "u01", seed)
    commit(out, "other", "v0", 0)
    truncate(table_dir(out, "evals", "s") / f"{TID}-0.parquet")
    truncate(table_dir(out, "runs", "s") / f"{TID}-1.parquet")
    capsys.readouterr()
    assert rows(out, "SELECT study, seed FROM runs ORDER BY ALL") == [("other", 0), ("s", 0)]
    assert rows(out, "SELECT count(*) FROM evals WHERE study = 'other'") == [(2,)]
    assert rows(out, "SELECT count(*) FROM evals WHERE study = 's'") == [(0,)]  # seed 1 uncommitted
    err = capsys.readouterr().err
    assert f"{TID}-0.parquet cannot be read" in err and f"{TID}-1.parquet cannot be read" in err
    assert "study check s --repair" in err
    assert committed(out, "s") == {(TID, 0)}  # planning sees seed 1 as not committed


def test_check_names_each_kind_of_damage(tmp_path: Path) -> None:
    out = tmp_path
    write_manifest(out, "s", 5)
    for seed in range(5):
        commit(out, "s", f"u{seed}", seed, weights=True)
    assert not check_study(out, "s").damage
    stem = f"{TID}-"
    (table_dir(out, "metrics", "s") / f"{stem}0.parquet").unlink()
    truncate(table_dir(out, "predictions", "s") / f"{stem}1.parquet")
    path = table_dir(out, "evals", "s") / f"{stem}2.parquet"  # rewritten with other values
    other = pq.read_table(path)
    pq.write_table(other.set_column(other.schema.get_field_index("value"), "value",
                                    pa.array([0.5, 0.5])), path, compression="zstd")
    weights = out / "s" / "weights" / TID / "seed-3.pt"
    weights.write_bytes(b"X" * weights.stat().st_size)
    truncate(table_dir(out, "runs", "s") / f"{stem}4.parquet")
    found = check_study(out, "s")
    got = {(d.seed, d.table): d.problem for d in found.damage}
    assert got[(0, "metrics")] == "missing"
    assert got[(1, "predictions")].startswith("size ")
    assert (2, "evals") in got
    assert got[(3, "weights")] == "content differs from what its commit wrote (sha256)"
    assert "not committed" in got[(4, "runs")]
    assert len(got) == 5 and found.runs == 4 and found.damaged_runs == {(TID, s) for s in range(5)}
    # the cheap check of `study run` sees all but the same-size changes
    cheap = {(d.seed, d.table) for d in check_study(out, "s", thorough=False).damage}
    assert cheap <= set(got) and {(0, "metrics"), (1, "predictions"), (4, "runs")} <= cheap


def test_quarantine_moves_a_seed_with_its_evaluations_and_keeps_every_file(tmp_path: Path) -> None:
    out = tmp_path
    write_manifest(out, "s", 2)
    for seed in (0, 1):
        commit(out, "s", "u01", seed, weights=True)
        commit_evaluation(out, "s", {"evals": [], "predictions": []}, {
            "study": "s", "trial_id": TID, "seed": seed, "split": "a", "eval_id": f"eval-a-{TID}-{seed}",
            "evaluated_at": T0 + dt.timedelta(hours=1)})
    before = {p.relative_to(out) for p in out.rglob("*") if p.is_file()}
    truncate(table_dir(out, "trials", "s") / f"{TID}-0.parquet")
    moved = quarantine_damaged(out, "s")
    assert moved.runs == {(TID, 0)} and moved.folder is not None
    assert moved.files[0] == f"tables/runs/study=s/{TID}-0.parquet"  # uncommitted first
    kept = {Path(f) for f in moved.files}
    assert {p for p in before if f"{TID}-0" in str(p) or p.name == "seed-0.pt"} == kept
    assert all((moved.folder / f).is_file() for f in kept)
    assert rows(out, "SELECT seed FROM runs") == [(1,)] and rows(out, "SELECT seed FROM evaluations") == [(1,)]
    assert not check_study(out, "s").damage
    assert not quarantine(out, "s", check_study(out, "s")).files  # nothing left to move
