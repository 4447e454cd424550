"""Process settings of a training worker, made in one place.

A trial's process trains one bundle on ``threads`` CPU threads. Besides torch's thread
count it flushes denormals to zero (tiny gradients otherwise take a slow path) and, on
glibc, keeps freed memory for reuse instead of handing it back to the kernel: a training
step allocates tens of MB of short-lived activations, and without this each step's large
buffers come back as fresh pages, so writing them first costs a page fault per 4 KiB
(measured: a symbol-rewriting training step at K=8 took 69.5 ms without this, 65.5 ms
with it, medians of 5 x 30 steps). The process then
keeps its peak memory until it exits, as Ray's workers are meant to.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform
import sys
from pathlib import Path
from typing import Any

import torch

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
KEEP_BYTES = 1 << 30
"""Allocations below this come from the heap, and up to this much free heap is kept."""


def configure_worker(threads: int) -> None:
    """Set torch's thread count, flush denormals and keep freed memory (see module doc)."""
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    keep_freed_memory()


@functools.cache
def keep_freed_memory() -> bool:
    """glibc only (elsewhere a no-op returning False): raise malloc's mmap and trim
    thresholds so freed blocks are reused instead of unmapped. True when both were set."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_MMAP_THRESHOLD, KEEP_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP_BYTES))


def quiet_sigterm_in_callbacks() -> None:
    """In a Ray worker: do not print the ``SystemExit`` that Ray's SIGTERM handler raises
    when the signal lands inside a callback (a weakref's or a finalizer's) that cannot
    raise. Python then prints "Exception ignored in ..." with Ray's traceback, which the
    driver forwards to the user's terminal at the end of every interrupted study, though
    nothing failed (the exception is dropped either way). Other unraisable exceptions go to
    the hook that was there before."""
    before = sys.unraisablehook
    if getattr(before, "_fineline_quiet", False):
        return

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, SystemExit):
            return
        before(unraisable)

    hook._fineline_quiet = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


NUMERICS_VARS = ("MKL_CBWR",)
"""Environment settings of torch's CPU libraries that choose how floats round (the CPU
capability, ``ATEN_CPU_CAPABILITY``, shows in torch's own report)."""


@functools.cache
def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def numerics(device: torch.device | str) -> str:
    """What, besides the seeds, decides how this process's floats round: on a CPU its model,
    the code path torch's operators dispatch to, whether MKL is used and its ``MKL_CBWR``
    setting, and the thread count; on a GPU the card and whether TF32 is on. Recorded in
    each unit's ``trials`` row (``numerics``).

    A seed reproduces bit for bit only under the same numerics: training is chaotic, so a
    last-bit difference in one matrix product can decide whether a seed learns (measured:
    docs/performance.md, "The same numbers on another machine"), e.g.
    ``AMD EPYC; torch AVX512; MKL_CBWR unset; 1 thread``."""
    device = torch.device(device)
    if device.type == "cuda":
        tf32 = "on" if torch.backends.cuda.matmul.allow_tf32 else "off"
        return f"{torch.cuda.get_device_name(device)}; TF32 {tf32}"
    parts = [cpu_model(), f"torch {torch.backends.cpu.get_cpu_capability()}"]
    if torch.backends.mkl.is_available():
        parts += [f"{name} {os.environ.get(name) or 'unset'}" for name in NUMERICS_VARS]
    threads = torch.get_num_threads()
    parts.append(f"{threads} thread{'s' if threads != 1 else ''}")
    return "; ".join(parts)


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` (a CPU tensor) on ``device``. To a GPU through pinned memory and without
    waiting: a copy from pageable memory waits for every kernel queued before it, so a
    batch built on the host could not overlap the GPU's previous step."""
    device = torch.device(device)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
