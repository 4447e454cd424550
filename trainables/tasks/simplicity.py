"""Slab data of Shah et al. 2020 ("The Pitfalls of Simplicity Bias in Neural Networks").

Binary labels ``y`` (uniform), ``dim`` coordinates, each fully predictive of ``y`` on its
own; coordinate 0 is the *simple* feature ``S``, coordinates ``1..dim-1`` the *complex*
ones ``S^c``. Data live in ``[-1, 1]`` (the authors' ``width: 1``) and every block keeps
a gap of ``2 * margin`` between opposite classes (their ``lin_margin = slab_margin = 0.1``,
``same_margin: true``):

* **linear**: ``x = (2y - 1) * (margin + (1 - margin) * U)``, ``U ~ U[0, 1]``;
* **5-slab**: slab width ``w = (2 - 8 * margin) / 5``; negatives in the centre slab
  ``[-w/2, w/2]`` with probability 3/4 (``slab5_pval``), else in the outer slabs
  ``+-[(3 + 8m) / 5, 1]``; positives in the slabs ``+-[(1 + 6m) / 5, (1 + 6m) / 5 + w]``;
* **7-slab**: ``w = (2 - 12 * margin) / 7``; positives in the inner slabs
  ``+-[w/2 + 2m, 3w/2 + 2m]`` with probability 7/8 (``slab7_pval``), else in the outer
  ones ``+-[5w/2 + 6m, 1]``; negatives in the centre slab (probability 1/2) or in
  ``+-[3w/2 + 4m, 5w/2 + 4m]``; the sign of a side slab is a fair coin.

Datasets (``dataset``; the authors' notebooks 01 and 03 give the layouts):

* ``lms5`` (LMS-5): ``S`` linear, ``S^c`` 5-slabs;
* ``ms57`` (MS-(5,7)): ``S`` a 5-slab, ``S^c`` 7-slabs;
* ``lms7`` (L^MS-7 with ``linear_noise: 0.1``): ``S`` linear, ``S^c`` 7-slabs; a fraction
  ``linear_noise`` of ALL examples (train and test together, a fixed count, drawn without
  replacement) gets a linear coordinate redrawn uniformly inside the margin
  ``U(-margin, margin)``, so ``S`` alone reaches at most ``1 - linear_noise / 2``
  accuracy while every 7-slab is 100% predictive (the authors' ``corrupt_lin`` with
  ``corrupt_lin_margin: true``).

Finally a random orthogonal matrix ``W`` (the Q of a Gaussian matrix's QR, the authors'
``utils.get_orthonormal_matrix``) rotates every example: the model sees ``x_c @ W``
(``random_transform: true``); ``meta["rotation"]`` holds ``W``. Everything is drawn from
the data seed. The generator follows ``scripts/gendata.py``
(``generate_ub_linslab_data_diffmargin_v2``) of github.com/harshays/simplicitybiaspitfalls
in distribution, not draw for draw (it reshuffles between coordinates with NumPy's global
state; here each block is drawn given the labels).

Splits (``ids`` = row numbers):

* ``train`` (role train): ``n_train`` examples;
* ``train_eval`` (role val): the same examples, evaluated: the authors' ``fit_model``
  stops once *training* accuracy reaches ``1 - epsilon`` (``converged_accuracy``);
* ``test`` (role test): ``n_test`` examples of the same distribution;
* ``test_s_rand`` (role test): ``test`` with ``S`` randomized: the canonical coordinate 0
  permuted across examples (labels stay), then rotated back (``lms_utils.
  get_randomized_loader(te_dl, W, [0])``);
* ``test_sc_rand`` (role test): ``test`` with every ``S^c`` coordinate randomized by ONE
  permutation of the examples (the authors' ``_randomize`` moves the whole block).

Metrics: ``accuracy`` and ``auc``, the area under the ROC curve of the score
``log p1 - log p0`` (the logit margin ``L1 - L0`` the authors score with, read back from
the model's probabilities). The AUC is not a mean over examples, but every split metric
here is one, so ``auc`` per example is that example's *share* (:func:`auc_shares`): a
positive's share is the fraction of negatives it outranks (ties 1/2) times ``N / n_pos``,
a negative's is 0; the split's mean is exactly the Mann-Whitney AUC. The ``predictions``
table stores the margin itself as the ``prediction`` text (e.g. ``"7.31254"``), the label
as ``target``, so analysis averages margins over seeds (the authors' ``EnsembleAverage``
of logits) without the models (:mod:`analysis.ensembles`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from trainables.configbase import FrozenConfig
from trainables.data import Arrays, Role, Split, TaskData
from trainables.errors import ConfigError
from trainables.registry import TASKS
from trainables.tasks.base import Task

Dataset = Literal["lms5", "ms57", "lms7"]
LAYOUTS: dict[str, tuple[str, str]] = {"lms5": ("linear", "slab5"), "ms57": ("slab5", "slab7"),
                                       "lms7": ("linear", "slab7")}  # fmt: skip
"""Dataset -> (block of S = coordinate 0, block of every S^c coordinate)."""
SLAB5_PVAL = 3 / 4
"""5-slab: probability that a negative lies in the centre slab (gendata's ``slab5_pval``)."""
SLAB7_PVAL = 7 / 8
"""7-slab: probability that a positive lies in the inner slabs (``slab7_pval``)."""
EPSILON = {"lms5": 1e-4, "ms57": 1e-4, "lms7": 5e-3}
"""The notebooks' ``fit_model(..., epsilon=...)``: training stops at accuracy >= 1 - epsilon."""


# --- generators (pure numpy) -----------------------------------------------------------


def slab_width(slabs: int, margin: float) -> float:
    """Width of one slab of a 5- or 7-slab coordinate in ``[-1, 1]`` (gendata's ``get_slab_width``)."""
    return {5: (2.0 - 8.0 * margin) / 5.0, 7: (2.0 - 12.0 * margin) / 7.0}[slabs]


def _sign(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return 2.0 * rng.integers(0, 2, shape) - 1.0


def linear_block(
    y: np.ndarray, margin: float, rng: np.random.Generator, cols: int = 1
) -> np.ndarray:
    """(N, cols): ``(2y - 1) * (margin + (1 - margin) U)``."""
    u = rng.random((len(y), cols))
    return (2.0 * y[:, None] - 1.0) * (margin + (1.0 - margin) * u)


def slab5_block(
    y: np.ndarray, margin: float, rng: np.random.Generator, cols: int = 1
) -> np.ndarray:
    """(N, cols) 5-slab coordinates given labels ``y`` (see the module docstring)."""
    w = slab_width(5, margin)
    shape = (len(y), cols)
    u, sign = rng.random(shape), _sign(rng, shape)
    centre = rng.random(shape) < SLAB5_PVAL
    pos = sign * ((1.0 + 6.0 * margin) / 5.0 + w * u)
    neg = np.where(centre, 0.5 * sign * w * u, sign * ((3.0 + 8.0 * margin) / 5.0 + w * u))
    return np.where(y[:, None] == 1, pos, neg)


def slab7_block(
    y: np.ndarray, margin: float, rng: np.random.Generator, cols: int = 1
) -> np.ndarray:
    """(N, cols) 7-slab coordinates given labels ``y`` (see the module docstring)."""
    w = slab_width(7, margin)
    shape = (len(y), cols)
    u, sign = rng.random(shape), _sign(rng, shape)
    inner = rng.random(shape) < SLAB7_PVAL
    centre = rng.random(shape) < 0.5
    pos = sign * np.where(inner, 0.5 * w + 2.0 * margin, 2.5 * w + 6.0 * margin) + sign * w * u
    neg = np.where(centre, 0.5 * sign * w * u, sign * (1.5 * w + 4.0 * margin + w * u))
    return np.where(y[:, None] == 1, pos, neg)


BLOCKS = {"linear": linear_block, "slab5": slab5_block, "slab7": slab7_block}


def orthogonal(dim: int, rng: np.random.Generator) -> np.ndarray:
    """A random orthogonal (dim, dim) matrix: Q of the QR of a standard Gaussian matrix."""
    q, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    return q


def canonical_data(
    dataset: str, n: int, dim: int, margin: float, linear_noise: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` examples before rotation: x (n, dim) float64, y (n,) int64 in {0, 1}."""
    simple, complex_ = LAYOUTS[dataset]
    y = rng.integers(0, 2, n)
    x = np.empty((n, dim))
    x[:, :1] = BLOCKS[simple](y, margin, rng)
    x[:, 1:] = BLOCKS[complex_](y, margin, rng, dim - 1)
    corrupt = round(n * linear_noise)
    if corrupt:
        idx = rng.choice(n, size=corrupt, replace=False)
        x[idx, 0] = rng.uniform(-margin, margin, corrupt)
    return x, y.astype(np.int64)


def randomized(x_c: np.ndarray, coords: Sequence[int] | slice, perm: np.ndarray) -> np.ndarray:
    """Canonical examples with the columns ``coords`` taken from the examples ``perm``
    (one permutation for the whole block), the rest as they were."""
    out = x_c.copy()
    out[:, coords] = x_c[perm][:, coords]
    return out


def auc_shares(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per-example shares of the AUC of ``scores`` for ``labels`` (1 = positive): their
    mean is the Mann-Whitney AUC, ties counting 1/2 (all NaN without both classes)."""
    s, y = np.asarray(scores, dtype=np.float64), np.asarray(labels) == 1
    n, n_pos = len(s), int(y.sum())
    n_neg = n - n_pos
    if n_pos == 0 or n_neg == 0:
        return np.full(n, np.nan)
    from scipy import stats  # here, not at import: every Ray worker imports the task registry

    out = np.zeros(n)
    # negatives a positive outranks (+ half its ties): its rank among all minus among positives
    below = stats.rankdata(s)[y] - stats.rankdata(s[y])
    out[y] = below / n_neg * n / n_pos
    return out


def margins(probs: np.ndarray) -> np.ndarray:
    """Logit margins ``log p1 - log p0`` (N,) float64 from probabilities (N, 2); a
    probability that underflowed to 0 gives +-inf (still ranked right)."""
    p = np.asarray(probs, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.log(p[:, 1]) - np.log(p[:, 0])


# --- the task ---------------------------------------------------------------------------


class SlabsConfig(FrozenConfig):
    """Shah et al.'s slab datasets."""

    dataset: Dataset = "lms5"
    """"lms5" (S linear, S^c 5-slabs), "ms57" (S a 5-slab, S^c 7-slabs) or "lms7" (S linear,
    S^c 7-slabs; L^MS-7 with linear_noise 0.1)."""
    dim: int = Field(50, ge=2)
    """Input dimension: coordinate 0 is S, the other dim - 1 are S^c (the notebooks: 50)."""
    n_train: int = Field(100_000, ge=1)
    """Training examples (notebooks: 100,000 for LMS-5 and MS-(5,7), 40,000 for L^MS-7)."""
    n_test: int = Field(10_000, ge=2)
    """Test examples, also the size of each randomized test set (notebooks: 10,000; 50,000 for
    MS-(5,7))."""
    margin: float = Field(0.1, gt=0)
    """Half the gap between opposite classes in every coordinate, in units of the data's
    half-width 1 (the authors' lin_margin = slab_margin, same_margin: true)."""
    linear_noise: float = Field(0.0, ge=0, lt=1)
    """Fraction of all examples whose linear coordinate is redrawn inside the margin, uniform
    on (-margin, margin) (the authors' corrupt_lin with corrupt_lin_margin: true; L^MS-7: 0.1)."""
    rotate: bool = True
    """Rotate every example by one random orthogonal matrix drawn from the data seed (the
    authors' random_transform); false: the canonical coordinates as they are."""
    converged_accuracy: float | None = Field(None, gt=0, le=1)
    """Training accuracy (split train_eval) at which a run counts as converged, for the
    declared time-to-event `converges`; null: the notebooks' 1 - epsilon (0.9999 for lms5 and
    ms57, 0.995 for lms7). The stopping rule itself is train.selection's."""

    @model_validator(mode="after")
    def _check(self) -> SlabsConfig:
        simple, complex_ = LAYOUTS[self.dataset]
        slabs = [int(b[-1]) for b in (simple, complex_) if b.startswith("slab")]
        for k in slabs:
            if slab_width(k, self.margin) <= 0:
                top = {5: 0.25, 7: 1 / 6}[k]
                raise ConfigError("task.margin", f"is {self.margin}: a {k}-slab coordinate leaves no "
                                  "room for its slabs", f"use a margin below {top:.4g}")  # fmt: skip
        if self.margin >= 1:
            raise ConfigError(
                "task.margin", f"is {self.margin}", "use a margin below 1 (data lie in [-1, 1])"
            )
        if self.linear_noise and simple != "linear":
            raise ConfigError("task.linear_noise", f"is {self.linear_noise} but {self.dataset} has no "
                              "linear coordinate", "set it to 0, or use dataset lms5 or lms7")  # fmt: skip
        return self

    @property
    def threshold(self) -> float:
        """The converged training accuracy (``converged_accuracy`` or the notebooks' 1 - epsilon)."""
        return (
            self.converged_accuracy
            if self.converged_accuracy is not None
            else 1 - EPSILON[self.dataset]
        )


@TASKS.register
class Slabs(Task):
    """Shah et al.'s LMS-5, MS-(5,7) and L^MS-7 with S- and S^c-randomized test sets."""

    name: ClassVar[str] = "slabs"
    Config: ClassVar[type[FrozenConfig]] = SlabsConfig
    data_kind = "classify"
    primary_metric: ClassVar[str] = "accuracy"
    metrics: ClassVar[tuple[str, ...]] = ("accuracy", "auc")
    tiny: ClassVar[dict[str, Any]] = {"dim": 6, "n_train": 96, "n_test": 48}
    tiny_train: ClassVar[dict[str, Any]] = {
        "optimizer": "sgd", "lr": 0.1, "batch_size": 16, "loss_reduction": "mean",
        "max_steps": 12, "eval_every_steps": 6,
        "selection": {"split": "train_eval", "metric": "accuracy"},
    }  # fmt: skip

    config: SlabsConfig

    def build(self, data_seed: int) -> TaskData:
        cfg = self.config
        data_rng, rot_rng, perm_rng = (
            np.random.default_rng(s) for s in np.random.SeedSequence(data_seed).spawn(3)
        )
        x_c, y = canonical_data(cfg.dataset, cfg.n_test + cfg.n_train, cfg.dim, cfg.margin,
                                cfg.linear_noise, data_rng)  # fmt: skip
        w = orthogonal(cfg.dim, rot_rng) if cfg.rotate else np.eye(cfg.dim)
        test_c, y_test = x_c[: cfg.n_test], y[: cfg.n_test]
        s_rand = randomized(test_c, [0], perm_rng.permutation(cfg.n_test))
        sc_rand = randomized(test_c, slice(1, None), perm_rng.permutation(cfg.n_test))

        def arrays(x: np.ndarray, labels: np.ndarray) -> Arrays:
            return Arrays(x=(x @ w).astype(np.float32), y=labels, ids=np.arange(len(labels)))

        train = arrays(x_c[cfg.n_test :], y[cfg.n_test :])
        splits = [
            Split("train", "train", train),
            Split("train_eval", "val", train),
            Split("test", "test", arrays(test_c, y_test)),
            Split("test_s_rand", "test", arrays(s_rand, y_test)),
            Split("test_sc_rand", "test", arrays(sc_rand, y_test)),
        ]
        meta = {"input_shape": (cfg.dim,), "n_classes": 2, "rotation": w}
        return TaskData(splits={s.name: s for s in splits}, meta=meta)

    def split_roles(self) -> dict[str, Role]:
        """The roles without building 100k examples."""
        return {"train": "train", "train_eval": "val", "test": "test", "test_s_rand": "test",
                "test_sc_rand": "test"}  # fmt: skip

    def score(self, split: Split, predictions: Sequence[Any]) -> dict[str, np.ndarray]:
        """``accuracy`` and ``auc`` shares (see the module docstring) from probability vectors."""
        if len(predictions) != len(split):
            raise ValueError(f"{len(predictions)} predictions for {len(split)} examples")
        if any(np.ndim(p) != 1 for p in predictions):
            raise ValueError("slabs needs class-probability vectors (the AUC ranks their margins)")
        probs = np.stack(predictions) if len(predictions) else np.zeros((0, 2))
        labels = np.asarray(split.data.y)  # type: ignore[union-attr]
        right = (probs.argmax(axis=1) == labels).astype(np.float64)
        return {"accuracy": right, "auc": auc_shares(margins(probs), labels)}

    def render(self, split: Split, prediction: Any, index: int | None = None) -> str:
        """The logit margin ``log p1 - log p0`` as text (``"7.31254"``): what analysis
        averages over seeds for the ensemble's AUC."""
        return f"{float(margins(np.asarray(prediction)[None])[0]):.9g}"

    def analysis(self) -> dict[str, Any]:
        """Per-seed AUCs on the three test sets with the fraction of seeds showing extreme
        simplicity bias, the ensemble of every seed (and of disjoint threes, the paper's
        size), and the time to convergence (training accuracy >= 1 - epsilon)."""
        tests = ["test", "test_s_rand", "test_sc_rand"]
        return {
            "metric_definitions": {
                "auc": "area under the ROC curve of the logit margin (1: every positive ranked above "
                "every negative; 0.5: chance)",
                "accuracy": "share of examples classified right",
                "loss": "cross-entropy per example",
            },
            "primary_metric": "auc",
            "test_splits": tests,
            "histograms": [{"split": s, "metric": "auc"} for s in tests[1:]],
            "scatter": [["test_s_rand", "auc"], ["test_sc_rand", "auc"]],
            "aggregates": [
                {
                    "kind": "extreme_sb",
                    "metric": "auc",
                    "standard": "test",
                    "s_randomized": "test_s_rand",
                    "sc_randomized": "test_sc_rand",
                    "s_max": 0.55,
                    "sc_tolerance": 0.02,
                },
                {"kind": "ensemble_auc", "splits": tests, "sizes": [3]},
            ],
            "events": [
                {
                    "name": "converges",
                    "split": "train_eval",
                    "metric": "accuracy",
                    "op": ">=",
                    "threshold": self.config.threshold,
                }
            ],
        }
