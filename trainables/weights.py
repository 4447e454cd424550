"""Kept weights: one seed's selected parameters, saved with its commit, for later evaluation.

Each committed (trial, seed) of a study run with ``execution.keep_weights: true`` (the
default) has one file ``OUT/<NAME>/weights/<trial_id>/seed-<i>.pt``, written atomically
(temporary name, fsync, rename) *before* its runs row, which names it (``runs.weights``, a
path relative to ``OUT``). The file is ``torch.save`` of a plain dict::

    {"format": 1,
     "state": {name: CPU tensor},   # Model.member_state(k): ONE member, no member dim
     "meta": {...}}                  # JSON-able: see :func:`weights_meta`

so it loads with ``torch.load(path, weights_only=True)``. ``meta`` records what rebuilds the
evaluation exactly as training ran it: the resolved spec, the bundle the seed trained in
(its seed sets, in order) and its row there, the selected epoch / step, and a hash of every
test split's data at commit time (:func:`split_hash`), so ``study eval`` can tell which test
splits were added or changed since.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainables.data import Split, TaskData

FORMAT = 1
"""Version of the kept-weights file layout."""


def weights_relpath(study: str, trial_id: str, seed: int) -> str:
    """Where a (trial, seed)'s kept weights live, relative to the results folder."""
    return f"{study}/weights/{trial_id}/seed-{int(seed)}.pt"


def save_weights(path: Path, state: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> None:
    """Write one member's ``state`` (moved to the CPU) and ``meta`` atomically to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "state": {n: t.detach().to("cpu").contiguous().clone() for n, t in state.items()},
        "meta": dict(meta),
    }
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as fh:
            torch.save(payload, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def load_weights(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(state, meta) of a kept-weights file (on the CPU); ValueError if it is not one."""
    payload = torch.load(Path(path), map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT or "state" not in payload:
        raise ValueError(f"{path} is not a fineline kept-weights file (format {FORMAT})")
    return dict(payload["state"]), dict(payload.get("meta") or {})


def weights_meta(
    unit: Mapping[str, Any], member: int, run: Mapping[str, Any], split_hashes: Mapping[str, str]
) -> dict[str, Any]:
    """The ``meta`` of member ``member`` of a unit payload (``trainables.trainable``):
    ``run`` is the member's runs summary (selected epoch / step, status)."""
    seeds = list(unit["seeds"])
    return {
        "study": unit["study"],
        "trial_id": unit["trial_id"],
        "unit_id": unit["unit_id"],
        "seed": int(seeds[member]["index"]),
        "member": int(member),
        "bundle": seeds,
        "task": unit["spec"]["task"]["name"],
        "model": unit["spec"]["model"]["name"],
        "spec": unit["spec"],
        "config_hash": unit.get("config_hash", ""),
        "selected_epoch": run.get("selected_epoch"),
        "selected_step": run.get("selected_step"),
        "status": run.get("status"),
        "device": str(unit.get("device", "")),
        "split_hashes": dict(split_hashes),
    }


def hashes_of_test_splits(data: TaskData) -> dict[str, str]:
    """``split_hash`` of every ``test`` split of ``data`` (what ``study eval`` compares)."""
    return {name: split_hash(s) for name, s in data.splits.items() if s.role == "test"}


def split_hash(split: Split) -> str:
    """A hash of a split's role and data (every array and sequence of its container, with
    dtypes and shapes): equal iff the split holds the same examples in the same order."""
    h = hashlib.sha256()
    h.update(f"role={split.role};kind={type(split.data).__name__};".encode())
    _feed(h, split.data)
    return h.hexdigest()[:32]


def _feed(h: Any, value: Any) -> None:
    if isinstance(value, np.ndarray):
        h.update(f"nd{value.dtype.str}{value.shape};".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, torch.Tensor):
        _feed(h, value.detach().cpu().numpy())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            if f.compare:  # cached derived views (e.g. padded copies) are left out
                h.update(f"{f.name}=".encode())
                _feed(h, getattr(value, f.name))
    elif isinstance(value, list | tuple) or _is_sequence(value):
        items = list(value)
        h.update(f"seq{len(items)}[".encode())
        for item in items:
            _feed(h, item)
        h.update(b"]")
    else:
        h.update(f"{type(value).__name__}:{value!r};".encode())


def _is_sequence(value: Any) -> bool:
    return hasattr(value, "__len__") and hasattr(value, "__getitem__") and not isinstance(value, str | bytes | dict)
