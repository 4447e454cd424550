"""Dyck-1 counting (El-Naggar, Madhyastha & Weyde 2022, data after Suzgun et al. 2019).

Strings of balanced brackets ``(`` ``)`` drawn from the PCFG ``S -> ( S )`` (probability
``p``), ``S -> S S`` (``q``), ``S -> empty`` (``1 - p - q``). A model reads one bracket per
time step (``SeqTags.x``: ids ``(`` = 0, ``)`` = 1; the model one-hots them) and emits a
2-vector per step: ``[1, 1 if the depth after the token is > 0 else 0]``. A model that
learns to count generalises to much longer strings than it was trained on.

Splits (``ids`` = row numbers within the split; with ``data_dir``, rows of the file):

* ``train`` (role train): ``train_size`` unique strings, lengths ``min_len..max_len``;
* ``val`` (role val): ``val_size`` unique strings of the same lengths, disjoint from train
  (the next strings of the same unique stream, so - as in the published files - the few
  shortest strings all land in train);
* ``long`` (role test): ``long_size`` unique strings, lengths ``long_min_len..long_max_len``
  (none of them in train or val);
* ``very_long`` (role test): ``very_long_size`` unique strings of length exactly
  ``very_long_len``;
* ``zigzag`` (role test): for each ``j`` in ``zigzag_js``, ``j`` opens then ``j`` closes,
  repeated to length ``zigzag_len``; example ``i`` has ``j = zigzag_js[i]`` (also the index
  of its first ``)``, see :func:`~trainables.tasks.dyck_strings.zigzag_j`).

Generators (:mod:`trainables.tasks.dyck_strings`). ``train``/``val``/``long`` follow Suzgun et al.'s recursive sampler
(:class:`~trainables.tasks.dyck_strings.SuzgunSampler`, run iteratively): a branch that makes the string longer than the
maximum is abandoned (returns the empty string), and strings are drawn until the
requested number of *unique* strings within the length range is reached. For
``very_long`` that rejection loop (Suzgun et al.'s ``generate_list(n, 1000, 1000)``) keeps
about 1 draw in 12,000, so it is drawn without the loop, by one of two dynamic programmes
(config ``very_long_sampler``): ``suzgun_rejection`` (:class:`~trainables.tasks.dyck_strings.SuzgunLengthSampler`) gives
exactly the loop's distribution, abandoned branches and depth cap included;
``conditioned`` (:class:`~trainables.tasks.dyck_strings.LengthConditionedSampler`, the default of configs that predate
the option) conditions the grammar itself on the length.

Metrics (per example; the trainer averages per split): outputs are thresholded at 0.5
(``> 0.5`` is 1). ``correct`` = 1 iff every step's thresholded 2-vector equals the target;
``fpf`` (first point of failure) = the 0-based index of the first step whose thresholded
2-vector differs from the target, or the length for a fully correct sequence.
``fpf_trivial`` = the FPF of the trivial predictor that says "depth > 0" at every step
(:func:`trivial_failure`) on the same example: a property of the split, not of the run,
scored from the data the run saw, so analysis can draw it beside every FPF (a run at or
below it did not learn to count).
:meth:`Dyck1.render` gives ``fpf=<n>`` when it is told the example's index (the base
interface passes none; then it renders the predicted depth bits).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from pydantic import ValidationInfo, field_validator, model_validator

from trainables.configbase import FrozenConfig, added_field
from trainables.data import Role, SeqTags, Split, TaskData
from trainables.errors import ConfigError, DataError
from trainables.metrics import Metric
from trainables.registry import TASKS
from trainables.tasks.base import Task, check_data_dir, check_files, decode_text
from trainables.tasks.dyck_strings import (
    SYMBOLS,
    VeryLongSampler,
    dyck_count,
    encode,
    sample_exact_unique,
    sample_unique,
    to_tags,
    zigzag,
)

PUBLISHED_FILES = {
    "train": "Dyck1_Dataset_Suzgun_train_.txt",
    "test": "Dyck1_Dataset_Suzgun_test_.txt",
    "very_long": "Dyck1_Dataset_Suzgun_1000tokens.txt",
    "zigzag": "Dyck1_Dataset_Suzgun_2000tokens_zigzag.txt",
}
PUBLISHED_VAL_START = 15_000
"""Published train file: rows 0..9,999 are train, rows 15,000..19,999 validation."""
SPLIT_ROLES: dict[str, Role] = {
    "train": "train",
    "val": "val",
    "long": "test",
    "very_long": "test",
    "zigzag": "test",
}
SIZE_FIELDS = {
    "train": "train_size",
    "val": "val_size",
    "long": "long_size",
    "very_long": "very_long_size",
}


# --------------------------------------------------------------------------- published files
def read_published(path: Path, rows: slice | None = None) -> SeqTags:
    """Rows of a published file (``sequence,targets,extra``); targets are read, not recomputed.

    ``ids`` are the row numbers in the file.
    """
    try:
        lines = decode_text(path, "ascii").splitlines()
    except FileNotFoundError as exc:
        raise DataError(
            f"{path} not found; point task.data_dir at the published Dyck-1 files"
        ) from exc
    index = np.arange(len(lines))[rows or slice(None)]
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    for i in index:
        fields = lines[i].split(",", 2)
        seq, digits = fields[0], fields[1] if len(fields) > 1 else ""
        if not seq or len(seq) != len(digits) or not set(digits) <= {"0", "1"}:
            raise DataError(
                f"{path}:{i + 1}: expected 'sequence,targets,...' with one 0/1 digit per "
                "bracket; check task.data_dir points at the published Dyck-1 files"
            )
        x = encode(seq)
        bit = np.frombuffer(digits.encode("ascii"), dtype=np.uint8) == ord("1")
        xs.append(x)
        ys.append(np.stack([np.ones(len(x)), bit], axis=1).astype(np.float32))
    return SeqTags(x=xs, y=ys, ids=index.astype(np.int64))


# --------------------------------------------------------------------------- metrics
def first_failure(predictions: Sequence[np.ndarray], targets: Sequence[np.ndarray]) -> np.ndarray:
    """FPF per example ``(N,)`` int64: first step whose thresholded 2-vector is wrong, else T.

    ``predictions[i]`` and ``targets[i]`` are ``(T_i, D)``; outputs ``> 0.5`` count as 1.
    """
    lengths = np.fromiter(map(len, targets), dtype=np.int64, count=len(targets))  # (N,)
    if len(predictions) != len(lengths):
        raise ValueError(f"{len(predictions)} predictions for {len(lengths)} targets")
    if not len(lengths):
        return lengths
    got = np.fromiter(map(len, predictions), dtype=np.int64, count=len(predictions))
    pred = np.concatenate([np.asarray(pr) for pr in predictions]) > 0.5  # (sum T, D)
    gold = np.concatenate(list(targets)) > 0.5  # (sum T, D)
    if np.any(got != lengths) or pred.shape != gold.shape or np.any(lengths == 0):
        i = int(np.argmax(got != lengths)) if np.any(got != lengths) else 0
        raise ValueError(
            f"prediction {i} has shape {np.shape(predictions[i])}, expected {targets[i].shape} (T > 0)"
        )
    bad = np.any(pred != gold, axis=1)  # (sum T,)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])  # (N,)
    local = np.arange(len(bad)) - np.repeat(starts, lengths)  # (sum T,) step within example
    where = np.where(bad, local, np.repeat(lengths, lengths))  # (sum T,)
    return np.minimum.reduceat(where, starts)  # (N,)


def trivial_failure(targets: Sequence[np.ndarray]) -> np.ndarray:
    """FPF per example ``(N,)`` of the trivial predictor: ``[1, 1]`` (depth > 0) at every step.

    Scored by :func:`first_failure` itself, so it is the step after which the depth first
    returns to 0 (never the full length: a Dyck string ends at depth 0).
    """
    return first_failure([np.ones_like(t) for t in targets], targets)


# --------------------------------------------------------------------------- config + task
class Dyck1Config(FrozenConfig):
    """Dyck-1 task settings (defaults: El-Naggar et al. 2022 after Suzgun et al. 2019)."""

    train_size: int = 10_000
    """Distinct training strings."""
    val_size: int = 5_000
    """Distinct validation strings (same lengths as train, disjoint from it)."""
    min_len: int = 2
    """Shortest train/val string."""
    max_len: int = 50
    """Longest train/val string (also the sampler's abandon limit)."""
    long_size: int = 5_000
    """Distinct strings of the `long` test split."""
    long_min_len: int = 52
    """Shortest `long` string."""
    long_max_len: int = 100
    """Longest `long` string (the sampler's abandon limit for that split)."""
    very_long_size: int = 100
    """Distinct strings of the `very_long` test split."""
    very_long_len: int = 1_000
    """Exact length of every `very_long` string (even)."""
    very_long_sampler: VeryLongSampler = added_field("conditioned")
    """How `very_long` is drawn: "suzgun_rejection": Suzgun et al.'s sampler (abandon limit
    very_long_len) kept only at length very_long_len, as their generate_list(n, L, L) does
    (El-Naggar et al.: "using the same methods"); "conditioned": the grammar conditioned on
    the length, which ignores the sampler's abandoned branches and depth cap (a different
    distribution; at length 1000 a close one, see SuzgunLengthSampler)."""
    zigzag_len: int = 2_000
    """Length of every `zigzag` string."""
    zigzag_js: tuple[int, ...] = (1000, 500, 250, 200, 125, 100, 50, 25, 20, 10)
    """Run lengths j of the `zigzag` strings (j opens then j closes, repeated); one string each."""
    p: float = 0.5
    """PCFG probability of S -> ( S )."""
    q: float = 0.25
    """PCFG probability of S -> S S (S -> empty gets 1 - p - q)."""
    data_dir: str | None = None
    """Optional folder with the published files (Dyck1_Dataset_Suzgun_{train_,test_,1000tokens,
    2000tokens_zigzag}.txt): train = rows 0.. of the train file, val = rows 15,000.., long =
    first rows of the test file, very_long and zigzag = their files (sizes as configured;
    zigzag: every row). The published very-long rows have lengths 502-974, not 1000."""

    @field_validator("train_size", "val_size", "long_size", "very_long_size", "zigzag_len")
    @classmethod
    def _positive(cls, value: int, info: ValidationInfo) -> int:
        if value < 1:
            raise ConfigError(f"task.{info.field_name}", f"is {value}", "use a value >= 1")
        return value

    @field_validator("min_len", "long_min_len")
    @classmethod
    def _min_len(cls, value: int, info: ValidationInfo) -> int:
        if value < 2:
            raise ConfigError(f"task.{info.field_name}", f"is {value}", "use a length >= 2")
        return value

    @field_validator("very_long_len")
    @classmethod
    def _even(cls, value: int) -> int:
        if value < 2 or value % 2:
            raise ConfigError("task.very_long_len", f"is {value}", "use an even length >= 2")
        return value

    @field_validator("zigzag_js")
    @classmethod
    def _js(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or min(value) < 1:
            raise ConfigError("task.zigzag_js", f"is {value}", "give one or more run lengths >= 1")
        return value

    @model_validator(mode="after")
    def _grammar_and_ranges(self) -> Dyck1Config:
        if not (0 < self.p < 1 and 0 <= self.q < 0.5 and self.p + self.q < 1):
            raise ConfigError(
                "task.p",
                f"p={self.p}, q={self.q} do not give a finite sampler",
                "use 0 < p < 1, 0 <= q < 0.5 and p + q < 1 (default p=0.5, q=0.25)",
            )
        ranges = {
            "max_len": (self.min_len, self.max_len, self.train_size + self.val_size),
            "long_max_len": (self.long_min_len, self.long_max_len, self.long_size),
        }
        for name, (lo, hi, need) in ranges.items():
            have = sum(dyck_count(n) for n in range(lo, hi + 1))
            if have < need:
                raise ConfigError(
                    f"task.{name}",
                    f"lengths {lo}..{hi} hold only {have} distinct Dyck strings, {need} requested",
                    "widen the length range or request fewer strings",
                )
        if dyck_count(self.very_long_len) < self.very_long_size:
            raise ConfigError(
                "task.very_long_size", "more strings than exist at very_long_len", "lower it"
            )
        return self


@TASKS.register
class Dyck1(Task):
    """Dyck-1 depth tagging; see the module docstring for splits, generators and metrics."""

    name: ClassVar[str] = "dyck1"
    Config: ClassVar[type[FrozenConfig]] = Dyck1Config
    data_kind = "tagging"
    primary_metric: ClassVar[str] = "correct"
    metrics: ClassVar[tuple[str | Metric, ...]] = (
        "correct", Metric("fpf", high=None), Metric("fpf_trivial", high=None),  # steps: 0 .. a sequence's length
    )
    tiny: ClassVar[dict[str, Any]] = {
        "train_size": 64,
        "val_size": 32,
        "long_size": 16,
        "very_long_size": 4,
        "very_long_len": 200,
        "zigzag_len": 200,
        "zigzag_js": (100, 10),
    }
    tiny_train: ClassVar[dict[str, Any]] = {
        "optimizer": "adam",
        "lr": 0.01,
        "batch_size": 1,
        "clip_norm": None,
        "loss_reduction": "mean",
        "selection": {"split": "val", "metric": "loss", "mode": "min"},
    }

    config: Dyck1Config

    def check(self, data_dir_required: bool = False) -> None:
        """Raise ConfigError if ``data_dir`` is set (or required) but lacks a published file,
        or one of them is malformed (read in full, as a worker would)."""
        self._check_paths(data_dir_required)
        if self.config.data_dir is not None:
            check_files(self._load, "Dyck-1")

    def _check_paths(self, data_dir_required: bool = False) -> None:
        check_data_dir(
            self.config.data_dir, list(PUBLISHED_FILES.values()), "Dyck-1",
            required=data_dir_required, fallback="generate the data",
        )

    def split_roles(self) -> dict[str, Role]:
        return dict(SPLIT_ROLES)

    def _generate(self, data_seed: int) -> dict[str, SeqTags]:
        cfg = self.config
        rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(data_seed).spawn(3)]
        n_train = cfg.train_size
        short = sample_unique(
            rngs[0], n_train + cfg.val_size, cfg.min_len, cfg.max_len, cfg.p, cfg.q
        )
        long = sample_unique(
            rngs[1], cfg.long_size, cfg.long_min_len, cfg.long_max_len, cfg.p, cfg.q, set(short)
        )
        very_long = sample_exact_unique(
            rngs[2], cfg.very_long_size, cfg.very_long_len, cfg.p, cfg.q, cfg.very_long_sampler
        )
        return {
            "train": to_tags(short[:n_train]),
            "val": to_tags(short[n_train:]),
            "long": to_tags(long),
            "very_long": to_tags(very_long),
            "zigzag": to_tags([zigzag(j, cfg.zigzag_len) for j in cfg.zigzag_js]),
        }

    def _load(self) -> dict[str, SeqTags]:
        cfg = self.config
        root = Path(str(cfg.data_dir))
        parts = {
            "train": read_published(root / PUBLISHED_FILES["train"], slice(0, cfg.train_size)),
            "val": read_published(
                root / PUBLISHED_FILES["train"],
                slice(PUBLISHED_VAL_START, PUBLISHED_VAL_START + cfg.val_size),
            ),
            "long": read_published(root / PUBLISHED_FILES["test"], slice(0, cfg.long_size)),
            "very_long": read_published(
                root / PUBLISHED_FILES["very_long"], slice(0, cfg.very_long_size)
            ),
            "zigzag": read_published(root / PUBLISHED_FILES["zigzag"]),
        }
        for name, field in SIZE_FIELDS.items():
            want = getattr(cfg, field)
            if len(parts[name]) != want:
                raise DataError(
                    f"the published files hold {len(parts[name])} rows for split {name!r} but "
                    f"{want} are configured; lower task.{field}"
                )
        return parts

    def build(self, data_seed: int) -> TaskData:
        """All splits, generated from ``data_seed`` (or read from ``data_dir``, seed unused)."""
        self._check_paths()
        parts = self._load() if self.config.data_dir is not None else self._generate(data_seed)
        splits = {name: Split(name, SPLIT_ROLES[name], data) for name, data in parts.items()}
        meta = {
            "input_size": len(SYMBOLS),
            "output_size": 2,
            "max_len": max(len(x) for d in parts.values() for x in d.x),
            "train_max_len": max(len(x) for x in parts["train"].x),
            "symbols": SYMBOLS,
        }
        return TaskData(splits=splits, meta=meta)

    def score(self, split: Split, predictions: Sequence[Any]) -> dict[str, np.ndarray]:
        """``correct`` (0/1), ``fpf`` and ``fpf_trivial`` (:func:`trivial_failure`, the same for
        every run on these data) per example; ``predictions[i]`` is ``(T_i, 2)`` sigmoid outputs."""
        data = split.data
        assert isinstance(data, SeqTags)
        if len(predictions) != len(data):
            raise ValueError(f"{len(predictions)} predictions for {len(data)} examples")
        fpf = first_failure(predictions, data.y)
        lengths = np.array([len(x) for x in data.x], dtype=np.int64)
        return {
            "correct": (fpf == lengths).astype(np.float64),
            "fpf": fpf.astype(np.float64),
            "fpf_trivial": self._trivial(split.name, data),
        }

    def _trivial(self, name: str, data: SeqTags) -> np.ndarray:
        """:func:`trivial_failure` of a split as float64, computed once per split's data
        (every member of a bundle is scored on the same data, every round)."""
        cache: dict[str, tuple[SeqTags, np.ndarray]] = self.__dict__.setdefault("_trivial_fpf", {})
        hit = cache.get(name)
        if hit is None or hit[0] is not data:
            values = trivial_failure(data.y).astype(np.float64)
            values.setflags(write=False)
            hit = cache[name] = (data, values)
        return hit[1]

    def render_example(self, data: TaskData, split: Split, index: int) -> tuple[str, str]:
        """The input as brackets (first 60), the target empty (a depth per step)."""
        x = split.data.x[index]  # type: ignore[union-attr]
        text = "".join("()"[int(t)] for t in x[:60]) + (f"...({len(x)})" if len(x) > 60 else "")
        return text, ""

    def render(self, split: Split, prediction: Any, index: int | None = None) -> str:
        """``fpf=<n>`` when the example ``index`` is given, else the thresholded depth bits.

        The base interface passes no index, so without it the target is unknown: the
        rendering is then the predicted second output as 0/1 digits (first 60 steps).
        """
        pred = np.asarray(prediction)
        if index is not None:
            data = split.data
            assert isinstance(data, SeqTags)
            fpf = int(first_failure([pred], [data.y[index]])[0])
            return f"fpf={fpf}"
        bits = "".join("1" if v > 0.5 else "0" for v in pred[:60, 1])
        return bits + (f"...({len(pred)})" if len(pred) > 60 else "")

    def analysis(self) -> dict[str, Any]:
        """El-Naggar et al.'s aggregates, declared as data for the manifest (docs/analysis.md).

        Per grid point (cell type): the summary over the 10 runs with the lowest validation
        loss (the paper's ReLU selection: 10 of 30; 10 of 10 for LSTM and GRU); the OLS of
        very-long FPF on -log(train / val / long loss) over the snapshot checkpoints of those
        runs (6 epochs x 10 runs = 60); and the trivial predictor's FPF (``fpf_trivial``, a
        metric the runs record from their own data) beside every FPF. Also the regression
        across runs at the selected epoch and the very-long FPF histogram.
        """
        very_long_fpf = {"split": "very_long", "metric": "fpf"}
        lowest_val_loss = {"k": 10, "by": {"split": "val", "metric": "loss"}, "mode": "min"}

        def neglog_loss(split: str) -> dict[str, str]:
            return {"split": split, "metric": "loss", "transform": "neglog"}

        return {
            "metric_definitions": {
                "correct": "share of sequences whose every step's depth outputs are right (thresholded at 0.5)",
                "fpf": "first point of failure: the number of steps before the first wrong depth output "
                "(the sequence length when none is wrong)",
                "fpf_trivial": "the FPF of the trivial predictor that says 'depth > 0' at every step, on "
                "the same sequences: a property of the split; a run at or below it did not learn to count",
                "loss": "mean squared error of the depth outputs (lower is better)",
            },
            "regressions": [{"x": neglog_loss("val"), "y": very_long_fpf, "over": "runs"}],
            "histograms": [very_long_fpf],
            "aggregates": [
                {
                    "kind": "best_k",
                    **lowest_val_loss,
                    "of": [
                        {"split": "val", "metric": "loss"},
                        {"split": "long", "metric": "correct"},
                        {"split": "long", "metric": "fpf"},
                        very_long_fpf,
                        {"split": "zigzag", "metric": "fpf"},
                    ],
                },
                {
                    "kind": "checkpoint_regression",
                    "y": very_long_fpf,
                    "x": [neglog_loss(s) for s in ("train", "val", "long")],
                    "runs": lowest_val_loss,
                },
                {
                    "kind": "baseline",
                    "metric": "fpf",
                    "baseline": "fpf_trivial",
                    "label": "trivial predictor (depth > 0 at every step)",
                },
            ],
        }
