"""A bundled multi-layer perceptron for ``classify`` tasks.

Every dense layer is a weight ``(K, out, in)`` and a bias ``(K, out)`` over the ``K``
members, applied with one ``baddbmm`` (:func:`~trainables.models.classify.dense_forward`);
batches, losses and predictions are the classifiers' shared ones
(:mod:`trainables.models.classify`).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from pydantic import field_validator

from trainables.configbase import FrozenConfig
from trainables.models.classify import (
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
    """Hidden layer sizes, each followed by ReLU (empty = a linear model)."""

    @field_validator("hidden")
    @classmethod
    def _hidden(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        return check_sizes("model.hidden", value)


@MODELS.register
class MLP(BundledClassifier):
    """ReLU MLP over the flattened input: meta ``input_shape`` -> hidden -> ``n_classes``."""

    name: ClassVar[str] = "mlp"
    Config: ClassVar[type[FrozenConfig]] = MLPConfig
    tiny: ClassVar[dict[str, Any]] = {"hidden": (8, 8)}

    config: MLPConfig

    def __init__(self, config: FrozenConfig, meta: dict[str, Any], k: int) -> None:
        super().__init__(config, meta, k)
        n_in = math.prod(meta["input_shape"])
        sizes = [n_in, *self.config.hidden, int(meta["n_classes"])]
        self.weights, self.biases = dense_stack(sizes, k)

    def init_member(self, member: int, generator: torch.Generator) -> None:
        """Layer by layer, weight then bias, as ``nn.Linear`` draws them."""
        for w, b in zip(self.weights, self.biases, strict=True):
            init_weight_bias(w[member], b[member], self.config.init, generator)

    def forward(self, batch: ClassifyBatch) -> torch.Tensor:
        """Logits (K, B, C)."""
        x = batch.x.flatten(start_dim=2)  # (K|1, B, F)
        return dense_forward(x, self.weights, self.biases)
