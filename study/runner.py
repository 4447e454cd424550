"""Launching a study's units on Ray Tune, locally or on a cluster, with progress."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from study import manifest as manifest_mod
from study.config import StudyConfig
from study.plan import default_cpus, plan_units, unit_payload
from trainables.errors import ConfigError, FinelineError
from trainables.plugins import shippable

console = Console(stderr=True)


class StudyFailed(FinelineError):
    """Some units failed after their retries."""


@contextmanager
def ray_session(
    address: str | None, num_cpus: int | None, runtime_env: dict[str, Any] | None = None
) -> Iterator[dict[str, float]]:
    """A Ray connection: a fresh local Ray (no dashboard, no usage stats) or ``address``.

    ``runtime_env`` is the job's (:func:`worker_env`: the plugin modules every worker needs).

    Authentication is decided once, here and in ``cluster.yaml``: every Ray process of a
    fineline cluster runs with token authentication (``RAY_AUTH_MODE=token``). Ray 2.60
    enables it by default for a new local Ray, but a driver connecting to an explicit
    ``address`` stays ``disabled`` unless told, and is then refused (``InvalidAuthToken``).
    So the driver sets ``RAY_AUTH_MODE=token`` unless the user chose a mode explicitly
    (``RAY_AUTH_MODE=disabled`` for a cluster deliberately run without tokens); the token
    itself comes from ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``
    and must be the cluster's. Ray caches the mode per process, so it is re-read if needed.
    """
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    import logging

    import ray
    from ray._raylet import (  # type: ignore[attr-defined]  # compiled; not in its stub
        AuthenticationMode,
        Config,
        get_authentication_mode,
    )
    from ray.exceptions import AuthenticationError

    from trainables.errors import ConfigError

    token = os.environ["RAY_AUTH_MODE"].lower() == "token"
    if token != (get_authentication_mode() == AuthenticationMode.TOKEN):
        # Ray read the mode before it was set here: re-read it (as ray.init itself does)
        Config.initialize("")

    if address:
        token_fix = (
            "give this driver the cluster's token: copy the head node's ~/.ray/auth_token here, "
            "or set RAY_AUTH_TOKEN_PATH (or RAY_AUTH_TOKEN); every node and driver must use "
            "RAY_AUTH_MODE=token (see docs/cluster.md)"
        )
        try:
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=True,
                     runtime_env=runtime_env)
        except AuthenticationError as exc:  # token mode, but no token on this machine
            raise ConfigError(
                "--address",
                f"no Ray auth token for the cluster at {address} ({exc.message})",
                token_fix,
            ) from None
        except ConnectionError as exc:
            if "InvalidAuthToken" in f"{exc} {exc.__cause__}":
                raise ConfigError(
                    "--address",
                    f"the cluster at {address} refused this driver's auth token",
                    token_fix,
                ) from None
            raise ConfigError(
                "--address",
                f"no Ray cluster answers at {address}",
                "start it (`ray up cluster.yaml` or `ray start --head`) and check "
                "`ray status --address ADDRESS`; or omit --address for a local Ray",
            ) from None
    else:
        ray.init(
            num_cpus=num_cpus or default_cpus(),
            include_dashboard=False,
            logging_level=logging.ERROR,
            log_to_driver=True,
            runtime_env=runtime_env,
        )
    try:
        yield ray.cluster_resources()
    finally:
        ray.shutdown()


def worker_env(cfg: StudyConfig) -> dict[str, Any] | None:
    """The job's Ray ``runtime_env``: the study's ``plugins:`` modules that are not installed,
    shipped to every worker as ``py_modules`` (None: nothing to ship, or shipping is off)."""
    if not cfg.plugins or not cfg.execution.ship_plugins:
        return None
    modules = shippable([sys.modules[name] for name in cfg.plugins])
    if not modules:
        return None
    console.print(
        "plugins shipped to the Ray workers: "
        + ", ".join(f"{m.__name__} ({m.__file__})" for m in modules),
        soft_wrap=True,
    )
    return {"py_modules": modules}


def resolve_device(cfg: StudyConfig) -> str:
    dev = cfg.execution.device
    if dev == "auto":
        return "cuda" if cfg.execution.gpus_per_trial > 0 else "cpu"
    return dev


def check_before_ray(cfg: StudyConfig) -> dict[str, Any]:
    """Everything that can fail on bad input, before Ray starts.

    Returns the task facts the manifest records: ``analysis`` (what the task wants
    analysed and drawn) and ``splits`` (name and role of each split, in order).
    """
    tasks = [point.spec.make_task() for point in cfg.points]
    for point, task in zip(cfg.points, tasks, strict=True):
        task.check()
        point.spec.check_splits(task.split_roles())
    if cfg.execution.device == "cuda" and cfg.execution.gpus_per_trial <= 0:
        raise ConfigError("execution.gpus_per_trial", "device is cuda but no GPU is requested per trial",
                          "set execution.gpus_per_trial (e.g. 1) so Ray schedules trials on GPUs")
    roles = tasks[0].split_roles()
    return {"analysis": tasks[-1].analysis(), "splits": [{"name": n, "role": r} for n, r in roles.items()]}


def run_study(
    cfg: StudyConfig,
    name: str,
    out: Path,
    address: str | None = None,
    num_cpus: int | None = None,
    kind: str = "seeds",
    extra_manifest: dict[str, Any] | None = None,
) -> dict[str, int]:
    """Run (or resume) a seed/grid study; returns counts. Raises StudyFailed on failures."""
    out = Path(out)
    facts = check_before_ray(cfg)
    manifest_mod.prepare(out, name, cfg, kind, facts, extra_manifest)
    meta = {"git_sha": manifest_mod.git_sha(), "versions": manifest_mod.versions()}
    device = resolve_device(cfg)
    units, planned, already = plan_units(cfg, out, name, device, 1)
    if not units:
        console.print(f"[green]study {name}: all {planned} runs already committed[/green]")
        return {"planned": planned, "done": already, "ran": 0, "failed": 0}
    with ray_session(address, num_cpus, worker_env(cfg)) as resources:
        units, planned, already = plan_units(cfg, out, name, device, resources.get("CPU", 1))
        payloads = [unit_payload(u, cfg, out, name, device, meta) for u in units]
        failed = launch(payloads, cfg, out, name, already, planned)
    if failed:
        raise StudyFailed(
            f"study {name}: {failed} unit(s) failed after retries; their seeds are not committed. "
            f"See the errors above, fix the cause, then re-run (committed seeds are kept)."
        )
    return {"planned": planned, "done": planned, "ran": planned - already, "failed": 0}


def launch(payloads: list[dict[str, Any]], cfg: StudyConfig, out: Path, name: str, already: int, planned: int) -> int:
    """Run the units as Ray Tune trials with reused actors; returns how many failed."""
    from ray import tune

    from study.progress import ProgressCallback
    from trainables.trainable import FinelineTrainable

    ex = cfg.execution
    storage = (out / name / "ray").resolve()
    trainable = tune.with_resources(
        tune.with_parameters(FinelineTrainable, payloads=payloads),
        {"cpu": ex.cpus_per_trial, "gpu": ex.gpus_per_trial},
    )
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console,
    )

    tuner = tune.Tuner(
        trainable,
        param_space={"unit_index": tune.grid_search(list(range(len(payloads))))},
        tune_config=tune.TuneConfig(reuse_actors=True, num_samples=1),
        run_config=tune.RunConfig(
            name=f"run-{int(time.time())}",
            storage_path=str(storage),
            verbose=0,
            callbacks=[ProgressCallback(progress, f"study {name}: seeds", planned, already,
                                        [len(p["seeds"]) for p in payloads])],
            failure_config=tune.FailureConfig(max_failures=ex.max_failures),
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1, num_to_keep=1),
        ),
    )
    with progress:
        results = tuner.fit()
    failed = results.num_errors
    for error in results.errors:
        console.print(f"[red]unit failed:[/red] {type(error).__name__}: {str(error)[-2000:]}")
    if not failed:
        shutil.rmtree(storage, ignore_errors=True)
    return failed
