"""Sparse parity: the label is the XOR of ``k`` hidden bits out of ``n_bits``.

A classic seed-sensitive problem: an MLP sits at chance for a while, then finds the
``k`` relevant bits and jumps to 100% (when it does). The *uncharacteristic* splits draw
their bits with another density than training does: a model that learned the parity
of the relevant bits is unaffected; one that learned a shortcut of the training
distribution is not.

Splits (``ids`` are row numbers): ``train`` (role train, density ``density``), ``val``
(val, same distribution), ``val_ood`` (val_ood, density ``ood_density``), ``test`` (test,
same as training) and ``test_ood`` (test, density ``1 - ood_density``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from pydantic import Field, model_validator

from trainables.configbase import FrozenConfig
from trainables.data import Arrays, Split, TaskData
from trainables.registry import TASKS
from trainables.tasks.base import Task


class ParityConfig(FrozenConfig):
    """Sparse parity settings."""

    n_bits: int = Field(12, ge=2, le=64)
    """Input length in bits."""
    k: int = Field(3, ge=1)
    """Relevant bits (chosen by the data seed); the label is their XOR."""
    train_size: int = Field(2000, ge=1)
    """Training examples (a fixed set)."""
    eval_size: int = Field(500, ge=1)
    """Examples in each of val, val_ood, test and test_ood."""
    density: float = Field(0.5, gt=0, lt=1)
    """Probability of a 1 bit in train, val and test."""
    ood_density: float = Field(0.25, gt=0, lt=1)
    """Probability of a 1 bit in val_ood (test_ood uses 1 - ood_density)."""

    @model_validator(mode="after")
    def _k_fits(self) -> ParityConfig:
        if self.k > self.n_bits:
            raise ValueError(f"k ({self.k}) must not exceed n_bits ({self.n_bits})")
        return self


def draw(rng: np.random.Generator, n: int, bits: int, density: float, relevant: np.ndarray) -> Arrays:
    """``n`` examples: x (n, bits) float32 in {-1, +1}, y (n,) = XOR of the relevant bits."""
    on = rng.random((n, bits)) < density  # (n, bits)
    y = (on[:, relevant].sum(axis=1) % 2).astype(np.int64)  # (n,)
    return Arrays(x=np.where(on, 1.0, -1.0).astype(np.float32), y=y, ids=np.arange(n))


@TASKS.register
class Parity(Task):
    """Sparse parity over ``n_bits`` (see the module docstring)."""

    name: ClassVar[str] = "parity"
    Config: ClassVar[type[FrozenConfig]] = ParityConfig
    data_kind = "classify"
    primary_metric: ClassVar[str] = "accuracy"
    metrics: ClassVar[tuple[str, ...]] = ("accuracy",)
    tiny: ClassVar[dict[str, Any]] = {"n_bits": 6, "k": 2, "train_size": 256, "eval_size": 64}
    tiny_train: ClassVar[dict[str, Any]] = {"optimizer": "adam", "lr": 0.01, "batch_size": 32}

    config: ParityConfig

    def build(self, data_seed: int) -> TaskData:
        c = self.config
        rng = np.random.default_rng(data_seed)
        relevant = np.sort(rng.choice(c.n_bits, size=c.k, replace=False))
        splits = [
            ("train", "train", c.train_size, c.density),
            ("val", "val", c.eval_size, c.density),
            ("val_ood", "val_ood", c.eval_size, c.ood_density),
            ("test", "test", c.eval_size, c.density),
            ("test_ood", "test", c.eval_size, 1.0 - c.ood_density),
        ]
        return TaskData(
            splits={
                name: Split(name, role, draw(rng, n, c.n_bits, p, relevant))  # type: ignore[arg-type]
                for name, role, n, p in splits
            },
            meta={"input_shape": (c.n_bits,), "n_classes": 2, "relevant_bits": relevant.tolist()},
        )

    def split_roles(self) -> dict[str, Any]:
        """Without building data."""
        return {"train": "train", "val": "val", "val_ood": "val_ood", "test": "test", "test_ood": "test"}

    def score(self, split: Split, predictions: Sequence[Any]) -> dict[str, np.ndarray]:
        """``accuracy``: the predicted class (argmax of a probability vector) is the label."""
        predicted = np.array([int(np.argmax(p)) for p in predictions], dtype=np.int64)
        return {"accuracy": (predicted == split.data.y).astype(np.float64)}  # type: ignore[union-attr]

    def render_example(self, data: TaskData, split: Split, index: int) -> tuple[str, str]:
        """The bits as 0/1 digits, the label."""
        x, y = split.data.x[index], split.data.y[index]  # type: ignore[union-attr]
        return "".join("1" if v > 0 else "0" for v in x), str(int(y))

    def render(self, split: Split, prediction: Any, index: int | None = None) -> str:
        c = int(np.argmax(prediction))
        return f"{c} (p={float(prediction[c]):.3f})"

    def analysis(self) -> dict[str, Any]:
        """Seed histograms of test accuracy, in- and out-of-distribution, and their scatter."""
        return {
            "metric_definitions": {
                "accuracy": "share of bit strings whose parity of the hidden relevant bits is predicted right",
            },
            "primary_metric": "accuracy",
            "test_splits": ["test", "test_ood"],
            "histograms": [{"split": "test_ood", "metric": "accuracy"}],
            "scatter": [["test", "accuracy"], ["test_ood", "accuracy"]],
            "charts": [{"type": "curve", "splits": ["val", "val_ood"], "metric": "accuracy"}],
        }
