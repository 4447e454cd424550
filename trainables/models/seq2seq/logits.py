"""The output layer's row-wise ops: cross-entropy (with its gradient) and argmax.

Logits are ``(M, V)`` rows (M tokens or hypotheses, V target symbols). On a CPU (float32)
each op is one pass of the compiled C kernel per row (:mod:`ckernels`,
``kernels/logits.c``): in training the loss reads the logits once and keeps each row's
softmax, and its gradient ``g (softmax - onehot)`` is one more pass, with no ``exp``. torch's
``cross_entropy`` makes five passes over the logits in training (``log_softmax``, the
``nll`` gradient's zero fill and scatter, ``log_softmax``'s backward). Elsewhere (CUDA,
float64, no compiler) these are torch's ops; the two agree to float rounding (~1e-7
relative, tested). Targets equal to ``ignore`` get loss 0, no gradient and no hit.

:func:`linear_cross_entropy` is the whole output layer, ``u @ w + b`` then the loss. In
training with the C kernels (``kernels/output.c``) it is one call each way that makes a
block of tokens' logits, loss and gradients while they are in cache (a K=8
symbol-rewriting step 56.2 -> 53.3 ms against chunks of ``bmm`` calls and the loss kernel,
which had taken 15.4 ms instead of one pass of torch's ops' 21.7 ms, on one AMD EPYC core).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from trainables.models.ckernels import CpuKernels, KernelChoice, applicable, padded_output_layer

EVAL_CHUNK_FLOATS = 1 << 18
"""Logits held at once when computing evaluation losses (1 MiB of float32)."""


class _CrossEntropy(torch.autograd.Function):
    """ce (M,) of logits (M, V) contiguous against target (M,) int64, with the C kernels
    ``kern``: the forward keeps each row's softmax as ``e = exp(x - max)`` and ``1 / sum(e)``,
    so the backward is ``g (e / sum(e) - onehot)``, with no ``exp``."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, ignore: int, kern: CpuKernels) -> torch.Tensor:  # type: ignore[override]
        m = logits.shape[0]
        ce, e, inv = logits.new_empty(m), torch.empty_like(logits), logits.new_empty(m)
        kern.softmax_ce(logits, target, ignore, ce, e, inv)
        ctx.kern, ctx.ignore = kern, ignore
        ctx.save_for_backward(e, inv, target)
        return ce

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:  # type: ignore[override]
        e, inv, target = ctx.saved_tensors
        d = torch.empty_like(e)
        ctx.kern.ce_grad(e, inv, target, ctx.ignore, grad.contiguous(), d)
        return d, None, None, None


class _OutputLayer(torch.autograd.Function):
    """ce (K, N) of the logits ``u @ w + b`` (u (K, N, D), w (K, D, V), b (K, 1, V)) against
    target (K, N), with the C kernels (``kernels/output.c``): the forward makes a block of
    tokens' logits and their loss while they are in cache and keeps the softmax numerators;
    the backward turns them into the logits' gradient in place and multiplies it out into
    du, dw and db, block by block. A member's gradients are summed over its own tokens in
    order, so they do not depend on the bundle."""

    @staticmethod
    def forward(ctx: Any, u: torch.Tensor, w: torch.Tensor, b: torch.Tensor, target: torch.Tensor, ignore: int, kern: CpuKernels) -> torch.Tensor:  # type: ignore[override]
        k, n, _ = u.shape
        v = w.shape[2]
        u = u.contiguous()
        w_pad, b_pad = padded_output_layer(w, b)
        ce, e, inv = u.new_empty(k, n), u.new_empty(k, n, v), u.new_empty(k, n)
        kern.out_fwd(u, w_pad, b_pad, v, target, ignore, ce, e, inv)
        ctx.kern, ctx.ignore, ctx.e = kern, ignore, e
        ctx.save_for_backward(u, w, target, inv)
        return ce

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None, None]:  # type: ignore[override]
        u, w, target, inv = ctx.saved_tensors
        e, ctx.e = ctx.e, None
        if e is None:
            raise RuntimeError(
                "the output layer's backward ran twice: it turns its saved softmax into "
                "the gradient in place. Fix: compute the loss again instead of retain_graph"
            )
        k, _, d = u.shape
        v = w.shape[2]
        g = grad.contiguous()
        w_t = w.transpose(1, 2).contiguous()  # (K, V, D): the parameter's own layout
        du, dw_t, db = torch.empty_like(u), u.new_zeros(k, v, d), u.new_zeros(k, 1, v)
        ctx.kern.out_bwd(u, w_t, target, ctx.ignore, g, e, inv, du, dw_t, db)
        return du, dw_t.transpose(1, 2), db, None, None, None


def linear_cross_entropy(
    u: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor,
    target: torch.Tensor,
    ignore: int,
    hits: bool = False,
    kern: KernelChoice = "default",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Cross-entropy (K, N) of the logits ``u @ w + b`` (u (K, N, D), w (K, D, V), b (K, 1,
    V)) against target (K, N) (0 where ``ignore``), differentiable; with ``hits`` also
    whether target is the argmax (K, N) bool. ``kern``: the model's kernels (None: torch ops;
    :func:`~trainables.models.ckernels.applicable`).

    In training with the C kernels, one call each way (:class:`_OutputLayer`). Otherwise
    the bias is a weight row over a constant-1 feature (its gradient is then a gemm
    reduction, which trailing token-list padding does not change, instead of a sum whose
    grouping depends on the padded length), and without autograd the logits are made about
    :data:`EVAL_CHUNK_FLOATS` at a time (evaluation: tens of thousands of tokens at once;
    2.4x faster than one pass).
    """
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in (u, w, b))
    fused = applicable(kern, u)
    if grad and not hits and fused is not None:
        return _OutputLayer.apply(u, w, b, target.contiguous(), ignore, fused), None
    k, n, _ = u.shape
    v = w.shape[2]
    u = torch.cat([u, u.new_ones(k, n, 1)], -1)
    w = torch.cat([w, b], 1)
    step = n if grad else max(1, EVAL_CHUNK_FLOATS // (k * v))
    parts, hit_parts = [], []
    for n0 in range(0, n, step):
        logits = torch.bmm(u[:, n0 : n0 + step], w)  # (K, C, V)
        c = logits.shape[1]
        ce, hit = cross_entropy(logits.view(k * c, v), target[:, n0 : n0 + step].reshape(-1), ignore, hits, fused)
        parts.append(ce.view(k, c))
        if hit is not None:
            hit_parts.append(hit.view(k, c))
    ce_all = parts[0] if len(parts) == 1 else torch.cat(parts, 1)
    return ce_all, torch.cat(hit_parts, 1) if hits else None


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore: int,
    hits: bool = False,
    kern: KernelChoice = "default",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Cross-entropy per row (M,) of logits (M, V) against target (M,) (0 where ``ignore``),
    differentiable; with ``hits`` also whether target is the row's argmax (M,) bool (the
    first maximum, as torch's argmax). ``kern`` as :func:`linear_cross_entropy`'s."""
    fused = applicable(kern, logits)
    if fused is None:
        ce = F.cross_entropy(logits, target, ignore_index=ignore, reduction="none")
        return ce, (argmax_last(logits, None) == target) if hits else None
    logits, target = logits.contiguous(), target.contiguous()
    if not (torch.is_grad_enabled() and logits.requires_grad):
        m = logits.shape[0]
        ce = logits.new_empty(m)
        hit = torch.empty(m, dtype=torch.bool) if hits else None
        fused.ce(logits, target, ignore, ce, hit)
        return ce, hit
    ce = _CrossEntropy.apply(logits, target, ignore, fused)
    return ce, (argmax_last(logits.detach(), fused) == target) if hits else None


def argmax_last(x: torch.Tensor, kern: KernelChoice = "default") -> torch.Tensor:
    """``x.argmax(-1)`` (the first maximum; a NaN counts as the maximum), faster on a CPU.

    With the C kernel (``kern``, as :func:`linear_cross_entropy`'s): one pass per row. Without it, torch's CPU argmax scans each row
    serially (~1 ns per element, as does a comparison into ``bool``); then the row maxima
    come from a vectorised ``amax``, the 0/1 "is a maximum" matrix is written as floats,
    and the index is its product with ``0 .. V-1``; rows with other than one maximum
    (ties, NaN) fall back to ``argmax`` (1.7x faster than ``argmax`` at (2048, 243)).
    """
    if x.is_cuda or x.dtype not in (torch.float32, torch.float64):
        return x.argmax(-1)
    v = x.shape[-1]
    rows = x.reshape(-1, v)
    fused = applicable(kern, x)
    if fused is not None:
        rows = rows.contiguous()
        index = torch.empty(rows.shape[0], dtype=torch.int64)
        fused.argmax(rows, index)
        return index.view(x.shape[:-1])
    hit = torch.eq(rows, rows.amax(-1, keepdim=True), out=torch.empty_like(rows))  # (M, V)
    index = torch.mv(hit, torch.arange(v, dtype=x.dtype)).long()
    odd = hit.sum(-1) != 1
    if bool(odd.any()):
        index[odd] = rows[odd].argmax(-1)
    return index.view(x.shape[:-1])
