"""Shah et al.'s slab data: sizes, margins, slab layouts, noise, rotation, determinism, the
randomized test sets' construction, and the AUC against hand cases."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from trainables.errors import ConfigError
from trainables.registry import TASKS
from trainables.spec import RunSpec
from trainables.tasks.simplicity import (
    Slabs,
    SlabsConfig,
    auc_shares,
    canonical_data,
    linear_block,
    margins,
    slab5_block,
    slab7_block,
    slab_width,
)

SMALL = {"dim": 8, "n_train": 3000, "n_test": 1000}


def _task(**kw: object) -> Slabs:
    return Slabs(SlabsConfig(**{**SMALL, **kw}))  # type: ignore[arg-type]


def _intervals(values: np.ndarray, gap: float = 0.01) -> list[tuple[float, float]]:
    """The support of |values| as maximal runs with gaps > ``gap`` between them."""
    v = np.sort(np.abs(values))
    cut = np.flatnonzero(np.diff(v) > gap)
    starts, ends = np.r_[0, cut + 1], np.r_[cut, len(v) - 1]
    return [
        (round(float(v[s]), 2), round(float(v[e]), 2)) for s, e in zip(starts, ends, strict=True)
    ]


def test_registered() -> None:
    assert TASKS.get("slabs") is Slabs


@pytest.mark.parametrize(
    ("block", "pos", "neg"),
    [
        # margin 0.1 in [-1, 1]: the linear block keeps |x| >= 0.1 with its sign = the label
        (linear_block, [(0.1, 1.0)], [(0.1, 1.0)]),
        # 5-slab: width 0.24; negatives centre [0, 0.12] and outer [0.76, 1], positives [0.32, 0.56]
        (slab5_block, [(0.32, 0.56)], [(0.0, 0.12), (0.76, 1.0)]),
        # 7-slab: width 0.8/7; positives [0.257, 0.371] and [0.886, 1]; negatives [0, 0.057], [0.571, 0.686]
        (slab7_block, [(0.26, 0.37), (0.89, 1.0)], [(0.0, 0.06), (0.57, 0.69)]),
    ],
)
def test_blocks_keep_their_slabs_and_margins(
    block: Callable[..., Any], pos: list, neg: list
) -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 40_000)
    x = block(y, 0.1, rng, 2)
    assert x.shape == (40_000, 2) and np.abs(x).max() <= 1.0
    for c in range(2):
        assert _intervals(x[y == 1, c]) == pos
        assert _intervals(x[y == 0, c]) == neg
    if block is linear_block:
        assert np.array_equal(np.sign(x[:, 0]) > 0, y == 1)
    else:  # both signs of every slab are used, evenly
        assert abs((x[:, 0] > 0).mean() - 0.5) < 0.02
    # opposite classes never come closer than 2 * margin on a coordinate (signed values)
    a, b = np.sort(x[y == 1, 0]), np.sort(x[y == 0, 0])
    i = np.clip(np.searchsorted(b, a), 1, len(b) - 1)
    nearest = np.minimum(np.abs(a - b[i - 1]), np.abs(a - b[i])).min()
    assert 0.2 - 1e-9 <= nearest < 0.201


def test_slab_probabilities_follow_gendata() -> None:
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 100_000)
    x5, x7 = slab5_block(y, 0.1, rng)[:, 0], slab7_block(y, 0.1, rng)[:, 0]
    w5, w7 = slab_width(5, 0.1), slab_width(7, 0.1)
    assert abs((np.abs(x5[y == 0]) <= w5 / 2).mean() - 0.75) < 0.01  # slab5_pval: centre
    assert abs((np.abs(x7[y == 1]) < 0.5).mean() - 0.875) < 0.01  # slab7_pval: inner slabs
    assert abs((np.abs(x7[y == 0]) <= w7 / 2).mean() - 0.5) < 0.01


def test_linear_noise_moves_a_fixed_count_into_the_margin() -> None:
    rng = np.random.default_rng(2)
    x, y = canonical_data("lms7", 10_000, 5, 0.1, 0.1, rng)
    inside = np.abs(x[:, 0]) < 0.1
    assert inside.sum() == 1000  # round(N * 0.1), drawn without replacement
    assert abs((np.sign(x[inside, 0]) > 0).mean() - 0.5) < 0.05  # label-free there
    assert np.array_equal(np.sign(x[~inside, 0]) > 0, y[~inside] == 1)
    # S alone: right on the clean 90%, a coin on the noisy 10% -> at most ~95%
    assert 0.93 < ((x[:, 0] > 0) == (y == 1)).mean() < 0.97


def test_layouts_sizes_and_roles() -> None:
    for dataset, s_block in [("lms5", "linear"), ("ms57", "slab5"), ("lms7", "linear")]:
        data = _task(dataset=dataset).build(3)
        assert {n: (s.role, len(s)) for n, s in data.splits.items()} == {
            "train": ("train", 3000), "train_eval": ("val", 3000), "test": ("test", 1000),
            "test_s_rand": ("test", 1000), "test_sc_rand": ("test", 1000),
        }  # fmt: skip
        assert data.meta["input_shape"] == (8,) and data.meta["n_classes"] == 2
        w = data.meta["rotation"]
        assert np.allclose(w @ w.T, np.eye(8), atol=1e-10)
        x_c = data.splits["test"].data.x.astype(np.float64) @ w.T  # canonical coordinates
        y = data.splits["test"].data.y
        s_intervals = _intervals(x_c[y == 1, 0], gap=0.05)  # 2 * margin = 0.2 between slabs
        assert s_intervals == ([(0.1, 1.0)] if s_block == "linear" else [(0.32, 0.56)])
        assert _task(dataset=dataset).split_roles() == {n: s.role for n, s in data.splits.items()}


def test_rotation_hides_the_coordinates_and_is_off_on_request() -> None:
    rotated, plain = _task().build(4), _task(rotate=False).build(4)
    x_r, x_p = rotated.splits["test"].data.x, plain.splits["test"].data.x
    assert np.allclose(x_r.astype(np.float64) @ rotated.meta["rotation"].T, x_p, atol=1e-5)
    assert np.abs(np.corrcoef(x_r[:, 0], rotated.splits["test"].data.y)[0, 1]) < 0.9


def test_deterministic_in_the_data_seed() -> None:
    a, b, c = _task().build(7), _task().build(7), _task().build(8)
    for name in a.splits:
        assert np.array_equal(a.splits[name].data.x, b.splits[name].data.x)
        assert np.array_equal(a.splits[name].data.y, b.splits[name].data.y)
    assert not np.array_equal(a.splits["train"].data.x, c.splits["train"].data.x)
    assert a.splits["train_eval"].data is a.splits["train"].data  # the training set itself


def test_randomized_test_sets_permute_one_block_across_examples() -> None:
    data = _task(dataset="ms57").build(5)
    w = data.meta["rotation"]
    canon = {
        n: data.splits[n].data.x.astype(np.float64) @ w.T
        for n in ("test", "test_s_rand", "test_sc_rand")
    }
    y = data.splits["test"].data.y
    std, s_rand, sc_rand = canon["test"], canon["test_s_rand"], canon["test_sc_rand"]
    assert np.array_equal(data.splits["test_s_rand"].data.y, y)  # labels stay with their example
    assert np.array_equal(data.splits["test_sc_rand"].data.y, y)
    # S-randomized: the S^c block untouched, S a permutation of S across examples
    assert np.allclose(s_rand[:, 1:], std[:, 1:], atol=1e-5)
    order = np.argsort(std[:, 0])
    assert np.allclose(np.sort(s_rand[:, 0]), std[order, 0], atol=1e-5)
    assert not np.allclose(s_rand[:, 0], std[:, 0], atol=1e-3)
    # S^c-randomized: S untouched, all 7 complex coordinates from ONE other example
    assert np.allclose(sc_rand[:, 0], std[:, 0], atol=1e-5)
    dist = np.abs(sc_rand[:, None, 1:] - std[None, :, 1:]).max(axis=2)  # (n, n)
    source = dist.argmin(axis=1)
    assert np.allclose(dist[np.arange(len(y)), source], 0, atol=1e-4)
    assert np.array_equal(np.sort(source), np.arange(len(y)))  # a permutation
    assert (source != np.arange(len(y))).mean() > 0.99
    # randomizing S breaks its link to the label; randomizing S^c breaks theirs
    assert abs(((s_rand[:, 0] > 0.3) & (s_rand[:, 0] < 0.6)).mean() - 0.25) < 0.05
    pos_slab = (np.abs(std[:, 0]) > 0.3) & (np.abs(std[:, 0]) < 0.6)
    assert np.array_equal(pos_slab, y == 1)
    rand_slab = (np.abs(s_rand[:, 0]) > 0.3) & (np.abs(s_rand[:, 0]) < 0.6)
    assert 0.35 < (rand_slab == (y == 1)).mean() < 0.65


def test_auc_shares_mean_is_the_mann_whitney_auc() -> None:
    scores = np.array([0.1, 0.4, 0.35, 0.8, 0.8])
    labels = np.array([0, 0, 1, 1, 0])
    # positives 0.35 (beats 0.1: 1 of 3) and 0.8 (beats 0.1, 0.4, ties 0.8: 2.5 of 3)
    assert auc_shares(scores, labels).mean() == pytest.approx((1 + 2.5) / 6)
    assert auc_shares([3.0, 2.0, 1.0], [1, 1, 0]).mean() == pytest.approx(1.0)
    assert auc_shares([1.0, 2.0, 3.0], [1, 1, 0]).mean() == pytest.approx(0.0)
    assert auc_shares([1.0, 1.0, 1.0, 1.0], [1, 0, 1, 0]).mean() == pytest.approx(0.5)
    assert np.isnan(auc_shares([1.0, 2.0], [1, 1])).all()
    rng = np.random.default_rng(0)
    s, y = rng.normal(size=500), rng.integers(0, 2, 500)
    brute = np.mean([(a > b) + 0.5 * (a == b) for a in s[y == 1] for b in s[y == 0]])
    assert auc_shares(s, y).mean() == pytest.approx(brute)


def test_margins_are_the_logit_difference() -> None:
    logits = np.array([[0.0, 3.0], [2.0, -1.0], [0.0, 40.0]])
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    assert np.allclose(margins(probs.astype(np.float32)), [3.0, -3.0, 40.0], atol=1e-4)


def test_score_and_render() -> None:
    task = _task()
    data = task.build(0)
    split = data.splits["test"]
    y = split.data.y
    perfect = [
        np.array([0.1, 0.9], np.float32) if t else np.array([0.8, 0.2], np.float32) for t in y
    ]
    s = task.score(split, perfect)
    assert s["accuracy"].mean() == 1.0 and s["auc"].mean() == pytest.approx(1.0)
    assert float(task.render(split, np.array([0.2, 0.8], np.float32))) == pytest.approx(
        np.log(4.0), rel=1e-6
    )
    with pytest.raises(ValueError, match="probability vectors"):
        task.score(split, [int(t) for t in y])


def test_bad_configs_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"task\.margin.*below 0\.25"):
        SlabsConfig(dataset="lms5", margin=0.3)
    with pytest.raises(ConfigError, match=r"task\.margin.*below 0\.1667"):
        SlabsConfig(dataset="lms7", margin=0.2)
    with pytest.raises(ConfigError, match=r"task\.linear_noise.*no linear coordinate"):
        SlabsConfig(dataset="ms57", linear_noise=0.1)
    with pytest.raises(ConfigError, match=r"task\.dataset"):
        RunSpec.from_dict({"task": {"name": "slabs", "dataset": "lms3"}, "model": {"name": "mlp"}})


def test_converged_accuracy_follows_the_notebooks() -> None:
    assert SlabsConfig(dataset="lms5").threshold == pytest.approx(0.9999)
    assert SlabsConfig(dataset="lms7").threshold == pytest.approx(0.995)
    assert SlabsConfig(dataset="lms7", converged_accuracy=0.99).threshold == 0.99
    (event,) = _task(dataset="ms57").analysis()["events"]
    assert event == {"name": "converges", "split": "train_eval", "metric": "accuracy", "op": ">=",
                     "threshold": pytest.approx(0.9999)}  # fmt: skip
