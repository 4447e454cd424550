"""The Ray Tune trainable that wraps any registered (task, model) pair.

One Tune trial = one *unit*: a resolved config (``trial_id``) x a bundle of seeds. Each
``step()`` trains rounds of the :class:`~trainables.loop.BundleRun` for about
``round_budget_s`` seconds (so tiny step-based tasks don't pay Tune's per-result cost
every optimizer step) and returns a small progress dict. When the bundle is done it
evaluates every member at its selected epoch and commits each seed's rows to Parquet
(``trainables.results``): metrics, evals, predictions, then the runs row last.

Actors are reused across trials (``reset_config``), and datasets are cached per actor
keyed by (task config, data seed), so a 50-seed study builds its data once per worker.
Checkpoints hold the whole bundle state, so a retried trial resumes where it stopped.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ray import tune

from trainables.loop import BundleRun, get_task, render_example
from trainables.results import commit_seed, write_rows
from trainables.seeding import SeedSet
from trainables.spec import RunSpec
from trainables.tasks.base import Task, TaskData
from trainables.tuning_unit import aggregate, unit_from_template


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when present, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class FinelineTrainable(tune.Trainable):
    """Trains one unit (a config x a bundle of seeds) and commits its rows."""

    round_budget_s = 2.0

    def setup(self, config: dict[str, Any]) -> None:
        logging.getLogger("ray.tune").setLevel(logging.WARNING)
        logging.getLogger("ray.train").setLevel(logging.WARNING)
        self._data_cache: dict[tuple[str, int], tuple[Task, TaskData]] = {}
        self._start(config)

    def _start(self, config: dict[str, Any]) -> None:
        if "template" in config:  # a tuning candidate: params sampled by Optuna
            params = {k: config[k] for k in config["template"]["space_keys"]}
            self.unit = unit_from_template(config["template"], params)
        else:
            self.unit = config["unit"]
        self.objective = self.unit.get("objective")
        torch.set_num_threads(int(self.unit.get("threads", 1)))
        torch.set_flush_denormal(True)
        self.spec = RunSpec.from_dict(self.unit["spec"])
        seeds = [SeedSet(**s) for s in self.unit["seeds"]]
        task, data = self._data(seeds[0].data_seed)
        self.run = BundleRun(self.spec, seeds, task, data, resolve_device(self.unit["device"]))
        self.started_at = dt.datetime.now(dt.UTC)
        self.committed = False
        self._final: dict[str, float] = {}

    def _data(self, data_seed: int) -> tuple[Task, TaskData]:
        key = (str(self.unit["spec"]["task"]), data_seed)
        if key not in self._data_cache:
            task = get_task(self.spec)
            self._data_cache.clear()
            self._data_cache[key] = (task, task.build(data_seed))
        return self._data_cache[key]

    def step(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        info: dict[str, Any] = {}
        while not self.run.done and (time.perf_counter() - t0) < self.round_budget_s:
            info = self.run.train_round()
        result = {"epoch": self.run.epoch, "opt_step": self.run.step, **info}
        if self.objective is not None:
            result["objective"] = self._epoch_objective()
        if self.run.done:
            final = self._commit()
            if self.objective is not None:
                result.update(final)
            result["done"] = True
        return result

    def _epoch_objective(self) -> float:
        """Mean over running members of the objective at the last evaluation (for pruning)."""
        obj = self.objective or {}
        values = self.run.last_eval.get(obj.get("split", ""), [])
        return aggregate([v.get(obj.get("metric", ""), float("nan")) for v in values], "mean")

    def _final_objective(self, member_rows: list[dict[str, Any]]) -> dict[str, float]:
        obj = self.objective or {}
        values = []
        for rows in member_rows:
            hit = [r["value"] for r in rows["evals"] if r["split"] == obj["split"] and r["metric"] == obj["metric"]]
            values.append(hit[0] if hit else float("nan"))
        finite = [v for v in values if math.isfinite(v)]
        return {
            "objective": aggregate(values, obj.get("aggregate", "mean")),
            "objective_std": float(np.std(finite, ddof=1)) if len(finite) > 1 else 0.0,
            "objective_min": min(finite) if finite else float("nan"),
            "objective_max": max(finite) if finite else float("nan"),
            "objective_n": float(len(finite)),
        }

    def _commit(self) -> dict[str, float]:
        if self.committed:
            return self._final
        u = self.unit
        out, study, trial_id = Path(u["out"]), u["study"], u["trial_id"]
        node = ray_node_id()
        run = self.run
        member_rows = run.finalize(lambda split, i: render_example(run.data, split, i))
        now = dt.datetime.now(dt.UTC)
        statuses = [r["run"][0]["status"] for r in member_rows]
        self._final = self._final_objective(member_rows) if self.objective is not None else {}
        write_rows(out, study, "trials", u["unit_id"], [{
            "study": study, "trial_id": trial_id, "unit_id": u["unit_id"],
            "seeds": [s["index"] for s in u["seeds"]], "task": self.spec.task_name,
            "model": self.spec.model_name, "config_hash": u["config_hash"],
            "config_json": u["config_json"], "point_json": u["point_json"],
            "status": "ok" if all(s == "ok" for s in statuses) else "partial",
            "started_at": self.started_at, "ended_at": now, "node": node,
            "hostname": socket.gethostname(), "git_sha": u.get("git_sha", ""),
            "versions_json": u.get("versions_json", "{}"), "bundle_size": len(u["seeds"]),
            "device": str(run.device), **u.get("flat", {}), **self._final,
        }])
        for seedset, rows in zip(u["seeds"], member_rows, strict=True):
            keyed = {
                name: [{"study": study, "trial_id": trial_id, **r} for r in rows[name]]
                for name in ("metrics", "evals", "predictions")
            }
            run_row = {
                "study": study, "trial_id": trial_id, "unit_id": u["unit_id"],
                "seed": seedset["index"], "init_seed": seedset["init_seed"],
                "order_seed": seedset["order_seed"], "dropout_seed": seedset["dropout_seed"],
                "data_seed": seedset["data_seed"], **rows["run"][0], "node": node,
                "wall_s": run.wall_s, "committed_at": dt.datetime.now(dt.UTC),
            }
            commit_seed(out, study, trial_id, seedset["index"], keyed, run_row)
        self.committed = True
        return self._final

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        torch.save(self.run.state_dict(), os.path.join(checkpoint_dir, "bundle.pt"))
        return {}

    def load_checkpoint(self, checkpoint: dict[str, Any] | str | None) -> None:
        path = checkpoint if isinstance(checkpoint, str) else None
        if path is None:
            return
        state = torch.load(os.path.join(path, "bundle.pt"), weights_only=False)
        self.run.load_state_dict(state)

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self._start(new_config)
        return True


def ray_node_id() -> str:
    try:
        import ray

        return str(ray.get_runtime_context().get_node_id())
    except Exception:  # outside Ray (tests driving the trainable directly)
        return socket.gethostname()
