"""Dyck-1 strings and their samplers (the data side of :mod:`trainables.tasks.dyck`).

Strings of balanced brackets ``(`` ``)`` drawn from the PCFG ``S -> ( S )`` (probability
``p``), ``S -> S S`` (``q``), ``S -> empty`` (``1 - p - q``), after Suzgun et al. 2019:

* :class:`SuzgunSampler`: their recursive sampler, run iteratively (a branch that makes the
  string longer than the maximum is abandoned); :func:`sample_unique` draws until enough
  *unique* strings within a length range are found.
* Strings of one exact length, where that rejection loop keeps about 1 draw in 12,000
  (:func:`sample_exact_unique`): :class:`SuzgunLengthSampler` gives exactly the loop's
  distribution, abandoned branches and depth cap included; :class:`LengthConditionedSampler`
  conditions the grammar itself on the length.
* :func:`to_tags`: strings -> :class:`~trainables.data.SeqTags` with per-step depth targets.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from trainables.data import SeqTags
from trainables.errors import DataError

OPEN, CLOSE = 0, 1
"""Input ids of ``(`` and ``)``."""
SYMBOLS = "()"
_WRAP, _CONCAT = -1, -2
VeryLongSampler = Literal["conditioned", "suzgun_rejection"]
_BLOCK = 1 << 16

# --------------------------------------------------------------------------- strings
def depth_targets(s: str) -> np.ndarray:
    """Per-step targets ``(T, 2)`` float32 of a bracket string: ``[1, depth after > 0]``."""
    x = encode(s)
    depth = np.cumsum(1 - 2 * x)  # (T,)
    return np.stack([np.ones(len(x)), depth > 0], axis=1).astype(np.float32)


def encode(s: str) -> np.ndarray:
    """Bracket string -> ``(T,)`` int64 ids (``(`` = 0, ``)`` = 1)."""
    raw = np.frombuffer(s.encode("ascii"), dtype=np.uint8)
    if not np.all((raw == ord("(")) | (raw == ord(")"))):
        raise DataError(f"not a bracket string: {s[:40]!r}; only '(' and ')' are allowed")
    return (raw == ord(")")).astype(np.int64)


def decode(x: np.ndarray) -> str:
    """``(T,)`` ids -> bracket string."""
    return "".join(SYMBOLS[int(t)] for t in x)


def is_dyck(s: str) -> bool:
    """True iff ``s`` is a non-empty balanced bracket string."""
    if not s:
        return False
    depth = np.cumsum(1 - 2 * encode(s))
    return bool(depth.min() >= 0 and depth[-1] == 0)


def zigzag(j: int, length: int) -> str:
    """``j`` opens then ``j`` closes, repeated and cut to ``length`` symbols."""
    period = "(" * j + ")" * j
    return (period * math.ceil(length / len(period)))[:length]


def zigzag_j(x: np.ndarray) -> int:
    """The ``j`` of a zigzag example: the index of its first ``)``."""
    return int(np.argmax(np.asarray(x) == CLOSE))


def dyck_count(length: int) -> int:
    """Number of Dyck-1 strings of ``length`` (the Catalan number; 0 for odd lengths)."""
    if length % 2:
        return 0
    m = length // 2
    return math.comb(2 * m, m) // (m + 1)


# --------------------------------------------------------------------------- generators
class _Uniforms:
    """Uniform draws from ``rng`` in blocks (scalar draws from numpy are slow one by one)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.buf: list[float] = []
        self.pos = 0

    def next(self) -> float:
        if self.pos == len(self.buf):
            self.buf, self.pos = self.rng.random(_BLOCK).tolist(), 0
        self.pos += 1
        return self.buf[self.pos - 1]


class SuzgunSampler:
    """Suzgun et al.'s recursive sampler, run with an explicit stack.

    The recursive original: ``gen(size)`` returns ``''`` if ``size >= max_len``; else with
    probability ``p`` it returns ``'(' + gen(size + 2) + ')'``, with ``q`` it returns
    ``gen(size) + gen(size)``, otherwise ``''``; a composed string longer than ``max_len``
    is abandoned (``''``). :meth:`sample` draws in the same depth-first order.
    """

    def __init__(self, rng: np.random.Generator, max_len: int, p: float, q: float) -> None:
        self.rng, self.max_len, self.p, self.q = rng, max_len, p, q
        self.buf: list[float] = []
        self.pos = 0

    def sample(self) -> str:
        """One string (possibly empty) of length ``<= max_len``."""
        max_len, p, pq = self.max_len, self.p, self.p + self.q
        buf, pos = self.buf, self.pos  # uniform draws, fetched from numpy in blocks
        tasks = [0]  # >= 0: expand a nonterminal at that size; _WRAP / _CONCAT: combine values
        values: list[str] = []
        while tasks:
            t = tasks.pop()
            if t >= 0:
                if t >= max_len:
                    values.append("")
                    continue
                if pos == len(buf):
                    buf, pos = self.rng.random(_BLOCK).tolist(), 0
                r = buf[pos]
                pos += 1
                if r < p:
                    tasks.append(_WRAP)
                    tasks.append(t + 2)
                elif r < pq:
                    tasks.append(_CONCAT)
                    tasks.append(t)
                    tasks.append(t)
                else:
                    values.append("")
                continue
            if t == _WRAP:
                s = "(" + values.pop() + ")"
            else:
                right = values.pop()
                s = values.pop() + right
            values.append(s if len(s) <= max_len else "")
        self.buf, self.pos = buf, pos
        return values[0]


def sample_unique(
    rng: np.random.Generator,
    n: int,
    min_len: int,
    max_len: int,
    p: float,
    q: float,
    exclude: set[str] | None = None,
) -> list[str]:
    """``n`` distinct strings with lengths in ``[min_len, max_len]`` from :class:`SuzgunSampler`.

    Strings in ``exclude`` are skipped (and ``exclude`` is not modified). Raises DataError
    when the range is too rare to fill (more than ``200 n + 100,000`` draws).
    """
    seen = set(exclude or ())
    out: list[str] = []
    sampler = SuzgunSampler(rng, max_len, p, q)
    budget = 200 * n + 100_000
    for _ in range(budget):
        if len(out) == n:
            return out
        s = sampler.sample()
        if len(s) >= min_len and s not in seen:
            seen.add(s)
            out.append(s)
    if len(out) == n:
        return out
    raise DataError(
        f"only {len(out)} of {n} distinct Dyck strings of length {min_len}..{max_len} after "
        f"{budget} draws: the range is too rare under p={p}, q={q}; widen the length range, "
        "lower the size, or raise p"
    )


def length_probs(max_len: int, p: float, q: float) -> np.ndarray:
    """``P[m]`` = probability that ``S`` derives a string of length ``2m``, ``m = 0..max_len//2``.

    Summed over every derivation: ``P[0]`` is the smaller root of ``P0 = r + q P0^2``
    (``r = 1 - p - q``) and ``P[m] = (p P[m-1] + q sum_{a=1}^{m-1} P[a] P[m-a]) / (1 - 2 q P0)``.
    """
    r = 1.0 - p - q
    probs = np.zeros(max_len // 2 + 1)  # (M+1,)
    probs[0] = 2 * r / (1 + math.sqrt(max(0.0, 1 - 4 * q * r)))
    denom = 1 - 2 * q * probs[0]
    for m in range(1, len(probs)):
        inner = float(probs[1:m] @ probs[m - 1 : 0 : -1]) if m > 1 else 0.0
        probs[m] = (p * probs[m - 1] + q * inner) / denom
    return probs


class LengthConditionedSampler:
    """Strings of the PCFG conditioned on their exact length.

    For a nonterminal that must produce length ``2m > 0`` the rule choices are
    ``( S )`` with weight ``p P[m-1]`` and ``S S`` with the left part of length ``2a``,
    ``a = 1..m-1``, with weight ``q P[a] P[m-a]`` (:func:`length_probs`). The split with an
    empty part gives back the same problem, so leaving it out keeps the distribution exact.
    """

    def __init__(self, max_len: int, p: float, q: float) -> None:
        probs = length_probs(max_len, p, q)
        self.cdfs: list[list[float]] = [[]]
        for m in range(1, len(probs)):
            weights = np.concatenate([[p * probs[m - 1]], q * probs[1:m] * probs[m - 1 : 0 : -1]])
            self.cdfs.append(np.cumsum(weights).tolist())  # (m,): choice 0 = paren, a = split

    def sample(self, u: _Uniforms, length: int) -> str:
        """One string of exactly ``length`` (even, ``<= max_len``)."""
        out: list[str] = []
        tasks = [length // 2]  # >= 0: nonterminal of that half-length; -1: a literal ')'
        while tasks:
            m = tasks.pop()
            if m < 0:
                out.append(")")
            elif m > 0:
                cdf = self.cdfs[m]
                a = min(bisect.bisect_right(cdf, u.next() * cdf[-1]), m - 1)
                if a == 0:
                    out.append("(")
                    tasks += (-1, m - 1)
                else:
                    tasks += (m - a, a)
        return "".join(out)


@functools.lru_cache(maxsize=8)
def suzgun_length_table(max_len: int, p: float, q: float) -> np.ndarray:
    """``G[d, m]`` = probability that :class:`SuzgunSampler`'s ``gen(2d)`` returns a string of
    length ``2m``, for ``d, m = 0..M`` (``M = max_len // 2``, ``max_len`` even); read-only.

    Row ``M`` is the depth cap (``gen`` returns ``''``). For ``d < M``, with ``z = G[d, 0]``
    and ``W = G[d + 1]``, the sampler's rules give, for ``m >= 1``,
    ``G[d, m] (1 - 2 q z) = p W[m - 1] + q sum_{a=1}^{m-1} G[d, a] G[d, m - a]``, and
    ``z = (1 - p - q) + p W[M] + q (z^2 + sum_{a, b >= 1, a + b > M} G[d, a] G[d, b])``: the
    empty rule, plus every wrap or concatenation longer than ``max_len``, which the sampler
    abandons (returns ``''``). ``z`` is found by Newton's method (each ``G[d, m]`` is a power
    series in ``z`` with non-negative coefficients, so from below it never overshoots),
    levels solved deepest first in windows of 25 (a level needs the one below it).
    """
    m_max = max_len // 2
    r = 1.0 - p - q
    table = np.zeros((m_max + 1, m_max + 1))  # (levels, half-lengths)
    table[m_max, 0] = 1.0
    grad = np.zeros_like(table)  # dG[d, m] / dz_d
    z_start = 2 * r / (1 + math.sqrt(max(0.0, 1 - 4 * q * r)))  # P(empty) without the limits
    for hi in range(m_max, 0, -25):
        lo = max(0, hi - 25)
        rows, below = slice(lo, hi), slice(lo + 1, hi + 1)
        z = np.full(hi - lo, z_start if hi == m_max else table[hi, 0])
        for _ in range(100):
            table[rows, 0], grad[rows, 0] = z, 1.0
            den = 1 - 2 * q * z
            conv, dconv = np.zeros(hi - lo), np.zeros(hi - lo)
            for m in range(1, m_max + 1):
                back = table[rows, m - 1 : 0 : -1]  # G[d, m-1], ..., G[d, 1]
                inner = np.einsum("da,da->d", table[rows, 1:m], back)
                dinner = 2 * np.einsum("da,da->d", grad[rows, 1:m], back)
                conv += inner
                dconv += dinner
                table[rows, m] = (p * table[below, m - 1] + q * inner) / den
                grad[rows, m] = (2 * q * table[rows, m] + q * dinner) / den
            s1, ds1 = table[rows, 1:].sum(1), grad[rows, 1:].sum(1)
            h = r + p * table[below, m_max] + q * (z * z + s1 * s1 - conv) - z
            if np.abs(h).max() < 1e-13:
                break
            z = z - h / (q * (2 * z + 2 * s1 * ds1 - dconv) - 1)
        else:  # pragma: no cover - not seen for any valid (p, q)
            raise DataError(f"Suzgun length table for max_len={max_len}, p={p}, q={q} did not converge")
    table.setflags(write=False)
    return table


class SuzgunLengthSampler:
    """:class:`SuzgunSampler` (abandon limit ``max_len``) kept only at one exact length:
    the distribution of Suzgun et al.'s ``generate_list(n, L, L)`` rejection loop, drawn
    without the loop (which needs about 12,000 draws and 12 million rule choices per string
    of length 1000).

    A node ``gen(2d)`` that must return length ``2m > 0`` chooses ``( S )`` with weight
    ``p G[d + 1, m - 1]`` or ``S S`` with a left part of length ``2a``, ``a = 1..m-1``, with
    weight ``q G[d, a] G[d, m - a]`` (:func:`suzgun_length_table`); a part of length 0 is
    ``''`` whether it was empty, abandoned or capped. The split with an empty part gives back
    the same problem, so leaving it out keeps the distribution exact. Unlike the grammar
    conditioned on its length (:class:`LengthConditionedSampler`), this counts the
    sampler's abandoned branches and its depth cap. Where those weigh, the two differ (at
    length 20, p=0.5, q=0.25: 17% of strings reach the cap's depth 10, against 9%); at
    length 1000 they agree closely (measured over 3,000 strings each: mean maximum depth
    56.6 and 56.5, first return to depth 0 at 734 and 738; two-sample KS p 0.94 and 1.0),
    while a plain draw has length 1000 with probability 8.4e-5 here, 3.6e-5 in the grammar.
    """

    def __init__(self, max_len: int, p: float, q: float) -> None:
        self.max_len, self.p, self.q = max_len, p, q
        self.table = suzgun_length_table(max_len, p, q)

    def sample(self, u: _Uniforms, length: int) -> str:
        """One string of exactly ``length`` (even, ``<= max_len``)."""
        g, p, q = self.table, self.p, self.q
        out: list[str] = []
        tasks: list[tuple[int, int]] = [(0, length // 2)]  # (level, half-length); (-1, 0): ')'
        while tasks:
            d, m = tasks.pop()
            if d < 0:
                out.append(")")
            elif m > 0:
                weights = np.empty(m)  # choice 0: ( S ); a >= 1: split at 2a
                weights[0] = p * g[d + 1, m - 1]
                weights[1:] = q * g[d, 1:m] * g[d, m - 1 : 0 : -1]
                cdf = np.cumsum(weights)
                a = min(int(np.searchsorted(cdf, u.next() * cdf[-1], side="right")), m - 1)
                if a == 0:
                    out.append("(")
                    tasks += ((-1, 0), (d + 1, m - 1))
                else:
                    tasks += ((d, m - a), (d, a))
        return "".join(out)


def sample_exact_unique(
    rng: np.random.Generator,
    n: int,
    length: int,
    p: float,
    q: float,
    method: VeryLongSampler = "conditioned",
) -> list[str]:
    """``n`` distinct strings of exactly ``length`` via :class:`LengthConditionedSampler`
    (``method="conditioned"``) or :class:`SuzgunLengthSampler` (``"suzgun_rejection"``,
    abandon limit ``length``)."""
    if dyck_count(length) < n:
        raise DataError(
            f"only {dyck_count(length)} Dyck strings have length {length}; ask for fewer"
        )
    sampler: LengthConditionedSampler | SuzgunLengthSampler = (
        SuzgunLengthSampler(length, p, q)
        if method == "suzgun_rejection"
        else LengthConditionedSampler(length, p, q)
    )
    u = _Uniforms(rng)
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < n:
        s = sampler.sample(u, length)
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def to_tags(strings: Sequence[str], ids: np.ndarray | None = None) -> SeqTags:
    """Bracket strings -> :class:`SeqTags` with :func:`depth_targets` (vectorised over all)."""
    if not strings:
        return SeqTags(x=[], y=[], ids=np.zeros(0, dtype=np.int64))
    lengths = np.array([len(s) for s in strings], dtype=np.int64)  # (N,)
    x_all = encode("".join(strings))  # (sum T,)
    depth = np.cumsum(1 - 2 * x_all)  # (sum T,) running depth over the concatenation
    ends = np.cumsum(lengths)  # (N,)
    before = np.concatenate([[0], depth[ends[:-1] - 1]])  # (N,) depth before each string
    depth -= np.repeat(before, lengths)  # depth within each string
    y_all = np.stack([np.ones(len(x_all)), depth > 0], axis=1).astype(np.float32)  # (sum T, 2)
    cuts = ends[:-1]
    x, y = np.split(x_all, cuts), np.split(y_all, cuts)
    return SeqTags(x=x, y=y, ids=np.arange(len(x)) if ids is None else ids)
