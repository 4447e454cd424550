"""Fixtures shared by the model tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from trainables.models import ckernels


@pytest.fixture(params=["fused", "torch_ops"])
def kernels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The fast seq2seq model's CPU kernels (LSTM cell, logits, decoding attention):
    compiled C (``fused``) or torch ops (the path CUDA and compiler-less CPUs take)."""
    monkeypatch.setenv(ckernels.SWITCH, "1" if request.param == "fused" else "0")
    ckernels.cpu_kernels.cache_clear()
    if request.param == "fused" and ckernels.cpu_kernels() is None:
        pytest.skip("no working C compiler: the fused kernels are unavailable")
    yield request.param
    ckernels.cpu_kernels.cache_clear()
