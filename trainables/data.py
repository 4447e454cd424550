"""The data containers tasks hand to models, and the names they share.

A task builds a :class:`TaskData`: named :class:`Split` s, each with a *role*:

* ``train``   - what the optimizer sees;
* ``val``     - in-distribution validation (model selection / early stopping);
* ``val_ood`` - "uncharacteristic" validation: what tuning may look at;
* ``test``    - never seen by tuning or selection.

A split's data comes in one of a few *kinds*, each a container below; a model family
declares the kind it consumes (``Model.data_kind``), and only matching (task, model)
pairs are valid:

==========  =============  ====================================================
kind        container      what it holds
==========  =============  ====================================================
seq2seq     SeqPairs       source and target token-id sequences (a Vocab each)
tagging     SeqTags        an input symbol sequence and per-step target vectors
classify    Arrays         fixed-size float inputs and integer labels
==========  =============  ====================================================

This module imports neither tasks nor models: both sides, built-in or plugin, import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

Role = Literal["train", "val", "val_ood", "test"]
ROLES: tuple[Role, ...] = ("train", "val", "val_ood", "test")
DataKind = Literal["seq2seq", "tagging", "classify", "regress"]

PAD, BOS, EOS = 0, 1, 2
SPECIALS = ("<pad>", "<s>", "</s>")


@dataclass(frozen=True)
class Vocab:
    """Token <-> id map; ids 0, 1, 2 are always ``<pad>``, ``<s>``, ``</s>``."""

    tokens: tuple[str, ...]

    @classmethod
    def build(cls, symbols: Sequence[str]) -> Vocab:
        return cls(tuple(SPECIALS) + tuple(symbols))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def index(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.tokens)}

    def encode(self, symbols: Sequence[str]) -> np.ndarray:
        idx = self.index
        return np.fromiter((idx[s] for s in symbols), dtype=np.int64, count=len(symbols))

    def decode(self, ids: Sequence[int]) -> list[str]:
        return [self.tokens[i] for i in ids]


@dataclass
class SeqPairs:
    """Kind ``seq2seq``: source and target token sequences (no BOS/EOS stored).

    ``src[i]`` and ``tgt[i]`` are int64 arrays of vocab ids; ``ids[i]`` is a stable
    example id within the split (used by the ``predictions`` table).
    """

    src: list[np.ndarray]
    tgt: list[np.ndarray]
    ids: np.ndarray
    _padded: PaddedPairs | None = field(default=None, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.src)

    def padded(self) -> PaddedPairs:
        """The split as zero-padded arrays (built on first use, then kept): a batch is
        then an index into them instead of a Python loop over its sequences."""
        if self._padded is None:
            self._padded = PaddedPairs(_pad(self.src), _pad(self.tgt))
        return self._padded

    def rows(self) -> tuple[TokenRows, TokenRows]:
        """Sources and targets as :class:`TokenRows` over the padded arrays (no copies)."""
        p = self.padded()
        return TokenRows(*p.src), TokenRows(*p.tgt)


@dataclass(frozen=True)
class PaddedPairs:
    """:class:`SeqPairs` as ``(values (N, max_len) int64 zero-padded, lengths (N,))`` pairs."""

    src: tuple[np.ndarray, np.ndarray]
    tgt: tuple[np.ndarray, np.ndarray]


def _pad(seqs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    lengths = row_lengths(seqs)
    return padded_rows(seqs, int(lengths.max(initial=0)), fill=0), lengths


class TokenRows(Sequence[np.ndarray]):
    """Generated token sequences of one member, stored padded: a ``Sequence`` whose item
    ``i`` is ``tokens[i, :lengths[i]]`` (int64, a view).

    What seq2seq models predict. Tasks may score it per item like any list of arrays, or
    whole (:meth:`padded`): at symbol rewriting's 117k evaluation examples per seed, the
    per-example arrays and re-padding took seconds of Python per member.
    """

    def __init__(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        if tokens.ndim != 2 or lengths.shape != (tokens.shape[0],):
            raise ValueError(f"tokens (N, W) and lengths (N,) expected, got {tokens.shape}, {lengths.shape}")
        if len(lengths) and (lengths.min() < 0 or lengths.max() > tokens.shape[1]):
            raise ValueError(f"lengths must lie in [0, {tokens.shape[1]}]")
        self.tokens = tokens
        self.lengths = lengths.astype(np.int64, copy=False)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:  # type: ignore[override]
        return self.tokens[i, : self.lengths[i]]

    def padded(self, width: int, fill: int = -1) -> np.ndarray:
        """``(N, width)`` int64: each row cut to ``width``, ``fill`` beyond its length."""
        w = min(width, self.tokens.shape[1])
        out = np.full((len(self), width), fill, dtype=np.int64)
        out[:, :w] = np.where(np.arange(w) < self.lengths[:, None], self.tokens[:, :w], fill)
        return out

    @staticmethod
    def assemble(n: int, parts: Sequence[tuple[np.ndarray, TokenRows]]) -> TokenRows:
        """Rows ``(index, rows)`` of a split's chunks put back in the split's order (``n`` rows,
        every index exactly once)."""
        width = max((r.tokens.shape[1] for _, r in parts), default=0)
        tokens = np.zeros((n, width), dtype=np.int64)
        lengths = np.full(n, -1, dtype=np.int64)
        for index, rows in parts:
            tokens[index, : rows.tokens.shape[1]] = rows.tokens
            lengths[index] = rows.lengths
        if (lengths < 0).any():
            raise ValueError("TokenRows.assemble: some rows of the split were not given")
        return TokenRows(tokens, lengths)


def row_lengths(rows: Sequence[Any]) -> np.ndarray:
    """Lengths of variable-length rows, ``(N,)`` int64 (no loop for :class:`TokenRows`)."""
    if isinstance(rows, TokenRows):
        return rows.lengths
    return np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))


def padded_rows(rows: Sequence[Any], width: int, fill: int = -1) -> np.ndarray:
    """Right-pad (or cut) variable-length int rows into ``(N, width)`` int64 (vectorised for
    :class:`TokenRows`)."""
    if isinstance(rows, TokenRows):
        return rows.padded(width, fill)
    lens = np.fromiter((min(len(r), width) for r in rows), dtype=np.int64, count=len(rows))
    out = np.full((len(rows), width), fill, dtype=np.int64)
    if lens.sum():
        flat = np.concatenate([np.asarray(r, dtype=np.int64).ravel()[:width] for r in rows])
        row = np.repeat(np.arange(len(rows)), lens)
        col = np.arange(len(flat)) - np.repeat(np.cumsum(lens) - lens, lens)
        out[row, col] = flat
    return out


@dataclass
class SeqTags:
    """Kind ``tagging``: per-time-step targets for an input sequence.

    ``x[i]``: (T_i,) int64 input symbol ids (no specials); ``y[i]``: (T_i, D) float32
    per-step targets.
    """

    x: list[np.ndarray]
    y: list[np.ndarray]
    ids: np.ndarray

    def __len__(self) -> int:
        return len(self.x)


@dataclass
class Arrays:
    """Kinds ``classify`` and ``regress``: fixed-size inputs and their labels. ``x``: (N, ...)
    float32; ``y``: (N,) int64 class indices (classify), or (N,) / (N, d) float32 real targets
    (regress)."""

    x: np.ndarray
    y: np.ndarray
    ids: np.ndarray

    def __len__(self) -> int:
        return len(self.y)


SplitData = SeqPairs | SeqTags | Arrays


def head(data: SplitData, n: int) -> SplitData:
    """The first ``n`` examples of ``data``, in the same container (ids kept)."""
    if isinstance(data, Arrays):
        return Arrays(x=data.x[:n], y=data.y[:n], ids=data.ids[:n])
    if isinstance(data, SeqPairs):
        return SeqPairs(src=list(data.src[:n]), tgt=list(data.tgt[:n]), ids=data.ids[:n])
    return SeqTags(x=list(data.x[:n]), y=list(data.y[:n]), ids=data.ids[:n])


@dataclass
class Split:
    """One named split of a task's data, with its role."""

    name: str
    role: Role
    data: SplitData

    def __len__(self) -> int:
        return len(self.data)


@dataclass
class TaskData:
    """Everything a task built from one data seed.

    ``meta`` carries what a model needs to size itself (vocab sizes, input dims,
    maximum lengths); see each kind's model family for the keys it reads.
    """

    splits: dict[str, Split]
    meta: dict[str, Any] = field(default_factory=dict)

    def by_role(self, role: Role) -> list[Split]:
        return [s for s in self.splits.values() if s.role == role]

    @property
    def train(self) -> Split:
        (train,) = self.by_role("train")
        return train
