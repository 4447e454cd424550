"""How a study says why trials failed: each failure as one line with its fix.

Ray wraps a worker's exception (``RayTaskError``, ``ActorDiedError`` keeping only the text of
an error in a trial's setup), Tune logs each failed try with its traceback, and Ray's memory
monitor reports a killed worker in 40 lines. :func:`failure_text` turns any of them into the
line the driver prints; :class:`TrialErrors` keeps each failed trial's exception as Tune logs
it and drops that log's traceback where the line says it all (fineline's own errors, memory
kills); :func:`fit_reporting_memory` ends a run whose worker Ray killed for memory in a step
(which ends Tune itself) with :class:`~trainables.errors.WorkerOutOfMemory`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainables.errors import REFUSED, ConfigRefused, FinelineError, WorkerOutOfMemory
from trainables.plugins import NOT_PLUGIN_CODE

OUT_OF_MEMORY = "were killed due to the node running low on memory"
"""What Ray's out-of-memory report (``OutOfMemoryError``) says, in the text of a trial's error."""
MEMORY_FIX = (
    "train smaller batches or fewer members at once (lower train.batch_size, or execution.bundle_size; "
    "when tuning, tune.batch or tune.seeds_per_candidate), or give each trial more of a node "
    "(raise execution.cpus_per_trial)"
)
"""What to do about a worker killed for memory (:class:`WorkerOutOfMemory`)."""
IN_RAYS_LOG = "the error is in Ray's log above"
"""A failed trial's text when Tune kept no error for it (neither logged nor in a file)."""
REFUSED_FIX = (
    "correct the config as the error above says and run it under a new name (`{again}`), or move "
    "{folder} away first; resuming reruns the recorded config, which its workers refuse again"
)
"""What to do when every failed trial's config was refused by its worker (``trainables.errors.REFUSED``)."""


@dataclass(frozen=True)
class FailedUnit:
    """A unit whose trial failed after its retries, or whose config its worker refused."""

    payload: dict[str, Any]
    """The unit's payload (``study.plan.unit_payload``: trial_id, point_json, seeds, ...)."""
    error: str
    """Why, as the driver printed it (:func:`failure_text`, or the refusal's text)."""
    refused: bool
    """The worker refused its config (``trainables.errors.REFUSED``): resuming cannot help."""


def failures_by_cause(failures: dict[int, str]) -> dict[str, list[int]]:
    """Failed units' indices grouped by their error text, in the order first seen (a cause
    shared by every unit, e.g. a refused batch size, is printed once)."""
    out: dict[str, list[int]] = {}
    for index, text in failures.items():
        out.setdefault(text, []).append(index)
    return out


def failed_units_text(indices: list[int], points: list[str], shown: int = 3) -> str:
    """``unit failed (lr=0.1)`` or ``3 units failed (lr=0.1; lr=0.2; lr=0.3)``: the grid
    points named, the first ``shown`` of them (those without a grid have no label)."""
    labels = list(dict.fromkeys(points[i] for i in indices if points[i]))
    named = "; ".join(labels[:shown]) + (f"; {len(labels) - shown} more" if len(labels) > shown else "")
    what = "unit failed" if len(indices) == 1 else f"{len(indices)} units failed"
    return f"{what} ({named})" if named else what


def failure_text(error: BaseException) -> str:
    """A trial's error as the driver prints it: fineline's own error (a FinelineError raised
    in the worker, e.g. a node without the results folder) as its one line with its fix,
    unwrapped from Ray's RayTaskError / Tune's wrappers; anything else as the exception's
    type and the end of its text (the traceback is in Ray's log above). A worker Ray's
    memory monitor killed (``OutOfMemoryError``) is :func:`memory_text` with the fix."""
    from ray.exceptions import OutOfMemoryError

    chain = unwrapped(error)
    for cause in chain:
        if isinstance(cause, FinelineError):
            return str(cause)
        if isinstance(cause, OutOfMemoryError):  # killed by Ray's memory monitor
            return f"{memory_text(str(cause))}. Fix: {MEMORY_FIX}"
    innermost = chain[0] if chain else error
    if innermost is not error and str(innermost):  # the worker's own exception, in one line
        return f"{type(error).__name__}: {type(innermost).__name__}: {str(innermost)[-2000:]}"
    if OUT_OF_MEMORY in str(error):  # Ray's memory report, as text (Tune's error file)
        return f"{memory_text(str(error))}. Fix: {MEMORY_FIX}"
    # Ray's ActorDiedError keeps only the text of an error raised while the trial's actor was
    # created (a trial's setup: e.g. a ConfigError about the task's data): its last line
    # (Ray's as_instanceof_cause makes subclasses named "RayTaskError(DataError)": not ours)
    names = "|".join(sorted(c.__name__ for c in _subclasses(FinelineError) if c.__name__.isidentifier()))
    found = re.findall(rf"^(?:[\w.]+\.)?(?:{names}): (.+)$", str(error), flags=re.M)
    if found:
        return found[-1]
    if setup := setup_error(error):
        return setup
    return f"{type(error).__name__}: {str(error)[-2000:]}"


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)', re.M)


def setup_error(error: BaseException) -> str | None:
    """An error raised while a trial's actor was created (its setup: the task's data, the
    model), which Ray's ActorDiedError carries only as text with the worker's traceback, in
    one line: ``RuntimeError: no data for this seed (at /path/task.py:107, in the trial's
    setup)``, the place being the innermost frame outside Python's and the installed
    libraries' and fineline's own files. None for any other error."""
    text = _ANSI.sub("", str(error))
    if "raised in its creation task" not in text:
        return None
    last = next((ln.strip() for ln in reversed(text.strip().splitlines()) if ln.strip()), "")
    frames = [(f, n) for f, n in _FRAME.findall(text) if not f.startswith(NOT_PLUGIN_CODE)]
    where = f"at {frames[-1][0]}:{frames[-1][1]}, " if frames else ""
    return f"{last} ({where}in the trial's setup)"


class TrialErrors(logging.Filter):
    """A filter on Tune's controller log: keeps the exception of each "Trial task failed for
    trial NAME" record by trial name (Tune writes a trial's error file only once the trial
    has a folder, so a first try that failed in its setup leaves none), and drops the
    record, with its traceback, where :func:`failure_text` says the error in one line:
    fineline's own errors and Ray's memory kills. Every other record passes."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: dict[str, BaseException] = {}
        """The latest exception of each failed trial, by its name (``str(trial)``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is None:
            return True
        message = record.getMessage()
        if message.startswith("Trial task failed for trial "):
            self.errors[message.rsplit(" ", 1)[-1]] = error
        if worker_died(error):  # a killed worker or a lost node: Tune retries it, no traceback
            first = (str(unwrapped(error)[0]).strip().splitlines() or [""])[0][:300]
            record.msg = (f"{message}: its worker died ({first}); Ray retries the trial from its last "
                          "checkpoint while execution.max_failures allows")
            record.args, record.exc_info, record.exc_text = (), None, None
            return True
        return not one_line(error)


def worker_died(error: BaseException) -> bool:
    """Whether ``error`` is Ray's word that a trial's worker process died (SIGKILL, its node
    lost): not the trial's own error, so its traceback says nothing. (An error raised in the
    trial's setup also comes as Ray's ActorDiedError: that one is the trial's own.)"""
    from ray.exceptions import ActorDiedError

    chain = unwrapped(error)
    return any(isinstance(cause, ActorDiedError) for cause in chain) and not any(
        setup_error(cause) is not None for cause in [error, *chain])


def one_line(error: BaseException) -> bool:
    """Whether :func:`failure_text` gives ``error`` as fineline's own line: a FinelineError,
    Ray's memory kill or an error in a trial's setup (:func:`setup_error`), however Ray
    wrapped it."""
    from ray.exceptions import OutOfMemoryError

    chain = unwrapped(error)
    return any(isinstance(cause, FinelineError | OutOfMemoryError) for cause in chain) or any(
        setup_error(cause) is not None for cause in [error, *chain])


def unwrapped(error: BaseException) -> list[BaseException]:
    """``error``'s chain without Ray's wrappers: what Ray's ``cause`` attributes lead to
    (a ``RayTaskError`` holds the worker's exception there, and its ``as_instanceof_cause``
    form is also an instance of the cause's class: never taken for it), then that
    exception's ``__cause__`` and so on."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        inner = getattr(cause, "cause", None)
        if isinstance(inner, BaseException):
            cause = inner
            continue
        chain.append(cause)
        cause = cause.__cause__
    return chain


def trial_error(trial: Any, logged: Mapping[str, BaseException]) -> BaseException | None:
    """A failed Tune trial's last error: as Tune logged it (``logged``: :attr:`TrialErrors.errors`),
    else the error file Tune wrote beside the trial (pickled, or its text), else None."""
    error: BaseException | str | None = logged.get(str(trial))
    if error is None:
        try:
            error = trial.get_pickled_error() or trial.get_error()
        except Exception:  # an unreadable error file
            error = None
    return RuntimeError(error) if isinstance(error, str) else error


def failed_trials() -> Any:
    """A Tune callback whose ``errors`` lists the last error of each trial that failed after
    its retries (:func:`trial_error`; a result grid has none for a trial whose first try
    failed in its setup) and, as a :class:`~trainables.errors.ConfigRefused`, the refusal
    of each trial whose config its worker refused (its one result's ``REFUSED`` text); pass
    its ``logged`` to :func:`study.runner.fit`. Defined on first use: this module must not
    import Ray early."""
    from ray.tune import Callback

    class FailedTrials(Callback):
        def __init__(self) -> None:
            self.logged = TrialErrors()
            self.errors: list[BaseException] = []

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            if REFUSED in result:
                self.errors.append(ConfigRefused(str(result[REFUSED])))

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            error = trial_error(trial, self.logged.errors)
            self.errors.append(error if error is not None else RuntimeError(IN_RAYS_LOG))

    return FailedTrials()


def fit_reporting_memory(tuner: Any) -> Any:
    """``tuner.fit()``, a worker killed by Ray's memory monitor as :class:`WorkerOutOfMemory`.

    Ray Tune (2.60) handles a dead actor as a trial error but re-raises an actor task's
    ``OutOfMemoryError`` as a bare ``RuntimeError("Caught unexpected exception: ...")``
    that ends ``fit`` with Ray's 170-line memory report."""
    from ray.exceptions import OutOfMemoryError

    try:
        return tuner.fit()
    except RuntimeError as err:
        killed = next((c for c in unwrapped(err) if isinstance(c, OutOfMemoryError)), None)
        if killed is None:
            raise
        raise WorkerOutOfMemory(memory_text(str(killed))) from None


def memory_text(report: str) -> str:
    """Ray's out-of-memory report (``OutOfMemoryError``) in one sentence: the node, how full
    it was and what the largest worker held, from the report's own lines."""
    node = re.search(r"Memory on the node \(IP: ([^,)]+)", report)
    used = re.search(r"was ([\d.]+\s*[KMGT]?B) used / ([\d.]+\s*[KMGT]?B) limit", report)
    top = re.search(r"^\d+\t([\d.]+)\tray::", report, flags=re.M)  # Top 10 memory users: PID MEM(GB) ...
    where = f" on node {node.group(1)}" if node else ""
    full = f" ({used.group(1)} used of its {used.group(2)} limit" if used else ""
    held = f"; the largest trial worker held {top.group(1)} GB)" if top and full else (")" if full else "")
    return f"Ray killed a trial's worker for memory{where}{full}{held}"


def _subclasses(cls: type) -> set[type]:
    """``cls`` and every subclass of it, however deep."""
    out: set[type] = {cls}
    subs: list[type] = type.__subclasses__(cls)
    for sub in subs:
        out |= _subclasses(sub)
    return out
