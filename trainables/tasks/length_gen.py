"""Length generalization on algorithmic tasks (Zhou et al. 2023, "What Algorithms can
Transformers Learn? A Study in Length Generalization", arXiv:2310.16028).

One task, ``length_gen``, whose ``kind`` picks one of the paper's seven tasks: ``count``,
``sort``, ``copy_unique``, ``mode`` (short RASP-L programs: the paper's Transformers
length-generalize) and ``copy_repeat``, ``parity``, ``addition`` (none in the standard
format: they do not), with the paper's index-hint and scratchpad formats as options. Formats
and what "length" counts per kind: :mod:`trainables.tasks.length_gen_data`.

Splits (``N`` = ``train_lengths[1]``; lengths uniform over each range):

============  =======  ======================================================================
train         train    ``train_size`` examples at lengths ``train_lengths`` (up to N)
val           val      ``val_size`` examples drawn like train (in-distribution)
val_ood       val_ood  ``val_ood_size`` examples a little longer (``val_ood_lengths``, default
                       N+1 .. 1.25 N): what tuning may look at
len_<L>       test     ``test_size`` examples of length exactly L, one split per L in
                       ``test_lengths`` (default: the shortest training length .. 2N)
============  =======  ======================================================================

**Why one test split per length** (not one split with a metric per length): the model's
metrics (the transformer's ``oracle_exact``) are per split too, so exact match per length
holds for free-running and oracle-length decoding alike, the ``evals`` table (split x metric)
holds both, and a run's ``predictions`` rows keep their length in the split name.

Every split comes from its own generator (the data seed with a fixed per-split spawn key),
so held-out splits do not depend on ``train_size``. Test lengths above N cannot meet a
training example; at short lengths the space of inputs is small and in-distribution splits
repeat training examples (as the paper's sampled data does). With ``random_start`` every
split's sources start after a random number of filler tokens (see the field), so a model
with learned positions meets no position at test time that training never reached.

**Metrics** (per example; the prediction is cut at its first ``</s>``, or taken whole):
``exact`` (the answer, every token and its length), ``length_correct`` (as many tokens as the
answer), ``token_accuracy`` (share of answer positions predicted right). The transformer adds
``oracle_exact``: greedy generation of exactly the answer's length (``</s>`` ruled out), the
paper's "oracle length" (a seq2seq model without it gives no oracle numbers).

**Length generalization** (declared for analysis, aggregate ``length_generalization`` in
:mod:`analysis.length_gen`): a run length-generalizes when its exact match over the test
lengths ``generalization_band`` x N (default 1.5 N .. 2 N, the mean over those ``len_<L>``
splits: equal sizes, so the pooled exact match) is at least ``generalization_level`` (0.9);
the report gives the fraction of seeds that do, with a Wilson interval, free-running and
with the oracle length, and draws exact match by length. The declaration is made from the
study's last grid point: points of one study should share ``train_lengths`` and
``test_lengths`` (a grid over ``kind`` does).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from trainables.configbase import FrozenConfig
from trainables.data import (
    EOS,
    SPECIALS,
    Role,
    SeqPairs,
    Split,
    TaskData,
    Vocab,
    padded_rows,
    row_lengths,
)
from trainables.errors import ConfigError
from trainables.registry import TASKS
from trainables.tasks.base import Task
from trainables.tasks.length_gen_data import KINDS, Kind

KindName = Literal["count", "sort", "copy_unique", "mode", "copy_repeat", "parity", "addition"]

_SPAWN_KEY = {"train": 1, "val": 2, "val_ood": 3}
"""Per-split spawn keys of the data seed's generators (``len_<L>``: 1000 + L)."""

FILLER = "_"
"""The source token before an example that starts late (``random_start``)."""


def length_split(length: int) -> str:
    """The name of the test split of length ``length``: ``len_<L>``."""
    return f"len_{length}"


class LengthGenConfig(FrozenConfig):
    """A length-generalization task (defaults: count, trained up to length 20, tested to 40)."""

    kind: KindName = "count"
    """The task: count, sort, copy_unique, mode (short RASP-L programs), copy_repeat, parity,
    addition (none); formats in trainables/tasks/length_gen_data.py."""
    n_symbols: int | None = Field(None, ge=1)
    """How many numbers inputs draw from (count, sort, copy_unique, mode, copy_repeat). None:
    the kind's default (count, sort, copy_unique 100; mode 10; copy_repeat 4). Parity and
    addition have fixed alphabets (bits, digits) and refuse it."""
    train_lengths: tuple[int, int] = (1, 20)
    """Lengths (min, max = N) of train and val, inclusive."""
    val_ood_lengths: tuple[int, int] | None = None
    """Lengths (min, max) of val_ood; None: N+1 .. max(N+1, floor(1.25 N))."""
    test_lengths: tuple[int, int] | None = None
    """Lengths (min, max) of the ``len_<L>`` test splits, one per length; None: train min .. 2N."""
    train_size: int = Field(20_000, ge=1)
    """Training examples."""
    val_size: int = Field(500, ge=1)
    """In-distribution validation examples."""
    val_ood_size: int = Field(500, ge=1)
    """Examples of val_ood."""
    test_size: int = Field(100, ge=1)
    """Examples in each ``len_<L>`` test split."""
    index_hints: bool = False
    """Addition and parity: precede every digit (bit) and answer digit with a hint token naming
    its position (Zhou et al.'s index hints)."""
    hint_offsets: bool = True
    """With index hints: each example's first hint drawn at random, so every hint token occurs
    in training; false: hints start at h0 (as the authors' RASP-L code writes them)."""
    scratchpad: bool = False
    """Parity: answer with the running parity after each bit (the last is the parity)."""
    reverse_output: bool = False
    """Addition: the sum least significant digit first."""
    random_start: int = Field(0, ge=0)
    """Sources start after 0 .. k filler tokens ``_`` (uniform per example), as if the example
    sat at a random place of a longer context: k = random_start, or less for an example longer
    than the longest training one, so that it ends within the positions training examples reach
    (k = random_start - (its tokens - the tokens of a length-N example), at least 0). The
    authors' examples sit at varying places of a context packed with examples, so every
    position embedding is trained; this gives a one-example-per-row model (learned positions)
    the same, in every split alike. 0: no filler."""
    generalization_level: float = Field(0.9, gt=0, le=1)
    """A run length-generalizes when its exact match over the band's test lengths is at least this."""
    generalization_band: tuple[float, float] = (1.5, 2.0)
    """The test lengths that decide it, as multiples of N (inclusive; default 1.5 N .. 2 N)."""

    @property
    def generator(self) -> Kind:
        return KINDS[self.kind]

    @property
    def ood_lengths(self) -> tuple[int, int]:
        n = self.train_lengths[1]
        return self.val_ood_lengths or (n + 1, max(n + 1, math.floor(1.25 * n)))

    @property
    def test_range(self) -> tuple[int, int]:
        return self.test_lengths or (self.train_lengths[0], 2 * self.train_lengths[1])

    @property
    def band_lengths(self) -> list[int]:
        """The test lengths whose exact match decides length generalization."""
        n, (lo, hi) = self.train_lengths[1], self.generalization_band
        return list(range(math.ceil(lo * n - 1e-9), math.floor(hi * n + 1e-9) + 1))

    @property
    def longest(self) -> int:
        return max(self.train_lengths[1], self.ood_lengths[1], self.test_range[1])

    @property
    def n_hints(self) -> int:
        """Hint tokens: as many as the longest example of any split has positions."""
        return self.generator.positions(self.longest) if self.index_hints else 0

    @model_validator(mode="after")
    def _check(self) -> LengthGenConfig:
        for field, rng in (("train_lengths", self.train_lengths), ("val_ood_lengths", self.val_ood_lengths),
                           ("test_lengths", self.test_lengths)):  # fmt: skip
            if rng is not None and not 1 <= rng[0] <= rng[1]:
                raise ConfigError(f"task.{field}", f"{tuple(rng)} is not a range 1 <= min <= max", "give (min, max)")
        lo, hi = self.generalization_band
        if not 0 < lo <= hi:
            raise ConfigError("task.generalization_band", f"({lo}, {hi}) is not a range 0 < min <= max",
                              "give multiples of N, e.g. [1.5, 2.0]")  # fmt: skip
        band, (t_lo, t_hi) = self.band_lengths, self.test_range
        if not band or band[0] < t_lo or band[-1] > t_hi:
            have = f"{band[0]}..{band[-1]}" if band else "no length"
            raise ConfigError(
                "task.test_lengths", f"the generalization band {lo:g}N..{hi:g}N ({have}) is not inside the "
                f"test lengths {t_lo}..{t_hi}", "widen task.test_lengths or change task.generalization_band",
            )  # fmt: skip
        gen = self.generator
        for field in ("index_hints", "scratchpad", "reverse_output"):
            if getattr(self, field) and field not in gen.options:
                takes = [k for k, g in KINDS.items() if field in g.options]
                raise ConfigError(f"task.{field}", f"kind {self.kind} has no such format option",
                                  f"remove it, or use a kind that takes it ({', '.join(takes)})")  # fmt: skip
        gen.check(self, self.longest)
        return self


@TASKS.register
class LengthGen(Task):
    """Zhou et al. (2023)'s length-generalization tasks (see the module docstring)."""

    name: ClassVar[str] = "length_gen"
    Config: ClassVar[type[FrozenConfig]] = LengthGenConfig
    data_kind = "seq2seq"
    primary_metric: ClassVar[str] = "exact"
    metrics: ClassVar[tuple[str, ...]] = ("exact", "length_correct", "token_accuracy")
    tiny: ClassVar[dict[str, Any]] = {
        "kind": "addition", "index_hints": True, "train_lengths": (1, 2), "test_lengths": (1, 4),
        "train_size": 64, "val_size": 8, "val_ood_size": 8, "test_size": 6,
    }  # fmt: skip
    """Addition with index hints: the longest format (hints in and out)."""
    tiny_train: ClassVar[dict[str, Any]] = {"batch_size": 16, "selection": {"metric": "exact"}}

    config: LengthGenConfig

    def __init__(self, config: FrozenConfig) -> None:
        super().__init__(config)
        cfg, gen = self.config, self.config.generator
        self.src_vocab = Vocab.build([*gen.src_symbols(cfg, cfg.n_hints), *([FILLER] if cfg.random_start else [])])
        self.tgt_vocab = Vocab.build(gen.tgt_symbols(cfg, cfg.n_hints))

    # ---- data -------------------------------------------------------------------------

    def split_roles(self) -> dict[str, Role]:
        lo, hi = self.config.test_range
        return {"train": "train", "val": "val", "val_ood": "val_ood",
                **{length_split(n): "test" for n in range(lo, hi + 1)}}  # fmt: skip

    def draw(self, rng: np.random.Generator, lengths: np.ndarray) -> SeqPairs:
        """One example per entry of ``lengths``, in that order (vocabulary ids), each source
        after its filler tokens (:meth:`starts`)."""
        cfg, off = self.config, len(SPECIALS)
        src: list[np.ndarray] = [np.empty(0, np.int64)] * len(lengths)
        tgt: list[np.ndarray] = [np.empty(0, np.int64)] * len(lengths)
        for length in np.unique(lengths):
            where = np.flatnonzero(lengths == length)
            d = cfg.generator.draw(rng, int(length), len(where), cfg, cfg.n_hints)
            for i, s, t in zip(where, d.src + off, d.tgt + off, strict=True):
                src[i], tgt[i] = s, t
        if cfg.random_start:
            filler = self.src_vocab.index[FILLER]
            starts = rng.integers(0, self.starts(lengths) + 1)
            src = [np.concatenate([np.full(k, filler, dtype=np.int64), s]) for k, s in zip(starts, src, strict=True)]
        return SeqPairs(src=src, tgt=tgt, ids=np.arange(len(lengths), dtype=np.int64))

    def tokens(self, length: int) -> int:
        """Source plus target tokens of an example of ``length`` (the same for every example)."""
        d = self.config.generator.draw(np.random.default_rng(0), length, 1, self.config, self.config.n_hints)
        return int(d.src.shape[1] + d.tgt.shape[1])

    def starts(self, lengths: np.ndarray) -> np.ndarray:
        """The most filler tokens before each example of ``lengths`` (see ``random_start``)."""
        cfg = self.config
        top = cfg.random_start + self.tokens(cfg.train_lengths[1])
        most = {int(n): min(cfg.random_start, max(0, top - self.tokens(int(n)))) for n in np.unique(lengths)}
        return np.array([most[int(n)] for n in lengths], dtype=np.int64)

    def _split(self, data_seed: int, name: str, lengths: tuple[int, int], size: int) -> SeqPairs:
        key = _SPAWN_KEY.get(name, 1000 + lengths[0])
        rng = np.random.default_rng(np.random.SeedSequence(data_seed, spawn_key=(key,)))
        lo, hi = lengths
        drawn = np.full(size, lo) if name not in _SPAWN_KEY else rng.integers(lo, hi + 1, size)
        return self.draw(rng, drawn)

    def build(self, data_seed: int) -> TaskData:
        cfg = self.config
        sources = {
            "train": (cfg.train_lengths, cfg.train_size), "val": (cfg.train_lengths, cfg.val_size),
            "val_ood": (cfg.ood_lengths, cfg.val_ood_size),
        }  # fmt: skip
        pairs = {name: self._split(data_seed, name, rng, size) for name, (rng, size) in sources.items()}
        lo, hi = cfg.test_range
        for n in range(lo, hi + 1):
            pairs[length_split(n)] = self._split(data_seed, length_split(n), (n, n), cfg.test_size)
        roles = self.split_roles()
        meta = {
            "src_vocab": self.src_vocab, "tgt_vocab": self.tgt_vocab,
            "max_src_len": max(int(row_lengths(p.src).max()) for p in pairs.values()),
            "max_tgt_len": max(int(row_lengths(p.tgt).max()) for p in pairs.values()),
        }  # fmt: skip
        return TaskData({name: Split(name, roles[name], p) for name, p in pairs.items()}, meta)

    # ---- metrics ----------------------------------------------------------------------

    def score(self, split: Split, predictions: Sequence[Any]) -> dict[str, np.ndarray]:
        """``exact``, ``length_correct``, ``token_accuracy`` per example (module docstring)."""
        data = split.data
        if not isinstance(data, SeqPairs):
            raise TypeError(f"split {split.name} holds {type(data).__name__}, not SeqPairs")
        if len(predictions) != len(data):
            raise ValueError(f"{len(predictions)} predictions for a split of {len(data)} examples")
        return score_answers(data.tgt, predictions)

    def render(self, split: Split, prediction: Any, index: int | None = None) -> str:
        """The predicted tokens up to (not including) the first ``</s>``, space-joined."""
        tokens, out = self.tgt_vocab.tokens, []
        for t in np.asarray(prediction, dtype=np.int64).ravel().tolist():
            if t == EOS:
                break
            out.append(tokens[t] if 0 <= t < len(tokens) else "?")
        return " ".join(out)

    def analysis(self) -> dict[str, Any]:
        """Exact match by length and the fraction of seeds that length-generalize (free-running
        and oracle length), declared as the ``length_generalization`` aggregate."""
        cfg = self.config
        lo, hi = cfg.test_range
        n, band = cfg.train_lengths[1], cfg.band_lengths
        lengths = {length_split(m): m for m in range(lo, hi + 1)}
        shown = list(dict.fromkeys(length_split(m) for m in (min(n, hi), band[0], band[-1])))
        band_splits = [length_split(m) for m in band]
        # the verdict speaks about the band value that decides whether a run length-generalizes
        band_mean = (f"{band_splits[0]}..{band_splits[-1]}=" + "+".join(band_splits)
                     if len(band_splits) > 1 else band_splits[0])  # fmt: skip
        return {
            "metric_definitions": {
                "exact": "share of examples whose free-running greedy answer (up to its first </s>) is "
                "the target: every token and the length",
                "oracle_exact": "the same with the answer's length given: greedy generation of exactly the "
                "target's length, </s> ruled out (Zhou et al.'s oracle length)",
                "length_correct": "share of free-running answers with the target's length",
                "token_accuracy": "share of target positions the free-running answer gets right",
                "loss": "teacher-forced cross-entropy summed over an example's answer tokens",
            },
            "primary_metric": "exact",
            "test_splits": shown,
            "verdict": {"splits": list(dict.fromkeys([band_mean, band_splits[0], band_splits[-1]]))},
            "scatter": [["val_ood", "exact"], [length_split(band[-1]), "exact"]],
            "aggregates": [{
                "kind": "length_generalization", "metric": "exact", "oracle_metric": "oracle_exact",
                "lengths": lengths, "band": band_splits, "train_max": n,
                "level": cfg.generalization_level, "band_examples": cfg.test_size * len(band),
            }],
            "events": [{"name": "fits", "split": "val", "metric": "exact", "op": ">=",
                        "threshold": cfg.generalization_level}],
        }  # fmt: skip


def score_answers(tgt: Sequence[np.ndarray], predictions: Sequence[Any]) -> dict[str, np.ndarray]:
    """Per-example ``exact``, ``length_correct`` and ``token_accuracy`` (each (N,) float) of
    predicted answers (any length; cut at the first ``</s>``, else taken whole) against the
    gold answers ``tgt`` (no ``</s>``)."""
    gold_len = row_lengths(tgt)
    width = int(gold_len.max(initial=0)) + 1
    pred = padded_rows(predictions, width)  # (N, W), -1 beyond a prediction
    is_eos = pred == EOS
    cut = np.where(is_eos.any(axis=1), is_eos.argmax(axis=1), np.minimum(row_lengths(predictions), width))
    cols = np.arange(width)[None, :]
    inside = cols < gold_len[:, None]
    hit = (pred == padded_rows(tgt, width)) & inside & (cols < cut[:, None])
    length_ok = cut == gold_len
    return {
        "exact": (length_ok & (hit.sum(axis=1) == gold_len)).astype(np.float64),
        "length_correct": length_ok.astype(np.float64),
        "token_accuracy": hit.sum(axis=1) / np.maximum(gold_len, 1),
    }
