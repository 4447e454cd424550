"""Process settings of a training worker (:mod:`trainables.runtime`)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys, weakref
from trainables.runtime import quiet_sigterm_in_callbacks

class Thing:
    pass

def raiser(exc):
    def callback(_):
        raise exc
    return callback

if sys.argv[1] == "quiet":
    quiet_sigterm_in_callbacks()
    quiet_sigterm_in_callbacks()  # twice: one hook, not a chain
for exc in (SystemExit(1), ValueError("a real error")):
    thing = Thing()
    ref = weakref.ref(thing, raiser(exc))
    del thing  # the callback's exception cannot propagate: Python calls sys.unraisablehook
print("went on")
"""


def run(mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60)


def test_a_sigterm_exit_inside_a_callback_is_not_printed_and_real_errors_still_are() -> None:
    """Ray's SIGTERM handler raises SystemExit; landing in a weakref callback, Python prints
    "Exception ignored" with a traceback. With the hook only the real error is printed."""
    plain, quiet = run("plain"), run("quiet")
    assert plain.returncode == quiet.returncode == 0
    assert plain.stdout == quiet.stdout == "went on\n"
    assert "SystemExit" in plain.stderr and "ValueError: a real error" in plain.stderr
    assert "SystemExit" not in quiet.stderr, quiet.stderr
    assert "ValueError: a real error" in quiet.stderr
    assert quiet.stderr.count("Exception ignored") == 1
