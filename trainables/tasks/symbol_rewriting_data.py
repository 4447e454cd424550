"""Data generation for the symbol-rewriting task (Weber, Shekhar & Balasubramanian 2018).

Pure numpy helpers used by :mod:`trainables.tasks.symbol_rewriting`: the alphabets, the two
input *families*, drawing distinct (or, for tiny lengths, balanced) inputs per length, the
rewriting of inputs into targets, and a parser of the published TSV files.

Symbols are handled here as 0-based indices in ``uint8`` arrays: symbol index ``j`` is the
paper's symbol ``j + 1`` and has vocab id ``j + 3`` (ids 0-2 are the special tokens).

Input families
--------------
* :class:`NoRepeat` - no symbol occurs twice anywhere in the input (train, val, Standard,
  Short, Long). Sampled uniformly: every arrangement of ``L`` distinct symbols is equally
  likely.
* :class:`Runs` - inputs made of *runs* (maximal blocks of one symbol), at least one of
  which is repeated (Repeat and the uncharacteristic validation set). The published
  ``grammar_repeat.tst.full.tsv`` and ``grammar.val.tsv`` are both fitted closely (maximum
  likelihood over the run-length compositions at every length; fitted run-length law
  ``[0.50, 0.10, 0.10, 0.10, 0.10, 0.10]`` for lengths 1..6 in both files) by this process:
  for a target length ``L``, draw runs one after another, each of length 1 with probability
  ``single_prob`` (1/2) and otherwise uniform over ``2..max_run``; cut the last run at ``L``;
  give every run a different symbol (uniformly, no symbol in two runs, as in the files);
  reject inputs with no run longer than 1. This reproduces what the files show: 1-2
  repeated runs per input in most rows (Repeat: 49% one, 44% two, 7% three), repeated
  runs of every length 2..6 with shorter ones more common, and many single-run inputs at
  the shortest lengths (e.g. 25% of length-5 Repeat rows are one symbol five times).

Distinctness: inputs are drawn per length, and an input already used (in this split or
in any split drawn before it) is rejected and redrawn, so splits are pairwise disjoint.
A length whose share exceeds the number of inputs that exist (e.g. the 40 inputs of
length 1 in Short) either gives its overflow to the other lengths (splits that must be
distinct) or, where repeats are allowed (Short only), uses every input as evenly as
possible (the published Short file instead draws with replacement at every length).
Where a length's share is more than half of its free inputs (tiny alphabets only), the
inputs are drawn uniformly from an explicit list of the free ones instead of by rejection.
Distinctness necessarily thins the commonest Repeat shapes at the shortest lengths: there
are only 40 single-run inputs of length 5, where the published file repeats them (84 of
its 330 length-5 rows).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from trainables.errors import ConfigError, DataError

BASE_LETTERS = "ABCDEFGHIJKLMNOPQRTUVWXYZ"
"""The 25 single-letter input symbols (A..Z without S), in index order."""
MAX_SYMBOLS = 250
"""Largest supported alphabet (symbols are stored as uint8; names get one more S per 25)."""
ENUMERATE_LIMIT = 2_000_000
"""Largest number of inputs of one length that may be enumerated explicitly."""
N_SPECIAL = 3
"""Vocab ids 0, 1, 2 are <pad>, <s>, </s>; real tokens start at 3."""


def input_symbols(n_symbols: int) -> list[str]:
    """Names of the input symbols, in index order.

    The first 40 are the paper's alphabet: ``A..Z`` without ``S`` (25), then ``AS..OS``
    (15). Beyond 40 the scheme continues: ``PS..ZS``, then ``ASS..ZSS``, and so on
    (symbol ``j`` (0-based) is ``BASE_LETTERS[j % 25] + "S" * (j // 25)``).
    """
    return [BASE_LETTERS[j % 25] + "S" * (j // 25) for j in range(n_symbols)]


def target_tokens(n_symbols: int, letters: str, n_values: int) -> list[str]:
    """Every output token ``{letter}{i}_{v}``, ordered so that a token's vocab id is

    ``3 + ((i - 1) * len(letters) + letter_index) * n_values + (v - 1)``.
    """
    return [
        f"{letter}{i}_{v}"
        for i in range(1, n_symbols + 1)
        for letter in letters
        for v in range(1, n_values + 1)
    ]


def compositions(length: int, max_part: int) -> list[tuple[int, ...]]:
    """All ordered ways to write ``length`` as a sum of parts in ``1..max_part``."""
    if length == 0:
        return [()]
    out: list[tuple[int, ...]] = []
    for first in range(1, min(max_part, length) + 1):
        out.extend((first, *rest) for rest in compositions(length - first, max_part))
    return out


def _n_compositions(length: int, parts: int, max_part: int) -> int:
    """Number of compositions of ``length`` into exactly ``parts`` parts in ``1..max_part``."""
    # ways[t] = compositions of t into the parts placed so far
    ways = [1] + [0] * length
    for _ in range(parts):
        new = [0] * (length + 1)
        for t, w in enumerate(ways):
            if w:
                for r in range(1, min(max_part, length - t) + 1):
                    new[t + r] += w
        ways = new
    return ways[length]


def arrangements(rng: np.random.Generator, m: int, n: int, k: int) -> np.ndarray:
    """``m`` uniform random ordered selections of ``k`` distinct values of ``0..n-1``, ``(m, k)``.

    A partial Fisher-Yates shuffle per row: ``k`` vectorised swap steps, O(m n) memory.
    """
    perm = np.tile(np.arange(n, dtype=np.uint8), (m, 1))  # (m, n)
    rows = np.arange(m)
    for j in range(k):
        pick = rng.integers(j, n, size=m)  # (m,) position swapped into column j
        chosen = perm[rows, pick]
        perm[rows, pick] = perm[:, j]
        perm[:, j] = chosen
    return perm[:, :k]


def row_keys(rows: np.ndarray) -> list[bytes]:
    """One hashable key per row of a ``(m, L)`` uint8 array (same length -> same width)."""
    rows = np.ascontiguousarray(rows, dtype=np.uint8)
    return rows.view(f"V{rows.shape[1]}").ravel().tolist()


class Family(Protocol):
    """A set of inputs of each length, with a sampler and a membership test."""

    def count(self, length: int) -> int:
        """Number of distinct inputs of ``length`` in the family (exact, may be huge)."""
        ...

    def sample(self, rng: np.random.Generator, m: int, length: int) -> np.ndarray:
        """Up to ``m`` random inputs ``(m', length)`` uint8 (may reject some draws)."""
        ...

    def contains(self, rows: np.ndarray) -> np.ndarray:
        """``(m,)`` bool: which rows of ``(m, L)`` belong to the family."""
        ...

    def enumerate(self, length: int) -> np.ndarray:
        """Every input of ``length``, ``(count, length)`` uint8, in a fixed order."""
        ...


@dataclass(frozen=True)
class NoRepeat:
    """Inputs in which no symbol occurs twice; sampled uniformly."""

    n_symbols: int

    def count(self, length: int) -> int:
        return math.perm(self.n_symbols, length)

    def sample(self, rng: np.random.Generator, m: int, length: int) -> np.ndarray:
        return arrangements(rng, m, self.n_symbols, length)  # (m, L)

    def contains(self, rows: np.ndarray) -> np.ndarray:
        srt = np.sort(rows, axis=1)  # (m, L)
        distinct = np.all(srt[:, 1:] != srt[:, :-1], axis=1)
        return distinct & np.all(rows < self.n_symbols, axis=1)

    def enumerate(self, length: int) -> np.ndarray:
        perms = itertools.permutations(range(self.n_symbols), length)
        flat = np.fromiter(itertools.chain.from_iterable(perms), dtype=np.uint8)
        return flat.reshape(-1, length)


@dataclass(frozen=True)
class Runs:
    """Inputs of runs of distinct symbols (runs of at most ``max_run``), >= 1 run repeated."""

    n_symbols: int
    max_run: int
    single_prob: float

    def count(self, length: int) -> int:
        total = 0
        for parts in range(1, min(length, self.n_symbols) + 1):
            n_shapes = _n_compositions(length, parts, self.max_run) - (parts == length)
            total += n_shapes * math.perm(self.n_symbols, parts)
        return total

    def sample(self, rng: np.random.Generator, m: int, length: int) -> np.ndarray:
        single = rng.random((m, length)) < self.single_prob  # (m, L) at most L runs
        longer = rng.integers(2, self.max_run + 1, size=(m, length))
        run_len = np.where(single, 1, longer)  # (m, L)
        ends = np.cumsum(run_len, axis=1)  # (m, L) exclusive end of each run
        starts = np.zeros((m, length + 1), dtype=np.int64)  # (m, L+1) 1 where a run starts
        r, c = np.nonzero(ends < length)
        starts[r, ends[r, c]] = 1
        run_of = np.cumsum(starts[:, :length], axis=1)  # (m, L) run index of each position
        n_runs = run_of[:, -1] + 1  # (m,)
        n_sym = min(length, self.n_symbols)
        symbols = arrangements(rng, m, self.n_symbols, n_sym)  # (m, n_sym) one per run
        ok = (n_runs < length) & (n_runs <= self.n_symbols)
        rows = np.take_along_axis(symbols, np.minimum(run_of, n_sym - 1), axis=1)  # (m, L)
        return rows[ok].astype(np.uint8)

    def contains(self, rows: np.ndarray) -> np.ndarray:
        m, length = rows.shape
        same = rows[:, 1:] == rows[:, :-1]  # (m, L-1)
        n_runs = length - same.sum(axis=1)
        srt = np.sort(rows, axis=1)
        n_distinct = 1 + np.sum(srt[:, 1:] != srt[:, :-1], axis=1)
        too_long: np.ndarray = np.zeros(m, dtype=bool)
        if length - 1 >= self.max_run:
            # (m, L - max_run, max_run): a run longer than max_run has max_run equal neighbours
            windows = np.lib.stride_tricks.sliding_window_view(same, self.max_run, axis=1)
            too_long = np.all(windows, axis=2).any(axis=1)
        in_range = np.all(rows < self.n_symbols, axis=1)
        return (n_runs < length) & (n_distinct == n_runs) & ~too_long & in_range

    def enumerate(self, length: int) -> np.ndarray:
        blocks = [np.zeros((0, length), dtype=np.uint8)]
        for shape in compositions(length, self.max_run):
            if len(shape) == length or len(shape) > self.n_symbols:
                continue
            perms = itertools.permutations(range(self.n_symbols), len(shape))
            flat = np.fromiter(itertools.chain.from_iterable(perms), dtype=np.uint8)
            blocks.append(np.repeat(flat.reshape(-1, len(shape)), shape, axis=1))
        return np.concatenate(blocks)


UsedKeys = dict[int, set[bytes]]
"""Inputs already taken, as row keys grouped by length."""


def _room(family: Family, length: int, used: UsedKeys) -> int:
    """How many inputs of ``length`` in ``family`` are not in ``used`` (exact)."""
    keys = used.get(length, set())
    taken = 0
    if keys:
        rows = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), length)
        taken = int(family.contains(rows).sum())
    return family.count(length) - taken


def _allocate(
    n: int, lengths: range, room: np.ndarray, rng: np.random.Generator, field: str
) -> np.ndarray:
    """Per-length counts: uniform over ``lengths``; overflow beyond ``room`` moves elsewhere."""
    counts = rng.multinomial(n, np.full(len(lengths), 1 / len(lengths)))
    while np.any(counts > room):
        excess = int(np.maximum(counts - room, 0).sum())
        counts = np.minimum(counts, room)
        free = room - counts
        if free.sum() < excess:
            raise ConfigError(
                field,
                f"only {int(room.sum())} distinct inputs of lengths {lengths.start}-"
                f"{lengths.stop - 1} are left for {n} examples",
                "ask for fewer examples, widen the length range or raise task.n_symbols",
            )
        has_room = free > 0
        counts[has_room] += rng.multinomial(excess, has_room[has_room] / has_room.sum())
    return counts


def _draw_distinct(
    family: Family, length: int, n: int, rng: np.random.Generator, used: set[bytes], room: int
) -> np.ndarray:
    """``n`` inputs of ``length`` not in ``used`` and distinct from each other, ``(n, L)``."""
    if 2 * n > room and family.count(length) <= ENUMERATE_LIMIT:
        return _draw_from_pool(family, length, n, rng, used)
    taken: list[np.ndarray] = []
    new: set[bytes] = set()
    for _ in range(200):
        need = n - len(new)
        if need == 0:
            break
        cand = family.sample(rng, 2 * need + 32, length)  # (m, L)
        keep = []
        for i, key in enumerate(row_keys(cand)):
            if key not in used and key not in new:
                new.add(key)
                keep.append(i)
                if len(keep) == need:
                    break
        taken.append(cand[keep])
    else:  # pragma: no cover - only with nearly exhausted, non-enumerable lengths
        raise RuntimeError(f"could not draw {n} distinct inputs of length {length}")
    return np.concatenate(taken) if taken else np.zeros((0, length), dtype=np.uint8)


def _draw_from_pool(
    family: Family, length: int, n: int, rng: np.random.Generator, used: set[bytes]
) -> np.ndarray:
    """``n`` distinct inputs chosen uniformly from every free input of ``length``."""
    pool = family.enumerate(length)
    free = pool[np.fromiter((k not in used for k in row_keys(pool)), bool, count=len(pool))]
    return free[np.sort(rng.choice(len(free), size=n, replace=False))]


def _draw_balanced(
    family: Family, length: int, n: int, rng: np.random.Generator, used: set[bytes], field: str
) -> np.ndarray:
    """``n`` inputs from a length with fewer free inputs than ``n``: each used evenly."""
    pool = family.enumerate(length)
    free = pool[np.fromiter((k not in used for k in row_keys(pool)), bool, count=len(pool))]
    if len(free) == 0:
        raise ConfigError(
            field, f"no free inputs of length {length} remain", "change the length ranges"
        )
    reps, extra = divmod(n, len(free))
    chosen = np.sort(rng.choice(len(free), size=extra, replace=False))
    return np.concatenate([np.tile(free, (reps, 1)), free[chosen]])


def draw_inputs(
    family: Family,
    lengths: tuple[int, int],
    n: int,
    rng: np.random.Generator,
    used: UsedKeys,
    *,
    allow_repeats: bool,
    field: str,
) -> list[np.ndarray]:
    """``n`` inputs with lengths uniform over ``lengths`` (inclusive), none of them in ``used``.

    Returns blocks ``(n_L, L)`` uint8, one per length. Within the split inputs are distinct,
    except (``allow_repeats``) where a length has fewer free inputs than its share: then
    every free input of that length appears ``n_L // free`` or one more times. The drawn
    inputs are added to ``used``. Raises ConfigError naming ``field`` when impossible.
    """
    span = range(lengths[0], lengths[1] + 1)
    rooms = [_room(family, length, used) for length in span]  # exact, may be huge
    if allow_repeats:
        counts = rng.multinomial(n, np.full(len(span), 1 / len(span)))
    else:
        clipped = np.array([min(room, n) for room in rooms], dtype=np.int64)
        counts = _allocate(n, span, clipped, rng, field)
    blocks = []
    for length, count, room in zip(span, counts, rooms, strict=True):
        keys = used.setdefault(length, set())
        if count == 0:
            continue
        if count > room:
            rows = _draw_balanced(family, length, int(count), rng, keys, field)
        else:
            rows = _draw_distinct(family, length, int(count), rng, keys, room)
        keys.update(row_keys(rows))
        blocks.append(rows)
    return blocks


def rewrite(
    rows: np.ndarray, n_letters: int, n_values: int, rng: np.random.Generator
) -> np.ndarray:
    """Gold targets for inputs ``(n, L)``: token ids ``(n, L * n_letters)`` int64.

    Every occurrence of a symbol becomes one token from each sub-alphabet, in a uniformly
    random order, each with a value uniform over ``1..n_values``, drawn independently.
    """
    n, length = rows.shape
    letters = rng.random((n, length, n_letters)).argsort(axis=2)  # (n, L, k) a permutation
    values = rng.integers(0, n_values, size=(n, length, n_letters))  # (n, L, k)
    symbol = rows.astype(np.int64)[:, :, None]  # (n, L, 1)
    ids = N_SPECIAL + (symbol * n_letters + letters) * n_values + values  # (n, L, k)
    return ids.reshape(n, length * n_letters)


def parse_tsv(path: Path) -> list[tuple[list[str], list[str]]]:
    """Rows ``(input symbols, output tokens)`` of a published file.

    Format: ``input \\t output \\t attention``; the input is space-separated symbols ending
    with ``.`` (dropped here); the output is space-separated tokens. Blank lines are skipped.
    """
    rows = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            cols = line.rstrip("\n").split("\t")
            if len(cols) < 2:
                raise DataError(
                    f"{path}:{lineno}: expected 'input<TAB>output[<TAB>attention]', got "
                    f"{line[:60]!r}; use the published symbol-rewriting TSV files"
                )
            src = cols[0].split()
            if src and src[-1] == ".":
                src = src[:-1]
            rows.append((src, cols[1].split()))
    return rows


def check_published_files(
    paths: dict[str, Path], n_symbols: int, sub_alphabets: str, n_values: int
) -> None:
    """Read every published file in ``paths`` (split -> path) as a worker would and raise a
    ConfigError naming ``task.data_dir`` for the first problem: unreadable, not UTF-8, a
    malformed row, no rows, a row without input, or a symbol / token outside the alphabets of
    this config. Called before Ray starts (``SymbolRewriting.check``)."""
    symbols = set(input_symbols(n_symbols))
    tokens = set(target_tokens(n_symbols, sub_alphabets, n_values))
    fix = (
        "point task.data_dir at the five published symbol-rewriting files (they need "
        "n_symbols >= 40, sub_alphabets containing A, B, C and n_values >= 2), or remove it"
    )

    def refuse(problem: str) -> ConfigError:
        return ConfigError("task.data_dir", problem, fix)

    for path in paths.values():
        try:
            rows = parse_tsv(path)
        except UnicodeDecodeError as exc:
            raise refuse(f"{path} is not UTF-8 text (offset {exc.start})") from None
        except DataError as exc:
            raise refuse(str(exc).split("; ")[0]) from None
        except OSError as exc:
            raise refuse(f"cannot read {path} ({exc.strerror or exc})") from None
        if not rows:
            raise refuse(f"{path} has no rows")
        for i, (src, tgt) in enumerate(rows, start=1):
            unknown = [s for s in src if s not in symbols] + [t for t in tgt if t not in tokens]
            if not src or unknown:
                what = f"unknown symbols/tokens {unknown[:3]}" if unknown else "no input"
                raise refuse(f"{path}: row {i} has {what}")
