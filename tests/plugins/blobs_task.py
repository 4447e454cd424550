"""A local plugin (not installed): a two-blob classification task, for the plugin tests.

The tests copy this file beside a study file in a temporary folder, away from the
driver's working directory, ``PYTHONPATH`` and site-packages, so a Ray worker can import
it only if fineline ships it with the job.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from pydantic import Field

from trainables.configbase import FrozenConfig
from trainables.data import Arrays, Split, TaskData
from trainables.registry import TASKS
from trainables.tasks.base import Task


class BlobsConfig(FrozenConfig):
    """Two Gaussian blobs in 2-D; the out-of-distribution splits move them apart."""

    n: int = Field(200, ge=4)
    """Examples per split."""
    shift: float = 1.5
    """How far the val_ood and test_ood blobs sit from the training ones."""


def _blobs(rng: np.random.Generator, n: int, offset: float) -> Arrays:
    y = rng.integers(0, 2, n)  # (n,)
    centre = np.where(y[:, None] == 1, 1.0 + offset, -1.0 - offset) * np.array([1.0, 0.5])
    x = centre + rng.normal(0.0, 0.7, (n, 2))  # (n, 2)
    return Arrays(x=x.astype(np.float32), y=y.astype(np.int64), ids=np.arange(n))


@TASKS.register
class Blobs(Task):
    """Two blobs; label = which blob."""

    name: ClassVar[str] = "blobs"
    Config: ClassVar[type[FrozenConfig]] = BlobsConfig
    data_kind = "classify"
    primary_metric: ClassVar[str] = "accuracy"
    metrics: ClassVar[tuple[str, ...]] = ("accuracy",)
    tiny: ClassVar[dict[str, Any]] = {"n": 64}
    tiny_train: ClassVar[dict[str, Any]] = {"lr": 0.01, "batch_size": 16}

    config: BlobsConfig

    def build(self, data_seed: int) -> TaskData:
        rng = np.random.default_rng(data_seed)
        n, s = self.config.n, self.config.shift
        parts = [("train", "train", 0.0), ("val", "val", 0.0), ("val_ood", "val_ood", s),
                 ("test", "test", 0.0), ("test_ood", "test", -0.8)]
        return TaskData(
            {name: Split(name, role, _blobs(rng, n, off)) for name, role, off in parts},  # type: ignore[arg-type]
            {"input_shape": (2,), "n_classes": 2},
        )

    def score(self, split: Split, predictions: Sequence[Any]) -> dict[str, np.ndarray]:
        predicted = np.array([int(np.argmax(p)) for p in predictions])
        return {"accuracy": (predicted == split.data.y).astype(np.float64)}  # type: ignore[union-attr]
