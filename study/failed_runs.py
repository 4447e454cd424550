"""Seeds that keep failing: recorded as failed runs, or run again.

A seed whose trial fails (an exception in the task, model or data at that seed; retried
``execution.max_failures`` times) stays uncommitted, so every ``study resume`` runs it
again, and a study with one seed that always fails never completes. ``study resume NAME
--skip-failed`` records each seed the last run left failed (``study status`` lists them,
from ``last_run.json``) as a committed run of status ``failed`` whose ``error`` column says
why (:func:`record_failed`): a result, like a diverged run, that resumes skip and analyses
count apart (the verdict's ``failed`` column; never a value of any statistic, since a
failed run has no metrics). ``study resume NAME --retry-failed`` removes those records, so
the seeds run again (:func:`retry_failed`).

Both run under the study's lock, before the resume plans its units. A recorded failure is
a commit like any other (:func:`trainables.results.commit_seed`): empty ``metrics``,
``evals`` and ``predictions`` files, then its ``runs`` row naming them, so the views and
``study check`` find every file a commit names.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from study.config import StudyConfig
from study.plan import seedsets
from study.status import FAILED, committed_runs, last_run, still_failed
from trainables.results import commit_seed, fsync_dir, readable, table_dir


def record_failed(cfg: StudyConfig, out: Path, name: str) -> dict[str, list[int]]:
    """Commit each seed the last run left failed (and still uncommitted) as a run of status
    :data:`FAILED` with its error; returns the seed indices recorded, by trial_id. Seeds
    the study no longer plans are left alone."""
    runs = committed_runs(out, name)
    sources = {p.trial_id: {s.index: s for s in seedsets(p)} for p in cfg.points}
    now = dt.datetime.now(dt.UTC)
    recorded: dict[str, list[int]] = {}
    for unit, seeds in still_failed(last_run(out, name), runs):
        trial_id = str(unit.get("trial_id"))
        for index in seeds:
            s = sources.get(trial_id, {}).get(index)
            if s is None:
                continue
            commit_seed(out, name, trial_id, index, {}, {  # empty metrics, evals, predictions files
                "study": name, "trial_id": trial_id, "unit_id": None, "seed": index, "init_seed": s.init_seed,
                "order_seed": s.order_seed, "dropout_seed": s.dropout_seed, "data_seed": s.data_seed,
                "status": FAILED, "committed_at": now,
                "error": str(unit.get("error") or "failed (no cause recorded)"),
            })
            recorded.setdefault(trial_id, []).append(index)
    return recorded


def retry_failed(out: Path, name: str) -> dict[str, list[int]]:
    """Remove every recorded failure (runs files of status :data:`FAILED`), so a resume runs
    those seeds again; returns their seed indices by trial_id."""
    folder = table_dir(out, "runs", name)
    removed: dict[str, list[int]] = {}
    for path in sorted(folder.glob("*.parquet")) if folder.is_dir() else []:
        t = readable(path, ["trial_id", "seed", "status", "files"])
        rows = t.to_pylist() if t is not None else []
        if len(rows) == 1 and rows[0]["status"] == FAILED:
            path.unlink()  # the commit marker first: its (empty) files are then uncommitted leftovers
            fsync_dir(folder)
            for f in json.loads(rows[0]["files"] or "[]"):
                (Path(out) / f["path"]).unlink(missing_ok=True)
            removed.setdefault(str(rows[0]["trial_id"]), []).append(int(rows[0]["seed"]))
    return removed
