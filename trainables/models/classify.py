"""What every bundled classifier shares: its batch container, losses, predictions, init.

Models of the ``classify`` data kind (hand-bundled like the MLP and the convnet, or plain
modules bundled by :mod:`trainables.models.plain`) take :class:`ClassifyBatch` es made by
:func:`make_classify_batch`, and predict per example a float32 class-probability vector
``(C,)``, the softmax of the logits; the predicted class is its argmax (what the classify
tasks' ``score`` takes; the toy task's ``grid`` split reads ``p[1]`` from it).

Dense layers of a bundle: ``K`` members, every weight ``(K, out, in)`` (torch's
``nn.Linear`` layout per member) and bias ``(K, out)``, applied with one ``baddbmm``.
:class:`BundledClassifier` holds what the hand-bundled classifiers share (batches,
losses, predictions, an evaluation-logits cache); no fused step.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trainables.configbase import FrozenConfig
from trainables.data import Arrays, SplitData
from trainables.errors import ConfigError
from trainables.models.base import MemberNoise, Model

Init = Literal["torch", "keras", "playground"]
LossName = Literal["cross_entropy", "hinge", "categorical_hinge", "square"]
Activation = Literal["relu", "tanh"]
ACTIVATIONS = {"relu": torch.relu, "tanh": torch.tanh}
REDUCTIONS = ("mean", "sum")


# --- batches -----------------------------------------------------------------------------


@dataclass
class ClassifyBatch:
    """One bundle batch. ``x``: (K, B, *input_shape), or (1, B, *input_shape) when every
    member has the same rows (evaluation), broadcast over the members; ``y``: (K, B)."""

    x: torch.Tensor
    y: torch.Tensor
    cache: tuple[Any, torch.Tensor] | None = None
    """Evaluation logits with the (model, parameter versions) they were computed for."""

    @property
    def shared(self) -> bool:
        return self.x.shape[0] == 1


def gather_rows(data: SplitData, rows: Sequence[np.ndarray], kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Member k's rows ``rows[k]`` of an :class:`Arrays` split: ``x`` (K, B, ...) float32, or
    (1, B, ...) when every member has the same rows (evaluation), and ``y`` (K, B, ...) as
    stored. ``kind`` names the models in the error for another container."""
    if not isinstance(data, Arrays):
        raise TypeError(f"{kind} models need Arrays data, got {type(data).__name__}")
    index = np.stack([np.asarray(r, dtype=np.int64) for r in rows])  # (K, B)
    shared = all(np.array_equal(index[0], r) for r in index[1:])
    x = torch.from_numpy(np.ascontiguousarray(data.x[index[:1] if shared else index]))
    return x.float(), torch.from_numpy(np.ascontiguousarray(data.y[index]))


def make_classify_batch(
    data: SplitData, rows: Sequence[np.ndarray], device: torch.device | str
) -> ClassifyBatch:
    """Gather member k's rows ``rows[k]`` of an :class:`Arrays` split into a batch."""
    x, y = gather_rows(data, rows, "classify")
    return ClassifyBatch(x=x.to(device), y=y.long().to(device))


# --- losses and predictions --------------------------------------------------------------


def classify_losses(logits: torch.Tensor, y: torch.Tensor, loss: LossName) -> torch.Tensor:
    """Per-example losses (K, B) from logits (K, B, C) and labels (K, B).

    ``hinge`` is the categorical hinge ``max(0, 1 + max_{j != y} z_j - z_y)``.
    ``categorical_hinge`` is Keras's (``keras.losses.categorical_hinge``: ``neg = max((1 -
    onehot) * z)``, ``max(0, neg - pos + 1)``): its max also runs over the 0 that
    ``(1 - onehot) * z`` puts in the true class's place, i.e. ``max(0, 1 + max(0, max_{j != y}
    z_j) - z_y)``. The two differ only when every wrong-class logit is negative (never on
    softmax outputs); Li et al.'s Keras code trains its logits with Keras's.

    ``square`` (binary tasks only) is TensorFlow Playground's ``Errors.SQUARE``,
    ``0.5 (o - t)^2``, of the output ``o = tanh((z1 - z0) / 2)`` (= ``p1 - p0``, in (-1, 1);
    exactly the tanh output unit of an MLP with ``output_activation: tanh``, whose logits
    are ``(-a, a)``) against the target ``t = 2y - 1`` (Playground's -1/+1 labels).
    """
    if loss == "cross_entropy":
        k, b, c = logits.shape
        return F.cross_entropy(logits.reshape(k * b, c), y.reshape(-1), reduction="none").view(k, b)
    if loss == "square":
        if logits.shape[-1] != 2:
            raise ConfigError(
                "model.loss",
                f"square needs a binary task (2 classes), this one has {logits.shape[-1]}",
                "use cross_entropy or hinge",
            )
        out = torch.tanh((logits[..., 1] - logits[..., 0]) / 2)  # (K, B)
        return 0.5 * (out - (2.0 * y - 1.0)) ** 2  # (K, B)
    true = logits.gather(-1, y.unsqueeze(-1)).squeeze(-1)  # (K, B)
    wrong = logits.masked_fill(F.one_hot(y, logits.shape[-1]).bool(), float("-inf")).amax(-1)  # (K, B)
    if loss == "categorical_hinge":
        wrong = torch.clamp(wrong, min=0.0)  # Keras's max over (1 - onehot) * z includes a 0
    return torch.clamp(1.0 + wrong - true, min=0.0)  # (K, B)


def reduce_losses(example_losses: torch.Tensor, reduction: str) -> torch.Tensor:
    """(K, B) -> (K,): ``mean`` (over each member's batch) or ``sum``."""
    if reduction == "mean":
        return example_losses.mean(dim=1)
    if reduction == "sum":
        return example_losses.sum(dim=1)
    raise ConfigError(
        "train.loss_reduction",
        f"{reduction!r} is not a reduction of classify models",
        f"use one of {', '.join(REDUCTIONS)}",
    )


def class_probabilities(logits: torch.Tensor) -> list[list[np.ndarray]]:
    """K lists of B float32 probability vectors (C,) from logits (K, B, C)."""
    probs = torch.softmax(logits.detach().float(), dim=-1).cpu().numpy()  # (K, B, C)
    return [list(member) for member in probs]


# --- init --------------------------------------------------------------------------------


def init_weight_bias(
    weight: torch.Tensor, bias: torch.Tensor, scheme: Init, generator: torch.Generator
) -> None:
    """Fill one member's ``weight`` (out, in, ...) then ``bias`` (out,) in place.

    ``torch``: PyTorch's default for ``nn.Linear``/``nn.Conv2d`` (kaiming-uniform with
    a = sqrt(5), i.e. U(+-1/sqrt(fan_in)), and bias U(+-1/sqrt(fan_in))); ``keras``:
    glorot-uniform (U(+-sqrt(6 / (fan_in + fan_out)))) and zero bias; ``playground``:
    TensorFlow Playground's (src/nn.ts: ``Link.weight = Math.random() - 0.5``, ``Node.bias =
    0.1``), every weight U(-0.5, 0.5) and every bias 0.1 (no draw).
    """
    with torch.no_grad():
        if scheme == "torch":
            nn.init.kaiming_uniform_(weight, a=math.sqrt(5), generator=generator)
            bound = 1.0 / math.sqrt(weight[0].numel())
            bias.uniform_(-bound, bound, generator=generator)
        elif scheme == "playground":
            weight.uniform_(-0.5, 0.5, generator=generator)
            bias.fill_(0.1)
        else:
            nn.init.xavier_uniform_(weight, generator=generator)
            bias.zero_()


def dense_stack(sizes: Sequence[int], k: int) -> tuple[nn.ParameterList, nn.ParameterList]:
    """Weights (K, out, in) and biases (K, out) for consecutive ``sizes``."""
    weights = nn.ParameterList(
        nn.Parameter(torch.zeros(k, n_out, n_in)) for n_in, n_out in itertools.pairwise(sizes)
    )
    biases = nn.ParameterList(nn.Parameter(torch.zeros(k, n)) for n in sizes[1:])
    return weights, biases


def dense_forward(
    h: torch.Tensor,
    weights: nn.ParameterList,
    biases: nn.ParameterList,
    activation: Activation = "relu",
) -> torch.Tensor:
    """Dense layers with ``activation`` between them (not after the last): (K|1, B, in) ->
    (K, B, out)."""
    k = weights[0].shape[0]
    h = h.expand(k, -1, -1)
    last = len(weights) - 1
    act = ACTIVATIONS[activation]
    for i, (w, b) in enumerate(zip(weights, biases, strict=True)):
        h = torch.baddbmm(b.unsqueeze(1), h, w.transpose(1, 2))  # (K, B, out)
        if i < last:
            h = act(h)
    return h


def check_sizes(field: str, sizes: tuple[int, ...]) -> tuple[int, ...]:
    if any(s < 1 for s in sizes):
        raise ConfigError(field, f"has a layer of size < 1: {sizes}", "use positive sizes")
    return sizes


# --- the shared base and the MLP ---------------------------------------------------------


class ClassifierConfig(FrozenConfig):
    """Fields every bundled classifier has."""

    init: Init = "torch"
    """"torch": PyTorch's default for nn.Linear / nn.Conv2d (kaiming-uniform a=sqrt(5), bias
    U(+-1/sqrt(fan_in))); "keras": glorot-uniform weights and zero biases (Keras's default);
    "playground": TensorFlow Playground's, weights U(-0.5, 0.5) and biases 0.1."""
    loss: LossName = "cross_entropy"
    """Training loss: "cross_entropy", "hinge" (categorical hinge on the logits),
    "categorical_hinge" (Keras's, :func:`classify_losses`) or "square"
    (binary tasks: TensorFlow Playground's 0.5 (o - t)^2 of the tanh output o = p1 - p0 against
    t = -1/+1)."""


class BundledClassifier(Model):
    """What the bundled classifiers share, given ``forward(batch) -> logits (K, B, C)``:
    batches, losses and probability-vector predictions. Not registered itself.

    The trainer evaluates a batch with ``example_losses`` and then ``predict``; under
    ``torch.no_grad`` the logits are computed once and cached on the batch, keyed by the
    model and its parameters' versions (any in-place update invalidates them).
    """

    data_kind = "classify"
    reductions: ClassVar[tuple[str, ...]] = REDUCTIONS
    config: ClassifierConfig

    def make_batch(
        self, data: SplitData, rows: Sequence[np.ndarray], device: torch.device
    ) -> ClassifyBatch:
        return make_classify_batch(data, rows, device)

    def loss(self, batch: ClassifyBatch, noise: MemberNoise | None, reduction: str) -> torch.Tensor:
        """Per-member loss (K,); there is no dropout, so ``noise`` is unused."""
        return reduce_losses(classify_losses(self(batch), batch.y, self.config.loss), reduction)

    def example_losses(self, batch: ClassifyBatch) -> torch.Tensor:
        return classify_losses(self.eval_logits(batch), batch.y, self.config.loss)

    def predict(self, batch: ClassifyBatch) -> list[Sequence[Any]]:
        return class_probabilities(self.eval_logits(batch))  # type: ignore[return-value]

    def eval_logits(self, batch: ClassifyBatch) -> torch.Tensor:
        """``self(batch)``, cached on the batch while gradients are off."""
        if torch.is_grad_enabled():
            return self(batch)
        key = (id(self), tuple(p._version for p in self.parameters()))
        if batch.cache is None or batch.cache[0] != key:
            batch.cache = (key, self(batch))
        return batch.cache[1]

    def make_fused_step(self, train_cfg: Any) -> None:
        """No fast path: the trainer's generic step is all these models need."""
        return None
