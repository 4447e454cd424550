"""Stopping a running study from another terminal: ``study stop NAME``.

``study stop NAME`` *drains* the study: the driver that holds its lock (:mod:`study.lock`)
finishes the bundles running now and starts no new one. The command writes
``OUT/NAME/stop_request.json`` (:func:`request_stop`); the driver looks for it at each
turn of Ray Tune's loop, about ten a second (:class:`StopRequest`). A seed study's pending Ray Tune trials are then stopped before
they start (:func:`draining_scheduler`); a tuning search asks Optuna for no new candidate
(:func:`draining_limiter`). Once the running bundles have committed, the driver ends like an
interrupted run, with counts and the resume command, and exit code :data:`DRAINED_EXIT`.
Only a file is written, so any machine that sees OUT can drain a study run on another.

``study stop NAME --now`` sends the driver SIGINT instead, as Ctrl-C in its terminal would:
the running bundles stop too (their committed seeds are kept), exit 130. A signal reaches a
process of this machine only, so the driver must run here.

Import-light (neither torch nor Ray): ``study stop`` answers at once.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from study import lock
from trainables.errors import StudyStateError

STOP_FILE = "stop_request.json"
"""The file in a study's folder that asks its driver to drain (:func:`request_stop`)."""

DRAINED_EXIT = 3
"""The exit code of a driver that stopped because ``study stop`` asked it to, leaving runs to
do (a drained study that had nothing left to start ends complete, exit 0)."""

STEERABLE = ("study run", "study resume", "study tune")
"""The commands whose driver takes a drain request (``study eval`` and ``study check`` stop
with ``--now`` only)."""

CHECK_EVERY_S = 0.05
"""How often a driver looks for a request at most (a ``stat`` of one file, a few
microseconds): Tune's loop asks its scheduler about ten times a second, so a bundle Tune
starts within that fraction of a second of the request may still start."""


def request_stop(out: Path, name: str, now: bool = False) -> str:
    """Ask the driver writing study ``name`` to drain (write :data:`STOP_FILE`), or with
    ``now`` send it SIGINT; returns what was done, as one line. Raises
    :class:`StudyStateError` when no driver runs the study, or when ``now`` and the driver
    runs on another machine."""
    folder = Path(out) / name
    if not folder.is_dir():
        raise StudyStateError(f"no study {name!r} in {out}. Fix: check the name and --out (`study ls --out {out}` "
                              "lists the studies there)")
    info = lock.holder_info(out, name)
    if info is None:
        raise StudyStateError(
            f"no driver is running study {name} in {out}: nothing to stop. Fix: `study status {name} "
            f"--out {out}` says how its last run ended; `study ls --out {out}` lists the studies there"
        )
    pid, host, command = int(info["pid"]), str(info["host"]), str(info["command"])
    who = f"pid {pid} on {host} ({command})"
    stop_now = f"`study stop {name} --now --out {out}`"
    if now:
        if host != socket.gethostname():
            raise StudyStateError(
                f"study {name} is run by {who}, on another machine: a signal cannot reach it from "
                f"here. Fix: run `study stop {name} --now --out OUT` on {host}, or drain it from here "
                f"(`study stop {name} --out {out}`: the running bundles finish first)"
            )
        os.kill(pid, signal.SIGINT)
        return (f"study {name}: sent SIGINT to {who}: the running bundles stop now, committed seeds are "
                "kept (exit 130); the driver prints the resume command")
    if not command.startswith(STEERABLE):
        raise StudyStateError(
            f"study {name} is being written by {who}, which does not take stop requests. Fix: wait "
            f"for it, or stop it at once with {stop_now}"
        )
    what = "candidates" if command.startswith("study tune") else "bundles"
    path = folder / STOP_FILE
    if path.exists():
        return f"study {name}: a stop was already requested; {who} starts no new {what[:-1]}"
    record = {"requested_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
              "by": f"pid {os.getpid()} on {socket.gethostname()}"}
    tmp = folder / f".{STOP_FILE}.{uuid.uuid4().hex}.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)
    return (f"study {name}: asked {who} to finish the {what} running now and start no new one; it "
            f"exits {DRAINED_EXIT} once they have committed (0 if none was left to start; {stop_now} stops "
            "them too)")


class StopRequest:
    """The driver's side: whether ``study stop`` asked this run to drain.

    Made under the study's lock, it removes a request left from an earlier run (one that
    ended before it saw it). Calling it returns True once the request file has appeared
    (looked for at most every :data:`CHECK_EVERY_S`; once seen, always True) and prints one
    line then (``what`` runs: bundles, or a tuning study's candidates). Picklable: Tune may save the scheduler or searcher holding it."""

    def __init__(self, out: Path, name: str, what: str = "bundles") -> None:
        self.path = Path(out) / name / STOP_FILE
        self.name, self.what = name, what
        self.path.unlink(missing_ok=True)
        self.seen = False
        self._next = 0.0

    def __call__(self) -> bool:
        if self.seen:
            return True
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + CHECK_EVERY_S
        if not self.path.exists():
            return False
        self.seen = True
        from study.runner import console

        console.print(f"study {self.name}: stop requested (study stop): the {self.what} running now finish, no "
                      "new one starts; Ctrl-C stops them too", soft_wrap=True, highlight=False)
        return True

    def clear(self) -> None:
        """Remove the request (the run it was for has ended)."""
        self.path.unlink(missing_ok=True)

    def why(self) -> str:
        """Why a drained run stopped, for its summary and ``study status``."""
        return f"stopped by `study stop`: the {self.what} running then finished, no new one started"


def draining_scheduler(requested: Callable[[], bool], newest: bool) -> Any:
    """A FIFO Ray Tune scheduler that, once ``requested()`` (a :class:`StopRequest`), stops
    every pending trial before it starts (``stop_trial``, part of the interface Tune gives
    schedulers), so only the running ones finish. ``newest``: start the newest pending trial
    first (:func:`study.runner.launch` explains why a local Ray wants that)."""
    from ray.tune.experiment import Trial
    from ray.tune.schedulers import FIFOScheduler

    class Draining(FIFOScheduler):
        def choose_trial_to_run(self, tune_controller: Any) -> Any:
            if requested():
                for t in list(tune_controller.get_trials()):
                    if t.status in (Trial.PENDING, Trial.PAUSED):
                        t.init_local_path()  # Tune's results need every trial's folder, started or not
                        tune_controller.stop_trial(t)
                return None
            if not newest:
                return super().choose_trial_to_run(tune_controller)
            trials = list(reversed(tune_controller.get_trials()))
            return next((t for t in trials if t.status == Trial.PENDING), None) or next(
                (t for t in trials if t.status == Trial.PAUSED), None
            )

    return Draining()


def quiet_trial_progress() -> Any:
    """Ray Tune's per-trial progress printer, silent. fineline passes ``verbose=0``, yet Tune's
    default printer still prints "Trial ... completed. Last result:" for every trial that
    ends without a result (each pending trial a drain stops); given one, Tune adds none."""
    from ray.tune.progress_reporter import TrialProgressCallback

    class Quiet(TrialProgressCallback):
        def _print(self, msg: str) -> None:
            return None

    return Quiet()


def draining_limiter(searcher: Any, max_concurrent: int, requested: Callable[[], bool]) -> Any:
    """Ray Tune's ``ConcurrencyLimiter`` around ``searcher`` that, once ``requested()``, answers
    every ``suggest`` with ``Searcher.FINISHED``: no new candidate is asked of Optuna, and the
    search ends when the running ones have finished."""
    from ray.tune.search import ConcurrencyLimiter, Searcher

    class Draining(ConcurrencyLimiter):
        def suggest(self, trial_id: str) -> Any:
            if requested():
                return Searcher.FINISHED
            return super().suggest(trial_id)

    return Draining(searcher, max_concurrent=max_concurrent)
