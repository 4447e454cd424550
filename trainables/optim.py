"""fineline's bundled optimizers: one update of K members whose hyperparameters may differ.

A bundle's members share every hyperparameter unless the trainer is told otherwise.
Tuning puts several candidates (each with its paired seeds) in one bundle, and then
members differ in the *per-member hyperparameters* (:data:`PER_MEMBER`): learning rate,
weight decay, SGD's momentum, Adam's betas, the gradient-norm clip and the model's
dropout probability. Each is one value per member, applied as a ``(K, 1, ...)`` tensor
over every parameter's leading member dimension, for every family alike (hand-bundled
``(K, ...)`` parameters and the plain family's stacked ones). ``torch.optim`` takes one
learning rate per parameter group, and a group is a whole stacked tensor, so fineline has
its own optimizers: :class:`BundledSGD` (with momentum), :class:`BundledAdam` and
:class:`BundledAdamW` (:func:`make_optimizer` picks one from ``train.optimizer``).

**Arithmetic.** Each follows ``torch.optim``'s single-tensor update (``foreach=False``)
op for op. A hyperparameter every member shares is applied as the Python number torch
applies, so with all of them shared an update is bitwise ``torch.optim``'s (tested; the
trainer always uses these optimizers, and a seed trained before they existed trains the
same). A hyperparameter that differs is a tensor in the same place, which agrees with a
lone member's torch update to float rounding (torch's fused multiply-add of
``add(alpha=...)`` becomes a multiply and an add). Which hyperparameters are shared is
decided once, when the bundle is built (:attr:`MemberHparams.shared`); compaction never
changes it. Bias corrections and step sizes are computed per member in Python doubles,
as torch computes them for a lone run.

**Identities.** Member ``k``'s values come from its own resolved config, a
:class:`~trainables.spec.RunSpec` (``BundleRun(..., member_specs=...)``): member ``k``
computes what a lone run of ``member_specs[k]`` computes, so its results belong to that
config's ``trial_id``. The specs may differ only in the fields of :data:`PER_MEMBER`
(:func:`bundle_hparams` refuses others); :func:`with_hparams` makes a member's spec from a
bundle's spec and a dict of per-member values.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from trainables.errors import ConfigError
from trainables.runtime import to_device
from trainables.spec import RunSpec, TrainConfig

PER_MEMBER: dict[str, tuple[str, str]] = {
    "lr": ("train", "lr"),
    "weight_decay": ("train", "weight_decay"),
    "momentum": ("train", "momentum"),
    "betas": ("train", "adam_betas"),
    "clip_norm": ("train", "clip_norm"),
    "dropout": ("model", "dropout"),
}
"""Per-member hyperparameter -> (config block, field) it sets in a member's spec."""

Value = float | Tensor
"""A per-member value as an update applies it: a Python number when every member shares
it, else a ``(K, 1, ...)`` tensor of the parameter's dtype."""


# --- which values each member has ---------------------------------------------------------


@dataclass(frozen=True)
class MemberHparams:
    """Each model row's per-member hyperparameters (row ``r``: the member in that row)."""

    lr: tuple[float, ...]
    """Learning rate before ``train.lr_halving``."""
    weight_decay: tuple[float, ...]
    """Weight decay (L2 added to the gradient; decoupled for AdamW)."""
    momentum: tuple[float, ...]
    """SGD momentum (0: none)."""
    betas: tuple[tuple[float, float], ...]
    """Adam's (beta1, beta2)."""
    clip_norm: tuple[float | None, ...]
    """Global gradient-norm clip of the member's own gradients; None: no clipping."""
    dropout: tuple[float, ...] | None
    """The model's ``dropout`` per member; None when the model config has no such field."""
    shared: frozenset[str]
    """The names whose value every member of the bundle, as it was built, shares."""

    def __len__(self) -> int:
        return len(self.lr)

    @classmethod
    def of(cls, specs: Sequence[RunSpec]) -> MemberHparams:
        """The values of ``specs`` (one per member)."""
        if not specs:
            raise ValueError("a bundle needs at least one member")
        dropout = None
        if all(_has_dropout(s.model) for s in specs):
            dropout = tuple(float(s.model.dropout) for s in specs)  # type: ignore[attr-defined]
        values: dict[str, Any] = {
            "lr": tuple(float(s.train.lr) for s in specs),
            "weight_decay": tuple(float(s.train.weight_decay) for s in specs),
            "momentum": tuple(float(s.train.momentum) for s in specs),
            "betas": tuple((float(s.train.adam_betas[0]), float(s.train.adam_betas[1])) for s in specs),
            "clip_norm": tuple(None if s.train.clip_norm is None else float(s.train.clip_norm) for s in specs),
            "dropout": dropout,
        }
        shared = frozenset(n for n, v in values.items() if v is None or len(set(v)) == 1)
        if any(s.train.lr_halving is not None and s.train.lr_halving.on_loss_rise for s in specs):
            shared -= {"lr"}  # each member's halvings are its own: one arithmetic, alone or bundled
        return cls(**values, shared=shared)

    def keep(self, rows: Sequence[int]) -> MemberHparams:
        """Rows ``rows`` only (compaction); :attr:`shared` stays what it was."""

        def pick(values: tuple[Any, ...] | None) -> Any:
            return None if values is None else tuple(values[r] for r in rows)

        return MemberHparams(
            lr=pick(self.lr), weight_decay=pick(self.weight_decay), momentum=pick(self.momentum),
            betas=pick(self.betas), clip_norm=pick(self.clip_norm), dropout=pick(self.dropout),
            shared=self.shared,
        )


def _has_dropout(model_cfg: Any) -> bool:
    field = type(model_cfg).model_fields.get("dropout")
    return field is not None and isinstance(getattr(model_cfg, "dropout", None), int | float)


def _flat(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flat(value, path + "."))
        else:
            out[path] = value
    return out


_PATHS = {f"{block}.{name}" for block, name in PER_MEMBER.values()}


def bundle_hparams(spec: RunSpec, member_specs: Sequence[RunSpec]) -> MemberHparams:
    """The per-member values of ``member_specs`` (one resolved config per member), which may
    differ from ``spec`` (the bundle's config) only in :data:`PER_MEMBER`'s fields.

    Raises ConfigError naming the first other field where a member differs."""
    base = {p: v for p, v in _flat(spec.to_dict()).items() if p not in _PATHS}
    for k, member in enumerate(member_specs):
        mine = {p: v for p, v in _flat(member.to_dict()).items() if p not in _PATHS}
        for path in sorted(base.keys() | mine.keys()):
            if base.get(path, "(absent)") != mine.get(path, "(absent)"):
                raise ConfigError(
                    path,
                    f"member {k} of the bundle has {mine.get(path, '(absent)')!r} where the bundle has "
                    f"{base.get(path, '(absent)')!r}; members of one bundle may differ only in "
                    + ", ".join(sorted(_PATHS)),
                    "train configs that differ in other fields in separate bundles",
                )
    return MemberHparams.of(member_specs)


def with_hparams(spec: RunSpec, values: Mapping[str, Any]) -> RunSpec:
    """``spec`` with per-member hyperparameters set: keys of :data:`PER_MEMBER` (``betas``
    a pair, ``clip_norm`` None for no clipping), validated like a study file's fields."""
    raw = spec.to_dict()
    for key, value in values.items():
        if key not in PER_MEMBER:
            raise ConfigError(
                "member_hparams", f"{key!r} is not a per-member hyperparameter",
                f"use one of: {', '.join(PER_MEMBER)}",
            )
        block, name = PER_MEMBER[key]
        if block == "model" and not _has_dropout(spec.model):
            raise ConfigError(
                f"model.{name}", f"model {spec.model_name!r} has no {name} to set per member",
                f"leave {key} out of the members' hyperparameters",
            )
        raw[block][name] = list(value) if isinstance(value, tuple) else value
    return RunSpec.from_dict(raw)


# --- gradient clipping -------------------------------------------------------------------


def clip_grad_norms_(grads: Sequence[Tensor], hp: MemberHparams) -> None:
    """Clip each member's gradients (rows of ``grads``, each ``(K, ...)``) by the global norm
    of that member's own gradients and its own ``clip_norm``, in place:
    ``g_k *= min(1, c_k / (||g_k|| + 1e-6))``. A member without a clip keeps its gradients."""
    clip = hp.clip_norm
    if all(c is None for c in clip) or not grads:
        return
    k = len(clip)
    # each member's squares summed over its own contiguous row, as in its lone run: a sum over
    # dim 0 of a (P, K) stack is a strided reduction whose rounding depends on K, and that
    # 1e-7 let a bundle member drift from its lone run (3e-5 in 200 steps with input feeding)
    sq = torch.stack([g.reshape(k, -1).pow(2).sum(1) for g in grads], 1).sum(1)  # (K,)
    if "clip_norm" in hp.shared:
        assert clip[0] is not None
        coef = (clip[0] / (sq.sqrt() + 1e-6)).clamp(max=1.0)  # (K,)
    else:
        c = to_device(torch.tensor([math.inf if v is None else v for v in clip], dtype=sq.dtype), sq.device)
        coef = ((sq.sqrt() + 1e-6).reciprocal() * c).clamp(max=1.0)  # what `c / t` computes
        coef = torch.where(torch.isinf(c), torch.ones_like(coef), coef)
    for g in grads:
        g.mul_(coef.view(-1, *([1] * (g.dim() - 1))))


# --- the optimizers ----------------------------------------------------------------------


class _Rows:
    """Per-member values as ``(K, 1, ...)`` tensors of a parameter's dtype (values computed
    in float64, cast once, as torch casts a Python number). Kept across steps while the
    values hold (a learning rate changes at an epoch's end), and sent to a GPU without
    waiting (:func:`~trainables.runtime.to_device`): a copy from pageable memory every step
    made the host wait for the GPU at each step."""

    def __init__(self) -> None:
        self.cache: dict[tuple[str, torch.dtype, torch.device], tuple[tuple[float, ...], Tensor]] = {}
        self.made = 0
        """Tensors made so far (a new one only where the values changed)."""

    def __call__(self, name: str, values: Sequence[float], like: Tensor) -> Tensor:
        key, values = (name, like.dtype, like.device), tuple(values)
        hit = self.cache.get(key)
        if hit is None or hit[0] != values:
            hit = (values, to_device(torch.tensor(values, dtype=torch.float64), like.device).to(like.dtype))
            self.cache[key] = hit
            self.made += 1
        return hit[1].view(-1, *([1] * (like.dim() - 1)))


def _scalar_dtype() -> torch.dtype:
    """The dtype of Adam's step count, as torch.optim makes it."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


class BundledOptimizer(torch.optim.Optimizer):
    """Base of the bundled optimizers: parameters ``(K, ...)``, per-member values
    :attr:`hparams`. Its state and ``state_dict`` have torch.optim's layout (checkpoints of
    torch.optim.SGD / Adam load into it).

    ``param_groups[0]["lr"]`` shows the learning rate now: a number, or one per row."""

    def __init__(self, params: Iterable[Tensor], hparams: MemberHparams) -> None:
        params = list(params)
        k = len(hparams)
        for p in params:
            if p.dim() == 0 or p.shape[0] != k:
                raise ValueError(f"a bundled optimizer of {k} members takes (K={k}, ...) parameters, got {tuple(p.shape)}")
        super().__init__(params, {"lr": hparams.lr[0]})
        self.hparams = hparams
        self.rows = _Rows()
        """Per-member values as tensors, made when they change (see :class:`_Rows`)."""
        self.lr_factor: float | tuple[float, ...] = 1.0
        """The schedule's factor on every member's learning rate, or one per row
        (``train.lr_halving``)."""
        self._show_lr()

    # torch.optim.Optimizer wraps these in torch._disable_dynamo, whose first call imports
    # torch._dynamo: about a core-second in every new worker process. fineline never
    # compiles an optimizer, so its optimizers call the undecorated functions.
    add_param_group = inspect.unwrap(torch.optim.Optimizer.add_param_group)
    zero_grad = inspect.unwrap(torch.optim.Optimizer.zero_grad)
    state_dict = inspect.unwrap(torch.optim.Optimizer.state_dict)
    load_state_dict = inspect.unwrap(torch.optim.Optimizer.load_state_dict)

    def _show_lr(self) -> None:
        lrs = self.lrs()
        for group in self.param_groups:
            group["lr"] = lrs[0] if "lr" in self.hparams.shared else lrs

    def set_lr_factor(self, factor: float | Sequence[float]) -> None:
        """Every learning rate := its base value times ``factor`` (an lr schedule), or row
        r's times ``factor[r]`` (each member's own schedule)."""
        self.lr_factor = float(factor) if isinstance(factor, int | float) else tuple(float(f) for f in factor)
        self._show_lr()

    def lrs(self) -> tuple[float, ...]:
        """Each row's learning rate now."""
        f = self.lr_factor
        factors = f if isinstance(f, tuple) else (f,) * len(self.hparams.lr)
        return tuple(lr * x for lr, x in zip(self.hparams.lr, factors, strict=True))

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keep model rows ``rows`` only (compaction): state tensors and per-member values."""
        old_k = len(self.hparams)
        for state in self.state.values():
            for key, v in state.items():
                if isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == old_k:
                    state[key] = v.index_select(0, torch.tensor(rows, device=v.device)).contiguous()
        self.hparams = self.hparams.keep(rows)
        if isinstance(self.lr_factor, tuple):
            self.lr_factor = tuple(self.lr_factor[r] for r in rows)
        self._show_lr()

    def _params(self) -> list[Tensor]:
        return [p for group in self.param_groups for p in group["params"] if p.grad is not None]

    def _closure(self, closure: Callable[[], Any] | None) -> Any:
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()


class BundledSGD(BundledOptimizer):
    """``torch.optim.SGD`` (dampening 0, no Nesterov) with per-member learning rate,
    weight decay and momentum."""

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = self._closure(closure)
        hp, shared, rows = self.hparams, self.hparams.shared, self.rows
        lrs = self.lrs()
        use_momentum = "momentum" not in shared or hp.momentum[0] != 0
        for p in self._params():
            grad = p.grad
            assert grad is not None
            if "weight_decay" not in shared:
                grad = torch.addcmul(grad, p, rows("wd", hp.weight_decay, p))
            elif hp.weight_decay[0] != 0:
                grad = grad.add(p, alpha=hp.weight_decay[0])
            if use_momentum:
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = grad.detach().clone()
                    state["momentum_buffer"] = buf
                elif "momentum" in shared:
                    buf.mul_(hp.momentum[0]).add_(grad, alpha=1)
                else:
                    buf.mul_(rows("momentum", hp.momentum, p)).add_(grad)
                grad = buf
            if "lr" in shared:
                p.add_(grad, alpha=-lrs[0])
            else:
                p.addcmul_(grad, rows("neg_lr", [-lr for lr in lrs], p))
        return loss


class BundledAdam(BundledOptimizer):
    """``torch.optim.Adam`` (no amsgrad) with per-member learning rate, weight decay (L2)
    and betas; ``eps`` is shared."""

    decoupled = False
    """AdamW: decay the parameters (``p *= 1 - lr * wd``) instead of adding ``wd * p`` to
    the gradient."""

    def __init__(self, params: Iterable[Tensor], hparams: MemberHparams, eps: float = 1e-8) -> None:
        super().__init__(params, hparams)
        self.eps = float(eps)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = self._closure(closure)
        hp, shared, rows = self.hparams, self.hparams.shared, self.rows
        lrs = self.lrs()
        beta1s = [b[0] for b in hp.betas]
        beta2s = [b[1] for b in hp.betas]
        betas_shared, lr_shared = "betas" in shared, "lr" in shared
        wd_shared = "weight_decay" in shared
        for p in self._params():
            grad = p.grad
            assert grad is not None
            state = self.state[p]
            if not state:
                state["step"] = torch.tensor(0.0, dtype=_scalar_dtype())
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            exp_avg, exp_avg_sq, step_t = state["exp_avg"], state["exp_avg_sq"], state["step"]
            step_t += 1
            if self.decoupled:
                if wd_shared and lr_shared:
                    if hp.weight_decay[0] != 0:
                        p.mul_(1 - lrs[0] * hp.weight_decay[0])
                elif any(wd != 0 for wd in hp.weight_decay):
                    p.mul_(rows("decay", [1 - lr * wd for lr, wd in zip(lrs, hp.weight_decay, strict=True)], p))
            elif not wd_shared:
                grad = torch.addcmul(grad, p, rows("wd", hp.weight_decay, p))
            elif hp.weight_decay[0] != 0:
                grad = grad.add(p, alpha=hp.weight_decay[0])
            if betas_shared:
                exp_avg.lerp_(grad, 1 - beta1s[0])
                exp_avg_sq.mul_(beta2s[0]).addcmul_(grad, grad, value=1 - beta2s[0])
            else:
                exp_avg.lerp_(grad, rows("1-beta1", [1 - b for b in beta1s], p))
                exp_avg_sq.mul_(rows("beta2", beta2s, p))
                exp_avg_sq.addcmul_(grad * rows("1-beta2", [1 - b for b in beta2s], p), grad)
            step = step_t.item()
            bc2_sqrt = [(1 - b2**step) ** 0.5 for b2 in beta2s]
            step_size = [lr / (1 - b1**step) for lr, b1 in zip(lrs, beta1s, strict=True)]
            if betas_shared:
                denom = (exp_avg_sq.sqrt() / bc2_sqrt[0]).add_(self.eps)
            else:
                denom = (exp_avg_sq.sqrt() / rows("bc2_sqrt", bc2_sqrt, p)).add_(self.eps)
            if betas_shared and lr_shared:
                p.addcdiv_(exp_avg, denom, value=-step_size[0])
            else:
                neg_step = rows("neg_step", [-s for s in step_size], p)  # step counts
                p.addcdiv_(exp_avg * neg_step, denom)  # differ where a parameter once had no grad
        return loss


class BundledAdamW(BundledAdam):
    """``torch.optim.AdamW``: :class:`BundledAdam` with decoupled weight decay."""

    decoupled = True


def make_optimizer(params: Iterable[Tensor], train: TrainConfig, hparams: MemberHparams) -> BundledOptimizer:
    """The bundled optimizer ``train.optimizer`` names, over ``params`` with ``hparams``."""
    if train.optimizer == "sgd":
        return BundledSGD(params, hparams)
    cls = BundledAdamW if train.optimizer == "adamw" else BundledAdam
    return cls(params, hparams, eps=train.adam_eps)
