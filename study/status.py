"""``study status``: per config (grid point), what is planned, committed, diverged, failed
and pending, and why the last run's seeds failed or why it stopped.

The driver records its last run's failures in ``OUT/NAME/last_run.json`` (:func:`record_last_run`):
a study run under nohup or a batch job says why seeds failed long after its log is gone.

Import-light: neither torch nor Ray (nor pandas) is imported, so it answers in about a
second; a test runs it in a subprocess and checks ``sys.modules``."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import uuid
from pathlib import Path
from typing import Any

from analysis.manifest import candidate_rank
from study import manifest
from trainables.errors import StudyStateError
from trainables.results import readable, table_dir

LAST_RUN = "last_run.json"
"""The file in a study's folder that says how its last run ended (:func:`record_last_run`)."""


def record_last_run(out: Path, name: str, failed: list[dict[str, Any]], stopped: str | None) -> None:
    """Record how a run of the study ended, atomically: ``failed``, one dict per failed unit
    (trial_id, point as JSON, seeds: the indices it left uncommitted, error: the line the
    driver printed; a tuning study's: one per cause, error and the line printed), and
    ``stopped``: why the run stopped early (SIGINT, a memory kill), or None. A run that
    ended with neither removes the record: nothing is left to explain."""
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


def still_failed(record: dict[str, Any] | None, runs: dict[tuple[str, int], str]) -> list[tuple[dict[str, Any], list[int]]]:
    """Each failed unit of the last run (``record``: :func:`last_run`) with the seeds it left
    that are still not committed (``runs``: :func:`committed_runs`; a resume may have
    committed some)."""
    failed = (record or {}).get("failed") or []
    return [(u, [s for s in u.get("seeds", []) if (str(u.get("trial_id")), s) not in runs]) for u in failed]


def last_run_lines(out: Path, name: str, labels: dict[str, str], runs: dict[tuple[str, int], str]) -> list[str]:
    """The last run's failures and stop, as lines under the status table: one line per cause
    (the seeds still uncommitted, by grid point: ``labels``, trial_id -> label), what to do
    about them, and one line for an early stop. Failed seeds committed since (``runs``:
    :func:`committed_runs`) are no longer named."""
    record = last_run(out, name)
    if record is None:
        return []
    causes: dict[str, dict[str, list[int]]] = {}  # error -> trial_id -> seeds still uncommitted
    retry = False  # a failure that resuming may mend (a refused config is refused again)
    for unit, seeds in still_failed(record, runs):
        if seeds:
            by_trial = causes.setdefault(str(unit.get("error", "")), {})
            by_trial.setdefault(str(unit.get("trial_id")), []).extend(seeds)
            retry = retry or not unit.get("refused", False)
    when = _ended(record)
    lines = []
    for error, by_trial in causes.items():
        count = sum(map(len, by_trial.values()))
        shown = dict(list(by_trial.items())[:3])
        named = seeds_text(shown, labels) + ("; ..." if len(by_trial) > 3 else "")
        lines.append(f"last run (ended {when}): {count} seed(s) failed ({named}): {error}")
    if retry:
        lines.append(f"then: fix the cause and `study resume {name} --out {out}` runs them again; or `study resume "
                     f"{name} --out {out} --skip-failed` records them as failed runs (not run again)")
    return lines + _stop_line(record)


FAILED = "failed"
"""The ``runs.status`` of a seed recorded as failed (:mod:`study.failed_runs`)."""


def seeds_text(by_trial: dict[str, list[int]], labels: dict[str, str]) -> str:
    """``lr=0.5: seeds 3, 7; lr=1: seed 2`` (``labels``: trial_id -> grid point label; a
    config without one is named by its trial_id, one labelled "" not at all)."""
    parts = []
    for trial_id, seeds in sorted(by_trial.items()):
        label = labels.get(trial_id, trial_id)
        listed = f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, sorted(seeds)))}"
        parts.append(f"{label}: {listed}" if label else listed)
    return "; ".join(parts)


def recorded_failed_lines(out: Path, name: str, labels: dict[str, str], runs: dict[tuple[str, int], str]) -> list[str]:
    """One line for the seeds recorded as failed runs (``study resume --skip-failed``), with
    how to run them again; none without any. ``labels``: trial_id -> grid point label."""
    by_trial: dict[str, list[int]] = {}
    for (trial_id, seed), run_status in runs.items():
        if run_status == FAILED:
            by_trial.setdefault(trial_id, []).append(seed)
    if not by_trial:
        return []
    n = sum(len(v) for v in by_trial.values())
    return [f"{n} seed(s) recorded as failed runs, not run again ({seeds_text(by_trial, labels)}; their errors: "
            f"`study sql \"SELECT trial_id, seed, error FROM runs WHERE study = '{name}' AND status = 'failed'\" "
            f"--out {out}`). Run them again: study resume {name} --out {out} --retry-failed"]


def driver_lines(out: Path, name: str, *, more: bool = False) -> list[str]:
    """Whether a driver writes the study now (the lock's holder), or the last one was killed
    before it could record how it ended (its details left in the lock file): one line, or
    none. ``more``: ``last run`` lines follow, which are then about the run before a running
    one."""
    from study.lock import killed_holder, writer

    if holder := writer(out, name):
        return [f"running now: {holder}" + ("; the lines below are about the run before it" if more else "")]
    if dead := killed_holder(out, name):
        return [f"last run: {dead} did not end: its driver was killed (SIGKILL, out of memory, a lost "
                f"machine or session); committed runs are kept. Fix: study resume {name} --out {out}"]
    return []


def _ended(record: dict[str, Any]) -> str:
    """When the recorded run ended, as ``2026-11-27 15:23:08 UTC``."""
    return str(record.get("ended_at", "?")).replace("T", " ").replace("+00:00", " UTC")


def _stop_line(record: dict[str, Any]) -> list[str]:
    """The line saying why the recorded run stopped early, if it did."""
    return [f"last run (ended {_ended(record)}) stopped early: {record['stopped']}"] if record.get("stopped") else []


def with_uncommitted_failures(out: Path, infos: list[Any]) -> list[Any]:
    """``study ls`` rows (:class:`analysis.db.StudyInfo`) counting failures as ``study status``
    does: a seed study's ``failed`` adds the seeds its last run's failed trials left
    uncommitted, and its ``pending`` leaves them out (it counted them as pending while
    ``study status`` said failed). Only a study whose last run failed is read again."""
    rows = []
    for info in infos:
        record = last_run(out, info.name) if info.kind == "seeds" and info.pending else None
        if record and record.get("failed"):
            lost = sum(len(seeds) for _, seeds in still_failed(record, committed_runs(out, info.name)))
            lost = min(lost, info.pending)
            info = dataclasses.replace(info, failed=info.failed + lost, pending=info.pending - lost)
        rows.append(info)
    return rows


def study_manifest(out: Path, name: str) -> dict[str, Any]:
    """Study ``name``'s manifest, or an error that says where to look."""
    m = manifest.read(out, name)
    if m is None:
        from study.check import no_manifest

        problem, fix = no_manifest(out, name)
        raise StudyStateError(f"{problem}. Fix: {fix}")
    return m


def _by_config(runs: dict[tuple[str, int], str]) -> dict[str, dict[str, int]]:
    """trial_id -> run status -> committed runs (``runs``: :func:`committed_runs`)."""
    counts: dict[str, dict[str, int]] = {}
    for (trial_id, _), run_status in runs.items():
        d = counts.setdefault(trial_id, {})
        d[run_status] = d.get(run_status, 0) + 1
    return counts


def study_status(out: Path, name: str, m: dict[str, Any], runs: dict[tuple[str, int], str]) -> list[dict[str, Any]]:
    """One dict per grid point of seed study ``name`` (manifest ``m``): point, trial_id,
    planned, done, ok, diverged, not_learned (committed runs whose selection metric never
    reached the arming level), failed (seeds the last run's failed trials left uncommitted:
    :func:`last_run`; and committed runs recorded as failed by ``study resume --skip-failed``,
    also in done) and pending (the rest). ``runs``: :func:`committed_runs`."""
    status = _by_config(runs)
    failed: dict[str, int] = {}
    for unit, seeds in still_failed(last_run(out, name), runs):
        failed[str(unit.get("trial_id"))] = failed.get(str(unit.get("trial_id")), 0) + len(seeds)
    rows = []
    for p in m.get("points", []):
        d = status.get(p["trial_id"], {})
        done = sum(d.values())
        lost = min(failed.get(p["trial_id"], 0), max(0, p["seeds"] - done))
        recorded = d.get("failed", 0)  # committed as failed (`study resume --skip-failed`)
        rows.append({
            "point": json.dumps(p.get("point") or {}, sort_keys=True),
            "trial_id": p["trial_id"],
            "planned": p["seeds"],
            "done": done,
            "ok": d.get("ok", 0),
            "diverged": d.get("diverged", 0),
            "not_learned": d.get("not_learned", 0),
            "failed": lost + recorded,
            "pending": max(0, p["seeds"] - done - lost),
        })
    return rows


CANDIDATE_STATES = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running", "WAITING": "waiting"}
"""Optuna's trial states as ``study status`` names them."""


def tuning_status(out: Path, name: str, m: dict[str, Any], runs: dict[tuple[str, int], str]) -> list[dict[str, Any]]:
    """One dict per candidate of tuning study ``name`` (manifest ``m``), from its Optuna
    storage in ``out``: candidate (Optuna's number), point (its parameters, JSON), trial_id,
    state (complete, pruned, failed, running, waiting; interrupted: Optuna's RUNNING while no
    driver runs the study, which a resume settles), objective (a complete candidate's),
    planned (its seeds), done, ok, diverged, not_learned (its committed runs: ``runs``, from
    :func:`committed_runs`), failed (a failed candidate's uncommitted seeds) and pending (a
    running or waiting one's). Imports Optuna (a seed study's status does not)."""
    import optuna

    db = manifest.study_dir(out, name) / manifest.OPTUNA_DB
    if not db.is_file():
        raise StudyStateError(f"tuning study {name!r} has no Optuna storage at {db}. Fix: run `study tune` for it "
                              f"(or restore {db.name} beside its manifest)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=name, storage=manifest.storage_url(out, name))
    per_candidate = int((m.get("tune") or {}).get("seeds_per_candidate") or 0)
    by_trial = _by_config(runs)
    from study.lock import writer

    driving = writer(out, name) is not None  # without a driver, a RUNNING candidate was interrupted
    rows = []
    for t in study.get_trials(deepcopy=False):
        trial_id = str(t.user_attrs.get("trial_id", ""))
        planned = len(t.user_attrs.get("seeds") or []) or per_candidate
        counts = by_trial.get(trial_id, {})
        done = sum(counts.values())
        state = CANDIDATE_STATES.get(t.state.name, t.state.name.lower())
        if state == "running" and not driving:
            state = "interrupted"  # Optuna still says RUNNING: a resume settles it from Parquet
        left = max(0, planned - done)
        rows.append({
            "candidate": t.number,
            "point": json.dumps(t.params, sort_keys=True),
            "trial_id": trial_id,
            "state": state,
            "objective": t.user_attrs.get("objective", t.value) if state == "complete" else None,
            "objective_std": t.user_attrs.get("objective_std") if state == "complete" else None,
            "planned": planned,
            "done": done,
            "ok": counts.get("ok", 0),
            "diverged": counts.get("diverged", 0),
            "not_learned": counts.get("not_learned", 0),
            "failed": left if state == "failed" else 0,
            "pending": left if state in ("running", "waiting", "interrupted") else 0,
        })
    return rows


def tuning_lines(
    out: Path, name: str, rows: list[dict[str, Any]], m: dict[str, Any], labels: dict[int, str]
) -> list[str]:
    """Lines under a tuning study's status table: how far the search is (against the
    requested candidates, manifest ``m``'s ``tune_trials``), its best complete candidate
    so far (``labels``: candidate -> parameter label), and why the last run's candidates
    failed or it stopped early (:func:`last_run`)."""
    by_state: dict[str, int] = {}
    for r in rows:
        by_state[r["state"]] = by_state.get(r["state"], 0) + 1
    finished = by_state.get("complete", 0) + by_state.get("pruned", 0)
    requested = m.get("tune_trials")
    of = f" of {requested} requested" if requested else ""
    parts = [f"{by_state[s]} {s}" for s in ("complete", "pruned") if by_state.get(s)]
    line = (f"search: {finished}{of} candidates finished ({', '.join(parts) or 'none yet'}), "
            f"{by_state.get('failed', 0)} failed, {by_state.get('running', 0) + by_state.get('waiting', 0)} running or waiting")
    if by_state.get("interrupted"):
        line += (f", {by_state['interrupted']} interrupted (the driver stopped while they ran; "
                 f"`study resume {name} --out {out}` settles them from the committed seeds)")
    lines = [line]
    objective = m.get("objective") or {}
    scored = [r for r in rows if r["state"] == "complete" and r["objective"] is not None
              and math.isfinite(float(r["objective"]))]  # every seed diverged: NaN
    if scored:
        maximize = objective.get("direction") == "maximize"
        best = min(scored, key=lambda r: candidate_rank(float(r["objective"]), r.get("objective_std"),
                                                         str(r.get("trial_id", "")), maximize=maximize))
        what = " ".join(str(objective[k]) for k in ("split", "metric") if objective.get(k)) or "objective"
        lines.append(f"best so far: candidate {best['candidate']} ({labels.get(best['candidate'], '')}): "
                     f"{what} {float(best['objective']):.6g} ({objective.get('direction', 'minimize')})")
    record = last_run(out, name) or {}
    lines += [f"last run (ended {_ended(record)}): {c.get('line') or c.get('error')}" for c in record.get("failed") or []]
    return lines + _stop_line(record)
