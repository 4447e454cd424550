"""Paired MNIST (Li et al. 2021, "Gradient Descent Resists Compositionality").

An input is two digit images side by side, ``[x1 | x2]``: ``(1, 28, 56)`` float32 in
[0, 1]; the label is ``y1``, the class of the left image. Only the *pairing* of the
classes differs between training and test:

* train, setting ``"A"``: ``y2 = (y1 + randint{0, 1}) mod 10`` - the right digit is
  correlated with the label (redundant, spurious information);
* train, setting ``"B"``: ``y2`` uniform over the 10 classes (no correlation);
* test: ``y2 = (y1 + 2 + randint{0..7}) mod 10`` - combinations never seen in setting A.

``x1`` is drawn uniformly from the pool, ``x2`` uniformly among the pool images of class
``y2``. Training draws FRESH pairs every step (:meth:`MnistPairs.sample_train`, called by
the trainer with each member's own order-seeded generator).

Image pools. Train and test pairs come from disjoint image pools. When ``data_dir`` holds
the real MNIST training set (``train-images-idx3-ubyte`` and ``train-labels-idx1-ubyte``,
raw or ``.gz``) and ``pool_source`` is ``"auto"``, the train pool is the 60k training set
and the test pool the 10k test set. Otherwise (``pool_source="t10k_split"``, or no training
images - as in this project's reference data) the 10k test images are shuffled by the data
seed and split: the first ``train_pool_size`` (default 8,000) form the train pool, the
remaining 2,000 the test pool.

Splits (``ids`` = row numbers within the split unless said otherwise):

* ``train`` (role train): the train pool, shown as pairs: one pair per pool image (sorted
  by label) with that image on the left and a partner drawn under the setting's rule by
  the data seed on the right; ``ids`` are the left images' indices in their IDX file. Its
  left halves ARE the pool that :meth:`MnistPairs.sample_train` draws fresh pairs from;
  ``len(train)`` is the pool size (an epoch, if the trainer counts them), and evaluating
  it gives a training accuracy. Memory: 6.3 KB per pool image (50 MB for the 8,000-image
  pool, 376 MB for the real 60k training set).
* ``train_eval`` (role val): ``n_curve`` fixed train-distribution pairs (train pool, the
  setting's rule), for per-step curves.
* ``test`` (role test): ``n_curve`` fixed test pairs (test pool, test rule).
* ``train_eval_full`` (role val) and ``test_full`` (role test): ``n_final`` pairs each,
  drawn the same way, for the final evaluation (left out when ``n_final`` is 0).

Predictions (what :meth:`MnistPairs.score` takes, shared with the toy task): per example
either a class-probability vector ``(C,)`` (what the bundled convnet / MLP return; the
predicted class is its argmax) or a plain int class id. Metric ``accuracy``.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import ValidationInfo, field_validator

from trainables.configbase import FrozenConfig
from trainables.data import Arrays, Split, TaskData
from trainables.errors import ConfigError, DataError
from trainables.registry import TASKS
from trainables.tasks.base import Task, check_files

N_CLASSES = 10
IMAGE_SIZE = (28, 28)
"""Height x width of an MNIST image (what the bundled convnet's layers are sized for)."""
IMAGE_MAGIC, LABEL_MAGIC = 0x00000803, 0x00000801
IDX_DTYPES: dict[int, str] = {
    0x08: "u1",
    0x09: "i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}
"""IDX type code (third magic byte) -> numpy dtype (big-endian)."""
T10K = ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
TRAIN = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte")
Rule = Literal["train_A", "train_B", "test"]


# --- IDX files ---------------------------------------------------------------------------


def read_idx(path: Path, expect_magic: int | None = None) -> np.ndarray:
    """Read an IDX file (gzip-compressed or raw, detected from its first bytes).

    Checks the magic number (``expect_magic``, e.g. 0x803 for images, 0x801 for labels),
    the type code and that the payload size matches the header's dimensions.
    """
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise DataError(f"{path}: corrupt gzip ({exc}); download the file again") from exc
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] not in IDX_DTYPES:
        raise DataError(f"{path}: not an IDX file (bad magic {raw[:4].hex()}); check the path")
    (magic,) = struct.unpack(">I", raw[:4])
    if expect_magic is not None and magic != expect_magic:
        raise DataError(
            f"{path}: magic {magic:#010x}, expected {expect_magic:#010x}; "
            "images and labels files may be swapped"
        )
    ndim = raw[3]
    header = 4 + 4 * ndim
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(IDX_DTYPES[raw[2]])
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataError(
            f"{path}: header says {dims} ({expected} bytes) but {len(raw) - header} bytes follow; "
            "the file is truncated or corrupt, download it again"
        )
    array = np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
    return array.astype(dtype.newbyteorder("="))


def find_idx(data_dir: Path, stem: str) -> Path | None:
    """``data_dir/stem`` or ``data_dir/stem.gz``, whichever exists (raw first)."""
    for name in (stem, f"{stem}.gz"):
        if (data_dir / name).is_file():
            return data_dir / name
    return None


def load_mnist(data_dir: Path, stems: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 28, 28) uint8, labels (N,) int64) from an images/labels IDX pair."""
    paths = [find_idx(data_dir, s) for s in stems]
    missing = [s for s, p in zip(stems, paths, strict=True) if p is None]
    if missing:
        raise DataError(f"{data_dir} lacks {', '.join(missing)} (raw or .gz); add the MNIST files")
    images = read_idx(paths[0], IMAGE_MAGIC)  # type: ignore[arg-type]
    labels = read_idx(paths[1], LABEL_MAGIC).astype(np.int64)  # type: ignore[arg-type]
    if images.shape[1:] != IMAGE_SIZE:  # the convnet's layers need 28x28 (the pairs 28x56)
        size = "x".join(map(str, images.shape[1:]))
        raise DataError(f"{paths[0]}: images are {size} pixels, expected 28x28; this is not an MNIST images file")
    if len(images) != len(labels):
        raise DataError(f"{data_dir}: {len(images)} images but {len(labels)} labels; the files do not belong together")
    if len(labels) == 0:
        raise DataError(f"{paths[1]}: no images; download the files again")
    if labels.min() < 0 or labels.max() >= N_CLASSES:
        raise DataError(f"{paths[1]}: labels outside 0..9; this is not an MNIST labels file")
    absent = sorted(set(range(N_CLASSES)) - set(np.unique(labels).tolist()))
    if absent:
        raise DataError(f"{paths[1]}: no image of classes {absent}; pairs need every digit 0..9")
    return images, labels


# --- pairs -------------------------------------------------------------------------------


def second_labels(rule: Rule, y1: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The right image's class for each ``y1`` under ``rule`` (see module docstring)."""
    n = len(y1)
    if rule == "train_A":
        return (y1 + rng.integers(0, 2, n)) % N_CLASSES
    if rule == "train_B":
        return rng.integers(0, N_CLASSES, n)
    return (y1 + 2 + rng.integers(0, N_CLASSES - 2, n)) % N_CLASSES


def _pairs_with_first(
    pool: Arrays, rule: Rule, rng: np.random.Generator, first: np.ndarray, ids: np.ndarray
) -> Arrays:
    """Pairs whose left images are ``pool`` rows ``first``; partners drawn under ``rule``."""
    images, labels = pool.x, pool.y  # (N, 28, 28), (N,) sorted by label
    starts = np.searchsorted(labels, np.arange(N_CLASSES + 1))  # (11,)
    y1 = labels[first]
    y2 = second_labels(rule, y1, rng)
    second = starts[y2] + rng.integers(0, (starts[1:] - starts[:-1])[y2])  # (n,)
    x = np.concatenate([images[first], images[second]], axis=-1)[:, None]  # (n, 1, 28, 56)
    return Arrays(x=x, y=y1.astype(np.int64), ids=ids)


def sample_pairs(pool: Arrays, rule: Rule, rng: np.random.Generator, n: int) -> Arrays:
    """``n`` pairs from a label-sorted image pool (x (N, 28, 28)): x (n, 1, 28, 56), y = y1;
    left images uniform over the pool, ids 0..n-1."""
    first = rng.integers(0, len(pool), n)  # (n,)
    return _pairs_with_first(pool, rule, rng, first, np.arange(n))


def pool_pairs(pool: Arrays, rule: Rule, rng: np.random.Generator) -> Arrays:
    """One pair per pool image, in pool order: that image on the left, a partner under
    ``rule`` on the right; ids = the pool's ids (the left images' file indices)."""
    return _pairs_with_first(pool, rule, rng, np.arange(len(pool)), pool.ids)


def left_images(pairs: Arrays) -> Arrays:
    """The pool behind :func:`pool_pairs`: left halves (N, 28, 28) (a view), labels, ids."""
    return Arrays(x=pairs.x[:, 0, :, :28], y=pairs.y, ids=pairs.ids)


def make_pool(images: np.ndarray, labels: np.ndarray, ids: np.ndarray) -> Arrays:
    """A pool Arrays sorted by label (stable): x float32 in [0, 1], ids = file indices."""
    order = np.argsort(labels, kind="stable")
    counts = np.bincount(labels, minlength=N_CLASSES)
    if (counts == 0).any():
        raise DataError(
            f"an image pool lacks classes {np.flatnonzero(counts == 0).tolist()}; "
            "increase its size (task.train_pool_size)"
        )
    x = images[order].astype(np.float32) / np.float32(255.0)
    return Arrays(x=x, y=labels[order], ids=ids[order])


# --- predictions (shared with the toy task) ----------------------------------------------


def class_ids(predictions: Sequence[Any]) -> np.ndarray:
    """Predicted classes (N,) from probability vectors (argmax) or plain class ids."""
    return np.asarray(
        [int(np.argmax(p)) if np.ndim(p) else int(p) for p in predictions], dtype=np.int64
    )


def accuracy(split: Split, predictions: Sequence[Any]) -> np.ndarray:
    """Per-example 0/1 correctness (N,) of class predictions on an Arrays split."""
    if len(predictions) != len(split):
        raise ValueError(f"{len(predictions)} predictions for {len(split)} examples")
    return (class_ids(predictions) == split.data.y).astype(np.float64)  # type: ignore[union-attr]


def render_class(prediction: Any) -> str:
    """``"3"`` for a class id, ``"3 (p=0.912)"`` for a probability vector."""
    if np.ndim(prediction) == 0:
        return str(int(prediction))
    c = int(np.argmax(prediction))
    return f"{c} (p={float(prediction[c]):.3f})"


# --- the task ----------------------------------------------------------------------------


class MnistPairsConfig(FrozenConfig):
    """Paired-MNIST settings."""

    data_dir: str | None = None
    """Folder with MNIST IDX files (raw or .gz): t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte,
    and optionally train-images-idx3-ubyte + train-labels-idx1-ubyte. Required."""
    setting: Literal["A", "B"] = "A"
    """Training pairs: "A" y2 = y1 + {0, 1} mod 10 (correlated); "B" y2 uniform."""
    pool_source: Literal["auto", "t10k_split"] = "auto"
    """"auto": the real training set as train pool when data_dir has it, else split the 10k
    test images; "t10k_split": always split the 10k test images (comparable everywhere)."""
    train_pool_size: int = 8000
    """When splitting the 10k test images: how many (shuffled by the data seed) form the
    train pool; the rest form the test pool."""
    n_curve: int = 100
    """Size of the fixed `train_eval` and `test` pair sets evaluated for per-step curves."""
    n_final: int = 2000
    """Size of `train_eval_full` and `test_full` (final evaluation); 0 leaves them out."""

    @field_validator("train_pool_size", "n_curve")
    @classmethod
    def _positive(cls, value: int, info: ValidationInfo) -> int:
        if value < 1:
            raise ConfigError(f"task.{info.field_name}", f"is {value}", "use a value >= 1")
        return value

    @field_validator("n_final")
    @classmethod
    def _non_negative(cls, value: int) -> int:
        if value < 0:
            raise ConfigError("task.n_final", f"is {value}", "use 0 (no final sets) or more")
        return value


@TASKS.register
class MnistPairs(Task):
    """Classify the left digit of an MNIST pair; train/test differ in class pairing."""

    name: ClassVar[str] = "mnist_pairs"
    Config: ClassVar[type[FrozenConfig]] = MnistPairsConfig
    data_kind = "classify"
    primary_metric: ClassVar[str] = "accuracy"
    metrics: ClassVar[tuple[str, ...]] = ("accuracy",)
    fresh_samples: ClassVar[bool] = True
    tiny: ClassVar[dict[str, Any]] = {
        "data_dir": "mnist",
        "train_pool_size": 1000,
        "n_curve": 32,
        "n_final": 0,
    }
    tiny_train: ClassVar[dict[str, Any]] = {
        "optimizer": "adam",
        "lr": 1e-3,
        "batch_size": 8,
        "loss_reduction": "mean",
        "max_steps": 20,
        "eval_every_steps": 10,
        "selection": {"split": "train_eval", "metric": "accuracy"},
    }

    config: MnistPairsConfig

    def check(self, data_dir_required: bool = False) -> None:
        """Raise ConfigError unless ``data_dir`` is set and holds the t10k images and labels,
        intact: every IDX file the pools use is read, as a worker would (28x28 images, as many
        labels as images, every class 0..9), and ``train_pool_size`` leaves a test pool."""
        self._check_paths()
        check_files(self._read_files, "MNIST IDX",
                    "point task.data_dir at a folder with intact MNIST IDX files (download them again)")

    def _check_paths(self) -> None:
        data_dir = self.config.data_dir
        if data_dir is None:
            raise ConfigError(
                "task.data_dir",
                "mnist_pairs needs the MNIST IDX files but no data_dir is set",
                f"set task.data_dir to a folder holding {T10K[0]}(.gz) and {T10K[1]}(.gz)",
            )
        missing = [s for s in T10K if find_idx(Path(data_dir), s) is None]
        if missing:
            raise ConfigError(
                "task.data_dir",
                f"{data_dir} lacks {', '.join(missing)} (raw or .gz)",
                "point it at a folder with the MNIST IDX files",
            )

    def _read_files(self) -> None:
        """Read (and so check) every IDX file the pools would use, and the split's size."""
        root = Path(str(self.config.data_dir))
        _, test_labels = load_mnist(root, T10K)
        if self.config.pool_source == "auto" and find_idx(root, TRAIN[0]) is not None:
            load_mnist(root, TRAIN)
        else:
            self._check_pool_size(len(test_labels))

    def _check_pool_size(self, n_images: int) -> None:
        """Refuse a ``train_pool_size`` that leaves no test pool out of ``n_images``."""
        n_train = self.config.train_pool_size
        if n_train >= n_images:
            raise ConfigError(
                "task.train_pool_size",
                f"is {n_train} but there are only {n_images} test images to split",
                f"use a value below {n_images} (default 8000)",
            )

    def _pools(self, rng: np.random.Generator) -> tuple[Arrays, Arrays, str]:
        """(train pool, test pool, source) - see the module docstring."""
        self._check_paths()
        root = Path(str(self.config.data_dir))
        test_images, test_labels = load_mnist(root, T10K)
        has_train = find_idx(root, TRAIN[0]) is not None
        if self.config.pool_source == "auto" and has_train:
            train_images, train_labels = load_mnist(root, TRAIN)
            train_ids = np.arange(len(train_labels))
            return (
                make_pool(train_images, train_labels, train_ids),
                make_pool(test_images, test_labels, np.arange(len(test_labels))),
                "train_file",
            )
        n_train = self.config.train_pool_size
        self._check_pool_size(len(test_labels))
        perm = rng.permutation(len(test_labels))
        train_rows, test_rows = perm[:n_train], perm[n_train:]
        return (
            make_pool(test_images[train_rows], test_labels[train_rows], train_rows),
            make_pool(test_images[test_rows], test_labels[test_rows], test_rows),
            "t10k_split",
        )

    def build(self, data_seed: int) -> TaskData:
        pool_seed, train_seed, *eval_seeds = np.random.SeedSequence(data_seed).spawn(6)
        train_pool, test_pool, source = self._pools(np.random.default_rng(pool_seed))
        train_rule: Rule = "train_A" if self.config.setting == "A" else "train_B"
        cfg = self.config
        plan: list[tuple[str, Literal["val", "test"], Arrays, Rule, int]] = [
            ("train_eval", "val", train_pool, train_rule, cfg.n_curve),
            ("test", "test", test_pool, "test", cfg.n_curve),
            ("train_eval_full", "val", train_pool, train_rule, cfg.n_final),
            ("test_full", "test", test_pool, "test", cfg.n_final),
        ]
        train = pool_pairs(train_pool, train_rule, np.random.default_rng(train_seed))
        splits = {"train": Split("train", "train", train)}
        for (name, role, pool, rule, n), seed in zip(plan, eval_seeds, strict=True):
            if n > 0:
                splits[name] = Split(
                    name, role, sample_pairs(pool, rule, np.random.default_rng(seed), n)
                )
        meta = {
            "input_shape": (1, 28, 56),
            "n_classes": N_CLASSES,
            "pool_source": source,
            "pool_sizes": (len(train_pool), len(test_pool)),
        }
        return TaskData(splits=splits, meta=meta)

    def sample_train(self, data: TaskData, rng: np.random.Generator, n: int) -> Arrays:
        """``n`` fresh training pairs from the train pool (the left images of ``train``)."""
        train = data.splits["train"].data
        assert isinstance(train, Arrays)
        rule: Rule = "train_A" if self.config.setting == "A" else "train_B"
        return sample_pairs(left_images(train), rule, rng, n)

    def score(self, split: Split, predictions: Sequence[Any]) -> dict[str, np.ndarray]:
        return {"accuracy": accuracy(split, predictions)}

    def render(self, split: Split, prediction: Any, index: int | None = None) -> str:
        return render_class(prediction)

    def analysis(self) -> dict[str, Any]:
        """Seed histogram and scatter on the final sets (the curve sets when ``n_final`` is 0)."""
        full = self.config.n_final > 0
        test, val = ("test_full", "train_eval_full") if full else ("test", "train_eval")
        return {
            "metric_definitions": {
                "accuracy": "share of image pairs whose predicted class is the left digit's label",
                "loss": "the training loss (categorical hinge or cross-entropy) per example",
            },
            "primary_metric": "accuracy",
            "test_splits": [test],
            "histograms": [{"split": test, "metric": "accuracy"}],
            "scatter": [[val, "accuracy"], [test, "accuracy"]],
            "charts": [{"type": "curve", "splits": ["train_eval", "test"], "metric": "accuracy"}],
        }
