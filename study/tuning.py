"""``study tune``: Optuna search on Ray Tune against val / val_ood splits, resumable.

A study file with a ``tune:`` block (:class:`~study.tuning_config.TuneBlock`) names a search space over
numeric config fields, the objective (a split whose role is ``val`` or ``val_ood``, a
metric, how seeds combine) and the sampler. Every candidate trains the SAME seed indices
0..K-1 (a paired comparison) as one bundle; its objective is the mean (or median, or
IQM) over them, and its spread (std, min, max) is recorded. Naming a ``test`` split (or
selecting epochs on one) is a :class:`~trainables.errors.ConfigError` before anything
runs, so test data never reaches the sampler; test splits are still evaluated and
stored like in any study.

Execution: Ray Tune with Ray's ``OptunaSearch`` (subclassed in :func:`study.tuning_search.ray_classes`)
behind a ``ConcurrencyLimiter`` (one candidate per CPU, or one at a time with
``sequential: true``), actors reused. With ``tune.batch`` > 1 (a space of per-member
hyperparameters only) several candidates x their seeds train as one bundle, pruned per
candidate: :mod:`study.tuning_bundles`. The Optuna study lives in ``OUT/NAME/optuna.db``
(SQLite through ``RDBStorage``), readable by the stock ``optuna`` CLI and
optuna-dashboard. ``study tune`` on the same name resumes: finished candidates are kept;
a candidate left RUNNING by a killed driver is told to Optuna from Parquet when all its
seeds were committed, otherwise marked FAIL and re-queued with the same params (it
re-runs first and replaces its partial rows); only the missing number of candidates runs.

Reproducibility: each proposal's sampler is seeded from ``(sampler_seed, its position)``.
With ``sequential: true`` (and deterministic training: CPU, fixed threads) the whole
search is bit-reproducible, also across an interruption and resume. Concurrent TPE (the
default, so every CPU works) is not: what the sampler has seen when it proposes depends
on timing.
"""

from __future__ import annotations

import json
import shutil
import signal
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.markup import escape

from study import manifest as manifest_mod
from study.config import StudyConfig, check_name
from study.failures import MEMORY_FIX, REFUSED_FIX, failed_trials, failure_text
from study.lock import study_lock
from study.manifest import storage_url
from study.plan import seedsets
from study.runner import (
    StopSignals,
    StudyFailed,
    check_before_ray,
    console,
    fit,
    ray_session,
    resolve_device,
    warn_cluster_resources,
    worker_env,
)
from study.status import record_last_run
from study.steer import DRAINED_EXIT, StopRequest
from study.tuning_config import (
    SEARCH_IDENTITY,
    Objective,
    ParamSpace,
    TuneBlock,
    bundle_batch,
    candidate_point,
    tune_block,
)
from study.tuning_search import (
    make_sampler,
    pruning_scheduler,
    ray_classes,
    told_value,
)
from trainables.errors import ConfigError, ConfigRefused, StudyStateError, WorkerOutOfMemory
from trainables.results import committed, read_rows
from trainables.trackers import driver_settings
from trainables.tuning_unit import (
    objective_stats,
    param_column,
    unit_from_template,
)


def ranking_sql(name: str, direction: str, space_keys: list[str], limit: int = 5) -> str:
    """SQL ranking the fully committed candidates of ``name`` (best first), for `study sql`:
    the order of :func:`analysis.manifest.candidate_rank`."""
    order = "DESC" if direction == "maximize" else "ASC"
    params = "".join(f"{param_column(k)}, " for k in space_keys)
    return (
        f"SELECT trial_id, {params}objective, objective_std, objective_n, status FROM trials t "
        f"WHERE study = '{check_name(name)}' AND isfinite(objective) AND bundle_size = "
        "(SELECT count(*) FROM runs r WHERE r.study = t.study AND r.trial_id = t.trial_id) "
        f"ORDER BY objective {order}, objective_std, trial_id LIMIT {int(limit)}"
    )


def candidate_template(
    cfg: StudyConfig, block: TuneBlock, name: str, out: Path, manifest: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Everything candidates share; a worker adds the sampled params (``unit_from_template``).
    ``manifest`` is what :func:`study.manifest.prepare` wrote (its plugin code hashes); without
    it the plugin code is hashed here."""
    point = cfg.points[0]
    spec = point.spec.to_dict()
    spec["train"]["curve_splits"] = list(
        dict.fromkeys([*spec["train"]["curve_splits"], block.objective.split])
    )
    assert block.space is not None
    return {
        "study": name,
        "out": str(Path(out).resolve()),
        "base_spec": spec,
        "seed_extra": point.seed_extra,
        "seeds": [s.as_dict() for s in seedsets(candidate_point(point, block))],
        "device": resolve_device(cfg),
        "cuda_graphs": cfg.execution.cuda_graphs,
        "threads": cfg.execution.threads,
        "report_every_s": cfg.execution.report_every_s,
        "loggers": driver_settings(cfg.execution.loggers),
        "plugins": list(cfg.plugins),
        "config_hash": cfg.identity_hash,
        "git_sha": manifest_mod.git_sha(),
        "versions_json": json.dumps(manifest_mod.run_versions(
            manifest or {"plugin_code": manifest_mod.plugin_code(cfg)})),
        "space_keys": list(block.space),
        "objective": {**block.objective.model_dump(), "direction": block.direction},
    }


def _trial_dirname(trial: Any) -> str:
    """Ray's folder for a candidate (its default spells out the whole config)."""
    return f"candidate_{trial.trial_id}"


def metric_name(objective: Objective) -> str:
    """The objective's name in Optuna (``study.metric_names``; optuna-dashboard's axis label),
    e.g. ``val_ood/accuracy (mean over seeds)``."""
    return f"{objective.split}/{objective.metric} ({objective.aggregate} over seeds)"


def reconcile(
    study: Any, storage: Any, out: Path, block: TuneBlock, template: dict[str, Any]
) -> list[int]:
    """Settle candidates a killed driver left RUNNING; returns the numbers re-queued.

    All K seeds committed -> told to Optuna with the objective recomputed from Parquet;
    pruned inside a bundle (its ``trials`` row with status ``pruned`` and its
    ``optuna_number`` exists: the row is written before Optuna is told) -> PRUNED;
    otherwise FAIL, and the same params are enqueued to run first (their partial rows are
    replaced, since a candidate's files are named by trial_id and seed; a replay with
    committed seeds, user attribute ``committed_seeds``, is never pruned in a bundle, so it
    does replace them).
    """
    import optuna

    from analysis.db import connect

    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    if not running:
        return []
    name, seeds = template["study"], [s["index"] for s in template["seeds"]]
    study_id = storage.get_study_id_from_name(name)
    obj = block.objective
    requeued = []
    pruned = {
        int(r["optuna_number"])
        for r in read_rows(out, name, "trials", ["status", "optuna_number"])
        if r["status"] == "pruned" and r["optuna_number"] is not None
    }
    con = connect(out, studies=[name])
    try:
        for t in running:
            if set(t.params) != set(template["space_keys"]):  # killed inside ask(): nothing ran
                study.tell(t.number, state=optuna.trial.TrialState.FAIL)
                continue
            try:
                trial_id = unit_from_template(template, dict(t.params))["trial_id"]
            except ConfigError:  # killed before refuse() told it: nothing ran
                study.tell(t.number, state=optuna.trial.TrialState.FAIL)
                continue
            rows = dict(
                con.execute(
                    "SELECT e.seed, e.value FROM evals e WHERE e.study = ? AND e.trial_id = ? "
                    "AND e.split = ? AND e.metric = ?",
                    [name, trial_id, obj.split, obj.metric],
                ).fetchall()
            )
            if t.number in pruned and not all(s in rows for s in seeds):
                study.tell(t.number, state=optuna.trial.TrialState.PRUNED)
            elif all(s in rows for s in seeds):
                stats = objective_stats([rows[s] for s in seeds], obj.aggregate)
                tid = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
                for key, value in stats.items():
                    storage.set_trial_user_attr(tid, key, value)
                study.tell(t.number, told_value(stats["objective"], str(block.direction)))
            else:
                study.tell(t.number, state=optuna.trial.TrialState.FAIL)
                attrs: dict[str, Any] = {"replay_of": t.number}
                if rows:  # some seeds committed: the replay must replace them, so it is never pruned
                    attrs["committed_seeds"] = sorted(int(s) for s in rows)
                study.enqueue_trial(dict(t.params), user_attrs=attrs)
                requeued.append(t.number)
    finally:
        con.close()
    return requeued


def finished_count(study: Any) -> int:
    """Finished candidates: COMPLETE plus PRUNED."""
    import optuna

    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return len(study.get_trials(deepcopy=False, states=states))


def _check_resume(out: Path, name: str, block: TuneBlock) -> None:
    old = manifest_mod.read(out, name)
    if old is None:
        return
    if old.get("kind") != "tune":
        raise StudyStateError(
            f"study {name!r} in {out} exists and is not a tuning study. Fix: use another --name"
        )
    new, before = block.model_dump(mode="json"), old.get("tune") or {}
    changed = [k for k in SEARCH_IDENTITY if k in before and before[k] != new[k]]
    if changed:
        a = manifest_mod.flatten({"tune": {k: before[k] for k in changed}})
        b = manifest_mod.flatten({"tune": {k: new[k] for k in changed}})
        diff = [f"{k} {json.dumps(a.get(k))} -> {json.dumps(b.get(k))}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        raise StudyStateError(
            f"tuning study {name!r} in {out} was created with a different search; changed: "
            f"{'; '.join(diff[:manifest_mod.DIFF_LINES]) or 'tune.' + changed[0]}. Fix: `study resume {name} "
            f"--out {out}` resumes it with the recorded config and overrides; or give a new --name to start a "
            "separate search"
        )


def run_tuning(
    cfg: StudyConfig,
    name: str,
    out: Path,
    trials: int | None = None,
    address: str | None = None,
    num_cpus: int | None = None,
) -> dict[str, int]:
    """Run or resume tuning study ``name`` until ``trials`` candidates have finished.

    Returns ``{"requested", "finished", "ran"}``. Raises ConfigError before anything is
    written for a bad config (e.g. a test split as objective), StudyFailed when candidates
    failed or the run was interrupted (re-running resumes).
    """
    out = Path(out)
    block = tune_block(cfg)
    n_trials = trials or block.trials
    analysis = check_before_ray(cfg, address, num_cpus)
    batch, note = bundle_batch(cfg, block, resolve_device(cfg))
    _check_resume(out, name, block)
    with study_lock(out, name), manifest_mod.forgotten_if_refused(out, name, also=(manifest_mod.OPTUNA_DB,)):
        if note:
            console.print(note)
        return _tune_locked(cfg, name, out, n_trials, address, num_cpus, block, analysis, batch)


def _tune_locked(
    cfg: StudyConfig,
    name: str,
    out: Path,
    n_trials: int,
    address: str | None,
    num_cpus: int | None,
    block: TuneBlock,
    analysis: dict[str, Any],
    batch: int = 1,
) -> dict[str, int]:
    """:func:`run_tuning` once its inputs are checked and this driver holds the study's lock;
    ``batch``: candidates per bundle (:func:`~study.tuning_config.bundle_batch`)."""
    import optuna

    url = storage_url(out, name)
    extra = {
        "tune_trials": n_trials,
        "tune": block.model_dump(mode="json"),
        "optuna_storage": url,
        "objective": {**block.objective.model_dump(), "direction": block.direction},
    }
    manifest = manifest_mod.prepare(out, name, cfg, "tune", analysis, extra)
    template = candidate_template(cfg, block, name, out, manifest)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(
        study_name=name, storage=storage, direction=block.direction, load_if_exists=True
    )
    with warnings.catch_warnings():  # experimental in Optuna 3.2+: not the user's concern
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([metric_name(block.objective)])  # optuna-dashboard names the objective
    if not study.get_trials(deepcopy=False):
        for cand in block.enqueue:
            study.enqueue_trial(dict(cand))
    requeued = reconcile(study, storage, out, block, template)
    if requeued:
        console.print(f"re-running interrupted candidate(s) {requeued} of tuning study {name}")
    finished = finished_count(study)
    storage_path = (out / name / "ray").resolve()
    if finished >= n_trials:
        console.print(f"[green]tuning study {name}: {finished}/{n_trials} already finished[/green]")
        _clean_up(out, name, storage_path)  # what a killed driver left (a resume that settled it)
        return {"requested": n_trials, "finished": finished, "ran": 0}
    if not block.sequential and block.sampler == "tpe":  # a random sampler's draws depend on the position only
        console.print("note: concurrent TPE is not bit-reproducible (`tune.sequential: true` is)")
    errors: list[BaseException] = []
    stops: StopSignals | None = None
    oom: WorkerOutOfMemory | None = None
    failed_before = _failed_numbers(study)
    request = StopRequest(out, name, "candidates")  # a request left from an earlier run is not for this one
    try:
        with ray_session(address, num_cpus, worker_env(cfg)) as resources:
            from study import runner

            stops = runner.SIGNALS
            if address:
                warn_cluster_resources(cfg)
            if note := runner.unused_gpu_note(cfg, resources):
                console.print(f"study {name}: {note}", soft_wrap=True, highlight=False)
            if batch > 1:
                from study.tuning_bundles import launch_bundles

                errors = launch_bundles(
                    cfg, block, template, storage, storage_path, resources, finished, n_trials, batch, request
                )
            else:
                errors = _launch(cfg, block, template, storage, storage_path, resources, finished, n_trials, request)
    except KeyboardInterrupt:
        if stops is None or stops.received is None:
            stops = StopSignals()
            stops.received = signal.SIGINT
    except WorkerOutOfMemory as killed:
        oom = killed
    finally:
        request.clear()
    texts = Counter(failure_text(err) for err in errors)  # one line per cause (a refused config refuses all alike)
    one, many = ("candidate", "candidates") if batch == 1 else ("bundle of candidates", "bundles of candidates")
    causes = []
    for text, n in texts.items():
        what = f"{one} failed" if n == 1 else f"{n} {many} failed"
        console.print(f"[red]{what}:[/red] {escape(text)}", soft_wrap=True, highlight=False)  # its [brackets] are text
        causes.append({"error": text, "line": f"{what}: {text}"})
    after = optuna.load_study(study_name=name, storage=storage)
    done = finished_count(after)
    # candidates, not trials: a failed bundle (tune.batch) fails each of its candidates
    failed = len(_failed_numbers(after) - failed_before)
    interrupted = stops is not None and stops.received is not None
    drained = request.seen and not interrupted and oom is None and done < n_trials
    stopped = f"interrupted by {stops.received.name}" if interrupted and stops and stops.received else (
        request.why() if drained else None
    )
    record_last_run(out, name, causes, stopped or (str(oom) if oom is not None else None))  # for `study status`
    if errors or done < n_trials or interrupted:
        where = f" --address {address}" if address else ""
        fix = (f"`study resume {name} --out {out}{where}` resumes it with the recorded config and overrides "
               "(as does the same `study tune` command, overrides included)")
        if stopped is not None:
            why = stopped
        elif oom is not None:
            why, fix = str(oom), f"{MEMORY_FIX}, then {fix}"
        elif errors and all(isinstance(e, ConfigRefused) for e in errors):  # resuming cannot help
            why = f"{failed} refused by their workers; see above"
            fix = REFUSED_FIX.format(again=f"study tune CONFIG --name NEW --out {out}", folder=out / name)
        else:
            why = f"{failed} failed; fix the cause shown above" if errors else "incomplete"
        seeds = len(committed(out, name))
        pending = max(0, n_trials - done - failed)
        raise StudyFailed(
            f"tuning study {name}: {done}/{n_trials} candidates finished, {failed} failed, "
            f"{pending} pending ({why}; {seeds} seed runs committed). "
            f"Fix: {fix}",
            stops.exit_code if interrupted and stops is not None else DRAINED_EXIT if drained and not errors else 1,
        )
    _clean_up(out, name, storage_path)
    return {"requested": n_trials, "finished": done, "ran": n_trials - finished}


def _clean_up(out: Path, name: str, storage_path: Path) -> None:
    """Remove what only a running search needs: Ray Tune's storage and the bundles' pruning
    decisions (``OUT/NAME/pruned``)."""
    shutil.rmtree(storage_path, ignore_errors=True)
    shutil.rmtree(out / name / "pruned", ignore_errors=True)


def _failed_numbers(study: Any) -> set[int]:
    """The numbers of an Optuna study's failed trials."""
    import optuna

    return {t.number for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))}


def tune_parts(cfg: StudyConfig, storage_path: Path, callbacks: list[Any] | None = None) -> tuple[Any, Any, Any]:
    """What every tuning launch shares: the trainable with the study's per-trial resources,
    the Tune ``RunConfig`` (checkpoint each result, keep one, the study's retries) and the
    callback that collects failed and refused trials' errors (:func:`~study.failures.failed_trials`;
    run the tuner with ``fit(tuner, errors=failed.logged)``)."""
    from ray import tune

    from trainables.trainable import FinelineTrainable

    ex = cfg.execution
    failed = failed_trials()
    trainable = tune.with_resources(FinelineTrainable, {"cpu": ex.cpus_per_trial, "gpu": ex.gpus_per_trial})
    run_config = tune.RunConfig(
        name=f"tune-{int(time.time())}",
        storage_path=str(storage_path),
        verbose=0,
        callbacks=[*(callbacks or []), failed],
        failure_config=tune.FailureConfig(max_failures=ex.max_failures),
        checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1, num_to_keep=1),
    )
    return trainable, run_config, failed


def _launch(
    cfg: StudyConfig,
    block: TuneBlock,
    template: dict[str, Any],
    storage: Any,
    storage_path: Path,
    resources: dict[str, float],
    finished: int,
    n_trials: int,
    requested: Callable[[], bool],
) -> list[BaseException]:
    """Run ``n_trials - finished`` candidates on the connected Ray; returns their errors.
    ``requested``: whether ``study stop`` asked to drain (:func:`study.steer.draining_limiter`)."""
    from ray import tune

    from study.steer import draining_limiter

    ex = cfg.execution
    workers = max(1, int(resources.get("CPU", 1) // ex.cpus_per_trial))
    search_cls, log_cls = ray_classes()
    searcher = search_cls(block, template, storage)
    search = draining_limiter(searcher, 1 if block.sequential else workers, requested)
    scheduler = pruning_scheduler(searcher) if block.pruner != "none" else None
    trainable, run_config, failed = tune_parts(
        cfg, storage_path, [log_cls(n_trials, finished, list(template["space_keys"]))]
    )
    tuner = tune.Tuner(
        trainable,
        param_space={"template": template},
        tune_config=tune.TuneConfig(
            search_alg=search,
            scheduler=scheduler,
            num_samples=n_trials - finished,
            metric="objective",
            mode="max" if block.direction == "maximize" else "min",
            reuse_actors=True,
            trial_dirname_creator=_trial_dirname,
        ),
        run_config=run_config,
    )
    fit(tuner, errors=failed.logged)
    return list(failed.errors)


def best_config(
    out: Path, tune_name: str, seeds: int | None, name: str | None
) -> tuple[StudyConfig, str, dict[str, Any]]:
    """The seed-study config of the best candidate of ``tune_name``.

    "Best" is the first row of :func:`ranking_sql` (what ``study sql`` ranks first). The
    seed study trains the candidate's resolved config, so its ``trial_id`` equals the
    candidate's; returns (config with ``seeds`` seeds, default 50; study name, default
    ``<tune_name>-best``; the manifest extra ``tuned_from``).
    """
    from analysis.db import connect

    m = manifest_mod.read(out, tune_name)
    if m is None:
        raise StudyStateError(
            f"--from-best: no tuning study {tune_name!r} in {out}. Fix: check `study ls --out {out}`"
        )
    if m.get("kind") != "tune":  # it said "no tuning study" of a study that is there
        raise StudyStateError(
            f"--from-best: study {tune_name!r} in {out} is a {manifest_mod.KIND_WORDS.get(str(m.get('kind')), 'seed')} study, not a "
            f"tuning study. Fix: name the tuning study it came from (`study ls --out {out}` lists kinds)"
        )
    tune = m.get("tune") or {}
    direction, keys = tune.get("direction", "maximize"), list(tune.get("space") or {})
    query = ranking_sql(tune_name, direction, keys, limit=1)
    con = connect(out, studies=[tune_name])
    try:
        best = con.execute(query).df()
        found = (
            None
            if best.empty
            else con.execute(
                "SELECT config_json, point_json FROM trials WHERE study = ? AND trial_id = ? LIMIT 1",
                [tune_name, best["trial_id"][0]],
            ).fetchone()
        )
    finally:
        con.close()
    if found is None:
        raise StudyStateError(
            f"--from-best: tuning study {tune_name!r} has no finished candidate yet. Fix: run `study tune` first"
        )
    resolved = json.loads(found[0])
    raw = {k: v for k, v in manifest_mod.recorded_config(m).items() if k not in ("tune", "name", "grid")}
    raw.update({k: resolved[k] for k in ("task", "model", "train")})
    cfg = manifest_mod.parse_recorded(m, raw, seeds or 50)
    study_name = check_name(name or f"{tune_name}-best")
    row = best.iloc[0]
    extra = {
        "tuned_from": {
            "study": tune_name,
            "trial_id": str(row["trial_id"]),
            "params": json.loads(found[1]),
            "objective": float(row["objective"]),
            "objective_std": float(row["objective_std"]),
            "objective_spec": m.get("objective"),
            "seeds_seen": int(tune.get("seeds_per_candidate", 0)),
            "optuna_storage": m.get("optuna_storage"),
            "ranking_sql": query,
        }
    }
    return cfg, study_name, extra


__all__ = [
    "Objective",
    "ParamSpace",
    "TuneBlock",
    "best_config",
    "candidate_template",
    "finished_count",
    "make_sampler",
    "ranking_sql",
    "ray_classes",
    "run_tuning",
    "storage_url",
    "tune_block",
]
