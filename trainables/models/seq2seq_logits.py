"""The output layer's row-wise ops: cross-entropy (with its gradient) and argmax.

Logits are ``(M, V)`` rows (M tokens or hypotheses, V target symbols). On a CPU (float32)
each op is one pass of the compiled C kernel per row (:mod:`ckernels`,
``kernels/logits.c``): in training the loss reads the logits once and keeps each row's
softmax, and its gradient ``g (softmax - onehot)`` is one more pass, with no ``exp``. torch's
``cross_entropy`` makes five passes over the logits in training (``log_softmax``, the
``nll`` gradient's zero fill and scatter, ``log_softmax``'s backward). Elsewhere (CUDA,
float64, no compiler) these are torch's ops; the two agree to float rounding (~1e-7
relative, tested). Targets equal to ``ignore`` get loss 0, no gradient and no hit.

:func:`linear_cross_entropy` is the whole output layer, ``u @ w`` then the loss, made a
cache-sized chunk of tokens at a time, so the logits are used while they are in cache:
in training the forward and the backward (its two gemms included) took 15.4 ms instead
of 21.7 ms for a K=8 symbol-rewriting batch on one AMD EPYC core.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from trainables.models.ckernels import ptr, usable

TRAIN_CHUNK_ROWS = 128
"""Tokens per member in one chunk of the training output layer. Fixed, not derived from K:
the weight gradient is summed chunk by chunk, so a lone run must cut where a bundle does."""
EVAL_CHUNK_FLOATS = 1 << 18
"""Logits held at once when computing evaluation losses (1 MiB of float32)."""


class _CrossEntropy(torch.autograd.Function):
    """ce (M,) of logits (M, V) contiguous against target (M,) int64, with the C kernels:
    the forward keeps each row's softmax as ``e = exp(x - max)`` and ``1 / sum(e)``, so the
    backward is ``g (e / sum(e) - onehot)``, with no ``exp``."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, ignore: int) -> torch.Tensor:  # type: ignore[override]
        kern = usable(logits)
        assert kern is not None
        m, v = logits.shape
        ce, e, inv = logits.new_empty(m), torch.empty_like(logits), logits.new_empty(m)
        kern.softmax_ce(m, v, ptr(logits), ptr(target), ignore, ptr(ce), ptr(e), ptr(inv))
        ctx.kern, ctx.ignore = kern, ignore
        ctx.save_for_backward(e, inv, target)
        return ce

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        e, inv, target = ctx.saved_tensors
        m, v = e.shape
        grad = grad.contiguous()
        d = torch.empty_like(e)
        ctx.kern.ce_grad(m, v, ptr(e), ptr(inv), ptr(target), ctx.ignore, ptr(grad), ptr(d))
        return d, None, None


class _LinearCrossEntropy(torch.autograd.Function):
    """ce (K, N) of logits ``u @ w`` (u (K, N, D), w (K, D, V)) against target (K, N), with
    the C kernels, :data:`TRAIN_CHUNK_ROWS` tokens per member at a time. The forward keeps
    each chunk's softmax numerators (as :class:`_CrossEntropy`); the backward turns them
    into the logits' gradient in place and multiplies it out while it is in cache. The
    weight gradient is summed over the chunks in order."""

    @staticmethod
    def forward(ctx: Any, u: torch.Tensor, w: torch.Tensor, target: torch.Tensor, ignore: int) -> torch.Tensor:  # type: ignore[override]
        kern = usable(u)
        assert kern is not None
        k, n, _ = u.shape
        v = w.shape[2]
        ce, inv = u.new_empty(k, n), u.new_empty(k, n)
        kept = []
        for n0 in range(0, n, TRAIN_CHUNK_ROWS):
            c = min(TRAIN_CHUNK_ROWS, n - n0)
            logits = torch.bmm(u[:, n0 : n0 + c], w)  # (K, C, V)
            t = target[:, n0 : n0 + c].contiguous()
            e, ce_c, inv_c = torch.empty_like(logits), u.new_empty(k, c), u.new_empty(k, c)
            kern.softmax_ce(k * c, v, ptr(logits), ptr(t), ignore, ptr(ce_c), ptr(e), ptr(inv_c))
            ce[:, n0 : n0 + c] = ce_c
            inv[:, n0 : n0 + c] = inv_c
            kept.append(e)
        ctx.kern, ctx.ignore, ctx.kept = kern, ignore, kept
        ctx.save_for_backward(u, w, target, inv)
        return ce

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:  # type: ignore[override]
        u, w, target, inv = ctx.saved_tensors
        kept, ctx.kept = ctx.kept, None
        if kept is None:
            raise RuntimeError(
                "linear_cross_entropy's backward ran twice: it turns its saved softmax into "
                "the gradient in place. Fix: compute the loss again instead of retain_graph"
            )
        k, n, _ = u.shape
        v = w.shape[2]
        du, dw = torch.empty_like(u), torch.zeros_like(w)
        w_t = w.transpose(1, 2)  # (K, V, D)
        for i, n0 in enumerate(range(0, n, TRAIN_CHUNK_ROWS)):
            d = kept[i]  # (K, C, V): the softmax numerators, overwritten by the gradient
            c = d.shape[1]
            t, g, inv_c = (x[:, n0 : n0 + c].contiguous() for x in (target, grad, inv))
            ctx.kern.ce_grad(k * c, v, ptr(d), ptr(inv_c), ptr(t), ctx.ignore, ptr(g), ptr(d))
            du[:, n0 : n0 + c] = torch.bmm(d, w_t)
            dw.baddbmm_(u[:, n0 : n0 + c].transpose(1, 2), d)
        return du, dw, None, None


def linear_cross_entropy(
    u: torch.Tensor, w: torch.Tensor, target: torch.Tensor, ignore: int, hits: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Cross-entropy (K, N) of the logits ``u @ w`` (u (K, N, D), w (K, D, V)) against
    target (K, N) (0 where ``ignore``), differentiable; with ``hits`` also whether target is
    the argmax (K, N) bool.

    The logits are made a chunk of tokens at a time and never held whole: in training
    :data:`TRAIN_CHUNK_ROWS` per member (with the C kernels), without autograd about
    :data:`EVAL_CHUNK_FLOATS` of them (evaluation: tens of thousands of tokens at once;
    2.4x faster than one pass).
    """
    k, n, _ = u.shape
    v = w.shape[2]
    grad = torch.is_grad_enabled() and (u.requires_grad or w.requires_grad)
    if grad and not hits and usable(u) is not None:
        return _LinearCrossEntropy.apply(u, w, target.contiguous(), ignore), None
    step = n if grad else max(1, EVAL_CHUNK_FLOATS // (k * v))
    parts, hit_parts = [], []
    for n0 in range(0, n, step):
        logits = torch.bmm(u[:, n0 : n0 + step], w)  # (K, C, V)
        c = logits.shape[1]
        ce, hit = cross_entropy(logits.view(k * c, v), target[:, n0 : n0 + step].reshape(-1), ignore, hits)
        parts.append(ce.view(k, c))
        if hit is not None:
            hit_parts.append(hit.view(k, c))
    ce_all = parts[0] if len(parts) == 1 else torch.cat(parts, 1)
    return ce_all, torch.cat(hit_parts, 1) if hits else None


def cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, ignore: int, hits: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Cross-entropy per row (M,) of logits (M, V) against target (M,) (0 where ``ignore``),
    differentiable; with ``hits`` also whether target is the row's argmax (M,) bool (the
    first maximum, as torch's argmax)."""
    kern = usable(logits)
    if kern is None:
        ce = F.cross_entropy(logits, target, ignore_index=ignore, reduction="none")
        return ce, (argmax_last(logits) == target) if hits else None
    logits, target = logits.contiguous(), target.contiguous()
    if not (torch.is_grad_enabled() and logits.requires_grad):
        m, v = logits.shape
        ce = logits.new_empty(m)
        hit = torch.empty(m, dtype=torch.bool) if hits else None
        kern.ce(m, v, ptr(logits), ptr(target), ignore, ptr(ce), None if hit is None else ptr(hit))
        return ce, hit
    ce = _CrossEntropy.apply(logits, target, ignore)
    return ce, (argmax_last(logits.detach()) == target) if hits else None


def argmax_last(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(-1)`` (the first maximum; a NaN counts as the maximum), faster on a CPU.

    With the C kernel: one pass per row. Without it, torch's CPU argmax scans each row
    serially (~1 ns per element, as does a comparison into ``bool``); then the row maxima
    come from a vectorised ``amax``, the 0/1 "is a maximum" matrix is written as floats,
    and the index is its product with ``0 .. V-1``; rows with other than one maximum
    (ties, NaN) fall back to ``argmax`` (1.7x faster than ``argmax`` at (2048, 243)).
    """
    if x.is_cuda or x.dtype not in (torch.float32, torch.float64):
        return x.argmax(-1)
    v = x.shape[-1]
    rows = x.reshape(-1, v)
    kern = usable(x)
    if kern is not None:
        rows = rows.contiguous()
        index = torch.empty(rows.shape[0], dtype=torch.int64)
        kern.argmax(rows.shape[0], v, ptr(rows), ptr(index))
        return index.view(x.shape[:-1])
    hit = torch.eq(rows, rows.amax(-1, keepdim=True), out=torch.empty_like(rows))  # (M, V)
    index = torch.mv(hit, torch.arange(v, dtype=x.dtype)).long()
    odd = hit.sum(-1) != 1
    if bool(odd.any()):
        index[odd] = rows[odd].argmax(-1)
    return index.view(x.shape[:-1])
