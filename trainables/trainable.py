"""The Ray Tune trainable that wraps any registered (task, model) pair.

One Tune trial = one *unit*: a resolved config (``trial_id``) x a bundle of seeds, or, for
tuning in bundles (``tune.batch``), several candidates x their paired seeds, each member
with its candidate's per-member hyperparameters; each candidate commits under its own
``trial_id`` and one the driver's pruner stopped (its pruned file) leaves the bundle. Each
``step()`` trains rounds of the :class:`~trainables.loop.BundleRun` for about
``execution.report_every_s`` seconds (so tiny step-based tasks don't pay Tune's per-result
cost every optimizer step) and returns a small progress dict. When the bundle is done it
evaluates every member at its selected epoch and commits each seed's rows to Parquet
(``trainables.results``): metrics, evals, predictions, its ``trials`` row (the unit's row
with its seed), its kept weights (``trainables.weights``, unless ``execution.keep_weights``
is false), then the runs row last, recording what the commit wrote.

Actors are reused across trials (``reset_config``), and datasets are cached per actor
keyed by (task config, data seed), so a 50-seed study builds its data once per worker.
Checkpoints hold the whole bundle state, so a retried trial resumes where it stopped.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch
from ray import tune
from ray.tune.result import SHOULD_CHECKPOINT

from trainables.data import TaskData
from trainables.errors import REFUSED, ConfigError, DataError
from trainables.loop import BundleRun
from trainables.plugins import import_modules
from trainables.results import commit_seed
from trainables.runtime import configure_worker, numerics, quiet_sigterm_in_callbacks
from trainables.seeding import SeedSet
from trainables.spec import RunSpec
from trainables.tasks.base import Task
from trainables.trackers import BundleTrackers, SeedRun
from trainables.tuning_unit import (
    OBJECTIVE_KEYS,
    aggregate,
    bundle_from_template,
    objective_curve,
    objective_stats,
    read_pruned,
    unit_from_template,
)
from trainables.weights import hashes_of_test_splits, save_weights, weights_meta, weights_relpath


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when present, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class FinelineTrainable(tune.Trainable):
    """Trains one unit (a config x a bundle of seeds) and commits its rows."""

    def setup(self, config: dict[str, Any], payloads: list[dict[str, Any]] | None = None) -> None:
        # A study's unit payloads travel once through the object store (tune.with_parameters);
        # each trial's config only carries its index, so planning stays linear in the trials.
        self._payloads = payloads or []
        logging.getLogger("ray.tune").setLevel(logging.WARNING)
        logging.getLogger("ray.train").setLevel(logging.WARNING)
        self._data_cache: dict[tuple[str, int], tuple[Task, TaskData]] = {}
        self._begin(config)

    def _begin(self, config: dict[str, Any]) -> None:
        """:meth:`_start`, a ConfigError kept as the unit's refusal (its one result says it)."""
        self.refusal: str | None = None
        """Why this unit's config was refused (a ConfigError in its setup or a step), or None."""
        self._tuning = "template" in config
        try:
            self._start(config)
        except ConfigError as err:
            self.refusal = str(err)
            self.trackers: BundleTrackers | None = None  # _start closed the previous unit's first

    def _start(self, config: dict[str, Any]) -> None:
        self.cleanup()  # a reused actor: the previous unit's tracker runs end (e.g. ASHA stopped it)
        if "template" in config:  # a candidate's config names the study's own tasks and models
            import_study_plugins(config["template"].get("plugins", []))
        if "candidates" in config:  # several tuning candidates x their seeds (tune.batch)
            self.unit = bundle_from_template(config["template"], config["candidates"])
        elif "template" in config:  # a tuning candidate: params sampled by Optuna
            params = {k: config[k] for k in config["template"]["space_keys"]}
            self.unit = unit_from_template(config["template"], params)
        elif "unit_index" in config:
            self.unit = self._payloads[config["unit_index"]]
        else:
            self.unit = config["unit"]
        self.objective = self.unit.get("objective")
        configure_worker(int(self.unit.get("threads", 1)))
        quiet_sigterm_in_callbacks()
        self.round_budget_s = float(self.unit.get("report_every_s", 2.0))
        self.spec = worker_spec(self.unit)
        self.candidates: list[dict[str, Any]] = list(self.unit.get("candidates", []))
        """A bundle of tuning candidates: each one's unit payload, in member order (else empty)."""
        self.pruned: set[int] = set()
        """Optuna numbers of this bundle's candidates that the driver's pruner stopped."""
        self.each_round = bool(self.candidates) and bool(self.unit.get("each_round"))
        """Report after every evaluation (a bundle whose candidates a pruner judges)."""
        seeds = [SeedSet(**s) for s in self.unit["seeds"]]
        task, data = self._data(seeds[0].data_seed)
        self.run = BundleRun(
            self.spec, seeds, task, data, resolve_device(self.unit["device"]), member_specs=self._member_specs(),
            cuda_graphs=bool(self.unit.get("cuda_graphs", False)),
        )
        self.started_at = dt.datetime.now(dt.UTC)
        self.committed = False
        self._final: dict[str, float] = {}
        self._finals: dict[int, dict[str, float]] = {}
        """A bundle of candidates: each committed candidate's objective and spread, by number."""
        self.trackers = self._trackers()
        """The seeds' experiment-tracker runs (``execution.loggers``; None: none asked for)."""
        self._curve_at = [0] * len(seeds)
        """Rows of each member's metrics already in an ``objective_curve`` result."""

    def _groups(self) -> list[tuple[dict[str, Any], list[int]]]:
        """(payload, members) per config the bundle trains: the unit with every member, or
        each tuning candidate with its K paired seeds (members ``c * K .. c * K + K - 1``)."""
        if not self.candidates:
            return [(self.unit, list(range(len(self.unit["seeds"]))))]
        k = int(self.unit["per_candidate"])
        return [(c, list(range(i * k, (i + 1) * k))) for i, c in enumerate(self.candidates)]

    def _member_specs(self) -> list[RunSpec] | None:
        """Each member's own config where a bundle holds several candidates (else None)."""
        if len(self.candidates) < 2:
            return None
        return [RunSpec.from_dict(c["spec"]) for c, ks in self._groups() for _ in ks]

    def _trackers(self) -> BundleTrackers | None:
        """The seeds' tracker runs, each under its own config's trial_id."""
        if not self.candidates:
            return BundleTrackers.from_unit(self.unit)
        u = self.unit
        if not u.get("loggers"):
            return None
        runs = [
            SeedRun(
                out=str(u["out"]), study=str(u["study"]), trial_id=str(c["trial_id"]),
                task=str(u["spec"]["task"]["name"]), model=str(u["spec"]["model"]["name"]),
                seeds=dict(u["seeds"][k]), point=str(c["point_json"]), config=dict(c["flat"]),
            )
            for c, ks in self._groups()
            for k in ks
        ]
        return BundleTrackers(u["loggers"], runs)

    def _apply_pruning(self) -> None:
        """Stop the members of the candidates the driver pruned since the last step (its
        pruned file, :func:`~trainables.tuning_unit.read_pruned`): they leave the loss at
        once and the model's rows at compaction; the other members go on unchanged."""
        u = self.unit
        new = read_pruned(u["out"], u["study"], u["unit_id"]) - self.pruned
        new &= {int(c["number"]) for c in self.candidates}
        if not new:
            return
        self.pruned |= new
        for c, ks in self._groups():
            if int(c["number"]) in new:
                for k in ks:
                    self.run.members[k].status = "pruned"
        self.run._compact()  # what the end of a round does for stopped members

    def _data(self, data_seed: int) -> tuple[Task, TaskData]:
        key = (str(self.unit["spec"]["task"]), data_seed)
        if key not in self._data_cache:
            task = self.spec.make_task()
            self._data_cache.clear()
            self._data_cache[key] = (task, task.build(data_seed))
        return self._data_cache[key]

    def step(self) -> dict[str, Any]:
        if self.refusal is None:
            try:
                return self._step()
            except ConfigError as err:
                self.refusal = str(err)
        return self._refused()

    def _refused(self) -> dict[str, Any]:
        """The one result of a unit whose config was refused: it ends the trial at once, not
        as a Ray error, so Tune neither retries it (``max_failures``: the same config fails
        the same way every time) nor prints the worker's traceback; the driver prints the
        text once (``REFUSED``). A tuning candidate's result carries a NaN objective, the
        metric Tune checks each result for."""
        return {REFUSED: self.refusal, "done": True, **({"objective": float("nan")} if self._tuning else {})}

    def _step(self) -> dict[str, Any]:
        out, study = Path(self.unit["out"]), self.unit["study"]
        seen, writable = (out / study).is_dir(), os.access(out, os.W_OK)
        if not (seen and writable):
            # The driver created OUT/<study> before launching: a node that cannot see it has
            # no (or another) shared filesystem, and its rows would never reach the study.
            problem = (
                f"results folder {out} is not writable"
                if seen
                else f"study folder {out / study} (the driver creates it before launching) is missing"
            )
            raise DataError(
                f"{problem} on node {socket.gethostname()}. Fix: mount the same shared filesystem "
                "at the same path on every node, writable by the user running Ray (docs/cluster.md)"
            )
        if self.candidates:
            self._apply_pruning()
        t0 = time.perf_counter()
        info: dict[str, Any] = {}
        while not self.run.done and (time.perf_counter() - t0) < self.round_budget_s:
            info = self.run.train_round()
            if self.each_round:
                break
        if self.trackers is not None:
            self.trackers.update([m.metrics for m in self.run.members])
        at = f"step {self.run.step}" if self.run.step_based else f"epoch {self.run.epoch}"
        result = {"epoch": self.run.epoch, "opt_step": self.run.step, "at": at, **info, **self._selection()}
        if self.candidates:
            result["candidate_curves"] = self._candidate_curves()
        elif self.objective is not None:
            result["objective"] = self._epoch_objective()
            result["objective_curve"] = self._objective_curve()
        if self.run.done:
            if self.trackers is not None:
                self.trackers.close()  # every tracker run flushed before its seed commits
            final = self._commit()
            if self.candidates:
                result["candidates_final"] = [
                    [n, *(stats[key] for key in OBJECTIVE_KEYS)] for n, stats in self._finals.items()
                ]
            elif self.objective is not None:
                result.update(final)
            result["committed_seeds"] = self._committed_seeds()
            result["done"] = True
        # A checkpoint after each result but the last: a finished unit has committed, so a
        # retry has nothing to resume (seed studies checkpoint on this alone, study.runner).
        result[SHOULD_CHECKPOINT] = not self.run.done
        return result

    def _selection(self) -> dict[str, Any]:
        """The selection metric of the running members at the last evaluation (for progress)."""
        sel = self.spec.train.selection
        if sel.mode == "last":
            return {}
        values = [v[sel.metric] for v in self.run.last_eval.get(sel.split, []) if sel.metric in v]
        return {"sel_metric": f"{sel.split} {sel.metric}", "sel_values": values}

    def _committed_seeds(self) -> list[dict[str, Any]]:
        """What each seed of the bundle committed: status, selected epoch, selection value."""
        return [
            {"seed": m.seeds.index, "status": self.run.run_status(m),
             "selected": f"step {m.best_step}" if self.run.step_based else f"epoch {m.best_epoch}",
             "value": m.best_value}
            for m in self.run.members
            if m.status != "pruned"
        ]

    def _epoch_objective(self) -> float:
        """The candidate's objective at the last evaluation, over its running members.

        Reported every step (Optuna stores it as an intermediate value; ASHA prunes on it).
        """
        obj = self.objective or {}
        split, metric = obj.get("split", ""), obj.get("metric", "")
        values = self.run.last_eval.get(split, [])
        if values and metric not in values[0]:
            raise ConfigError(
                "tune.objective.metric",
                f"split {split!r} has no metric {metric!r}",
                f"use one of: {', '.join(sorted(values[0]))}",
            )
        return aggregate([v[metric] for v in values], obj.get("aggregate", "mean"))

    def _objective_curve(self) -> list[list[float]]:
        """The candidate's per-epoch objective since the last result, ``[epoch or step, value]``
        pairs (Optuna's intermediate values: its learning curve in optuna-dashboard). After a
        restore from a checkpoint the whole curve is sent again (the searcher skips known steps)."""
        obj = self.objective or {}
        new = self._new_metric_rows()
        return objective_curve(new, obj.get("split", ""), obj.get("metric", ""), obj.get("aggregate", "mean"))

    def _new_metric_rows(self) -> list[list[dict[str, Any]]]:
        """Each member's ``metrics`` rows since the last result (all of them after a restore)."""
        members = self.run.members
        if any(len(m.metrics) < at for m, at in zip(members, self._curve_at, strict=True)):
            self._curve_at = [0] * len(members)
        new = [m.metrics[at:] for m, at in zip(members, self._curve_at, strict=True)]
        self._curve_at = [len(m.metrics) for m in members]
        return new

    def _candidate_curves(self) -> list[list[Any]]:
        """A bundle of candidates: ``[number, curve]`` per candidate with new points, its curve
        as :meth:`_objective_curve`'s over its own seeds (what the driver reports to Optuna
        and prunes on)."""
        obj, new = self.objective or {}, self._new_metric_rows()
        out: list[list[Any]] = []
        for c, ks in self._groups():
            if int(c["number"]) in self.pruned:
                continue
            curve = objective_curve(
                [new[k] for k in ks], obj.get("split", ""), obj.get("metric", ""), obj.get("aggregate", "mean")
            )
            if curve:
                out.append([int(c["number"]), curve])
        return out

    def _final_objective(self, member_rows: list[dict[str, Any]]) -> dict[str, float]:
        """Objective and spread over every seed, at each seed's selected epoch."""
        obj = self.objective or {}
        values = []
        for rows in member_rows:
            hit = [
                r["value"]
                for r in rows["evals"]
                if r["split"] == obj["split"] and r["metric"] == obj["metric"]
            ]
            values.append(hit[0] if hit else float("nan"))
        return objective_stats(values, obj.get("aggregate", "mean"))

    def _commit(self) -> dict[str, float]:
        if self.committed:
            return self._final
        u = self.unit
        out, study = Path(u["out"]), u["study"]
        node = ray_node_id()
        run = self.run
        float_path = numerics(run.device)
        member_rows = run.finalize()
        now = dt.datetime.now(dt.UTC)
        keep = bool(u.get("keep_weights", False))
        hashes = hashes_of_test_splits(run.data) if keep else {}
        # A bundle of tuning candidates commits each one's seeds under its own trial_id (its
        # trials row names the bundle's unit_id); a pruned candidate commits nothing.
        bundle = {"bundle_members": len(u["seeds"])} if self.candidates else {}
        for cfg, ks in self._groups():
            number = cfg.get("number")
            if number is not None and int(number) in self.pruned:
                continue
            trial_id = cfg["trial_id"]
            statuses = [member_rows[k]["run"][0]["status"] for k in ks]
            final = self._final_objective([member_rows[k] for k in ks]) if self.objective is not None else {}
            if number is None:
                self._final = final
            else:
                self._finals[int(number)] = final
            # The unit's trials row goes into each seed's commit (with its seed), so the
            # ``trials`` view, derived from committed seeds, never runs ahead of ``runs``.
            unit_row = {
                "study": study, "trial_id": trial_id, "unit_id": u["unit_id"], "task": self.spec.task_name,
                "model": self.spec.model_name, "config_hash": u["config_hash"],
                "config_json": cfg["config_json"], "point_json": cfg["point_json"],
                "status": "partial" if "diverged" in statuses else "ok",
                "started_at": self.started_at, "ended_at": now, "node": node,
                "hostname": socket.gethostname(), "git_sha": u.get("git_sha", ""),
                "versions_json": u.get("versions_json", "{}"), "bundle_size": len(ks),
                "device": str(run.device), "bundling": getattr(run.model, "bundling", "hand"),
                "kernels": getattr(run.model, "kernels", "torch"), "kernel_flags": getattr(run.model, "kernel_flags", ""),
                "dropout_masks": "counter" if run.noise.positional else "generator",
                "numerics": float_path,
                "train_s": run.wall_s - run.eval_s, "eval_s": run.eval_s, "final_eval_s": run.final_eval_s,
                **cfg.get("flat", {}), **final, **bundle,
                **({"optuna_number": int(number)} if number is not None else {}),
            }
            for k in ks:
                seedset, rows = u["seeds"][k], member_rows[k]
                keyed = {
                    name: [{"study": study, "trial_id": trial_id, **r} for r in rows[name]]
                    for name in ("metrics", "evals", "predictions")
                }
                keyed["trials"] = [{**unit_row, "seed": seedset["index"]}]
                best = run.members[k].best_params
                kept = weights_relpath(study, trial_id, seedset["index"]) if keep and best is not None else None
                run_row = {
                    "study": study, "trial_id": trial_id, "unit_id": u["unit_id"],
                    "seed": seedset["index"], "init_seed": seedset["init_seed"],
                    "order_seed": seedset["order_seed"], "dropout_seed": seedset["dropout_seed"],
                    "data_seed": seedset["data_seed"], **rows["run"][0], "node": node,
                    "wall_s": run.wall_s, "committed_at": dt.datetime.now(dt.UTC), "weights": kept,
                }
                save = None
                if kept is not None and best is not None:
                    meta = weights_meta({**u, "trial_id": trial_id, "spec": cfg["spec"]}, k, rows["run"][0], hashes)
                    save = functools.partial(save_weights, out / kept, best, meta)
                commit_seed(out, study, trial_id, seedset["index"], keyed, run_row, keep=save)
        self.committed = True
        return self._final

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        # Returning None (not a dict) makes Tune hand load_checkpoint the directory back.
        if self.refusal is not None:  # a tuning study checkpoints every result: nothing to keep
            return
        torch.save(self.run.state_dict(), os.path.join(checkpoint_dir, "bundle.pt"))

    def load_checkpoint(self, checkpoint: dict[str, Any] | str | None) -> None:
        if not isinstance(checkpoint, str):  # no checkpoint directory: nothing was saved
            return
        state = torch.load(os.path.join(checkpoint, "bundle.pt"), weights_only=False)
        self.run.load_state_dict(state)
        print(
            f"fineline: unit {self.unit['unit_id']} resumed from its checkpoint at epoch "
            f"{self.run.epoch}, step {self.run.step}",
            file=sys.stderr,
            flush=True,
        )

    def cleanup(self) -> None:
        """Tune stops the trial (or reuses the actor): its open tracker runs are closed."""
        trackers = getattr(self, "trackers", None)
        if trackers is not None:
            trackers.close()

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self._begin(new_config)
        return True


def import_study_plugins(plugins: list[str]) -> None:
    """Import the study file's ``plugins:`` modules here (every worker, every node), before
    anything resolves a task or model name (a tuning candidate's config, a unit's spec)."""
    fix = (
        "it was shipped with the job unless execution.ship_plugins is false: then put it on "
        "every node's PYTHONPATH, or pip install its package on every node (docs/plugins.md)"
    )
    import_modules(plugins, None, f"the study, on node {socket.gethostname()}", fix)


def worker_spec(unit: dict[str, Any]) -> RunSpec:
    """The unit's RunSpec, after importing the study's plugins here (every worker, every node).

    A task or model the driver had but this node lacks is named with the fix."""
    import_study_plugins(unit.get("plugins", []))
    try:
        return RunSpec.from_dict(unit["spec"])
    except ConfigError as exc:
        if exc.field not in ("task.name", "model.name"):
            raise
        raise ConfigError(
            exc.field,
            f"{exc.problem} on node {socket.gethostname()}, though the driver has it",
            "install the plugin that provides it on every node (`pip install ...`, as on the "
            "driver), or list its module under `plugins:` in the study file (docs/plugins.md)",
        ) from None


def ray_node_id() -> str:
    import ray

    if not ray.is_initialized():  # outside Ray (tests driving the trainable directly)
        return socket.gethostname()
    return str(ray.get_runtime_context().get_node_id())
