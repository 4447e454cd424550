"""The one exception of the analysis package.

``analysis`` never imports ``trainables`` (it must work on a laptop without torch), so it
has its own error. Every message says what is wrong *and* what to do, so the CLI can print
it as-is and exit non-zero.
"""

from __future__ import annotations


class AnalysisError(Exception):
    """A results folder, study name, query or declaration the user can fix."""
