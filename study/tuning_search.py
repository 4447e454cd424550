"""Optuna behind Ray Tune for ``study tune``: the seeded samplers, the search space as Optuna
distributions, Ray's ``OptunaSearch`` with fineline's bookkeeping, the per-candidate log,
and the ``trials`` row of a pruned candidate (:mod:`study.tuning` runs the search;
:mod:`study.tuning_bundles` searches in bundles with the same pieces)."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import numpy as np

from study.runner import console
from study.tuning_config import TuneBlock
from trainables.errors import REFUSED, ConfigError
from trainables.results import write_rows
from trainables.tuning_unit import OBJECTIVE_KEYS, unit_from_template


def make_sampler(block: TuneBlock, position: int, batched: bool = False) -> Any:
    """The sampler for the candidate at ``position``, seeded from (sampler_seed, position).

    TPE runs with ``constant_liar`` (running candidates count with a pessimistic value, so
    proposals made while others run spread out) unless one candidate runs at a time:
    ``sequential`` without ``batched`` (a batch asks several candidates before any ends)."""
    import optuna

    seed = int(
        np.random.SeedSequence(block.sampler_seed, spawn_key=(position,)).generate_state(1)[0]
    )
    if block.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(
        seed=seed,
        n_startup_trials=block.startup_trials,
        constant_liar=batched or not block.sequential,
    )


def make_pruner(block: TuneBlock) -> Any:
    """The Optuna pruner consulted per candidate (``NopPruner`` for ``none``): ``asha`` is
    Optuna's ``SuccessiveHalvingPruner`` (asynchronous successive halving), rungs at
    ``grace_period * reduction_factor**k`` epochs (optimizer steps for step-based tasks).
    It reads every candidate's rung values from the storage, so a resumed search compares
    new candidates with those of earlier runs too."""
    import optuna

    if block.pruner == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=block.grace_period, reduction_factor=block.reduction_factor
        )
    return optuna.pruners.NopPruner()


def pruning_scheduler(searcher: Any) -> Any:
    """A Ray Tune scheduler that stops a candidate's trial when the study's Optuna pruner says
    so (``searcher``: the :func:`ray_classes` searcher, which reports the candidate's curve
    first). Ray's own ASHA kept its rungs in the driver's memory: each ``study tune`` (a
    resume, a larger ``--trials``) started empty, so a candidate pruned at epoch 1 in an
    uninterrupted search trained to its end after a resume. Defined on first use (no Ray
    import at module level)."""
    from ray.tune.schedulers import FIFOScheduler, TrialScheduler

    class OptunaPruning(FIFOScheduler):
        def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
            return TrialScheduler.STOP if searcher.should_prune(trial.trial_id, result) else TrialScheduler.CONTINUE

    return OptunaPruning()


def distributions(block: TuneBlock) -> dict[str, Any]:
    import optuna

    assert block.space is not None
    dists: dict[str, Any] = {}
    for path, r in block.space.items():
        if r.type == "int":
            dists[path] = optuna.distributions.IntDistribution(int(r.low), int(r.high), log=r.log)
        else:
            dists[path] = optuna.distributions.FloatDistribution(r.low, r.high, log=r.log)
    return dists


def position_of(study: Any) -> int:
    """Candidates before the next one, not counting failed ones (they are replayed) but
    counting those the config refused (:func:`refuse`: the next draw must differ)."""
    import optuna

    states = (optuna.trial.TrialState.FAIL, optuna.trial.TrialState.WAITING)
    return sum(1 for t in study.get_trials(deepcopy=False) if t.state not in states or "refused" in t.user_attrs)


MAX_REFUSED = 50
"""Candidates in a row the config may refuse before the search stops (its space then lies
mostly outside what the config takes)."""


def refuse(study: Any, trial: Any, exc: ConfigError, in_a_row: int, block: TuneBlock) -> None:
    """A candidate whose params the config refuses (e.g. 5 heads for d_model 8, from two
    searched fields that each pass alone): told to Optuna as FAIL with the reason in its user
    attribute ``refused``, never trained, and said on the console; the search draws another.
    Before, the ConfigError ended the search after Ray had started, and every resume
    re-drew the same candidate. ``in_a_row``: refusals so far without an accepted candidate
    between (:data:`MAX_REFUSED` of them stop the search with a ConfigError)."""
    import optuna

    trial.set_user_attr("refused", str(exc))
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items())
    say(f"candidate {trial.number} ({params}) refused by the config, not trained: {exc}")
    if in_a_row + 1 >= MAX_REFUSED:
        raise ConfigError(
            "tune.space", f"the config refused {MAX_REFUSED} candidates in a row (the last: {exc})",
            "narrow the searched ranges to values the config takes together, or search fewer fields "
            f"({', '.join(block.space or {})})",
        )


def told_value(objective: float, direction: str) -> float:
    """The value Optuna is told: the objective, or the worst value when no seed gave one."""
    if math.isfinite(objective):
        return objective
    return -math.inf if direction == "maximize" else math.inf


def say(message: str) -> None:
    """Print to the driver's console (a module function, so Ray pickles it by reference)."""
    console.print(message, soft_wrap=True)


@functools.cache
def ray_classes() -> tuple[type, type]:
    """``(FinelineSearch, CandidateLog)``, defined on first use.

    This module must not import Ray: ``study.runner.ray_session`` sets Ray's environment
    (auth mode) before Ray's first import in the process.
    """
    from ray.tune import Callback
    from ray.tune.search.optuna import OptunaSearch

    class FinelineSearch(OptunaSearch):
        """Ray's OptunaSearch with fineline's bookkeeping.

        * each proposal's sampler is seeded from (sampler_seed, position) (reproducible resume);
        * a candidate is COMPLETE only with its final objective over all seeds (its spread as
          user attributes), PRUNED when the pruner stopped it (:func:`pruning_scheduler`; a
          ``pruned`` trials row is written first),
          FAIL when it errored; the fineline ``trial_id`` is a user attribute.
        """

        def __init__(self, block: TuneBlock, template: dict[str, Any], storage: Any) -> None:
            self._block, self._template = block, template
            self._curve_steps: dict[str, int] = {}
            """Ray trial id -> the last step of its learning curve told to Optuna."""
            mode = "max" if block.direction == "maximize" else "min"
            super().__init__(
                space=distributions(block),
                metric="objective",
                mode=mode,
                sampler=make_sampler(block, 0),
                study_name=template["study"],
                storage=storage,
            )

        def _setup_study(self, mode: Any) -> None:
            super()._setup_study(mode)
            study: Any = self._ot_study
            study.pruner = make_pruner(self._block)  # Ray's OptunaSearch sets a NopPruner

        def should_prune(self, trial_id: str, result: dict[str, Any]) -> bool:
            """Report the candidate's new curve points (:meth:`on_trial_result`), then ask the
            study's pruner (:func:`make_pruner`) at its last step."""
            if self._block.pruner == "none" or trial_id not in self._ot_trials or trial_id in self._completed_trials:
                return False
            self.on_trial_result(trial_id, result)
            ot_trial = self._ot_trials[trial_id]
            return bool(self._curve_steps.get(trial_id, -1) >= 0 and ot_trial.should_prune())

        def suggest(self, trial_id: str) -> dict[str, Any] | None:
            study: Any = self._ot_study
            for in_a_row in range(MAX_REFUSED):
                if trial_id not in self._ot_trials:
                    study.sampler = make_sampler(self._block, position_of(study))
                config = super().suggest(trial_id)
                ot_trial = self._ot_trials[trial_id]
                try:
                    unit = unit_from_template(self._template, dict(ot_trial.params))
                except ConfigError as exc:
                    refuse(study, ot_trial, exc, in_a_row, self._block)
                    del self._ot_trials[trial_id]
                    continue
                ot_trial.set_user_attr("trial_id", unit["trial_id"])
                ot_trial.set_user_attr("seeds", [s["index"] for s in self._template["seeds"]])
                return config
            raise AssertionError("refuse() stops the search first")

        def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
            """The candidate's learning curve as Optuna intermediate values: its per-epoch
            objective (``objective_curve``: [epoch or optimizer step, value] pairs since its
            last result), each step once (a trial restored from a checkpoint resends its curve).
            Tune hands a trial's last result only to :meth:`on_trial_complete`, which reports it too."""
            if trial_id in self._completed_trials or trial_id not in self._ot_trials:
                return
            ot_trial = self._ot_trials[trial_id]
            last = self._curve_steps.get(trial_id, -1)
            for step, value in result.get("objective_curve", []):
                if int(step) > last:
                    ot_trial.report(float(value), int(step))
                    last = int(step)
            self._curve_steps[trial_id] = last

        def on_trial_complete(
            self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
        ) -> None:
            import optuna

            if trial_id in self._completed_trials or trial_id not in self._ot_trials:
                return
            if result and not error:
                self.on_trial_result(trial_id, result)  # the curve's last points
            study: Any = self._ot_study
            ot_trial = self._ot_trials[trial_id]
            self._completed_trials.add(trial_id)
            if error or not result or REFUSED in result:  # errored, refused, or removed before it ran
                study.tell(ot_trial, state=optuna.trial.TrialState.FAIL)
            elif "objective_n" in result:  # the final result: every seed evaluated and committed
                for key in OBJECTIVE_KEYS:
                    ot_trial.set_user_attr(key, float(result[key]))
                value = told_value(float(result["objective"]), str(self._block.direction))
                study.tell(ot_trial, value)
            else:  # stopped by the pruner (pruning_scheduler) before its last epoch
                # the row first, then Optuna: a driver killed in between is settled from the
                # row (reconcile: PRUNED); the other order left it PRUNED without its row
                write_pruned_row(
                    self._template, dict(ot_trial.params), result, extra={"optuna_number": ot_trial.number}
                )
                study.tell(ot_trial, state=optuna.trial.TrialState.PRUNED)

    class CandidateLog(Callback):
        """Prints one line per finished or failed candidate (holds no unpicklable state)."""

        def __init__(self, total: int, done: int, space_keys: list[str]) -> None:
            self.total, self.done, self.keys = total, done, space_keys

        def params(self, trial: Any) -> str:
            """The candidate's searched values, e.g. ``train.lr=0.125 model.dropout=0.1``."""
            return " ".join(f"{k}={trial.config.get(k, math.nan):.4g}" for k in self.keys)

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            r = trial.last_result or {}
            params = self.params(trial)
            if REFUSED in r:  # its error is printed with the others when the search ends
                say(f"[red]candidate {params} failed: its config was refused (not retried)[/red]")
                return
            self.done += 1
            if "objective_n" in r:
                what = f"objective {r['objective']:.4g} (std {r['objective_std']:.3g}, {int(r['objective_n'])} seeds)"
            else:
                what = f"pruned at epoch {r.get('epoch')} (objective {r.get('objective', math.nan):.4g})"
            say(f"{self.done}/{self.total} done: candidate {params} -> {what}")

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            say(f"[red]candidate {self.params(trial)} failed[/red] (its error below)")

    return FinelineSearch, CandidateLog


def write_pruned_row(
    template: dict[str, Any],
    params: dict[str, Any],
    result: dict[str, Any],
    unit_id: str | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """A ``trials`` row (status ``pruned``, no objective) for a candidate ASHA stopped.

    A pruned candidate commits no seed (no runs row), so this one-row file, named by its
    ``unit_id`` and written atomically, is its commit unit of its own; the ``trials`` view
    shows it (``seeds`` empty) until that unit commits seeds (``analysis.db``). A candidate
    pruned inside a bundle of several (``unit_id``: the bundle's; ``extra``: its
    ``optuna_number`` and ``bundle_members``) has the file ``pruned-<unit_id>-<trial_id>``."""
    import datetime as dt
    import socket

    u = unit_from_template(template, params)
    spec = u["spec"]
    row = {
        "study": u["study"],
        "trial_id": u["trial_id"],
        "unit_id": unit_id or u["unit_id"],
        "seeds": [s["index"] for s in u["seeds"]],
        "task": spec["task"]["name"],
        "model": spec["model"]["name"],
        "config_hash": u["config_hash"],
        "config_json": u["config_json"],
        "point_json": u["point_json"],
        "status": "pruned",
        "started_at": None,
        "ended_at": dt.datetime.now(dt.UTC),
        "node": "",
        "hostname": socket.gethostname(),
        "git_sha": u["git_sha"],
        "versions_json": u["versions_json"],
        "bundle_size": len(u["seeds"]),
        "device": u["device"],
        **u["flat"],
        "objective": None,
        "pruned_objective": float(result.get("objective", math.nan)),
        "pruned_epoch": int(result.get("epoch", 0)),
        "pruned_step": int(result.get("opt_step", 0)),
        **(extra or {}),
    }
    stem = u["unit_id"] if unit_id is None else f"pruned-{unit_id}-{u['trial_id']}"
    write_rows(Path(u["out"]), u["study"], "trials", stem, [row])
