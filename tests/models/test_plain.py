"""Plain ``nn.Module`` models bundled through ``torch.func`` (trainables.models.plain).

Real torch, real trainer: a seed's result never depends on its bundle (dropout included),
``torch.nn.Dropout`` and other random ops are refused, the member loop equals vmap, and the
``mlp_plain`` twin trains exactly like the hand-bundled ``mlp``.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from torch import nn

from trainables.configbase import FrozenConfig
from trainables.data import Arrays
from trainables.errors import ConfigError
from trainables.loop import BundleRun
from trainables.models.base import MemberNoise
from trainables.models.classify import make_classify_batch
from trainables.models.mlp_plain import MLPPlain, MLPPlainConfig
from trainables.models.plain import Dropout, PlainClassifier, PlainClassifierConfig
from trainables.registry import TASKS
from trainables.seeding import derive_seedset, torch_generator
from trainables.spec import RunSpec

TOY_TASK = {"name": "toy2d", "n_train": 64, "n_eval": 64, "grid": (-1.0, 1.0, 5)}
TOY_TRAIN = {
    "optimizer": "adam", "lr": 0.01, "batch_size": 16, "loss_reduction": "mean",
    "max_steps": 30, "eval_every_steps": 10,
    "selection": {"split": "train_eval", "metric": "accuracy"},
}
META = {"input_shape": (2,), "n_classes": 2}


@pytest.fixture(autouse=True)
def _one_thread(torch_threads: None) -> None:
    """One torch thread, as in a trial."""


def toy_spec(model: dict[str, Any], **train: Any) -> RunSpec:
    return RunSpec.from_dict({"task": TOY_TASK, "model": model, "train": {**TOY_TRAIN, **train}})


def steps_spec(model: dict[str, Any], steps: int = 200) -> RunSpec:
    return toy_spec(model, max_steps=steps, eval_every_steps=steps,
                    selection={"mode": "last", "early_stop": False})


def train(spec: RunSpec, indices: list[int]) -> BundleRun:
    seeds = [derive_seedset(11, i) for i in indices]
    task = TASKS.get(spec.task_name)(spec.task)
    run = BundleRun(spec, seeds, task, task.build(seeds[0].data_seed))
    while not run.done:
        run.train_round()
    return run


def member(run: BundleRun, row: int) -> dict[str, torch.Tensor]:
    return run.model.member_state(row)


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=0, atol=atol), (name, (a[name] - b[name]).abs().max())


def evals(run: BundleRun, k: int) -> dict[tuple[str, str], float]:
    return {(r["split"], r["metric"]): r["value"] for r in run.finalize()[k]["evals"]}


# --- init -------------------------------------------------------------------------------


def test_member_k_starts_as_torch_manual_seed_then_the_module_and_global_rng_is_untouched() -> None:
    cfg = MLPPlainConfig(hidden=(5, 4))
    model = MLPPlain(cfg, META, 3)
    before = torch.random.get_rng_state()
    for k, seed in enumerate((7, 8, 9)):
        model.init_member(k, torch_generator(seed))
    assert torch.equal(torch.random.get_rng_state(), before)
    torch.manual_seed(8)
    reference = model.build_module(cfg, META)
    torch.random.set_rng_state(before)
    assert_same({f"net.{n}": p.detach() for n, p in reference.state_dict().items()}, member_of(model, 1), atol=0)
    assert not torch.equal(model.net[1].weight[0], model.net[1].weight[1])


def member_of(model: torch.nn.Module, k: int) -> dict[str, torch.Tensor]:
    return model.member_state(k)  # type: ignore[operator, no-any-return]


# --- a seed's result never depends on its bundle -----------------------------------------


def test_bundle_member_equals_lone_run_after_200_steps_with_dropout() -> None:
    spec = steps_spec({"name": "mlp_plain", "hidden": (8, 8), "dropout": 0.3})
    bundle = train(spec, [0, 1, 2])
    assert bundle.model.bundling == "vmap"
    for k in range(3):
        assert_same(member(bundle, k), member(train(spec, [k]), 0))
    no_dropout = train(steps_spec({"name": "mlp_plain", "hidden": (8, 8)}), [0])
    diff = (member(bundle, 0)["net.1.weight"] - member(no_dropout, 0)["net.1.weight"]).abs().max()
    assert diff > 1e-3, "dropout 0.3 should change training"


def test_the_same_seed_in_any_bundle_gets_the_same_parameters() -> None:
    spec = steps_spec({"name": "mlp_plain", "hidden": (8, 8), "dropout": 0.2}, steps=100)
    runs = {(0, 1, 2): 2, (2,): 0, (5, 2): 1}
    states = [member(train(spec, list(seeds)), row) for seeds, row in runs.items()]
    for other in states[1:]:  # bit-identical on a CPU: every K runs the same vmapped kernels
        assert_same(states[0], other, atol=0)


# --- refusals ----------------------------------------------------------------------------


class _Net(nn.Module):
    """A small classifier body; ``noise`` picks how it (wrongly or rightly) adds noise."""

    def __init__(self, noise: str) -> None:
        super().__init__()
        drop: nn.Module = nn.Dropout(0.5) if noise == "nn.Dropout" else Dropout(0.5)
        self.body = nn.Sequential(nn.Linear(2, 6), drop, nn.ReLU())
        self.head = nn.Linear(6, 2)
        self.noise = noise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        if self.noise == "randn":
            h = h + torch.randn_like(h)
        return self.head(h)


class _NoisyConfig(PlainClassifierConfig):
    noise: str = "plain"
    """How the module adds noise."""


class _Noisy(PlainClassifier):
    name: ClassVar[str] = "noisy_test_net"
    Config: ClassVar[type[FrozenConfig]] = _NoisyConfig

    def build_module(self, config: FrozenConfig, meta: dict[str, Any]) -> nn.Module:
        assert isinstance(config, _NoisyConfig)
        return _Net(config.noise)


def toy_batch(k: int, b: int = 8, seed: int = 0) -> Any:
    rng = np.random.default_rng(seed)
    data = Arrays(x=rng.normal(size=(64, 2)).astype(np.float32), y=rng.integers(0, 2, 64), ids=np.arange(64))
    return make_classify_batch(data, [rng.permutation(64)[:b] for _ in range(k)], "cpu")


def test_torch_dropout_is_refused_naming_the_module_and_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"module body\.1 is torch\.nn\.Dropout.*trainables\.models\.plain\.Dropout"):
        _Noisy(_NoisyConfig(noise="nn.Dropout"), META, 2)


def test_a_random_op_in_training_is_refused_naming_the_module() -> None:
    model = _Noisy(_NoisyConfig(noise="randn"), META, 2)
    with pytest.raises(ConfigError, match=r"module \(root\) runs randn.*plain\.Dropout"):
        model.loss(toy_batch(2), MemberNoise([1, 2]), "mean")
    with pytest.raises(ConfigError, match=r"runs a random op"), torch.no_grad():
        model.example_losses(toy_batch(2))  # evaluation: vmap refuses the random op


def test_evaluation_is_noise_free_and_equals_the_members_own_module() -> None:
    model = _Noisy(_NoisyConfig(), META, 3)
    for k in range(3):
        model.init_member(k, torch_generator(40 + k))
    batch = toy_batch(3)
    with torch.no_grad():
        logits = model(batch)
        for k in range(3):
            alone = model.member_module(k).eval()
            assert torch.allclose(logits[k], alone(batch.x[k]), atol=1e-6)
        train_logits = model(batch, MemberNoise([1, 2, 3]))
    assert not torch.allclose(logits, train_logits)


# --- the member loop ---------------------------------------------------------------------


class _Branchy(nn.Module):
    """Data-dependent control flow: vmap cannot run it."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(2, 8)
        self.drop = Dropout(0.25)
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        h = torch.relu(h) if h.sum() > 0 else torch.tanh(h)
        return self.out(self.drop(h))


class _BranchyModel(PlainClassifier):
    name: ClassVar[str] = "branchy_test_net"
    Config: ClassVar[type[FrozenConfig]] = PlainClassifierConfig

    def build_module(self, config: FrozenConfig, meta: dict[str, Any]) -> nn.Module:
        return _Branchy()


def train_direct(model_cls: type[PlainClassifier], seeds: list[int], steps: int = 30) -> PlainClassifier:
    """The trainer's generic step (summed member losses, Adam) on member-own batches."""
    model = model_cls(model_cls.Config(), META, len(seeds))
    for k, s in enumerate(seeds):
        model.init_member(k, torch_generator(s))
    noise = MemberNoise([1000 + s for s in seeds])
    opt = torch.optim.Adam(model.parameters(), lr=0.01, foreach=False)
    rng = np.random.default_rng(0)
    data = Arrays(x=rng.normal(size=(256, 2)).astype(np.float32), y=rng.integers(0, 2, 256), ids=np.arange(256))
    orders = [np.random.default_rng(s) for s in seeds]
    for _ in range(steps):
        batch = make_classify_batch(data, [o.integers(0, 256, 16) for o in orders], "cpu")
        opt.zero_grad(set_to_none=True)
        model.loss(batch, noise, "mean").sum().backward()
        opt.step()
    return model


def test_data_dependent_control_flow_falls_back_to_the_member_loop_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="trainables.models.plain"):
        bundle = train_direct(_BranchyModel, [3, 4, 5])
    assert bundle.bundling == "loop"
    warnings = [r for r in caplog.records if "vmap cannot run" in r.getMessage()]
    assert len(warnings) == 1 and "branchy_test_net" in warnings[0].getMessage()
    for k, s in enumerate([3, 4, 5]):
        assert_same(bundle.member_state(k), train_direct(_BranchyModel, [s]).member_state(0))


def test_the_member_loop_equals_vmap() -> None:
    class Looped(_Noisy):
        bundling = "loop"

    vmapped, looped = train_direct(_Noisy, [3, 4]), train_direct(Looped, [3, 4])
    assert vmapped.bundling == "vmap" and looped.bundling == "loop"
    for k in range(2):
        assert_same(vmapped.member_state(k), looped.member_state(k))


# --- the twin ----------------------------------------------------------------------------


def test_mlp_plain_with_dropout_0_trains_like_the_hand_bundled_mlp() -> None:
    plain = train(steps_spec({"name": "mlp_plain", "hidden": (8, 8)}), [0, 1, 2])
    hand = train(steps_spec({"name": "mlp", "hidden": (8, 8)}), [0, 1, 2])
    for k in range(3):
        mine, theirs = member(plain, k), member(hand, k)
        for i, layer in enumerate((1, 3, 5)):
            assert torch.allclose(mine[f"net.{layer}.weight"], theirs[f"weights.{i}"], rtol=0, atol=1e-6)
            assert torch.allclose(mine[f"net.{layer}.bias"], theirs[f"biases.{i}"], rtol=0, atol=1e-6)
        ev_p, ev_h = evals(plain, k), evals(hand, k)
        assert ev_p.keys() == ev_h.keys()
        for key in ev_p:
            assert ev_p[key] == pytest.approx(ev_h[key], abs=1e-6), key


# --- compaction and checkpoints ----------------------------------------------------------


def test_compaction_and_checkpoint_resume_keep_members_lone() -> None:
    spec = toy_spec({"name": "mlp_plain", "hidden": (8, 8), "dropout": 0.2},
                    selection={"mode": "last", "early_stop": False})
    seeds = [derive_seedset(11, i) for i in range(3)]
    task = TASKS.get(spec.task_name)(spec.task)
    data = task.build(seeds[0].data_seed)
    bundle = BundleRun(spec, seeds, task, data)
    bundle.train_round()
    bundle.members[1].status = "stopped"
    bundle._compact()
    assert bundle.slots == [0, 2] and bundle.model.net[1].weight.shape[0] == 2
    bundle.train_round()
    resumed = BundleRun(spec, seeds, task, data)
    resumed.load_state_dict(copy.deepcopy(bundle.state_dict()))
    for run in (bundle, resumed):
        while not run.done:
            run.train_round()
    assert_same(member(resumed, 1), member(bundle, 1), atol=0)
    for row, k in enumerate([0, 2]):
        assert_same(member(bundle, row), member(train(spec, [k]), 0))
