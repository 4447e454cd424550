"""Fused CPU kernels for the seq2seq model, compiled at first use.

:file:`kernels/lstm_seq.c` holds a training LSTM layer over all its time steps (forward
and backward, the input projection and the recurrent matmul included),
:file:`kernels/lstm_cell.c` one evaluation time step, :file:`kernels/logits.c` row-wise
cross-entropy and argmax of the output layer's logits, :file:`kernels/output.c` the
training output layer (logits, loss and gradients), :file:`kernels/attention.c` one
decoding step's attention and :file:`kernels/decode.c` the teacher-forced losses and greedy
decoding of a whole batch,
as plain C loops (see their headers; the ``.h`` files hold what several share). Python
calls them through checked entries (:mod:`kernel_calls`: every tensor's device, dtype,
layout, shape and index range is checked before the C code runs).

**Build.** They are compiled once per machine with the system C compiler into one library
in ``$FINELINE_CACHE`` (default ``~/.cache/fineline``)``/kernels``, in a file named by a hash
of the sources, the flags, the compiler's ``--version`` and, for a build tuned to this CPU
(a flag of :data:`NATIVE_FLAGS`), the CPU's feature flags; written atomically (several Ray
workers may build it at once: the last rename wins, and every build is the same). Loading
it takes milliseconds, a cold build about a second. What to build is read from the
environment once per process (:func:`build_config`); a study forwards these variables
from the driver to every Ray worker (:func:`forwarded_env`):

* ``FINELINE_CPU_KERNELS``: ``0`` runs the model as torch ops even where a compiler exists
  (the tests run both ways); ``1`` or unset: build and use the kernels.
* ``FINELINE_CFLAGS``: compiler flags (shell words) in place of :data:`DEFAULT_FLAGS`;
  :data:`REQUIRED_FLAGS` are always added. Flags that let the compiler reorder, contract or
  approximate float operations (:data:`REFUSED_FLAGS`, e.g. ``-ffast-math``) are refused.
* ``FINELINE_PORTABLE_KERNELS=1``: leave out every flag naming the build machine's CPU
  (:data:`NATIVE_FLAGS`): a library for the compiler's baseline target, cached under one
  name for every CPU of the architecture (for clusters of mixed CPUs).
* ``FINELINE_CC``: the compiler (else ``$CC``, else ``cc``, else ``gcc``); not forwarded
  (a node's compiler is its own).

Where the compiler refuses a flag of :data:`NATIVE_FLAGS` (``-march=native`` is unknown to
some compilers and targets), the build is retried without it (one warning). Where no
compiler is found or the build fails, :func:`cpu_kernels` returns None (one warning) and the
model runs as torch ops, which compute the same to float rounding.

**The same bits on every CPU.** The kernels compute plain IEEE float32 operations in a fixed
order: contraction is off (``-ffp-contract=off``, always passed: otherwise ``a * b + c`` may
become one fused multiply-add where the CPU has one and two roundings where it does not, and
a vector loop body would round differently from its scalar remainder), no fast-math, and
``exp`` is a polynomial of our own (``kernels/fmath.h``). So a library built with or without
``-march=native`` computes the same bits (tested), and a portable library runs on every node.
Two things the kernels do not decide: ``logf`` comes from the C library (it enters the
reported loss, not the gradients), and torch's own CPU ops (the matmuls outside the kernels,
through MKL/oneDNN) pick code paths by CPU features (docs/performance.md, "Kernel builds").

**One choice per model.** A model asks :func:`cpu_kernels` once, at construction, and hands
the answer (a :class:`CpuKernels` or None) to every call site (their ``kern`` argument);
:func:`applicable` then only checks that a call's tensors are float32 on a CPU. Callers
outside a model (tests, benchmarks) may pass ``"default"``: this process's answer.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from trainables.errors import ConfigError
from trainables.models.kernel_calls import MAX_HIDDEN, CpuKernels, KernelCallError

__all__ = ["MAX_HIDDEN", "CpuKernels", "KernelCallError"]

KERNELS = Path(__file__).with_name("kernels")
SOURCES = ("lstm_cell.c", "lstm_seq.c", "logits.c", "output.c", "attention.c", "decode.c")
"""Compiled together into one library (with the headers beside them)."""
REQUIRED_FLAGS = ("-ffp-contract=off", "-fPIC", "-shared")
"""Always passed, after the others: a shared library, and no contraction of float operations
(see the module doc: what makes results independent of the CPU and of vector blocking)."""
DEFAULT_FLAGS = ("-O3", "-march=native", "-fno-math-errno")
"""The flags where ``FINELINE_CFLAGS`` is unset: tuned for the building CPU."""
NATIVE_FLAGS = ("-march=native", "-mcpu=native", "-mtune=native")
"""Flags naming the building CPU: left out by a portable build and by the retry."""
REFUSED_FLAGS = (
    "-ffast-math", "-Ofast", "-ffp-contract=fast", "-ffp-contract=on",
    "-funsafe-math-optimizations", "-fassociative-math", "-freciprocal-math",
    "-ffinite-math-only", "-fno-signed-zeros",
)
"""Flags that let the compiler reorder, contract or approximate float operations, or assume
no NaN: results would depend on the compiler, the CPU and a row's place in a vector block."""
SWITCH = "FINELINE_CPU_KERNELS"
"""Environment variable: ``0`` runs the model as torch ops even where a compiler exists."""
CFLAGS_VAR = "FINELINE_CFLAGS"
"""Environment variable: compiler flags in place of :data:`DEFAULT_FLAGS`."""
PORTABLE_VAR = "FINELINE_PORTABLE_KERNELS"
"""Environment variable: ``1`` builds without :data:`NATIVE_FLAGS` (same library on every CPU)."""
CC_VAR = "FINELINE_CC"
"""Environment variable: the C compiler (before ``$CC``)."""
FORWARDED = (SWITCH, CFLAGS_VAR, PORTABLE_VAR, "ATEN_CPU_CAPABILITY", "MKL_CBWR")
"""Variables a study passes from the driver to its Ray workers where set (the last two pin
torch's own CPU code paths: docs/performance.md)."""

KernelChoice = CpuKernels | None | Literal["default"]
"""What a call site is given: a model's kernels, None (torch ops), or ``"default"`` (this
process's :func:`cpu_kernels`, for callers outside a model)."""


@dataclass(frozen=True)
class BuildConfig:
    """What to build, from the environment (see the module doc)."""

    enabled: bool
    """Whether to use the kernels at all (``FINELINE_CPU_KERNELS``)."""
    flags: tuple[str, ...]
    """The full compiler flags: ``FINELINE_CFLAGS`` or :data:`DEFAULT_FLAGS`, less
    :data:`NATIVE_FLAGS` when portable, then :data:`REQUIRED_FLAGS`."""
    portable: bool
    """Whether ``FINELINE_PORTABLE_KERNELS`` asked for a build without :data:`NATIVE_FLAGS`."""
    compiler: str
    """The compiler asked for (``FINELINE_CC``, ``CC`` or ``cc``), before the PATH lookup."""


def _switch(name: str, default: str) -> bool:
    value = os.environ.get(name, "").strip() or default
    if value not in ("0", "1"):
        raise ConfigError(
            name, f"must be 0 or 1, got {value!r}", f"set {name}=0 or {name}=1, or unset it"
        )
    return value == "1"


def build_config() -> BuildConfig:
    """The kernels' build settings from the environment; raises ConfigError (naming the
    variable and the fix) for a value it cannot take."""
    enabled = _switch(SWITCH, "1")
    portable = _switch(PORTABLE_VAR, "0")
    raw = os.environ.get(CFLAGS_VAR)
    try:
        flags = tuple(shlex.split(raw)) if raw is not None else DEFAULT_FLAGS
    except ValueError as e:
        raise ConfigError(CFLAGS_VAR, f"cannot be split into words ({e})", "quote it as for a shell") from None
    refused = [f for f in flags if f in REFUSED_FLAGS or f.startswith(("-ffast-math", "-Ofast"))]
    if refused:
        raise ConfigError(
            CFLAGS_VAR,
            f"{' '.join(refused)} lets the compiler reorder or approximate float operations, so "
            "a seed's result would depend on the compiler, the CPU and the bundle",
            f"drop {' '.join(refused)} (the default is {' '.join(DEFAULT_FLAGS)})",
        )
    asan = any(f.startswith("-fsanitize=") and "address" in f for f in flags)
    if enabled and asan and "asan" not in os.environ.get("LD_PRELOAD", ""):
        raise ConfigError(
            CFLAGS_VAR,
            "an AddressSanitizer build (-fsanitize=address) loads only into a process that "
            "starts with the ASan runtime",
            "run python with LD_PRELOAD=$(gcc -print-file-name=libasan.so) and "
            "ASAN_OPTIONS=detect_leaks=0, or drop -fsanitize=address",
        )
    if portable:
        flags = tuple(f for f in flags if f not in NATIVE_FLAGS)
    compiler = os.environ.get(CC_VAR) or os.environ.get("CC") or "cc"
    return BuildConfig(enabled, flags + REQUIRED_FLAGS, portable, compiler)


def forwarded_env() -> dict[str, str]:
    """The variables of :data:`FORWARDED` set in this (the driver's) environment, for every
    Ray worker's ``runtime_env``; checked first (:func:`build_config`, and a set
    ``FINELINE_CFLAGS`` by :func:`check_cflags`), so a bad value is refused before Ray starts."""
    cfg = build_config()
    if cfg.enabled and CFLAGS_VAR in os.environ:
        check_cflags(cfg)
    return {name: os.environ[name] for name in FORWARDED if name in os.environ}


@functools.cache
def check_cflags(cfg: BuildConfig) -> None:
    """Compile an empty file with ``cfg``'s flags (less :data:`NATIVE_FLAGS`, which a build
    retries without): a flag the compiler refuses is a ConfigError naming
    ``FINELINE_CFLAGS``, where each worker would otherwise warn and run torch ops. Skipped
    where this machine has no compiler (a driver outside the cluster). Once per setting and
    process: a study start reads :func:`forwarded_env` twice (its checks, the workers' env)."""
    compiler = shutil.which(cfg.compiler) or shutil.which("gcc")
    if compiler is None:
        return
    flags = [f for f in cfg.flags if f not in NATIVE_FLAGS]
    try:
        done = subprocess.run([compiler, *flags, "-x", "c", "-c", "-o", os.devnull, "-"], input="",
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return
    if done.returncode != 0:
        why = next((ln.strip() for ln in done.stderr.splitlines() if "error" in ln), done.stderr.strip()[:200])
        raise ConfigError(CFLAGS_VAR, f"{compiler} refuses these flags ({why})",
                          f"fix or unset {CFLAGS_VAR} (the default is {' '.join(DEFAULT_FLAGS)})")


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


def library_path(flags: tuple[str, ...], compiler_version: str) -> Path:
    """Where the library built with ``flags`` by this compiler is cached: named by a hash of
    the sources, the flags, the compiler's version and (only for flags naming the CPU) the
    CPU's features; a portable build's name is the same on every CPU of the architecture."""
    native = any(f in NATIVE_FLAGS for f in flags)
    target = _cpu_signature() if native else platform.machine()
    text = "\n".join([*_sources(), " ".join(flags), compiler_version, target])
    return cache_dir() / f"fineline-{hashlib.sha256(text.encode()).hexdigest()[:16]}.so"


def _build(compiler: str, flags: tuple[str, ...], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        subprocess.run(
            [compiler, *flags, *(str(KERNELS / f) for f in SOURCES), "-o", tmp],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load(compiler: str, version: str, flags: tuple[str, ...]) -> CpuKernels:
    """The library built with ``flags``, from the cache or built now."""
    path = library_path(flags, version)
    if not path.exists():
        _build(compiler, flags, path)
    return CpuKernels(ctypes.CDLL(str(path)), path, flags)


def reopen(path: str, flags: tuple[str, ...]) -> CpuKernels:
    """A built library loaded again (how a pickled :class:`CpuKernels` comes back)."""
    return CpuKernels(ctypes.CDLL(path), Path(path), tuple(flags))


def _first_line(e: BaseException) -> str:
    """What went wrong, in one line: the compiler's first line of errors, else its exit status."""
    if isinstance(e, subprocess.CalledProcessError):
        lines = [line for line in str(e.stderr or "").splitlines() if line.strip()]
        return lines[0].strip() if lines else f"exit status {e.returncode}, no message"
    return str(e).splitlines()[0] if str(e) else type(e).__name__


@functools.cache
def cpu_kernels() -> CpuKernels | None:
    """This process's kernels, built on first use; None where they are off or cannot be
    built (see the module doc). Raises ConfigError for a bad setting (:func:`build_config`)."""
    cfg = build_config()
    if not cfg.enabled:
        return None
    compiler = shutil.which(cfg.compiler) or shutil.which("gcc")
    if compiler is None:
        warnings.warn(
            f"fineline: no C compiler found ({cfg.compiler}, gcc; set {CC_VAR}): the seq2seq "
            "model runs as torch ops, about 1.5x slower on a CPU. Install gcc to build its "
            "fused kernels.",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    try:
        version = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, timeout=30
        ).stdout
        try:
            return _load(compiler, version, cfg.flags)
        except subprocess.CalledProcessError as e:
            native = [f for f in cfg.flags if f in NATIVE_FLAGS]
            if not native:
                raise
            warnings.warn(
                f"fineline: building the CPU kernels with {' '.join(native)} failed "
                f"({_first_line(e)}); building them without it (portable; set {PORTABLE_VAR}=1 "
                "to skip the attempt).",
                RuntimeWarning,
                stacklevel=2,
            )
            return _load(compiler, version, tuple(f for f in cfg.flags if f not in NATIVE_FLAGS))
    except (OSError, subprocess.SubprocessError) as e:
        warnings.warn(
            f"fineline: building the fused CPU kernels with {compiler} failed ({_first_line(e)}); "
            f"the seq2seq model runs as torch ops. Set {SWITCH}=0 to skip the attempt.",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


def applicable(kern: KernelChoice, x: torch.Tensor, hidden: int = 1) -> CpuKernels | None:
    """The kernels a call on ``x`` runs: ``kern`` (``"default"``: :func:`cpu_kernels`) where
    ``x`` is float32 on a CPU and a cell has at most :data:`MAX_HIDDEN` units, else None
    (torch ops: CUDA, float64, or no kernels)."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or hidden > MAX_HIDDEN:
        return None
    return cpu_kernels() if isinstance(kern, str) else kern


def choice_name(kern: CpuKernels | None, like: torch.Tensor) -> str:
    """How a model holding ``kern`` computes with parameters like ``like``: ``c`` (the
    compiled kernels) or ``torch`` (its ops: no kernels, or CUDA, or float64)."""
    return "c" if kern is not None and applicable(kern, like) is not None else "torch"


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
