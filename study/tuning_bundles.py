"""Tuning in bundles (``tune.batch`` > 1): several candidates x their paired seeds, one bundle.

Every candidate of a search trains the same K seeds; where candidates differ only in
per-member hyperparameters (:data:`~study.tuning_config.BUNDLABLE`), ``batch`` of them share
one :class:`~trainables.loop.BundleRun` of ``batch x K`` members (``member_specs``: member
``c * K + i`` is seed i of candidate c and computes what a lone run of that candidate's
config computes). One Ray Tune trial trains one such bundle.

:class:`BundleSearch` (a Ray Tune ``Searcher``, defined on first use by
:func:`bundle_search_class`) asks Optuna for the bundle's candidates with ask-and-tell: each
``ask`` with the sampler seeded from ``(sampler_seed, position)`` (as one candidate per
trial does) and, for TPE, ``constant_liar=True``, so a batch spreads out (the candidates
asked before it in the batch count as RUNNING with a pessimistic value). The worker reports
each candidate's learning curve (the objective aggregated over the candidate's running
seeds); the searcher reports it to Optuna (``trial.report``) and, with a pruner, consults it
per candidate (``trial.should_prune`` through the storage). ``tune.pruner: asha`` is then
Optuna's ``SuccessiveHalvingPruner`` (``min_resource = grace_period``,
``reduction_factor``): Ray's ASHA stops whole trials, i.e. whole bundles. A pruned
candidate gets its ``trials`` row (status ``pruned``, this bundle's ``unit_id``), is told
PRUNED, and its number is written to the bundle's pruned file
(:func:`trainables.tuning_unit.pruned_path`), which the trainable reads before its next
round (Tune schedules that round only after the searcher has seen the result), so its
members are masked and compacted out while the rest go on. With a pruner the trainable
reports after every evaluation, so the decisions do not depend on timing.

Each candidate commits its seeds under its own ``trial_id`` with its ``trials`` row in each
seed's commit, ``unit_id`` being the bundle's: the ``trials`` view then has one row per
(candidate, bundle), ``bundle_size`` its K seeds and ``bundle_members`` the whole bundle.
Resume after a killed driver is :func:`study.tuning.reconcile`'s: a candidate left RUNNING
is told from Parquet when its K seeds are committed, PRUNED when its pruned row exists,
else FAIL and re-queued with the same params (it re-runs first, in a new bundle).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from study.config import StudyConfig
from study.runner import fit
from study.tuning import tune_parts
from study.tuning_config import TuneBlock
from study.tuning_search import (
    distributions,
    make_pruner,
    make_sampler,
    position_of,
    refuse,
    say,
    told_value,
    write_pruned_row,
)
from trainables.errors import REFUSED, ConfigError
from trainables.tuning_unit import (
    OBJECTIVE_KEYS,
    bundle_from_template,
    unit_from_template,
    write_pruned,
)


def _params_text(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.4g}" for k, v in params.items())


@functools.cache
def bundle_search_class() -> type:
    """:class:`BundleSearch`, defined on first use (this module must not import Ray early:
    ``study.runner.ray_session`` sets Ray's environment before Ray's first import)."""
    import optuna
    from ray.tune.search import Searcher

    class BundleSearch(Searcher):
        """Ask-and-tell Optuna search, ``batch`` candidates per Ray Tune trial (module doc).

        ``to_run``: candidates to ask in all (then :attr:`Searcher.FINISHED`); ``total`` and
        ``done``: the search's requested and already finished candidates (for the lines
        printed per finished candidate)."""

        def __init__(
            self, block: TuneBlock, template: dict[str, Any], storage: Any, batch: int,
            to_run: int, total: int, done: int,
        ) -> None:
            super().__init__(metric=None, mode=None)
            self._block, self._template, self._batch = block, template, batch
            self._left = to_run
            self.total, self.done = total, done
            self._study = optuna.load_study(
                study_name=template["study"], storage=storage, pruner=make_pruner(block)
            )
            self._dists = distributions(block)
            self._bundles: dict[str, tuple[str, list[int]]] = {}
            """Ray trial id -> (the bundle's unit_id, its candidates' Optuna numbers)."""
            self._trials: dict[int, Any] = {}
            """Optuna number -> its ``optuna.Trial`` (asked by this searcher)."""
            self._last: dict[int, tuple[int, float]] = {}
            """Optuna number -> (step, value) of its last reported intermediate value."""
            self._settled: set[int] = set()
            """Numbers told to Optuna (COMPLETE, PRUNED or FAIL)."""
            self._unprunable: set[int] = set()
            """Replays of interrupted candidates with committed seeds (``reconcile``'s user
            attribute ``committed_seeds``): they run to their end and replace those rows."""
            self._pruned: dict[str, list[int]] = {}
            """Ray trial id -> its pruned candidates (what its pruned file lists)."""

        def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
            return True  # the objective comes in each result's candidate curves, not a metric

        def suggest(self, trial_id: str) -> dict[str, Any] | None:
            if self._left <= 0:
                return Searcher.FINISHED  # type: ignore[return-value]  # Tune's "no more" marker
            candidates: list[list[Any]] = []
            seeds = [s["index"] for s in self._template["seeds"]]
            in_a_row = 0
            while len(candidates) < min(self._batch, self._left):
                self._study.sampler = make_sampler(self._block, position_of(self._study), batched=True)
                trial = self._study.ask(self._dists)
                params = dict(trial.params)
                try:
                    trial.set_user_attr("trial_id", unit_from_template(self._template, params)["trial_id"])
                except ConfigError as exc:
                    refuse(self._study, trial, exc, in_a_row, self._block)
                    in_a_row += 1
                    continue
                in_a_row = 0
                trial.set_user_attr("seeds", seeds)
                self._trials[trial.number] = trial
                if "committed_seeds" in trial.user_attrs:
                    self._unprunable.add(trial.number)
                candidates.append([trial.number, params])
            self._left -= len(candidates)
            unit_id = bundle_from_template(self._template, candidates)["unit_id"]
            for number, _ in candidates:
                self._trials[number].set_user_attr("bundle", unit_id)
            self._bundles[trial_id] = (unit_id, [int(n) for n, _ in candidates])
            return {"candidates": candidates}

        def _report(self, result: dict[str, Any]) -> list[int]:
            """Report each candidate's new curve points (each step once; a bundle restored
            from a checkpoint resends its curves); returns the numbers that got one."""
            fresh = []
            for number, curve in result.get("candidate_curves", []):
                n = int(number)
                if n in self._settled or n not in self._trials:
                    continue
                last = self._last.get(n, (-1, math.nan))
                for step, value in curve:
                    if int(step) > last[0]:
                        self._trials[n].report(float(value), int(step))
                        last = (int(step), float(value))
                        if n not in fresh:
                            fresh.append(n)
                self._last[n] = last
            return fresh

        def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
            if trial_id not in self._bundles:
                return
            fresh = self._report(result)
            if self._block.pruner == "none":
                return
            unit_id, numbers = self._bundles[trial_id]
            newly = [
                n for n in numbers
                if n in fresh and n not in self._unprunable and self._trials[n].should_prune()
            ]
            if not newly:
                return
            members = len(numbers) * len(self._template["seeds"])
            for n in newly:
                params = dict(self._trials[n].params)
                step, value = self._last[n]
                # the row first, then Optuna: a driver killed in between is settled from it
                write_pruned_row(
                    self._template, params,
                    {"objective": value, "epoch": result.get("epoch", 0), "opt_step": result.get("opt_step", 0)},
                    unit_id=unit_id, extra={"optuna_number": n, "bundle_members": members},
                )
                self._study.tell(n, state=optuna.trial.TrialState.PRUNED)
                self._settled.add(n)
                self.done += 1
                live = [m for m in numbers if m not in self._settled]
                goes_on = f"its bundle goes on with {len(live)}" if live else "its bundle stops: none left"
                say(f"{self.done}/{self.total} done: candidate {_params_text(params)} -> pruned at "
                     f"{result.get('at', step)} (objective {value:.4g}; {goes_on})")
            pruned = self._pruned.setdefault(trial_id, [])
            pruned.extend(newly)
            write_pruned(self._template["out"], self._template["study"], unit_id, pruned)

        def on_trial_complete(
            self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
        ) -> None:
            if trial_id not in self._bundles:
                return
            _, numbers = self._bundles.pop(trial_id)
            open_ = [n for n in numbers if n not in self._settled]
            if error or REFUSED in (result or {}):
                for n in open_:
                    self._study.tell(n, state=optuna.trial.TrialState.FAIL)
                    self._settled.add(n)
                return
            if result:
                self._report(result)
            finals = {int(row[0]): row[1:] for row in (result or {}).get("candidates_final", [])}
            for n in open_:
                if n not in finals:
                    continue  # stopped before its commit: left RUNNING, settled by reconcile
                stats = {k: float(v) for k, v in zip(OBJECTIVE_KEYS, finals[n], strict=True)}
                for key, value in stats.items():
                    self._trials[n].set_user_attr(key, value)
                self._study.tell(n, told_value(stats["objective"], str(self._block.direction)))
                self._settled.add(n)
                self.done += 1
                say(f"{self.done}/{self.total} done: candidate {_params_text(dict(self._trials[n].params))} -> "
                     f"objective {stats['objective']:.4g} (std {stats['objective_std']:.3g}, "
                     f"{int(stats['objective_n'])} seeds; bundle of {len(numbers)})")

        def save(self, checkpoint_path: str) -> None:
            """Nothing to save: the search's state is the Optuna storage (a Tune experiment is
            never restored; ``study tune`` resumes from the storage and Parquet)."""

        def restore(self, checkpoint_path: str) -> None:
            """See :meth:`save`."""

    return BundleSearch


def _bundle_dirname(trial: Any) -> str:
    """Ray's folder for a bundle (its default spells out the whole config)."""
    return f"bundle_{trial.trial_id}"


def launch_bundles(
    cfg: StudyConfig,
    block: TuneBlock,
    template: dict[str, Any],
    storage: Any,
    storage_path: Path,
    resources: dict[str, float],
    finished: int,
    n_trials: int,
    batch: int,
    requested: Callable[[], bool] = lambda: False,
) -> list[BaseException]:
    """Run ``n_trials - finished`` candidates, ``batch`` per bundle, on the connected Ray;
    returns the bundles' errors. ``requested``: whether ``study stop`` asked to drain (no new
    bundle is asked for then: :func:`study.steer.draining_limiter`)."""
    from ray import tune

    from study.steer import draining_limiter

    ex = cfg.execution
    workers = max(1, int(resources.get("CPU", 1) // ex.cpus_per_trial))
    to_run = n_trials - finished
    template = {**template, "each_round": block.pruner != "none"}
    search = draining_limiter(
        bundle_search_class()(block, template, storage, batch, to_run, n_trials, finished),
        1 if block.sequential else workers,
        requested,
    )
    trainable, run_config, failed = tune_parts(cfg, storage_path)
    tuner = tune.Tuner(
        trainable,
        param_space={"template": template},
        tune_config=tune.TuneConfig(
            search_alg=search,
            num_samples=math.ceil(to_run / batch),
            reuse_actors=True,
            trial_dirname_creator=_bundle_dirname,
        ),
        run_config=run_config,
    )
    fit(tuner, errors=failed.logged)
    return list(failed.errors)
