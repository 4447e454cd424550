"""analysis.db: views over hand-written Parquet files, commit semantics, read-only access."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.db import connect, format_studies, list_studies, run_sql
from analysis.errors import AnalysisError
from analysis.schema import SCHEMAS, TABLES

T0 = datetime(2025, 3, 1, tzinfo=UTC)


def _write(out: Path, table: str, study: str, name: str, rows: list[dict]) -> Path:
    folder = out / "tables" / table / f"study={study}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _run(study: str, trial: str, seed: int, status: str = "ok", minute: int = 0) -> dict:
    return {
        "study": study,
        "trial_id": trial,
        "unit_id": f"{trial}-u",
        "seed": seed,
        "init_seed": 100 + seed,
        "order_seed": 200 + seed,
        "dropout_seed": 300,
        "data_seed": 400,
        "selected_epoch": 3,
        "selected_step": 30,
        "status": status,
        "node": "n0",
        "wall_s": 1.5,
        "committed_at": T0.replace(minute=minute),
    }


def _eval(study: str, trial: str, seed: int, value: float, split: str = "test_a") -> dict:
    return {
        "study": study,
        "trial_id": trial,
        "seed": seed,
        "split": split,
        "role": "test",
        "metric": "accuracy",
        "value": value,
    }


@pytest.fixture()
def out(tmp_path: Path) -> Path:
    """Study s1: trial t1 seeds 0, 1 committed, seed 2 only partly written (no runs row).
    Study s2: trial t9 seed 0 committed (diverged). Every table's rows for those runs."""
    o = tmp_path / "results"
    for seed in (0, 1):
        _write(o, "runs", "s1", f"t1-{seed}.parquet", [_run("s1", "t1", seed)])
    _write(o, "runs", "s2", "t9-0.parquet", [_run("s2", "t9", 0, status="diverged")])
    for study, trial, seed in (("s1", "t1", 0), ("s1", "t1", 1), ("s1", "t1", 2), ("s2", "t9", 0)):
        stem = f"{trial}-{seed}.parquet"
        _write(o, "evals", study, stem, [_eval(study, trial, seed, 0.5 + seed / 10)])
        _write(
            o,
            "metrics",
            study,
            stem,
            [
                {
                    "study": study,
                    "trial_id": trial,
                    "seed": seed,
                    "epoch": e,
                    "step": 10 * e,
                    "split": "test_a",
                    "role": "test",
                    "metric": "loss",
                    "value": 1.0 / e,
                }
                for e in (1, 2, 3)
            ],
        )
        _write(
            o,
            "predictions",
            study,
            stem,
            [
                {
                    "study": study,
                    "trial_id": trial,
                    "seed": seed,
                    "split": "test_a",
                    "example_id": i,
                    "input": "x",
                    "target": "y",
                    "prediction": "y",
                    "correct": i % 2 == 0,
                }
                for i in range(4)
            ],
        )
    _write(
        o,
        "trials",
        "s1",
        "t1-u.parquet",
        [
            {
                "study": "s1",
                "trial_id": "t1",
                "unit_id": "t1-u",
                "seeds": [0, 1, 2],
                "task": "taskA",
                "model": "modelA",
                "point_json": "{}",
                "status": "running",
                "train_lr": 1,
            }
        ],
    )
    _write(
        o,
        "trials",
        "s2",
        "t9-u.parquet",
        [
            {
                "study": "s2",
                "trial_id": "t9",
                "unit_id": "t9-u",
                "seeds": [0],
                "task": "taskB",
                "model": "modelB",
                "point_json": "{}",
                "status": "ok",
                "train_lr": 0.5,
                "param_lr": 0.5,
                "objective": 0.7,
            }
        ],
    )
    (o / "s1").mkdir()
    (o / "s1" / "study.json").write_text(
        json.dumps(
            {
                "name": "s1",
                "kind": "seeds",
                "task": "taskA",
                "model": "modelA",
                "seeds": 3,
                "points": [{"trial_id": "t1", "point": {}, "seeds": 3}],
            }
        )
    )
    return o


def test_uncommitted_rows_are_invisible(out: Path) -> None:
    con = connect(out)
    for table in ("evals", "metrics", "predictions"):
        seeds = con.execute(
            f"SELECT DISTINCT study, trial_id, seed FROM {table} ORDER BY ALL"
        ).fetchall()
        assert seeds == [("s1", "t1", 0), ("s1", "t1", 1), ("s2", "t9", 0)], table
    assert con.execute("SELECT count(*) FROM predictions").fetchone() == (12,)
    # the raw files do hold seed 2: it is the view that hides it
    raw = pq.read_table(out / "tables" / "evals" / "study=s1" / "t1-2.parquet")
    assert raw.num_rows == 1


def test_duplicate_runs_rows_keep_the_latest_commit(out: Path) -> None:
    _write(out, "runs", "s1", "t1-0-again.parquet", [_run("s1", "t1", 0, "failed", minute=5)])
    con = connect(out)
    rows = con.execute("SELECT seed, status FROM runs WHERE study = 's1' ORDER BY seed").fetchall()
    assert rows == [(0, "failed"), (1, "ok")]
    # the commit marker still lets seed 0's evals through exactly once
    assert con.execute("SELECT count(*) FROM evals WHERE study='s1' AND seed=0").fetchone() == (1,)


def test_columns_are_united_by_name_and_widened(out: Path) -> None:
    con = connect(out)
    types = dict(con.execute("SELECT column_name, column_type FROM (DESCRIBE trials)").fetchall())
    assert types["train_lr"] == "DOUBLE"  # int64 in s1, double in s2
    assert types["param_lr"] == "DOUBLE" and types["objective"] == "DOUBLE"
    assert types["seeds"] == "BIGINT[]"
    rows = con.execute("SELECT study, train_lr, param_lr FROM trials ORDER BY study").fetchall()
    assert rows == [("s1", 1.0, None), ("s2", 0.5, 0.5)]


def test_conflicting_types_fall_back_to_text(out: Path) -> None:
    row = {"study": "s3", "trial_id": "t", "unit_id": "t-u", "seed": 0, "train_lr": "auto"}
    _write(out, "trials", "s3", "t-0.parquet", [row])
    _write(out, "runs", "s3", "t-0.parquet", [_run("s3", "t", 0)])  # trials counts committed seeds
    con = connect(out)
    rows = con.execute("SELECT study, train_lr FROM trials ORDER BY study").fetchall()
    assert rows == [("s1", "1"), ("s2", "0.5"), ("s3", "auto")]


def test_temporary_and_hidden_files_are_skipped(out: Path) -> None:
    folder = out / "tables" / "runs" / "study=s1"
    pq.write_table(pa.Table.from_pylist([_run("s1", "t1", 2)]), folder / ".t1-2.parquet.abc.tmp")
    pq.write_table(pa.Table.from_pylist([_run("s1", "t1", 2)]), folder / ".t1-2.parquet")
    con = connect(out)
    assert con.execute("SELECT count(*) FROM runs WHERE study = 's1'").fetchone() == (2,)


@pytest.mark.parametrize(
    "statement",
    [
        "CREATE TABLE x AS SELECT 1",
        "INSERT INTO runs SELECT * FROM runs",
        "CREATE VIEW v AS SELECT 1",
        "DROP VIEW runs",
    ],
)
def test_connection_refuses_writes(out: Path, statement: str) -> None:
    con = connect(out)
    with pytest.raises(duckdb.Error):
        con.execute(statement)
    assert con.execute("SELECT count(*) FROM runs").fetchone() == (3,)


def test_connection_refuses_file_access_even_inside_out(out: Path, tmp_path: Path) -> None:
    con = connect(out)
    target = out / "tables" / "runs" / "study=s1" / "evil.parquet"
    with pytest.raises(duckdb.Error):
        con.execute(f"COPY (SELECT * FROM runs) TO '{target}' (FORMAT parquet)")
    assert not target.exists()
    victim = out / "tables" / "runs" / "study=s1" / "t1-0.parquet"
    before = victim.read_bytes()
    with pytest.raises(duckdb.Error):
        con.execute(f"COPY (SELECT 1) TO '{victim}' (FORMAT parquet, USE_TMP_FILE false)")
    assert victim.read_bytes() == before
    outside = tmp_path / "secret.csv"
    outside.write_text("a\n1\n")
    with pytest.raises(duckdb.Error):
        con.execute(f"SELECT * FROM read_csv('{outside}')")
    with pytest.raises(duckdb.Error):
        con.execute("SET enable_external_access = true")


@pytest.mark.parametrize(
    "query",
    [
        "CREATE TABLE x AS SELECT 1",
        "INSERT INTO runs SELECT * FROM runs",
        "COPY (SELECT * FROM runs) TO 'x.csv'",
        "DELETE FROM runs",
        "ATTACH 'other.db'",
        "SELECT 1; DROP VIEW runs",
    ],
)
def test_run_sql_rejects_writes_with_a_clear_message(out: Path, query: str) -> None:
    with pytest.raises(AnalysisError, match=r"read-only|one at a time"):
        run_sql(out, query)
    assert not (Path.cwd() / "x.csv").exists()


def test_run_sql_reports_sql_errors(out: Path) -> None:
    with pytest.raises(AnalysisError, match="SQL error"):
        run_sql(out, "SELECT nope FROM runs")
    with pytest.raises(AnalysisError, match="SQL error"):
        run_sql(out, "SELEC 1")
    with pytest.raises(AnalysisError, match="table, csv, json"):
        run_sql(out, "SELECT 1", "xml")


def test_a_file_damaged_inside_fails_its_query_with_the_fix(out: Path) -> None:
    """A Parquet file whose footer reads but whose pages are garbage stays in the views; a
    query reading it says which table is damaged and how to find and mend the file
    (before: DuckDB's "Couldn't deserialize thrift" and a hint to DESCRIBE runs)."""
    path = out / "tables" / "predictions" / "study=s1" / "t1-1.parquet"
    raw = bytearray(path.read_bytes())
    pages_end = len(raw) - 8 - int.from_bytes(raw[-8:-4], "little")  # where the footer starts
    raw[4:pages_end] = b"Z" * (pages_end - 4)  # the pages, not the footer
    path.write_bytes(bytes(raw))
    with pytest.raises(AnalysisError, match=r"a predictions file cannot be read .*damaged inside.*"
                       r"study check --out .*study check NAME --repair"):
        run_sql(out, "SELECT * FROM predictions WHERE study = 's1'")
    assert run_sql(out, "SELECT count(*) AS n FROM predictions WHERE study = 's2'", "csv").splitlines()[1] == "4"


def test_run_sql_formats(out: Path) -> None:
    q = "SELECT seed, value FROM evals WHERE study = 's1' ORDER BY seed"
    rows = list(csv.DictReader(io.StringIO(run_sql(out, q, "csv"))))
    assert [(r["seed"], float(r["value"])) for r in rows] == [("0", 0.5), ("1", 0.6)]
    assert json.loads(run_sql(out, q, "json")) == [
        {"seed": 0, "value": 0.5},
        {"seed": 1, "value": 0.6},
    ]
    table = run_sql(out, q).splitlines()
    assert table[0].split() == ["seed", "value"]
    assert table[2].split() == ["0", "0.5"] and table[-1] == "(2 rows)"
    short = run_sql(out, "SELECT * FROM predictions", max_rows=5)
    assert "7 more rows" in short


def test_empty_results_folder_gives_empty_typed_views(tmp_path: Path) -> None:
    con = connect(tmp_path)
    for table in TABLES:
        cols = con.execute(f"DESCRIBE {table}").fetchall()
        assert [c[0] for c in cols] == SCHEMAS[table].names
        assert con.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
    types = dict(con.execute("SELECT column_name, column_type FROM (DESCRIBE runs)").fetchall())
    assert types["seed"] == "BIGINT" and types["committed_at"] == "TIMESTAMP WITH TIME ZONE"
    text = run_sql(tmp_path, "SELECT split, avg(value) FROM evals GROUP BY split")
    assert text.endswith("(0 rows)")
    assert list_studies(tmp_path) == []


def test_missing_results_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(AnalysisError, match="does not exist"):
        connect(tmp_path / "nope")


def test_list_studies_counts_committed_runs(out: Path) -> None:
    (out / "planned_only").mkdir()
    (out / "planned_only" / "study.json").write_text(
        json.dumps({"name": "planned_only", "kind": "tune", "seeds": 2,
                    "points": [{"trial_id": "a", "point": {}}, {"trial_id": "b", "point": {}}]})
    )  # fmt: skip
    _write(out, "runs", "s4", "t4-0.parquet", [_run("s4", "t4", 0, status="not_learned")])
    infos = {i.name: i for i in list_studies(out)}
    assert set(infos) == {"s1", "s2", "s4", "planned_only"}
    assert (infos["s4"].done, infos["s4"].ok, infos["s4"].not_learned) == (1, 0, 1)
    p = infos["planned_only"]
    assert (p.kind, p.planned, p.done, p.not_learned, p.pending) == ("tune", 4, 0, 0, None)
    assert [i.name for i in list_studies(out, only=["s2"])] == ["s2"]
    s1, s2 = infos["s1"], infos["s2"]
    assert (s1.kind, s1.task, s1.model, s1.planned) == ("seeds", "taskA", "modelA", 3)
    assert (s1.done, s1.ok, s1.not_learned, s1.diverged, s1.pending) == (2, 2, 0, 0, 1)
    assert (s2.kind, s2.task, s2.planned) == (None, "taskB", None)  # no manifest
    assert (s2.done, s2.diverged, s2.pending) == (1, 1, None)
    lines = format_studies(list(infos.values())).splitlines()
    assert lines[0].split()[:4] == ["name", "kind", "task", "model"]
    assert lines[-1].startswith("(pending is blank for a tuning study: a pruned candidate commits no runs")
    assert "pending is blank" not in format_studies([s1, s2])
    assert "(pending: planned runs not committed yet and not failed; `study status NAME`" in lines[-2]
    assert "not committed yet" not in format_studies([s2])  # nothing pending: no note
    listed = json.loads(format_studies(list_studies(out), "json"))
    assert [(r["name"], r["done"]) for r in listed] == [("planned_only", 0), ("s1", 2), ("s2", 1), ("s4", 1)]


def test_ls_counts_the_last_runs_failed_seeds_as_failed_like_status(out: Path) -> None:
    """`study ls` called a seed the last run's failed trial left uncommitted "pending" where
    `study status` said "failed"; both now count it failed. A failed seed committed since
    (a resume) is neither; a study whose last run did not fail keeps its counts."""
    from typer.testing import CliRunner

    from study.cli import app
    from study.status import study_status, with_uncommitted_failures

    # s1: t1 plans 3 seeds, 0 and 1 committed; the last run failed seeds 1 (committed since) and 2
    (out / "s1" / "last_run.json").write_text(json.dumps(
        {"ended_at": "2026-11-28T12:00:00+00:00", "stopped": None,
         "failed": [{"trial_id": "t1", "seeds": [1, 2], "error": "boom", "point": "{}"}]}))  # fmt: skip
    infos = {i.name: i for i in with_uncommitted_failures(out, list_studies(out))}
    s1 = infos["s1"]
    assert (s1.done, s1.ok, s1.failed, s1.pending) == (2, 2, 1, 0)
    assert infos["s2"] == next(i for i in list_studies(out) if i.name == "s2")
    row = study_status(out, "s1", json.loads((out / "s1" / "study.json").read_text()),
                       {("t1", 0): "ok", ("t1", 1): "ok"})  # fmt: skip
    assert (row[0]["failed"], row[0]["pending"]) == (s1.failed, s1.pending)
    listed = json.loads(CliRunner().invoke(app, ["ls", "--out", str(out), "--format", "json"]).output)
    assert [(r["name"], r["failed"], r["pending"]) for r in listed if r["name"] == "s1"] == [("s1", 1, 0)]
