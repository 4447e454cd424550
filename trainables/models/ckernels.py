"""Fused CPU kernels for the seq2seq model, compiled at first use.

:file:`kernels/lstm_seq.c` holds a training LSTM layer over all its time steps (forward
and backward, the input projection and the recurrent matmul included),
:file:`kernels/lstm_cell.c` one evaluation time step, :file:`kernels/logits.c` row-wise
cross-entropy and argmax of the output layer's logits, :file:`kernels/output.c` the
training output layer (logits, loss and gradients), :file:`kernels/attention.c` one
decoding step's attention and :file:`kernels/decode.c` the teacher-forced losses and greedy
decoding of a whole batch,
as plain C loops (see their headers; the ``.h`` files hold what several share). They are
compiled once per machine with the system C compiler (``cc``, or ``$CC``) for this CPU
(``-march=native``) into one library in ``$FINELINE_CACHE`` (default
``~/.cache/fineline``)``/kernels``, in a file named by a hash of the sources, the flags,
the compiler and the CPU, written atomically (several Ray workers may build it at once:
the last rename wins, and every build is the same). Loading it takes milliseconds, a cold
build about a second.

Where no compiler is found or the build fails, :func:`cpu_kernels` returns None (with
one warning) and the model runs as torch ops, which compute the same to float rounding.
``FINELINE_CPU_KERNELS=0`` turns the kernels off (the tests run both ways).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

KERNELS = Path(__file__).with_name("kernels")
SOURCES = ("lstm_cell.c", "lstm_seq.c", "logits.c", "output.c", "attention.c", "decode.c")
"""Compiled together into one library (with the headers beside them)."""
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fPIC", "-shared")
SWITCH = "FINELINE_CPU_KERNELS"
"""Environment variable: ``0`` runs the model as torch ops even where a compiler exists."""

_F = ctypes.c_void_p
_I = ctypes.c_int
_L = ctypes.c_long
_I64 = ctypes.c_int64


def _sources() -> list[str]:
    """The text of every kernel source and header (what a build depends on)."""
    return [p.read_text() for p in sorted(KERNELS.glob("*.[ch]"))]


def cache_dir() -> Path:
    """Where built kernels are kept: ``$FINELINE_CACHE/kernels`` (default ``~/.cache/fineline``)."""
    root = os.environ.get("FINELINE_CACHE") or Path.home() / ".cache" / "fineline"
    return Path(root) / "kernels"


def _cpu_signature() -> str:
    """What ``-march=native`` depends on: the machine and, on Linux, the CPU's flags."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = line
                break
    except OSError:
        pass
    return f"{platform.machine()} {flags}"


class CpuKernels:
    """ctypes bindings of the kernels in :file:`kernels/` (see there for the arguments)."""

    def __init__(self, lib: ctypes.CDLL, path: Path) -> None:
        self.path = path
        self.eval_step = _bind(lib.lstm_eval_step, [_I, _I, _I, _F, _L, _F, _L, _F, _F, _L])
        self.fwd_seq = _bind(lib.lstm_fwd_seq, [_I] * 5 + [_F] * 11)
        self.bwd_seq = _bind(lib.lstm_bwd_seq, [_I] * 5 + [_F] * 19)
        self.argmax = _bind(lib.logits_argmax, [_I, _I, _F, _F])
        self.ce = _bind(lib.logits_ce, [_I, _I, _F, _F, _I64, _F, _F])
        self.softmax_ce = _bind(lib.logits_softmax_ce, [_I, _I, _F, _F, _I64, _F, _F, _F])
        self.ce_grad = _bind(lib.logits_ce_grad, [_I, _I, _F, _F, _F, _I64, _F, _F])
        self.out_fwd = _bind(lib.out_fwd, [_I] * 5 + [_F] * 4 + [_I64] + [_F] * 3, ctypes.c_int)
        self.out_bwd = _bind(lib.out_bwd, [_I] * 4 + [_F] * 3 + [_I64] + [_F] * 6)
        self.attend_one = _bind(lib.attend_one, [_I] * 5 + [_F] * 5)
        self.decode = _bind(lib.decode_batch, [_I] * 12 + [_I64] + [_F] * 20, ctypes.c_int)


def _bind(fn: Any, argtypes: list[Any], restype: Any = None) -> Any:
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        subprocess.run(
            [compiler, *FLAGS, *(str(KERNELS / f) for f in SOURCES), "-o", tmp],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.cache
def cpu_kernels() -> CpuKernels | None:
    """The compiled kernels, built on first use; None where they cannot be (see module doc)."""
    if os.environ.get(SWITCH, "1") == "0":
        return None
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        warnings.warn(
            "fineline: no C compiler found (cc, gcc or $CC): the seq2seq model runs as "
            "torch ops, about 1.5x slower on a CPU. Install gcc to build its fused kernels.",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    try:
        version = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, timeout=30
        ).stdout
        key = hashlib.sha256(
            "\n".join([*_sources(), " ".join(FLAGS), version, _cpu_signature()]).encode()
        ).hexdigest()[:16]
        path = cache_dir() / f"fineline-{key}.so"
        if not path.exists():
            _build(compiler, path)
        return CpuKernels(ctypes.CDLL(str(path)), path)
    except (OSError, subprocess.SubprocessError) as e:
        detail = e.stderr if isinstance(e, subprocess.CalledProcessError) else e
        warnings.warn(
            f"fineline: building the fused CPU kernels with {compiler} failed ({detail}); the "
            f"seq2seq model runs as torch ops. Set {SWITCH}=0 to skip the attempt.",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


MAX_HIDDEN = 1024
"""Largest hidden size the kernels take (the backward's zero row, ``lstm_seq.c``)."""


def usable(x: torch.Tensor, hidden: int = 1) -> CpuKernels | None:
    """The kernels for a cell of ``hidden`` units on ``x`` (float32, CPU) where they are
    available, else None."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or hidden > MAX_HIDDEN:
        return None
    return cpu_kernels()


def ptr(x: torch.Tensor) -> int:
    """Address of ``x``'s first element."""
    return int(x.data_ptr())


def ptr_or_none(x: torch.Tensor | None) -> int | None:
    """:func:`ptr`, or None (a NULL pointer for the kernels) for no tensor."""
    return None if x is None else ptr(x)


LANES = 16
"""Floats per vector of the kernels (``kernels/fmath.h``)."""


def whole_vectors(n: int) -> int:
    """``n`` rounded up to whole :data:`LANES`-float vectors."""
    return -(-n // LANES) * LANES


def padded_output_layer(w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The output layer w (K, D, V), b (K, 1, V) as (K, D, Vp) and (K, Vp) contiguous, its
    columns padded with zeros to whole vectors (the kernels never read the padding's
    logits)."""
    k, d, v = w.shape
    vp = whole_vectors(v)
    w_pad, b_pad = w.new_zeros(k, d, vp), b.new_zeros(k, vp)
    w_pad[:, :, :v] = w
    b_pad[:, :v] = b.view(k, v)
    return w_pad, b_pad
