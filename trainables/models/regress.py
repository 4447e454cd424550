"""Regression: data kind ``regress`` and the plain models that fit real-valued targets.

A ``regress`` task returns :class:`~trainables.data.Arrays` whose ``y`` holds real targets,
``(N,)`` or ``(N, d)`` float32. :class:`PlainRegressor` is the base of a plugin's regressor:
``build_module`` returns one seed's module mapping a batch ``(B, *input_shape)`` to
``(B, d)`` (or ``(B,)`` for ``(N,)`` targets); fineline bundles it like every plain model
(:mod:`trainables.models.plain`). A prediction is the model's output for one example, a
``(d,)`` float32 array. ``mlp_regressor`` is the built-in one: an MLP like ``mlp_plain``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, field_validator
from torch import nn

from trainables.configbase import FrozenConfig
from trainables.data import SplitData
from trainables.errors import ConfigError
from trainables.models.base import MemberNoise
from trainables.models.classify import REDUCTIONS, check_sizes, gather_rows, reduce_losses
from trainables.models.plain import Dropout, PlainModel
from trainables.registry import MODELS


@dataclass
class RegressBatch:
    """One bundle batch. ``x``: (K, B, *input_shape), or (1, B, ...) when every member has the
    same rows (evaluation); ``y``: (K, B, d) targets (a task's (N,) targets get d = 1)."""

    x: torch.Tensor
    y: torch.Tensor


def make_regress_batch(data: SplitData, rows: Sequence[np.ndarray], device: torch.device | str) -> RegressBatch:
    """Gather member k's rows ``rows[k]`` of an :class:`Arrays` split into a batch."""
    x, y = gather_rows(data, rows, "regression")
    y = y.float()
    return RegressBatch(x=x.to(device), y=(y if y.dim() == 3 else y.unsqueeze(-1)).to(device))


class PlainRegressorConfig(FrozenConfig):
    """Fields every plain regressor has."""

    loss: Literal["squared", "absolute"] = "squared"
    """Training loss per example: the squared error summed over the target's d values, or
    the absolute error summed likewise."""


class PlainRegressor(PlainModel):
    """A plain model for ``regress`` tasks: ``build_module``'s module maps one seed's batch
    ``(B, *input_shape)`` to ``(B, d)`` (``(B,)`` where the targets are ``(N,)``)."""

    data_kind = "regress"
    reductions: ClassVar[tuple[str, ...]] = REDUCTIONS
    config: PlainRegressorConfig

    def make_batch(self, data: SplitData, rows: Sequence[np.ndarray], device: torch.device) -> RegressBatch:
        return make_regress_batch(data, rows, device)

    def forward(self, batch: RegressBatch, noise: MemberNoise | None = None) -> torch.Tensor:
        """Outputs ``(K, B, d)``; ``noise`` None: evaluation."""
        out: torch.Tensor = self.run_members(batch.x, noise=noise)
        out = out.unsqueeze(-1) if out.dim() == 2 else out
        if out.dim() != 3 or out.shape[1:] != batch.y.shape[1:]:
            raise ConfigError(
                "model",
                f"{self.name!r}: build_module's module maps a batch {tuple(batch.x.shape[1:])} to "
                f"{tuple(out.shape[1:])}; a regressor's module returns (batch, d) = {tuple(batch.y.shape[1:])}",
                "keep the batch dimension first and give the last layer as many outputs as a target has values",
            )
        return out

    def _errors(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-example loss (K, B) of outputs and targets (K, B, d)."""
        diff = out - y
        return (diff.square() if self.config.loss == "squared" else diff.abs()).sum(-1)

    def loss(self, batch: RegressBatch, noise: MemberNoise | None, reduction: str) -> torch.Tensor:
        """Per-member loss ``(K,)``, dropout masks from ``noise``."""
        return reduce_losses(self._errors(self(batch, noise), batch.y), reduction)

    def example_losses(self, batch: RegressBatch) -> torch.Tensor:
        return self._errors(self(batch), batch.y)

    def predict(self, batch: RegressBatch) -> list[Sequence[Any]]:
        """K lists of B float32 arrays (d,): each example's output."""
        return [list(member) for member in self(batch).detach().float().cpu().numpy()]

    def make_fused_step(self, train_cfg: Any) -> None:
        return None


class MLPRegressorConfig(PlainRegressorConfig):
    """MLP regressor settings."""

    hidden: tuple[int, ...] = (32, 32)
    """Hidden layer sizes, each followed by the activation (empty = a linear model)."""
    activation: Literal["relu", "tanh"] = "relu"
    """The hidden layers' nonlinearity (tanh: smooth functions extrapolate differently)."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout probability after each hidden layer (0: none); masks from each seed's own stream."""

    @field_validator("hidden")
    @classmethod
    def _hidden(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        return check_sizes("model.hidden", value)


@MODELS.register
class MLPRegressor(PlainRegressor):
    """MLP over the flattened input: meta ``input_shape`` -> hidden -> meta ``target_size``
    outputs (1 where the task gives none), ``nn.Linear``'s own init."""

    name: ClassVar[str] = "mlp_regressor"
    Config: ClassVar[type[FrozenConfig]] = MLPRegressorConfig
    tiny: ClassVar[dict[str, Any]] = {"hidden": (8,), "dropout": 0.1}

    config: MLPRegressorConfig

    def build_module(self, config: FrozenConfig, meta: dict[str, Any]) -> nn.Module:
        assert isinstance(config, MLPRegressorConfig)
        act = {"relu": nn.ReLU, "tanh": nn.Tanh}[config.activation]
        layers: list[nn.Module] = [nn.Flatten()]
        n_in = math.prod(meta["input_shape"])
        for n_out in config.hidden:
            layers += [nn.Linear(n_in, n_out), act()]
            if config.dropout > 0:
                layers.append(Dropout(config.dropout))
            n_in = n_out
        layers.append(nn.Linear(n_in, int(meta.get("target_size", 1))))
        return nn.Sequential(*layers)
