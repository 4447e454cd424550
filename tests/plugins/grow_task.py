"""A local plugin (not installed) whose test splits grow in code: for the ``study eval`` tests.

Two Gaussian blobs in 2-D (as ``blobs_task``). The tests copy this file beside a study
file, train a study, then edit ``EXTRA_TEST_SPLITS`` (a split added in code, or an existing
one's data changed) and run ``study eval``. Every split draws from its own generator (the
data seed and a key from the split's name), so adding a split leaves the others as they are.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from pydantic import Field

from trainables.configbase import FrozenConfig
from trainables.data import Arrays, Split, TaskData
from trainables.registry import TASKS
from trainables.tasks.base import Task

EXTRA_TEST_SPLITS: dict[str, float] = {}
"""Test splits beyond ``test``: name -> how far its blobs sit from the training ones."""


class GrowConfig(FrozenConfig):
    """Two blobs; the val_ood split moves them apart."""

    n: int = Field(64, ge=4)
    """Examples per split."""


def _blobs(data_seed: int, split: str, n: int, offset: float) -> Arrays:
    key = int.from_bytes(hashlib.sha256(split.encode()).digest()[:4], "little")
    rng = np.random.default_rng([data_seed, key])
    y = rng.integers(0, 2, n)  # (n,)
    centre = np.where(y[:, None] == 1, 1.0 + offset, -1.0 - offset) * np.array([1.0, 0.5])
    x = centre + rng.normal(0.0, 0.9, (n, 2))  # (n, 2)
    return Arrays(x=x.astype(np.float32), y=y.astype(np.int64), ids=np.arange(n))


@TASKS.register
class Grow(Task):
    """Two blobs; label = which blob; test splits listed in ``EXTRA_TEST_SPLITS`` too."""

    name: ClassVar[str] = "grow_blobs"
    Config: ClassVar[type[FrozenConfig]] = GrowConfig
    data_kind = "classify"
    primary_metric: ClassVar[str] = "accuracy"
    metrics: ClassVar[tuple[str, ...]] = ("accuracy",)

    config: GrowConfig

    def build(self, data_seed: int) -> TaskData:
        parts = [("train", "train", 0.0), ("val", "val", 0.0), ("val_ood", "val_ood", 1.0),
                 ("test", "test", 0.0), *((name, "test", off) for name, off in EXTRA_TEST_SPLITS.items())]
        return TaskData(
            {name: Split(name, role, _blobs(data_seed, name, self.config.n, off))  # type: ignore[arg-type]
             for name, role, off in parts},
            {"input_shape": (2,), "n_classes": 2},
        )

    def score(self, split: Split, predictions: Sequence[Any]) -> dict[str, np.ndarray]:
        predicted = np.array([int(np.argmax(p)) for p in predictions])
        return {"accuracy": (predicted == split.data.y).astype(np.float64)}  # type: ignore[union-attr]
