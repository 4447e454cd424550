"""Checks a study makes before Ray starts: the ``--address`` it is given (form, auth token,
a TCP answer within seconds) and resources a local Ray could never give; plus the
environment fineline's Ray driver runs with."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from study.config import StudyConfig
from study.plan import default_cpus
from trainables.errors import ConfigError

console = Console(stderr=True)

PROBE_TIMEOUT_S = 5.0
"""How long ``--address`` may take to accept a TCP connection before it is called dead."""
ADDRESS_RE = re.compile(r"^(?:ray://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*):(?P<port>[0-9]{1,5})$")


def ray_env() -> None:
    """The environment fineline's Ray driver runs with (set before Ray's first import)."""
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # fineline handles SIGINT / SIGTERM itself (StopSignals): Tune's handler would swallow them
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"


@contextlib.contextmanager
def held_stderr() -> Iterator[None]:
    """Hold back what is written to stderr inside the block, Ray's C++ core included (it
    writes to file descriptor 2, past ``sys.stderr``), and print it afterwards, unless a
    :class:`ConfigError` leaves the block: a driver refused by a cluster's auth token gets
    about 20 lines of ``gcs_client.cc: Failed to get cluster ID`` retries before Ray raises,
    and fineline's one error says it all."""
    sys.stderr.flush()
    saved = os.dup(2)
    refused = False
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        except ConfigError:
            refused = True
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read()
            if text and not refused:
                os.write(2, text)


LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch (``ray._private.ray_constants.ENABLE_RAY_CLUSTER``) that makes a node take
127.0.0.1 as its address, so the GCS, raylet, object manager and workers listen on loopback
only. Ray 2.60 has no other supported way: ``ray.init(_node_ip_address="127.0.0.1")`` is
rewritten to the machine's address. The same switch makes ``ray start`` refuse to run, so it
suits a local Ray only; a cluster's exposure is ``cluster.yaml``'s (docs/cluster.md)."""


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """A local Ray started inside this block listens on 127.0.0.1 only.

    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1`` set by the user keeps Ray's default (every
    interface). Ray reads the switch when its constants are first imported, so the constant is
    set too where Ray is already imported, and both are put back afterwards (a later
    ``--address`` run in this process must see its real address)."""
    before = os.environ.get(LOOPBACK_ENV)
    if before is not None and before.strip().lower() in ("1", "true"):
        yield
        return
    os.environ[LOOPBACK_ENV] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    old = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(LOOPBACK_ENV, None)
        else:
            os.environ[LOOPBACK_ENV] = before
        if constants is not None:
            constants.ENABLE_RAY_CLUSTER = old  # type: ignore[attr-defined]


@dataclass
class RayProcesses:
    """The processes a local Ray started as this driver's children (GCS, raylet, monitors):
    filled in by :func:`shielded_from_sigterm`, stopped by :func:`shutdown_local_ray`."""

    pids: set[int] = field(default_factory=set)


@contextlib.contextmanager
def shielded_from_sigterm() -> Iterator[RayProcesses]:
    """SIGTERM and SIGHUP blocked while a local Ray starts inside this block, so every Ray
    process it starts (GCS, raylet, agents, and the workers the raylet forks later) inherits
    them blocked, as Ray itself blocks SIGINT in them; this thread's mask is put back
    afterwards. Yields the children started in the block (filled in at its end). (A closed
    terminal sends SIGHUP to the whole foreground process group, as `timeout` does SIGTERM.)

    ``timeout``, Slurm and systemd stop a job by sending SIGTERM to its whole process group
    (or every process of the job), not to the driver alone. Unshielded, the GCS dies at once:
    the driver's graceful stop then waits 60 s for it and exits 1 with Ray's C++ error and no
    counts. Shielded, only the driver acts on the signal (:class:`~study.runner.StopSignals`)
    and stops the study as after Ctrl-C. Stop that Ray with :func:`shutdown_local_ray`."""
    import psutil

    me = psutil.Process()
    before = {p.pid for p in me.children()}
    started = RayProcesses()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP})
    try:
        yield started
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        started.pids = {p.pid for p in me.children()} - before


def shutdown_local_ray(started: RayProcesses) -> None:
    """``ray.shutdown()`` for a Ray started in :func:`shielded_from_sigterm`, then SIGKILL to
    whatever of it is left. Its processes block SIGTERM, so Ray's own stop (SIGTERM, a 1 s
    wait per process, then SIGKILL) would add about 4 s to every study, and the raylet, killed
    instead of stopped, would leave its agents running: so Ray is told to kill at once (its
    private ``Node.kill_all_processes``, Ray 2.50-2.60; where that is gone, Ray's own slower
    stop runs), and the processes it started, with everything below them, are killed after
    it (psutil checks each is still the same process)."""
    import psutil
    import ray

    family: list[psutil.Process] = []
    for pid in started.pids:
        with contextlib.suppress(psutil.Error):
            top = psutil.Process(pid)
            family += [top, *top.children(recursive=True)]
    node = getattr(ray._private.worker, "_global_node", None)
    kill = getattr(node, "kill_all_processes", None)
    if callable(kill):
        node.kill_all_processes = lambda **kw: kill(**{**kw, "allow_graceful": False})  # type: ignore[union-attr]
    ray.shutdown()
    for p in family:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(family, timeout=5)


def private_token() -> Path | None:
    """Make the Ray auth token file a local Ray will use readable by its owner only.

    Ray 2.60 writes a missing ``~/.ray/auth_token`` with the process umask (typically
    world-readable). Where token auth is on and no ``RAY_AUTH_TOKEN`` is given, the file
    (``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``) is created here first with mode 0600,
    holding a token made as Ray makes them (``secrets.token_hex(32)``), or an existing one's
    group / other permissions are removed. Returns the file's path (``None`` when not used).

    Two drivers may start at once (two studies, or tests run in parallel): the token is
    written whole to a private temporary file and then hard-linked into place, so the file
    never exists half-written and the first link wins; the loser uses the winner's token."""
    if os.environ.get("RAY_AUTH_MODE", "token").lower() != "token" or os.environ.get("RAY_AUTH_TOKEN"):
        return None
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if path.exists():
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
        return path
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        with contextlib.suppress(FileExistsError):  # another driver's token came first
            os.link(tmp, path)
    finally:
        os.unlink(tmp)
    return path


TOKEN_FIX = (
    "give this driver the cluster's token: copy the head node's ~/.ray/auth_token here, "
    "or set RAY_AUTH_TOKEN_PATH (or RAY_AUTH_TOKEN); every node and driver must use "
    "RAY_AUTH_MODE=token (see docs/cluster.md)"
)
DEAD_FIX = (
    "start it (`ray up cluster.yaml` or `ray start --head`) and check "
    "`ray status --address ADDRESS`; or omit --address for a local Ray"
)


def check_address(address: str) -> str:
    """``--address`` checked without starting Ray: its form, this driver's auth token, and a
    TCP connection to it (within seconds, where Ray itself retries for minutes). Returns the
    ``host:port`` (or ``ray://host:port``) it names."""
    if address == "auto":
        ray_env()
        from ray._private.services import canonicalize_bootstrap_address

        try:
            found = canonicalize_bootstrap_address("auto")
        except Exception:
            found = None
        if not found:
            raise ConfigError("--address", "auto: no running Ray cluster found on this machine", DEAD_FIX)
        address = found
    match = ADDRESS_RE.match(address)
    if not match or not 0 < int(match["port"]) < 65536:
        raise ConfigError(
            "--address",
            f"{address[:80]!r} is not a Ray address",
            "give HOST:PORT of the head node's GCS (e.g. 10.0.0.1:6379), ray://HOST:PORT, or auto",
        )
    _check_token(address)
    host, port = match["host"].strip("[]"), int(match["port"])
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            pass
    except OSError as exc:
        why = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__)
        raise ConfigError("--address", f"no Ray cluster answers at {address} ({why})", DEAD_FIX) from None
    if not speaks_grpc(f"{match['host']}:{port}"):
        raise ConfigError(
            "--address",
            f"something accepts connections at {address} but does not answer as a Ray cluster (no "
            f"gRPC reply within {PROBE_TIMEOUT_S:g} s; Ray itself would retry it for ever)",
            "check the port: give the head node's GCS port (6379 unless `ray start --head --port` "
            "set another; `ray status --address ADDRESS` shows it), or omit --address for a local Ray",
        )
    if not address.startswith("ray://") and not serves_gcs(f"{match['host']}:{port}"):
        raise ConfigError(
            "--address",
            f"{address} speaks gRPC but is not a Ray head node's GCS (a Ray Client port, 10001 by "
            "default, or a raylet's port?); Ray would try it for 20 s or more, then say no cluster answers",
            "give the head node's GCS port (6379 unless `ray start --head --port` set another; "
            "`ray status --address ADDRESS` checks it), or ray://HOST:10001 for a Ray Client port",
        )
    return address


GCS_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"
"""A method every Ray GCS serves (Ray 2.x), asked for by name: no Ray import, no token."""


def serves_gcs(target: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """False if the gRPC server at ``host:port`` does not have the GCS's methods (it answers
    UNIMPLEMENTED, as a Ray Client server, a raylet or any other gRPC server does); True
    otherwise, a refusal of the missing token included (a GCS in token mode answers
    UNAUTHENTICATED): ``ray.init`` then says what is wrong."""
    import grpc

    channel = grpc.insecure_channel(target)
    try:
        channel.unary_unary(GCS_METHOD)(b"", timeout=timeout)
    except grpc.RpcError as exc:
        return exc.code() != grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]
    finally:
        channel.close()
    return True


def speaks_grpc(target: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """True if ``host:port`` completes a gRPC (HTTP/2) handshake within ``timeout`` seconds,
    as a Ray GCS or Ray client server does; an HTTP/1 server or another protocol never does.
    No call is made, so no auth token is needed."""
    import grpc  # Ray's own dependency

    channel = grpc.insecure_channel(target)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()


def sync_auth_mode() -> None:
    """Make Ray's cached authentication mode the one ``RAY_AUTH_MODE`` names (Ray reads it
    once per process, possibly before fineline set it): re-read it, as ``ray.init`` does."""
    ray_env()
    from ray._raylet import (  # type: ignore[attr-defined]  # compiled; not in its stub
        AuthenticationMode,
        Config,
        get_authentication_mode,
    )

    token = os.environ["RAY_AUTH_MODE"].lower() == "token"
    if token != (get_authentication_mode() == AuthenticationMode.TOKEN):
        Config.initialize("")


def _check_token(address: str) -> None:
    """Token mode without a token on this machine: refused before any connection."""
    from ray._private.authentication.authentication_token_setup import ensure_token_if_auth_enabled
    from ray.exceptions import AuthenticationError

    sync_auth_mode()
    try:
        ensure_token_if_auth_enabled(create_token_if_missing=False)
    except AuthenticationError as exc:
        raise ConfigError(
            "--address", f"no Ray auth token for the cluster at {address} ({exc.message})", TOKEN_FIX
        ) from None


def local_gpus() -> int:
    """GPUs a local Ray would see (CUDA_VISIBLE_DEVICES respected), without starting Ray."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "NoDevFiles"):
        return 0
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception:
        return 0


def check_resources(cfg: StudyConfig, address: str | None, num_cpus: int | None) -> None:
    """Resources a trial asks for that a local Ray can never give fail now (Ray would wait
    forever); with ``--address`` the address is checked (:func:`check_address`) and the
    cluster's resources are compared once connected (:func:`warn_cluster_resources`)."""
    ex = cfg.execution
    if address is not None:  # an empty --address is refused, not taken for a local Ray
        if num_cpus is not None:
            source = " (from RAY_ADDRESS)" if os.environ.get("RAY_ADDRESS") == address else ""
            raise ConfigError(
                "--num-cpus", f"sets the CPUs of a local Ray, but this study runs on the cluster at {address}{source}",
                "drop --num-cpus (a cluster's nodes bring their own CPUs), or drop --address"
                + (" and unset RAY_ADDRESS" if source else "") + " to run on a local Ray",
            )
        check_address(address)
        return
    machine = os.cpu_count() or 1
    if ex.threads > machine:  # every trial starts that many threads: thousands exhaust the OS's
        raise ConfigError(
            "execution.threads",
            f"each trial asks for {ex.threads} torch threads but this machine has {machine} CPUs",
            f"set it to at most {machine} (1 is fastest for these small models; raise "
            "execution.cpus_per_trial with it)",
        )
    if num_cpus is not None and num_cpus > machine:
        console.print(f"note: --num-cpus {num_cpus} is more than this machine's {machine} CPUs: up to "
                      f"{num_cpus // max(1, int(ex.cpus_per_trial))} trials at once will share them",
                      soft_wrap=True, highlight=False)
    cpus = num_cpus or default_cpus()
    if ex.cpus_per_trial > cpus:
        raise ConfigError(
            "execution.cpus_per_trial",
            f"each trial asks for {ex.cpus_per_trial:g} CPUs but the local Ray has {cpus}",
            f"set it to at most {cpus} (or raise --num-cpus, or run on a cluster with --address)",
        )
    if ex.gpus_per_trial > 0:
        gpus = local_gpus()
        if ex.gpus_per_trial > gpus:
            have = f"only {gpus}" if gpus else "none"
            raise ConfigError(
                "execution.gpus_per_trial",
                f"each trial asks for {ex.gpus_per_trial:g} GPUs but this machine has {have}",
                "set execution.gpus_per_trial: 0 (device: cpu or auto) here, or run on a cluster "
                "with GPUs through --address",
            )


def warn_cluster_resources(cfg: StudyConfig) -> None:
    """On a cluster, warn where no node has what one trial asks for (an autoscaler may still
    add one, so this is not an error)."""
    import ray

    ex = cfg.execution
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    best_cpu = max((r.get("CPU", 0.0) for r in nodes), default=0.0)
    best_gpu = max((r.get("GPU", 0.0) for r in nodes), default=0.0)
    for what, want, have in (("cpus_per_trial", ex.cpus_per_trial, best_cpu), ("gpus_per_trial", ex.gpus_per_trial, best_gpu)):
        if want > have:
            console.print(
                f"[yellow]warning: execution.{what}: each trial asks for {want:g} but the largest node "
                f"of the cluster has {have:g}; trials wait until a node that big joins[/yellow]",
                soft_wrap=True,
            )


HEAD_LOST_S = 30.0
"""Seconds the head node's GCS port may refuse connections before a cluster driver gives up
on it (:class:`HeadWatch`). Ray's own driver waits 60 s, spinning a core, then dies with
one C++ line and no counts; a GCS with fault tolerance is back well within this."""


class HeadWatch:
    """A daemon thread that connects to a cluster's GCS port every few seconds; once it has
    refused (or timed out) for ``lost_after_s``, ``on_lost(why)`` is called from the thread,
    once. Use as a context manager around the driver's work."""

    def __init__(self, address: str, on_lost: Callable[[str], None], *, every_s: float = 2.0,
                 lost_after_s: float = HEAD_LOST_S) -> None:
        match = ADDRESS_RE.match(address)
        self.target = (match["host"].strip("[]"), int(match["port"])) if match else None
        self.address, self.on_lost = address, on_lost
        self.every_s, self.lost_after_s = every_s, lost_after_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="fineline-head-watch", daemon=True)

    def __enter__(self) -> HeadWatch:
        if self.target is not None:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()

    def _answers(self) -> bool:
        assert self.target is not None
        try:
            with socket.create_connection(self.target, timeout=min(self.every_s, 3.0)):
                return True
        except OSError:
            return False

    def _watch(self) -> None:
        down_since: float | None = None
        while not self.stop.wait(self.every_s):
            if self._answers():
                down_since = None
                continue
            now = time.monotonic()
            down_since = down_since if down_since is not None else now
            if now - down_since >= self.lost_after_s and not self.stop.is_set():
                self.on_lost(f"the cluster's head node (GCS at {self.address}) has not answered for "
                             f"{now - down_since:.0f} s")
                return
