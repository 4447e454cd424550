"""``sine``: regress a sine wave, in range and beyond it (data kind ``regress``).

The smallest extrapolation question: a network fit to ``y = sin(x)`` on ``x`` in
``train_range`` (noisy targets) is scored on clean targets in that range and beyond it.
Inside, every reasonable seed fits; outside, what a ReLU network continues with (a line
whose slope the seed picks) and what a tanh network does differ from seed to seed, which
is what a seed study measures. Not a published reproduction: the built-in example of a
regression task (an error metric, lower is better, declared in ``metrics``).

Splits (``ids`` = row numbers within the split; ``x`` uniform in the split's range):

* ``train`` (role train): ``train_size`` points, targets ``sin(x) + noise``;
* ``val`` (role val): ``eval_size`` points in ``train_range``, clean targets;
* ``val_ood`` (role val_ood): ``eval_size`` points in ``val_ood_range``, clean;
* ``test`` (role test): ``eval_size`` points in ``train_range``, clean;
* ``test_ood`` (role test): ``eval_size`` points in ``test_ood_range``, clean.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from pydantic import Field, field_validator

from trainables.configbase import FrozenConfig
from trainables.data import Arrays, Role, Split, TaskData
from trainables.errors import ConfigError
from trainables.metrics import Metric
from trainables.registry import TASKS
from trainables.tasks.base import Task

ROLES: dict[str, Role] = {"train": "train", "val": "val", "val_ood": "val_ood", "test": "test", "test_ood": "test"}


class SineConfig(FrozenConfig):
    """A sine wave sampled in a training range and scored in and beyond it."""

    train_range: tuple[float, float] = (-3.0, 3.0)
    """Inputs of train, val and test: x uniform in (low, high)."""
    val_ood_range: tuple[float, float] = (3.0, 4.0)
    """Inputs of val_ood (what tuning may look at)."""
    test_ood_range: tuple[float, float] = (4.0, 5.0)
    """Inputs of test_ood (never seen by selection or tuning)."""
    train_size: int = Field(256, ge=2)
    """Training points."""
    eval_size: int = Field(256, ge=2)
    """Points in each of val, val_ood, test and test_ood."""
    noise: float = Field(0.1, ge=0.0)
    """Standard deviation of the Gaussian noise added to the training targets (the other
    splits' targets are the clean sin(x))."""

    @field_validator("train_range", "val_ood_range", "test_ood_range")
    @classmethod
    def _ordered(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not value[0] < value[1]:
            raise ConfigError("task", f"range {list(value)} is empty", "give [low, high] with low < high")
        return value


@TASKS.register
class Sine(Task):
    """y = sin(x): fit in range, scored in and beyond it."""

    name: ClassVar[str] = "sine"
    Config: ClassVar[type[FrozenConfig]] = SineConfig
    data_kind = "regress"
    primary_metric: ClassVar[str] = "mse"
    metrics: ClassVar[tuple[str | Metric, ...]] = (
        Metric("mse", better="lower", high=None), Metric("mae", better="lower", high=None),
    )
    tiny: ClassVar[dict[str, Any]] = {"train_size": 32, "eval_size": 16}
    tiny_train: ClassVar[dict[str, Any]] = {"optimizer": "adam", "lr": 0.01, "batch_size": 8}
    default_search_space: ClassVar[dict[str, dict[str, Any]] | None] = {
        "train.lr": {"low": 1e-4, "high": 1e-1, "log": True}, "model.dropout": {"low": 0.0, "high": 0.3},
    }

    config: SineConfig

    def _split(self, rng: np.random.Generator, span: tuple[float, float], n: int, noise: float) -> Arrays:
        x = rng.uniform(span[0], span[1], n)  # (n,)
        y = np.sin(x) + (rng.normal(0.0, noise, n) if noise else 0.0)  # (n,)
        return Arrays(x=x[:, None].astype(np.float32), y=y.astype(np.float32), ids=np.arange(n))

    def build(self, data_seed: int) -> TaskData:
        c = self.config
        rng = np.random.default_rng(data_seed)
        spans = {"train": c.train_range, "val": c.train_range, "val_ood": c.val_ood_range,
                 "test": c.train_range, "test_ood": c.test_ood_range}  # fmt: skip
        splits = {name: Split(name, role, self._split(rng, spans[name], c.train_size if name == "train" else c.eval_size,
                                                      c.noise if name == "train" else 0.0))
                  for name, role in ROLES.items()}  # fmt: skip
        return TaskData(splits, {"input_shape": (1,), "target_size": 1})

    def split_roles(self) -> dict[str, Role]:
        return dict(ROLES)

    def score(self, split: Split, predictions: Sequence[Any]) -> dict[str, np.ndarray]:
        out = np.array([float(np.asarray(p).reshape(-1)[0]) for p in predictions])  # (N,)
        err = out - split.data.y  # type: ignore[union-attr]
        return {"mse": err**2, "mae": np.abs(err)}

    def render(self, split: Split, prediction: Any, index: int | None = None) -> str:
        return f"{float(np.asarray(prediction).reshape(-1)[0]):.4g}"

    def analysis(self) -> dict[str, Any]:
        return {
            "metric_definitions": {
                "mse": "mean squared error against the clean sin(x) (lower is better)",
                "mae": "mean absolute error against the clean sin(x) (lower is better)",
            },
            "verdict": {"metric": "mse", "splits": ["test_ood", "test"]},
        }
