"""Plain ``nn.Module`` models: written for one seed, trained K seeds at a time.

A researcher writes the ``torch.nn.Module`` ONE seed uses (no member dimension) and
:meth:`PlainModel.build_module`; fineline trains K seeds of it as one computation with
``torch.func`` (the stacked parameters, ``functional_call`` and ``vmap``). A
:class:`PlainModel` is a :class:`~trainables.models.base.Model` like any hand-bundled
family: registered with ``@MODELS.register``, trained by the same trainer, held to the
same contract. For ``classify`` tasks :class:`PlainClassifier` needs nothing else (the
module maps a batch ``(B, *input_shape)`` to logits ``(B, C)``); other data kinds write
``make_batch``, ``loss``, ``example_losses`` and ``predict`` around :meth:`run_members`.

The rules that keep a seed's result independent of its bundle:

* **Init**: member k starts with exactly the parameters that
  ``torch.manual_seed(init_seed); build_module(config, meta)`` gives: :meth:`init_member`
  builds the module with torch's CPU default generator set to the member generator's state
  (inside ``torch.random.fork_rng``, so the global RNG is left as it was) and copies its
  parameters and buffers into row k. Independent of K and of the other members.
* **Noise**: dropout is :class:`Dropout`, whose masks come from each member's own stream
  (:class:`~trainables.models.base.MemberNoise`), drawn outside ``vmap`` in the
  activation's per-member shape and fed in. The first training batch of each input shape
  runs a *probe* (member 0, no gradients) that records the dropout calls and refuses any
  other random op; ``torch.nn.Dropout`` is refused when the model is built.
* **Bundling** (``model.bundling``, for the manifest): ``"vmap"`` computes the members
  with one ``vmap`` over ``functional_call``; where vmap cannot run the module
  (data-dependent control flow, an op without a batching rule) the model switches to
  ``"loop"``, one ``functional_call`` per member with the same masks and results, and says
  so once in the log.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from trainables.configbase import FrozenConfig
from trainables.errors import ConfigError
from trainables.models.base import MemberNoise, Model
from trainables.models.classify import (
    REDUCTIONS,
    BundledClassifier,
    ClassifyBatch,
    LossName,
    classify_losses,
    reduce_losses,
)
from trainables.models.plain_engine import (
    DropoutCall,
    NoiseFeed,
    RandomOpWatch,
    Tensors,
    active_feed,
    call_loop,
    make_vmapped,
    member_call,
    stack_module,
)

Bundling = Literal["vmap", "loop"]
log = logging.getLogger(__name__)
_warned: set[str] = set()

TORCH_DROPOUTS = (
    nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout,
)


class Dropout(nn.Module):
    """Inverted dropout for plain modules: masks from each seed's own dropout stream.

    Inside fineline a training forward multiplies the activation ``x`` (per member, any
    shape) by a mask of the same shape, 0 or ``1/(1-p)``, drawn by ``MemberNoise`` from the
    member's ``dropout_seed`` stream; evaluation (or ``p == 0``) is the identity. Outside
    fineline (the module used on its own) it is ``F.dropout`` with torch's global RNG.
    """

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        feed = active_feed()
        if feed is None:
            return F.dropout(x, self.p, training=True)
        return feed.apply(self.p, x)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class PlainModel(Model):
    """A model family written as one seed's ``nn.Module``, bundled through ``torch.func``.

    Subclasses implement :meth:`build_module` and the hooks of their data kind; their
    parameters live in ``self.net`` (the module tree, every tensor ``(K, *shape)``).
    """

    bundling: Bundling = "vmap"
    """How the members are computed: ``"vmap"``, or ``"loop"`` (one member at a time)
    after vmap failed on this module; a subclass may set ``"loop"`` to skip vmap."""

    def __init__(self, config: FrozenConfig, meta: dict[str, Any], k: int) -> None:
        super().__init__(config, meta, k)
        with torch.random.fork_rng(devices=[]):
            module = self.build_module(config, meta)
        if not isinstance(module, nn.Module):
            raise ConfigError(
                "model", f"{self.name!r}: build_module returned {type(module).__name__}, not a torch.nn.Module",
                "return the module one seed uses (e.g. nn.Sequential(...)), built from config and meta",
            )
        _refuse_torch_dropout(self.name, module)
        self.net = stack_module(module, k)
        self._probed: dict[tuple[Any, ...], tuple[DropoutCall, ...]] = {}
        self._vmapped: dict[tuple[bool, ...], Any] = {}
        self._stacked: tuple[Tensors, Tensors] | None = None
        """The skeleton's (parameters, buffers) by one-seed name, cached between steps."""

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> PlainModel:
        """``to``/``cuda``/``float``...: the stacked tensors may be new objects."""
        self._stacked = None
        return super()._apply(fn, *args, **kwargs)  # type: ignore[no-any-return]

    @abstractmethod
    def build_module(self, config: FrozenConfig, meta: dict[str, Any]) -> nn.Module:
        """One seed's module for ``config`` and the task's ``meta``, initialised by its own
        constructor (torch's global RNG, which fineline seeds per member)."""

    # ----------------------------------------------------------------- members
    def init_member(self, member: int, generator: torch.Generator) -> None:
        """Row ``member`` := a module built with the default generator at ``generator``'s
        state (``generator`` then advances by what the build drew)."""
        if generator.device.type != "cpu":
            raise ValueError("plain models initialise from a CPU generator")
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.set_state(generator.get_state())
            fresh = self.build_module(self.config, self.meta)
            generator.set_state(torch.default_generator.get_state())
        state = dict(fresh.named_parameters()) | dict(fresh.named_buffers())
        with torch.no_grad():
            for name, stacked in self._tensors().items():
                stacked[member].copy_(state[name])

    def set_member_dropout(self, rates: Sequence[float]) -> None:
        """Members with their own ``dropout`` (config field): each member's :class:`Dropout`
        calls draw at its rate (:class:`MemberNoise` ``rates``). That is the member's lone run
        when the rate changes nothing but the Dropout layers' rates: checked by building the
        module at every rate (same seed) and comparing its tensors, initial values included,
        and its Dropout layers, each of which must use the rate. The bundle's module is then
        the one built at the largest rate, so it has every Dropout layer a member's has (a
        member at rate 0, whose lone module may have none, multiplies by ones)."""
        if "dropout" not in type(self.config).model_fields:
            raise ConfigError(
                "model.dropout", f"{self.name!r} has no dropout field to set per member",
                "give the members no dropout of their own",
            )
        here = self.config.dropout  # type: ignore[attr-defined]
        reference = _tensor_values(self._built_at(here))
        built = {p: self._built_at(p) for p in sorted(set(rates) | {here})}
        layers: dict[float, set[str]] = {}
        for p, module in built.items():
            mine = _tensor_values(module)
            names = sorted(mine.keys() ^ reference.keys())
            values = [n for n in sorted(mine.keys() & reference.keys()) if not torch.equal(mine[n], reference[n])]
            if names or values:
                what = f"tensor {names[0]!r} exists at only one of them" if names else f"{values[0]!r} starts elsewhere"
                raise ConfigError(
                    "model.dropout",
                    f"{self.name!r} builds other tensors at dropout {p} than at {here} ({what}; a "
                    "Dropout layer added only where the rate is > 0 shifts nn.Sequential's names): "
                    "members with these dropouts cannot share a bundle",
                    "train them in separate bundles, or give every member a dropout > 0",
                )
            drops = {path: m.p for path, m in module.named_modules() if isinstance(m, Dropout)}
            wrong = {path: q for path, q in drops.items() if q != p}
            if wrong:
                path, q = next(iter(wrong.items()))
                raise ConfigError(
                    "model.dropout",
                    f"{self.name!r} at dropout {p} has Dropout layer {path} at rate {q}: a "
                    "member's own dropout can only replace one rate used by every layer",
                    "train members with different dropout in separate bundles",
                )
            layers[p] = set(drops)
        top = max(rates)
        if top == 0.0:
            return
        if not all(paths <= layers[top] for paths in layers.values()):
            raise ConfigError(
                "model.dropout",
                f"{self.name!r} has Dropout layers at a lower rate that it lacks at {top}",
                "train members with different dropout in separate bundles",
            )
        self.net = stack_module(built[top], self.k)
        self._probed.clear()
        self._vmapped.clear()
        self._stacked = None

    def _built_at(self, p: float) -> nn.Module:
        """The one-seed module at dropout ``p``, built under a fixed seed (torch's global RNG
        left as it was)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            module = self.build_module(self.config.model_copy(update={"dropout": p}), self.meta)
        _refuse_torch_dropout(self.name, module)
        return module

    def member_module(self, member: int) -> nn.Module:
        """A one-seed module holding member ``member``'s current parameters and buffers."""
        with torch.random.fork_rng(devices=[]):
            module = self.build_module(self.config, self.meta)
        module.load_state_dict(
            {n: t.detach()[member] for n, t in self._tensors().items()}, strict=False
        )
        return module

    def member_state(self, member: int) -> dict[str, torch.Tensor]:
        """Member ``member``'s parameters and buffers (leading dim removed)."""
        return {
            n: t.detach()[member].clone()
            for n, t in [*self.named_parameters(), *self.named_buffers()]
        }

    def load_member_state(self, member: int, state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for n, t in [*self.named_parameters(), *self.named_buffers()]:
                t[member].copy_(state[n])

    def member_tensors(self) -> dict[str, torch.Tensor]:
        """Parameters and buffers (both are in :meth:`member_state`)."""
        return dict(self.named_parameters()) | dict(self.named_buffers())

    def _tensors(self) -> Tensors:
        """The skeleton's stacked parameters and buffers by their one-seed names."""
        return dict(self.net.named_parameters()) | dict(self.net.named_buffers())

    # ----------------------------------------------------------------- computing
    def run_members(self, *inputs: torch.Tensor, noise: MemberNoise | None = None) -> Any:
        """The module on every member. Each input is ``(K, *shape)`` (member k's own) or
        ``(1, *shape)`` (the same for all); the outputs carry a leading ``K``. A lone
        member (K = 1) goes through vmap too: the same kernels as in any bundle, so on a
        CPU a seed's parameters are bit-identical whatever bundle it ran in.

        ``noise`` given: training (module in train mode, dropout masks from ``noise``);
        None: evaluation (eval mode, dropout the identity).
        """
        if self._stacked is None:
            self._stacked = dict(self.net.named_parameters()), dict(self.net.named_buffers())
        params, buffers = self._stacked
        k = next(iter(params.values())).shape[0] if params else self.k
        shared = tuple(x.shape[0] == 1 and k > 1 for x in inputs)
        if any(x.shape[0] not in (1, k) for x in inputs):
            raise ValueError(f"inputs must lead with the member dim {k} (or 1 if shared)")
        self.net.train(noise is not None)
        masks = self._masks(inputs, noise, buffers) if noise is not None else ()
        if self.bundling == "loop":
            return call_loop(self.net, params, buffers, masks, inputs, shared, k)
        fn = self._vmapped.get(shared)
        if fn is None:
            fn = self._vmapped[shared] = make_vmapped(self.net, shared)
        args = [x[0] if s else x for x, s in zip(inputs, shared, strict=True)]
        try:
            return fn(params, buffers, masks, *args)
        except (RuntimeError, NotImplementedError) as exc:
            if "random" in str(exc):
                raise self._random_op_error("the module runs a random op") from exc
            out = call_loop(self.net, params, buffers, masks, inputs, shared, k)
            self._fall_back(exc)
            return out

    def _masks(
        self, inputs: tuple[torch.Tensor, ...], noise: MemberNoise, buffers: Tensors
    ) -> tuple[torch.Tensor, ...]:
        """This forward's dropout masks, ``(K, *shape)`` per call, drawn in call order."""
        key = tuple((tuple(x.shape[1:]), x.dtype) for x in inputs)
        calls = self._probed.get(key)
        if calls is None:
            calls = self._probed[key] = self._probe(inputs, buffers)
        return tuple(noise.dropout_mask(p, shape) for p, shape in calls)

    def _probe(self, inputs: tuple[torch.Tensor, ...], buffers: Tensors) -> tuple[DropoutCall, ...]:
        """Member 0's training forward without gradients: its dropout calls; refuses any
        other random op (it would draw from one generator shared by the bundle)."""
        params0 = {n: p.detach()[0] for n, p in self.net.named_parameters()}
        buffers0 = {n: b.detach()[0].clone() for n, b in buffers.items()}
        feed = NoiseFeed(None)
        with torch.no_grad(), RandomOpWatch(self.net) as watch:
            member_call(self.net, params0, buffers0, feed, [x[0] for x in inputs])
        if watch.found is not None:
            op, path = watch.found
            raise self._random_op_error(f"module {path} runs {op}")
        return tuple(feed.calls)

    def _random_op_error(self, what: str) -> ConfigError:
        return ConfigError(
            "model",
            f"{self.name!r}: {what} in training; vmap's random ops draw from "
            "one generator shared by the bundle, so a seed's result would depend on its bundle",
            "use trainables.models.plain.Dropout(p), whose masks come from each seed's own "
            "dropout stream, for dropout; draw any other training noise from MemberNoise",
        )

    def _fall_back(self, exc: BaseException) -> None:
        self.bundling = "loop"
        if self.name not in _warned:
            _warned.add(self.name)
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            log.warning(
                "model %r: vmap cannot run its module (%s); computing the bundle's members one "
                "after another (functional_call per member): same results, slower",
                self.name, reason,
            )


def _tensor_values(module: nn.Module) -> dict[str, torch.Tensor]:
    return dict(module.named_parameters()) | dict(module.named_buffers())


def _refuse_torch_dropout(model: str, module: nn.Module) -> None:
    """Refuse what would make a seed's result depend on its bundle: torch's dropout layers
    (one generator) and norms with running statistics (one state, changed by each step)."""
    for path, sub in module.named_modules():
        if isinstance(sub, nn.modules.batchnorm._NormBase) and sub.track_running_stats:
            raise ConfigError(
                "model",
                f"{model!r}: module {path or '(root)'} is torch.nn.{type(sub).__name__} with running "
                "statistics, buffers each training step changes in place: in a bundle they are one "
                "state for every seed, so a seed's result would depend on its bundle",
                "use a normalisation without running statistics (nn.LayerNorm, nn.GroupNorm)",
            )
        if isinstance(sub, TORCH_DROPOUTS):
            raise ConfigError(
                "model",
                f"{model!r}: module {path or '(root)'} is torch.nn.{type(sub).__name__}, whose "
                "masks come from one generator shared by the bundle (a seed's result would "
                "depend on its bundle)",
                "use trainables.models.plain.Dropout(p), which draws each seed's masks from "
                "its own dropout stream",
            )


# --- classify ----------------------------------------------------------------------------


class PlainClassifierConfig(FrozenConfig):
    """Fields every plain classifier has."""

    loss: LossName = "cross_entropy"
    """Training loss: "cross_entropy", "hinge" (categorical hinge on the logits) or
    "categorical_hinge" (Keras's; :func:`~trainables.models.classify.classify_losses`)."""


class PlainClassifier(PlainModel, BundledClassifier):  # type: ignore[misc]
    """A plain model for ``classify`` tasks: ``build_module`` returns a module mapping one
    seed's batch ``(B, *input_shape)`` to logits ``(B, C)``. Per-example loss and
    predictions (softmax probability vectors) are :class:`BundledClassifier`'s."""

    data_kind = "classify"
    reductions: ClassVar[tuple[str, ...]] = REDUCTIONS
    config: PlainClassifierConfig  # type: ignore[assignment]

    def forward(self, batch: ClassifyBatch, noise: MemberNoise | None = None) -> torch.Tensor:
        """Logits ``(K, B, C)``; ``noise`` None: evaluation."""
        logits: torch.Tensor = self.run_members(batch.x, noise=noise)
        b = batch.x.shape[1]
        c = self.meta.get("n_classes")
        if logits.dim() != 3 or logits.shape[1] != b or (c is not None and logits.shape[2] != int(c)):
            want = f"({b}, {int(c)})" if c is not None else f"({b}, n_classes)"
            raise ConfigError(
                "model",
                f"{self.name!r}: build_module's module maps a batch {tuple(batch.x.shape[1:])} to "
                f"{tuple(logits.shape[1:])}; a classifier's module returns logits (batch, n_classes) = {want}",
                "keep the batch dimension first and give the last layer meta['n_classes'] outputs",
            )
        return logits

    def loss(self, batch: ClassifyBatch, noise: MemberNoise | None, reduction: str) -> torch.Tensor:
        """Per-member loss ``(K,)``, dropout masks from ``noise``."""
        return reduce_losses(classify_losses(self(batch, noise), batch.y, self.config.loss), reduction)
