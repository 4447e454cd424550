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
from trainables.results import committed, flatten
from trainables.seeding import SeedSet, derive_seedset


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


def bundle_size(cfg: StudyConfig, n_seeds: int, device: str, cpus: float) -> int:
    """Resolve ``execution.bundle_size`` (``auto``: all seeds on a GPU; spread over CPUs)."""
    k = cfg.execution.bundle_size
    if k != "auto":
        return int(k)
    if device == "cuda":
        return max(1, min(n_seeds, 64))
    workers = max(1, int(cpus // cfg.execution.cpus_per_trial))
    return max(1, math.ceil(n_seeds / workers))


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
        k = bundle_size(cfg, len(todo), device, cpus)
        todo.sort(key=lambda s: (s.data_seed, s.index))
        for _, group in groupby(todo, key=lambda s: s.data_seed):
            members = list(group)
            for i in range(0, len(members), k):
                units.append(Unit(point, tuple(members[i : i + k])))
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
        "threads": cfg.execution.threads,
        "config_hash": cfg.identity_hash,
        "config_json": json.dumps({**spec, "seeds": unit.point.seed_extra["seeds"]}, sort_keys=True),
        "point_json": json.dumps(unit.point.values, sort_keys=True, default=str),
        "flat": flat,
        "git_sha": meta.get("git_sha", ""),
        "versions_json": json.dumps(meta.get("versions", {})),
    }


def default_cpus() -> int:
    return os.cpu_count() or 1
