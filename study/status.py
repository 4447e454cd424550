"""``study status``: per config (grid point), what is planned, committed, diverged and pending.

Import-light: neither torch nor Ray (nor pandas) is imported, so it answers in about a
second; a test runs it in a subprocess and checks ``sys.modules``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from study import manifest
from trainables.errors import StudyStateError
from trainables.results import readable, table_dir


def study_status(out: Path, name: str) -> list[dict[str, Any]]:
    """One dict per grid point: point, trial_id, planned, done, ok, diverged, not_learned
    (committed runs whose selection metric never reached the arming level), pending."""
    m = manifest.read(out, name)
    if m is None:
        raise StudyStateError(f"no study {name!r} in {out}. Fix: check `study ls --out {out}`")
    status: dict[str, dict[str, int]] = {}
    folder = table_dir(out, "runs", name)
    if folder.is_dir():
        for path in folder.glob("*.parquet"):
            # ParquetFile, not read_table: the latter imports pyarrow.dataset and pandas (~0.6 s);
            # a runs file that cannot be read is an uncommitted run (`study check` repairs it)
            t = readable(path, ["trial_id", "seed", "status"])
            for r in t.to_pylist() if t is not None else []:
                d = status.setdefault(r["trial_id"], {})
                d[r["status"]] = d.get(r["status"], 0) + 1
    rows = []
    for p in m.get("points", []):
        d = status.get(p["trial_id"], {})
        done = sum(d.values())
        rows.append({
            "point": json.dumps(p.get("point") or {}, sort_keys=True),
            "trial_id": p["trial_id"],
            "planned": p["seeds"],
            "done": done,
            "ok": d.get("ok", 0),
            "diverged": d.get("diverged", 0),
            "not_learned": d.get("not_learned", 0),
            "pending": max(0, p["seeds"] - done),
        })
    return rows
