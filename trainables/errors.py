"""The one exception hierarchy of fineline's training side.

Every message says what is wrong *and* what to do about it, so the CLI can print it
as-is and exit non-zero.
"""

from __future__ import annotations

REFUSED = "refused"
"""The result key under which a Ray worker reports a ConfigError raised in a unit's setup or
step: its text (one line with its fix). The unit ends with that result instead of a Ray
error, so it is not retried (``trainables.trainable.FinelineTrainable._refused``)."""


class FinelineError(Exception):
    """Base class: an error a user can fix (config, data, arguments).

    The CLI prints it as one ``error: ...`` line and exits with ``exit_code`` (2: the input
    was refused, nothing ran). A subclass whose constructor takes other arguments than
    the message defines ``__reduce__`` (as :class:`ConfigError`), so that raised in a Ray
    worker it reaches the driver as itself, not as Ray's UnserializableException."""

    exit_code: int = 2


class ConfigError(FinelineError):
    """A study config (or CLI argument) is invalid. The message names the field and the fix."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"{field}: {problem}. Fix: {fix}")

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, str, str]]:
        return type(self), (self.field, self.problem, self.fix)


class DataError(FinelineError):
    """A data file or data_dir is missing or malformed."""


class StudyStateError(FinelineError):
    """The study folder disagrees with the request (changed config, unknown study)."""


class StudyIncomplete(FinelineError):
    """A study ran but did not commit every planned run: some failed, it was interrupted, or
    both. The message gives the committed / failed / pending counts (read from Parquet, never
    from what Ray Tune reports) and the command that finishes the study.

    ``exit_code``: 1 when runs failed, 130 after SIGINT, 143 after SIGTERM (the shell's
    128 + signal number), so ``study run ... && study sql ...`` stops at an incomplete study.
    """

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class WorkerOutOfMemory(FinelineError):
    """Ray's memory monitor killed a trial's worker: its node ran out of memory. Ray Tune
    stops the whole run on it (not a trial error it could retry), so the study stops; the
    message says how full the node was and what to lower."""

    exit_code = 1


class ConfigRefused(FinelineError):
    """A Ray worker refused a unit's config (a ConfigError in its setup or a step, reported
    under :data:`REFUSED`): the driver's form of it. Resuming cannot help (the recorded config
    is refused again); the config must change."""

