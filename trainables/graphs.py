"""A bundle's training loss and gradients as CUDA graphs, one per batch shape.

On a GPU a seq2seq bundle step is bound by the host: its LSTMs run step by step, and each
of the ~1,000 small kernels of a forward and backward costs more Python and launch time
than GPU time (docs/performance.md, "GPU"). A CUDA graph records those launches once and
replays them as one. What it needs, and where fineline provides it:

* **Fixed shapes.** :meth:`~trainables.models.base.Model.graph_batch` pads a batch to a few
  buckets (seq2seq: S and T to multiples of 4, the token list to a multiple of 128), and
  :class:`CapturedLoss` keeps one graph per shape, with its own static input tensors the
  batch is copied into before each replay.
* **Noise inside the graph.** :class:`~trainables.models.counter_noise.CounterNoise`
  computes every member's masks from its seed and a device counter that the graph itself
  advances (generator draws of data-dependent sizes cannot be replayed).
* **No host synchronisation** in the loss or its backward (the seq2seq torch ops have none).

What is captured: ``model.loss`` and ``backward`` of the active members' summed losses, the
gradients landing in tensors the graph owns (``p.grad`` points at them after a replay).
Clipping and the optimizer step run eagerly after it (their learning rates change with a
schedule; each is a few launches per parameter). The first sighting of a shape runs
eagerly, the second captures (after one warm-up pass on the capture stream whose effects
are undone) and replays. A replay computes what the eager step computes on the same padded
batch (the same kernels, in the same order).

Parameters must keep their storage while graphs exist: :meth:`CapturedLoss.clear` after
anything that replaces them (compaction).

:class:`CapturedEval` does the same for the device part of an evaluation batch
(:meth:`~trainables.models.base.Model.eval_tensors`; seq2seq: the teacher-forced losses and
greedy decoding), one graph per batch shape and :meth:`~trainables.models.base.Model.graph_key`
(the decoding length), all drawing on one memory pool: an evaluation copies each replay's
outputs before the next replay, so one graph's scratch memory may be another's.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from trainables.models.base import MemberNoise, Model


@dataclass
class _Graph:
    graph: Any  # torch.cuda.CUDAGraph
    inputs: Any
    """The static batch: the tensors the graph reads, refilled before each replay."""
    active: torch.Tensor
    losses: torch.Tensor
    grads: list[torch.Tensor | None]


def loss_backward(model: Model, batch: Any, noise: MemberNoise | None, reduction: str, active: torch.Tensor) -> torch.Tensor:
    """The generic training step's loss and backward: the (K,) losses of ``batch``, the
    active members' (``active`` (K,) bool) summed and differentiated; returns the losses
    detached, gradients in ``p.grad`` (added to what is there)."""
    losses = model.loss(batch, noise, reduction)  # (K,)
    torch.where(active, losses, torch.zeros_like(losses)).sum().backward()
    return losses.detach()


def tensor_fields(batch: Any) -> list[str]:
    """Names of a dataclass batch's tensor fields (what a graph reads)."""
    return [f.name for f in dataclasses.fields(batch) if isinstance(getattr(batch, f.name), torch.Tensor)]


def shape_key(batch: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The shapes a graph is captured for: every tensor field's."""
    return tuple((name, tuple(getattr(batch, name).shape)) for name in tensor_fields(batch))


G = TypeVar("G")


class _PerShape(Generic[G]):
    """One captured graph per key of a batch, captured at the key's ``warm_sightings + 1``-th
    sighting; the first failure to capture turns capturing off (with a warning): every later
    call runs eagerly."""

    what = "a step"

    def __init__(self, warm_sightings: int) -> None:
        self.warm_sightings = warm_sightings
        """Sightings of a key that run eagerly before its graph is captured."""
        self.graphs: dict[Any, G] = {}
        self.sightings: dict[Any, int] = {}
        self.failed: str | None = None
        """Why capturing failed (then every call runs eagerly), or None."""
        self.replays = 0
        self.eager = 0

    def clear(self) -> None:
        """Drop every graph (the parameters were replaced)."""
        self.graphs.clear()
        self.sightings.clear()

    def _key(self, batch: Any) -> Any:
        return shape_key(batch)

    def _capture(self, batch: Any, *args: Any) -> G:
        raise NotImplementedError

    def _graph(self, batch: Any, *args: Any) -> G | None:
        """The graph for ``batch``'s key, captured now if this sighting is the one; None:
        run this call eagerly."""
        if self.failed is not None:
            return None
        key = self._key(batch)
        entry = self.graphs.get(key)
        if entry is None:
            seen = self.sightings.get(key, 0) + 1
            self.sightings[key] = seen
            if seen <= self.warm_sightings:
                return None
            try:
                entry = self._capture(batch, *args)
            except RuntimeError as e:  # an op that cannot be captured: say so, run eagerly
                self.failed = f"{type(e).__name__}: {e}"
                warnings.warn(f"fineline: capturing {self.what} as a CUDA graph failed, it runs "
                              f"eagerly: {self.failed}", RuntimeWarning, stacklevel=3)
                torch.cuda.synchronize()
                return None
            self.graphs[key] = entry
        return entry


T = TypeVar("T")


def _warm_and_capture(fn: Callable[[], T], undo: Callable[[], None] | None = None, pool: Any = None) -> tuple[Any, T]:
    """``fn`` run once on a side stream (lazy library state is set up there), ``undo``
    reverting what that run changed, then ``fn`` captured as a CUDA graph on the same stream
    (in ``pool``, a :func:`torch.cuda.graph_pool_handle`, where given): the graph and the
    outputs it writes."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    if undo is not None:
        undo()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        outputs = fn()
    return graph, outputs


def _static(batch: Any) -> Any:
    """``batch`` with copies of its tensors: the inputs a graph reads, refilled per replay."""
    return dataclasses.replace(batch, **{n: getattr(batch, n).clone() for n in tensor_fields(batch)})


def _refill(static: Any, batch: Any) -> None:
    for name in tensor_fields(batch):
        getattr(static, name).copy_(getattr(batch, name))


class CapturedLoss(_PerShape[_Graph]):
    """Loss and gradients of ``model`` under ``noise`` (positional), one CUDA graph per
    batch shape (see the module doc). Call with a :meth:`Model.graph_batch` batch and the
    (K,) bool active mask; returns the (K,) losses and leaves the gradients in ``p.grad``."""

    what = "the training step"

    def __init__(self, model: Model, noise: MemberNoise, reduction: str, warm_sightings: int = 1) -> None:
        if not noise.positional:
            raise ValueError("captured steps need positional noise (CounterNoise)")
        super().__init__(warm_sightings)
        self.model = model
        self.noise = noise
        self.reduction = reduction

    def _params(self) -> list[torch.Tensor]:
        return list(self.model.parameters())

    def _loss_backward(self, batch: Any, active: torch.Tensor) -> torch.Tensor:
        return loss_backward(self.model, batch, self.noise, self.reduction, active)

    def _eager(self, batch: Any, active: torch.Tensor) -> torch.Tensor:
        self.eager += 1
        for p in self._params():
            p.grad = None
        return self._loss_backward(batch, active)

    def __call__(self, batch: Any, active: torch.Tensor) -> torch.Tensor:
        entry = self._graph(batch, active)
        if entry is None:
            return self._eager(batch, active)
        _refill(entry.inputs, batch)
        entry.active.copy_(active)
        entry.graph.replay()
        self.replays += 1
        for p, g in zip(self._params(), entry.grads, strict=True):
            p.grad = g
        return entry.losses.clone()

    def _capture(self, batch: Any, active: torch.Tensor) -> _Graph:
        params = self._params()
        static = _static(batch)
        static_active = active.clone()
        saved = self.noise.state()

        def step() -> torch.Tensor:
            for p in params:
                p.grad = None  # the graph's backward then writes (not adds) gradients it owns
            return self._loss_backward(static, static_active)

        # the warm-up's draws did not happen
        graph, losses = _warm_and_capture(step, undo=lambda: self.noise.set_state(saved))
        return _Graph(graph, static, static_active, losses, [p.grad for p in params])


@dataclass
class _EvalGraph:
    graph: Any  # torch.cuda.CUDAGraph
    inputs: Any
    outputs: tuple[torch.Tensor, ...]


class CapturedEval(_PerShape[_EvalGraph]):
    """:meth:`Model.eval_tensors` of ``model`` as CUDA graphs, one per batch shape and
    :meth:`Model.graph_key` (see the module doc). Call with a :meth:`Model.graph_batch`
    batch, under ``torch.no_grad``; returns copies of the outputs."""

    what = "an evaluation batch"

    def __init__(self, model: Model, warm_sightings: int = 1) -> None:
        super().__init__(warm_sightings)
        self.model = model
        self.pool: Any = None
        """The memory pool every evaluation graph draws on (made at the first capture)."""

    def _key(self, batch: Any) -> Any:
        return shape_key(batch), self.model.graph_key(batch)

    def __call__(self, batch: Any) -> tuple[torch.Tensor, ...]:
        entry = self._graph(batch)
        if entry is None:
            self.eager += 1
            return self.model.eval_tensors(batch)
        _refill(entry.inputs, batch)
        entry.graph.replay()
        self.replays += 1
        return tuple(t.clone() for t in entry.outputs)

    def _capture(self, batch: Any) -> _EvalGraph:
        static = _static(batch)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph, outputs = _warm_and_capture(lambda: self.model.eval_tensors(static), pool=self.pool)
        return _EvalGraph(graph, static, outputs)
