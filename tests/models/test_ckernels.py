"""The compiled LSTM cell (trainables/models/kernels/lstm_cell.c) against the torch-ops cell,
skipping ended rows, its build cache and its fallback where no compiler works."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from trainables.models import ckernels
from trainables.models.ckernels import cpu_kernels
from trainables.models.seq2seq.cells import lstm_sequence
from trainables.models.seq2seq.layout import active_rows
from trainables.runtime import keep_freed_memory


@pytest.fixture(autouse=True)
def _fresh_kernels(torch_threads: None) -> Iterator[None]:
    """Each test looks the kernels up anew, and leaves no cached answer behind."""
    cpu_kernels.cache_clear()
    yield
    cpu_kernels.cache_clear()


def kernels() -> ckernels.CpuKernels:
    kern = cpu_kernels()
    if kern is None:
        pytest.skip("no working C compiler: the fused kernels are unavailable")
    return kern


def run_cell(
    fused: bool, monkeypatch: pytest.MonkeyPatch, shape: tuple[int, int, int, int],
    active: tuple[int, ...] | None = None,
    live: tuple[int, ...] | None = None,
) -> list[torch.Tensor]:
    """hs, cs and the gradients of x, w_ih, bias, w_hh, h0, c0 for fixed random inputs (E =
    H + 3); the upstream gradient is zero on rows past ``live`` (as the model's is on ended
    sequences)."""
    monkeypatch.setenv(ckernels.SWITCH, "1" if fused else "0")
    cpu_kernels.cache_clear()
    k, t, b, h = shape
    g = torch.Generator().manual_seed(0)
    x = torch.randn(k, t, b, h + 3, generator=g).requires_grad_()
    w_ih = (torch.randn(k, 4 * h, h + 3, generator=g) * 0.5).requires_grad_()
    bias = torch.randn(k, 1, 4 * h, generator=g).requires_grad_()
    w = (torch.randn(k, 4 * h, h, generator=g) * 0.5).requires_grad_()
    h0 = torch.randn(k, b, h, generator=g).requires_grad_()
    c0 = torch.randn(k, b, h, generator=g).requires_grad_()
    up_h, up_c = torch.randn(k, t, b, h, generator=g), torch.randn(k, t, b, h, generator=g)
    if live is not None:
        keep = torch.zeros(1, t, b, 1)
        for step, n in enumerate(live):
            keep[:, step, :n] = 1.0
        up_h, up_c = up_h * keep, up_c * keep
    hs, cs = lstm_sequence(x, w_ih, w, h0, c0, active, bias)
    ((hs * up_h).sum() + (cs * up_c).sum()).backward()
    grads = [x.grad, w_ih.grad, bias.grad, w.grad, h0.grad, c0.grad]
    assert all(gr is not None for gr in grads)
    return [hs.detach(), cs.detach(), *grads]  # type: ignore[list-item]


NAMES = ["hs", "cs", "d_x", "d_w_ih", "d_bias", "d_w_hh", "d_h0", "d_c0"]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("shape", [(3, 7, 5, 4), (2, 6, 9, 32), (1, 5, 3, 37)])
def test_fused_cell_equals_the_torch_ops_cell(
    shape: tuple[int, int, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forward states and every gradient, H below, at and above one vector width."""
    kernels()
    fused = run_cell(True, monkeypatch, shape)
    ops = run_cell(False, monkeypatch, shape)
    for name, a, b in zip(NAMES, fused, ops, strict=True):
        assert rel(a, b) < 2e-6, name
    assert rel(fused[5], ops[5] * 1.0001) > 5e-5  # the comparison can fail


def test_skipping_ended_rows_changes_no_live_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``active`` the fused cell computes only each step's row prefix: the live
    positions and all gradients equal the full computation's, skipped positions are 0."""
    kernels()
    shape = (3, 6, 5, 8)
    active = (5, 5, 4, 2, 2, 1)
    part = run_cell(True, monkeypatch, shape, active, live=active)
    full = run_cell(True, monkeypatch, shape, None, live=active)
    live = torch.zeros(1, 6, 5, 1, dtype=torch.bool)
    for step, n in enumerate(active):
        live[:, step, :n] = True
    for a, b in zip(part[:2], full[:2], strict=True):
        assert rel(a * live, b * live) < 1e-6
        assert torch.count_nonzero(a * ~live) == 0
    for name, a, b in zip(NAMES[2:], part[2:], full[2:], strict=True):
        assert rel(a, b) < 1e-6, name


def layer_outputs(
    x: torch.Tensor, bias: torch.Tensor, w: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor,
    up: torch.Tensor, active: tuple[int, ...] | None = None,
) -> dict[str, torch.Tensor]:
    """The compiled layer's outputs and gradients for upstream gradient ``up`` on hs; W_ih
    is ``w`` (K, 4H, H) again, so the inputs x are (K, T, B, H)."""
    x, bias, h0, c0 = (v.clone().requires_grad_() for v in (x, bias, h0, c0))
    hs, cs = lstm_sequence(x, w, w, h0, c0, active, bias)
    (hs * up).sum().backward()
    grads = {"d_x": x.grad, "d_bias": bias.grad, "d_h0": h0.grad, "d_c0": c0.grad}
    present = {k: v for k, v in grads.items() if v is not None}
    return {"hs": hs.detach(), "cs": cs.detach(), **present}


@pytest.mark.parametrize("hidden", [5, 32])
def test_a_rows_result_does_not_depend_on_its_place(hidden: int) -> None:
    """What a bundle member's bit-identity to its lone run needs, from the compiled layer:
    a row gives the same bits computed alone or as the 4th of a block of 7 (rows run in
    pairs there), a member the same bits alone or as the 2nd of 3, and trailing steps with
    no live row change no bias gradient bit (H = 5 runs the scalar remainders)."""
    kernels()
    g = torch.Generator().manual_seed(1)
    k, t, b, h = 3, 4, 7, hidden
    xs = torch.randn(k, t, b, h, generator=g) * 2
    bias = torch.randn(k, 1, 4 * h, generator=g)
    w = torch.randn(k, 4 * h, h, generator=g) * 0.5
    h0, c0 = torch.randn(k, b, h, generator=g), torch.randn(k, b, h, generator=g)
    up = torch.randn(k, t, b, h, generator=g)

    def take(x: torch.Tensor, member: slice, rows: slice) -> torch.Tensor:
        return (x[member, :, rows] if x.dim() == 4 else x[member, rows]).contiguous()

    block = layer_outputs(xs[1:2], bias[1:2], w[1:2], h0[1:2], c0[1:2], up[1:2])
    row = slice(3, 4)
    one = [take(v, slice(1, 2), row) for v in (xs, h0, c0, up)]
    alone = layer_outputs(one[0], bias[1:2], w[1:2], one[1], one[2], one[3])
    for name in ("hs", "cs", "d_x", "d_h0", "d_c0"):
        got = take(block[name], slice(0, 1), row)
        assert torch.equal(got, alone[name]), name

    bundle = layer_outputs(xs, bias, w, h0, c0, up)
    for name in ("hs", "cs", "d_x", "d_bias", "d_h0", "d_c0"):
        assert torch.equal(bundle[name][1:2], block[name]), name
    assert rel(block["hs"], bundle["hs"][0:1]) > 1e-3  # members differ: the check can fail

    pad = torch.randn(1, 2, b, h, generator=g)  # two more steps in which no row is live
    longer = layer_outputs(torch.cat([xs[1:2], pad], 1), bias[1:2], w[1:2], h0[1:2], c0[1:2],
                           torch.cat([up[1:2], torch.zeros_like(pad)], 1), (b,) * t + (0, 0))
    assert torch.equal(longer["d_bias"], block["d_bias"])
    assert torch.equal(longer["hs"][:, :t], block["hs"])
    assert torch.count_nonzero(longer["hs"][:, t:]) == 0


def test_active_rows_of_a_hand_made_mask() -> None:
    # member 0: rows of lengths 3, 1, 0; member 1: 2, 2, 1 -> prefixes 2+1, 3, 1 rows
    lengths = np.array([[3, 1, 0], [2, 2, 1]])
    mask = np.arange(3) < lengths[..., None]  # (K, B, T)
    assert active_rows(mask) == (3, 2, 1)
    assert active_rows(np.zeros((1, 2, 2), dtype=bool)) == (0, 0)


def test_switch_turns_the_kernels_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ckernels.SWITCH, "0")
    assert cpu_kernels() is None
    assert ckernels.applicable("default", torch.zeros(1)) is None


def test_build_is_cached_per_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FINELINE_CACHE", str(tmp_path))
    first = kernels()
    built = sorted((tmp_path / "kernels").iterdir())
    assert [p.suffix for p in built] == [".so"] and first.path == built[0]
    stamp = built[0].stat().st_mtime_ns
    cpu_kernels.cache_clear()
    again = kernels()
    assert again.path == first.path and again.path.stat().st_mtime_ns == stamp  # not rebuilt
    assert ckernels.applicable(again, torch.zeros(1)) is again
    assert ckernels.applicable(again, torch.zeros(1, dtype=torch.float64)) is None  # float32 only
    assert ckernels.applicable(again, torch.zeros(1), ckernels.MAX_HIDDEN + 1) is None


def test_a_failing_compiler_warns_and_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FINELINE_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # exits 1: a compiler that cannot build anything
    for var in ("FINELINE_PORTABLE_KERNELS", "FINELINE_CFLAGS"):  # the native build is tried first
        monkeypatch.delenv(var, raising=False)
    with pytest.warns(RuntimeWarning) as record:
        assert cpu_kernels() is None
    said = [str(w.message) for w in record]
    # the native build fails, the portable retry fails too, then the fallback is named
    assert any("-march=native failed" in m for m in said) and "runs as torch ops" in said[-1]
    assert list((tmp_path / "kernels").iterdir()) == []  # no half-written library left
    xp, c0 = torch.randn(1, 1, 3, 8), torch.randn(1, 3, 2)  # one step, W_ih = I, W_hh = 0
    hs, cs = lstm_sequence(xp, torch.eye(8)[None], torch.zeros(1, 8, 2), torch.zeros(1, 3, 2), c0)
    o, i, f, _ = xp[0, 0].sigmoid().split(2, -1)  # gate order o, i, f, g
    c = f * c0[0] + i * xp[0, 0, :, 6:].tanh()
    assert rel(cs[0, 0], c) < 1e-6 and rel(hs[0, 0], o * c.tanh()) < 1e-6


def test_freed_memory_is_kept_on_linux() -> None:
    import sys

    assert keep_freed_memory() is sys.platform.startswith("linux")
