"""The Multi-Bootstrap: seeds and test examples resampled together (Sellam et al. 2022,
"The MultiBERTs").

A test accuracy varies with the seed *and* with the finite test set. Resampling only the
seeds treats the test set as the whole population; resampling only the examples treats
one seed as the model. The Multi-Bootstrap resamples both at once: each replicate draws
seeds with replacement and examples with replacement and recomputes the mean over the
drawn (seed, example) cells. For a difference between two groups:

* **two configs on one split**: the *same* example draw for both (they were scored on the
  same examples: paired over examples); the seeds drawn *together* when both configs ran
  the same seeds (same seed indices and seed values: paired over seeds), else each
  config's seeds drawn on their own;
* **two test splits of one config**: different examples, so each split's examples are
  drawn on their own; the seeds drawn together (the same seed ran both splits).

Every table is a correctness matrix ``(seeds, examples)`` of 0/1 (or any per-example
score), rows in seed order, columns in example order. A replicate's mean is
``w_s @ X @ w_e / (S * E)`` with ``w_s`` (S,) and ``w_e`` (E,) the draw counts, so a
replicate costs one matrix product. The interval is the percentile interval of the
replicates; ``p`` is two-sided: twice the smaller share of replicates on either side of 0
(at most 1), a bootstrap analogue of a p-value (Sellam et al. report the one-sided share).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from analysis.errors import AnalysisError

CHUNK_CELLS = 4_000_000
"""Replicates are computed in chunks of at most this many (replicate, example) cells."""


@dataclass(frozen=True)
class MultiBoot:
    """A difference of means ``mean_a - mean_b`` with its Multi-Bootstrap interval."""

    estimate: float
    low: float
    high: float
    p: float
    """Two-sided bootstrap p: 2 * min(share of replicates <= 0, share >= 0), capped at 1."""
    mean_a: float
    mean_b: float
    n_boot: int
    level: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _counts(rng: np.random.Generator, n: int, size: int) -> np.ndarray:
    """(size, n) draw counts of ``n`` items drawn ``n`` times with replacement: each row is a
    Multinomial(n, 1/n) draw, made as n uniform indices counted per row. At 1,000-10,000
    test examples that is 4-5x faster than ``Generator.multinomial`` (which draws one
    binomial per item), and these draws were most of ``study analyze``'s time."""
    idx = rng.integers(0, n, size=(size, n))
    idx += np.arange(size)[:, None] * n  # row r counts into bins r*n .. r*n + n - 1
    return np.bincount(idx.ravel(), minlength=size * n).reshape(size, n).astype(float)


def replicates(
    a: Any,
    b: Any,
    *,
    paired_seeds: bool,
    paired_examples: bool,
    n_boot: int = 2000,
    seed: int = 0,
) -> np.ndarray:
    """(n_boot,) replicates of ``mean(a) - mean(b)``; ``a`` (S_a, E_a), ``b`` (S_b, E_b).

    ``paired_seeds``: row i of ``a`` and of ``b`` come from the same seed (S_a == S_b),
    drawn together; ``paired_examples``: column j of both is the same example (E_a ==
    E_b), drawn together. Draws come from ``default_rng(seed)``.
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.ndim != 2 or y.ndim != 2 or 0 in x.shape or 0 in y.shape:
        raise AnalysisError(
            f"multi-bootstrap needs two non-empty (seeds, examples) tables, got {x.shape} and {y.shape}"
        )
    if paired_seeds and x.shape[0] != y.shape[0]:
        raise AnalysisError(
            f"paired seeds need the same number of seeds, got {x.shape[0]} and {y.shape[0]}"
        )
    if paired_examples and x.shape[1] != y.shape[1]:
        raise AnalysisError(
            f"paired examples need the same examples, got {x.shape[1]} and {y.shape[1]}"
        )
    (sa, ea), (sb, eb) = x.shape, y.shape
    rng = np.random.default_rng(seed)
    out = np.empty(n_boot)
    step = max(1, CHUNK_CELLS // max(ea, eb))
    for lo in range(0, n_boot, step):
        m = min(step, n_boot - lo)
        ws_a = _counts(rng, sa, m)  # (m, S_a)
        ws_b = ws_a if paired_seeds else _counts(rng, sb, m)
        we_a = _counts(rng, ea, m)  # (m, E_a)
        we_b = we_a if paired_examples else _counts(rng, eb, m)
        mean_a = np.einsum("ms,se,me->m", ws_a, x, we_a, optimize=True) / (sa * ea)
        mean_b = np.einsum("ms,se,me->m", ws_b, y, we_b, optimize=True) / (sb * eb)
        out[lo : lo + m] = mean_a - mean_b
    return out


def multi_bootstrap(
    a: Any,
    b: Any,
    *,
    paired_seeds: bool,
    paired_examples: bool,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> MultiBoot:
    """``mean(a) - mean(b)`` over every (seed, example) cell, with the percentile
    ``level`` interval and two-sided ``p`` of :func:`replicates`."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    reps = replicates(x, y, paired_seeds=paired_seeds, paired_examples=paired_examples,
                      n_boot=n_boot, seed=seed)  # fmt: skip
    tail = (1 - level) / 2
    low, high = np.quantile(reps, [tail, 1 - tail])
    p = min(1.0, 2 * min(float(np.mean(reps <= 0)), float(np.mean(reps >= 0))))
    ma, mb = float(x.mean()), float(y.mean())
    return MultiBoot(ma - mb, float(low), float(high), p, ma, mb, n_boot, level)
