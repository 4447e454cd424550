"""The 2-D toy task of Li et al. 2021 ("Gradient Descent Resists Compositionality").

Two binary factors ``Y1, Y2``; the input is ``X_i = Y_i - U_i`` with ``U_i ~ U[0, 1]``
independent, so ``X_i`` lies in ``[Y_i - 1, Y_i]``; the label is ``Y1``. Training draws
``(Y1, Y2)`` uniformly from {(0, 0), (0, 1), (1, 0)}; the test combination is (1, 1),
never seen in training. A model that uses only ``X1`` generalises; one that leans on the
(training-time correlated) ``X2`` does not. By default (config ``fresh_samples``) every
training step draws new samples (:meth:`Toy2D.sample_train`); with ``fresh_samples: false``
training passes over the fixed ``train`` split instead, as TensorFlow Playground (where
the paper trained it) passes over its fixed training points.

Splits (``ids`` = row numbers within the split):

* ``train`` (role train): ``n_train`` samples of the training distribution drawn by the
  data seed. With ``fresh_samples`` the trainer draws training batches with
  :meth:`Toy2D.sample_train` and only uses ``len(train)`` (as an epoch size, if it counts
  epochs); without, it trains on these samples (an epoch is one pass over them).
* ``train_eval`` (role val): ``n_eval`` fixed training-distribution samples.
* ``test`` (role test): ``n_eval`` fixed (1, 1) samples.
* ``grid`` (role test): the points of a regular grid over ``[low, high]^2`` (config
  ``grid``, default -1..1 with 41 points per axis); point ``id = i1 * n + i2`` has
  ``x = (g[i1], g[i2])``. Its per-example ``p_y1`` (the model's probability of ``Y1 = 1``)
  is the decision surface: the ``predictions`` table stores it per seed (its
  ``prediction`` column is ``p_y1`` as a decimal string, see :meth:`Toy2D.render`) and
  :meth:`Toy2D.analysis` declares the chart. Its label is ``y = 1[x1 > 0]``, the true Y1
  wherever the point lies in the support (``X1 > 0`` iff ``Y1 = 1``), so the grid's
  ``accuracy`` is the share of the square where the model decides by the compositional
  rule (X1 alone). The trainer needs the primary metric on every ``test`` split, which is
  why the grid is scored for accuracy too. It is never used for selection; its ``p_y1``
  mean is not a score.

Predictions: per example a class-probability vector ``(2,)`` (``p_y1`` needs it) or, for
``accuracy`` only, a plain int class id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from pydantic import ValidationInfo, field_validator

from trainables.configbase import FrozenConfig, added_field
from trainables.data import Arrays, Split, TaskData
from trainables.errors import ConfigError
from trainables.registry import TASKS
from trainables.tasks.base import Task
from trainables.tasks.mnist_pairs import accuracy, render_class

TRAIN_COMBOS = np.array([[0, 0], [0, 1], [1, 0]], dtype=np.int64)
TEST_COMBOS = np.array([[1, 1]], dtype=np.int64)


def sample_toy(combos: np.ndarray, rng: np.random.Generator, n: int) -> Arrays:
    """``n`` samples: ``(Y1, Y2)`` uniform over ``combos`` (C, 2); x (n, 2) float32, y = Y1."""
    labels = combos[rng.integers(0, len(combos), n)]  # (n, 2)
    x = labels - rng.random((n, 2))  # (n, 2)
    return Arrays(x=x.astype(np.float32), y=labels[:, 0].copy(), ids=np.arange(n))


def grid_points(low: float, high: float, n: int) -> Arrays:
    """Grid over ``[low, high]^2``: x (n*n, 2) float32 row-major in (x1, x2), y = 1[x1 > 0]."""
    axis = np.linspace(low, high, n)
    x1, x2 = np.meshgrid(axis, axis, indexing="ij")  # (n, n) each
    x = np.stack([x1.ravel(), x2.ravel()], axis=1).astype(np.float32)
    return Arrays(x=x, y=(x[:, 0] > 0).astype(np.int64), ids=np.arange(n * n))


class Toy2DConfig(FrozenConfig):
    """2-D toy task settings."""

    n_train: int = 3000
    """Size of the nominal `train` split (an epoch size: training draws fresh samples)."""
    n_eval: int = 1000
    """Size of each fixed evaluation set (`train_eval`, `test`)."""
    grid: tuple[float, float, int] = (-1.0, 1.0, 41)
    """Decision-surface grid (low, high, points per axis) of the `grid` split."""
    fresh_samples: bool = added_field(True)
    """true: every training step draws new samples (n_train is only an epoch size); false:
    training passes over the fixed `train` split's n_train samples (TensorFlow Playground's
    way: a fixed training set, one "step" = one pass over it)."""

    @field_validator("n_train", "n_eval")
    @classmethod
    def _positive(cls, value: int, info: ValidationInfo) -> int:
        if value < 1:
            raise ConfigError(f"task.{info.field_name}", f"is {value}", "use a value >= 1")
        return value

    @field_validator("grid")
    @classmethod
    def _grid(cls, value: tuple[float, float, int]) -> tuple[float, float, int]:
        low, high, n = value
        if not (low < high and n >= 2):
            raise ConfigError(
                "task.grid", f"is {value}", "give (low, high, n) with low < high and n >= 2"
            )
        return value


@TASKS.register
class Toy2D(Task):
    """Predict Y1 from (X1, X2); the (1, 1) combination appears only at test time."""

    name: ClassVar[str] = "toy2d"
    Config: ClassVar[type[FrozenConfig]] = Toy2DConfig
    data_kind = "classify"
    primary_metric: ClassVar[str] = "accuracy"
    metrics: ClassVar[tuple[str, ...]] = ("accuracy", "p_y1")
    fresh_samples: ClassVar[bool] = True
    tiny: ClassVar[dict[str, Any]] = {"n_train": 64, "n_eval": 64, "grid": (-1.0, 1.0, 5)}
    tiny_train: ClassVar[dict[str, Any]] = {
        "optimizer": "adam",
        "lr": 0.01,
        "batch_size": 16,
        "loss_reduction": "mean",
        "max_steps": 30,
        "eval_every_steps": 10,
        "selection": {"split": "train_eval", "metric": "accuracy"},
    }

    config: Toy2DConfig

    def __init__(self, config: FrozenConfig) -> None:
        super().__init__(config)
        # the trainer reads it from the task; the class keeps the default (True)
        self.fresh_samples = self.config.fresh_samples  # type: ignore[misc]

    def build(self, data_seed: int) -> TaskData:
        seeds = np.random.SeedSequence(data_seed).spawn(3)
        cfg = self.config
        splits = [
            Split(
                "train",
                "train",
                sample_toy(TRAIN_COMBOS, np.random.default_rng(seeds[0]), cfg.n_train),
            ),
            Split(
                "train_eval",
                "val",
                sample_toy(TRAIN_COMBOS, np.random.default_rng(seeds[1]), cfg.n_eval),
            ),
            Split(
                "test", "test", sample_toy(TEST_COMBOS, np.random.default_rng(seeds[2]), cfg.n_eval)
            ),
            Split("grid", "test", self.decision_grid()),
        ]
        return TaskData(
            splits={s.name: s for s in splits}, meta={"input_shape": (2,), "n_classes": 2}
        )

    def decision_grid(self) -> Arrays:
        """The ``grid`` split's points (see module docstring)."""
        low, high, n = self.config.grid
        return grid_points(low, high, n)

    def sample_train(self, data: TaskData, rng: np.random.Generator, n: int) -> Arrays:
        """``n`` fresh training samples (``data`` is not needed)."""
        return sample_toy(TRAIN_COMBOS, rng, n)

    def score(self, split: Split, predictions: Sequence[Any]) -> dict[str, np.ndarray]:
        """``accuracy`` on every split; the ``grid`` also gets ``p_y1``."""
        if len(predictions) == len(split) > 0 and all(np.ndim(p) == 1 for p in predictions):
            probs = np.stack(predictions)  # (N, C): one argmax for the split, not one per example
            labels = split.data.y  # type: ignore[union-attr]
            scores = {"accuracy": (probs.argmax(axis=1) == labels).astype(np.float64)}
            if split.name == "grid":
                scores["p_y1"] = probs[:, 1].astype(np.float64)
            return scores
        scores = {"accuracy": accuracy(split, predictions)}
        if split.name == "grid":
            if any(np.ndim(p) != 1 for p in predictions):
                raise ValueError("the grid split needs class-probability vectors, not class ids")
            scores["p_y1"] = np.asarray([float(p[1]) for p in predictions], dtype=np.float64)
        return scores

    def render(self, split: Split, prediction: Any, index: int | None = None) -> str:
        """``p_y1`` (``"0.734215"``) on the grid; the class form elsewhere (``"1 (p=0.912)"``)."""
        if split.name == "grid" and np.ndim(prediction) == 1:
            return f"{float(prediction[1]):.6f}"
        return render_class(prediction)

    def analysis(self) -> dict[str, Any]:
        """The decision-boundary chart (per seed, ``p_y1`` over the ``grid`` split), the
        seed histogram of (1, 1) accuracy, and its scatter against the grid's agreement
        with the compositional rule."""
        low, high, n = self.config.grid
        return {
            "metric_definitions": {
                "accuracy": "share of points classified as their Y1 (on the grid: as 1[x1 > 0], the "
                "compositional rule)",
                "p_y1": "the model's probability of Y1 = 1 at a grid point",
                "loss": "the model's training loss per example (cross-entropy by default; "
                "with loss: square, TensorFlow Playground's 0.5 (o - t)^2 of the tanh output)",
            },
            "primary_metric": "accuracy",
            "decision_boundary": {
                "grid": [low, high, n],
                "split": "grid",
                "metric": "p_y1",
                "axes": ["x1", "x2"],
                "id": "i1 * n + i2",
                "prediction": "p_y1 as a decimal string (predictions table)",
            },
            "test_splits": ["test", "grid"],
            "histograms": [{"split": "test", "metric": "accuracy"}],
            "scatter": [["grid", "accuracy"], ["test", "accuracy"]],
        }
