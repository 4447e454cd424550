"""Turning a tuning candidate (sampled params) into a unit, and scoring its objective.

Lives on the trainables side because the Ray worker builds the unit from the params
Optuna sampled; ``study.tuning`` builds the *template* (everything a candidate shares:
base spec, seed bundle, objective, output folder) and the driver uses the same
functions to name a candidate (its ``trial_id``) and to re-score it from Parquet. A bundle
of several candidates (``tune.batch``) is :func:`bundle_from_template`'s payload; the driver
tells it which of its candidates were pruned through :func:`write_pruned`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trainables.results import flatten
from trainables.spec import RunSpec

AGGREGATES = ("mean", "median", "iqm")
"""How the per-seed objective values of one candidate combine."""

OBJECTIVE_KEYS = ("objective", "objective_std", "objective_min", "objective_max", "objective_n")
"""What :func:`objective_stats` returns: trials-table columns and Optuna user attributes."""


def param_column(path: str) -> str:
    """``train.lr`` -> ``param_train_lr`` (a trials-table column)."""
    return "param_" + path.replace(".", "_")


def apply_params(spec: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """A copy of a ``{task, model, train}`` dict with dotted ``params`` set."""
    out = copy.deepcopy(spec)
    for path, value in params.items():
        cur = out
        *parents, leaf = path.split(".")
        for p in parents:
            cur = cur.setdefault(p, {})
        cur[leaf] = value
    return out


def unit_from_template(template: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The unit payload of one candidate: template + params, with its own trial_id.

    The ``trial_id`` hashes the resolved config exactly like a seed study's point, so a
    ``study run --from-best`` of this candidate gets the same ``trial_id``.
    """
    spec_dict = apply_params(template["base_spec"], params)
    spec = RunSpec.from_dict(spec_dict)
    resolved = spec.to_dict()
    trial_id = spec.trial_id(template["seed_extra"])
    seeds = template["seeds"]
    unit_key = f"{trial_id}:{','.join(str(s['index']) for s in seeds)}"
    flat = flatten("", resolved, {})
    flat.pop("task_name", None)
    flat.pop("model_name", None)
    flat.update({param_column(k): v for k, v in params.items()})
    return {
        **{k: v for k, v in template.items() if k not in ("base_spec", "seed_extra")},
        "spec": resolved,
        "trial_id": trial_id,
        "unit_id": hashlib.sha256(unit_key.encode()).hexdigest()[:16],
        "config_json": json.dumps({**resolved, **template["seed_extra"]}, sort_keys=True),
        "point_json": json.dumps(params, sort_keys=True),
        "flat": flat,
        "params": params,
    }


def bundle_from_template(template: dict[str, Any], candidates: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """The unit payload of a bundle of tuning candidates (``tune.batch``), one Ray Tune trial.

    ``candidates``: ``[[number, params], ...]``, each an Optuna trial number and its sampled
    params. Member ``c * K + i`` trains seed ``i`` of candidate ``c`` (K: the template's
    seeds, paired across candidates); ``candidates`` in the payload are the candidates' own
    unit payloads (:func:`unit_from_template`, each with its ``trial_id`` and ``number``),
    ``spec`` is the first candidate's resolved config (the others differ from it only in
    per-member hyperparameters) and ``unit_id`` names this execution: the candidates'
    numbers and trial_ids and the seeds, so a replayed candidate runs in a new unit.
    """
    units = [{**unit_from_template(template, dict(params)), "number": int(number)} for number, params in candidates]
    if not units:
        raise ValueError("a bundle of tuning candidates needs at least one candidate")
    seeds = template["seeds"]
    key = ";".join(f"{u['number']}:{u['trial_id']}" for u in units) + "|" + ",".join(str(s["index"]) for s in seeds)
    return {
        **{k: v for k, v in template.items() if k not in ("base_spec", "seed_extra")},
        "spec": units[0]["spec"],
        "seeds": [s for _ in units for s in seeds],
        "per_candidate": len(seeds),
        "unit_id": "b" + hashlib.sha256(key.encode()).hexdigest()[:15],
        "candidates": units,
    }


def pruned_path(out: str | Path, study: str, unit_id: str) -> Path:
    """The file through which the driver tells a running bundle which of its candidates the
    pruner stopped: ``OUT/<study>/pruned/<unit_id>.json``, ``{"numbers": [...]}``."""
    return Path(out) / study / "pruned" / f"{unit_id}.json"


def read_pruned(out: str | Path, study: str, unit_id: str) -> set[int]:
    """The Optuna numbers of the candidates of bundle ``unit_id`` pruned so far (empty: none)."""
    path = pruned_path(out, study, unit_id)
    try:
        return {int(n) for n in json.loads(path.read_text())["numbers"]}
    except FileNotFoundError:
        return set()


def write_pruned(out: str | Path, study: str, unit_id: str, numbers: Sequence[int]) -> None:
    """Atomically (temporary file + rename) record the pruned candidates of bundle ``unit_id``."""
    path = pruned_path(out, study, unit_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps({"numbers": sorted(int(n) for n in numbers)}))
    os.replace(tmp, path)


def aggregate(values: Sequence[float], how: str) -> float:
    """Mean, median or interquartile mean (IQM: mean of the middle 50%) of ``values``.

    Non-finite values (diverged seeds) are left out; no finite value gives NaN.
    """
    v = np.sort(np.asarray([x for x in values if np.isfinite(x)], dtype=float))  # (n,)
    if len(v) == 0:
        return float("nan")
    if how == "median":
        return float(np.median(v))
    if how == "iqm":
        n = len(v)
        lo, hi = int(np.floor(n * 0.25)), int(np.ceil(n * 0.75))
        return float(v[lo:hi].mean()) if hi > lo else float(v.mean())
    return float(v.mean())


def objective_curve(
    rows: Sequence[Sequence[Mapping[str, Any]]], split: str, metric: str, how: str
) -> list[list[float]]:
    """A candidate's learning curve from its members' ``metrics`` rows (``rows[k]``: member
    k's new rows): ``[x, value]`` per evaluation point in order, ``x`` the epoch (the
    optimizer step for step-based training) and ``value`` the ``how`` aggregate of
    ``split``/``metric`` over the members evaluated there (the running ones), as Optuna
    gets it for intermediate values."""
    by_x: dict[int, list[float]] = {}
    for member in rows:
        for r in member:
            if r["split"] == split and r["metric"] == metric:
                x = r["epoch"] if r["epoch"] is not None else r["step"]
                by_x.setdefault(int(x), []).append(float(r["value"]))
    return [[x, aggregate(v, how)] for x, v in sorted(by_x.items())]


def objective_stats(values: Sequence[float], how: str) -> dict[str, float]:
    """A candidate's objective and its spread over its seeds.

    ``values``: one objective value per seed (NaN for a seed without one). Returns
    ``objective`` (the ``how`` aggregate), ``objective_std`` (sample std, 0 for one
    seed), ``objective_min``, ``objective_max`` and ``objective_n`` (finite values used).
    These become columns of the ``trials`` table and user attributes in Optuna.
    """
    finite = [float(v) for v in values if np.isfinite(v)]
    return {
        "objective": aggregate(finite, how),
        "objective_std": float(np.std(finite, ddof=1)) if len(finite) > 1 else 0.0,
        "objective_min": min(finite) if finite else float("nan"),
        "objective_max": max(finite) if finite else float("nan"),
        "objective_n": float(len(finite)),
    }
