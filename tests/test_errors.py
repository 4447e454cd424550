"""fineline's exceptions cross process boundaries intact (a Ray worker's error reaches the
driver as itself, not as Ray's UnserializableException)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

import study.lock  # noqa: F401  (registers StudyLocked)
import trainables.plugins  # noqa: F401  (registers PluginError)
from trainables.errors import ConfigError, FinelineError, StudyIncomplete


def subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *subclasses(sub)]
    return out


def example(cls: type[FinelineError]) -> FinelineError:
    if issubclass(cls, ConfigError):
        return cls("model.dropout", "torch.nn.Dropout draws one mask for the bundle", "use plain.Dropout(p)")
    if issubclass(cls, StudyIncomplete):
        return cls("0/2 runs committed, 2 failed", exit_code=130)
    return cls("something is wrong. Fix: do this")


@pytest.mark.parametrize("cls", [FinelineError, *subclasses(FinelineError)], ids=lambda c: c.__name__)
def test_every_error_pickles_with_its_message_and_fields(cls: type[FinelineError]) -> None:
    err = example(cls)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert str(back) == str(err)
    assert back.exit_code == err.exit_code
    for name in ("field", "problem", "fix"):
        assert getattr(back, name, None) == getattr(err, name, None)


def test_the_hierarchy_is_all_here() -> None:
    names = {c.__name__ for c in subclasses(FinelineError)}
    assert {"ConfigError", "DataError", "StudyStateError", "StudyIncomplete", "StudyLocked", "PluginError"} <= names


def test_a_workers_fineline_error_is_printed_as_its_one_line() -> None:
    """What the driver prints for a failed trial (study.failures.failure_text): Ray wraps the
    worker's exception in a RayTaskError whose text holds the worker's traceback."""
    from ray.exceptions import RayTaskError

    from study.failures import failure_text
    from trainables.errors import DataError

    cause = DataError("study folder /r/s is missing on node vm. Fix: mount the same shared filesystem")
    wrapped = RayTaskError("train", "Traceback (most recent call last):\n  File ...", cause)
    assert failure_text(wrapped) == str(cause)
    assert failure_text(wrapped.as_instanceof_cause()) == str(cause)
    tb = 'Traceback (most recent call last):\n  File "m.py", line 3\nValueError: shapes (3,) and (4,) differ'
    other = RayTaskError("train", tb, ValueError("shapes (3,) and (4,) differ"))  # not ours: its text
    assert failure_text(other).startswith("RayTaskError") and "shapes (3,) and (4,) differ" in failure_text(other)
    # a long traceback: the worker's exception and its message, not the text's last 2,000
    # characters (which began mid-line: "unit failed: RayTaskError(RuntimeError): y-return]")
    long_tb = "Traceback (most recent call last):\n" + '  File "x.py", line 1, in f\n    y-return]\n' * 200
    boom = RayTaskError("train", long_tb + "RuntimeError: boom", RuntimeError("boom"))
    assert failure_text(boom.as_instanceof_cause()) == "RayTaskError(RuntimeError): RuntimeError: boom"
    # an error raised while the trial's actor was created: Ray's ActorDiedError keeps its text only
    from ray.exceptions import ActorDiedError

    setup_tb = tb.replace("ValueError: shapes (3,) and (4,) differ", f"trainables.errors.ConfigError: {cause}")
    died = ActorDiedError(RayTaskError("__init__", setup_tb, cause))
    assert failure_text(died) == str(cause)
    # any other error raised there: its own last line and the innermost frame of the user's
    # code (not Python's, a library's or fineline's), without the traceback Ray keeps as text
    assert failure_text(ActorDiedError(other)) == "ValueError: shapes (3,) and (4,) differ (at m.py:3, in the trial's setup)"
    import ray

    import trainables

    lib, own = Path(ray.__file__).parent / "tune" / "trainable" / "trainable.py", Path(trainables.__file__).parent / "trainable.py"
    frames = (f'  File "{lib}", line 151, in __init__\n  File "{own}", line 181, in _data\n'
              '  File "/tmp/study/my_task.py", line 7, in build\n    raise RuntimeError("no data")\n'
              f'  File "{lib}", line 9, in helper\n')
    died = ActorDiedError(RayTaskError("__init__", f"Traceback (most recent call last):\n{frames}RuntimeError: no data",
                                       RuntimeError("no data")))
    assert failure_text(died) == "RuntimeError: no data (at /tmp/study/my_task.py:7, in the trial's setup)"


def test_tunes_failed_trial_log_keeps_each_error_and_drops_only_the_tracebacks_fineline_says_itself() -> None:
    """``study.failures.TrialErrors`` on Tune's "Trial task failed for trial NAME" records: the
    exception is kept by trial name (the callback's source: a first try that failed in its
    setup leaves Tune no error file); the record is dropped for fineline's own errors and
    memory kills (one line each), kept for anything else (its traceback is the only one)."""
    import logging

    from ray.exceptions import OutOfMemoryError, RayTaskError

    from study.failures import TrialErrors
    from trainables.errors import ConfigError

    def record(message: str, error: BaseException | None) -> logging.LogRecord:
        info = (type(error), error, None) if error is not None else None
        return logging.LogRecord("ray.tune.execution.tune_controller", logging.ERROR, "x.py", 1, message, None, info)

    errors = TrialErrors()
    ours = RayTaskError("train", "Traceback ...", ConfigError("train.lr", "bad", "fix it")).as_instanceof_cause()
    oom = OutOfMemoryError("1 worker(s) were killed due to the node running low on memory.")
    bug = RuntimeError("shapes differ")
    assert errors.filter(record("Trial task failed for trial T_00000", ours)) is False
    assert errors.filter(record("Trial task failed for trial T_00001", oom)) is False
    assert errors.filter(record("Trial task failed for trial T_00002", bug)) is True
    assert errors.filter(record("Trial task failed for trial T_00002", bug)) is True  # a retry: the latest kept
    assert errors.filter(record("something else", None)) is True
    assert errors.errors == {"T_00000": ours, "T_00001": oom, "T_00002": bug}
    # a worker killed (or its node lost), which Tune retries: one line, no 28-line traceback
    from ray.exceptions import ActorDiedError

    died = record("Trial task failed for trial T_00003", ActorDiedError())
    assert errors.filter(died) is True and died.exc_info is None
    assert died.getMessage() == (
        "Trial task failed for trial T_00003: its worker died (The actor died unexpectedly before "
        "finishing this task.); Ray retries the trial from its last checkpoint while "
        "execution.max_failures allows"
    )
    assert isinstance(errors.errors["T_00003"], ActorDiedError)  # kept for the failure line
