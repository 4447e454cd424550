"""A small synthetic study in the results layout, for trying analysis without training.

:func:`write_demo_study` writes ``OUT/tables/<table>/study=<NAME>/*.parquet`` and
``OUT/<NAME>/study.json`` exactly as the training side does (one file per (trial, seed)
for runs/metrics/evals/predictions, one per unit for trials). Values are made up but
structured like a real seed study: each seed has a latent "skill" shared by every split,
so test accuracies correlate across seeds; the validation loss falls with skill; grid
points shift the mean. All randomness comes from ``default_rng(seed)``.

With ``decision_grid=(low, high, n)`` the study is instead shaped like the ``toy2d`` task
(Li et al. 2021): splits ``train``, ``train_eval``, ``test`` and ``grid``, learning curves
per step on ``train_eval`` and ``test``, and on the ``grid`` split one prediction per grid
point and run holding ``P(Y1 = 1)`` as a decimal string (``example_id = i1 * n + i2`` at
``(g[i1], g[i2])``, ``g = linspace(low, high, n)``), with the task's ``decision_boundary``
declaration in the manifest. Each run is a made-up classifier
``p = sigmoid(k * (x1 - t * x2 - c))``: its reliance ``t`` on the spurious input ``x2``
varies by seed (and falls with the grid point's index), so the (1, 1) test accuracy
varies across seeds as in the paper; every metric is measured on samples of the task's
distributions.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from analysis.manifest import MANIFEST
from analysis.schema import SCHEMAS

DEMO_SPLITS: tuple[tuple[str, str, float], ...] = (
    ("train", "train", 3.0),
    ("val", "val", 2.5),
    ("val_ood", "val_ood", 0.8),
    ("short", "test", 0.6),
    ("long", "test", -0.4),
    ("very_long", "test", -1.0),
)
"""(split, role, logit offset): harder splits have lower accuracy."""

TOY_SPLITS: tuple[tuple[str, str], ...] = (
    ("train", "train"),
    ("train_eval", "val"),
    ("test", "test"),
    ("grid", "test"),
)
"""(split, role) of the toy-shaped study, in the ``toy2d`` task's order."""

TOY_STEPS_PER_EVAL = 32
"""Optimizer steps between two logged evaluations of the toy-shaped study."""



DEMO_METRICS: dict[str, dict[str, Any]] = {
    "accuracy": {"better": "higher", "low": 0.0, "high": 1.0},
    "loss": {"better": "lower", "low": None, "high": None},
    "fpf": {"better": "higher", "low": 0.0, "high": None},
}
"""How the demo's metrics read, as a study writes them from its task (``analysis.metrics``)."""

def _write(out: Path, table: str, study: str, stem: str, rows: list[dict[str, Any]]) -> None:
    schema = SCHEMAS.get(table) if table != "trials" else None
    t = pa.Table.from_pylist(rows, schema=schema)
    if "study" in t.column_names:  # as trainables.results.write_rows: the folder holds it
        t = t.drop_columns(["study"])
    folder = out / "tables" / table / f"study={study}"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, folder / f"{stem}.parquet")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


DEMO_NUMERICS = "Demo CPU; torch DEFAULT; MKL_CBWR unset; 1 thread"
"""The ``trials.numerics`` of a demo study's units."""


def _trial_row(
    name: str,
    trial_id: str,
    p_idx: int,
    point: dict[str, Any],
    n_seeds: int,
    t0: datetime,
    task: str,
    model: str,
) -> dict[str, Any]:
    """The ``trials`` row of grid point ``p_idx`` (one unit holding every seed)."""
    return {
        "study": name,
        "trial_id": trial_id,
        "unit_id": f"{trial_id}-u0",
        "seeds": list(range(n_seeds)),
        "task": task,
        "model": model,
        "config_hash": f"h{p_idx}",
        "config_json": json.dumps({"point": point}),
        "point_json": json.dumps(point),
        "status": "ok",
        "started_at": t0 + timedelta(minutes=p_idx),
        "ended_at": t0 + timedelta(minutes=p_idx + 1),
        "node": "node0",
        "hostname": "demo",
        "git_sha": "0" * 7,
        "versions_json": "{}",
        "bundle_size": n_seeds,
        "device": "cpu",
        "train_lr": 0.1 * (p_idx + 1),
    }


def _run_row(
    name: str,
    trial_id: str,
    p_idx: int,
    s: int,
    epoch: int | None,
    step: int,
    t0: datetime,
) -> dict[str, Any]:
    """The ``runs`` row (the commit marker) of seed ``s`` of grid point ``p_idx``."""
    return {
        "study": name,
        "trial_id": trial_id,
        "unit_id": f"{trial_id}-u0",
        "seed": s,
        "init_seed": 1000 + s,
        "order_seed": 2000 + s,
        "dropout_seed": 3000 + s,
        "data_seed": 4000,
        "selected_epoch": epoch,
        "selected_step": step,
        "status": "ok",
        "node": "node0",
        "wall_s": 1.0 + s,
        "committed_at": t0 + timedelta(minutes=p_idx, seconds=s),
    }


def _write_manifest(out: Path, name: str, manifest: dict[str, Any]) -> Path:
    path = out / name / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=1))
    return path


def write_demo_study(
    out: Path,
    name: str = "demo",
    *,
    n_seeds: int = 5,
    points: list[dict[str, Any]] | None = None,
    kind: str = "seeds",
    epochs: int = 6,
    n_examples: int = 40,
    seed: int = 0,
    decision_grid: tuple[float, float, int] | None = None,
    numerics: tuple[str, ...] = (DEMO_NUMERICS,),
    commits: tuple[str, ...] = ("0" * 7,),
) -> Path:
    """Write a synthetic study ``name`` into ``out``; returns its manifest path.

    ``points``: grid-point dicts (default one point, ``{}``); each point becomes a trial
    with ``n_seeds`` seeds. ``kind="tune"`` adds ``param_lr``/``param_dropout`` and
    ``objective`` columns to ``trials``. Predictions are written for the test splits,
    ``n_examples`` per split and run. ``decision_grid=(low, high, n)``: a study shaped
    like the ``toy2d`` task instead (see the module docstring; ``epochs`` evaluations
    :data:`TOY_STEPS_PER_EVAL` steps apart, ``n_examples`` samples per evaluation set).
    ``numerics``: each point's ``trials.numerics`` in turn (point ``i``:
    ``numerics[i % len(numerics)]``); ``commits`` likewise its ``trials.git_sha``.
    """
    if decision_grid is not None:
        return _write_toy_study(
            Path(out),
            name,
            n_seeds=n_seeds,
            points=points if points is not None else [{}],
            kind=kind,
            evals_logged=epochs,
            n_examples=n_examples,
            grid=decision_grid,
            seed=seed,
        )
    out = Path(out)
    rng = np.random.default_rng(seed)
    points = points if points is not None else [{}]
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    manifest_points = []
    for p_idx, point in enumerate(points):
        trial_id = f"{name}-t{p_idx:02d}"
        manifest_points.append({"trial_id": trial_id, "point": point, "seeds": n_seeds})
        shift = 0.5 * p_idx - 0.25 * (len(points) - 1)
        skill = rng.normal(size=n_seeds)  # (S,)
        trial = _trial_row(name, trial_id, p_idx, point, n_seeds, t0, "demo_task", "demo_model")
        trial["numerics"] = numerics[p_idx % len(numerics)]
        trial["git_sha"] = commits[p_idx % len(commits)]
        if kind == "tune":
            trial["param_lr"] = float(10 ** rng.uniform(-3, -1))
            trial["param_dropout"] = float(rng.uniform(0, 0.5))
        finals = []
        for s in range(n_seeds):
            metrics, evals, preds = [], [], []
            for split, role, offset in DEMO_SPLITS:
                for epoch in range(1, epochs + 1):
                    progress = epoch / epochs
                    logit = progress * (offset + shift + 0.8 * skill[s]) + rng.normal(0, 0.1)
                    acc = float(_sigmoid(np.asarray(4 * progress - 2 + logit)))
                    loss = float(np.exp(-logit - 2 * progress) + 0.01)
                    base = {"study": name, "trial_id": trial_id, "seed": s, "epoch": epoch}
                    base |= {"step": epoch * 100, "split": split, "role": role}
                    metrics.append(base | {"metric": "accuracy", "value": acc})
                    metrics.append(base | {"metric": "loss", "value": loss})
                    if split == "very_long":
                        metrics.append(base | {"metric": "fpf", "value": 10 + 20 * acc})
                ev = {"study": name, "trial_id": trial_id, "seed": s, "split": split, "role": role}
                evals.append(ev | {"metric": "accuracy", "value": acc})
                evals.append(ev | {"metric": "loss", "value": loss})
                if split == "very_long":
                    evals.append(ev | {"metric": "fpf", "value": 10 + 20 * acc})
                if role == "test":
                    correct = rng.random(n_examples) < acc
                    preds += [
                        {
                            "study": name,
                            "trial_id": trial_id,
                            "seed": s,
                            "split": split,
                            "example_id": i,
                            "input": f"x{i}",
                            "target": f"y{i}",
                            "prediction": f"y{i}" if c else f"z{i}",
                            "correct": bool(c),
                        }
                        for i, c in enumerate(correct)
                    ]
                if split == "val_ood":
                    finals.append(acc)
            stem = f"{trial_id}-{s}"
            _write(out, "metrics", name, stem, metrics)
            _write(out, "evals", name, stem, evals)
            _write(out, "predictions", name, stem, preds)
            run = _run_row(name, trial_id, p_idx, s, epochs, epochs * 100, t0)
            _write(out, "runs", name, stem, [run])
        if kind == "tune":
            trial["objective"] = float(np.mean(finals))
        _write(out, "trials", name, f"{trial_id}-u0", [trial])
    manifest = {
        "name": name,
        "kind": kind,
        "task": "demo_task",
        "model": "demo_model",
        "config": {"task": {"name": "demo_task"}, "model": {"hidden": 32}, "train": {"lr": 0.1}},
        "config_hash": "demo",
        "created_at": t0.isoformat(),
        "git_sha": "0" * 7,
        "version": "0.1.0",
        "seeds": n_seeds,
        "splits": [{"name": s, "role": r} for s, r, _ in DEMO_SPLITS],
        "points": manifest_points,
        "analysis": {
            "scatter": [["short", "accuracy"], ["long", "accuracy"]],
            "regressions": [
                {
                    "x": {"split": "val", "metric": "loss", "transform": "neglog"},
                    "y": {"split": "very_long", "metric": "fpf"},
                    "over": over,
                }
                for over in ("runs", "checkpoints")
            ],
            "histograms": [{"split": "very_long", "metric": "fpf"}],
            "metrics": DEMO_METRICS,
        },
    }
    if kind == "tune":
        manifest["objective"] = {"split": "val_ood", "metric": "accuracy", "direction": "maximize"}
    return _write_manifest(out, name, manifest)


def _toy_sample(combos: np.ndarray, rng: np.random.Generator, n: int) -> tuple[np.ndarray, ...]:
    """``toy2d`` samples: ``(Y1, Y2)`` uniform over ``combos`` (C, 2), x = Y - U[0, 1]."""
    labels = combos[rng.integers(0, len(combos), n)]  # (n, 2)
    return labels - rng.random((n, 2)), labels[:, 0]  # (n, 2), (n,)


def _toy_scores(p: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Accuracy and mean binary cross-entropy of probabilities ``p`` (n,) for labels ``y``."""
    q = np.clip(p, 1e-7, 1 - 1e-7)
    loss = -np.mean(y * np.log(q) + (1 - y) * np.log(1 - q))
    return {"accuracy": float(np.mean((p > 0.5) == (y == 1))), "loss": float(loss)}


def _write_toy_study(
    out: Path,
    name: str,
    *,
    n_seeds: int,
    points: list[dict[str, Any]],
    kind: str,
    evals_logged: int,
    n_examples: int,
    grid: tuple[float, float, int],
    seed: int,
) -> Path:
    """The ``toy2d``-shaped study of :func:`write_demo_study` (see the module docstring)."""
    if kind != "seeds":
        raise ValueError(f"the toy-shaped demo study is a seed study; got kind={kind!r}")
    low, high, n = grid
    rng = np.random.default_rng(seed)
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    axis = np.linspace(low, high, n)
    g1, g2 = np.meshgrid(axis, axis, indexing="ij")  # (n, n) each
    grid_x = np.stack([g1.ravel(), g2.ravel()], axis=1)  # (n*n, 2): id = i1 * n + i2
    train_combos = np.array([[0, 0], [0, 1], [1, 0]])
    sets = {  # split -> (x (N, 2), y (N,)); one data seed for the whole study
        "train": _toy_sample(train_combos, rng, n_examples),
        "train_eval": _toy_sample(train_combos, rng, n_examples),
        "test": _toy_sample(np.array([[1, 1]]), rng, n_examples),
        "grid": (grid_x, (grid_x[:, 0] > 0).astype(np.int64)),
    }
    roles = dict(TOY_SPLITS)
    manifest_points = []
    for p_idx, point in enumerate(points):
        trial_id = f"{name}-t{p_idx:02d}"
        manifest_points.append({"trial_id": trial_id, "point": point, "seeds": n_seeds})
        reliance = np.clip(0.6 - 0.4 * p_idx + 0.25 * rng.normal(size=n_seeds), 0.0, 1.5)  # (S,)
        offset = 0.1 * rng.normal(size=n_seeds)  # (S,)
        for s in range(n_seeds):
            metrics, evals, preds = [], [], []
            probs: dict[str, np.ndarray] = {}
            for e in range(1, evals_logged + 1):
                r = e / evals_logged
                k, t = 2 + 10 * r, reliance[s] * (0.5 + 0.5 * r)
                c = offset[s] + 0.5 * (1 - r)
                probs = {
                    split: _sigmoid(k * (x[:, 0] - t * x[:, 1] - c))
                    for split, (x, _) in sets.items()
                }
                for split in ("train_eval", "test"):
                    base = {"study": name, "trial_id": trial_id, "seed": s, "epoch": None}
                    base |= {"step": e * TOY_STEPS_PER_EVAL, "split": split, "role": roles[split]}
                    for metric, v in _toy_scores(probs[split], sets[split][1]).items():
                        metrics.append(base | {"metric": metric, "value": v})
            for split, role in TOY_SPLITS:  # final evals: the last evaluation (mode: last)
                ev = {"study": name, "trial_id": trial_id, "seed": s, "split": split, "role": role}
                scores = _toy_scores(probs[split], sets[split][1])
                if split == "grid":
                    scores["p_y1"] = float(np.mean(probs[split]))
                evals += [ev | {"metric": m, "value": v} for m, v in scores.items()]
                if role != "test":
                    continue
                y = sets[split][1]
                for i, (p, label) in enumerate(zip(probs[split], y, strict=True)):
                    c_hat = int(p > 0.5)
                    shown = f"{p:.6f}" if split == "grid" else f"{c_hat} (p={max(p, 1 - p):.3f})"
                    preds.append(
                        {
                            "study": name,
                            "trial_id": trial_id,
                            "seed": s,
                            "split": split,
                            "example_id": i,
                            "input": "",
                            "target": str(int(label)),
                            "prediction": shown,
                            "correct": bool(c_hat == label),
                        }
                    )
            stem = f"{trial_id}-{s}"
            _write(out, "metrics", name, stem, metrics)
            _write(out, "evals", name, stem, evals)
            _write(out, "predictions", name, stem, preds)
            last = evals_logged * TOY_STEPS_PER_EVAL
            _write(out, "runs", name, stem, [_run_row(name, trial_id, p_idx, s, None, last, t0)])
        trial = _trial_row(name, trial_id, p_idx, point, n_seeds, t0, "toy2d", "mlp")
        _write(out, "trials", name, f"{trial_id}-u0", [trial])
    manifest = {
        "name": name,
        "kind": "seeds",
        "task": "toy2d",
        "model": "mlp",
        "config": {
            "task": {"name": "toy2d", "grid": [low, high, n]},
            "model": {"name": "mlp", "hidden": [8, 8, 8]},
            "train": {"max_steps": evals_logged * TOY_STEPS_PER_EVAL},
        },
        "config_hash": "demo-toy",
        "created_at": t0.isoformat(),
        "git_sha": "0" * 7,
        "version": "0.1.0",
        "seeds": n_seeds,
        "splits": [{"name": s, "role": r} for s, r in TOY_SPLITS],
        "points": manifest_points,
        "analysis": {  # as toy2d's Task.analysis()
            "primary_metric": "accuracy",
            "metrics": {**DEMO_METRICS, "p_y1": DEMO_METRICS["accuracy"]},
            "decision_boundary": {
                "grid": [low, high, n],
                "split": "grid",
                "metric": "p_y1",
                "axes": ["x1", "x2"],
                "id": "i1 * n + i2",
                "prediction": "p_y1 as a decimal string (predictions table)",
            },
            "test_splits": ["test", "grid"],
            "histograms": [{"split": "test", "metric": "accuracy"}],
            "scatter": [["grid", "accuracy"], ["test", "accuracy"]],
        },
    }
    return _write_manifest(out, name, manifest)
