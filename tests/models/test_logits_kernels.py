"""The compiled output-layer and attention kernels (trainables/models/kernels/logits.c,
output.c, attention.c) against torch's ops: cross-entropy and its gradient, the training
output layer, hits, decoding attention, and a row's bits alone or inside a block (what bundle = lone run
needs)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from trainables.models import ckernels
from trainables.models.seq2seq.logits import cross_entropy, linear_cross_entropy
from trainables.models.seq2seq.stepper import attend_one

IGNORE = -100


@pytest.fixture(autouse=True)
def _one_thread(torch_threads: None) -> Iterator[None]:
    yield


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def logits_case(m: int, v: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, v, generator=gen) * 4
    target = torch.randint(0, v, (m,), generator=gen)
    target[::5] = IGNORE  # token-list padding
    return x, target


@pytest.mark.parametrize("v", [7, 16, 243])
def test_cross_entropy_and_its_gradient_equal_torchs(v: int, kernels: str) -> None:
    x, target = logits_case(40, v)
    up = torch.randn(40, generator=torch.Generator().manual_seed(3))
    xa = x.clone().requires_grad_()
    ce, hit = cross_entropy(xa, target, IGNORE, hits=True)
    (ce * up).sum().backward()
    xb = x.clone().requires_grad_()
    want = F.cross_entropy(xb, target, ignore_index=IGNORE, reduction="none")
    (want * up).sum().backward()
    assert xa.grad is not None and xb.grad is not None
    assert rel(ce.detach(), want.detach()) < 1e-6 and rel(xa.grad, xb.grad) < 1e-6
    assert torch.count_nonzero(ce[::5]) == 0 and torch.count_nonzero(xa.grad[::5]) == 0
    assert hit is not None and torch.equal(hit, (x.argmax(-1) == target) & (target != IGNORE))
    assert rel(xa.grad, xb.grad * 1.0001) > 5e-5  # the comparison can fail
    with torch.no_grad():  # evaluation: same values, no graph
        ce_eval, hit_eval = cross_entropy(x, target, IGNORE, hits=True)
    assert torch.allclose(ce_eval, ce.detach(), rtol=1e-6, atol=1e-6)
    assert hit_eval is not None and torch.equal(hit_eval, hit)


def test_hits_need_the_first_maximum_to_be_the_target(kernels: str) -> None:
    x = torch.zeros(3, 20)
    x[:, [2, 17]] = 5.0  # a tie: argmax is 2
    target = torch.tensor([2, 17, IGNORE])
    with torch.no_grad():
        _, hit = cross_entropy(x, target, IGNORE, hits=True)
    assert hit is not None and hit.tolist() == [True, False, False]


def test_a_rows_loss_and_gradient_do_not_depend_on_its_block() -> None:
    """Bit-identical alone or as row 5 of 9, forward and backward (fused kernels)."""
    if ckernels.cpu_kernels() is None:
        pytest.skip("no working C compiler")
    x, target = logits_case(9, 243, seed=4)
    target[5] = 11

    def run(rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        xr = x[rows].clone().requires_grad_()
        ce, _ = cross_entropy(xr, target[rows], IGNORE)
        ce.sum().backward()
        assert xr.grad is not None
        return ce.detach(), xr.grad

    (ce_all, g_all), (ce_one, g_one) = run(slice(0, 9)), run(slice(5, 6))
    assert torch.equal(ce_all[5:6], ce_one) and torch.equal(g_all[5:6], g_one)


def output_layer_case(k: int, n: int, seed: int = 0, v: int = 243) -> tuple[torch.Tensor, ...]:
    """u (K, N, 32), w (K, 32, V), b (K, 1, V), target (K, N) with ignored rows, and the
    upstream gradient (K, N)."""
    gen = torch.Generator().manual_seed(seed)
    u, w = torch.randn(k, n, 32, generator=gen), torch.randn(k, 32, v, generator=gen) * 0.3
    b = torch.randn(k, 1, v, generator=gen)
    target = torch.randint(0, v, (k, n), generator=gen)
    target[:, ::7] = IGNORE
    return u, w, b, target, torch.randn(k, n, generator=gen)


def output_layer_grads(
    u: torch.Tensor, w: torch.Tensor, b: torch.Tensor, target: torch.Tensor, up: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """ce and the gradients of sum(ce * up) with respect to u, w and b."""
    ua, wa, ba = (x.clone().requires_grad_() for x in (u, w, b))
    ce, _ = linear_cross_entropy(ua, wa, ba, target, IGNORE)
    (ce * up).sum().backward()
    assert ua.grad is not None and wa.grad is not None and ba.grad is not None
    return ce.detach(), ua.grad, wa.grad, ba.grad


@pytest.mark.parametrize("v", [243, 16, 37])
def test_output_layer_and_its_gradients_equal_torchs_ops(v: int, kernels: str) -> None:
    """300 tokens per member (with the C kernels: blocks of 16 rows forward and 32 backward,
    the last ones partial; the vocabulary a whole number of vectors or not)."""
    u, w, b, target, up = output_layer_case(2, 300, v=v)
    got = output_layer_grads(u, w, b, target, up)
    ub, wb, bb = (x.clone().requires_grad_() for x in (u, w, b))
    logits = torch.baddbmm(bb, ub, wb)
    want = F.cross_entropy(logits.view(600, v), target.view(-1), ignore_index=IGNORE, reduction="none")
    (want.view(2, 300) * up).sum().backward()
    assert ub.grad is not None and wb.grad is not None and bb.grad is not None
    ce, du, dw, db = got
    assert rel(ce, want.view(2, 300).detach()) < 1e-6
    assert rel(du, ub.grad) < 1e-6 and rel(dw, wb.grad) < 1e-5 and rel(db, bb.grad) < 1e-5
    assert torch.count_nonzero(ce[:, ::7]) == 0 and torch.count_nonzero(du[:, ::7]) == 0
    assert rel(dw, wb.grad * 1.0001) > 5e-5  # the comparison can fail
    with torch.no_grad():  # evaluation: chunks sized by EVAL_CHUNK_FLOATS, with hits
        ce_eval, hit = linear_cross_entropy(u, w, b, target, IGNORE, hits=True)
    assert rel(ce_eval, ce) < 1e-6
    assert hit is not None and torch.equal(hit, (logits.argmax(-1) == target) & (target != IGNORE))


def test_a_members_output_layer_does_not_depend_on_the_bundles_padding() -> None:
    """Alone (200 tokens) or as member 0 beside one with 300 (its tail padded with ignored
    targets, so the blocks run past its end): the same loss and gradients, bit for bit."""
    if ckernels.cpu_kernels() is None:
        pytest.skip("no working C compiler")
    u, w, b, target, up = output_layer_case(2, 300, seed=5)
    target[0, 200:] = IGNORE
    ce, du, dw, db = output_layer_grads(u, w, b, target, up)
    one = output_layer_grads(u[:1, :200], w[:1], b[:1], target[:1, :200], up[:1, :200])
    assert torch.equal(ce[:1, :200], one[0]) and torch.equal(du[:1, :200], one[1])
    assert torch.equal(dw[:1], one[2]) and torch.equal(db[:1], one[3])


def test_the_output_layer_refuses_a_second_backward() -> None:
    """Its backward overwrites the saved softmax with the gradient: a second pass over the
    same graph must fail loudly, not return garbage."""
    if ckernels.cpu_kernels() is None:
        pytest.skip("no working C compiler")
    u, w, b, target, _ = output_layer_case(1, 20)
    ce, _ = linear_cross_entropy(u.requires_grad_(), w, b, target, IGNORE)
    ce.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="retain_graph"):
        ce.sum().backward()


def attention_case(seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    r, s, d, e = 12, 7, 32, 20
    keys, q = torch.randn(r, s, d, generator=gen), torch.randn(r, d, generator=gen)
    enc = torch.randn(r, s, e, generator=gen)
    lengths = torch.randint(1, s + 1, (r,), generator=gen)
    masked = torch.arange(s) >= lengths[:, None]
    bias = torch.zeros(r, s).masked_fill_(masked, float("-inf"))
    return keys, q, bias, enc, masked


def test_decoding_attention_equals_softmax_attention(kernels: str) -> None:
    """Masked positions get no weight: huge encoder values there change nothing."""
    keys, q, bias, enc, masked = attention_case()
    enc_poisoned = enc.masked_fill(masked[..., None], 1e30)
    keys_t = keys.transpose(1, 2)
    got = attend_one(keys_t, q, bias, enc_poisoned)
    p = torch.softmax((keys @ q[..., None]).squeeze(-1) + bias, -1)  # (R, S)
    want = (p[..., None] * enc).sum(1)
    assert got.shape == want.shape and rel(got, want) < 1e-6
    assert rel(attend_one(keys_t, q * 1.001, bias, enc), want) > 1e-5  # it can fail


def test_a_rows_attention_does_not_depend_on_its_block() -> None:
    if ckernels.cpu_kernels() is None:
        pytest.skip("no working C compiler")
    keys, q, bias, enc, _ = attention_case(seed=2)
    keys_t = keys.transpose(1, 2)
    block = attend_one(keys_t, q, bias, enc)
    alone = attend_one(keys_t[4:5], q[4:5], bias[4:5], enc[4:5])
    assert torch.equal(block[4:5], alone)
