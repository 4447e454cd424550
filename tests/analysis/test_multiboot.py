"""analysis.multiboot on tiny (seeds, examples) tables whose bootstrap distribution is known."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from analysis import multiboot as mb
from analysis.errors import AnalysisError


def _freqs(reps: np.ndarray) -> dict[float, float]:
    vals, counts = np.unique(np.round(reps, 9), return_counts=True)
    return {float(v): c / reps.size for v, c in zip(vals, counts, strict=True)}


def test_draw_counts_are_multinomial_like_numpys() -> None:
    # each row: n draws of n items (sums to n); a cell's count is Binomial(n, 1/n), as in
    # Generator.multinomial: same mean, variance and P(count = k) for small k
    from scipy import stats

    n, size = 50, 20_000
    ours = mb._counts(np.random.default_rng(3), n, size)
    numpys = np.random.default_rng(4).multinomial(n, np.full(n, 1 / n), size=size)
    assert ours.shape == (size, n) and (ours.sum(axis=1) == n).all()
    cells = ours.ravel()
    binom = stats.binom(n, 1 / n)
    assert cells.mean() == pytest.approx(1.0, abs=1e-12)  # rows sum to n exactly
    assert cells.var() == pytest.approx(binom.var(), rel=0.02)
    for k in range(4):
        assert np.mean(cells == k) == pytest.approx(binom.pmf(k), abs=0.005), k
        assert np.mean(cells == k) == pytest.approx(np.mean(numpys.ravel() == k), abs=0.006), k
    # counts of different items in one row are negatively correlated, -1/(n-1)
    r = np.corrcoef(ours[:, 0], ours[:, 1])[0, 1]
    assert r == pytest.approx(-1 / (n - 1), abs=0.02)


def test_no_variance_across_examples_is_a_seeds_only_bootstrap() -> None:
    # seed 0 gets every example right, seed 1 none: a replicate's mean is (draws of seed 0) / 2,
    # i.e. 0, 1/2 or 1 with probabilities 1/4, 1/2, 1/4, whatever examples are drawn
    a = np.array([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    b = np.zeros((2, 3))
    reps = mb.replicates(a, b, paired_seeds=False, paired_examples=True, n_boot=40_000, seed=1)
    f = _freqs(reps)
    assert set(f) == {0.0, 0.5, 1.0}
    assert (f[0.0], f[0.5], f[1.0]) == pytest.approx((0.25, 0.5, 0.25), abs=0.01)
    r = mb.multi_bootstrap(a, b, paired_seeds=False, paired_examples=True, n_boot=40_000, seed=1)
    assert (r.estimate, r.low, r.high) == (0.5, 0.0, 1.0)
    # replicates <= 0: 1/4, >= 0: all -> two-sided p = 2 * 1/4
    assert r.p == pytest.approx(0.5, abs=0.02)


def test_no_variance_across_seeds_is_an_examples_only_bootstrap() -> None:
    a = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])  # every seed: example 0 right, 1 wrong
    reps = mb.replicates(
        a, np.zeros((3, 2)), paired_seeds=True, paired_examples=True, n_boot=40_000
    )
    f = _freqs(reps)
    assert (f[0.0], f[0.5], f[1.0]) == pytest.approx((0.25, 0.5, 0.25), abs=0.01)


def test_joint_resampling_matches_exact_enumeration() -> None:
    # every ordered draw of 2 seeds and 2 examples (4 x 4 equally likely), paired seeds and examples
    a = np.array([[1.0, 0.0], [1.0, 1.0]])
    b = np.array([[0.0, 0.0], [0.0, 1.0]])
    exact: dict[float, float] = {}
    for s in itertools.product(range(2), repeat=2):
        for e in itertools.product(range(2), repeat=2):
            d = a[np.ix_(s, e)].mean() - b[np.ix_(s, e)].mean()
            exact[round(d, 9)] = exact.get(round(d, 9), 0.0) + 1 / 16
    reps = mb.replicates(a, b, paired_seeds=True, paired_examples=True, n_boot=64_000, seed=2)
    got = _freqs(reps)
    assert set(got) == set(exact)
    for k, p in exact.items():
        assert got[k] == pytest.approx(p, abs=0.01), k
    assert mb.multi_bootstrap(a, b, paired_seeds=True, paired_examples=True).estimate == 0.5


def test_pairing_removes_shared_noise() -> None:
    rng = np.random.default_rng(0)
    a = (rng.random((6, 30)) < 0.7).astype(float)
    paired = mb.multi_bootstrap(a, a, paired_seeds=True, paired_examples=True, n_boot=500)
    assert (paired.estimate, paired.low, paired.high, paired.p) == (0.0, 0.0, 0.0, 1.0)
    apart = mb.multi_bootstrap(a, a, paired_seeds=False, paired_examples=False, n_boot=500)
    assert apart.low < 0 < apart.high and apart.p > 0.2


def test_splits_with_different_example_counts_resample_apart() -> None:
    a = np.ones((4, 10))
    b = np.zeros((4, 7))
    r = mb.multi_bootstrap(a, b, paired_seeds=True, paired_examples=False, n_boot=200)
    assert (r.estimate, r.low, r.high, r.p) == (1.0, 1.0, 1.0, 0.0)
    with pytest.raises(AnalysisError, match="paired examples"):
        mb.replicates(a, b, paired_seeds=True, paired_examples=True)
    with pytest.raises(AnalysisError, match="paired seeds"):
        mb.replicates(a, np.zeros((3, 10)), paired_seeds=True, paired_examples=True)


def test_seeded_replicates_repeat_and_center_on_the_estimate() -> None:
    rng = np.random.default_rng(4)
    a, b = rng.random((5, 40)), rng.random((5, 40))
    one = mb.replicates(a, b, paired_seeds=True, paired_examples=True, n_boot=300, seed=9)
    again = mb.replicates(a, b, paired_seeds=True, paired_examples=True, n_boot=300, seed=9)
    assert np.array_equal(one, again)
    assert abs(one.mean() - (a.mean() - b.mean())) < 0.02
