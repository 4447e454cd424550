"""``study eval NAME``: evaluate a study's kept weights on test splits added or changed since.

A seed study keeps each committed seed's selected parameters (``execution.keep_weights``,
on by default; :mod:`trainables.weights`), together with a hash of every test split's data
at commit time. ``study eval`` rebuilds each task from the study's manifest (its config, its
plugins, the task code as it is *now*) and the data from the same data seed, and evaluates
the kept weights, without retraining, on every test split that is

* **new**: the task has a test split the seed was never evaluated on (a split added in
  code, e.g. a longer length);
* **changed**: the split's data hash differs from the one its visible rows were computed on
  (a published file replaced, a generator fixed). The new rows land *under the split's
  name* and replace the old ones in the views: a split name always means the split as the
  task defines it now, and ``evaluations.data_hash`` records which data that was;
* **requested** with ``--split NAME``: (re-)evaluated even when unchanged, once (a check
  that the kept weights reproduce the committed numbers: they do, bit for bit on a CPU,
  since the evaluation rebuilds the very bundle the seed trained in).

Each (trial, seed, split) is its own committed unit (:func:`trainables.results.commit_evaluation`):
``evals`` and ``predictions`` files ``eval-<split>-<trial_id>-<seed>``, then its
``evaluations`` row last; the views show its rows only once that row exists. Re-running
writes nothing new (an evaluation whose data hash is current is up to date); an interrupted
run leaves nothing visible that is half done and the next run completes it.

How: seeds are evaluated per training bundle (the seed sets and row recorded with the
weights), on the CPU with ``execution.threads`` threads, without Ray, through the trainer's
own evaluation (:meth:`trainables.loop.BundleRun.split_rows`), so a re-evaluated split gives
exactly the committed numbers (runs trained on a GPU agree to float rounding).
"""

from __future__ import annotations

import datetime as dt
import json
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from study import manifest as manifest_mod
from study.config import Point, StudyConfig
from trainables.data import Split, TaskData
from trainables.errors import ConfigError, StudyStateError
from trainables.loop import BundleRun
from trainables.results import commit_evaluation, eval_id, read_rows
from trainables.runtime import configure_worker
from trainables.seeding import SeedSet
from trainables.tasks.base import Task
from trainables.weights import load_weights, split_hash


@dataclass(frozen=True)
class Kept:
    """One committed seed's kept weights."""

    trial_id: str
    seed: int
    weights: str
    """Path relative to the results folder (the runs row's ``weights``)."""
    state: dict[str, torch.Tensor]
    meta: dict[str, Any]


@dataclass
class EvalSummary:
    """What one ``study eval`` did."""

    study: str
    committed: list[tuple[str, str, int, str]] = field(default_factory=list)
    """(split, trial_id, seed, why) per evaluation committed; why: new, changed or requested."""
    up_to_date: int = 0
    """(trial, seed, test split) triples whose visible rows are current."""
    kept: int = 0
    """Committed seeds with kept weights."""
    without_weights: int = 0
    """Committed seeds without kept weights (not evaluated)."""


def evaluate_study(
    out: Path, name: str, splits: Sequence[str] = (), *, redo: frozenset[str] = frozenset(), locked: bool = False
) -> EvalSummary:
    """Evaluate study ``name``'s kept weights on its new or changed test splits (and on
    ``splits``, if given: only those); see the module doc. Every input is checked before
    anything is written. ``redo``: evaluate exactly these evaluations (``eval_id``), whatever
    their state (``study check --repair``); ``locked``: the caller holds the study lock."""
    from study.lock import study_lock

    out = Path(out)
    m = manifest_mod.read(out, name)
    if m is None:
        from study.check import no_manifest

        raise ConfigError("NAME", *no_manifest(out, name))
    if m.get("kind") == "tune":
        raise ConfigError(
            "NAME", f"{name!r} is a tuning study, whose candidates keep no weights",
            f"evaluate a seed study: `study run --from-best {name} --out {out}` keeps its seeds' "
            "weights; then `study eval` that study",
        )
    try:
        seeds = int(m["seeds"])
    except (TypeError, ValueError):
        raise ConfigError("NAME", f"the manifest {out}/{name}/study.json is damaged (seeds)",
                          "restore it, or re-create it with `study run CONFIG --name NAME`") from None
    cfg = manifest_mod.parse_recorded(m, manifest_mod.recorded_config(m), seeds)
    if locked:
        return _evaluate(cfg, out, name, tuple(dict.fromkeys(splits)), redo)
    with study_lock(out, name):
        return _evaluate(cfg, out, name, tuple(dict.fromkeys(splits)), redo)


def _evaluate(
    cfg: StudyConfig, out: Path, name: str, requested: tuple[str, ...], redo: frozenset[str] = frozenset()
) -> EvalSummary:
    summary = EvalSummary(name)
    runs = latest_runs(out, name)
    if not runs:
        raise StudyStateError(
            f"study {name!r} in {out} has no committed runs yet, so no kept weights. "
            f"Fix: finish it first (`study resume {name} --out {out}`)"
        )
    points = {p.trial_id: p for p in cfg.points}
    kept_rows = {key: r for key, r in runs.items() if r.get("weights") and key[0] in points}
    summary.without_weights = len(runs) - len(kept_rows)
    if not kept_rows:
        raise StudyStateError(
            f"study {name!r} kept no weights: none of its {len(runs)} committed runs has any "
            "(they ran with execution.keep_weights: false, before fineline kept weights, or "
            "diverged before any selection), so there is nothing to evaluate. Fix: train it "
            "again under a new name with execution.keep_weights: true "
            f"(the default), `study run CONFIG --name NEW --out {out}`, then `study eval NEW --out {out}`"
        )
    kept = [_load(out, name, key, r) for key, r in sorted(kept_rows.items())]
    summary.kept = len(kept)
    data = _Datasets()
    current: dict[tuple[str, int], dict[str, Split]] = {}  # (trial, data seed) -> test splits
    roles: dict[str, str] = {}
    for k in kept:
        key = (k.trial_id, _data_seed(k))
        if key not in current:
            _, built = data.get(points[k.trial_id], key[1])
            current[key] = {n: s for n, s in built.splits.items() if s.role == "test"}
            roles.update({n: s.role for n, s in built.splits.items()})
    _check_requested(requested, roles)
    markers = _markers(out, name)
    hashes: dict[int, str] = {}  # id(split) -> hash
    todo: dict[tuple[str, str], dict[int, list[tuple[str, str]]]] = {}  # (trial, unit) -> row -> [(split, why)]
    bundles: dict[tuple[str, str], list[Kept]] = {}
    for k in kept:
        unit = (k.trial_id, str(k.meta["unit_id"]))
        bundles.setdefault(unit, []).append(k)
        splits = current[(k.trial_id, _data_seed(k))]
        for split_name, split in splits.items():
            if requested and split_name not in requested:
                continue
            if redo and eval_id(split_name, k.trial_id, k.seed) not in redo:
                continue  # a repair re-runs exactly the evaluations it quarantined
            h = hashes.setdefault(id(split), split_hash(split))
            marker = markers.get((k.trial_id, k.seed, split_name))
            why = "repaired" if redo else _why(k, split_name, h, marker, split_name in requested)
            if why is None:
                summary.up_to_date += 1
            else:
                todo.setdefault(unit, {}).setdefault(int(k.meta["member"]), []).append((split_name, why))
    if not todo:
        return summary
    before = torch.get_num_threads()
    configure_worker(cfg.execution.threads)
    try:
        for unit, members in todo.items():
            _evaluate_bundle(out, name, points[unit[0]], bundles[unit], members, data, hashes, summary)
    finally:
        torch.set_num_threads(before)
    return summary


def _why(k: Kept, split: str, h: str, marker: dict[str, Any] | None, forced: bool) -> str | None:
    """Why (trial, seed) ``k`` needs an evaluation on ``split`` (data hash ``h``), or None
    when its visible rows are current: those of its committed evaluation if it has one,
    else those of training (unless ``forced``)."""
    trained = (k.meta.get("split_hashes") or {}).get(split)
    if marker is not None:
        return None if marker.get("data_hash") == h else "changed"
    if trained is None:
        return "new"
    if trained != h:
        return "changed"
    return "requested" if forced else None


def _evaluate_bundle(
    out: Path, name: str, point: Point, kept: list[Kept], members: dict[int, list[tuple[str, str]]],
    data: _Datasets, hashes: dict[int, str], summary: EvalSummary,
) -> None:
    """Rebuild the bundle these kept seeds trained in (same seed sets and rows; members
    without kept weights keep their initial parameters and are not evaluated) and commit
    every evaluation ``members`` asks for (row -> [(split, why)])."""
    bundle = [SeedSet(**s) for s in kept[0].meta["bundle"]]
    task, built = data.get(point, bundle[0].data_seed)
    run = BundleRun(point.spec, bundle, task, built, "cpu")
    states: list[dict[str, torch.Tensor] | None] = [None] * len(bundle)
    for k in kept:
        states[int(k.meta["member"])] = k.state
    try:
        run.model.load_member_states(states)
    except ValueError as exc:
        raise StudyStateError(
            f"the kept weights of trial {kept[0].trial_id} no longer fit model "
            f"{point.spec.model_name!r} ({exc}): its code changed since they were saved. Fix: "
            "evaluate with the fineline version that trained them (the manifest's git_sha), "
            "or train the study again under a new name"
        ) from None
    by_seed = {int(k.meta["member"]): k for k in kept}
    wanted: dict[str, list[int]] = {}
    why: dict[tuple[str, int], str] = {}
    for row, items in members.items():
        for split_name, reason in items:
            wanted.setdefault(split_name, []).append(row)
            why[(split_name, row)] = reason
    for split_name, rows in wanted.items():
        split = built.splits[split_name]
        t0 = time.perf_counter()
        per_member = run.split_rows(split_name, split, sorted(rows))
        wall = (time.perf_counter() - t0) / max(len(rows), 1)
        for row, tables in per_member.items():
            k = by_seed[row]
            stem = eval_id(split_name, k.trial_id, k.seed)
            keyed = {t: [{"study": name, "trial_id": k.trial_id, **r} for r in rs] for t, rs in tables.items()}
            commit_evaluation(out, name, keyed, {
                "study": name, "trial_id": k.trial_id, "seed": k.seed, "split": split_name,
                "role": split.role, "eval_id": stem, "data_hash": hashes[id(split)],
                "n_examples": len(split), "weights": k.weights, "device": "cpu",
                "hostname": socket.gethostname(), "wall_s": wall,
                "evaluated_at": dt.datetime.now(dt.UTC),
            })
            summary.committed.append((split_name, k.trial_id, k.seed, why[(split_name, row)]))


class _Datasets:
    """Tasks and their data, built once per (task config, data seed)."""

    def __init__(self) -> None:
        self.cache: dict[tuple[str, int], tuple[Task, TaskData]] = {}

    def get(self, point: Point, data_seed: int) -> tuple[Task, TaskData]:
        key = (json.dumps(point.spec.to_dict()["task"], sort_keys=True), int(data_seed))
        if key not in self.cache:
            task = point.spec.make_task()
            task.check()
            self.cache[key] = (task, task.build(int(data_seed)))
        return self.cache[key]


def latest_runs(out: Path, name: str) -> dict[tuple[str, int], dict[str, Any]]:
    """The committed runs rows of ``name`` by (trial_id, seed), the latest commit of each
    (as the ``runs`` view keeps it)."""
    cols = ["trial_id", "seed", "unit_id", "weights", "committed_at", "files"]
    latest: dict[tuple[str, int], dict[str, Any]] = {}
    for r in read_rows(out, name, "runs", cols):
        key = (str(r["trial_id"]), int(r["seed"]))
        old = latest.get(key)
        if old is None or _later(r, old):
            latest[key] = r
    return latest


def _later(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether runs row ``a`` wins over ``b``: later ``committed_at`` (NULL last), then unit_id."""
    if (a["committed_at"] is None) != (b["committed_at"] is None):
        return b["committed_at"] is None
    if a["committed_at"] != b["committed_at"]:
        return bool(a["committed_at"] > b["committed_at"])
    return (a["unit_id"] or "") > (b["unit_id"] or "")


def _markers(out: Path, name: str) -> dict[tuple[str, int, str], dict[str, Any]]:
    """Committed evaluations by (trial_id, seed, split), the latest of each."""
    found: dict[tuple[str, int, str], dict[str, Any]] = {}
    for r in read_rows(out, name, "evaluations", ["trial_id", "seed", "split", "data_hash", "evaluated_at"]):
        key = (str(r["trial_id"]), int(r["seed"]), str(r["split"]))
        old = found.get(key)
        if old is None or (r["evaluated_at"] is not None and (old["evaluated_at"] is None or r["evaluated_at"] > old["evaluated_at"])):
            found[key] = r
    return found


def _load(out: Path, name: str, key: tuple[str, int], run: dict[str, Any]) -> Kept:
    """The kept weights a runs row names, checked to be that (trial, seed)'s."""
    trial_id, seed = key
    rel = str(run["weights"])
    path = out / rel
    fix = (
        f"restore {path} from a backup (the runs row of trial {trial_id} seed {seed} names it), "
        f"or `study check {name} --repair --out {out}`, which trains exactly that seed again "
        "(same seeds, same numbers) and keeps its weights; the other seeds are evaluated once it is back"
    )
    if not path.is_file():
        raise StudyStateError(f"kept weights {path} are missing. Fix: {fix}")
    from study.check import verify_file

    # torch.load does not notice a changed byte inside a tensor: check the file against what
    # the seed's commit recorded (runs.files; commits before checksums recorded none)
    for record in json.loads(run.get("files") or "[]"):
        weights = record.get("table") == "weights" and record.get("path") == rel
        if weights and (problem := verify_file(out, record)) is not None:
            raise StudyStateError(f"kept weights {path} are damaged ({problem}). Fix: {fix}")
    try:
        state, meta = load_weights(path)
    except Exception as exc:  # a truncated or foreign file: torch raises many kinds
        raise StudyStateError(f"kept weights {path} cannot be read ({str(exc).splitlines()[0][:160]}). Fix: {fix}") from None
    if meta.get("trial_id") != trial_id or int(meta.get("seed", -1)) != seed or meta.get("unit_id") != run["unit_id"]:
        raise StudyStateError(
            f"kept weights {path} belong to trial {meta.get('trial_id')} seed {meta.get('seed')} "
            f"(unit {meta.get('unit_id')}), not to the committed run of trial {trial_id} seed {seed} "
            f"(unit {run['unit_id']}). Fix: {fix}"
        )
    return Kept(trial_id, seed, rel, state, meta)


def _data_seed(k: Kept) -> int:
    return int(k.meta["bundle"][int(k.meta["member"])]["data_seed"])


def _check_requested(requested: tuple[str, ...], roles: dict[str, str]) -> None:
    """Every ``--split`` names a test split the task has now (ConfigError naming the choices)."""
    tests = sorted(n for n, r in roles.items() if r == "test")
    for split in requested:
        if split in tests:
            continue
        problem = (
            f"split {split!r} has role {roles[split]!r}, and study eval evaluates test splits"
            if split in roles
            else f"the task has no split {split!r}"
        )
        raise ConfigError("--split", problem, f"name one of its test splits: {', '.join(tests) or '(none)'}")
