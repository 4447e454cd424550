"""The fused training step of the fast RNN tagger (the trainer's optional fast-path hook).

One function does what the trainer's generic step does with autograd and a torch
optimizer: forward over the bundle, the hand-derived backward-through-time of
:mod:`trainables.models.rnn_tagger_cells`, per-member gradient-norm clipping (the
trainer's formula), and SGD or Adam over the stacked parameters with the same
arithmetic as ``torch.optim.SGD``/``Adam(foreach=False)`` (weight decay added to the
gradient as they do). Members whose ``active`` flag is false keep their parameters, Adam
moments and step count unchanged. Each member has its own Adam step count, so member k
updates exactly as a lone run would.

With ``compiled=True`` the function runs under ``torch.compile(fullgraph=True,
dynamic=False)``: batch-1 training is pure per-step overhead, and one compiled graph for
forward + backward + update removes most of it (cold compile 40-60 s per shape; ``T`` is
padded to ``meta["train_max_len"]`` so a run sees one shape).

The learning rate is a tensor input: set :attr:`FusedStep.lr` to change it without a
recompile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from trainables.models.rnn_tagger_cells import (
    Cell,
    Params,
    backward,
    loss_grad,
    loss_weights,
    readout,
    run,
    squared_error,
)

if TYPE_CHECKING:
    from trainables.models.rnn_tagger import RNNTagger, TagBatch


COMPILE_OPTIONS: dict[str, Any] = {"cpp_wrapper": True}
"""Inductor options of the compiled step: ``cpp_wrapper`` runs the graph's glue (hundreds of
small buffer allocations per step) in C++ instead of Python."""


@dataclass(frozen=True)
class OptimSpec:
    """The optimizer settings the fused step bakes in (from the trainer's train config)."""

    kind: str
    """``sgd`` or ``adam``."""
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    clip_norm: float | None


def loss_and_grads(
    cell: type[Cell], p: Params, x: Tensor, y: Tensor, mask: Tensor, reduction: str
) -> tuple[Tensor, Params]:
    """Per-member losses ``(K,)`` and parameter gradients, by the manual backward."""
    hs, trace = run(cell, p, x, keep=True)  # (K, B, T, H)
    assert trace is not None
    out = readout(p, hs)  # (K, B, T, O)
    w = loss_weights(mask, reduction, out.shape[-1])  # (K|1, B, T)
    losses = (w * squared_error(out, y, mask)).sum((1, 2))
    grads = backward(cell, p, x, hs, trace, loss_grad(out, y, mask, w))
    return losses, grads


def make_update(cell: type[Cell], reduction: str, opt: OptimSpec) -> Callable[..., Tensor]:
    """The fused step as a pure function that updates its state arguments in place."""

    def update(
        params: list[Tensor],
        exp_avg: list[Tensor],
        exp_avg_sq: list[Tensor],
        steps: Tensor,
        x: Tensor,
        y: Tensor,
        mask: Tensor,
        active: Tensor,
        lr: Tensor,
    ) -> Tensor:
        losses, grad_tuple = loss_and_grads(cell, Params(*params), x, y, mask, reduction)
        k = steps.shape[0]
        grads = list(grad_tuple)
        if opt.weight_decay != 0:
            grads = [g + opt.weight_decay * w for g, w in zip(grads, params, strict=True)]
        if opt.clip_norm is not None:  # the trainer's per-member clip
            sq = torch.stack([g.reshape(k, -1).pow(2).sum(1) for g in grads]).sum(0)  # (K,)
            coef = (opt.clip_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)  # (K,)
            grads = [g * coef.view(-1, *([1] * (g.dim() - 1))) for g in grads]
        new_steps = torch.where(active, steps + 1, steps)  # (K,) float64
        if opt.kind == "adam":
            bc1 = 1 - opt.beta1**new_steps  # (K,) float64, as torch's Python floats
            bc2 = 1 - opt.beta2**new_steps
            step_size = (lr / bc1).to(torch.float32)
            bc2_sqrt = bc2.sqrt().to(torch.float32)
        for i, (w, g) in enumerate(zip(params, grads, strict=True)):
            shape = (-1, *([1] * (w.dim() - 1)))
            on = active.view(shape)
            if opt.kind == "adam":
                m = torch.lerp(exp_avg[i], g, 1 - opt.beta1)
                v = exp_avg_sq[i] * opt.beta2 + (1 - opt.beta2) * g * g
                denom = v.sqrt() / bc2_sqrt.view(shape) + opt.eps
                w_new = w - step_size.view(shape) * m / denom
                exp_avg[i].copy_(torch.where(on, m, exp_avg[i]))
                exp_avg_sq[i].copy_(torch.where(on, v, exp_avg_sq[i]))
            else:
                w_new = w - lr.to(torch.float32) * g
            w.copy_(torch.where(on, w_new, w))
        steps.copy_(new_steps)
        return losses

    return update


def _pad_time(t: Tensor, length: int) -> Tensor:
    """Right-pad dim 2 (time) of ``t`` with zeros/False to ``length``."""
    extra = length - t.shape[2]
    if extra <= 0:
        return t
    pad = t.new_zeros(*t.shape[:2], extra, *t.shape[3:])
    return torch.cat([t, pad], dim=2)


class FusedStep:
    """``__call__(batch, active) -> losses (K,)``: one full training step of the bundle.

    Holds the optimizer state (Adam moments and per-member step counts); checkpoint it
    with :meth:`state_dict` / :meth:`load_state_dict`.
    """

    def __init__(self, model: RNNTagger, train_cfg: Any, compiled: bool = False) -> None:
        from trainables.models.rnn_tagger import check_reduction

        check_reduction(train_cfg.loss_reduction)
        self.model = model
        self.compiled = compiled
        beta1, beta2 = (float(b) for b in train_cfg.adam_betas)
        clip = train_cfg.clip_norm
        self.spec = OptimSpec(
            kind=str(train_cfg.optimizer),
            beta1=beta1,
            beta2=beta2,
            eps=float(train_cfg.adam_eps),
            weight_decay=float(train_cfg.weight_decay),
            clip_norm=None if clip is None else float(clip),
        )
        if self.spec.kind not in ("sgd", "adam"):
            raise ValueError(f"fused step supports sgd and adam, not {self.spec.kind!r}")
        params = model.params()
        device = params.w_ih.device
        self.exp_avg = [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in params]
        self.steps = torch.zeros(model.k, dtype=torch.float64, device=device)
        self._lr = torch.tensor(float(train_cfg.lr), dtype=torch.float64, device=device)
        fn = make_update(model.cell, train_cfg.loss_reduction, self.spec)
        self.fn = (
            torch.compile(fn, fullgraph=True, dynamic=False, options=COMPILE_OPTIONS)
            if compiled
            else fn
        )
        self.pad_to = int(model.meta.get("train_max_len", 0)) if compiled else 0

    @property
    def lr(self) -> float:
        return float(self._lr)

    @lr.setter
    def lr(self, value: float) -> None:
        self._lr.fill_(float(value))

    def __call__(self, batch: TagBatch, active: Tensor) -> Tensor:
        """Train every active member on its rows of ``batch``; returns the losses ``(K,)``."""
        x, y, mask = batch.x, batch.y, batch.mask
        if self.compiled:  # one static shape: all K rows, T padded to the training maximum
            k = self.model.k
            x, y, mask = (t.expand(k, *t.shape[1:]) for t in (x, y, mask))
            length = max(self.pad_to, x.shape[2])
            x, y, mask = (_pad_time(t, length) for t in (x, y, mask))
        with torch.no_grad():
            losses = self.fn(
                list(self.model.params()),
                self.exp_avg,
                self.exp_avg_sq,
                self.steps,
                x,
                y,
                mask,
                active.to(device=self.steps.device, dtype=torch.bool),
                self._lr,
            )
        return losses

    def state_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps.clone(),
            "exp_avg": [t.clone() for t in self.exp_avg],
            "exp_avg_sq": [t.clone() for t in self.exp_avg_sq],
            "lr": self.lr,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps.copy_(state["steps"])
        for dst, src in zip(self.exp_avg, state["exp_avg"], strict=True):
            dst.copy_(src)
        for dst, src in zip(self.exp_avg_sq, state["exp_avg_sq"], strict=True):
            dst.copy_(src)
        self.lr = state["lr"]
