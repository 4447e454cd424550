"""``study check [NAME] [--repair]``: verify every commit against what it recorded; repair.

Every commit records what it wrote (:mod:`trainables.results`): a seed's runs row lists its
``metrics``, ``evals``, ``predictions`` and ``trials`` files and its kept weights, a later
evaluation's ``evaluations`` row its ``evals`` and ``predictions`` files, each with its path
(relative to OUT), row count, byte size and sha256. :func:`check_study` verifies

* every committed seed (the latest runs row per (trial_id, seed)): each recorded file
  exists, has its size, reads as Parquet with its row count, and has its sha256;
* every committed evaluation of a committed seed, likewise;
* every runs and evaluations file reads (one that does not is an uncommitted unit, named by
  its file: ``<trial_id>-<seed>``, ``eval-<split>-<trial_id>-<seed>``);
* every other Parquet file of the study (leftovers of uncommitted work, ``trials`` files of
  the older per-unit layout, pruned tuning candidates) reads.

A runs row written before commits recorded their files is *unverified*: its files are
only checked to exist and read. A check reads and writes nothing else; it takes no lock, so
a study being written meanwhile may show work in progress.

:func:`repair_study` (``--repair``; a seed study) holds the study lock throughout: it moves
every file of each damaged seed (its runs file first, then its evaluations, its other
tables' files and its kept weights) and of each damaged evaluation into
``OUT/NAME/quarantine/<UTC time>/`` under their paths relative to OUT (nothing is deleted),
so the seed or evaluation is no longer committed, then runs the study again from its
manifest exactly like ``study resume`` (which trains exactly the uncommitted seeds), then
re-runs exactly the quarantined evaluations of seeds that were not retrained (a retrained
seed was evaluated on every current test split by its training). ``study run`` and
``study resume`` quarantine damaged seeds the same way before planning, after the cheap
part of the check (files present with their recorded sizes, runs files readable).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from analysis.manifest import damaged_fix
from analysis.schema import ROW_TABLES, stem_key
from trainables.errors import StudyStateError
from trainables.results import (
    COMMITTED_TABLES,
    TABLES,
    file_digest,
    fsync_dir,
    readable,
    table_dir,
)

QUARANTINE = "quarantine"
"""The folder (inside the study folder) that repaired files are moved to."""


@dataclass(frozen=True)
class Damage:
    """One damaged file, and the commit unit it belongs to (what a repair re-runs)."""

    study: str
    trial_id: str | None
    seed: int | None
    table: str
    """metrics, evals, predictions, trials, weights, runs or evaluations."""
    file: str
    """Path relative to the results folder."""
    problem: str
    unit: str
    """``run`` (the seed is re-trained), ``evaluation`` (re-evaluated), ``file`` (no
    commit names it: it is only moved out of the way) or ``manifest`` (the study's
    study.json does not read: restored by hand, never moved)."""
    eval_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"study": self.study, "trial_id": self.trial_id, "seed": self.seed, "table": self.table,
                "file": self.file, "problem": self.problem}


COLUMNS = ("study", "trial_id", "seed", "table", "file", "problem")
"""The columns ``study check`` prints per damaged file."""


@dataclass
class StudyCheck:
    """What :func:`check_study` found in one study."""

    study: str
    runs: int = 0
    """Committed runs checked."""
    evaluations: int = 0
    """Committed evaluations checked."""
    unverified: int = 0
    """Runs and evaluations committed before commits recorded their files (read only)."""
    damage: list[Damage] = field(default_factory=list)
    out: Path | None = None
    """The results folder checked (for the fix a damaged manifest prints)."""
    not_committed: int = 0
    """Runs the manifest plans that have no committed runs row (a seed study): never run, or
    quarantined and not (yet) trained again, e.g. after an interrupted repair."""
    writer: str | None = None
    """The driver writing the study now, if any (then those runs are under way)."""
    failed_last_run: bool = False
    """The study's last run recorded failed trials (``study.status.last_run``): resuming
    may fail them again; ``study status`` says why they failed."""

    @property
    def damaged_runs(self) -> set[tuple[str, int]]:
        return {(d.trial_id, d.seed) for d in self.damage if d.unit == "run" and d.trial_id and d.seed is not None}

    @property
    def damaged_evaluations(self) -> set[str]:
        return {d.eval_id for d in self.damage if d.unit == "evaluation" and d.eval_id}

    def summary(self) -> str:
        what = f"{_n(self.runs, 'run')} and {_n(self.evaluations, 'evaluation')} checked"
        old = f", {self.unverified} unverified (committed before checksums)" if self.unverified else ""
        runs_them = (f"being written by {self.writer}" if self.writer else
                     f"`study resume {self.study} --out {self.out}` runs {'it' if self.not_committed == 1 else 'them'}")
        if self.failed_last_run and not self.writer:
            runs_them += f"; the last run's failed trials left some: `study status {self.study} --out {self.out}` says why"
        pending = f"; {_n(self.not_committed, 'planned run')} not committed ({runs_them})" if self.not_committed else ""
        if not self.damage:
            return f"study {self.study}: {what}{old}: no damage{pending}"
        runs, evals = len(self.damaged_runs), len(self.damaged_evaluations)
        files = sum(d.unit == "file" for d in self.damage)
        manifest = [d for d in self.damage if d.unit == "manifest"]
        parts = [_n(runs, "run")] if runs or not manifest else []
        parts += [_n(evals, "evaluation")] if evals else []
        parts += [_n(files, "file no commit names", "files no commit names")] if files else []
        parts += ["the manifest"] if manifest else []
        line = f"study {self.study}: {what}{old}: {_n(len(self.damage), 'damaged file')} ({', '.join(parts)}){pending}"
        if manifest and self.out is not None:  # --repair re-runs from the manifest: it cannot re-create one
            missing = manifest[0].problem == "missing"
            line += f". Fix: {manifest_fix(self.out, self.study, missing)}"
        return line

    @property
    def repairable(self) -> bool:
        """Damage that ``--repair`` mends (anything but the manifest)."""
        return any(d.unit != "manifest" for d in self.damage)


def _n(count: int, one: str, many: str | None = None) -> str:
    """``1 run``, ``2 runs``."""
    return f"{count} {one if count == 1 else (many or one + 's')}"


# ----------------------------------------------------------------------- reading
def _later(a: dict[str, Any], b: dict[str, Any], at: str) -> bool:
    """Whether row ``a`` wins over ``b`` as the views choose: later ``at`` (NULL last), then unit_id."""
    if (a[at] is None) != (b[at] is None):
        return b[at] is None
    if a[at] != b[at]:
        return bool(a[at] > b[at])
    return str(a.get("unit_id") or "") > str(b.get("unit_id") or "")


def _rows(out: Path, study: str, table: str, columns: Sequence[str], key: Sequence[str], at: str
          ) -> tuple[dict[tuple[Any, ...], dict[str, Any]], list[Path]]:
    """The latest row per ``key`` of ``table``'s readable files (each row with its ``_path``),
    and the files that cannot be read."""
    folder = table_dir(out, table, study)
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    unreadable: list[Path] = []
    for path in sorted(folder.glob("*.parquet")) if folder.is_dir() else []:
        t = readable(path, columns)
        if t is None:
            unreadable.append(path)
            continue
        for r in t.to_pylist():
            row = {c: r.get(c) for c in columns} | {"_path": path}
            k = tuple(row[c] for c in key)
            if k not in latest or _later(row, latest[k], at):
                latest[k] = row
    return latest, unreadable


RUN_COLUMNS = ("trial_id", "seed", "unit_id", "weights", "committed_at", "files")
EVAL_COLUMNS = ("trial_id", "seed", "split", "eval_id", "evaluated_at", "files")


def committed_runs(out: Path, study: str) -> tuple[dict[tuple[str, int], dict[str, Any]], list[Path]]:
    """The latest readable runs row per (trial_id, seed), and the unreadable runs files."""
    rows, bad = _rows(out, study, "runs", RUN_COLUMNS, ("trial_id", "seed"), "committed_at")
    return {(str(k[0]), int(k[1])): r for k, r in rows.items()}, bad


# ---------------------------------------------------------------------- checking
def verify_file(out: Path, record: dict[str, Any], thorough: bool = True) -> str | None:
    """What is wrong with one recorded file, or None. Cheap (``thorough=False``): present
    with its recorded size. Thorough: also its content (sha256), and for Parquet whether
    it reads and how many rows it holds."""
    path = Path(out) / str(record["path"])
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    if record.get("bytes") is not None and size != int(record["bytes"]):
        return f"size {size} bytes, its commit wrote {int(record['bytes'])}"
    if not thorough or file_digest(path)["sha256"] == record.get("sha256"):
        return None
    if record.get("table") != "weights":
        t = readable(path)
        if t is None:
            return "does not read as Parquet"
        if record.get("rows") is not None and t.num_rows != int(record["rows"]):
            return f"{t.num_rows} rows, its commit wrote {int(record['rows'])}"
    return "content differs from what its commit wrote (sha256)"


def _legacy_files(out: Path, study: str, run: dict[str, Any], stem: str, tables: Iterable[str]) -> list[dict[str, Any]]:
    """The files an unverified commit (no ``files``) is expected to have: one per table, plus
    the weights it names."""
    recs = [{"table": t, "path": (table_dir(out, t, study) / f"{stem}.parquet").relative_to(out).as_posix()}
            for t in tables]
    if run.get("weights"):
        recs.append({"table": "weights", "path": str(run["weights"])})
    return recs


def _verify_unit(out: Path, records: list[dict[str, Any]], thorough: bool, legacy: bool) -> list[tuple[dict[str, Any], str]]:
    """(record, problem) for every damaged file of one commit."""
    bad = []
    for rec in records:
        if legacy:  # committed before checksums: present, and readable
            path = Path(out) / rec["path"]
            problem = "missing" if not path.is_file() else None
            if problem is None and rec["table"] != "weights" and thorough and readable(path) is None:
                problem = "does not read as Parquet"
        else:
            problem = verify_file(out, rec, thorough)
        if problem is not None:
            bad.append((rec, problem))
    return bad


def check_study(out: Path, study: str, thorough: bool = True) -> StudyCheck:
    """Verify every commit of ``study`` in ``out`` (see the module doc). ``thorough=False``:
    only the cheap part (files present with their sizes; runs files readable), as
    ``study run`` does before planning."""
    out = Path(out)
    found = StudyCheck(study, out=out)
    runs, bad_runs = committed_runs(out, study)
    recorded: set[str] = set()
    for path in bad_runs:
        key = stem_key(path.stem)
        recorded.add(_rel(out, path))
        found.damage.append(Damage(
            study, key[0] if key else None, key[1] if key else None, "runs", _rel(out, path),
            "does not read as Parquet (so the run is not committed)", "run" if key else "file",
        ))
    for (trial_id, seed), run in sorted(runs.items()):
        found.runs += 1
        recorded.add(_rel(out, run["_path"]))
        legacy = not run.get("files")
        if legacy:
            found.unverified += 1
            records = _legacy_files(out, study, run, f"{trial_id}-{seed}", ("metrics", "evals", "predictions"))
        else:
            records = json.loads(run["files"])
        recorded.update(r["path"] for r in records)
        for rec, problem in _verify_unit(out, records, thorough, legacy):
            found.damage.append(Damage(study, trial_id, seed, rec["table"], rec["path"], problem, "run"))
    if thorough:
        _check_evaluations(out, study, runs, found, recorded)
        _check_other_files(out, study, found, recorded)
        manifest = _check_manifest(out, study, found)
        found.not_committed = _not_committed(study, manifest, runs)
        if found.not_committed:
            from study.lock import writer
            from study.status import last_run

            found.writer = writer(out, study)
            found.failed_last_run = bool((last_run(out, study) or {}).get("failed"))
    return found


def _check_manifest(out: Path, study: str, found: StudyCheck) -> dict[str, Any] | None:
    """The study's manifest; one that does not read, or is missing while the study has
    results (``study resume``, ``eval`` and ``status`` refuse both), is damage too, which no
    repair re-creates (unit ``manifest``)."""
    from study import manifest

    path = manifest.manifest_path(out, study)
    data, why = manifest.damage(out, study)
    if why is not None:
        found.damage.append(Damage(study, None, None, "manifest", _rel(out, path),
                                   f"does not read as a manifest ({why})", "manifest"))
    elif data is None and not path.exists() and _has_results(out, study):
        found.damage.append(Damage(study, None, None, "manifest", _rel(out, path), "missing", "manifest"))
    return data


def _has_results(out: Path, study: str) -> bool:
    """Whether any table of ``study`` holds a Parquet file."""
    return any(_glob(table_dir(out, t, study), "*.parquet") for t in TABLES)


def no_manifest(out: Path, study: str) -> tuple[str, str]:
    """(problem, fix) for a command that needs ``study``'s manifest and finds none: a study
    with results whose ``study.json`` is gone (``study ls`` lists it) gets the way to mend
    it; a name no study has, the way to find the right one."""
    from study.manifest import manifest_path

    if _has_results(out, study):
        return (f"study {study!r} in {out} has results but no manifest ({manifest_path(out, study)})",
                manifest_fix(out, study, True))
    return f"no study {study!r} in {out}", f"check `study ls --out {out}`"


def manifest_fix(out: Path, study: str, missing: bool) -> str:
    """How to mend the manifest of ``study``: restore it, or re-create it with ``study run``
    (which keeps the committed runs); a damaged one is moved away first."""
    from study.manifest import manifest_path

    if not missing:
        return damaged_fix(out, study)
    return (f"restore {manifest_path(out, study)} from a backup, or re-create it with `study run CONFIG "
            f"--name {study} --out {out}` given the study's own config and overrides (committed runs are kept)")


def _not_committed(study: str, manifest: dict[str, Any] | None, runs: dict[tuple[str, int], Any]) -> int:
    """Planned runs of seed study ``study`` without a committed runs row (0 for a tuning study,
    or without a readable manifest)."""
    from analysis.errors import AnalysisError
    from analysis.manifest import parse_manifest

    if manifest is None:
        return 0
    try:
        m = parse_manifest(manifest, default_name=study)
    except AnalysisError:
        return 0
    if m.kind == "tune" or m.planned is None:
        return 0
    return max(int(m.planned) - len(runs), 0)


def _check_evaluations(out: Path, study: str, runs: dict[tuple[str, int], Any], found: StudyCheck,
                       recorded: set[str]) -> None:
    markers, bad = _rows(out, study, "evaluations", EVAL_COLUMNS, ("eval_id",), "evaluated_at")
    for path in bad:
        key = stem_key(path.stem)
        recorded.add(_rel(out, path))
        if key is not None and key not in runs:
            continue  # an evaluation of an uncommitted seed is not shown anyway
        found.damage.append(Damage(
            study, key[0] if key else None, key[1] if key else None, "evaluations", _rel(out, path),
            "does not read as Parquet (so the evaluation is not committed)",
            "evaluation" if key else "file", path.stem,
        ))
    for (stem,), m in sorted(markers.items()):
        recorded.add(_rel(out, m["_path"]))
        key = (str(m["trial_id"]), int(m["seed"]))
        if key not in runs:
            continue
        found.evaluations += 1
        legacy = not m.get("files")
        if legacy:
            found.unverified += 1
            records = _legacy_files(out, study, {}, str(stem), ("evals", "predictions"))
        else:
            records = json.loads(m["files"])
        recorded.update(r["path"] for r in records)
        for rec, problem in _verify_unit(out, records, True, legacy):
            found.damage.append(Damage(study, key[0], key[1], rec["table"], rec["path"], problem,
                                       "evaluation", str(stem)))


def _check_other_files(out: Path, study: str, found: StudyCheck, recorded: set[str]) -> None:
    """Every Parquet file no commit names (leftovers, older trials files, pruned candidates)
    must at least read: the views leave out one that does not, with a warning. A metrics,
    evals or predictions file whose name is no commit's (``<trial_id>-<seed>``, or an
    evaluation's) is a stray copy the views leave out: named, and moved by ``--repair``."""
    for table in TABLES:
        folder = table_dir(out, table, study)
        for path in sorted(folder.glob("*.parquet")) if folder.is_dir() else []:
            rel = _rel(out, path)
            if rel in recorded:
                continue
            key = stem_key(path.stem)
            try:
                pq.read_schema(path)
            except (OSError, pa.ArrowException):
                found.damage.append(Damage(
                    study, key[0] if key else None, key[1] if key else None, table, rel,
                    "does not read as Parquet (not part of any commit)", "file",
                ))
                continue
            if key is None and table in ROW_TABLES:  # e.g. `X-0 (1).parquet`: a copy
                found.damage.append(Damage(
                    study, None, None, table, rel,
                    "no commit names this file (a copy?); the views leave it out", "file",
                ))


def _rel(out: Path, path: Path) -> str:
    return Path(path).relative_to(out).as_posix()


def studies(out: Path) -> list[str]:
    """Every study of ``out``: with a manifest or with results (sorted)."""
    from analysis.db import result_studies
    from analysis.manifest import study_names

    return sorted(set(study_names(out)) | set(result_studies(out)))


# -------------------------------------------------------------------- quarantine
@dataclass
class Quarantined:
    """What :func:`quarantine` moved."""

    folder: Path | None = None
    files: list[str] = field(default_factory=list)
    runs: set[tuple[str, int]] = field(default_factory=set)
    evaluations: set[str] = field(default_factory=set)
    """The ``eval_id`` of each evaluation moved on its own (its seed was not retrained)."""


def quarantine(out: Path, study: str, found: StudyCheck) -> Quarantined:
    """Move every file of each damaged run and evaluation of ``found`` (and each damaged file
    no commit names) to ``OUT/STUDY/quarantine/<UTC time>/``; the caller holds the lock."""
    out = Path(out)
    moved = Quarantined()
    if not found.damage:
        return moved
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    moved.folder = out / study / QUARANTINE / stamp
    runs, _ = committed_runs(out, study)
    for trial_id, seed in sorted(found.damaged_runs):
        _move_run(out, study, trial_id, seed, runs.get((trial_id, seed)), moved)
        moved.runs.add((trial_id, seed))
    for stem in sorted(found.damaged_evaluations):
        key = stem_key(stem)
        if key is not None and key in moved.runs:
            continue  # went with its seed
        _move_evaluation(out, study, stem, moved)
        moved.evaluations.add(stem)
    for d in found.damage:
        if d.unit == "file":
            _move(out, out / d.file, moved)
    return moved


def quarantine_damaged(out: Path, study: str) -> Quarantined:
    """The cheap check of ``study run`` / ``study resume`` (before planning, lock held): every
    committed seed whose recorded files are missing or of another size, or whose runs file
    does not read, is quarantined with its evaluations, so it runs again."""
    found = check_study(out, study, thorough=False)
    found.damage = [d for d in found.damage if d.unit == "run"]
    return quarantine(out, study, found)


def _move_run(out: Path, study: str, trial_id: str, seed: int, run: dict[str, Any] | None, moved: Quarantined) -> None:
    """A seed's runs file(s) first (it is then uncommitted), its evaluations, its other files."""
    stem = f"{trial_id}-{seed}"
    runs_dir = table_dir(out, "runs", study)
    for path in sorted(runs_dir.glob("*.parquet")) if runs_dir.is_dir() else []:
        if path.stem == stem:
            _move(out, path, moved)
            continue
        t = readable(path, ["trial_id", "seed"])
        if t is not None and any((r["trial_id"], r["seed"]) == (trial_id, seed) for r in t.to_pylist()):
            _move(out, path, moved)
    for path in sorted(_glob(table_dir(out, "evaluations", study), f"eval-*-{stem}.parquet")):
        _move_evaluation(out, study, path.stem, moved)
    paths = [out / r["path"] for r in json.loads(run["files"])] if run and run.get("files") else []
    paths += [table_dir(out, t, study) / f"{stem}.parquet" for t in COMMITTED_TABLES]
    if run and run.get("weights"):
        paths.append(out / str(run["weights"]))
    paths.append(out / study / "weights" / trial_id / f"seed-{seed}.pt")
    for path in paths:
        _move(out, path, moved)


def _move_evaluation(out: Path, study: str, stem: str, moved: Quarantined) -> None:
    """An evaluation's marker first, then its evals and predictions files."""
    for table in ("evaluations", "evals", "predictions"):
        _move(out, table_dir(out, table, study) / f"{stem}.parquet", moved)


def _glob(folder: Path, pattern: str) -> list[Path]:
    return list(folder.glob(pattern)) if folder.is_dir() else []


def _move(out: Path, path: Path, moved: Quarantined) -> None:
    """Move ``path`` (if it exists) to the same relative path under the quarantine folder."""
    if not path.is_file() or moved.folder is None:
        return
    rel = path.relative_to(out)
    dest = moved.folder / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(path, dest)
    fsync_dir(path.parent)
    fsync_dir(dest.parent)
    moved.files.append(rel.as_posix())


# ------------------------------------------------------------------------ repair
@dataclass
class Repair:
    """What :func:`repair_study` did."""

    before: StudyCheck
    moved: Quarantined
    ran: int = 0
    """Runs trained again."""
    evaluated: int = 0
    """Evaluations run again."""
    not_evaluated: list[str] = field(default_factory=list)
    """Quarantined evaluations that could not be run again (their split is gone from the task)."""
    after: StudyCheck | None = None


def repair_study(
    out: Path, study: str, address: str | None = None, num_cpus: int | None = None,
    on_moved: Callable[[StudyCheck, Quarantined], None] | None = None,
) -> Repair:
    """Quarantine the damaged runs and evaluations of seed study ``study`` and run them
    again (see the module doc); returns what was done, with a check made afterwards.
    ``on_moved`` is called once the damaged files are moved, before anything runs again
    (the CLI prints the damage and the move then, so an interrupted repair still says it)."""
    from study import manifest
    from study.lock import study_lock

    out = Path(out)
    first = check_study(out, study)
    if not first.damage:
        return Repair(first, Quarantined(), after=first)
    m = manifest.read(out, study)
    if m is None:
        raise StudyStateError(
            f"study {study!r} in {out} has no manifest ({out / study / 'study.json'}), so --repair "
            f"cannot run it again. Fix: {manifest_fix(out, study, missing=True)}"
        )
    if m.get("kind") == "tune":
        raise StudyStateError(
            f"study {study!r} is a tuning study: its candidates' objectives live in Optuna, so "
            f"--repair does not re-run them. Fix: restore the damaged files named above from a "
            f"backup, or run the search again under a new name (`study tune CONFIG --name NEW --out {out}`)"
        )
    from study.runner import _run_locked, check_before_ray, recorded_study

    cfg, extra = recorded_study(out, study, m)
    facts = check_before_ray(cfg, address, num_cpus)
    with study_lock(out, study):
        before = check_study(out, study)  # again, now that no other driver writes
        moved = quarantine(out, study, before)
        repair = Repair(before, moved)
        if on_moved is not None:
            on_moved(before, moved)
        if moved.runs:
            counts = _run_locked(cfg, study, out, address, num_cpus, "seeds", extra, facts)
            repair.ran = int(counts.get("ran", 0))
        if moved.evaluations:
            from study.evaluate import evaluate_study

            done = evaluate_study(out, study, redo=frozenset(moved.evaluations), locked=True)
            repair.evaluated = len(done.committed)
            from trainables.results import eval_id

            redone = {eval_id(s, t, seed) for s, t, seed, _ in done.committed}
            repair.not_evaluated = sorted(moved.evaluations - redone)
    repair.after = check_study(out, study)
    return repair
