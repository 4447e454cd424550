"""XOR cluster data of Xu et al. 2023 ("Benign Overfitting and Grokking in ReLU Networks
for XOR Cluster Data", ICLR 2024), with label-flip noise.

Two orthogonal cluster means of norm ``mu_norm``, ``mu1 = mu_norm * e1`` and
``mu2 = mu_norm * e2`` (any orthogonal pair of equal norm gives the same distribution up to
a rotation, since the noise is isotropic). An example draws its cluster mean uniformly
from ``{+mu1, -mu1, +mu2, -mu2}`` and is ``x = mean + xi`` with ``xi ~ N(0, I_dim)``; its
clean label is ``+1`` (class 1) for the ``+-mu1`` clusters and ``-1`` (class 0) for
``+-mu2``: no linear classifier beats chance. The training label is flipped with
probability ``flip`` (independently per example; the paper's eta).

The paper's theorem (two-layer ReLU network with a fixed +-1/sqrt(m) second layer, small
Gaussian init, logistic loss, full-batch gradient descent: model ``two_layer_relu``) says
that with high probability over data, flips and init, after ONE step the network fits
every training label, flipped ones included, while its test accuracy is near chance, and
that later it reaches near-optimal test accuracy while still fitting the flips (benign
overfitting, "grokking"). Its conditions (dim >~ n^5, among others) are far beyond what a
CPU study runs; configs/xu2023_xor.yaml picks a setting where both events happen for
some but not all seeds, which is what a seed study measures.

Splits (``ids`` = row numbers):

* ``train`` (role train): ``n_train`` examples with their (possibly flipped) labels;
* ``test`` (role test): ``n_test`` fresh examples with their CLEAN labels: the Bayes
  classifier's accuracy is about 1 here (the clusters are far apart), and accuracy under
  the noisy labels is ``flip + (1 - 2 flip) * accuracy`` in expectation.

Metric ``accuracy``. Declared for analysis (:meth:`XorCluster.analysis`): the events
``fits_noise`` (train accuracy = 1, flipped labels included) and ``recovers`` (test accuracy
>= ``recovered_accuracy``), read from the per-step curves: times to an event with
right-censoring at the step budget (``study analyze``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from pydantic import Field

from trainables.configbase import FrozenConfig
from trainables.data import Arrays, Role, Split, TaskData
from trainables.registry import TASKS
from trainables.tasks.base import Task
from trainables.tasks.mnist_pairs import accuracy, render_class


def xor_clusters(
    n: int, dim: int, mu_norm: float, flip: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` examples: x (n, dim) float64, noisy labels (n,) int64 in {0, 1}, clean labels (n,).

    Cluster ``c`` uniform in 0..3 (``+mu1, -mu1, +mu2, -mu2``); clean label 1 for c < 2."""
    cluster = rng.integers(0, 4, n)
    x = rng.standard_normal((n, dim))
    sign = np.where(cluster % 2 == 0, 1.0, -1.0)
    x[:, 0] += np.where(cluster < 2, sign * mu_norm, 0.0)
    x[:, 1] += np.where(cluster >= 2, sign * mu_norm, 0.0)
    clean = (cluster < 2).astype(np.int64)
    flipped = rng.random(n) < flip
    return x, np.where(flipped, 1 - clean, clean), clean


class XorClusterConfig(FrozenConfig):
    """XOR cluster data settings."""

    dim: int = Field(3000, ge=2)
    """Input dimension p (the cluster means use the first two coordinates)."""
    mu_norm: float = Field(17.3, gt=0)
    """Norm of each cluster mean ||mu1|| = ||mu2|| (the noise has norm about sqrt(dim))."""
    flip: float = Field(0.1, ge=0, lt=0.5)
    """Probability that a training label is flipped (the paper's eta)."""
    n_train: int = Field(100, ge=2)
    """Training examples n (gradient descent takes all of them each step: train.batch_size = n_train)."""
    n_test: int = Field(1000, ge=1)
    """Test examples (clean labels)."""
    recovered_accuracy: float = Field(0.95, gt=0.5, le=1)
    """Test accuracy at which a run counts as recovered (the declared event `recovers`)."""


@TASKS.register
class XorCluster(Task):
    """Xu et al.'s XOR cluster data with flipped training labels and a clean test set."""

    name: ClassVar[str] = "xor_cluster"
    Config: ClassVar[type[FrozenConfig]] = XorClusterConfig
    data_kind = "classify"
    primary_metric: ClassVar[str] = "accuracy"
    metrics: ClassVar[tuple[str, ...]] = ("accuracy",)
    tiny: ClassVar[dict[str, Any]] = {"dim": 40, "mu_norm": 4.0, "n_train": 24, "n_test": 32}
    tiny_train: ClassVar[dict[str, Any]] = {
        "optimizer": "sgd", "lr": 0.5, "batch_size": 24, "loss_reduction": "mean",
        "max_steps": 6, "eval_every_steps": 1, "curve_splits": ["train", "test"],
        "selection": {"mode": "last", "early_stop": False},
    }  # fmt: skip

    config: XorClusterConfig

    def build(self, data_seed: int) -> TaskData:
        cfg = self.config
        train_rng, test_rng = (
            np.random.default_rng(s) for s in np.random.SeedSequence(data_seed).spawn(2)
        )
        x, y, clean = xor_clusters(cfg.n_train, cfg.dim, cfg.mu_norm, cfg.flip, train_rng)
        x_test, _, clean_test = xor_clusters(cfg.n_test, cfg.dim, cfg.mu_norm, 0.0, test_rng)
        splits = [
            Split("train", "train", Arrays(x.astype(np.float32), y, np.arange(cfg.n_train))),
            Split(
                "test", "test", Arrays(x_test.astype(np.float32), clean_test, np.arange(cfg.n_test))
            ),
        ]
        meta = {"input_shape": (cfg.dim,), "n_classes": 2, "flipped": np.flatnonzero(y != clean)}
        return TaskData(splits={s.name: s for s in splits}, meta=meta)

    def split_roles(self) -> dict[str, Role]:
        return {"train": "train", "test": "test"}

    def score(self, split: Split, predictions: Sequence[Any]) -> dict[str, np.ndarray]:
        """``accuracy`` against the split's labels (noisy on train, clean on test)."""
        return {"accuracy": accuracy(split, predictions)}

    def render(self, split: Split, prediction: Any, index: int | None = None) -> str:
        return render_class(prediction)

    def analysis(self) -> dict[str, Any]:
        """The two events of the paper's theorem, read from the per-step curves."""
        level = self.config.recovered_accuracy
        return {
            "metric_definitions": {
                "accuracy": "share of examples classified as their label (train: the noisy labels, "
                "flipped ones included; test: the clean labels)",
                "loss": "logistic loss per example",
            },
            "primary_metric": "accuracy",
            "histograms": [{"split": "test", "metric": "accuracy"}],
            "events": [
                {
                    "name": "fits_noise",
                    "split": "train",
                    "metric": "accuracy",
                    "op": ">=",
                    "threshold": 1.0,
                },
                {
                    "name": "recovers",
                    "split": "test",
                    "metric": "accuracy",
                    "op": ">=",
                    "threshold": level,
                },
            ],
        }
