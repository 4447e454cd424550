"""Process settings of a training worker (:mod:`trainables.runtime`)."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

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


NUMERICS = """
import torch
from trainables.runtime import cpu_model, numerics
torch.set_num_threads(3)
print(cpu_model())
print(numerics("cpu"))
"""


def test_numerics_name_the_cpu_torch_code_path_mkl_setting_and_threads() -> None:
    """Pinned by the environment (a fresh process: torch reads both at start), each setting
    shows in its own place."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}
    res = subprocess.run([sys.executable, "-c", NUMERICS], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    model, text = res.stdout.strip().splitlines()
    parts = text.split("; ")
    assert parts[0] == model and model
    assert parts[1] == "torch DEFAULT"  # not this machine's best path
    assert parts[-1] == "3 threads"
    if torch.backends.mkl.is_available():
        assert parts[2] == "MKL_CBWR COMPATIBLE"
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR")}
    res = subprocess.run([sys.executable, "-c", NUMERICS], capture_output=True, text=True, env=env, timeout=120)
    parts = res.stdout.strip().splitlines()[1].split("; ")
    assert parts[1] == f"torch {torch.backends.cpu.get_cpu_capability()}"
    assert "MKL_CBWR unset" in parts or not torch.backends.mkl.is_available()
