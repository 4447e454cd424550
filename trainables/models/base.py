"""The Model base class: a bundle of K independent replicas in one computation.

Every parameter carries a leading member dimension K (``(K, ...)``); member ``k`` of a
bundle computes exactly what a lone (K=1) model with the same seeds computes. The
rules that make this true, which every model family follows:

* **Init**: :meth:`Model.init_member` fills member ``k``'s slice of every parameter,
  in a fixed order, from that member's own generator (seeded by its ``init_seed``).
* **Batches**: each member gets its own rows (its own data order). Sequences are padded
  to the longest in the whole bundle and masked, so padding never changes a member's
  loss or gradient.
* **Noise**: dropout masks come from :class:`MemberNoise`: one generator per member,
  masks drawn in a *canonical* per-member shape (independent of bundle padding) and
  sliced, so member ``k`` sees the masks a lone run would.
* **Loss**: :meth:`Model.loss` returns one loss per member ``(K,)``; the trainer sums
  them before ``backward`` (never averages: that would scale every gradient by 1/K).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from trainables.configbase import FrozenConfig
from trainables.data import DataKind, SplitData
from trainables.seeding import torch_generator


class MemberNoise:
    """Per-member random streams for training-time noise (dropout).

    ``rates``: members trained with different dropout probabilities (each its own config's
    ``model.dropout``, see :mod:`trainables.optim`): member k's rate replaces the model's
    ``p`` wherever the model asks for dropout (:meth:`dropout_mask`, :meth:`member_rates`).
    A member whose rate is 0 gets masks of ones and draws nothing, as a lone run with
    dropout 0 draws nothing (models skip dropout at p = 0)."""

    positional = False
    """Whether masks may be drawn over a padded grid keyed by position (:class:`~trainables.
    models.counter_noise.CounterNoise`); False: over each member's real rows in order."""

    def __init__(
        self, seeds: Sequence[int], device: torch.device | str = "cpu",
        rates: Sequence[float] | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.generators = [torch_generator(s, self.device) for s in seeds]
        if rates is not None and len(rates) != len(self.generators):
            raise ValueError(f"{len(rates)} dropout rates for {len(self.generators)} members")
        self.rates = None if rates is None else tuple(float(r) for r in rates)
        """Per-member dropout probabilities replacing the model's; None: the model's for all."""

    def __len__(self) -> int:
        return len(self.generators)

    def multipliers(self, p: float, elements: torch.Tensor) -> torch.Tensor | None:
        """Masks keyed by position (:attr:`positional` noise only; see
        :class:`~trainables.models.counter_noise.CounterNoise`)."""
        raise TypeError("generator noise draws rows in order; it has no masks keyed by position")

    def member_rates(self, p: float) -> tuple[float, ...]:
        """Each member's dropout probability where the model's is ``p``."""
        return self.rates if self.rates is not None else (p,) * len(self)

    def keep(self, rows: Sequence[int]) -> None:
        """Keep the streams (and rates) of rows ``rows`` only (compaction)."""
        self.generators = [self.generators[r] for r in rows]
        if self.rates is not None:
            self.rates = tuple(self.rates[r] for r in rows)

    def dropout_mask(self, p: float, shape: Sequence[int]) -> torch.Tensor:
        """Inverted-dropout masks ``(K, *shape)``: 0 or 1/(1-p), member k from generator k
        (with :attr:`rates`, member k's rate in place of ``p``).

        ``shape`` is the canonical per-member shape: callers slice the result to the
        padded size they need, so the stream a member consumes never depends on what
        the other members of its bundle look like.
        """
        if self.rates is not None:
            return torch.stack([self._member_mask(q, shape, g) for q, g in zip(self.rates, self.generators, strict=True)])
        keep = 1.0 - p
        masks = [
            torch.empty(tuple(shape), device=self.device).bernoulli_(keep, generator=g)
            for g in self.generators
        ]
        return torch.stack(masks).div_(keep)

    def _member_mask(self, p: float, shape: Sequence[int], g: torch.Generator) -> torch.Tensor:
        if p == 0.0:
            return torch.ones(tuple(shape), device=self.device)
        keep = 1.0 - p
        return torch.empty(tuple(shape), device=self.device).bernoulli_(keep, generator=g).div_(keep)

    def state(self) -> list[torch.Tensor]:
        return [g.get_state() for g in self.generators]

    def set_state(self, states: Sequence[torch.Tensor]) -> None:
        for g, s in zip(self.generators, states, strict=True):
            g.set_state(s)


class Model(nn.Module, ABC):
    """A model family over one data kind, holding K replicas with stacked parameters."""

    name: ClassVar[str]
    Config: ClassVar[type[FrozenConfig]]
    data_kind: ClassVar[DataKind]
    reductions: ClassVar[tuple[str, ...]]
    """The values ``train.loss_reduction`` may take with this model (what :meth:`loss`
    accepts); the first is the default when a study file leaves it unset."""
    tiny: ClassVar[dict[str, Any]] = {}
    """Config overrides for a small, fast model in the contract test."""
    cpu_bundle_cap: ClassVar[int | None] = None
    """``bundle_size: auto`` on CPUs puts at most this many seeds in a bundle (None: no cap).
    Set it where throughput per thread stops growing with K: a bundle runs until its slowest
    member stops early, so beyond that point a bigger bundle only computes frozen members."""
    eval_rows: ClassVar[int | None] = None
    """On a CPU, an evaluation batch holds at most this many (member, example) rows: the
    trainer's ``eval_batch_size`` examples per batch is capped at ``eval_rows // K`` (None:
    no cap). Set it where a bundle's evaluation throughput peaks (its working set leaves
    the cache beyond it)."""

    @classmethod
    def max_bundle(cls, config: FrozenConfig) -> int | None:
        """The most seeds one bundle of ``config`` may hold (None: any number), checked before
        Ray against ``execution.bundle_size`` (``auto`` keeps to it). The default follows the
        convention that a config field ``impl: reference`` selects a one-seed reference
        implementation (seq2seq's); a model with other limits overrides this."""
        return 1 if getattr(config, "impl", None) == "reference" else None

    @classmethod
    def takes_counter_noise(cls, config: FrozenConfig) -> bool:
        """Whether ``config`` can train with counter-based dropout masks
        (``execution.cuda_graphs``; checked before Ray). Every model whose masks go through
        :meth:`MemberNoise.dropout_mask` can; by the convention of :meth:`max_bundle`, a
        one-seed reference implementation (``impl: reference``) draws its own and cannot."""
        return getattr(config, "impl", None) != "reference"

    @classmethod
    def metric_names(cls, config: FrozenConfig) -> tuple[str, ...]:
        """Names :meth:`example_metrics` returns with ``config`` (``loss`` first). Checked
        before Ray against what a study selects on or tunes; a model adding metrics
        overrides this (and the contract suite checks the two agree)."""
        return ("loss",)

    def __init__(self, config: FrozenConfig, meta: dict[str, Any], k: int) -> None:
        super().__init__()
        self.config = config
        self.meta = meta
        self.k = k

    @abstractmethod
    def init_member(self, member: int, generator: torch.Generator) -> None:
        """Initialise member ``member``'s parameters from ``generator`` in a fixed order."""

    def set_member_dropout(self, rates: Sequence[float]) -> None:
        """Members will train with their own dropout probabilities ``rates`` (member k's
        ``model.dropout``; the trainer calls this before :meth:`init_member`). The masks'
        rates come from :class:`MemberNoise` (its ``rates`` replace the model's ``p``), so a
        family whose dropout draws go through ``dropout_mask`` / ``member_rates`` needs
        nothing more. Override to adapt the model, or to raise ConfigError for what the
        family cannot honour (the contract suite checks the members against lone runs)."""

    @abstractmethod
    def make_batch(
        self, data: SplitData, rows: Sequence[np.ndarray], device: torch.device
    ) -> Any:
        """Collate one batch: ``rows[k]`` are member k's example indices into ``data``.

        All members get the same number of rows.
        """

    def graph_batch(self, data: SplitData, rows: Sequence[np.ndarray], device: torch.device) -> Any | None:
        """:meth:`make_batch` for a captured training step (``execution.cuda_graphs``): a
        dataclass batch whose tensors take one of a few shapes (padded to buckets), whose
        :meth:`loss` under positional noise (:attr:`MemberNoise.positional`) reads nothing
        but those tensors and does not synchronise with the host. None (the default): this
        model's loss is not captured; its steps run eagerly."""
        return None

    def train_layout(self, data: SplitData, rows: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Each member's training rows in the order its batch lays them out (default: as
        drawn). The order within a batch changes no loss; a model may pick one it computes
        faster (seq2seq: longest targets first). Only a member's own rows may decide its order."""
        return list(rows)

    @abstractmethod
    def loss(self, batch: Any, noise: MemberNoise | None, reduction: str) -> torch.Tensor:
        """Training loss per member, ``(K,)``. ``noise`` is None in evaluation."""

    @abstractmethod
    def example_losses(self, batch: Any) -> torch.Tensor:
        """Evaluation loss per member and example, ``(K, B)``, without noise."""

    def example_metrics(self, batch: Any) -> dict[str, torch.Tensor]:
        """Per-example evaluation values ``{name: (K, B)}`` made from the model's own outputs,
        ``loss`` first; a model may add metrics its task cannot compute from predictions
        (seq2seq: teacher-forced exact match)."""
        return {"loss": self.example_losses(batch)}

    def evaluate_batch(self, batch: Any) -> tuple[dict[str, torch.Tensor], list[Sequence[Any]]]:
        """:meth:`example_metrics` and :meth:`predict` of one evaluation batch, which a model
        may compute sharing work (seq2seq encodes the batch once for both)."""
        return self.example_metrics(batch), self.predict(batch)

    captures_evaluation: ClassVar[bool] = False
    """Whether :meth:`evaluate_batch` splits into :meth:`eval_tensors`, which a CUDA graph
    can capture for a :meth:`graph_batch` batch (``execution.cuda_graphs``), and
    :meth:`eval_from_tensors`. False (the default): evaluation runs eagerly."""

    def eval_tensors(self, batch: Any) -> tuple[torch.Tensor, ...]:
        """The device part of :meth:`evaluate_batch`: tensors computed from ``batch``'s tensors
        (and :meth:`graph_key`'s values) alone, without host synchronisation."""
        raise NotImplementedError(f"{type(self).__name__} does not capture its evaluation")

    def eval_from_tensors(
        self, outputs: tuple[torch.Tensor, ...], batch: Any
    ) -> tuple[dict[str, torch.Tensor], list[Sequence[Any]]]:
        """:meth:`evaluate_batch`'s result from :meth:`eval_tensors`' ``outputs``."""
        raise NotImplementedError(f"{type(self).__name__} does not capture its evaluation")

    def graph_key(self, batch: Any) -> tuple[Any, ...]:
        """Host values besides the tensors' shapes that a captured computation of ``batch``
        bakes in (seq2seq: the decoding length); a graph is captured per shape and key."""
        return ()

    @abstractmethod
    def predict(self, batch: Any) -> list[Sequence[Any]]:
        """Predictions, ``K`` sequences of ``B`` task-level predictions (what ``Task.score``
        takes), e.g. lists, or :class:`~trainables.data.TokenRows` for token sequences."""

    def member_state(self, member: int) -> dict[str, torch.Tensor]:
        """Member ``member``'s parameters as a plain state dict (leading dim removed)."""
        return {n: p.detach()[member].clone() for n, p in self.named_parameters()}

    def load_member_state(self, member: int, state: dict[str, torch.Tensor]) -> None:
        """Row ``member`` := ``state`` (what :meth:`member_state` returned, any device)."""
        with torch.no_grad():
            for n, p in self.named_parameters():
                p[member].copy_(state[n])

    def load_member_states(self, states: Sequence[Mapping[str, torch.Tensor] | None]) -> None:
        """Rebuild the bundle from saved members: row ``k`` := ``states[k]`` (a
        :meth:`member_state` of any model of this config, e.g. kept weights loaded from disk);
        None leaves row ``k`` as it is. Raises ValueError naming the first tensor whose name
        or shape does not fit (the model's code or config changed since they were saved)."""
        if len(states) != self.k:
            raise ValueError(f"{len(states)} member states for a bundle of {self.k}")
        want = {n: tuple(t.shape[1:]) for n, t in self.member_tensors().items()}
        for k, state in enumerate(states):
            if state is None:
                continue
            got = {n: tuple(t.shape) for n, t in state.items()}
            for name in sorted(set(want) | set(got)):
                if want.get(name) != got.get(name):
                    raise ValueError(
                        f"member {k}: tensor {name!r} is {got.get(name, 'missing')} in the saved "
                        f"state but {want.get(name, 'absent')} in model {self.name!r}"
                    )
            self.load_member_state(k, dict(state))

    def member_tensors(self) -> dict[str, torch.Tensor]:
        """The stacked tensors :meth:`member_state` reads, by name (each ``(K, ...)``)."""
        return dict(self.named_parameters())
