"""``parity_mlp``: a plain one-seed ``nn.Module`` that fineline bundles over seeds.

Written for ONE seed, with no member dimension anywhere: fineline stacks K copies of
its parameters and runs them as one computation (``torch.func.vmap``), each copy
initialised by this module's own constructor under its seed. Dropout is fineline's
:class:`~trainables.models.plain.Dropout` (each seed its own masks); ``nn.Dropout`` is
refused, since its masks would depend on the bundle.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import Field
from torch import nn

from trainables.configbase import FrozenConfig
from trainables.models.plain import Dropout, PlainClassifier, PlainClassifierConfig
from trainables.registry import MODELS


class ParityMLPConfig(PlainClassifierConfig):
    """A two-layer ReLU MLP."""

    width: int = Field(64, ge=1)
    """Hidden units per layer."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout after each hidden layer (0: none)."""


class ParityMLP(nn.Module):
    """(B, n_bits) -> logits (B, 2)."""

    def __init__(self, n_in: int, width: int, dropout: float, n_classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(n_in, width), nn.ReLU(), Dropout(dropout),
            nn.Linear(width, width), nn.ReLU(), Dropout(dropout),
            nn.Linear(width, n_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x.flatten(start_dim=1))  # (B, n_bits) -> (B, C)


@MODELS.register
class ParityMLPModel(PlainClassifier):
    """Registers :class:`ParityMLP` as the model ``parity_mlp`` (kind ``classify``)."""

    name: ClassVar[str] = "parity_mlp"
    Config: ClassVar[type[FrozenConfig]] = ParityMLPConfig
    tiny: ClassVar[dict[str, Any]] = {"width": 16, "dropout": 0.1}

    def build_module(self, config: Any, meta: dict[str, Any]) -> nn.Module:
        (n_in,) = meta["input_shape"]
        return ParityMLP(n_in, config.width, config.dropout, int(meta["n_classes"]))
