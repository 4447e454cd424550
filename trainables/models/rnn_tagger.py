"""Single-layer RNN taggers (El-Naggar et al. 2022): LSTM, GRU or ReLU RNN, then Linear + sigmoid.

One recurrent layer from a zero state reads one-hot symbols (``meta["input_size"]``); a
``Linear(H, O)`` and a sigmoid give ``O = meta["output_size"]`` outputs per time step.
Training loss: squared error of the per-step outputs (see ``REDUCTIONS``; the paper's
``mean`` is each sequence's MSE over its own ``O * L`` elements); the trainer sums the
members' losses.

Two implementations (config ``impl``), numerically equivalent:

* ``reference``: PyTorch's own ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN(nonlinearity="relu")``
  (run per member through ``torch.func.functional_call`` on the stacked parameters) and
  ``F.linear`` - the baseline.
* ``fast``: the bundle of K members in one computation with the hand-written cells of
  :mod:`trainables.models.rnn_tagger_cells` over stacked parameters ``(K, ...)``;
  members' sequences are right-padded to a common ``T`` and masked.

Fast path for training (the trainer's optional hook): :meth:`RNNTagger.make_fused_step`
returns a :class:`~trainables.models.rnn_tagger_fused.FusedStep` doing forward, manual
backward, per-member clipping and the SGD/Adam update in one function, optionally under
``torch.compile`` (config ``compile`` or ``train.compile``). Batch size 1 online training
is all per-step overhead, which is what the fused (and compiled) step removes.

Initialisation is PyTorch's default, drawn from the member's generator in a fixed order:
``w_ih, w_hh, b_ih, b_hh`` ~ U(-1/sqrt(H), 1/sqrt(H)) as in ``nn.LSTM.reset_parameters``,
then ``w_out`` (kaiming_uniform with a=sqrt(5), i.e. U(-1/sqrt(H), 1/sqrt(H))) and
``b_out`` ~ U(-1/sqrt(H), 1/sqrt(H)) as in ``nn.Linear``: a lone run seeded with
``torch.manual_seed(s)`` that builds ``nn.LSTM(I, H)`` then ``nn.Linear(H, O)`` starts from
the same values.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import field_validator
from torch import Tensor, nn
from torch.func import functional_call

from trainables.configbase import FrozenConfig
from trainables.data import SeqTags, SplitData
from trainables.errors import ConfigError
from trainables.models.base import MemberNoise, Model
from trainables.models.rnn_tagger_cells import (
    CELLS,
    REDUCTIONS,
    Cell,
    Params,
    loss_weights,
    readout,
    run,
    squared_error,
)
from trainables.registry import MODELS

TORCH_NAMES = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")
"""``nn.LSTM``/``GRU``/``RNN`` names of ``w_ih, w_hh, b_ih, b_hh``."""
_CACHE_SIZE = 8


class RNNTaggerConfig(FrozenConfig):
    """Single-cell RNN tagger."""

    cell: Literal["lstm", "gru", "relu"] = "lstm"
    """Recurrent cell: LSTM, GRU, or an Elman RNN with ReLU (nn.RNN(nonlinearity="relu"))."""
    hidden_size: int = 1
    """Hidden units (El-Naggar et al. use 1)."""
    impl: Literal["fast", "reference"] = "fast"
    """"fast": hand-written cell over the stacked bundle (and the fused training step);
    "reference": torch's nn.LSTM/GRU/RNN per member (the slow baseline)."""
    fused: bool = True
    """impl=fast: train with the fused step (forward + manual backward + optimizer in one
    function); false uses the trainer's generic autograd step."""
    compile: bool = False
    """Compile the fused training step with torch.compile (also on when train.compile is
    true). Costs about 40-60 s per (K, batch size, padded T) shape; T is padded to the
    task's meta["train_max_len"], so there is one shape per run."""

    @field_validator("hidden_size")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 1:
            raise ConfigError("model.hidden_size", f"is {value}", "use a value >= 1")
        return value


@dataclass
class TagBatch:
    """A padded batch. ``R`` is K (each member its own rows) or 1 (every member the same rows).

    ``x``: ``(R, B, T)`` int64 symbol ids (0 on padding); ``y``: ``(R, B, T, O)`` float32
    targets; ``mask``: ``(R, B, T)`` bool, true on real steps; ``lengths``: ``(R, B)``
    numpy int64.
    """

    x: Tensor
    y: Tensor
    mask: Tensor
    lengths: np.ndarray
    outputs: dict[int, tuple[tuple[int, ...], Tensor]] = field(default_factory=dict)
    """Outputs computed without autograd, per model id, with the parameter versions they
    were computed from (evaluation asks for losses and predictions of the same batch)."""


class _Packed:
    """A split's sequences concatenated, for fast padded gathers (one zero row at the end)."""

    def __init__(self, data: SeqTags) -> None:
        self.data = data  # keeps id(data) valid while cached
        self.lengths = np.fromiter((len(s) for s in data.x), dtype=np.int64, count=len(data))
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        n_out = data.y[0].shape[-1] if len(data) else 1
        self.x = np.concatenate([*data.x, np.zeros(1, np.int64)]).astype(np.int64)  # (sum T + 1,)
        self.y = np.concatenate([*data.y, np.zeros((1, n_out), np.float32)]).astype(np.float32)
        self.pad = len(self.x) - 1

    def gather(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``x (R, B, T)``, ``y (R, B, T, O)``, ``mask (R, B, T)``, ``lengths (R, B)`` of ``rows (R, B)``."""
        lengths = self.lengths[rows]  # (R, B)
        steps = np.arange(lengths.max(initial=0))  # (T,)
        mask = steps < lengths[..., None]  # (R, B, T)
        idx = np.where(mask, self.starts[rows][..., None] + steps, self.pad)  # (R, B, T)
        return self.x[idx], self.y[idx], mask, lengths


@MODELS.register
class RNNTagger(Model):
    """K replicas of a one-layer RNN tagger; see the module docstring."""

    name: ClassVar[str] = "rnn_tagger"
    Config: ClassVar[type[FrozenConfig]] = RNNTaggerConfig
    data_kind = "tagging"
    reductions: ClassVar[tuple[str, ...]] = tuple(REDUCTIONS)
    """``mean`` first: the paper's loss (each sequence's mean squared error)."""

    config: RNNTaggerConfig

    def __init__(self, config: FrozenConfig, meta: dict[str, Any], k: int) -> None:
        super().__init__(config, meta, k)
        for key in ("input_size", "output_size"):
            if key not in meta:
                raise ValueError(f"rnn_tagger needs meta[{key!r}] from its task (a tagging task)")
        self.cell: type[Cell] = CELLS[self.config.cell]
        n_h, n_in, n_out = (
            self.config.hidden_size,
            int(meta["input_size"]),
            int(meta["output_size"]),
        )
        gh = self.cell.gates * n_h
        self.w_ih = nn.Parameter(torch.zeros(k, gh, n_in))
        self.w_hh = nn.Parameter(torch.zeros(k, gh, n_h))
        self.b_ih = nn.Parameter(torch.zeros(k, gh))
        self.b_hh = nn.Parameter(torch.zeros(k, gh))
        self.w_out = nn.Parameter(torch.zeros(k, n_out, n_h))
        self.b_out = nn.Parameter(torch.zeros(k, n_out))
        self._packed: OrderedDict[int, _Packed] = OrderedDict()
        # Reference impl: an unregistered torch module whose parameters functional_call replaces.
        module_cls = getattr(nn, self.cell.torch_module)
        extra = {"nonlinearity": "relu"} if self.cell.torch_module == "RNN" else {}
        self._torch_rnn: tuple[nn.Module, ...] = (module_cls(n_in, n_h, batch_first=True, **extra),)

    # ----------------------------------------------------------------- parameters
    def params(self) -> Params:
        """The stacked parameters as a :class:`Params` tuple."""
        return Params(self.w_ih, self.w_hh, self.b_ih, self.b_hh, self.w_out, self.b_out)

    def init_member(self, member: int, generator: torch.Generator) -> None:
        """PyTorch's default init from ``generator``: the RNN's 4 tensors, then the Linear's 2."""
        stdv = 1.0 / math.sqrt(self.config.hidden_size)
        with torch.no_grad():
            for p in (self.w_ih, self.w_hh, self.b_ih, self.b_hh):
                value = nn.init.uniform_(torch.empty(p.shape[1:]), -stdv, stdv, generator=generator)
                p[member].copy_(value)
            w = nn.init.kaiming_uniform_(
                torch.empty(self.w_out.shape[1:]), a=math.sqrt(5), generator=generator
            )
            fan_in = w.shape[1]
            bound = 1.0 / math.sqrt(fan_in)
            b = nn.init.uniform_(
                torch.empty(self.b_out.shape[1:]), -bound, bound, generator=generator
            )
            self.w_out[member].copy_(w)
            self.b_out[member].copy_(b)

    # ----------------------------------------------------------------- batches
    def _pack(self, data: SeqTags) -> _Packed:
        key = id(data)
        packed = self._packed.get(key)
        if packed is None or packed.data is not data:
            packed = _Packed(data)
            self._packed[key] = packed
            while len(self._packed) > _CACHE_SIZE:
                self._packed.popitem(last=False)
        return packed

    def make_batch(
        self, data: SplitData, rows: Sequence[np.ndarray], device: torch.device
    ) -> TagBatch:
        """Pad member rows to the longest sequence in the bundle; shared rows give ``R = 1``."""
        if not isinstance(data, SeqTags):
            raise TypeError(f"rnn_tagger needs tagging data (SeqTags), got {type(data).__name__}")
        stacked = np.asarray(rows, dtype=np.int64)  # (K, B)
        if bool((stacked == stacked[:1]).all()):  # every member the same rows: R = 1
            stacked = stacked[:1]
        x, y, mask, lengths = self._pack(data).gather(stacked)
        return TagBatch(
            x=torch.from_numpy(x).to(device),
            y=torch.from_numpy(y).to(device),
            mask=torch.from_numpy(mask).to(device),
            lengths=lengths,
        )

    # ----------------------------------------------------------------- forward
    def outputs(self, batch: TagBatch) -> Tensor:
        """Sigmoid outputs ``(K, B, T, O)`` (reused within ``no_grad`` while the parameters
        are unchanged)."""
        if torch.is_grad_enabled():
            return self._outputs(batch)
        versions = tuple(p._version for p in self.parameters())
        cached = batch.outputs.get(id(self))
        if cached is None or cached[0] != versions:
            cached = (versions, self._outputs(batch))
            batch.outputs[id(self)] = cached
        return cached[1]

    def _outputs(self, batch: TagBatch) -> Tensor:
        if self.config.impl == "reference":
            return self._reference_outputs(batch)
        hs, _ = run(self.cell, self.params(), batch.x)  # (K, B, T, H)
        return readout(self.params(), hs)

    def _reference_outputs(self, batch: TagBatch) -> Tensor:
        (module,) = self._torch_rnn
        p = self.params()
        onehot = F.one_hot(batch.x, p.w_ih.shape[-1]).to(p.w_ih.dtype)  # (R, B, T, I)
        outs = []
        for k in range(self.k):
            weights = dict(
                zip(TORCH_NAMES, (p.w_ih[k], p.w_hh[k], p.b_ih[k], p.b_hh[k]), strict=True)
            )
            hs, _ = functional_call(module, weights, (onehot[k % onehot.shape[0]],))  # (B, T, H)
            outs.append(torch.sigmoid(F.linear(hs, p.w_out[k], p.b_out[k])))
        return torch.stack(outs)

    def loss(self, batch: TagBatch, noise: MemberNoise | None, reduction: str) -> Tensor:
        """Per-member training loss ``(K,)`` (no dropout: ``noise`` is unused)."""
        check_reduction(reduction)
        y = self.outputs(batch)
        se = squared_error(y, batch.y, batch.mask)  # (K, B, T)
        return (loss_weights(batch.mask, reduction, y.shape[-1]) * se).sum((1, 2))

    def example_losses(self, batch: TagBatch) -> Tensor:
        """Per-sequence MSE ``(K, B)`` (mean over each sequence's ``O * L`` elements)."""
        y = self.outputs(batch)
        se = squared_error(y, batch.y, batch.mask).sum(-1)  # (K, B)
        return se / (y.shape[-1] * batch.mask.sum(-1).clamp(min=1))

    def predict(self, batch: TagBatch) -> list[Sequence[Any]]:
        """K lists of B ``(T_i, O)`` float32 arrays of sigmoid outputs."""
        y = self.outputs(batch).detach().cpu().numpy()  # (K, B, T, O)
        lengths = batch.lengths
        return [
            [y[k, b, : lengths[k % len(lengths), b]] for b in range(y.shape[1])]
            for k in range(self.k)
        ]

    # ----------------------------------------------------------------- fused step
    def make_fused_step(self, train_cfg: Any) -> Any:
        """A :class:`~trainables.models.rnn_tagger_fused.FusedStep` for impl=fast (None otherwise).

        Compiled when ``train_cfg.compile`` or config ``compile`` is true. None too for what
        the fused step does not compute (AdamW, SGD's momentum): the generic step trains those.
        """
        if self.config.impl != "fast" or not self.config.fused:
            return None
        if train_cfg.optimizer not in ("sgd", "adam") or getattr(train_cfg, "momentum", 0.0) != 0:
            return None
        from trainables.models.rnn_tagger_fused import FusedStep

        return FusedStep(self, train_cfg, compiled=bool(train_cfg.compile or self.config.compile))


def check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ConfigError(
            "train.loss_reduction",
            f"rnn_tagger has no loss reduction {reduction!r}",
            f"use one of: {', '.join(REDUCTIONS)} (the paper's loss is 'mean')",
        )
