"""The generators of the length-generalization tasks (:mod:`trainables.tasks.length_gen`).

Zhou et al. (2023), "What Algorithms can Transformers Learn? A Study in Length
Generalization" (arXiv:2310.16028), train decoder-only Transformers on seven algorithmic
tasks at lengths up to N and test them at longer lengths. Four have short RASP-L programs
(and length-generalize in the paper): ``count``, ``sort``, ``copy_unique``, ``mode``; three
have none in their standard format (and do not): ``copy_repeat``, ``parity``, ``addition``.

Each task is a :class:`Kind` in the registry :data:`KINDS` (no dispatch on names): it names
its source and target symbols and draws ``n`` examples of one length ``L`` at once, as
0-based indices into those symbol lists (the task adds the vocabularies' special ids). What
``L`` counts, per kind (one example each, ``L`` = 3):

=============  ======================================  ===========================  ===========
kind           source                                  target                       length L
=============  ======================================  ===========================  ===========
count          ``a b`` (two numbers, ``b = a + L-1``)  ``a a+1 .. b``               answer tokens
sort           L distinct numbers, e.g. ``7 2 5``      ``2 5 7``                    input tokens
copy_unique    L distinct numbers                      the same                     input tokens
mode           L numbers with one most frequent        that number (one token)      input tokens
copy_repeat    L numbers, drawn with replacement       the same                     input tokens
parity         L bits, e.g. ``1 0 1``                  ``0`` (their sum mod 2)      input bits
addition       ``0 4 7 + 0 9 5`` (L-digit operands     ``1 4 2`` (L+1 digits)       operand digits
               written with L+1 digits)
=============  ======================================  ===========================  ===========

Formats that the paper uses to make the hard tasks length-generalize, as options:

* **Index hints** (``index_hints``; addition and parity): every operand digit (parity: every
  bit) is preceded by a hint token naming its position, ``h3 0 h4 4 h5 7 + h3 0 h4 9 h5 5``,
  and so is every answer digit: ``h3 1 h4 4 h5 2`` (reversed: ``h5 2 h4 4 h3 1``). The
  layout is the one of the authors' RASP-L code (github.com/apple/ml-np-rasp,
  ``examples/add.py`` / ``test_add.py``: hint, digit pairs; both operands padded to the
  answer's L+1 digits and given the same hints). The first hint of an example is drawn at
  random (``hint_offsets``) from ``h0 .. h{H - positions}``, where H hint tokens cover the
  longest example of any split, so every hint token occurs in training; without it hints
  start at ``h0`` and longer test examples meet hint tokens never trained.
* **Scratchpad** (``scratchpad``; parity): the answer is the running parity after each bit,
  the last one the parity itself (with index hints, each preceded by its bit's hint).
* **Reversed output** (``reverse_output``; addition): the sum least significant digit first.

Every draw is vectorised numpy from the generator it is given; the test suite checks each
kind against a plain-Python reference implementation over many examples.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from trainables.errors import ConfigError


class KindConfig(Protocol):
    """The fields of :class:`~trainables.tasks.length_gen.LengthGenConfig` a kind reads."""

    @property
    def n_symbols(self) -> int | None: ...
    @property
    def index_hints(self) -> bool: ...
    @property
    def hint_offsets(self) -> bool: ...
    @property
    def scratchpad(self) -> bool: ...
    @property
    def reverse_output(self) -> bool: ...


@dataclass(frozen=True)
class Drawn:
    """``n`` examples of one length: source and target as 0-based symbol indices."""

    src: np.ndarray
    """(n, S) int64 indices into the kind's :meth:`Kind.src_symbols`."""
    tgt: np.ndarray
    """(n, T) int64 indices into the kind's :meth:`Kind.tgt_symbols`."""


def hint_symbols(n_hints: int) -> list[str]:
    """The index-hint tokens ``h0 .. h{n_hints - 1}``."""
    return [f"h{i}" for i in range(n_hints)]


def interleave(hints: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(n, P) hint indices and (n, P) values -> (n, 2P): hint, value, hint, value, ..."""
    out = np.empty((values.shape[0], 2 * values.shape[1]), dtype=np.int64)
    out[:, 0::2], out[:, 1::2] = hints, values
    return out


def distinct_rows(rng: np.random.Generator, n: int, length: int, n_symbols: int) -> np.ndarray:
    """(n, length) rows of distinct symbols, each row uniform over ordered draws without
    replacement (the first ``length`` of a random permutation of ``0 .. n_symbols - 1``)."""
    return np.argsort(rng.random((n, n_symbols)), axis=1)[:, :length].astype(np.int64)


class Kind(ABC):
    """One task of the family: its symbols and how it draws examples of a length."""

    name: ClassVar[str]
    rasp_l: ClassVar[bool]
    """Zhou et al.: the task has a short RASP-L program in its standard format."""
    options: ClassVar[tuple[str, ...]] = ()
    """The format options (config fields) this kind accepts besides the shared ones."""
    default_symbols: ClassVar[int | None] = None
    """``n_symbols`` when the config leaves it unset (None: the kind has a fixed alphabet)."""

    def symbols(self, cfg: KindConfig) -> int:
        """How many numbers the kind draws from (fixed-alphabet kinds: their alphabet)."""
        return int(cfg.n_symbols if cfg.n_symbols is not None else self.default_symbols or 0)

    @abstractmethod
    def src_symbols(self, cfg: KindConfig, n_hints: int) -> list[str]:
        """Source symbols, in index order."""

    @abstractmethod
    def tgt_symbols(self, cfg: KindConfig, n_hints: int) -> list[str]:
        """Target symbols, in index order."""

    @abstractmethod
    def draw(self, rng: np.random.Generator, length: int, n: int, cfg: KindConfig, n_hints: int) -> Drawn:
        """``n`` examples of length ``length`` (deterministic in ``rng``)."""

    def positions(self, length: int) -> int:
        """Hint positions an example of ``length`` needs (0: the kind takes no hints)."""
        return 0

    def check(self, cfg: KindConfig, longest: int) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Raise ConfigError if ``cfg`` cannot make examples up to length ``longest``."""


def _refuse_fixed_alphabet(kind: Kind, cfg: KindConfig) -> None:
    if cfg.n_symbols is not None:
        raise ConfigError(
            "task.n_symbols", f"kind {kind.name} has a fixed alphabet, so n_symbols {cfg.n_symbols} means nothing",
            "remove task.n_symbols",
        )  # fmt: skip


KINDS: dict[str, Kind] = {}
"""Every kind by the name the config's ``kind`` gives."""


def register(cls: type[Kind]) -> type[Kind]:
    """Class decorator: add a kind (one instance) to :data:`KINDS`."""
    KINDS[cls.name] = cls()
    return cls


class _Numbers(Kind):
    """Kinds over the numbers ``0 .. n_symbols - 1`` (the same symbols in and out)."""

    def src_symbols(self, cfg: KindConfig, n_hints: int) -> list[str]:
        return [str(i) for i in range(self.symbols(cfg))]

    def tgt_symbols(self, cfg: KindConfig, n_hints: int) -> list[str]:
        return self.src_symbols(cfg, n_hints)


class _Distinct(_Numbers):
    """Inputs of distinct numbers: ``n_symbols`` must cover the longest input."""

    def check(self, cfg: KindConfig, longest: int) -> None:
        if self.symbols(cfg) < longest:
            raise ConfigError(
                "task.n_symbols", f"{self.name} inputs of length {longest} need {longest} distinct numbers, "
                f"but there are {self.symbols(cfg)}", f"set task.n_symbols to at least {longest}",
            )  # fmt: skip


@register
class Count(_Numbers):
    """``a b`` -> ``a a+1 .. b``; ``a`` uniform over the starts that keep ``b`` a number."""

    name = "count"
    rasp_l = True
    default_symbols = 100

    def check(self, cfg: KindConfig, longest: int) -> None:
        if self.symbols(cfg) < longest:
            raise ConfigError(
                "task.n_symbols", f"counting {longest} numbers needs at least {longest}, there are "
                f"{self.symbols(cfg)}", f"set task.n_symbols well above {longest} (several starts per length)",
            )  # fmt: skip

    def draw(self, rng: np.random.Generator, length: int, n: int, cfg: KindConfig, n_hints: int) -> Drawn:
        start = rng.integers(0, self.symbols(cfg) - length + 1, n)
        return Drawn(np.stack([start, start + length - 1], axis=1), start[:, None] + np.arange(length))


@register
class Sort(_Distinct):
    """L distinct numbers -> the same numbers ascending (Zhou et al. sort unique tokens)."""

    name = "sort"
    rasp_l = True
    default_symbols = 100

    def draw(self, rng: np.random.Generator, length: int, n: int, cfg: KindConfig, n_hints: int) -> Drawn:
        src = distinct_rows(rng, n, length, self.symbols(cfg))
        return Drawn(src, np.sort(src, axis=1))


@register
class CopyUnique(_Distinct):
    """L distinct numbers -> the same sequence."""

    name = "copy_unique"
    rasp_l = True
    default_symbols = 100

    def draw(self, rng: np.random.Generator, length: int, n: int, cfg: KindConfig, n_hints: int) -> Drawn:
        src = distinct_rows(rng, n, length, self.symbols(cfg))
        return Drawn(src, src.copy())


@register
class CopyRepeat(_Numbers):
    """L numbers drawn uniformly with replacement -> the same sequence (with few symbols,
    repeats are the rule: an induction head cannot tell which occurrence comes next)."""

    name = "copy_repeat"
    rasp_l = False
    default_symbols = 4

    def draw(self, rng: np.random.Generator, length: int, n: int, cfg: KindConfig, n_hints: int) -> Drawn:
        src = rng.integers(0, self.symbols(cfg), (n, length))
        return Drawn(src, src.copy())


@register
class Mode(_Numbers):
    """L numbers with a unique most frequent one -> that number. Inputs are uniform over the
    sequences whose mode is unique (rejection sampling), so no tie rule is needed."""

    name = "mode"
    rasp_l = True
    default_symbols = 10

    def draw(self, rng: np.random.Generator, length: int, n: int, cfg: KindConfig, n_hints: int) -> Drawn:
        v = self.symbols(cfg)
        kept: list[np.ndarray] = []
        have = 0
        while have < n:
            batch = rng.integers(0, v, (max(64, 2 * (n - have)), length))
            counts = np.zeros((len(batch), v), dtype=np.int64)
            np.add.at(counts, (np.repeat(np.arange(len(batch)), length), batch.ravel()), 1)
            top = counts.max(axis=1)
            unique = (counts == top[:, None]).sum(axis=1) == 1
            kept.append(batch[unique])
            have += int(unique.sum())
        src = np.concatenate(kept)[:n]
        counts = np.zeros((n, v), dtype=np.int64)
        np.add.at(counts, (np.repeat(np.arange(n), length), src.ravel()), 1)
        return Drawn(src, counts.argmax(axis=1)[:, None])

    def check(self, cfg: KindConfig, longest: int) -> None:
        if self.symbols(cfg) < 2:
            raise ConfigError("task.n_symbols", f"mode over {self.symbols(cfg)} symbol is trivial", "use 2 or more")


class _Hinted(Kind):
    """Fixed-alphabet kinds that take index hints (see the module docstring)."""

    def hints(self, rng: np.random.Generator, length: int, n: int, cfg: KindConfig, n_hints: int) -> np.ndarray:
        """(n, positions) hint indices: consecutive, from a random (or zero) first hint."""
        p = self.positions(length)
        first = rng.integers(0, n_hints - p + 1, n) if cfg.hint_offsets else np.zeros(n, dtype=np.int64)
        return first[:, None] + np.arange(p)


@register
class Parity(_Hinted):
    """L bits -> their parity; options: index hints, a running-parity scratchpad."""

    name = "parity"
    rasp_l = False
    options = ("index_hints", "scratchpad")

    def positions(self, length: int) -> int:
        return length

    def check(self, cfg: KindConfig, longest: int) -> None:
        _refuse_fixed_alphabet(self, cfg)

    def src_symbols(self, cfg: KindConfig, n_hints: int) -> list[str]:
        return ["0", "1", *(hint_symbols(n_hints) if cfg.index_hints else [])]

    def tgt_symbols(self, cfg: KindConfig, n_hints: int) -> list[str]:
        return self.src_symbols(cfg, n_hints)

    def draw(self, rng: np.random.Generator, length: int, n: int, cfg: KindConfig, n_hints: int) -> Drawn:
        bits = rng.integers(0, 2, (n, length))
        running = np.cumsum(bits, axis=1) % 2
        if not cfg.index_hints:
            return Drawn(bits, running if cfg.scratchpad else running[:, -1:])
        hints = self.hints(rng, length, n, cfg, n_hints) + 2  # hint symbols follow the bits
        tgt = interleave(hints, running) if cfg.scratchpad else running[:, -1:]
        return Drawn(interleave(hints, bits), tgt)


def add_digits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(n, P) + (n, P) digit rows (most significant first, P >= 1) -> (n, P) digits of the
    sum mod 10^P (the carry out of the first column is dropped)."""
    out = np.empty_like(a)
    carry = np.zeros(len(a), dtype=np.int64)
    for j in range(a.shape[1] - 1, -1, -1):
        s = a[:, j] + b[:, j] + carry
        out[:, j], carry = s % 10, s // 10
    return out


@register
class Addition(_Hinted):
    """Two L-digit operands (uniform over ``0 .. 10^L - 1``, written with L+1 digits, a leading
    0 first, as in the authors' code) -> their sum's L+1 digits; options: index hints,
    reversed output."""

    name = "addition"
    rasp_l = False
    options = ("index_hints", "reverse_output")
    PLUS: ClassVar[int] = 10
    """Source index of ``+`` (after the digits)."""

    def positions(self, length: int) -> int:
        return length + 1

    def check(self, cfg: KindConfig, longest: int) -> None:
        _refuse_fixed_alphabet(self, cfg)

    def src_symbols(self, cfg: KindConfig, n_hints: int) -> list[str]:
        return [*map(str, range(10)), "+", *(hint_symbols(n_hints) if cfg.index_hints else [])]

    def tgt_symbols(self, cfg: KindConfig, n_hints: int) -> list[str]:
        return [*map(str, range(10)), *(hint_symbols(n_hints) if cfg.index_hints else [])]

    def draw(self, rng: np.random.Generator, length: int, n: int, cfg: KindConfig, n_hints: int) -> Drawn:
        zero = np.zeros((n, 1), dtype=np.int64)
        a = np.concatenate([zero, rng.integers(0, 10, (n, length))], axis=1)  # (n, L+1)
        b = np.concatenate([zero, rng.integers(0, 10, (n, length))], axis=1)
        total = add_digits(a, b)  # never overflows: both operands start with 0
        plus = np.full((n, 1), self.PLUS, dtype=np.int64)
        if not cfg.index_hints:
            return Drawn(np.concatenate([a, plus, b], axis=1), total[:, ::-1] if cfg.reverse_output else total)
        hints = self.hints(rng, length, n, cfg, n_hints)
        src = np.concatenate([interleave(hints + 11, a), plus, interleave(hints + 11, b)], axis=1)
        tgt = interleave(hints + 10, total)
        if cfg.reverse_output:  # pairs (hint, digit) in reverse order
            tgt = tgt.reshape(n, -1, 2)[:, ::-1].reshape(n, -1)
        return Drawn(src, np.ascontiguousarray(tgt))


def describe_kinds() -> dict[str, Any]:
    """``{kind: {"rasp_l": bool, "options": [...]}}`` (for docs and the analysis declaration)."""
    return {name: {"rasp_l": k.rasp_l, "options": list(k.options)} for name, k in KINDS.items()}
