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
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

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


class CapturedLoss:
    """Loss and gradients of ``model`` under ``noise`` (positional), one CUDA graph per
    batch shape (see the module doc). Call with a :meth:`Model.graph_batch` batch and the
    (K,) bool active mask; returns the (K,) losses and leaves the gradients in ``p.grad``."""

    def __init__(self, model: Model, noise: MemberNoise, reduction: str, warm_sightings: int = 1) -> None:
        if not noise.positional:
            raise ValueError("captured steps need positional noise (CounterNoise)")
        self.model = model
        self.noise = noise
        self.reduction = reduction
        self.warm_sightings = warm_sightings
        """Sightings of a shape that run eagerly before its graph is captured."""
        self.graphs: dict[tuple[Any, ...], _Graph] = {}
        self.sightings: dict[tuple[Any, ...], int] = {}
        self.failed: str | None = None
        """Why capturing failed (then every step runs eagerly), or None."""
        self.replays = 0
        self.eager = 0

    def clear(self) -> None:
        """Drop every graph (the parameters were replaced)."""
        self.graphs.clear()
        self.sightings.clear()

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
        if self.failed is not None:
            return self._eager(batch, active)
        key = shape_key(batch)
        entry = self.graphs.get(key)
        if entry is None:
            seen = self.sightings.get(key, 0) + 1
            self.sightings[key] = seen
            if seen <= self.warm_sightings:
                return self._eager(batch, active)
            try:
                entry = self._capture(batch, active)
            except RuntimeError as e:  # an op that cannot be captured: say so, run eagerly
                self.failed = f"{type(e).__name__}: {e}"
                warnings.warn(f"fineline: capturing the training step as a CUDA graph failed, "
                              f"it runs eagerly: {self.failed}", RuntimeWarning, stacklevel=2)
                torch.cuda.synchronize()
                return self._eager(batch, active)
            self.graphs[key] = entry
        for name in tensor_fields(batch):
            getattr(entry.inputs, name).copy_(getattr(batch, name))
        entry.active.copy_(active)
        entry.graph.replay()
        self.replays += 1
        for p, g in zip(self._params(), entry.grads, strict=True):
            p.grad = g
        return entry.losses.clone()

    def _capture(self, batch: Any, active: torch.Tensor) -> _Graph:
        params = self._params()
        static = dataclasses.replace(batch, **{n: getattr(batch, n).clone() for n in tensor_fields(batch)})
        static_active = active.clone()
        saved = self.noise.state()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up on the capture stream (lazy library state)
            for p in params:
                p.grad = None
            self._loss_backward(static, static_active)
        torch.cuda.current_stream().wait_stream(stream)
        self.noise.set_state(saved)  # the warm-up's draws did not happen
        for p in params:
            p.grad = None  # the graph's backward then writes (not adds) gradients it owns
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            losses = self._loss_backward(static, static_active)
        return _Graph(graph, static, static_active, losses, [p.grad for p in params])
