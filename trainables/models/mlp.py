"""A bundled multi-layer perceptron for ``classify`` tasks.

Every dense layer is a weight ``(K, out, in)`` and a bias ``(K, out)`` over the ``K``
members, applied with one ``baddbmm`` (:func:`~trainables.models.classify.dense_forward`);
batches, losses and predictions are the classifiers' shared ones
(:mod:`trainables.models.classify`).

TensorFlow Playground's network (Li et al. 2021 trained their 2-D toy there) is
``activation: tanh``, ``output_activation: tanh``, ``init: playground`` and, for its
squared error, ``loss: square`` (src/nn.ts, src/playground.ts).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import torch
from pydantic import field_validator

from trainables.configbase import FrozenConfig, added_field
from trainables.errors import ConfigError
from trainables.models.classify import (
    Activation,
    BundledClassifier,
    ClassifierConfig,
    ClassifyBatch,
    check_sizes,
    dense_forward,
    dense_stack,
    init_weight_bias,
)
from trainables.registry import MODELS


class MLPConfig(ClassifierConfig):
    """Bundled MLP settings."""

    hidden: tuple[int, ...] = (8, 8, 8)
    """Hidden layer sizes, each followed by the `activation` (empty = a linear model)."""
    activation: Activation = added_field("relu")
    """Hidden activation: "relu", or "tanh" (TensorFlow Playground's default)."""
    output_activation: Literal["softmax", "tanh"] = added_field("softmax")
    """"softmax": one output per class, probabilities their softmax. "tanh" (binary tasks):
    TensorFlow Playground's single output unit o = tanh(a), class 1 iff o > 0; the model's
    logits are (-a, a), so class 1's probability is (1 + o) / 2 and loss "square" trains
    o itself."""

    @field_validator("hidden")
    @classmethod
    def _hidden(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        return check_sizes("model.hidden", value)


@MODELS.register
class MLP(BundledClassifier):
    """MLP over the flattened input: meta ``input_shape`` -> hidden -> ``n_classes`` outputs
    (or one tanh unit, see ``output_activation``)."""

    name: ClassVar[str] = "mlp"
    Config: ClassVar[type[FrozenConfig]] = MLPConfig
    tiny: ClassVar[dict[str, Any]] = {"hidden": (8, 8)}

    config: MLPConfig

    def __init__(self, config: FrozenConfig, meta: dict[str, Any], k: int) -> None:
        super().__init__(config, meta, k)
        n_in = math.prod(meta["input_shape"])
        n_classes = int(meta["n_classes"])
        if self.config.output_activation == "tanh" and n_classes != 2:
            raise ConfigError(
                "model.output_activation",
                f"tanh needs a binary task (2 classes), this one has {n_classes}",
                "use softmax",
            )
        n_out = 1 if self.config.output_activation == "tanh" else n_classes
        self.weights, self.biases = dense_stack([n_in, *self.config.hidden, n_out], k)

    def init_member(self, member: int, generator: torch.Generator) -> None:
        """Layer by layer, weight then bias, as ``nn.Linear`` draws them."""
        for w, b in zip(self.weights, self.biases, strict=True):
            init_weight_bias(w[member], b[member], self.config.init, generator)

    def forward(self, batch: ClassifyBatch) -> torch.Tensor:
        """Logits (K, B, C); with a tanh output unit of pre-activation a, (-a, a)."""
        x = batch.x.flatten(start_dim=2)  # (K|1, B, F)
        out = dense_forward(x, self.weights, self.biases, self.config.activation)  # (K, B, C|1)
        if self.config.output_activation == "tanh":
            return torch.cat([-out, out], dim=-1)  # (K, B, 2)
        return out
