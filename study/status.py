"""``study status``: per config (grid point), what is planned, committed, diverged, failed
and pending, and why the last run's seeds failed or why it stopped.

The driver records its last run's failures in ``OUT/NAME/last_run.json`` (:func:`record_last_run`):
a study run under nohup or a batch job says why seeds failed long after its log is gone.

Import-light: neither torch nor Ray (nor pandas) is imported, so it answers in about a
second; a test runs it in a subprocess and checks ``sys.modules``."""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid
from pathlib import Path
from typing import Any

from study import manifest
from trainables.errors import StudyStateError
from trainables.results import readable, table_dir

LAST_RUN = "last_run.json"
"""The file in a study's folder that says how its last run ended (:func:`record_last_run`)."""


def record_last_run(out: Path, name: str, failed: list[dict[str, Any]], stopped: str | None) -> None:
    """Record how a run of the study ended, atomically: ``failed``, one dict per failed unit
    (trial_id, point as JSON, seeds: the indices it left uncommitted, error: the line the
    driver printed), and ``stopped``: why the run stopped early (SIGINT, a memory kill), or
    None. A run that ended with neither removes the record: nothing is left to explain."""
    path = Path(out) / name / LAST_RUN
    if not failed and stopped is None:
        path.unlink(missing_ok=True)
        return
    record = {"ended_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "stopped": stopped, "failed": failed}
    tmp = path.with_name(f".{LAST_RUN}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True))
    os.replace(tmp, path)


def last_run(out: Path, name: str) -> dict[str, Any] | None:
    """What :func:`record_last_run` wrote (None: the last run ended complete, or none ran;
    an unreadable record counts as none: it only explains)."""
    try:
        record = json.loads((Path(out) / name / LAST_RUN).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def committed_runs(out: Path, name: str) -> dict[tuple[str, int], str]:
    """The status of every committed run of study ``name``, by (trial_id, seed), from its runs
    files. ParquetFile, not read_table: the latter imports pyarrow.dataset and pandas
    (~0.6 s); a runs file that cannot be read is an uncommitted run (``study check`` repairs it)."""
    runs: dict[tuple[str, int], str] = {}
    folder = table_dir(out, "runs", name)
    for path in folder.glob("*.parquet") if folder.is_dir() else []:
        t = readable(path, ["trial_id", "seed", "status"])
        for r in t.to_pylist() if t is not None else []:
            runs[(r["trial_id"], int(r["seed"]))] = r["status"]
    return runs


def _still_failed(record: dict[str, Any] | None, runs: dict[tuple[str, int], str]) -> list[tuple[dict[str, Any], list[int]]]:
    """Each failed unit of the last run (``record``: :func:`last_run`) with the seeds it left
    that are still not committed (``runs``: :func:`committed_runs`; a resume may have
    committed some)."""
    failed = (record or {}).get("failed") or []
    return [(u, [s for s in u.get("seeds", []) if (str(u.get("trial_id")), s) not in runs]) for u in failed]


def last_run_lines(out: Path, name: str, labels: dict[str, str], runs: dict[tuple[str, int], str]) -> list[str]:
    """The last run's failures and stop, as lines under the status table: one line per cause
    (seeds still uncommitted, the grid points by ``labels``: trial_id -> label) and one for
    an early stop. Failed seeds committed since (``runs``: :func:`committed_runs`) are no
    longer named."""
    record = last_run(out, name)
    if record is None:
        return []
    causes: dict[str, tuple[int, list[str]]] = {}  # error -> (seeds still uncommitted, points)
    for unit, seeds in _still_failed(record, runs):
        if not seeds:
            continue
        error, label = str(unit.get("error", "")), labels.get(str(unit.get("trial_id")), "")
        count, points = causes.get(error, (0, []))
        causes[error] = (count + len(seeds), points + ([label] if label and label not in points else []))
    when = str(record.get("ended_at", "?")).replace("T", " ").replace("+00:00", " UTC")
    lines = []
    for error, (count, points) in causes.items():
        named = "; ".join(points[:3]) + ("; ..." if len(points) > 3 else "")
        lines.append(f"last run (ended {when}): {count} seed(s) failed{f' ({named})' if named else ''}: {error}")
    if record.get("stopped"):
        lines.append(f"last run (ended {when}) stopped early: {record['stopped']}")
    return lines


def study_status(out: Path, name: str, runs: dict[tuple[str, int], str]) -> list[dict[str, Any]]:
    """One dict per grid point: point, trial_id, planned, done, ok, diverged, not_learned
    (committed runs whose selection metric never reached the arming level), failed (seeds
    the last run's failed trials left uncommitted: :func:`last_run`) and pending (the rest).
    ``runs``: :func:`committed_runs`."""
    m = manifest.read(out, name)
    if m is None:
        raise StudyStateError(f"no study {name!r} in {out}. Fix: check `study ls --out {out}`")
    status: dict[str, dict[str, int]] = {}
    for (trial_id, _), run_status in runs.items():
        d = status.setdefault(trial_id, {})
        d[run_status] = d.get(run_status, 0) + 1
    failed: dict[str, int] = {}
    for unit, seeds in _still_failed(last_run(out, name), runs):
        failed[str(unit.get("trial_id"))] = failed.get(str(unit.get("trial_id")), 0) + len(seeds)
    rows = []
    for p in m.get("points", []):
        d = status.get(p["trial_id"], {})
        done = sum(d.values())
        lost = min(failed.get(p["trial_id"], 0), max(0, p["seeds"] - done))
        rows.append({
            "point": json.dumps(p.get("point") or {}, sort_keys=True),
            "trial_id": p["trial_id"],
            "planned": p["seeds"],
            "done": done,
            "ok": d.get("ok", 0),
            "diverged": d.get("diverged", 0),
            "not_learned": d.get("not_learned", 0),
            "failed": lost,
            "pending": max(0, p["seeds"] - done - lost),
        })
    return rows
