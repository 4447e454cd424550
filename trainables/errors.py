"""The one exception hierarchy of fineline's training side.

Every message says what is wrong *and* what to do about it, so the CLI can print it
as-is and exit non-zero.
"""

from __future__ import annotations


class FinelineError(Exception):
    """Base class: an error a user can fix (config, data, arguments)."""


class ConfigError(FinelineError):
    """A study config (or CLI argument) is invalid. The message names the field and the fix."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"{field}: {problem}. Fix: {fix}")


class DataError(FinelineError):
    """A data file or data_dir is missing or malformed."""


class StudyStateError(FinelineError):
    """The study folder disagrees with the request (changed config, unknown study)."""
