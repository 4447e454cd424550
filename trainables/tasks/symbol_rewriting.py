"""Symbol rewriting (Weber, Shekhar & Balasubramanian 2018, "The Fine Line between
Linguistic Generalization and Failure in Seq2Seq-Attention Models").

Input: a sequence of symbols from an alphabet of 40 (``A..Z`` without ``S``, then
``AS..OS``; symbol ``i`` (1-based, in that order) has index ``i``). Output: every
occurrence of symbol ``i`` is rewritten as one token from each sub-alphabet ``A``, ``B``,
``C`` in a uniformly random order, each ``{A|B|C}{i}_{v}`` with ``v`` uniform over
``{1, 2}``, drawn independently per occurrence. Many outputs are correct, so the metric is
*validity* (the authors' accuracy), not exact match.

Splits (name, role, default size, inputs):

======== ======= ======= ==================================================================
train    train   100,000 length 5-10, no symbol repeated
val      val       2,000 as train
val_ood  val_ood   5,000 "uncharacteristic": length 3-12, consecutive runs of repeated symbols
standard test      2,000 as train
repeat   test      2,000 length 5-10, >= 1 repeated run, runs of at most 6
short    test      2,000 length 1-4, no repeats
long     test      2,000 length 11-15, no repeats
======== ======= ======= ==================================================================

Lengths are uniform over each range. How repeat and val_ood inputs are drawn (a run
process fitted to the published files) and how distinctness is kept is described in
:mod:`trainables.tasks.symbol_rewriting_data`. Every split is drawn from its own generator
(the data seed with a fixed per-split spawn key), in the order standard, repeat, short,
long, val_ood, val, train, each avoiding every input drawn before it: all splits are
pairwise disjoint (in particular nothing held out occurs in train, and val and standard
share nothing), and the held-out splits do not depend on ``train_size``. Only Short repeats
inputs, where a length has fewer inputs than its share (40 inputs of length 1).

With ``data_dir`` the five published evaluation files replace standard, repeat, short,
long and val_ood as they are (including their known ~3% defective gold outputs); train and
val are still generated, disjoint from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from pydantic import model_validator

from trainables.configbase import FrozenConfig, added_field
from trainables.data import (
    EOS,
    Role,
    SeqPairs,
    Split,
    TaskData,
    TokenRows,
    Vocab,
    padded_rows,
    row_lengths,
)
from trainables.errors import ConfigError, DataError
from trainables.registry import TASKS
from trainables.tasks.base import Task
from trainables.tasks.symbol_rewriting_data import (
    MAX_SYMBOLS,
    N_SPECIAL,
    NoRepeat,
    Runs,
    UsedKeys,
    check_published_files,
    draw_inputs,
    input_symbols,
    parse_tsv,
    rewrite,
    target_tokens,
)

PUBLISHED_FILES = {
    "standard": "grammar_std.tst.full.tsv",
    "repeat": "grammar_repeat.tst.full.tsv",
    "short": "grammar_short.tst.full.tsv",
    "long": "grammar_long.tst.full.tsv",
    "val_ood": "grammar.val.tsv",
}
"""Split name -> published file that replaces it when ``data_dir`` is given."""

SPLIT_ROLES: dict[str, Role] = {
    "train": "train",
    "val": "val",
    "val_ood": "val_ood",
    "standard": "test",
    "repeat": "test",
    "short": "test",
    "long": "test",
}
"""Every split and its role, in the order :meth:`SymbolRewriting.build` returns them."""

_SPAWN_KEY = {"standard": 1, "repeat": 2, "short": 3, "long": 4, "val_ood": 5, "val": 6, "train": 7}
"""Fixed per-split spawn keys: each split has its own generator derived from the data seed."""


END_SYMBOL = "."
"""The end-of-input symbol of the published data (``task.end_symbol``)."""

class SymbolRewritingConfig(FrozenConfig):
    """Symbol-rewriting data: alphabet, split sizes and length ranges (defaults: the paper)."""

    n_symbols: int = 40
    """Input alphabet size. The first 40 are named A..Z without S, then AS..OS; more continue
    PS..ZS, ASS..ZSS, ... (up to 250)."""
    sub_alphabets: str = "ABC"
    """Output sub-alphabet letters; each input symbol becomes one token per letter."""
    n_values: int = 2
    """Number of values ``v`` a token ``{letter}{i}_{v}`` can take (uniform, not checked)."""
    train_size: int = 100_000
    """Training examples."""
    val_size: int = 2_000
    """In-distribution validation examples (drawn like train)."""
    val_ood_size: int = 5_000
    """Uncharacteristic validation examples (with repeated runs; what tuning looks at)."""
    test_size: int = 2_000
    """Examples in each test split (standard, repeat, short, long)."""
    train_lengths: tuple[int, int] = (5, 10)
    """Input length range (min, max), inclusive, of train, val and standard."""
    val_ood_lengths: tuple[int, int] = (3, 12)
    """Input length range (min, max) of the uncharacteristic validation set."""
    repeat_lengths: tuple[int, int] = (5, 10)
    """Input length range (min, max) of the repeat test set."""
    short_lengths: tuple[int, int] = (1, 4)
    """Input length range (min, max) of the short test set."""
    long_lengths: tuple[int, int] = (11, 15)
    """Input length range (min, max) of the long test set."""
    max_run: int = 6
    """Longest run of one repeated symbol in repeat and val_ood inputs."""
    single_run_prob: float = 0.5
    """In repeat and val_ood inputs, probability that a run has length 1 (otherwise its
    length is uniform over 2..max_run); 0.5 fits the published files."""
    data_dir: str | None = None
    """Folder with the published files (grammar_std.tst.full.tsv, grammar_repeat.tst.full.tsv,
    grammar_short.tst.full.tsv, grammar_long.tst.full.tsv, grammar.val.tsv); they replace
    standard, repeat, short, long and val_ood. None: generate every split."""
    end_symbol: bool = added_field(False)
    """End every input with the symbol ``.`` (an extra source token), in generated and loaded
    data alike. Every input of the published files ends with it, and their attention column
    aligns the decoder's EOS step with it; without it the EOS step has no input of its own.
    Scoring and decoding lengths do not count it."""

    @model_validator(mode="after")
    def _check(self) -> SymbolRewritingConfig:
        _validate(self)
        return self


def _validate(c: SymbolRewritingConfig) -> None:
    """Raise ConfigError for impossible settings (checked in field order)."""

    def bad(field: str, problem: str, fix: str) -> ConfigError:
        return ConfigError(f"task.{field}", problem, fix)

    if not 1 <= c.n_symbols <= MAX_SYMBOLS:
        raise bad("n_symbols", f"{c.n_symbols} is out of range", f"use 1..{MAX_SYMBOLS}")
    letters = c.sub_alphabets
    if (
        not letters
        or not all("A" <= ch <= "Z" for ch in letters)
        or len(set(letters)) < len(letters)
    ):
        raise bad("sub_alphabets", f"{letters!r} is not a set of capital letters", 'use e.g. "ABC"')
    if c.n_values < 1:
        raise bad("n_values", f"{c.n_values} < 1", "use 1 or more (the paper uses 2)")
    for field in ("train_size", "val_size", "val_ood_size", "test_size"):
        if getattr(c, field) < 1:
            raise bad(field, f"{getattr(c, field)} < 1", "ask for at least one example")
    if c.max_run < 2:
        raise bad("max_run", f"{c.max_run} < 2", "use 2 or more (the paper uses 6)")
    if not 0.0 <= c.single_run_prob < 1.0:
        raise bad("single_run_prob", f"{c.single_run_prob} is not in [0, 1)", "use e.g. 0.5")
    no_repeat = NoRepeat(c.n_symbols)
    runs = Runs(c.n_symbols, c.max_run, c.single_run_prob)
    checks: list[tuple[str, tuple[int, int], Any, int, str]] = [
        (
            "train_lengths",
            c.train_lengths,
            no_repeat,
            c.train_size + c.val_size + c.test_size,
            "train_size + val_size + test_size",
        ),
        ("short_lengths", c.short_lengths, no_repeat, 0, ""),
        ("long_lengths", c.long_lengths, no_repeat, c.test_size, "test_size"),
        ("repeat_lengths", c.repeat_lengths, runs, c.test_size, "test_size"),
        ("val_ood_lengths", c.val_ood_lengths, runs, c.val_ood_size, "val_ood_size"),
    ]
    for field, (lo, hi), family, demand, what in checks:
        if not 1 <= lo <= hi:
            raise bad(field, f"({lo}, {hi}) is not a range 1 <= min <= max", "give (min, max)")
        if family is no_repeat and hi > c.n_symbols:
            raise bad(
                field,
                f"inputs of length {hi} cannot avoid repeating one of {c.n_symbols} symbols",
                "lower the maximum or raise task.n_symbols",
            )
        if family is runs and lo < 2:
            raise bad(field, "an input with a repeated run needs length >= 2", "use min >= 2")
        if family is runs and hi > c.n_symbols * c.max_run:
            raise bad(
                field,
                f"length {hi} needs more than {c.n_symbols} runs of at most {c.max_run}",
                "lower the maximum, or raise task.n_symbols or task.max_run",
            )
        available = 0
        for length in range(lo, hi + 1):  # stop early: counts grow very fast
            available += family.count(length)
            if available >= demand:
                break
        if demand > available:
            raise bad(
                field,
                f"{what} = {demand} distinct inputs requested but only {available} exist",
                f"lower {what} or widen the range",
            )


@dataclass(frozen=True)
class DecodeLen:
    """Greedy decoding steps per example: ``tokens_per_symbol * symbols + 1`` (incl. EOS),
    where ``symbols`` is the source length less the end symbol, if inputs carry one."""

    tokens_per_symbol: int
    end_symbol: bool = False

    def __call__(self, src_lengths: np.ndarray) -> np.ndarray:
        symbols = np.asarray(src_lengths, dtype=np.int64) - int(self.end_symbol)
        return symbols * self.tokens_per_symbol + 1


def score_rewrites(
    src: Sequence[np.ndarray],
    tgt: Sequence[np.ndarray],
    predictions: Sequence[Any],
    n_letters: int,
    n_values: int,
    n_symbols: int,
) -> dict[str, np.ndarray]:
    """Validity and exact match of predicted rewrites, ``{"accuracy", "exact"}`` each ``(N,)``.

    ``src[i]``: input ids (symbol ``j`` 0-based has id ``j + 3``); ``tgt[i]``: gold ids;
    ``predictions[i]``: generated ids of any length. A prediction is valid iff, cut at its
    first EOS (which must exist), it has exactly ``n_letters * len(src)`` tokens, none of
    them special, and for every input position ``p`` the span ``[k p, k p + k)`` carries
    the number of ``src[p]`` on every token and each letter exactly once. Values are not
    checked. ``exact``: the cut prediction equals the gold target.
    """
    n, k = len(src), n_letters
    if len(predictions) != n:
        raise ValueError(f"{len(predictions)} predictions for a split of {n} examples")
    src_len = row_lengths(src)
    need = k * src_len  # (N,) position where EOS must be
    n_spans = int(src_len.max(initial=0)) + 1
    width = k * n_spans  # >= need + 1: every column that can decide validity
    pred = padded_rows(predictions, width)  # (N, W)
    is_eos = pred == EOS
    first_eos = np.where(is_eos.any(axis=1), is_eos.argmax(axis=1), -1)  # (N,)
    length_ok = first_eos == need
    inside = np.arange(width)[None, :] < need[:, None]  # (N, W) positions before EOS
    tok = pred - N_SPECIAL  # (N, W) 0-based token index
    tok_ok = (tok >= 0) & (tok < n_symbols * k * n_values)
    tokens_ok = np.all(~inside | tok_ok, axis=1)
    tok = np.where(inside & tok_ok, tok, 0)
    number = tok // (k * n_values)  # (N, W) 0-based symbol index of each token
    letter = (tok // n_values) % k  # (N, W)
    symbols = padded_rows(src, n_spans) - N_SPECIAL  # (N, S) 0-based
    expected = np.repeat(symbols, k, axis=1)  # (N, W)
    numbers_ok = np.all(~inside | (number == expected), axis=1)
    bits = np.where(inside, np.left_shift(1, letter), 0).reshape(n, n_spans, k)  # (N, S, k)
    span_mask = np.bitwise_or.reduce(bits, axis=2)  # (N, S)
    span_inside = np.arange(n_spans)[None, :] < src_len[:, None]  # (N, S)
    letters_ok = np.all(~span_inside | (span_mask == (1 << k) - 1), axis=1)
    valid = length_ok & tokens_ok & numbers_ok & letters_ok
    gold = padded_rows(tgt, width)  # (N, W)
    gold_len = row_lengths(tgt)
    exact = (first_eos == gold_len) & np.all(~inside | (pred == gold), axis=1)
    return {"accuracy": valid.astype(np.float64), "exact": exact.astype(np.float64)}


@TASKS.register
class SymbolRewriting(Task):
    """Rewrite each input symbol into one token per sub-alphabet; scored by validity."""

    name = "symbol_rewriting"
    Config = SymbolRewritingConfig
    data_kind = "seq2seq"
    primary_metric = "accuracy"
    metrics = ("accuracy", "exact")
    tiny: ClassVar[dict[str, Any]] = {
        "n_symbols": 12, "train_size": 300, "val_size": 40, "val_ood_size": 40, "test_size": 40,
        "train_lengths": (2, 4), "val_ood_lengths": (2, 5), "repeat_lengths": (3, 5),
        "short_lengths": (1, 2), "long_lengths": (5, 6),
    }
    tiny_train: ClassVar[dict[str, Any]] = {"batch_size": 16, "max_epochs": 3}
    # Weber et al. tuned the learning rate and dropout against the uncharacteristic set
    default_search_space: ClassVar[dict[str, dict[str, Any]] | None] = {
        "train.lr": {"low": 0.01, "high": 1.0, "log": True},
        "model.dropout": {"low": 0.0, "high": 0.5},
    }

    def __init__(self, config: SymbolRewritingConfig | None = None) -> None:
        super().__init__(config or SymbolRewritingConfig())
        self.cfg: SymbolRewritingConfig = self.config  # type: ignore[assignment]
        end = [END_SYMBOL] if self.cfg.end_symbol else []
        self.src_vocab = Vocab.build(input_symbols(self.cfg.n_symbols) + end)
        self.tgt_vocab = Vocab.build(
            target_tokens(self.cfg.n_symbols, self.cfg.sub_alphabets, self.cfg.n_values)
        )

    # ---- data -------------------------------------------------------------------------

    def check(self, data_dir_required: bool = False) -> None:
        """Check ``data_dir`` and its five files: present, readable, well-formed, in this
        config's alphabets (call before any Ray work)."""
        paths = self._published_paths(data_dir_required)
        if paths:
            c = self.cfg
            check_published_files(paths, c.n_symbols, c.sub_alphabets, c.n_values)

    def split_roles(self) -> dict[str, Role]:
        """Split name -> role, without building any data."""
        return dict(SPLIT_ROLES)

    def _published_paths(self, required: bool = False) -> dict[str, Path] | None:
        expected = ", ".join(PUBLISHED_FILES.values())
        if self.cfg.data_dir is None:
            if required:
                raise ConfigError(
                    "task.data_dir",
                    "this study needs the published files",
                    f"set task.data_dir to a folder holding {expected}",
                )
            return None
        root = Path(self.cfg.data_dir).expanduser()
        if not root.is_dir():
            raise ConfigError(
                "task.data_dir",
                f"{root} is not a folder",
                f"point it at a folder holding {expected}, or remove it",
            )
        paths = {split: root / fname for split, fname in PUBLISHED_FILES.items()}
        missing = [p.name for p in paths.values() if not p.is_file()]
        if missing:
            raise ConfigError(
                "task.data_dir",
                f"{root} lacks {', '.join(missing)}",
                f"put all of {expected} there, or remove task.data_dir",
            )
        return paths

    def load_published(self, path: Path) -> SeqPairs:
        """One published TSV file as SeqPairs (ids in this task's vocabularies)."""
        src_index, tgt_index = self.src_vocab.index, self.tgt_vocab.index
        src, tgt = [], []
        for i, (symbols, tokens) in enumerate(parse_tsv(path)):
            unknown = [s for s in symbols if s not in src_index] + [
                t for t in tokens if t not in tgt_index
            ]
            if unknown or not symbols:
                raise DataError(
                    f"{path}: row {i + 1} has unknown symbols/tokens {unknown[:3]} or no input; "
                    "the published files need n_symbols >= 40, sub_alphabets containing A, B, "
                    "C and n_values >= 2"
                )
            src.append(np.array([src_index[s] for s in symbols], dtype=np.int64))
            tgt.append(np.array([tgt_index[t] for t in tokens], dtype=np.int64))
        if not src:
            raise DataError(f"{path} has no rows; use the published symbol-rewriting files")
        return SeqPairs(src=src, tgt=tgt, ids=np.arange(len(src), dtype=np.int64))

    def build(self, data_seed: int) -> TaskData:
        """Every split from ``data_seed`` (deterministic), plus the meta the model needs."""
        c = self.cfg
        no_repeat = NoRepeat(c.n_symbols)
        runs = Runs(c.n_symbols, c.max_run, c.single_run_prob)
        plan: dict[str, tuple[Any, tuple[int, int], int, str]] = {
            "standard": (no_repeat, c.train_lengths, c.test_size, "test_size"),
            "repeat": (runs, c.repeat_lengths, c.test_size, "test_size"),
            "short": (no_repeat, c.short_lengths, c.test_size, "test_size"),
            "long": (no_repeat, c.long_lengths, c.test_size, "test_size"),
            "val_ood": (runs, c.val_ood_lengths, c.val_ood_size, "val_ood_size"),
            "val": (no_repeat, c.train_lengths, c.val_size, "val_size"),
            "train": (no_repeat, c.train_lengths, c.train_size, "train_size"),
        }
        data: dict[str, SeqPairs] = {}
        used: UsedKeys = {}
        published = self._published_paths() or {}
        for split, path in published.items():
            data[split] = self.load_published(path)
            for s in data[split].src:
                used.setdefault(len(s), set()).add((s - N_SPECIAL).astype(np.uint8).tobytes())
        for split, (family, lengths, size, field) in plan.items():
            if split in data:
                continue
            rng = np.random.default_rng(
                np.random.SeedSequence(data_seed, spawn_key=(_SPAWN_KEY[split],))
            )
            blocks = draw_inputs(
                family,
                lengths,
                size,
                rng,
                used,
                allow_repeats=split == "short",
                field=f"task.{field}",
            )
            data[split] = self._pairs(blocks, rng)
        if c.end_symbol:
            data = {name: self._with_end(pairs) for name, pairs in data.items()}
        splits = {name: Split(name, role, data[name]) for name, role in SPLIT_ROLES.items()}
        meta = {
            "src_vocab": self.src_vocab,
            "tgt_vocab": self.tgt_vocab,
            "max_src_len": max(max(map(len, d.src)) for d in data.values()),
            "max_tgt_len": max(max(map(len, d.tgt)) for d in data.values()),
            "decode_len": DecodeLen(len(c.sub_alphabets), c.end_symbol),
        }
        return TaskData(splits=splits, meta=meta)

    def _with_end(self, pairs: SeqPairs) -> SeqPairs:
        """``pairs`` with the end symbol appended to every source."""
        end = np.array([self.src_vocab.index[END_SYMBOL]], dtype=np.int64)
        return SeqPairs(src=[np.concatenate([s, end]) for s in pairs.src], tgt=pairs.tgt, ids=pairs.ids)

    def _pairs(self, blocks: list[np.ndarray], rng: np.random.Generator) -> SeqPairs:
        """Per-length input blocks -> shuffled SeqPairs with gold targets."""
        src: list[np.ndarray] = []
        tgt: list[np.ndarray] = []
        for rows in blocks:  # (n_L, L)
            src.extend(rows.astype(np.int64) + N_SPECIAL)
            tgt.extend(rewrite(rows, len(self.cfg.sub_alphabets), self.cfg.n_values, rng))
        order = rng.permutation(len(src))
        return SeqPairs(
            src=[src[i] for i in order],
            tgt=[tgt[i] for i in order],
            ids=np.arange(len(src), dtype=np.int64),
        )

    # ---- metrics ----------------------------------------------------------------------

    def score(self, split: Split, predictions: Sequence[Any]) -> dict[str, np.ndarray]:
        """``{"accuracy": validity, "exact": exact match}``, each ``(N,)`` of 0/1."""
        data = split.data
        if not isinstance(data, SeqPairs):
            raise TypeError(f"split {split.name} holds {type(data).__name__}, not SeqPairs")
        src, tgt = data.rows()
        if self.cfg.end_symbol:  # validity is judged on the symbols, not the end marker
            src = TokenRows(src.tokens, src.lengths - 1)
        return score_rewrites(
            src,
            tgt,
            predictions,
            len(self.cfg.sub_alphabets),
            self.cfg.n_values,
            self.cfg.n_symbols,
        )

    def render(self, split: Split, prediction: Any, index: int | None = None) -> str:
        """The prediction's tokens up to (not including) its first EOS, space-joined."""
        tokens = self.tgt_vocab.tokens
        out = []
        for i in np.asarray(prediction, dtype=np.int64).ravel().tolist():
            if i == EOS:
                break
            out.append(tokens[i] if 0 <= i < len(tokens) else f"<unk:{i}>")
        return " ".join(out)

    def analysis(self) -> dict[str, Any]:
        """Declarations for the study manifest.

        ``test_splits``: the test splits whose seed-by-seed correlations to report, in
        report order; ``scatter``: ``[[split, metric], [split, metric]]``, the seed scatter
        the paper discusses (x: Short accuracy, y: Long accuracy); ``primary_metric``: the
        metric of the distribution charts and summaries; ``events``: when a run *learns*
        (val accuracy first reaches 0.5: validity sits at 0 for epochs, then jumps within
        one or two), read from the val curve as a time to an event.
        """
        return {
            "metric_definitions": {
                "accuracy": "validity: share of inputs whose output rewrites every symbol as one token "
                "of each sub-alphabet with the symbol's number, in any order (the paper's accuracy)",
                "exact": "share of outputs equal to the one gold rewrite (many valid rewrites exist)",
                "loss": "cross-entropy summed over the target tokens of an example",
            },
            "test_splits": ["standard", "repeat", "short", "long"],
            "scatter": [["short", "accuracy"], ["long", "accuracy"]],
            "primary_metric": self.primary_metric,
            "events": [{"name": "learns", "split": "val", "metric": "accuracy", "op": ">=", "threshold": 0.5}],
        }
