"""Planning: which (trial, seed) pairs a study still needs, grouped into units.

A *unit* is one Ray Tune trial: one grid point x a bundle of seed indices that share a
data seed. Planning reads the committed runs (``trainables.results.committed``), so a
re-run or resume schedules only the missing seeds and never duplicates a row.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

from study.config import Point, StudyConfig
from trainables.registry import MODELS
from trainables.results import committed, flatten
from trainables.seeding import SeedSet, derive_seedset
from trainables.trackers import driver_settings


@dataclass(frozen=True)
class Unit:
    """One Ray Tune trial: a point and a bundle of seeds."""

    point: Point
    seeds: tuple[SeedSet, ...]

    @property
    def unit_id(self) -> str:
        key = f"{self.point.trial_id}:{','.join(str(s.index) for s in self.seeds)}"
        return hashlib.sha256(key.encode()).hexdigest()[:16]


def seedsets(point: Point) -> list[SeedSet]:
    s = point.seeds
    pinned: dict[str, int] = {str(k): v for k, v in s.pinned.items()}
    return [derive_seedset(s.root, i, s.vary, pinned) for i in range(s.count)]


def bundle_count(
    cfg: StudyConfig, n_seeds: int, device: str, cpus: float, cap: int | None, limit: int | None = None
) -> int:
    """How many bundles a point's ``n_seeds`` seeds form (they are then split evenly).

    An integer ``execution.bundle_size`` K gives ``ceil(n / K)``. ``auto``: on a GPU, bundles
    of up to 64; on CPUs, one bundle per worker, or, where the model caps the useful bundle
    size (``Model.cpu_bundle_cap``), enough bundles of at most the cap, rounded up to a
    multiple of the workers so the last wave keeps every CPU busy. ``limit``: the most seeds
    the model can put in one bundle (``Model.max_bundle``), kept on any device.
    """
    if n_seeds == 0:
        return 0
    k = cfg.execution.bundle_size
    if k != "auto":
        return math.ceil(n_seeds / int(k))
    if device == "cuda":
        return math.ceil(n_seeds / min(64, limit or 64))
    if limit is not None:
        cap = min(cap, limit) if cap is not None else limit
    workers = max(1, int(cpus // cfg.execution.cpus_per_trial))
    per_worker = math.ceil(n_seeds / workers)
    if cap is None or per_worker <= cap:
        return math.ceil(n_seeds / per_worker)
    return min(n_seeds, workers * math.ceil(math.ceil(n_seeds / cap) / workers))


def even_split(items: list[SeedSet], parts: int) -> list[list[SeedSet]]:
    """``items`` in order, cut into ``parts`` runs whose sizes differ by at most one."""
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return [p for p in out if p]


def plan_units(cfg: StudyConfig, out: Path, study: str, device: str, cpus: float) -> tuple[list[Unit], int, int]:
    """Units still to run, plus (planned, already committed) seed counts."""
    done = committed(out, study)
    units: list[Unit] = []
    planned = already = 0
    for point in cfg.points:
        todo = []
        for s in seedsets(point):
            planned += 1
            if (point.trial_id, s.index) in done:
                already += 1
            else:
                todo.append(s)
        model_cls = MODELS.get(point.spec.model_name)
        cap, limit = model_cls.cpu_bundle_cap, model_cls.max_bundle(point.spec.model)
        todo.sort(key=lambda s: (s.data_seed, s.index))
        for _, group in groupby(todo, key=lambda s: s.data_seed):
            members = list(group)
            if cfg.execution.bundle_size == "auto":
                bundles = even_split(members, bundle_count(cfg, len(members), device, cpus, cap, limit))
            else:  # bundles of exactly K, the last one what is left
                k = int(cfg.execution.bundle_size)
                bundles = [members[i : i + k] for i in range(0, len(members), k)]
            units.extend(Unit(point, tuple(b)) for b in bundles)
    return units, planned, already


def unit_payload(unit: Unit, cfg: StudyConfig, out: Path, study: str, device: str, meta: dict[str, Any]) -> dict[str, Any]:
    """The JSON-able dict a trainable receives (``config["unit"]``)."""
    spec = unit.point.spec.to_dict()
    flat = flatten("", spec, {})
    flat.pop("task_name", None)
    flat.pop("model_name", None)
    return {
        "study": study,
        "out": str(Path(out).resolve()),
        "trial_id": unit.point.trial_id,
        "unit_id": unit.unit_id,
        "spec": spec,
        "seeds": [s.as_dict() for s in unit.seeds],
        "device": device,
        "cuda_graphs": cfg.execution.cuda_graphs,
        "threads": cfg.execution.threads,
        "report_every_s": cfg.execution.report_every_s,
        "keep_weights": cfg.execution.keep_weights,
        "loggers": driver_settings(cfg.execution.loggers),
        "plugins": list(cfg.plugins),
        "config_hash": cfg.identity_hash,
        "config_json": json.dumps({**spec, "seeds": unit.point.seed_extra["seeds"]}, sort_keys=True),
        "point_json": json.dumps(unit.point.values, sort_keys=True, default=str),
        "flat": flat,
        "git_sha": meta.get("git_sha", ""),
        "versions_json": json.dumps(meta.get("versions", {})),
    }


def default_cpus() -> int:
    return os.cpu_count() or 1
