"""Xu et al.'s XOR cluster data and the two-layer ReLU network with a fixed second layer."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from trainables.errors import ConfigError
from trainables.loop import BundleRun
from trainables.models.classify import make_classify_batch
from trainables.models.two_layer import TwoLayerReLU, TwoLayerReLUConfig
from trainables.registry import MODELS, TASKS
from trainables.seeding import derive_seedset, torch_generator
from trainables.spec import RunSpec
from trainables.tasks.xor_cluster import XorCluster, XorClusterConfig, xor_clusters


def test_registered() -> None:
    assert TASKS.get("xor_cluster") is XorCluster
    assert MODELS.get("two_layer_relu") is TwoLayerReLU


def test_clusters_labels_and_flips() -> None:
    rng = np.random.default_rng(0)
    x, y, clean = xor_clusters(40_000, 50, 6.0, 0.2, rng)
    assert x.shape == (40_000, 50) and y.dtype == np.int64
    # the clean label is 1 exactly for the +-mu1 clusters: |x_1| large, x_2 noise
    on_axis1 = np.abs(x[:, 0]) > np.abs(x[:, 1])
    assert (on_axis1 == (clean == 1)).mean() > 0.99
    for axis, label in ((0, 1), (1, 0)):  # each mean: +mu and -mu equally often, norm mu_norm
        sel = clean == label
        assert abs(np.abs(x[sel, axis]).mean() - 6.0) < 0.05
        assert abs((x[sel, axis] > 0).mean() - 0.5) < 0.02
        assert abs(x[sel, 1 - axis].std() - 1.0) < 0.02  # the other mean coordinate is noise
    assert abs(x[:, 2:].std() - 1.0) < 0.01 and abs(x[:, 2:].mean()) < 0.01
    assert abs((y != clean).mean() - 0.2) < 0.01  # flips at rate eta
    assert abs(clean.mean() - 0.5) < 0.01
    # XOR: no linear direction separates the clean classes (the class means are both 0)
    assert np.abs(x[clean == 1, :2].mean(axis=0)).max() < 0.1
    assert np.abs(x[clean == 0, :2].mean(axis=0)).max() < 0.1


def test_splits_sizes_determinism() -> None:
    task = XorCluster(XorClusterConfig(dim=30, n_train=64, n_test=200, flip=0.25, mu_norm=5.0))
    a, b, c = task.build(1), task.build(1), task.build(2)
    assert {n: (s.role, len(s)) for n, s in a.splits.items()} == {
        "train": ("train", 64),
        "test": ("test", 200),
    }
    assert task.split_roles() == {"train": "train", "test": "test"}
    assert a.meta["input_shape"] == (30,) and a.meta["n_classes"] == 2
    for name in a.splits:
        assert np.array_equal(a.splits[name].data.x, b.splits[name].data.x)
        assert np.array_equal(a.splits[name].data.y, b.splits[name].data.y)
    assert not np.array_equal(a.splits["train"].data.x, c.splits["train"].data.x)
    # test labels are clean: the XOR rule of the cluster coordinates; train has the flips
    for split, flips in (("test", 0), ("train", len(a.meta["flipped"]))):
        d = a.splits[split].data
        rule = (np.abs(d.x[:, 0]) > np.abs(d.x[:, 1])).astype(np.int64)
        assert (rule != d.y).sum() == pytest.approx(flips, abs=3)
    assert 5 <= len(a.meta["flipped"]) <= 28


def test_bad_configs_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"task\.flip"):
        RunSpec.from_dict(
            {"task": {"name": "xor_cluster", "flip": 0.5}, "model": {"name": "two_layer_relu"}}
        )
    with pytest.raises(ConfigError, match=r"model\.init_std"):
        RunSpec.from_dict(
            {"task": {"name": "xor_cluster"}, "model": {"name": "two_layer_relu", "init_std": 0}}
        )


def test_two_layer_network_is_the_papers() -> None:
    cfg = TwoLayerReLUConfig(width=5, init_std=0.5)
    model = TwoLayerReLU(cfg, {"input_shape": (3,), "n_classes": 2}, k=2)
    for k in range(2):
        model.init_member(k, torch_generator(k))
    assert [n for n, _ in model.named_parameters()] == ["weight"]  # the second layer is fixed
    a = model.output
    assert torch.allclose(a, torch.tensor([1, 1, 1, -1, -1]) / math.sqrt(5))
    w = model.weight.detach()
    x = torch.randn(4, 3)
    batch = make_classify_batch(_arrays(x.numpy()), [np.arange(4)] * 2, "cpu")
    logits = model(batch)
    f = torch.relu(torch.einsum("bi,kmi->kbm", x, w)) @ a  # (K, B)
    assert torch.allclose(logits, torch.stack([-f / 2, f / 2], -1), atol=1e-6)
    # cross-entropy of the logits = the logistic loss log(1 + exp(-y' f)), y' = 2y - 1
    y = torch.tensor([0, 1, 1, 0])
    ce = F.cross_entropy(logits[0], y, reduction="none")
    assert torch.allclose(ce, F.softplus(-(2 * y - 1) * f[0]), atol=1e-6)
    # init N(0, init_std^2), per member from its own generator
    big = TwoLayerReLU(
        TwoLayerReLUConfig(width=400, init_std=0.5), {"input_shape": (100,), "n_classes": 2}, 1
    )
    big.init_member(0, torch_generator(3))
    w_big = big.weight.detach()
    assert abs(float(w_big.std()) - 0.5) < 0.01 and abs(float(w_big.mean())) < 0.01
    with pytest.raises(ConfigError, match=r"model\.name"):
        TwoLayerReLU(cfg, {"input_shape": (3,), "n_classes": 3}, 1)


def _arrays(x: np.ndarray):  # type: ignore[no-untyped-def]
    from trainables.data import Arrays

    return Arrays(x=x.astype(np.float32), y=np.zeros(len(x), np.int64), ids=np.arange(len(x)))


def test_one_gradient_step_fits_the_flips_and_later_generalizes(torch_threads: None) -> None:
    """The paper's picture on a small instance: after step 1 every training label (flips
    included) is fit while test accuracy is near chance; later the test accuracy is high."""
    spec = RunSpec.from_dict({
        "task": {"name": "xor_cluster", "dim": 1500, "mu_norm": 12.0, "flip": 0.1, "n_train": 40,
                 "n_test": 400},
        "model": {"name": "two_layer_relu", "width": 100, "init_std": 1e-4},
        "train": {"optimizer": "sgd", "lr": 1.0, "batch_size": 40, "loss_reduction": "mean",
                  "max_steps": 100, "eval_every_steps": 1, "curve_splits": ["train", "test"],
                  "selection": {"mode": "last", "early_stop": False}},
    })  # fmt: skip
    seeds = [derive_seedset(0, i, vary=("init",)) for i in range(4)]
    task = spec.make_task()
    run = BundleRun(spec, seeds, task, task.build(seeds[0].data_seed))
    while not run.done:
        run.train_round()
    curves = [
        {(r["split"], r["step"]): r["value"] for r in m.metrics if r["metric"] == "accuracy"}
        for m in run.members
    ]
    fits_at_1 = [c[("train", 1)] == 1.0 for c in curves]
    test_at_1 = [c[("test", 1)] for c in curves]
    assert sum(fits_at_1) >= 3 and max(test_at_1) < 0.65, (fits_at_1, test_at_1)
    final = [c[("test", 100)] for c in curves]
    assert min(c[("train", 100)] for c in curves) == 1.0  # still fits every flipped label
    assert min(f - t for f, t in zip(final, test_at_1, strict=True)) > 0.1, (test_at_1, final)
