"""``study tune``: Optuna search on Ray Tune against val / val_ood splits, resumable.

Every candidate trains on the SAME seed indices (a paired comparison) as one bundle; its
objective is the mean (or median, or IQM) over those seeds of one metric on one split
whose role is ``val`` or ``val_ood`` - naming a ``test`` split is a config error before
anything runs, so test data can never reach the sampler. Test splits are still
evaluated and stored like in any study.

The Optuna study lives in ``OUT/NAME/optuna.db`` (SQLite through RDBStorage), readable by
the stock ``optuna`` CLI and optuna-dashboard. Re-running ``study tune`` with the same
name resumes: finished candidates are kept, an interrupted candidate whose rows were
already committed is told to Optuna from Parquet, other interrupted ones are marked
failed, and only the missing number of candidates runs.

Reproducibility: with ``sequential: true`` candidates run one at a time and a seeded TPE
is bit-reproducible. Concurrent TPE (the default, so both CPUs work) is not: which
results the sampler has seen when it proposes depends on timing.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from study import manifest as manifest_mod
from study.config import StudyConfig, parse
from study.plan import seedsets
from study.runner import StudyFailed, check_before_ray, console, ray_session, resolve_device
from trainables.configbase import FrozenConfig
from trainables.errors import ConfigError, StudyStateError
from trainables.loop import get_task
from trainables.spec import RunSpec, validate
from trainables.tuning_unit import aggregate, apply_params, param_column


class ParamSpace(FrozenConfig):
    """One searched numeric field."""

    low: float
    """Lower bound."""
    high: float
    """Upper bound."""
    log: bool = False
    """Sample on a log scale (log-uniform)."""
    type: Literal["float", "int"] = "float"
    """Float or integer field."""


class Objective(FrozenConfig):
    """What a candidate is scored on."""

    split: str = "val_ood"
    """Split whose metric is the objective; its role must be ``val`` or ``val_ood``."""
    metric: str = "accuracy"
    """Metric on that split."""
    aggregate: Literal["mean", "median", "iqm"] = "mean"
    """How the per-seed values combine (IQM = interquartile mean)."""


class TuneBlock(FrozenConfig):
    """The ``tune:`` block of a study file."""

    space: dict[str, ParamSpace]
    """Dotted field path -> range, e.g. ``train.lr: {low: 0.01, high: 1.0, log: true}``."""
    objective: Objective = Objective()
    """The objective split and metric."""
    direction: Literal["maximize", "minimize"] = "maximize"
    """Whether a larger objective is better."""
    seeds_per_candidate: int = Field(3, ge=1)
    """Seeds each candidate trains (the same indices for every candidate)."""
    trials: int = Field(20, ge=1)
    """Candidates to finish (``--trials`` overrides)."""
    sampler: Literal["tpe", "random"] = "tpe"
    """Optuna sampler."""
    sampler_seed: int = 0
    """Seed of the sampler."""
    sequential: bool = False
    """Run one candidate at a time (bit-reproducible TPE) instead of using every CPU."""
    pruner: Literal["none", "asha"] = "none"
    """Early stopping of poor candidates on the per-epoch objective (ASHA); off by default."""
    grace_epochs: int = Field(2, ge=1)
    """ASHA: epochs every candidate gets before it can be stopped."""


def tune_block(cfg: StudyConfig) -> TuneBlock:
    if not cfg.tune:
        raise ConfigError("tune", "the study file has no `tune:` block", "add one (see configs/weber2018_tune.yaml)")
    if len(cfg.points) != 1:
        raise ConfigError("grid", "a tuning study cannot also have a grid", "remove `grid:` or tune each point separately")
    block: TuneBlock = validate(TuneBlock, dict(cfg.tune), "tune")
    base = cfg.points[0].spec.to_dict()
    for path, rng in block.space.items():
        if path.split(".")[0] not in ("task", "model", "train"):
            raise ConfigError(f"tune.space.{path}", "not a task/model/train field", "use a path like train.lr")
        if rng.low >= rng.high or (rng.log and rng.low <= 0):
            raise ConfigError(f"tune.space.{path}", f"invalid range [{rng.low}, {rng.high}]",
                              "need low < high, and low > 0 for log")
        for value in (rng.low, rng.high):
            try:
                RunSpec.from_dict(apply_params(base, {path: int(value) if rng.type == "int" else value}))
            except ConfigError as exc:
                raise ConfigError(f"tune.space.{path}", exc.problem, exc.fix) from None
    roles = get_task(cfg.points[0].spec).split_roles()
    obj = block.objective
    allowed = sorted(n for n, r in roles.items() if r in ("val", "val_ood"))
    if obj.split not in roles:
        raise ConfigError("tune.objective.split", f"no split {obj.split!r}", f"use one of: {', '.join(allowed)}")
    if roles[obj.split] not in ("val", "val_ood"):
        raise ConfigError(
            "tune.objective.split",
            f"split {obj.split!r} has role {roles[obj.split]!r}: tuning may only look at val or val_ood splits "
            "(a test split would leak into model selection)",
            f"use one of: {', '.join(allowed)}",
        )
    return block


def storage_url(out: Path, name: str) -> str:
    return f"sqlite:///{(Path(out) / name / 'optuna.db').resolve()}"


def _distributions(block: TuneBlock) -> dict[str, Any]:
    import optuna

    dists: dict[str, Any] = {}
    for path, r in block.space.items():
        if r.type == "int":
            dists[path] = optuna.distributions.IntDistribution(int(r.low), int(r.high), log=r.log)
        else:
            dists[path] = optuna.distributions.FloatDistribution(r.low, r.high, log=r.log)
    return dists


def _reconcile(study: Any, out: Path, name: str, block: TuneBlock, template: dict[str, Any]) -> None:
    """Settle candidates left RUNNING by an interrupted driver."""
    import optuna

    from analysis.db import connect
    from trainables.tuning_unit import unit_from_template

    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    if not running:
        return
    con = connect(out)
    for t in running:
        unit = unit_from_template(template, dict(t.params))
        rows = con.execute(
            "SELECT value FROM evals WHERE study = ? AND trial_id = ? AND split = ? AND metric = ?",
            [name, unit["trial_id"], block.objective.split, block.objective.metric],
        ).fetchall()
        if len(rows) >= block.seeds_per_candidate:
            study.tell(t.number, aggregate([r[0] for r in rows], block.objective.aggregate))
        else:
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)
    con.close()


def run_tuning(
    cfg: StudyConfig, name: str, out: Path, trials: int | None,
    address: str | None = None, num_cpus: int | None = None,
) -> dict[str, int]:
    """Run or resume a tuning study until ``trials`` candidates have finished."""
    import optuna
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    from trainables.trainable import FinelineTrainable

    out = Path(out)
    block = tune_block(cfg)
    n_trials = trials or block.trials
    analysis = check_before_ray(cfg)
    old = manifest_mod.read(out, name)
    if old is not None and old.get("kind") != "tune":
        raise StudyStateError(f"study {name!r} exists and is not a tuning study. Fix: use another --name")
    objective = {**block.objective.model_dump(), "direction": block.direction}
    manifest_mod.prepare(out, name, cfg, "tune", analysis, {"tune_trials": n_trials, "objective": objective})
    point = cfg.points[0]
    spec = point.spec.to_dict()
    curve = list(dict.fromkeys([*spec["train"].get("curve_splits", []), block.objective.split]))
    spec["train"]["curve_splits"] = curve
    device = resolve_device(cfg)
    seeds = seedsets(point.__class__(point.spec, point.seeds.model_copy(update={"count": block.seeds_per_candidate}), {}))
    template = {
        "study": name, "out": str(out.resolve()), "base_spec": spec, "seed_extra": point.seed_extra,
        "seeds": [s.as_dict() for s in seeds], "device": device, "threads": cfg.execution.threads,
        "config_hash": cfg.identity_hash, "git_sha": manifest_mod.git_sha(),
        "versions_json": "{}", "space_keys": list(block.space), "objective": objective,
    }
    storage = optuna.storages.RDBStorage(storage_url(out, name))
    sampler = (optuna.samplers.TPESampler(seed=block.sampler_seed) if block.sampler == "tpe"
               else optuna.samplers.RandomSampler(seed=block.sampler_seed))
    direction = block.direction
    ot_study = optuna.create_study(study_name=name, storage=storage, direction=direction, load_if_exists=True)
    _reconcile(ot_study, out, name, block, template)
    finished = len(ot_study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    remaining = n_trials - finished
    if remaining <= 0:
        console.print(f"[green]tuning study {name}: {finished}/{n_trials} candidates already finished[/green]")
        return {"finished": finished, "ran": 0}
    mode = "max" if direction == "maximize" else "min"
    ex = cfg.execution
    with ray_session(address, num_cpus) as resources:
        workers = max(1, int(resources.get("CPU", 1) // ex.cpus_per_trial))
        searcher = OptunaSearch(
            space=_distributions(block), metric="objective", mode=mode, sampler=sampler,
            study_name=name, storage=storage,
        )
        search_alg = ConcurrencyLimiter(searcher, max_concurrent=1 if block.sequential else workers)
        scheduler = (ASHAScheduler(time_attr="epoch", grace_period=block.grace_epochs, max_t=10_000)
                     if block.pruner == "asha" else None)
        tuner = tune.Tuner(
            tune.with_resources(FinelineTrainable, {"cpu": ex.cpus_per_trial, "gpu": ex.gpus_per_trial}),
            param_space={"template": template},
            tune_config=tune.TuneConfig(
                search_alg=search_alg, scheduler=scheduler, num_samples=remaining,
                metric="objective", mode=mode, reuse_actors=True,
            ),
            run_config=tune.RunConfig(
                name=f"tune-{finished}", storage_path=str((out / name / "ray").resolve()), verbose=1,
                failure_config=tune.FailureConfig(max_failures=ex.max_failures),
            ),
        )
        results = tuner.fit()
    failed = sum(1 for r in results if r.error is not None)
    if failed:
        raise StudyFailed(f"tuning study {name}: {failed} candidate(s) failed; re-run `study tune` to resume")
    done = len(optuna.load_study(study_name=name, storage=storage).get_trials(
        deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    console.print(f"[green]tuning study {name}: {done}/{n_trials} candidates finished; "
                  f"storage {storage_url(out, name)}[/green]")
    return {"finished": done, "ran": remaining}


def best_config(out: Path, tune_name: str, seeds: int | None, name: str | None) -> tuple[StudyConfig, str, dict[str, Any]]:
    """The seed-study config of the best candidate of ``tune_name`` (as `study sql` ranks it)."""
    from analysis.db import connect

    m = manifest_mod.read(out, tune_name)
    if m is None or m.get("kind") != "tune":
        raise StudyStateError(f"--from-best: no tuning study {tune_name!r} in {out}. Fix: check `study ls --out {out}`")
    direction = m.get("objective", {}).get("direction", "maximize")
    order = "DESC" if direction == "maximize" else "ASC"
    con = connect(out)
    row = con.execute(
        f"SELECT trial_id, point_json, objective FROM trials WHERE study = ? AND objective IS NOT NULL "
        f"AND NOT isnan(objective) ORDER BY objective {order}, trial_id LIMIT 1", [tune_name]
    ).fetchone()
    con.close()
    if row is None:
        raise StudyStateError(f"--from-best: tuning study {tune_name!r} has no finished candidate yet. Fix: run `study tune` first")
    import json

    params = json.loads(row[1])
    raw = {k: v for k, v in m["config"].items() if k not in ("tune", "name")}
    for path, value in params.items():
        from study.config import set_dotted

        set_dotted(raw, path, value)
    cfg = parse(raw, seeds or 50)
    study_name = name or f"{tune_name}-best"
    from study.config import check_name

    check_name(study_name)
    extra = {"tuned_from": {"study": tune_name, "trial_id": row[0], "params": params, "objective": row[2]}}
    return cfg, study_name, extra


__all__ = ["TuneBlock", "best_config", "param_column", "run_tuning", "tune_block"]
_ = math
