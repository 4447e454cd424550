"""The Parquet result sink: table schemas, atomic writes and the commit protocol.

Layout under a results folder OUT (hive-partitioned by study)::

    OUT/tables/<table>/study=<NAME>/<file>.parquet

* ``trials``: one file per executed unit (a trial's bundle of seeds), named by unit_id.
* ``metrics``, ``evals``, ``predictions``: one file per (trial, seed), named
  ``<trial_id>-<seed>``; a re-run of the same (trial, seed) replaces it.
* ``runs``: one file per (trial, seed), written LAST: it is the commit marker. Readers
  (``analysis.db``) show a (trial, seed)'s rows only once its runs row exists. Its
  ``weights`` column names the seed's kept weights (``OUT/<NAME>/weights/...``, written
  before the runs row, :mod:`trainables.weights`), NULL when none were kept.
* ``evaluations``: a later evaluation of kept weights on one split (``study eval``) is its
  own committed unit: ``evals`` and ``predictions`` files named
  ``eval-<split>-<trial_id>-<seed>`` (their rows carry that ``eval_id``), then its
  ``evaluations`` row of the same name LAST (:func:`commit_evaluation`). Readers show an
  evaluation's rows only once that row exists, and then in place of the (trial, seed)'s
  training-time rows of that split.

Every file is written to a temporary name in the same folder and renamed into place,
so a crash never leaves a half-written Parquet file under a final name.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

TS = pa.timestamp("us", tz="UTC")

SCHEMAS: dict[str, pa.Schema] = {
    "runs": pa.schema(
        [
            ("study", pa.string()),
            ("trial_id", pa.string()),
            ("unit_id", pa.string()),
            ("seed", pa.int64()),
            ("init_seed", pa.int64()),
            ("order_seed", pa.int64()),
            ("dropout_seed", pa.int64()),
            ("data_seed", pa.int64()),
            ("selected_epoch", pa.int64()),
            ("selected_step", pa.int64()),
            ("epochs_run", pa.int64()),
            ("status", pa.string()),
            ("node", pa.string()),
            ("wall_s", pa.float64()),
            ("committed_at", TS),
            ("weights", pa.string()),  # kept weights, relative to OUT (NULL: none kept)
        ]
    ),
    "metrics": pa.schema(
        [
            ("study", pa.string()),
            ("trial_id", pa.string()),
            ("seed", pa.int64()),
            ("epoch", pa.int64()),
            ("step", pa.int64()),
            ("split", pa.string()),
            ("role", pa.string()),
            ("metric", pa.string()),
            ("value", pa.float64()),
        ]
    ),
    "evals": pa.schema(
        [
            ("study", pa.string()),
            ("trial_id", pa.string()),
            ("seed", pa.int64()),
            ("split", pa.string()),
            ("role", pa.string()),
            ("metric", pa.string()),
            ("value", pa.float64()),
            ("eval_id", pa.string()),  # NULL: written by training; else its evaluations row
        ]
    ),
    "predictions": pa.schema(
        [
            ("study", pa.string()),
            ("trial_id", pa.string()),
            ("seed", pa.int64()),
            ("split", pa.string()),
            ("example_id", pa.int64()),
            ("input", pa.string()),
            ("target", pa.string()),
            ("prediction", pa.string()),
            ("correct", pa.bool_()),
            ("eval_id", pa.string()),
        ]
    ),
    "evaluations": pa.schema(
        [
            ("study", pa.string()),
            ("trial_id", pa.string()),
            ("seed", pa.int64()),
            ("split", pa.string()),
            ("role", pa.string()),
            ("eval_id", pa.string()),
            ("data_hash", pa.string()),
            ("n_examples", pa.int64()),
            ("weights", pa.string()),
            ("device", pa.string()),
            ("hostname", pa.string()),
            ("wall_s", pa.float64()),
            ("evaluated_at", TS),
        ]
    ),
}
TABLES = ("trials", "runs", "metrics", "evals", "predictions", "evaluations")


def table_dir(out: Path, table: str, study: str) -> Path:
    return Path(out) / "tables" / table / f"study={study}"


def write_atomic(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` via a temporary file and an atomic rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        pq.write_table(table, tmp, compression="zstd")
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def to_table(name: str, rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Rows -> an Arrow table with the fixed schema of ``name`` (trials: inferred)."""
    if name in SCHEMAS:
        schema = SCHEMAS[name]
        return pa.Table.from_pylist([dict(r) for r in rows], schema=schema)
    return pa.Table.from_pylist([dict(r) for r in rows])


def write_rows(out: Path, study: str, name: str, file_stem: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Atomically write ``rows`` of table ``name`` as one file (replacing a previous one).

    The ``study`` column is not stored: the folder ``study=<NAME>`` holds it (hive
    partitioning), so pandas, polars and DuckDB read ``OUT/tables/<table>`` as they are
    (a column of the same name clashed with the folder key)."""
    table = to_table(name, rows)
    if "study" in table.column_names:
        table = table.drop_columns(["study"])
    write_atomic(table, table_dir(out, name, study) / f"{file_stem}.parquet")


def commit_seed(
    out: Path,
    study: str,
    trial_id: str,
    seed: int,
    tables: Mapping[str, Sequence[Mapping[str, Any]]],
    run_row: Mapping[str, Any],
    keep: Callable[[], None] | None = None,
) -> None:
    """Write one (trial, seed)'s rows, then ``keep()`` (writes its kept weights, which the
    runs row names), then its runs row last (the commit marker)."""
    stem = f"{trial_id}-{seed}"
    for name in ("metrics", "evals", "predictions"):
        write_rows(out, study, name, stem, tables.get(name, []))
    if keep is not None:
        keep()
    write_rows(out, study, "runs", stem, [run_row])


SAFE_SPLIT = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def eval_id(split: str, trial_id: str, seed: int) -> str:
    """The file stem (and ``eval_id``) of an evaluation of one (trial, seed) on ``split``:
    ``eval-<split>-<trial_id>-<seed>``; a split name unfit for a file name is replaced by
    ``h`` + a hash of it."""
    name = split if SAFE_SPLIT.fullmatch(split) else "h" + hashlib.sha256(split.encode()).hexdigest()[:16]
    return f"eval-{name}-{trial_id}-{seed}"


def commit_evaluation(
    out: Path, study: str, tables: Mapping[str, Sequence[Mapping[str, Any]]], marker: Mapping[str, Any]
) -> None:
    """Commit one evaluation (of a (trial, seed) on one split): its previous marker is
    removed first (its rows fall back to what they were until this one commits), then its
    ``evals`` and ``predictions`` files are written, then its ``evaluations`` row last."""
    stem = str(marker["eval_id"])
    old = table_dir(out, "evaluations", study) / f"{stem}.parquet"
    if old.exists():
        old.unlink()
        _fsync_dir(old.parent)
    for name in ("evals", "predictions"):
        write_rows(out, study, name, stem, [{**r, "eval_id": stem} for r in tables.get(name, [])])
    write_rows(out, study, "evaluations", stem, [marker])


def _fsync_dir(folder: Path) -> None:
    """Make a rename or unlink in ``folder`` durable (no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_rows(out: Path, study: str, table: str, columns: Sequence[str]) -> list[dict[str, Any]]:
    """Every row of ``table`` in ``study``'s files (committed or not), only ``columns``; a
    column a file lacks (written before it existed) reads as None."""
    folder = table_dir(out, table, study)
    rows: list[dict[str, Any]] = []
    for path in sorted(folder.glob("*.parquet")) if folder.is_dir() else []:
        t = pq.read_table(path)
        have = [c for c in columns if c in t.column_names]
        for r in t.select(have).to_pylist():
            rows.append({c: r.get(c) for c in columns})
    return rows


def committed(out: Path, study: str) -> set[tuple[str, int]]:
    """The (trial_id, seed) pairs of ``study`` that have a runs row (are committed)."""
    folder = table_dir(out, "runs", study)
    if not folder.is_dir():
        return set()
    done: set[tuple[str, int]] = set()
    files = [p for p in folder.glob("*.parquet")]
    for path in files:
        t = pq.read_table(path, columns=["trial_id", "seed"])
        for tid, seed in zip(t.column("trial_id").to_pylist(), t.column("seed").to_pylist(), strict=True):
            done.add((tid, int(seed)))
    return done


def flatten(prefix: str, value: Any, into: dict[str, Any]) -> dict[str, Any]:
    """Flatten nested config dicts into ``<block>_<field>`` scalar columns."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            flatten(f"{prefix}_{k}" if prefix else str(k), v, into)
    elif isinstance(value, bool | int | float | str) or value is None:
        into[prefix] = value
    elif isinstance(value, Iterable):
        into[prefix] = str(list(value))
    return into
