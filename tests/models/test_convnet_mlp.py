"""Bundled convnet and MLP: init, equivalence with plain torch modules and with lone runs."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from trainables.data import Arrays
from trainables.errors import ConfigError
from trainables.models.classify import ClassifyBatch, classify_losses
from trainables.models.convnet import ConvNet, ConvNetConfig
from trainables.models.mlp import MLP, MLPConfig
from trainables.registry import MODELS
from trainables.seeding import torch_generator
from trainables.tasks.mnist_pairs import MnistPairs, MnistPairsConfig
from trainables.tasks.toy2d import Toy2D, Toy2DConfig

IMAGE_META = {"input_shape": (1, 28, 56), "n_classes": 10}
SMALL_IMAGE_META = {"input_shape": (1, 12, 16), "n_classes": 5}
SMALL_CONV = ConvNetConfig(channels=(4, 6), hidden=(16, 12))
SEEDS = (11, 22, 33)


def build(cls: type, config, meta: dict, seeds: Sequence[int]):
    model = cls(config, meta, len(seeds))
    for i, s in enumerate(seeds):
        model.init_member(i, torch_generator(s))
    return model


def random_arrays(meta: dict, n: int, seed: int) -> Arrays:
    rng = np.random.default_rng(seed)
    x = rng.random((n, *meta["input_shape"]), dtype=np.float32)
    return Arrays(x=x, y=rng.integers(0, meta["n_classes"], n), ids=np.arange(n))


def reference(model: ConvNet | MLP) -> nn.Sequential:
    """A plain nn.Sequential of the same architecture (default torch init)."""
    cfg, meta = model.config, model.meta
    layers: list[nn.Module] = []
    if isinstance(model, ConvNet):
        c_in, (c1, c2) = meta["input_shape"][0], cfg.channels
        layers += [
            nn.Conv2d(c_in, c1, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3),
            nn.ReLU(),
        ]
        sizes = [model.weights[0].shape[2], *cfg.hidden, meta["n_classes"]]
    else:
        sizes = [int(np.prod(meta["input_shape"])), *cfg.hidden, meta["n_classes"]]
    layers.append(nn.Flatten())
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        layers += [nn.Linear(n_in, n_out)] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
    return nn.Sequential(*layers)


def bundle_params(model: ConvNet | MLP) -> list[torch.Tensor]:
    """The bundle's parameters in the order an nn.Sequential lists its own."""
    convs = (
        [model.conv1_w, model.conv1_b, model.conv2_w, model.conv2_b]
        if isinstance(model, ConvNet)
        else []
    )
    dense = [p for pair in zip(model.weights, model.biases, strict=True) for p in pair]
    return convs + dense


def reference_of_member(model: ConvNet | MLP, member: int) -> nn.Sequential:
    seq = reference(model)
    with torch.no_grad():
        for p, q in zip(seq.parameters(), bundle_params(model), strict=True):
            p.copy_(q[member])
    return seq


def assert_close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-5) -> None:
    scale = max(float(b.abs().max()), 1e-12)
    assert float((a - b).abs().max()) <= rel * scale, (float((a - b).abs().max()), scale)


CASES = [
    pytest.param(ConvNet, ConvNetConfig(), IMAGE_META, id="convnet-paper"),
    pytest.param(
        ConvNet,
        ConvNetConfig(init="keras", loss="cross_entropy"),
        SMALL_IMAGE_META,
        id="convnet-keras",
    ),
    pytest.param(MLP, MLPConfig(), {"input_shape": (2,), "n_classes": 2}, id="mlp-toy"),
    pytest.param(MLP, MLPConfig(hidden=(7, 5), loss="hinge"), SMALL_IMAGE_META, id="mlp-image"),
    pytest.param(ConvNet, ConvNetConfig(conv_impl="grouped"), IMAGE_META, id="convnet-grouped"),
]


def test_registered():
    assert MODELS.get("convnet") is ConvNet and MODELS.get("mlp") is MLP


@pytest.mark.parametrize(("cls", "config", "meta"), [CASES[0], CASES[2]])
def test_torch_init_equals_torch_default_modules(cls, config, meta):
    lone = build(cls, config, meta, [5])
    with torch.random.fork_rng():
        torch.manual_seed(5)
        seq = reference(lone)
    for p, q in zip(seq.parameters(), bundle_params(lone), strict=True):
        assert torch.equal(p.detach(), q.detach()[0])


def test_keras_init_is_glorot_uniform_with_zero_bias():
    model = build(ConvNet, ConvNetConfig(init="keras"), IMAGE_META, [1])
    for w, b in zip(bundle_params(model)[::2], bundle_params(model)[1::2], strict=True):
        w = w.detach()[0]
        receptive = w[0, 0].numel() if w.dim() > 2 else 1
        limit = (6.0 / ((w.shape[0] + w.shape[1]) * receptive)) ** 0.5
        assert w.abs().max() <= limit and w.abs().max() > 0.9 * limit
        assert not b.detach().any()


@pytest.mark.parametrize(("cls", "config", "meta"), CASES)
def test_bundle_members_init_like_lone_models(cls, config, meta):
    bundle = build(cls, config, meta, SEEDS)
    for i, s in enumerate(SEEDS):
        lone = build(cls, config, meta, [s])
        for name, value in lone.member_state(0).items():
            assert torch.equal(bundle.member_state(i)[name], value), name


@pytest.mark.parametrize(("cls", "config", "meta"), CASES)
def test_outputs_and_grads_equal_plain_sequential(cls, config, meta):
    model = build(cls, config, meta, SEEDS[:2])
    data = random_arrays(meta, 40, seed=0)
    rows = [np.arange(0, 6), np.arange(20, 26)]
    batch = model.make_batch(data, rows, torch.device("cpu"))
    logits = model(batch)
    model.loss(batch, None, "mean").sum().backward()
    for k in range(2):
        seq = reference_of_member(model, k)
        x = torch.from_numpy(data.x[rows[k]])
        ref_logits = seq(x)
        assert_close(logits[k].detach(), ref_logits.detach())
        y = torch.from_numpy(data.y[rows[k]])
        classify_losses(ref_logits[None], y[None], config.loss).mean().backward()
        for p, q in zip(seq.parameters(), bundle_params(model), strict=True):
            assert_close(q.grad[k], p.grad)


def _train(model, data: Arrays, schedule: list[list[np.ndarray]], clip: float) -> None:
    """The trainer's generic step: summed member losses, per-member clipping, Adam."""
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, foreach=False)
    for rows in schedule:
        batch = model.make_batch(data, rows, torch.device("cpu"))
        opt.zero_grad()
        model.loss(batch, None, "mean").sum().backward()
        params = list(model.parameters())
        norms = torch.sqrt(sum(p.grad.flatten(1).pow(2).sum(1) for p in params))  # (K,)
        coef = torch.clamp(clip / (norms + 1e-6), max=1.0)
        for p in params:
            p.grad.mul_(coef.view(-1, *[1] * (p.dim() - 1)))
        opt.step()


@pytest.mark.parametrize(
    ("cls", "config", "meta"),
    [
        pytest.param(ConvNet, SMALL_CONV, SMALL_IMAGE_META, id="convnet"),
        pytest.param(MLP, MLPConfig(), {"input_shape": (2,), "n_classes": 2}, id="mlp"),
    ],
)
def test_bundle_member_equals_lone_run_after_200_adam_steps(cls, config, meta, torch_threads):
    data = random_arrays(meta, 200, seed=1)
    rng = np.random.default_rng(2)
    steps, batch = 200, 8
    schedules = [[rng.integers(0, 200, batch) for _ in range(steps)] for _ in SEEDS]  # member, step
    bundle = build(cls, config, meta, SEEDS)
    _train(bundle, data, [list(step) for step in zip(*schedules, strict=True)], clip=1.0)
    moved = 0.0
    for i, s in enumerate(SEEDS):
        lone = build(cls, config, meta, [s])
        start = lone.member_state(0)
        _train(lone, data, [[rows] for rows in schedules[i]], clip=1.0)
        for name, value in lone.member_state(0).items():
            assert_close(bundle.member_state(i)[name], value)
            moved = max(moved, float((value - start[name]).abs().max()))
    assert moved > 0.05  # training really moved the parameters


@pytest.mark.parametrize(("cls", "config", "meta"), [CASES[1], CASES[3], CASES[4]])
def test_shared_rows_batch_equals_per_member_copies(cls, config, meta):
    model = build(cls, config, meta, SEEDS)
    data = random_arrays(meta, 30, seed=3)
    rows = np.arange(5, 25)
    shared = model.make_batch(data, [rows] * 3, torch.device("cpu"))
    assert shared.x.shape[0] == 1 and shared.y.shape == (3, 20)
    copies = ClassifyBatch(x=shared.x.expand(3, *shared.x.shape[1:]).contiguous(), y=shared.y)
    with torch.no_grad():
        assert_close(model.example_losses(shared), model.example_losses(copies))
        assert_close(model(shared), model(copies))


def test_grouped_convolutions_compute_the_loop_forward():
    loop = build(ConvNet, SMALL_CONV, SMALL_IMAGE_META, SEEDS)
    grouped = ConvNet(SMALL_CONV.model_copy(update={"conv_impl": "grouped"}), SMALL_IMAGE_META, 3)
    grouped.load_state_dict(loop.state_dict())
    data = random_arrays(SMALL_IMAGE_META, 30, seed=6)
    batch = loop.make_batch(
        data, [np.arange(10), np.arange(10, 20), np.arange(20, 30)], torch.device("cpu")
    )
    with torch.no_grad():
        assert_close(grouped(batch), loop(batch))


def test_convnet_evaluates_big_batches_in_chunks():
    model = build(ConvNet, SMALL_CONV, SMALL_IMAGE_META, SEEDS)
    data = random_arrays(SMALL_IMAGE_META, 400, seed=5)
    batch = model.make_batch(data, [np.arange(400)] * 3, torch.device("cpu"))
    whole = model(batch).detach()  # with grad: one pass
    with torch.no_grad():
        chunked = model(batch)  # 400 > EVAL_CHUNK // 3 examples: two passes
    assert chunked.shape == (3, 400, 5)
    assert_close(chunked, whole)


def test_losses_reductions_and_predictions():
    model = build(MLP, MLPConfig(), SMALL_IMAGE_META, SEEDS)
    data = random_arrays(SMALL_IMAGE_META, 30, seed=4)
    batch = model.make_batch(
        data, [np.arange(10), np.arange(10, 20), np.arange(20, 30)], torch.device("cpu")
    )
    with torch.no_grad():
        ex = model.example_losses(batch)
        assert ex.shape == (3, 10)
        assert_close(model.loss(batch, None, "sum"), ex.sum(1))
        assert_close(model.loss(batch, None, "mean"), ex.mean(1))
        preds = model.predict(batch)
        logits = model(batch)
    with pytest.raises(ConfigError, match=r"train\.loss_reduction"):
        model.loss(batch, None, "token_mean")
    assert len(preds) == 3 and all(len(p) == 10 for p in preds)
    probs = np.stack([np.stack(p) for p in preds])  # (K, B, C)
    assert np.allclose(probs.sum(-1), 1.0, atol=1e-5)
    assert np.array_equal(probs.argmax(-1), logits.argmax(-1).numpy())


def test_evaluation_logits_are_cached_until_parameters_change():
    model = build(MLP, MLPConfig(), SMALL_IMAGE_META, SEEDS)
    data = random_arrays(SMALL_IMAGE_META, 20, seed=7)
    batch = model.make_batch(data, [np.arange(20)] * 3, torch.device("cpu"))
    with torch.no_grad():
        before = model.example_losses(batch)
        assert batch.cache is not None
        cached = batch.cache[1]
        model.predict(batch)
        assert batch.cache[1] is cached  # predict reused the logits
        model.weights[-1].add_(0.5)  # an in-place update, like an optimizer step
        after = model.example_losses(batch)
        fresh = classify_losses(model(batch), batch.y, "cross_entropy")
    assert not torch.equal(before, after)
    assert torch.equal(after, fresh)


def test_categorical_hinge_by_hand():
    logits = torch.tensor([[[2.0, 1.0, -1.0]] * 3 + [[-1.0, -2.0, 3.0]]])  # (1, 4, 3)
    y = torch.tensor([[0, 1, 2, 2]])
    # 1 + max wrong - true: 1+1-2 -> 0, 1+2-1 = 2, 1+2+1 = 4, 1-1-3 -> 0
    assert classify_losses(logits, y, "hinge").tolist() == [[0.0, 2.0, 4.0, 0.0]]


def test_keras_categorical_hinge_by_hand_and_against_its_formula():
    """Keras's categorical_hinge: pos = sum(onehot * z), neg = max((1 - onehot) * z),
    max(0, neg - pos + 1). Its neg is never below 0 (the true class's place holds 0), so it
    differs from ``hinge`` where every wrong-class logit is negative."""
    logits = torch.tensor([[[0.5, -1.0, -2.0], [2.0, 1.0, -1.0], [-3.0, -0.5, -0.2]]])  # (1, 3, 3)
    y = torch.tensor([[0, 1, 0]])
    # row 0: wrong all negative: hinge 1 - 1 - 0.5 -> 0 (clamped), Keras 1 + 0 - 0.5 = 0.5
    # row 1: a wrong logit >= 0: both 1 + 2 - 1 = 2; row 2: Keras 1 + 0 + 3 = 4, hinge 1 - 0.2 + 3 = 3.8
    got = classify_losses(logits, y, "categorical_hinge")
    assert torch.allclose(got, torch.tensor([[0.5, 2.0, 4.0]]))
    assert torch.allclose(classify_losses(logits, y, "hinge"), torch.tensor([[0.0, 2.0, 3.8]]))
    rng = np.random.default_rng(0)
    z = rng.normal(size=(2, 64, 10)).astype(np.float32)
    labels = rng.integers(0, 10, size=(2, 64))
    onehot = np.eye(10, dtype=np.float32)[labels]
    keras = np.maximum(0.0, ((1 - onehot) * z).max(-1) - (onehot * z).sum(-1) + 1)
    assert np.allclose(classify_losses(torch.from_numpy(z), torch.from_numpy(labels), "categorical_hinge").numpy(), keras)


def test_convnet_rejects_vector_inputs():
    with pytest.raises(ConfigError, match=r"model\.name"):
        ConvNet(ConvNetConfig(), {"input_shape": (2,), "n_classes": 2}, 1)
    with pytest.raises(ConfigError, match=r"model\.channels"):
        ConvNetConfig(channels=(0, 4))


def _fit_fresh(model, task, data, steps: int, batch: int, lr: float, seeds: Sequence[int]) -> None:
    """Train on fresh samples, each member from its own order generator."""
    rngs = [np.random.default_rng(s) for s in seeds]
    opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)
    rows = [np.arange(k * batch, (k + 1) * batch) for k in range(len(seeds))]
    for _ in range(steps):
        parts = [task.sample_train(data, rng, batch) for rng in rngs]
        fresh = Arrays(
            x=np.concatenate([p.x for p in parts]),
            y=np.concatenate([p.y for p in parts]),
            ids=np.arange(0),
        )
        opt.zero_grad()
        model.loss(
            model.make_batch(fresh, rows, torch.device("cpu")), None, "mean"
        ).sum().backward()
        opt.step()


def _evaluate(model, task, split) -> list[dict[str, np.ndarray]]:
    with torch.no_grad():
        preds = model.predict(
            model.make_batch(split.data, [np.arange(len(split))] * model.k, torch.device("cpu"))
        )
    return [task.score(split, p) for p in preds]


def test_mlp_learns_the_toy_task_and_draws_the_grid(torch_threads):
    task = Toy2D(Toy2DConfig(n_eval=500))
    data = task.build(data_seed=0)
    model = build(MLP, MLPConfig(), data.meta, SEEDS[:2])
    _fit_fresh(model, task, data, steps=300, batch=32, lr=0.01, seeds=(1, 2))
    for scores in _evaluate(model, task, data.splits["train_eval"]):
        assert scores["accuracy"].mean() > 0.95
    for scores in _evaluate(model, task, data.splits["grid"]):
        p = scores["p_y1"]
        assert p.shape == (1681,) and (p >= 0).all() and (p <= 1).all()
        assert p[0] < 0.1 and p[-1] > 0.5  # (-1, -1) is Y1 = 0 territory


@pytest.mark.slow
def test_convnet_learns_paired_mnist(shared_data: Path, torch_threads):
    task = MnistPairs(MnistPairsConfig(data_dir=str(shared_data / "mnist"), n_final=0))
    data = task.build(data_seed=0)
    model = build(ConvNet, ConvNetConfig(), data.meta, SEEDS[:2])
    _fit_fresh(model, task, data, steps=150, batch=32, lr=1e-3, seeds=(1, 2))
    for scores in _evaluate(model, task, data.splits["train_eval"]):
        assert scores["accuracy"].mean() > 0.7  # chance is 0.1
