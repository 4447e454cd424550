"""A real Ray cluster of several raylets on this machine, for the cluster tests.

A Ray head and worker nodes run as separate ``ray start --block`` processes (1 CPU each,
their own ports and temp dir, token authentication for every process with a token of
their own). Process hygiene: only processes started here are signalled, by pid and only
after checking their start time (no ``ray stop``, which would stop every Ray on the
machine); :meth:`Cluster.stop` returns any of them left alive.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Proc:
    """One process as /proc shows it; (pid, start) identifies it across pid reuse."""

    pid: int
    ppid: int
    pgid: int
    start: int
    state: str
    cmd: str


def processes() -> dict[int, Proc]:
    """Every process on the machine (zombies included, marked by state ``Z``)."""
    found: dict[int, Proc] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            raw = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        rest = stat[stat.rindex(")") + 2 :].split()  # fields 3.. (the name may hold spaces)
        found[int(entry)] = Proc(
            pid=int(entry),
            ppid=int(rest[1]),
            pgid=int(rest[2]),
            start=int(rest[19]),
            state=rest[0],
            cmd=raw.replace(b"\0", b" ").decode(errors="replace").strip(),
        )
    return found


def family(root: int) -> dict[int, Proc]:
    """Live processes in ``root``'s process group or descended from it."""
    procs = processes()
    live = {p.pid: p for p in procs.values() if p.state != "Z"}
    found = {pid: p for pid, p in live.items() if p.pgid == root or pid == root}
    grew = True
    while grew:
        grew = False
        for p in live.values():
            if p.ppid in found and p.pid not in found:
                found[p.pid] = p
                grew = True
    return found


def still_alive(procs: Iterable[Proc]) -> list[Proc]:
    """Those of ``procs`` that still run (same pid *and* start time, not a zombie)."""
    now = processes()
    return [p for p in procs if (q := now.get(p.pid)) and q.start == p.start and q.state != "Z"]


def send(procs: Iterable[Proc], sig: signal.Signals) -> None:
    """Signal exactly these processes, skipping any whose pid now names another process."""
    for p in still_alive(procs):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, sig)


class ProcessEnded(AssertionError):
    """The process waited on exited first."""


def wait_for(
    check: Callable[[], bool],
    what: str,
    timeout: float,
    proc: subprocess.Popen | None = None,
    poll: float = 0.1,
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc is not None and proc.poll() is not None:
            raise ProcessEnded(f"process ended (rc {proc.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_PICK = random.SystemRandom()


def free_port(avoid: set[int] | None = None) -> int:
    """A port free now, below the ephemeral range: the OS gives ports of that range to every
    outgoing connection (Ray's processes make many), so one picked there by binding port 0
    can be taken again before the node that is told to use it binds it.

    Nothing holds the port, so two calls can return the same one: a caller that needs several
    at once passes the ones it already has as ``avoid`` (this function adds its pick to it)."""
    avoid = set() if avoid is None else avoid
    high = min(_ephemeral_low(), 32768) - 1
    for _ in range(200):
        port = _PICK.randint(20000, high)
        if port in avoid:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            avoid.add(port)
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    avoid.add(port)
    return port


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# --------------------------------------------------------------------------- the cluster


class RayNode:
    """One ``ray start --block`` process (a Ray node) and everything it spawned."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        with log.open("w") as fh:
            self.proc = subprocess.Popen(
                args, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.seen: dict[int, Proc] = {}
        self.node_id = ""

    def procs(self) -> dict[int, Proc]:
        """This node's live processes (remembered, so a later check finds leftovers)."""
        now = family(self.proc.pid)
        self.seen.update(now)
        return now

    def wait_started(self, timeout: float = 120) -> None:
        wait_for(
            lambda: "Ray runtime started" in self.log.read_text(),
            f"{self.name} to start",
            timeout,
            self.proc,
        )
        raylets = [
            p for p in self.procs().values() if "/raylet " in p.cmd and "--node_id=" in p.cmd
        ]
        assert len(raylets) == 1, f"{self.name}: expected one raylet, found {len(raylets)}"
        match = re.search(r"--node_id=([0-9a-f]+)", raylets[0].cmd)
        assert match, raylets[0].cmd
        self.node_id = match.group(1)

    def actors(self) -> list[Proc]:
        """The trial (Tune trainable actor) processes on this node."""
        return [p for p in self.procs().values() if re.match(r"ray::\w*Trainable\b", p.cmd)]

    def kill(self) -> None:
        """Remove the node abruptly: SIGKILL every process of it (a preempted machine)."""
        procs = self.procs()
        send(procs.values(), signal.SIGKILL)
        wait_for(lambda: not still_alive(procs.values()), f"{self.name} to die", 30)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop gracefully (SIGTERM to ``ray start``), then SIGKILL what is left."""
        self.procs()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while still_alive(self.seen.values()) and time.monotonic() < deadline:
            self.procs()
            time.sleep(0.2)
        send(self.seen.values(), signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(timeout=10)

    def alive(self) -> bool:
        return self.proc.poll() is None


class Cluster:
    """A Ray head plus worker nodes, all on this machine, with token authentication."""

    def __init__(self) -> None:
        # A short folder: Ray's unix socket paths must stay under ~107 characters.
        self.root = Path(tempfile.mkdtemp(prefix="flc-", dir="/tmp"))
        self.token = self.root / "auth_token"
        self.token.write_text(secrets.token_hex(32))
        self.port = 0  # the head's GCS port, drawn with its other ports at each try
        self.client_port = 0
        self.node_env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("RAY_")},
            "RAY_AUTH_MODE": "token",  # every node agrees (as cluster.yaml does)
            "RAY_AUTH_TOKEN_PATH": str(self.token),
            "RAY_USAGE_STATS_ENABLED": "0",
            # the GCS declares a silent node dead after ~3 s instead of ~30 s
            "RAY_health_check_period_ms": "1000",
            "RAY_health_check_timeout_ms": "1000",
            "RAY_health_check_failure_threshold": "3",
        }
        self.head = self._node("head", self._head_args)
        self.workers: list[RayNode] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _head_args(self, taken: set[int]) -> list[str]:
        self.port = free_port(taken)
        head = f"--head --port {self.port} --temp-dir {self.root / 'ray'} --include-dashboard false"
        # the client server's default 10001 would clash with any other Ray head on this machine
        self.client_port = free_port(taken)  # the head's Ray Client server (ray://)
        return [*head.split(), "--dashboard-port", str(free_port(taken)),
                "--ray-client-server-port", str(self.client_port)]

    def _node(self, name: str, extra: Callable[[set[int]], list[str]]) -> RayNode:
        """Start one node; ``extra`` gives its own arguments from the set of ports taken so far
        at this try (every port of one try is distinct: a repeat makes Ray refuse to start)."""
        ports = ["--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
                 "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port"]  # fmt: skip
        # worker ports 0: each worker process takes a free port
        start = "start --block --num-cpus 1 --node-ip-address 127.0.0.1 --disable-usage-stats"
        start += " --min-worker-port 0 --max-worker-port 0"
        failed = ""
        for attempt in range(3):  # a port taken between picking it and the node binding it
            taken: set[int] = {self.port} if self.port else set()
            args = [sys.executable, "-m", "ray.scripts.scripts", *start.split(), *extra(taken)]
            for flag in ports:  # fixed defaults (e.g. the agent's 52365) would clash between nodes
                args += [flag, str(free_port(taken))]
            log = self.root / f"{name}-{attempt}.log"
            node = RayNode(name, args, self.node_env, log)
            try:
                node.wait_started()
                return node
            except ProcessEnded as exc:
                node.stop()  # a node that failed to start must not outlive the test
                failed += f"\n--- try {attempt + 1}: {exc}; its log ends:\n{log_tail(log)}"
            except BaseException:
                node.stop()
                raise
        raise AssertionError(f"{name} did not start in 3 tries:{failed}")

    def add_worker(self) -> RayNode:
        node = self._node(f"worker{len(self.workers) + 1}", lambda _: ["--address", self.address])
        self.workers.append(node)
        return node

    def live_workers(self) -> list[RayNode]:
        return [w for w in self.workers if w.alive()]

    def ensure_workers(self, n: int) -> list[RayNode]:
        while len(self.live_workers()) < n:
            self.add_worker()
        return self.live_workers()

    def nodes(self) -> list[RayNode]:
        return [self.head, *self.workers]

    def stop(self) -> list[Proc]:
        """Stop every node; returns any process of ours that survived (should be none)."""
        for node in [*self.workers, self.head]:
            node.stop()
        return still_alive([p for node in self.nodes() for p in node.seen.values()])

    def driver_env(self) -> dict[str, str]:
        """A driver's environment: the cluster's token, but NO ``RAY_AUTH_MODE``: fineline's
        ``ray_session`` must choose token mode itself."""
        keep = ("HOME", "PYTHONPATH", "VIRTUAL_ENV", "LANG")
        env = {k: v for k, v in os.environ.items() if k in keep}
        return {
            **env,
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_TOKEN_PATH": str(self.token),
        }
