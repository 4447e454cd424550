"""``mlp_plain``: the MLP family written as a plain one-seed ``nn.Module``.

The twin of the hand-bundled :mod:`trainables.models.mlp` (``mlp``), bundled by fineline
through ``torch.func`` (:mod:`trainables.models.plain`): ``nn.Flatten``, then per hidden
size ``nn.Linear`` + ReLU (+ :class:`~trainables.models.plain.Dropout` where ``dropout``
> 0), then ``nn.Linear`` to the logits. Initialised by ``nn.Linear``'s own constructor,
layer by layer, weight then bias: the draws ``mlp``'s ``init: torch`` makes, so with
``dropout: 0`` the two families train the same seeds to the same parameters.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import field_validator
from torch import nn

from trainables.configbase import FrozenConfig
from trainables.errors import ConfigError
from trainables.models.classify import check_sizes
from trainables.models.plain import Dropout, PlainClassifier, PlainClassifierConfig
from trainables.registry import MODELS


class MLPPlainConfig(PlainClassifierConfig):
    """Plain MLP settings."""

    hidden: tuple[int, ...] = (8, 8, 8)
    """Hidden layer sizes, each followed by ReLU (empty = a linear model)."""
    dropout: float = 0.0
    """Dropout probability after each hidden layer's ReLU (0: none); masks from each seed's
    own dropout stream."""
    init: Literal["torch"] = "torch"
    """"torch": nn.Linear's own init (kaiming-uniform a=sqrt(5), bias U(+-1/sqrt(fan_in)))."""

    @field_validator("hidden")
    @classmethod
    def _hidden(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        return check_sizes("model.hidden", value)

    @field_validator("dropout")
    @classmethod
    def _dropout(cls, value: float) -> float:
        if not 0.0 <= value < 1.0:
            raise ConfigError("model.dropout", f"is {value}", "use a probability in [0, 1)")
        return value


@MODELS.register
class MLPPlain(PlainClassifier):
    """ReLU MLP over the flattened input: meta ``input_shape`` -> hidden -> ``n_classes``."""

    name: ClassVar[str] = "mlp_plain"
    Config: ClassVar[type[FrozenConfig]] = MLPPlainConfig
    tiny: ClassVar[dict[str, Any]] = {"hidden": (8, 8), "dropout": 0.2}

    config: MLPPlainConfig

    def build_module(self, config: FrozenConfig, meta: dict[str, Any]) -> nn.Module:
        assert isinstance(config, MLPPlainConfig)
        layers: list[nn.Module] = [nn.Flatten()]
        n_in = math.prod(meta["input_shape"])
        for n_out in config.hidden:
            layers += [nn.Linear(n_in, n_out), nn.ReLU()]
            if config.dropout > 0:
                layers.append(Dropout(config.dropout))
            n_in = n_out
        layers.append(nn.Linear(n_in, int(meta["n_classes"])))
        return nn.Sequential(*layers)
