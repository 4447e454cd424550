"""A bundled two-layer ReLU network with a fixed second layer, for binary ``classify`` tasks.

``f(x) = sum_j a_j relu(<w_j, x>)`` over ``width`` (m) hidden units without biases; the
second layer is fixed, ``a_j = +1/sqrt(m)`` for the first half of the units and
``-1/sqrt(m)`` for the rest (``ceil(m/2)`` positive), and only the first layer ``W``
``(K, m, dim)`` trains, initialised ``N(0, init_std^2)`` entrywise. This is the network of
Xu et al. 2023 (and of Frei et al. 2022's random feature amplification) whose behaviour
under full-batch gradient descent on the logistic loss their theorem describes.

The logits are ``(-f/2, f/2)``: class 1's probability is ``sigmoid(f)`` and the
cross-entropy of class ``y`` is exactly the logistic loss ``log(1 + exp(-y' f))`` of the
label ``y' = 2y - 1``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field
from torch import nn

from trainables.configbase import FrozenConfig
from trainables.errors import ConfigError
from trainables.models.classify import BundledClassifier, ClassifyBatch
from trainables.registry import MODELS


class TwoLayerReLUConfig(FrozenConfig):
    """Two-layer ReLU network settings."""

    width: int = Field(200, ge=2)
    """Hidden units m (half with second-layer weight +1/sqrt(m), half -1/sqrt(m))."""
    init_std: float = Field(1e-4, gt=0)
    """Standard deviation of every first-layer weight at init (Xu et al.'s omega_init: small
    next to the step size, so the first step dominates the initial weights)."""
    loss: Literal["cross_entropy"] = "cross_entropy"
    """Training loss: the cross-entropy of the logits (-f/2, f/2), i.e. the logistic loss."""


@MODELS.register
class TwoLayerReLU(BundledClassifier):
    """``f(x) = sum_j a_j relu(<w_j, x>)`` with fixed ``a`` (see the module docstring)."""

    name: ClassVar[str] = "two_layer_relu"
    Config: ClassVar[type[FrozenConfig]] = TwoLayerReLUConfig
    tiny: ClassVar[dict[str, Any]] = {"width": 8, "init_std": 0.01}

    config: TwoLayerReLUConfig  # type: ignore[assignment]  # no init schemes: not a ClassifierConfig
    output: torch.Tensor
    """The fixed second layer (m,), a buffer shared by every member."""

    def __init__(self, config: FrozenConfig, meta: dict[str, Any], k: int) -> None:
        super().__init__(config, meta, k)
        if int(meta["n_classes"]) != 2:
            raise ConfigError(
                "model.name", f"two_layer_relu is binary; this task has {meta['n_classes']} classes",
                "use mlp for this task",
            )  # fmt: skip
        n_in = math.prod(meta["input_shape"])
        m = self.config.width
        self.weight = nn.Parameter(torch.zeros(k, m, n_in))
        half = (m + 1) // 2
        a = torch.cat([torch.ones(half), -torch.ones(m - half)]) / math.sqrt(m)
        self.register_buffer("output", a)  # (m,), the same for every member: not trained

    def init_member(self, member: int, generator: torch.Generator) -> None:
        with torch.no_grad():
            self.weight[member].normal_(0.0, self.config.init_std, generator=generator)

    def forward(self, batch: ClassifyBatch) -> torch.Tensor:
        """Logits (K, B, 2) = (-f/2, f/2)."""
        x = batch.x.flatten(start_dim=2).expand(self.weight.shape[0], -1, -1)  # (K, B, F)
        hidden = torch.relu(torch.bmm(x, self.weight.transpose(1, 2)))  # (K, B, m)
        f = hidden @ self.output  # (K, B)
        return torch.stack([-0.5 * f, 0.5 * f], dim=-1)
