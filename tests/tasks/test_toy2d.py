"""2-D toy task: sample distribution, splits, grid, metrics."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trainables.errors import ConfigError
from trainables.registry import TASKS
from trainables.tasks.toy2d import Toy2D, Toy2DConfig


def _factors(x: np.ndarray) -> np.ndarray:
    """(Y1, Y2) recovered from X = Y - U with U in [0, 1): Y = ceil(X)."""
    return np.ceil(x).astype(np.int64)


@pytest.fixture(scope="module")
def task() -> Toy2D:
    return Toy2D(Toy2DConfig())


def test_registered():
    assert TASKS.get("toy2d") is Toy2D


def test_training_distribution(task: Toy2D):
    data = task.build(data_seed=0)
    s = task.sample_train(data, np.random.default_rng(1), 30_000)
    assert s.x.shape == (30_000, 2) and s.x.dtype == np.float32 and s.y.dtype == np.int64
    factors = _factors(s.x)
    assert np.array_equal(factors[:, 0], s.y)
    combos, counts = np.unique(factors, axis=0, return_counts=True)
    assert combos.tolist() == [[0, 0], [0, 1], [1, 0]]  # never (1, 1)
    assert np.allclose(counts / counts.sum(), 1 / 3, atol=0.015)
    noise = factors - s.x  # U, per coordinate
    assert noise.min() >= 0.0 and noise.max() <= 1.0
    assert abs(noise.mean() - 0.5) < 0.01 and abs(noise.var() - 1 / 12) < 0.005
    assert abs(np.corrcoef(noise[:, 0], noise[:, 1])[0, 1]) < 0.03


def test_splits(task: Toy2D):
    data = task.build(data_seed=0)
    roles = {n: (s.role, len(s)) for n, s in data.splits.items()}
    assert roles == {
        "train": ("train", 3000),
        "train_eval": ("val", 1000),
        "test": ("test", 1000),
        "grid": ("test", 41 * 41),
    }
    assert data.meta == {"input_shape": (2,), "n_classes": 2}
    test = data.splits["test"].data
    assert (_factors(test.x) == 1).all() and (test.y == 1).all()
    train_eval = _factors(data.splits["train_eval"].data.x)
    assert not (train_eval == 1).all(axis=1).any()


def test_grid(task: Toy2D):
    grid = task.decision_grid()
    assert grid.x.shape == (1681, 2)
    axis = np.linspace(-1, 1, 41)
    i1, i2 = 7, 30
    assert np.allclose(grid.x[i1 * 41 + i2], [axis[i1], axis[i2]])
    assert grid.x.min() == -1.0 and grid.x.max() == 1.0
    assert np.array_equal(grid.y, (grid.x[:, 0] > 0).astype(np.int64))  # the true Y1 rule
    decl = json.loads(json.dumps(task.analysis()))  # pure data
    assert decl["decision_boundary"]["grid"] == [-1.0, 1.0, 41]
    assert decl["decision_boundary"]["split"] == "grid"
    named = {a[0] for a in decl["scatter"]} | {h["split"] for h in decl["histograms"]}
    assert named | set(decl["test_splits"]) <= set(task.build(data_seed=0).splits)


def test_determinism(task: Toy2D):
    a, b, c = (task.build(data_seed=s) for s in (5, 5, 6))
    for name in ("train", "train_eval", "test"):
        assert np.array_equal(a.splits[name].data.x, b.splits[name].data.x)
        assert not np.array_equal(a.splits[name].data.x, c.splits[name].data.x)
    s1, s2 = (task.sample_train(a, np.random.default_rng(3), 10) for _ in range(2))
    assert np.array_equal(s1.x, s2.x)


def test_scores(task: Toy2D):
    data = task.build(data_seed=0)
    split, grid = data.splits["train_eval"], data.splits["grid"]
    right = [np.array([1 - c, c], dtype=np.float32) for c in split.data.y]
    assert task.score(split, right)["accuracy"].mean() == 1.0
    assert task.score(split, [1 - int(c) for c in split.data.y])["accuracy"].mean() == 0.0
    p = np.linspace(0, 1, len(grid))
    scored = task.score(grid, [np.array([1 - q, q]) for q in p])
    assert set(scored) == {"accuracy", "p_y1"} and np.allclose(scored["p_y1"], p)
    x1_rule = [
        np.array([1.0, 0.0]) if x1 <= 0 else np.array([0.0, 1.0]) for x1 in grid.data.x[:, 0]
    ]
    assert task.score(grid, x1_rule)["accuracy"].mean() == 1.0
    x2_rule = [
        np.array([1.0, 0.0]) if x2 <= 0 else np.array([0.0, 1.0]) for x2 in grid.data.x[:, 1]
    ]
    assert task.score(grid, x2_rule)["accuracy"].mean() == pytest.approx(
        (20 * 20 + 21 * 21) / 41**2
    )  # agree when both > 0 or both <= 0
    assert task.render(grid, np.array([0.25, 0.75])) == "0.750000"
    assert task.render(split, np.array([0.25, 0.75])) == "1 (p=0.750)"
    with pytest.raises(ValueError, match="probability"):
        task.score(grid, [0] * len(grid))


def test_bad_config():
    with pytest.raises(ConfigError, match=r"task\.grid"):
        Toy2DConfig(grid=(1.0, -1.0, 41))
    with pytest.raises(ConfigError, match=r"task\.n_eval"):
        Toy2DConfig(n_eval=0)
