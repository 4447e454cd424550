"""A small synthetic study in the results layout, for trying analysis without training.

:func:`write_demo_study` writes ``OUT/tables/<table>/study=<NAME>/*.parquet`` and
``OUT/<NAME>/study.json`` exactly as the training side does (one file per (trial, seed)
for runs/metrics/evals/predictions, one per unit for trials). Values are made up but
structured like a real seed study: each seed has a latent "skill" shared by every split,
so test accuracies correlate across seeds; the validation loss falls with skill; grid
points shift the mean. All randomness comes from ``default_rng(seed)``.
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


def _write(out: Path, table: str, study: str, stem: str, rows: list[dict[str, Any]]) -> None:
    schema = SCHEMAS.get(table) if table != "trials" else None
    t = pa.Table.from_pylist(rows, schema=schema)
    folder = out / "tables" / table / f"study={study}"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, folder / f"{stem}.parquet")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


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
) -> Path:
    """Write a synthetic study ``name`` into ``out``; returns its manifest path.

    ``points``: grid-point dicts (default one point, ``{}``); each point becomes a trial
    with ``n_seeds`` seeds. ``kind="tune"`` adds ``param_lr``/``param_dropout`` and
    ``objective`` columns to ``trials``. Predictions are written for the test splits,
    ``n_examples`` per split and run.
    """
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
        trial: dict[str, Any] = {
            "study": name,
            "trial_id": trial_id,
            "unit_id": f"{trial_id}-u0",
            "seeds": list(range(n_seeds)),
            "task": "demo_task",
            "model": "demo_model",
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
            run = {
                "study": name,
                "trial_id": trial_id,
                "unit_id": f"{trial_id}-u0",
                "seed": s,
                "init_seed": 1000 + s,
                "order_seed": 2000 + s,
                "dropout_seed": 3000 + s,
                "data_seed": 4000,
                "selected_epoch": epochs,
                "selected_step": epochs * 100,
                "status": "ok",
                "node": "node0",
                "wall_s": 1.0 + s,
                "committed_at": t0 + timedelta(minutes=p_idx, seconds=s),
            }
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
        },
    }
    if kind == "tune":
        manifest["objective"] = {"split": "val_ood", "metric": "accuracy", "direction": "maximize"}
    path = out / name / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=1))
    return path
