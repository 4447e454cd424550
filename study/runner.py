"""Launching a study's units on Ray Tune, locally or on a cluster, with progress."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

from study import manifest as manifest_mod
from study.config import StudyConfig
from study.failures import (
    MEMORY_FIX,
    REFUSED_FIX,
    FailedUnit,
    TrialErrors,
    failed_units_text,
    failures_by_cause,
    fit_reporting_memory,
)
from study.lock import LOCK_FILE, study_lock
from study.plan import default_cpus, plan_units, seedsets, unit_payload
from study.preflight import (
    DEAD_FIX,
    TOKEN_FIX,
    HeadWatch,
    check_address,
    check_resources,
    held_stderr,
    loopback_only,
    private_token,
    shielded_from_sigterm,
    shutdown_local_ray,
    sync_auth_mode,
    warn_cluster_resources,
)
from study.status import FAILED, committed_runs, record_last_run
from study.steer import DRAINED_EXIT, StopRequest
from trainables.errors import ConfigError, StudyIncomplete, WorkerOutOfMemory
from trainables.plugins import shippable
from trainables.results import committed

console = Console(stderr=True)

StudyFailed = StudyIncomplete
"""The name this module used before (kept for callers)."""

class StopSignals:
    """SIGINT, SIGTERM and SIGHUP (a closed terminal or SSH session) during a Ray session,
    handled in Python (no C++ stack dump): the first stops Ray Tune gracefully (running
    trials are stopped, committed seeds kept), a second stops at once; either way
    ``ray.shutdown()`` then stops every Ray process this driver started, and ``study
    status`` says why the run stopped. ``received`` names the first signal."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self.tune_running = False
        self.closing = False
        self.before: dict[int, object] = {}

    def install(self) -> None:
        import threading

        if threading.current_thread() is threading.main_thread():
            self.before = {s: signal.signal(s, self.handle) for s in self.SIGNALS if not self.ignored(s)}

    @staticmethod
    def ignored(sig: signal.Signals) -> bool:
        """SIGHUP ignored (``nohup study run ...``) stays ignored: closing the terminal must not
        stop a study its user detached on purpose."""
        return sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN

    def restore(self) -> None:
        for s, h in self.before.items():
            signal.signal(s, h)  # type: ignore[arg-type]
        self.before = {}

    def handle(self, signum: int, frame: Any) -> None:
        first = self.received is None
        if first:
            self.received = signal.Signals(signum)
        if self.closing:
            return  # already stopping: let ray.shutdown() finish
        if first and self.tune_running:
            tune_stop = signal.getsignal(signal.SIGUSR1)  # Tune's graceful-stop handler
            if callable(tune_stop):
                with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
                    console.print(
                        f"{signal.Signals(signum).name}: stopping the study (committed seeds are kept); "
                        "send it again to stop at once",
                        soft_wrap=True,
                        highlight=False,
                    )
                tune_stop(signal.SIGUSR1, frame)
                return
        raise KeyboardInterrupt

    @property
    def exit_code(self) -> int:
        return 128 + int(self.received) if self.received is not None else 1


RAY_CLIENT_NOTE = (
    "note: ray:// (Ray Client) runs Ray Tune inside the cluster, so fineline's per-seed lines and "
    "progress do not reach this terminal (Ray Tune's own output does); the results are the same. "
    "For them, run the driver where the head's GCS port is reachable (HOST:6379; e.g. on the head "
    "node: `ray attach cluster.yaml`)"
)
"""Said once when ``--address`` is a Ray Client address (probe D: 131 lines of Ray Tune's
output for a 20 s study, and none of fineline's)."""

SIGNALS: StopSignals | None = None
"""The current Ray session's signal handling (None outside one)."""


def connect(address: str, runtime_env: dict[str, Any] | None) -> None:
    """``ray.init`` to the cluster at ``address``; a refused token or a dead address is one
    :class:`ConfigError` naming ``--address`` and the fix."""
    import ray
    from ray.exceptions import AuthenticationError

    try:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=True, runtime_env=runtime_env)
    except AuthenticationError as exc:  # token mode, but no token on this machine
        raise ConfigError(
            "--address", f"no Ray auth token for the cluster at {address} ({exc.message})", TOKEN_FIX
        ) from None
    except ConnectionError as exc:
        if "InvalidAuthToken" in f"{exc} {exc.__cause__}":
            if os.environ.get("RAY_AUTH_MODE") == "disabled":  # no token was sent at all
                raise ConfigError(
                    "--address",
                    f"the cluster at {address} requires an auth token, and this driver runs with "
                    "RAY_AUTH_MODE=disabled",
                    f"unset RAY_AUTH_MODE (fineline then uses token mode) and {TOKEN_FIX}",
                ) from None
            raise ConfigError(
                "--address", f"the cluster at {address} refused this driver's auth token", TOKEN_FIX
            ) from None
        raise ConfigError("--address", f"no Ray cluster answers at {address}", DEAD_FIX) from None


@contextmanager
def ray_session(
    address: str | None, num_cpus: int | None, runtime_env: dict[str, Any] | None = None,
    on_lost: Callable[[str], None] | None = None,
) -> Iterator[dict[str, float]]:
    """A Ray connection: a fresh local Ray (no dashboard, no usage stats) or ``address``.

    ``runtime_env`` is the job's (:func:`worker_env`: the plugin modules every worker needs).
    ``on_lost``: on a cluster, called (from a watcher thread) once the head node's GCS has
    not answered for :data:`~study.preflight.HEAD_LOST_S` (:class:`~study.preflight.HeadWatch`).

    Authentication is decided once, here and in ``cluster.yaml``: every Ray process of a
    fineline cluster runs with token authentication (``RAY_AUTH_MODE=token``). Ray 2.60
    enables it by default for a new local Ray, but a driver connecting to an explicit
    ``address`` stays ``disabled`` unless told, and is then refused (``InvalidAuthToken``).
    So the driver sets ``RAY_AUTH_MODE=token`` unless the user chose a mode explicitly
    (``RAY_AUTH_MODE=disabled`` for a cluster deliberately run without tokens); the token
    itself comes from ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``
    and must be the cluster's. Ray caches the mode per process, so it is re-read if needed.
    """
    global SIGNALS
    sync_auth_mode()
    import ray

    stops = StopSignals()
    if address:
        address = check_address(address)
        console.print(f"connecting to Ray at {address}")
        if address.startswith("ray://"):
            console.print(RAY_CLIENT_NOTE, soft_wrap=True, highlight=False, markup=False)
        with held_stderr():  # Ray's retry lines, printed unless one error below says it all
            connect(address, runtime_env)
    else:
        private_token()
        with loopback_only(), shielded_from_sigterm() as started:
            ray.init(
                # "local": a Ray of this study's own, never the cluster a `ray start` on this
                # machine left in /tmp/ray/ray_current_cluster (stale or not)
                address="local",
                num_cpus=num_cpus or default_cpus(),
                include_dashboard=False,
                logging_level=logging.ERROR,
                log_to_driver=True,
                runtime_env=runtime_env,
            )
    stops.install()
    SIGNALS = stops
    watch = HeadWatch(address, on_lost) if address and on_lost is not None else contextlib.nullcontext()
    try:
        with watch:
            yield ray.cluster_resources()
    finally:
        stops.closing = True
        try:
            if address:
                ray.shutdown()
            else:
                shutdown_local_ray(started)
        finally:
            stops.restore()
            SIGNALS = None


def worker_env(cfg: StudyConfig) -> dict[str, Any] | None:
    """The job's Ray ``runtime_env``: the study's ``plugins:`` modules that are not installed,
    shipped to every worker as ``py_modules``, and the driver's CPU-kernel settings
    (``FINELINE_CFLAGS``, ``FINELINE_PORTABLE_KERNELS``, ...: :func:`ckernels.forwarded_env`,
    checked here, before Ray) as ``env_vars``, so every node builds the same kernels (None:
    nothing to ship or set)."""
    from trainables.models.ckernels import forwarded_env

    env = forwarded_env()
    runtime: dict[str, Any] = {"env_vars": env} if env else {}
    if not cfg.plugins or not cfg.execution.ship_plugins:
        return runtime or None
    modules = shippable([sys.modules[name] for name in cfg.plugins])
    if not modules:
        return runtime or None
    console.print(
        "plugins shipped to the Ray workers: "
        + ", ".join(f"{m.__name__} ({m.__file__})" for m in modules),
        soft_wrap=True,
    )
    return {**runtime, "py_modules": modules}


def resolve_device(cfg: StudyConfig) -> str:
    dev = cfg.execution.device
    if dev == "auto":
        return "cuda" if cfg.execution.gpus_per_trial > 0 else "cpu"
    return dev


def built_data(spec: Any, task: Any, cache: dict[str, tuple[Any, Any]], key: str) -> Any:
    """``task``'s data for data seed 0, built once per task config ``key`` (kept in
    ``cache`` as ``(task, data)``); a plugin's exception names its line (``blame``)."""
    from trainables.rehearsal import blame

    if key not in cache:
        with blame(spec, "building the task's data (data seed 0)", "task"):
            cache[key] = (task, task.build(0))
    return cache[key][1]


def check_pairs(cfg: StudyConfig, built: dict[str, tuple[Any, Any]] | None = None,
                local: bool = True) -> None:
    """Run what trials would run first, once, before Ray, for each distinct (task, model):

    * the model is sized on torch's ``meta`` device (:func:`~trainables.rehearsal.seed_bytes`;
      nothing allocated): one seed that cannot train in this machine's available memory is
      refused for a local Ray (``local``); on a cluster, whose nodes may hold more, it is
      only not built here;
    * a plugin's pair is rehearsed on a few examples (:func:`~trainables.rehearsal.rehearse`:
      a training step, an evaluation, every split scored, twice from the same seeds) after
      its task's data is checked to follow the data seed.

    So a mistake is one error, not a failure in every trial. Costs one data build per task
    config (0.01-0.5 s for the shipped studies; ``built`` holds those already made, by task
    config) and, per plugin pair, a second data build and two steps of a two-seed bundle on
    8 examples. A plugin task whose ``rehearsable()`` is False (slow or side-effecting
    builds) is not built here. A study on ``cuda`` is neither refused for this machine's
    memory nor rehearsed (on a CPU, maybe without a GPU): its contract suite runs with
    ``device="cuda"``."""
    import psutil

    from trainables.rehearsal import (
        check_data_seeded,
        check_task_data,
        is_builtin,
        needs_rehearsal,
        rehearse,
        seed_bytes,
    )

    data: dict[str, tuple[Any, Any]] = built if built is not None else {}
    seen: set[tuple[str, str, str]] = set()
    seeded: set[str] = set()  # task configs whose build was checked to follow the data seed
    on_gpu = cfg.execution.device == "cuda"  # trials hold the model in GPU memory; the driver may have no GPU
    for point in cfg.points:
        spec = point.spec
        raw = spec.to_dict()
        key = (json.dumps(raw["task"], sort_keys=True), json.dumps(raw["model"], sort_keys=True),
               f"{spec.train.loss_reduction} {spec.train.optimizer} {spec.train.momentum}")
        plugin = needs_rehearsal(spec)
        if key in seen:
            continue
        seen.add(key)
        task = data[key[0]][0] if key[0] in data else spec.make_task()
        if not is_builtin(type(task)) and not task.rehearsable():
            continue
        task_data = built_data(spec, task, data, key[0])
        if plugin and not is_builtin(type(task)) and key[0] not in seeded:
            seeded.add(key[0])
            check_task_data(spec, task_data)  # before the seeding check: a NaN differs from itself
            check_data_seeded(spec, task, task_data)
        where = f" (grid point {point.values})" if point.values else ""
        try:
            try:
                params, need = seed_bytes(spec, task_data.meta)
            except ConfigError:
                raise  # the model's own refusal (a size its task cannot take)
            except Exception:
                if not plugin:
                    raise  # a built-in model that the meta device cannot build: a fineline bug
                params, need = 0, 0  # plugin code that needs real values: the rehearsal builds it for real
            free = psutil.virtual_memory().available
            if need > free and local and not on_gpu:
                raise ConfigError(
                    "model", f"model {spec.model_name!r} has {params:,} parameters per seed: training one "
                    f"seed needs about {need / 2**30:.1f} GiB (parameters, gradients, optimizer state, the "
                    f"selected copy), more than the {free / 2**30:.1f} GiB this machine has available",
                    "lower its sizes (`study plugins --fields` lists the model's fields), or run on a "
                    "cluster whose nodes hold more with --address",
                )
            if plugin and not on_gpu and 2 * need <= free:  # the rehearsal trains two seeds here
                rehearse(spec, task, task_data)
        except ConfigError as exc:
            if not where:
                raise
            raise ConfigError(exc.field, f"{exc.problem}{where}", exc.fix) from None


def check_batches(cfg: StudyConfig, built: dict[str, tuple[Any, Any]]) -> None:
    """Each point's ``train.batch_size`` and ``data_order`` against its task's training split,
    as the worker checks them (:func:`~trainables.spec.check_batch_size`), for the task configs
    built here (``built``: task config -> (task, data), by :func:`check_pairs`); before, a batch
    larger than the split was refused only on the worker, after Ray had started."""
    from trainables.spec import check_batch_size, check_data_order

    for point in cfg.points:
        task_data = built.get(json.dumps(point.spec.to_dict()["task"], sort_keys=True))
        if task_data is None:  # a plugin task not rehearsable here: its worker checks it
            continue
        task, data = task_data
        try:
            check_data_order(point.spec.train, task)
            check_batch_size(point.spec.train, task, len(data.train))
        except ConfigError as exc:
            if not point.values:
                raise
            raise ConfigError(exc.field, f"{exc.problem} (grid point {point.values})", exc.fix) from None


def check_device(cfg: StudyConfig) -> None:
    """A study on ``cuda`` must ask Ray for GPUs, or Ray would place its trials on none."""
    if cfg.execution.device == "cuda" and cfg.execution.gpus_per_trial <= 0:
        raise ConfigError("execution.gpus_per_trial", "device is cuda but no GPU is requested per trial",
                          "set execution.gpus_per_trial (e.g. 1) so Ray schedules trials on GPUs")


def unused_gpu_note(cfg: StudyConfig, resources: dict[str, float]) -> str | None:
    """The line to print when Ray has GPUs that the study will not use: ``device: auto`` asks
    for none unless ``execution.gpus_per_trial`` is set, and bundles then run on CPUs."""
    gpus = resources.get("GPU", 0)
    if not gpus or cfg.execution.device != "auto" or cfg.execution.gpus_per_trial > 0:
        return None
    return (f"note: Ray has {gpus:g} GPU(s) but execution.gpus_per_trial is 0, so bundles run on CPUs; "
            "set execution.gpus_per_trial=1 to train each bundle on a GPU")


def check_before_ray(cfg: StudyConfig, address: str | None = None, num_cpus: int | None = None) -> dict[str, Any]:
    """Everything that can fail on bad input, before Ray starts (and before OUT is written):
    the tasks' data (``Task.check``), split names, bundle sizes the model can train, and the
    resources trials ask for (:func:`check_resources`; ``address``/``num_cpus`` as given
    to ``study``).

    Returns the task facts the manifest records: ``analysis`` (what the task wants
    analysed and drawn) and ``splits`` (name and role of each split, in order).
    """
    from trainables.rehearsal import blame
    from trainables.tasks.base import Task

    roles_of: dict[str, dict[str, str]] = {}  # one check and one split_roles per task config
    built: dict[str, tuple[Any, Any]] = {}  # task config -> (task, its data for data seed 0)
    for point in cfg.points:
        key = json.dumps(point.spec.to_dict()["task"], sort_keys=True)
        if key not in roles_of:
            task = point.spec.make_task()
            with blame(point.spec, "the task's check()", "task"):
                task.check()
            if type(task).split_roles is Task.split_roles:  # the default builds the data: keep it
                splits = built_data(point.spec, task, built, key).splits
                roles_of[key] = {name: split.role for name, split in splits.items()}
            else:
                with blame(point.spec, "the task's split_roles()", "task"):
                    roles_of[key] = dict(task.split_roles())
        point.spec.check_splits(roles_of[key])
    check_bundles(cfg)
    check_pairs(cfg, built, local=address is None)
    check_batches(cfg, built)
    from trainables.trackers import check_loggers

    check_loggers(cfg.execution.loggers)  # unknown tracker, or its package not installed
    from trainables.models.ckernels import forwarded_env

    forwarded_env()  # a bad FINELINE_CFLAGS / _CPU_KERNELS / _PORTABLE_KERNELS value
    check_device(cfg)
    check_resources(cfg, address, num_cpus)
    roles = next(iter(roles_of.values()))
    if "test" not in roles.values():
        console.print(f"note: task {cfg.points[0].spec.task_name!r} has no test split (role test): the "
                      "verdict and summaries will speak about splits that selection or tuning looked at",
                      soft_wrap=True, highlight=False)
    task = cfg.points[-1].spec.make_task()
    # how each metric reads (trainables.metrics), for an analysis that never imports the task;
    # the task's primary metric unless its declarations name another
    metrics = {n: m.as_dict() for p in cfg.points for n, m in p.spec.metrics().items()}
    analysis = {"primary_metric": task.primary_metric, **task.analysis(), "metrics": metrics}
    return {"analysis": analysis, "splits": [{"name": n, "role": r} for n, r in roles.items()]}


def check_bundles(cfg: StudyConfig) -> None:
    """A fixed ``execution.bundle_size`` no larger than the model can train (``Model.max_bundle``,
    e.g. one seed for seq2seq's ``impl: reference``), and ``execution.cuda_graphs`` only for
    models that take its counter-based masks (``Model.takes_counter_noise``)."""
    from trainables.registry import MODELS

    if cfg.execution.cuda_graphs:
        for point in cfg.points:
            if not MODELS.get(point.spec.model_name).takes_counter_noise(point.spec.model):
                impl = getattr(point.spec.model, "impl", None)
                raise ConfigError(
                    "execution.cuda_graphs",
                    f"model {point.spec.model_name!r}" + (f" with impl: {impl}" if impl else "")
                    + " draws each member's dropout masks from its own generator, not the counter-based masks "
                    "this setting uses",
                    "set execution.cuda_graphs: false" + (", or use model.impl: fast" if impl == "reference" else ""),
                )
    k = cfg.execution.bundle_size
    if k == "auto":
        return  # planning keeps to the limit
    for point in cfg.points:
        limit = MODELS.get(point.spec.model_name).max_bundle(point.spec.model)
        largest = min(int(k), point.seeds.count)
        if limit is not None and largest > limit:
            impl = getattr(point.spec.model, "impl", None)
            why = f" with impl: {impl}" if impl else ""
            where = f" (grid point {point.values})" if point.values else ""
            raise ConfigError(
                "execution.bundle_size",
                f"{k} puts {largest} seeds in one bundle but model {point.spec.model_name!r}{why} trains "
                f"at most {limit} per bundle{where}",
                f"set execution.bundle_size to at most {limit} (or auto)"
                + (", or use model.impl: fast" if impl == "reference" else ""),
            )


def committed_counts(cfg: StudyConfig, out: Path, name: str) -> tuple[int, int, int]:
    """(planned, committed, of those recorded as failed) runs of ``cfg`` in ``out``, read from
    the Parquet ``runs`` rows (``study resume --skip-failed`` records failures)."""
    done = committed_runs(out, name)
    planned = hit = failed = 0
    for point in cfg.points:
        for s in seedsets(point):
            planned += 1
            status = done.get((point.trial_id, s.index))
            hit += status is not None
            failed += status == FAILED
    return planned, hit, failed


def recorded_study(out: Path, name: str, m: dict[str, Any]) -> tuple[StudyConfig, dict[str, Any]]:
    """The seed study ``study resume`` runs from manifest ``m`` of study ``name``: the config it
    records (the study file with its command-line overrides applied) with each grid point's
    seed count, and the manifest extras a re-run keeps (``tuned_from``)."""
    import dataclasses

    from study.config import with_point_counts

    try:
        seeds = int(m["seeds"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError("NAME", f"the manifest {out}/{name}/study.json is damaged (seeds)",
                          "restore it, or re-create it with `study run CONFIG --name NAME`") from None
    recorded = tuple(str(o) for o in m.get("overrides") or ())  # already applied to m["config"]
    per_point = {str(p["trial_id"]): int(p["seeds"]) for p in m.get("points") or [] if "trial_id" in p}
    raw = manifest_mod.recorded_config(m)
    cfg = with_point_counts(manifest_mod.parse_recorded(m, raw, None if per_point else seeds), per_point)
    return dataclasses.replace(cfg, overrides=recorded), {k: m[k] for k in ("tuned_from",) if k in m}


def head_lost(cfg: StudyConfig, name: str, out: Path, address: str | None) -> Callable[[str], None]:
    """What a cluster driver does when the head node is gone (:class:`HeadWatch`): nothing of
    Ray can be trusted to stop cleanly, so it says what is committed and how to finish, records
    why the run stopped (``study status``), clears its lock record, and exits 1 at once."""

    def lost(why: str) -> None:
        planned, done, _ = committed_counts(cfg, out, name)
        counts = {"planned": planned, "done": done, "failed": 0, "pending": planned - done}
        stopped = f"lost the Ray cluster: {why}"
        with contextlib.suppress(Exception):
            record_last_run(out, name, [], stopped)
            with open(Path(out) / name / LOCK_FILE, "r+") as lock:  # ours: not a killed driver
                lock.truncate(0)
        with contextlib.suppress(Exception):
            fix = f"restart the cluster (or its head node), then {resume_command(name, out, address)} (committed runs are kept)"
            console.print("error: " + incomplete_line(name, counts, stopped, fix),
                          soft_wrap=True, highlight=False, markup=False)
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(1)

    return lost


def incomplete_line(name: str, counts: dict[str, int], why: str, fix: str) -> str:
    """The line an incomplete study ends with: ``study NAME: 3/8 runs committed, 1 failed, 4
    pending (why). Fix: ...`` (``counts``: planned, done, failed, pending)."""
    return (f"study {name}: {counts['done']}/{counts['planned']} runs committed, {counts['failed']} failed, "
            f"{counts['pending']} pending ({why}). Fix: {fix}")


def resume_command(name: str, out: Path, address: str | None) -> str:
    cmd = f"study resume {name} --out {out}"
    return cmd + (f" --address {address}" if address else "")


def run_study(
    cfg: StudyConfig,
    name: str,
    out: Path,
    address: str | None = None,
    num_cpus: int | None = None,
    kind: str = "seeds",
    extra_manifest: dict[str, Any] | None = None,
    failed_seeds: Literal["skip", "retry"] | None = None,
) -> dict[str, int]:
    """Run (or resume) a seed/grid study; returns counts ``planned``, ``done`` (committed),
    ``ran``, ``failed``, ``pending``, ``recorded_failed`` (committed runs recorded as failed),
    all read from Parquet after the run. ``failed_seeds``: first
    record the seeds the last run left failed as failed runs (``skip``), or remove those
    records so the seeds run again (``retry``): :mod:`study.failed_runs`.

    Raises :class:`StudyIncomplete` (exit 1, or 128 + the signal after SIGINT / SIGTERM)
    unless every planned run is committed."""
    out = Path(out)
    facts = check_before_ray(cfg, address, num_cpus)
    # before the lock touches the folder of a study of another kind (prepare checks again under it)
    manifest_mod.check_kind(manifest_mod.read(out, name), out, name, kind)
    with study_lock(out, name), manifest_mod.forgotten_if_refused(out, name):
        return _run_locked(cfg, name, out, address, num_cpus, kind, extra_manifest, facts, failed_seeds)


def _run_locked(
    cfg: StudyConfig,
    name: str,
    out: Path,
    address: str | None,
    num_cpus: int | None,
    kind: str,
    extra_manifest: dict[str, Any] | None,
    facts: dict[str, Any],
    failed_seeds: Literal["skip", "retry"] | None = None,
) -> dict[str, int]:
    """:func:`run_study` once its inputs are checked and this driver holds the study's lock."""
    manifest = manifest_mod.prepare(out, name, cfg, kind, facts, extra_manifest)
    from study.config import with_point_counts

    # a point that already plans more seeds keeps them (prepare's note says so): they run too,
    # as `study resume` would run them (before: planned at the smaller count, the study said
    # "all runs committed" and exited 0 with seeds pending)
    cfg = with_point_counts(cfg, {p["trial_id"]: int(p["seeds"]) for p in manifest["points"]})
    meta = {"git_sha": manifest_mod.git_sha(), "versions": manifest_mod.run_versions(manifest)}
    device = resolve_device(cfg)
    from study.check import quarantine_damaged

    moved = quarantine_damaged(out, name)  # damaged committed seeds run again
    if moved.runs:
        console.print(f"study {name}: {len(moved.runs)} damaged run(s) moved to {moved.folder}; they run again "
                      f"(study check {name} --out {out} verifies every file)", soft_wrap=True, highlight=False)
    if failed_seeds is not None:
        settle_failed(cfg, out, name, failed_seeds)
    units, planned, already = plan_units(cfg, out, name, device, 1)
    request = StopRequest(out, name)  # a request left from an earlier run is not for this one
    if not units:
        console.print(f"[green]study {name}: all {planned} runs already committed[/green]")
        planned, already, recorded = committed_counts(cfg, out, name)
        return {"planned": planned, "done": already, "ran": 0, "failed": 0, "recorded_failed": recorded}
    failed_units: list[FailedUnit] = []
    stops: StopSignals | None = None
    oom: WorkerOutOfMemory | None = None
    try:
        with ray_session(address, num_cpus, worker_env(cfg), on_lost=head_lost(cfg, name, out, address)) as resources:
            stops = SIGNALS
            if address:
                warn_cluster_resources(cfg)
            units, planned, already = plan_units(cfg, out, name, device, resources.get("CPU", 1))
            payloads = [unit_payload(u, cfg, out, name, device, meta) for u in units]
            console.print(
                f"study {name}: {f'connected to Ray at {address}' if address else 'Ray started'} "
                f"({resources.get('CPU', 0):g} CPUs, "
                f"{resources.get('GPU', 0):g} GPUs); {planned} runs planned, {already} already "
                f"committed; {planned - already} to run in {len(payloads)} bundle(s) (Ray trials)",
                soft_wrap=True, highlight=False,
            )
            if note := unused_gpu_note(cfg, resources):
                console.print(f"study {name}: {note}", soft_wrap=True, highlight=False)
            # A local Ray has no autoscaler that pending trials would grow: one trial per slot.
            slots = None if address else concurrent_trials(resources, cfg)
            failed_units = launch(payloads, cfg, out, name, already, planned, slots, request)
    except KeyboardInterrupt:
        if stops is None or stops.received is None:
            stops = StopSignals()
            stops.received = signal.SIGINT
    except WorkerOutOfMemory as killed:
        oom = killed
    finally:
        request.clear()
    planned, done, recorded = committed_counts(cfg, out, name)
    have = committed(out, name) if failed_units else set()
    lost = [
        {"trial_id": f.payload["trial_id"], "point": f.payload["point_json"], "error": f.error, "refused": f.refused,
         "seeds": [s["index"] for s in f.payload["seeds"] if (f.payload["trial_id"], s["index"]) not in have]}
        for f in failed_units
    ]
    failed = sum(len(u["seeds"]) for u in lost)
    pending = planned - done - failed
    counts = {"planned": planned, "done": done, "ran": done - already, "failed": failed, "pending": pending,
              "recorded_failed": recorded}
    interrupted = stops is not None and stops.received is not None
    refused = bool(failed_units) and all(f.refused for f in failed_units)
    drained = request.seen and not interrupted and oom is None and done < planned
    stopped = f"interrupted by {stops.received.name}" if interrupted and stops and stops.received else (
        str(oom) if oom is not None else request.why() if drained else None
    )
    record_last_run(out, name, [u for u in lost if u["seeds"]], stopped)
    if done < planned or interrupted:
        resume = resume_command(name, out, address)
        why, fix, kept = stopped, resume, " (committed runs are kept)"
        if oom is not None and not interrupted:
            fix = f"{MEMORY_FIX}, then {resume}"
        elif refused and not interrupted:  # resuming reruns the refused config
            why = f"{len(failed_units)} trial(s) refused by their workers (errors above)"
            fix = REFUSED_FIX.format(again=f"study run CONFIG --name NEW --out {out}", folder=out / name)
            kept = ""
        elif failed_units:
            why = why or f"{len(failed_units)} trial(s) failed (errors above)"
            fix = f"fix the cause shown above, then {resume}; or record the failing seeds as failed runs: {resume} --skip-failed"
        code = stops.exit_code if interrupted and stops else DRAINED_EXIT if drained and not failed_units else 1
        raise StudyIncomplete(incomplete_line(name, counts, why or "incomplete", f"{fix}{kept}"), code)
    return counts


def settle_failed(cfg: StudyConfig, out: Path, name: str, how: Literal["skip", "retry"]) -> None:
    """``study resume --skip-failed`` / ``--retry-failed`` (:mod:`study.failed_runs`), with one
    line saying which seeds."""
    from analysis.manifest import point_label
    from study.failed_runs import record_failed, retry_failed
    from study.status import seeds_text

    labels = {p.trial_id: point_label(dict(p.values)) for p in cfg.points}  # as `study status` names them
    if how == "skip":
        done = record_failed(cfg, out, name)
        said = (f"{sum(map(len, done.values()))} seed(s) the last run left failed recorded as failed runs, not "
                f"run again ({seeds_text(done, labels)}); `study resume {name} --out {out} --retry-failed` runs "
                "them again" if done else f"no failed seeds to record (`study status {name} --out {out}` lists them)")
    else:
        done = retry_failed(out, name)
        said = (f"{sum(map(len, done.values()))} seed(s) recorded as failed run again ({seeds_text(done, labels)})"
                if done else "no seeds recorded as failed to run again")
    console.print(f"study {name}: {said}", soft_wrap=True, highlight=False)


def concurrent_trials(resources: dict[str, float], cfg: StudyConfig) -> int:
    """How many trials ``resources`` (Ray's) run at once: CPUs, and GPUs where trials ask for them."""
    ex = cfg.execution
    slots = int(resources.get("CPU", 0) // ex.cpus_per_trial)
    if ex.gpus_per_trial > 0:
        slots = min(slots, int(resources.get("GPU", 0) // ex.gpus_per_trial))
    return max(1, slots)


def launch(
    payloads: list[dict[str, Any]],
    cfg: StudyConfig,
    out: Path,
    name: str,
    already: int,
    planned: int,
    slots: int | None = None,
    requested: Callable[[], bool] = lambda: False,
) -> list[FailedUnit]:
    """Run the units as Ray Tune trials with reused actors; returns those that failed after
    their retries or were refused, with why (what is committed is read from Parquet, not
    from Tune).

    ``slots``: how many trials run at once (a local Ray's CPUs per trial); then Tune holds
    only that many trials at a time and starts the newest pending one first
    (:func:`study.steer.draining_scheduler`).
    Otherwise a unit shorter than an actor's start (importing Ray, torch and the plugins:
    4-5 core-s) makes Tune start actors it never uses: a finished trial's actor is reused
    by the oldest pending trial, which is the one waiting for a starting actor; that actor
    is then stopped once started and the next trial's actor starts in its place. 100 tiny
    units took 5 actor starts on 2 CPUs, and one actor ran nearly all of them, one at a
    time (``benchmarks/load_500.py``, docs/performance.md). A cluster (``--address``) keeps Tune's defaults: its
    pending trials are what make an autoscaler add nodes.

    A unit checkpoints after each result but its last (``should_checkpoint`` in its result;
    Tune's default for a class trainable also checkpoints the last): a finished unit has
    committed, so a retry has nothing to resume. A unit of one step then never checkpoints,
    nor makes Tune save the whole experiment state (Tune forces that save after every
    ``num_to_keep`` checkpoints of a trial, and it grows with the number of trials).

    ``requested``: whether ``study stop`` asked to drain (:class:`study.steer.StopRequest`):
    then no pending trial starts."""
    from ray import tune

    from study.progress import ProgressCallback, progress_bar
    from study.steer import draining_scheduler, quiet_trial_progress
    from trainables.trainable import FinelineTrainable

    ex = cfg.execution
    storage = (out / name / "ray").resolve()
    trainable = tune.with_resources(
        tune.with_parameters(FinelineTrainable, payloads=payloads),
        {"cpu": ex.cpus_per_trial, "gpu": ex.gpus_per_trial},
    )
    sizes = [len(p["seeds"]) for p in payloads]
    points = [_point_label(p["point_json"]) for p in payloads]
    title = f"study {name}"
    errors = TrialErrors()
    if console.is_terminal:
        progress: Progress | None = progress_bar(console)
        callback = ProgressCallback(
            f"{title}: seeds", planned, already, sizes, points, progress=progress, trial_errors=errors.errors,
            retries=ex.max_failures,
        )
    else:  # a log: lines, not a bar
        progress = None
        callback = ProgressCallback(
            title, planned, already, sizes, points, every_s=ex.progress_every_s,
            emit=lambda line: console.print(line, soft_wrap=True, highlight=False, markup=False),
            trial_errors=errors.errors, retries=ex.max_failures,
        )

    tuner = tune.Tuner(
        trainable,
        param_space={"unit_index": tune.sample_from(unit_counter())},
        tune_config=tune.TuneConfig(
            reuse_actors=True,
            num_samples=len(payloads),
            max_concurrent_trials=slots,
            scheduler=draining_scheduler(requested, newest=bool(slots)),
        ),
        run_config=tune.RunConfig(
            name=f"run-{int(time.time())}",
            storage_path=str(storage),
            verbose=0,
            callbacks=[callback, quiet_trial_progress()],
            failure_config=tune.FailureConfig(max_failures=ex.max_failures),
            checkpoint_config=tune.CheckpointConfig(
                checkpoint_frequency=0, checkpoint_at_end=False, num_to_keep=1
            ),
        ),
    )
    fit(tuner, progress, callback.finish, errors)
    # A trial that failed before its first result has no config in Tune's results: the
    # callback saw every failure, with its grid point.
    failed = [
        FailedUnit(payloads[i], callback.failures.get(i, ""), i in callback.refused)
        for i in sorted(set(callback.failed_units))
    ]
    for text, indices in failures_by_cause(callback.failures).items():
        console.print(f"[red]{escape(failed_units_text(indices, points))}:[/red] {escape(text)}", soft_wrap=True,
                      highlight=False)  # escaped: an error's own [brackets] are not markup
    if not failed and (SIGNALS is None or SIGNALS.received is None):
        shutil.rmtree(storage, ignore_errors=True)
    return failed


def _experiment_state_sync(record: logging.LogRecord) -> bool:
    """A logging filter: drops Tune's "Saving experiment state to storage ... failed" error.

    Tune copies its experiment state (its driver's files) into the study's ``ray`` folder now
    and then; the copy races with its own atomic writes of the searcher's state (seen:
    ``FileNotFoundError`` on a ``.tmp-searcher-state`` file that was renamed meanwhile) and
    printed a 20-line traceback mid-study. fineline never restores a Tune experiment (a
    study resumes from its Parquet files and, when tuning, its Optuna storage), so that
    state is not needed; every other record passes."""
    return not record.getMessage().startswith("Saving experiment state to storage")


def unit_counter() -> Callable[[Any], int]:
    """The trials' ``unit_index`` as a ``tune.sample_from`` function: 0, 1, ... in the order
    Tune makes its ``num_samples`` trials. ``tune.grid_search(range(n))`` gave the same
    indices, but Tune's variant generator deep-copies the whole grid for each trial it makes:
    quadratic, 5 s of the driver before 5,000 units could start (20 s for 10,000). The
    count lives in a closure: Tune deep-copies the spec per trial, and a function is copied
    by reference (a counter object would be copied, restarting at 0 in every trial)."""
    made = [0]

    def next_index(_spec: Any) -> int:
        made[0] += 1
        return made[0] - 1

    return next_index


def _point_label(point_json: str) -> str:
    """``model.cell=lstm, train.lr=0.01`` for a grid point ("" without a grid)."""
    return ", ".join(f"{k}={v}" for k, v in json.loads(point_json).items())


def fit(
    tuner: Any,
    progress: Progress | None = None,
    finish: Callable[[], None] | None = None,
    errors: TrialErrors | None = None,
) -> Any:
    """``tuner.fit()`` with fineline's signal handling armed (SIGINT / SIGTERM stop it
    gracefully), Tune's own "trials did not complete" log line silenced (fineline reports
    committed counts itself), each failed trial's exception kept in ``errors`` (the tracebacks
    of those fineline prints as one line dropped: :class:`~study.failures.TrialErrors`) and a
    worker killed for memory as :class:`~trainables.errors.WorkerOutOfMemory`. ``finish``
    runs before the bar's last frame (it clears what was running: a stopped study leaves no
    bundle shown as running)."""
    tune_log = logging.getLogger("ray.tune.tune")
    level = tune_log.level
    tune_log.setLevel(logging.CRITICAL)
    controller_log = logging.getLogger("ray.tune.execution.tune_controller")
    errors = errors if errors is not None else TrialErrors()
    controller_log.addFilter(errors)
    state_log = logging.getLogger("ray.tune.execution.experiment_state")
    state_log.addFilter(_experiment_state_sync)
    if SIGNALS is not None:
        SIGNALS.tune_running = True
    try:
        if progress is None:
            return fit_reporting_memory(tuner)
        with progress:
            try:
                return fit_reporting_memory(tuner)
            finally:
                if finish is not None:
                    finish()
    finally:
        if SIGNALS is not None:
            SIGNALS.tune_running = False
        tune_log.setLevel(level)
        controller_log.removeFilter(errors)
        state_log.removeFilter(_experiment_state_sync)
