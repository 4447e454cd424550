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

The learning rate is a tensor input: set :attr:`FusedStep.lr` (or
:meth:`FusedStep.set_lr_factor`) to change it without a recompile.

Per-member hyperparameters (:meth:`FusedStep.use_member_hparams`, from the trainer's
:class:`~trainables.optim.MemberHparams`): a value the members share stays the Python
number above (the arithmetic of a bundle of one config is unchanged); one that differs is
a ``(K,)`` tensor in its place: learning rate, weight decay, Adam's betas, clip norm. The
step has no momentum: a bundle with one falls back to the trainer's generic step.
"""

from __future__ import annotations

import math
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
    from trainables.optim import MemberHparams


COMPILE_OPTIONS: dict[str, Any] = {"cpp_wrapper": True}
"""Inductor options of the compiled step: ``cpp_wrapper`` runs the graph's glue (hundreds of
small buffer allocations per step) in C++ instead of Python."""


@dataclass(frozen=True)
class OptimSpec:
    """The optimizer settings the fused step bakes in (from the trainer's train config)."""

    kind: str
    """``sgd`` or ``adam``."""
    beta1: float | Tensor
    """A number, or one value per member ``(K,)`` float64 (as are the next three)."""
    beta2: float | Tensor
    eps: float
    weight_decay: float | Tensor
    clip_norm: float | Tensor | None
    """None: no clipping; per member ``inf`` where a member has none."""


def _rows(value: float | Tensor, like: Tensor) -> float | Tensor:
    """A number as is; a per-member ``(K,)`` tensor as ``(K, 1, ...)`` of ``like``'s dtype
    (a 0-dim tensor as is)."""
    if isinstance(value, Tensor) and value.dim() > 0:
        return value.to(like.dtype).view(-1, *([1] * (like.dim() - 1)))
    return value


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
        if isinstance(opt.weight_decay, Tensor) or opt.weight_decay != 0:
            grads = [g + _rows(opt.weight_decay, w) * w for g, w in zip(grads, params, strict=True)]
        if opt.clip_norm is not None:  # the trainer's per-member clip
            sq = torch.stack([g.reshape(k, -1).pow(2).sum(1) for g in grads]).sum(0)  # (K,)
            if isinstance(opt.clip_norm, Tensor):  # what `c / t` computes, per member
                c = opt.clip_norm.to(sq.dtype)
                coef = ((sq.sqrt() + 1e-6).reciprocal() * c).clamp(max=1.0)
                coef = torch.where(torch.isinf(c), torch.ones_like(coef), coef)
            else:
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
                m = torch.lerp(exp_avg[i], g, _rows(1 - opt.beta1, w))
                v = exp_avg_sq[i] * _rows(opt.beta2, w) + _rows(1 - opt.beta2, w) * g * g
                denom = v.sqrt() / bc2_sqrt.view(shape) + opt.eps
                w_new = w - step_size.view(shape) * m / denom
                exp_avg[i].copy_(torch.where(on, m, exp_avg[i]))
                exp_avg_sq[i].copy_(torch.where(on, v, exp_avg_sq[i]))
            else:
                w_new = w - _rows(lr.to(torch.float32), w) * g
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
        self._base_lr: tuple[float, ...] = (float(train_cfg.lr),)
        """The learning rate before a schedule's factor: one number, or one per member."""
        self.reduction = train_cfg.loss_reduction
        self._make_fn()
        self.pad_to = int(model.meta.get("train_max_len", 0)) if compiled else 0

    def _make_fn(self) -> None:
        fn = make_update(self.model.cell, self.reduction, self.spec)
        self.fn = (
            torch.compile(fn, fullgraph=True, dynamic=False, options=COMPILE_OPTIONS)
            if self.compiled
            else fn
        )

    def use_member_hparams(self, hp: MemberHparams) -> bool:
        """Train each member with its own values in ``hp`` (one row per member; before the
        first step). False, changing nothing, where the step cannot: a momentum."""
        if any(m != 0 for m in hp.momentum) or len(hp) != self.model.k:
            return False
        device = self.steps.device

        def value(name: str, values: tuple[Any, ...]) -> float | Tensor:
            if name in hp.shared:
                return float(values[0])
            return torch.tensor(values, dtype=torch.float64, device=device)

        clip: float | Tensor | None = None
        if "clip_norm" in hp.shared:
            clip = None if hp.clip_norm[0] is None else float(hp.clip_norm[0])
        else:
            clip = value("clip_norm", tuple(math.inf if c is None else c for c in hp.clip_norm))
        self.spec = OptimSpec(
            kind=self.spec.kind,
            beta1=value("betas", tuple(b[0] for b in hp.betas)),
            beta2=value("betas", tuple(b[1] for b in hp.betas)),
            eps=self.spec.eps,
            weight_decay=value("weight_decay", hp.weight_decay),
            clip_norm=clip,
        )
        self._base_lr = hp.lr[:1] if "lr" in hp.shared else hp.lr
        self._lr = torch.tensor(
            self._base_lr[0] if len(self._base_lr) == 1 else self._base_lr,
            dtype=torch.float64, device=device,
        )
        self._make_fn()
        return True

    def set_lr_factor(self, factor: float) -> None:
        """Every learning rate := its base value times ``factor`` (the trainer's schedule)."""
        self.lr = self._base_lr[0] * factor if len(self._base_lr) == 1 else tuple(
            lr * factor for lr in self._base_lr
        )

    @property
    def lr(self) -> float | tuple[float, ...]:
        """The learning rate now: one number, or one per member."""
        return float(self._lr) if self._lr.dim() == 0 else tuple(self._lr.tolist())

    @lr.setter
    def lr(self, value: float | tuple[float, ...]) -> None:
        if isinstance(value, tuple | list):
            self._lr.copy_(torch.tensor(value, dtype=torch.float64))
        else:
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
