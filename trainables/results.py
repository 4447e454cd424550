"""The Parquet result sink: table schemas, atomic writes and the commit protocol.

Layout under a results folder OUT (hive-partitioned by study)::

    OUT/tables/<table>/study=<NAME>/<file>.parquet

* ``metrics``, ``evals``, ``predictions`` and ``trials``: one file per (trial, seed), named
  ``<trial_id>-<seed>``; a re-run of the same (trial, seed) replaces it. A ``trials`` file
  holds one row: the unit (bundle) the seed trained in (``unit_id``, config, node, times,
  a tuning candidate's objective) and the seed (``seed``). Readers derive one row per unit
  from the *committed* seeds (``analysis.db``), so ``trials`` is never out of step with
  ``runs``, whatever crashed when. Files written before this layout hold one row per unit
  (named by ``unit_id``, with a ``seeds`` list); readers count only their committed seeds.
  A tuning candidate that ASHA stopped commits no seed: its one ``trials`` row (status
  ``pruned``, a ``seeds`` list, named by ``unit_id``) is a commit unit of its own.
* ``runs``: one file per (trial, seed), written LAST: it is the commit marker. Readers
  (``analysis.db``) show a (trial, seed)'s rows only once its runs row exists. Its
  ``weights`` column names the seed's kept weights (``OUT/<NAME>/weights/...``, written
  before the runs row, :mod:`trainables.weights`), NULL when none were kept. Its ``files``
  column records what the commit wrote (:func:`commit_seed`): a JSON list, per file, of its
  ``table``, ``path`` (relative to OUT), ``rows`` (Parquet), ``bytes`` and ``sha256``, so
  damage after the commit is detectable (``study check``) and repairable.
* ``evaluations``: a later evaluation of kept weights on one split (``study eval``) is its
  own committed unit: ``evals`` and ``predictions`` files named
  ``eval-<split>-<trial_id>-<seed>`` (their rows carry that ``eval_id``), then its
  ``evaluations`` row of the same name LAST (:func:`commit_evaluation`), recording its
  files like a runs row. Readers show an evaluation's rows only once that row exists, and
  then in place of the (trial, seed)'s training-time rows of that split.

Every file is written to a temporary name in the same folder, fsynced and renamed into
place, and the folder is fsynced after the rename, so a crash never leaves a half-written
Parquet file under a final name, nor a commit marker that outlives the files it names.
A file that cannot be read (damaged after its commit) counts as absent: a runs or
evaluations file that cannot be read is an uncommitted unit (:func:`committed`,
:func:`read_rows`).
"""

from __future__ import annotations

import hashlib
import json
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
            ("files", pa.string()),  # JSON: what the commit wrote (see the module doc)
            ("error", pa.string()),  # status failed: why (``study resume --skip-failed``); else NULL
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
            ("files", pa.string()),  # JSON: the evaluation's files, as in runs
        ]
    ),
}
TABLES = ("trials", "runs", "metrics", "evals", "predictions", "evaluations")


def table_dir(out: Path, table: str, study: str) -> Path:
    return Path(out) / "tables" / table / f"study={study}"


def write_atomic(table: pa.Table, path: Path) -> dict[str, Any]:
    """Write ``table`` to ``path`` via a temporary file, fsync, an atomic rename and an fsync
    of the folder; returns what was written: ``rows``, ``bytes`` and ``sha256`` of the file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        pq.write_table(table, tmp, compression="zstd")
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        record = {"rows": table.num_rows, **file_digest(tmp)}
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()
    return record


def file_digest(path: Path) -> dict[str, Any]:
    """``bytes`` and ``sha256`` (hex) of the file at ``path``."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return {"bytes": size, "sha256": h.hexdigest()}


def to_table(name: str, rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Rows -> an Arrow table with the fixed schema of ``name`` (trials: inferred)."""
    if name in SCHEMAS:
        schema = SCHEMAS[name]
        return pa.Table.from_pylist([dict(r) for r in rows], schema=schema)
    return pa.Table.from_pylist([dict(r) for r in rows])


def write_rows(
    out: Path, study: str, name: str, file_stem: str, rows: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Atomically write ``rows`` of table ``name`` as one file (replacing a previous one);
    returns its record: ``table``, ``path`` (relative to ``out``), ``rows``, ``bytes``, ``sha256``.

    The ``study`` column is not stored: the folder ``study=<NAME>`` holds it (hive
    partitioning), so pandas, polars and DuckDB read ``OUT/tables/<table>`` as they are
    (a column of the same name clashed with the folder key)."""
    table = to_table(name, rows)
    if "study" in table.column_names:
        table = table.drop_columns(["study"])
    path = table_dir(out, name, study) / f"{file_stem}.parquet"
    written = write_atomic(table, path)
    return {"table": name, "path": path.relative_to(out).as_posix(), **written}


COMMITTED_TABLES = ("metrics", "evals", "predictions", "trials")
"""The tables a seed's commit writes before its runs row, in that order."""


def commit_seed(
    out: Path,
    study: str,
    trial_id: str,
    seed: int,
    tables: Mapping[str, Sequence[Mapping[str, Any]]],
    run_row: Mapping[str, Any],
    keep: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """Write one (trial, seed)'s rows (``metrics``, ``evals``, ``predictions``; its ``trials``
    row when ``tables`` has one), then ``keep()`` (writes the kept weights that
    ``run_row["weights"]`` names, relative to ``out``), then its runs row last (the commit
    marker), whose ``files`` records every file written before it; returns that record."""
    out = Path(out)
    stem = f"{trial_id}-{seed}"
    files = [
        write_rows(out, study, name, stem, tables.get(name, []))
        for name in COMMITTED_TABLES
        if name != "trials" or name in tables
    ]
    if keep is not None:
        keep()
    if run_row.get("weights"):
        kept = out / str(run_row["weights"])
        fsync_dir(kept.parent)
        files.append({"table": "weights", "path": str(run_row["weights"]), "rows": None, **file_digest(kept)})
    write_rows(out, study, "runs", stem, [{**run_row, "files": json.dumps(files)}])
    return files


SAFE_SPLIT = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def eval_id(split: str, trial_id: str, seed: int) -> str:
    """The file stem (and ``eval_id``) of an evaluation of one (trial, seed) on ``split``:
    ``eval-<split>-<trial_id>-<seed>``; a split name unfit for a file name is replaced by
    ``h`` + a hash of it."""
    name = split if SAFE_SPLIT.fullmatch(split) else "h" + hashlib.sha256(split.encode()).hexdigest()[:16]
    return f"eval-{name}-{trial_id}-{seed}"


def commit_evaluation(
    out: Path, study: str, tables: Mapping[str, Sequence[Mapping[str, Any]]], marker: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Commit one evaluation (of a (trial, seed) on one split): its previous marker is
    removed first (its rows fall back to what they were until this one commits), then its
    ``evals`` and ``predictions`` files are written, then its ``evaluations`` row last, whose
    ``files`` records them (returned)."""
    out = Path(out)
    stem = str(marker["eval_id"])
    old = table_dir(out, "evaluations", study) / f"{stem}.parquet"
    if old.exists():
        old.unlink()
        fsync_dir(old.parent)
    files = [
        write_rows(out, study, name, stem, [{**r, "eval_id": stem} for r in tables.get(name, [])])
        for name in ("evals", "predictions")
    ]
    write_rows(out, study, "evaluations", stem, [{**marker, "files": json.dumps(files)}])
    return files


def fsync_dir(folder: Path) -> None:
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


def readable(path: Path, columns: Sequence[str] | None = None) -> pa.Table | None:
    """The Parquet file at ``path`` (only ``columns`` it has, when given), or None when it
    cannot be read (truncated, overwritten, vanished): damage counts as absence."""
    try:
        f = pq.ParquetFile(path)
        have = None if columns is None else [c for c in columns if c in f.schema_arrow.names]
        return f.read(columns=have)
    except (OSError, pa.ArrowException):
        return None


def read_rows(out: Path, study: str, table: str, columns: Sequence[str]) -> list[dict[str, Any]]:
    """Every row of ``table`` in ``study``'s files (committed or not), only ``columns``; a
    column a file lacks (written before it existed) reads as None; a file that cannot be
    read is skipped (for ``runs`` and ``evaluations``: that unit is not committed)."""
    folder = table_dir(out, table, study)
    rows: list[dict[str, Any]] = []
    for path in sorted(folder.glob("*.parquet")) if folder.is_dir() else []:
        t = readable(path, columns)
        if t is None:
            continue
        for r in t.to_pylist():
            rows.append({c: r.get(c) for c in columns})
    return rows


def committed(out: Path, study: str) -> set[tuple[str, int]]:
    """The (trial_id, seed) pairs of ``study`` that have a readable runs row (are committed)."""
    return {(str(r["trial_id"]), int(r["seed"])) for r in read_rows(out, study, "runs", ["trial_id", "seed"])}


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
