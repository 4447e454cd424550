"""The one exception of the analysis package.

``analysis`` never imports ``trainables`` (it must work on a laptop without torch), so it
has its own error. Every message says what is wrong *and* what to do, so the CLI can print
it as-is and exit non-zero.
"""

from __future__ import annotations


class AnalysisError(Exception):
    """A results folder, study name, query or declaration the user can fix."""


def unknown_study(study: str, where: str, known: list[str]) -> AnalysisError:
    """The error for a study name with no results in ``where``: the closest known names
    first (``difflib``), every known name when there are few, and the fix."""
    import difflib

    close = difflib.get_close_matches(study, known, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    listing = ", ".join(known) if len(known) <= 12 else f"{len(known)} studies"
    return AnalysisError(
        f"study {study!r} has no results in {where}{hint} (known: {listing or '(none yet)'}). "
        "Fix: check the name with `study ls` or pass the right --out folder"
    )
