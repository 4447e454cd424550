"""The Task base class: what a task (built-in or plugin) implements.

A task generates (or loads) its data deterministically from a data seed and names its
splits with a *role* (``train``, ``val``, ``val_ood``, ``test``; see
:mod:`trainables.data`, which also holds the data containers it returns). It owns its
metrics: :meth:`Task.score` turns a model's predictions on a split into per-example
metric values (the split's metric is their mean), and declares which metric per example
marks an example "correct" for the ``predictions`` table.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from trainables.configbase import FrozenConfig
from trainables.data import Arrays, DataKind, Role, SeqPairs, SeqTags, Split, SplitData, TaskData
from trainables.errors import ConfigError, DataError
from trainables.metrics import Metric, declared


def check_data_dir(
    data_dir: str | None, files: Sequence[str], dataset: str, *, required: bool, fallback: str
) -> None:
    """Raise ConfigError (naming ``task.data_dir``) if a needed data folder or file is missing.

    ``required``: the study cannot run without the files; ``fallback`` says what happens
    without ``data_dir`` (e.g. "generate the data").
    """
    if data_dir is None:
        if required:
            raise ConfigError(
                "task.data_dir",
                f"this study needs the published {dataset} files but no data_dir is set",
                f"set task.data_dir to a folder holding {', '.join(files)}",
            )
        return
    missing = [f for f in files if not (Path(data_dir) / f).is_file()]
    if missing:
        raise ConfigError(
            "task.data_dir",
            f"{data_dir} lacks {', '.join(missing)}",
            f"point it at the folder with the published {dataset} files, or unset it to {fallback}",
        )


def check_files(load: Callable[[], object], dataset: str, fix: str | None = None) -> None:
    """Run ``load`` (a task's reader of its ``data_dir`` files) before Ray starts: a malformed,
    empty, non-UTF-8 or unreadable file, or one with unknown symbols, becomes a ConfigError
    naming ``task.data_dir`` (instead of failing inside a Ray worker after retries)."""
    try:
        load()
    except ConfigError:
        raise
    except DataError as exc:
        raise ConfigError(
            "task.data_dir", _clip(str(exc).split("; ")[0], 300),
            fix or f"point task.data_dir at the published {dataset} files, or unset it to generate the data",
        ) from None
    except OSError as exc:
        raise ConfigError(
            "task.data_dir", f"cannot read {exc.filename or 'a data file'} ({exc.strerror or exc})",
            "make the files readable",
        ) from None


def decode_text(path: Path, encoding: str = "utf-8") -> str:
    """A data file's text; a file that is not ``encoding`` is a DataError naming it."""
    data = Path(path).read_bytes()
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{path} is not {encoding} text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def _clip(text: str, width: int = 120) -> str:
    return text if len(text) <= width else f"{text[:width]}...({len(text)} chars)"


class Task(ABC):
    """A task: deterministic data from a seed, splits with roles, and metrics.

    Subclasses set ``name``, ``Config`` (a :class:`FrozenConfig`), ``data_kind`` and
    ``primary_metric``, and implement :meth:`build` and :meth:`score`.
    """

    name: ClassVar[str]
    Config: ClassVar[type[FrozenConfig]]
    data_kind: ClassVar[DataKind]
    primary_metric: ClassVar[str]
    """The task's headline metric: selection and the analysis default to it when the task has
    no ``accuracy``; when it is a share in [0, 1] where higher is better, an example is
    "correct" in the ``predictions`` table where its value is above 0.5."""
    metrics: ClassVar[tuple[str | Metric, ...]]
    """Every metric :meth:`score` may return (on some split). A bare name is a share in
    [0, 1] where higher is better (accuracy); any other metric is declared, e.g.
    ``Metric("mse", better="lower", high=None)`` (:mod:`trainables.metrics`): the declaration
    decides which config is better, the default direction of selection and tuning, and the
    range intervals stay in. Study files are checked against it before Ray starts; the
    contract suite checks ``score`` keeps to the names and ranges."""
    fresh_samples: ClassVar[bool] = False
    """True if training draws fresh samples each step (see :meth:`sample_train`)."""
    tiny: ClassVar[dict[str, Any]] = {}
    """Config overrides for a tiny dataset (the contract test trains every pair on it).
    A ``data_dir`` value here is a folder name under the reference data (``../shared/data``)."""
    tiny_train: ClassVar[dict[str, Any]] = {}
    """Train-config overrides that suit this task in the contract test (optimizer, batch)."""
    default_search_space: ClassVar[dict[str, dict[str, Any]] | None] = None
    """The ``tune.space`` a study file's ``tune:`` block gets when it names none: dotted
    field -> ``{low, high, log?, type?}`` (None: such a block must name its space)."""

    def __init__(self, config: FrozenConfig) -> None:
        self.config = config

    @classmethod
    def declared_metrics(cls) -> dict[str, Metric]:
        """``metrics`` as name -> :class:`Metric` (a bare name: a share in [0, 1], higher better)."""
        return declared(cls.metrics)

    @abstractmethod
    def build(self, data_seed: int) -> TaskData:
        """Generate or load every split from ``data_seed`` (deterministic)."""

    @abstractmethod
    def score(self, split: Split, predictions: Sequence[Any]) -> dict[str, np.ndarray]:
        """Per-example metric values for ``predictions`` (one per example of ``split``).

        Returns ``{metric: (N,) float array}``; the split-level metric is the mean.
        """

    def render(self, split: Split, prediction: Any, index: int | None = None) -> str:
        """A human-readable rendering of one prediction (for the ``predictions`` table).

        ``index`` is the example's position in ``split`` (for metrics that need the target)."""
        return str(prediction)

    def render_example(self, data: TaskData, split: Split, index: int) -> tuple[str, str]:
        """(input, target) of example ``index`` of ``split`` as text, for the ``predictions``
        table. The default writes token sequences with the vocabularies in ``data.meta``
        (``src_vocab``, ``tgt_vocab``), a tagging input as its symbol ids and a class label
        as its number; a task overrides it to show its examples as a reader knows them."""
        d = split.data
        if isinstance(d, SeqPairs):
            src, tgt = data.meta.get("src_vocab"), data.meta.get("tgt_vocab")
            if src is not None and tgt is not None:
                return " ".join(src.decode(d.src[index])), " ".join(tgt.decode(d.tgt[index]))
            return " ".join(map(str, d.src[index])), " ".join(map(str, d.tgt[index]))
        if isinstance(d, SeqTags):
            return _clip(" ".join(str(int(t)) for t in d.x[index])), ""
        if isinstance(d, Arrays):  # a class label, or a regress task's real target(s)
            y = np.asarray(d.y[index])
            return "", str(int(y)) if y.dtype.kind in "iu" else " ".join(f"{v:.4g}" for v in y.reshape(-1))
        return "", ""

    def sample_train(self, data: TaskData, rng: np.random.Generator, n: int) -> SplitData:
        """Fresh training samples (only for ``fresh_samples`` tasks)."""
        raise NotImplementedError(f"task {self.name} has a fixed training set")

    def analysis(self) -> dict[str, Any]:
        """What the task wants analysed and drawn, as data for the study manifest.

        Keys (all optional): ``regressions``: list of ``{x: {split, metric, transform},
        y: {split, metric}, over: "runs"|"checkpoints"}``; ``charts``: list of
        ``{type: "histogram"|"scatter"|"curve", ...}``; ``aggregates``: a paper's own
        summaries, list of ``{kind: "best_k"|"checkpoint_regression"|"baseline", ...}``
        (docs/analysis.md, "Declared aggregates"; a baseline computed from the data, such
        as a trivial predictor's score, is a metric :meth:`score` returns, since this
        declaration is written before any data is built); ``verdict``: ``{"metric"?,
        "splits"?}``, what the verdict speaks about, headline split first, a split or a
        pooled ``NAME=A+B+...`` (``analysis/verdict_axis.py``). Analysis reads this without
        importing trainables.
        """
        return {}

    def check(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Validate the config against the filesystem before any Ray work starts."""

    def rehearsable(self) -> bool:
        """Whether the driver may build this config's data (``build(0)``, twice) before Ray
        starts, to rehearse a plugin's pair on a few examples (:mod:`trainables.rehearsal`).
        Return False where a build is slow (a large dataset read from disk) or has side
        effects; the pair's contract suite is then its only check before a study."""
        return True

    def split_roles(self) -> dict[str, Role]:
        """Split name -> role, without training (default: builds the data once)."""
        return {name: split.role for name, split in self.build(0).splits.items()}
