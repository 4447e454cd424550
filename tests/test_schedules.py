"""Learning-rate warmup and cosine decay (trainables.schedules) and how the trainer applies them."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from trainables.errors import ConfigError
from trainables.loop import BundleRun
from trainables.schedules import lr_factor
from trainables.seeding import derive_seedset
from trainables.spec import RunSpec


@pytest.fixture(autouse=True)
def _one_thread(torch_threads: None) -> None:
    """One torch thread, as in a trial."""


@pytest.mark.parametrize(
    ("step", "schedule", "warmup", "total", "factor"),
    [
        (0, "constant", 10, None, 0.0),  # the first warmup step runs at 0 (torch's LambdaLR)
        (1, "constant", 10, None, 0.1),
        (5, "constant", 10, None, 0.5),
        (9, "constant", 10, None, 0.9),
        (10, "constant", 10, None, 1.0),
        (10_000, "constant", 10, None, 1.0),
        (0, "constant", 0, None, 1.0),  # no warmup
        (0, "cosine", 0, 100, 1.0),
        (50, "cosine", 0, 100, 0.5),
        (25, "cosine", 0, 100, 0.5 * (1 + math.cos(math.pi / 4))),  # 0.853553...
        (100, "cosine", 0, 100, 0.0),
        (150, "cosine", 0, 100, 0.0),  # past the budget it stays at 0
        (4, "cosine", 8, 108, 0.5),  # still warming up
        (8, "cosine", 8, 108, 1.0),  # decay starts after the warmup
        (58, "cosine", 8, 108, 0.5),
        (108, "cosine", 8, 108, 0.0),
        (20, "cosine", 30, 20, 20 / 30),  # a budget inside the warmup: never decays
    ],
)
def test_lr_factor_by_hand(step: int, schedule: str, warmup: int, total: int | None, factor: float) -> None:
    assert lr_factor(step, schedule, warmup, total) == pytest.approx(factor, abs=1e-12)


def test_lr_factor_refuses_what_it_cannot_compute() -> None:
    with pytest.raises(ValueError, match="total number of steps"):
        lr_factor(3, "cosine", 0, None)
    with pytest.raises(ValueError, match="unknown lr schedule"):
        lr_factor(3, "linear", 0, 10)
    with pytest.raises(ValueError, match="step"):
        lr_factor(-1, "constant", 0)


def test_bad_schedule_fields_name_the_field() -> None:
    base: dict[str, Any] = {"task": {"name": "toy2d"}, "model": {"name": "mlp_plain"}}
    with pytest.raises(ConfigError, match=r"train\.lr_schedule"):
        RunSpec.from_dict({**base, "train": {"lr_schedule": "linear"}})
    with pytest.raises(ConfigError, match=r"train\.warmup_steps"):
        RunSpec.from_dict({**base, "train": {"warmup_steps": -1}})


def test_the_new_fields_at_their_defaults_keep_the_trial_id() -> None:
    base: dict[str, Any] = {"task": {"name": "toy2d"}, "model": {"name": "mlp_plain"}, "train": {"lr": 0.01}}
    plain = RunSpec.from_dict(base)
    stated = RunSpec.from_dict({**base, "train": {"lr": 0.01, "lr_schedule": "constant", "warmup_steps": 0}})
    assert plain.trial_id() == stated.trial_id()
    assert "warmup_steps" not in plain.identity()["train"]
    warm = RunSpec.from_dict({**base, "train": {"lr": 0.01, "warmup_steps": 5}})
    assert warm.trial_id() != plain.trial_id()


def _run(k: int = 1, **train: Any) -> BundleRun:
    spec = RunSpec.from_dict({
        "task": {"name": "xor_cluster", "dim": 6, "mu_norm": 3.0, "n_train": 64, "n_test": 32},
        "model": {"name": "mlp_plain", "hidden": (8,)},
        "train": {"optimizer": "adamw", "lr": 0.05, "weight_decay": 0.5, "adam_betas": (0.9, 0.98),
                  "adam_eps": 1e-4, "batch_size": 64, "loss_reduction": "mean", "eval_every_steps": 4,
                  "selection": {"mode": "last", "early_stop": False}, **train},
    })  # fmt: skip
    seeds = [derive_seedset(5, i) for i in range(k)]
    task = spec.make_task()
    return BundleRun(spec, seeds, task, task.build(seeds[0].data_seed))


def test_the_trainer_sets_each_members_rate_from_the_schedule() -> None:
    run = _run(max_steps=24, warmup_steps=4, lr_schedule="cosine")
    assert run.optimizer is not None
    for step, factor in ((0, 0.0), (2, 0.5), (4, 1.0), (14, 0.5), (24, 0.0)):
        run.step = step
        run._set_lr()
        assert run.optimizer.param_groups[0]["lr"] == pytest.approx(0.05 * factor)
    epochs = _run(max_epochs=3, lr_schedule="cosine")  # no max_steps: 3 epochs of 1 step
    epochs.step = 1
    epochs._set_lr()
    assert epochs.optimizer is not None
    assert epochs.optimizer.param_groups[0]["lr"] == pytest.approx(0.05 * 0.75)


def test_the_first_warmup_step_moves_nothing_but_adams_moments() -> None:
    run = _run(max_steps=4, warmup_steps=4)
    before = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    run.train_round()  # 4 steps: lr 0, 1/4, 2/4, 3/4 of 0.05
    fresh = _run(max_steps=1, warmup_steps=4, eval_every_steps=1)
    fresh.train_round()
    assert all(torch.equal(p, before[n]) for n, p in fresh.model.named_parameters())
    assert any(not torch.equal(p, before[n]) for n, p in run.model.named_parameters())
    assert fresh.optimizer is not None
    assert any(bool(s["exp_avg"].abs().sum() > 0) for s in fresh.optimizer.state.values())


def test_warmup_and_cosine_train_as_torch_adamw_with_lambdalr() -> None:
    """A lone run equals torch.optim.AdamW stepped by LambdaLR(lr_factor) on the same module
    (full batch, so the data order changes nothing but rounding)."""
    steps, warmup = 12, 3
    run = _run(max_steps=steps, warmup_steps=warmup, lr_schedule="cosine", eval_every_steps=steps)
    module = run.model.member_module(0)
    data = run.train_split.data
    x, y = torch.as_tensor(data.x), torch.as_tensor(data.y)
    opt = torch.optim.AdamW(module.parameters(), lr=0.05, betas=(0.9, 0.98), eps=1e-4, weight_decay=0.5, foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: lr_factor(t, "cosine", warmup, steps))
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(module(x), y).backward()
        opt.step()
        sched.step()
    run.train_round()
    mine = dict(run.model.member_module(0).named_parameters())
    for name, p in module.named_parameters():
        assert torch.allclose(mine[name].detach(), p.detach(), rtol=1e-5, atol=1e-6), name
