"""A local plugin whose headline metric is an error (lower is better), for the tests of
declared metrics (:mod:`trainables.metrics`): ``miss`` (a share of wrong answers, lower
better) and ``margin`` (the true class's logit minus the other's: unbounded, higher better).
Named ``mse``-like metrics used to be read as "higher is better" everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from pydantic import Field

from trainables.configbase import FrozenConfig
from trainables.data import Arrays, Role, Split, TaskData
from trainables.metrics import Metric
from trainables.registry import TASKS
from trainables.tasks.base import Task


class MissesConfig(FrozenConfig):
    """Two noisy classes in 2-D; val_ood and test_ood move them closer together."""

    n: int = Field(120, ge=8)
    """Examples per split."""
    spread: float = Field(0.8, gt=0)
    """Standard deviation of the inputs around their class centre."""


ROLES: dict[str, Role] = {"train": "train", "val": "val", "val_ood": "val_ood", "test": "test", "test_ood": "test"}


def _points(rng: np.random.Generator, n: int, gap: float, spread: float) -> Arrays:
    y = rng.integers(0, 2, n)  # (n,)
    x = np.where(y[:, None] == 1, gap, -gap) * np.array([1.0, 0.3]) + rng.normal(0.0, spread, (n, 2))  # (n, 2)
    return Arrays(x=x.astype(np.float32), y=y.astype(np.int64), ids=np.arange(n))


@TASKS.register
class Misses(Task):
    """Which of two classes; scored by the share of misses and the logit margin."""

    name: ClassVar[str] = "misses"
    Config: ClassVar[type[FrozenConfig]] = MissesConfig
    data_kind = "classify"
    primary_metric: ClassVar[str] = "miss"
    metrics: ClassVar[tuple[str | Metric, ...]] = (
        Metric("miss", better="lower"), Metric("margin", low=None, high=None),
    )
    tiny: ClassVar[dict[str, Any]] = {"n": 32}
    tiny_train: ClassVar[dict[str, Any]] = {"lr": 0.05, "batch_size": 8}

    config: MissesConfig

    def build(self, data_seed: int) -> TaskData:
        rng = np.random.default_rng(data_seed)
        gaps = {"train": 1.0, "val": 1.0, "val_ood": 0.6, "test": 1.0, "test_ood": 0.5}
        return TaskData(
            {name: Split(name, role, _points(rng, self.config.n, gaps[name], self.config.spread))
             for name, role in ROLES.items()},
            {"input_shape": (2,), "n_classes": 2},
        )

    def split_roles(self) -> dict[str, Role]:
        return dict(ROLES)

    def score(self, split: Split, predictions: Sequence[Any]) -> dict[str, np.ndarray]:
        logits = np.stack([np.asarray(p, dtype=np.float64) for p in predictions])  # (N, 2)
        y = split.data.y  # type: ignore[union-attr]
        rows = np.arange(len(y))
        return {"miss": (logits.argmax(1) != y).astype(np.float64),
                "margin": logits[rows, y] - logits[rows, 1 - y]}  # fmt: skip
