"""BundleRun behaviour beyond the contract test: the learning-rate schedule."""

from __future__ import annotations

import pytest

from trainables.loop import BundleRun, get_task
from trainables.seeding import derive_seedset
from trainables.spec import RunSpec


def _run(lr_halving: dict[str, float] | None) -> BundleRun:
    spec = RunSpec.from_dict({
        "task": {"name": "symbol_rewriting", "n_symbols": 12, "train_size": 160, "val_size": 20,
                 "val_ood_size": 20, "test_size": 20, "train_lengths": [2, 4], "val_ood_lengths": [2, 5],
                 "repeat_lengths": [3, 5], "short_lengths": [1, 2], "long_lengths": [5, 6]},
        "model": {"name": "seq2seq", "emb_size": 8, "hidden_size": 8},
        "train": {"optimizer": "sgd", "lr": 0.8, "batch_size": 16, "lr_halving": lr_halving},
    })
    seeds = [derive_seedset(3, i) for i in range(2)]
    task = get_task(spec)
    return BundleRun(spec, seeds, task, task.build(seeds[0].data_seed))


@pytest.mark.parametrize(
    ("step", "lr"),
    [
        (0, 0.8), (49, 0.8),  # 10 steps per epoch: before 5 epochs are done the lr stands
        (50, 0.4), (54, 0.4),  # [5.0, 5.5): halved once
        (55, 0.2), (59, 0.2),  # [5.5, 6.0): twice
        (60, 0.1), (70, 0.025),  # every half epoch after that
    ],
)
def test_lr_halves_every_half_epoch_after_epoch_five(step: int, lr: float) -> None:
    """Sutskever et al.'s schedule: 160 examples / batch 16 = 10 steps per epoch."""
    run = _run({"start_epoch": 5, "every_epochs": 0.5})
    run.step = step
    run._set_lr()
    assert run.optimizer is not None
    assert run.optimizer.param_groups[0]["lr"] == pytest.approx(lr)


def test_without_a_schedule_the_lr_never_moves_and_training_applies_it() -> None:
    run = _run(None)
    run.step = 10_000
    run._set_lr()
    assert run.optimizer is not None and run.optimizer.param_groups[0]["lr"] == 0.8
    halving = _run({"start_epoch": 0, "every_epochs": 0.5})
    halving.train_round()  # one epoch = 10 steps, the lr halves every 5 of them
    assert halving.step == 10
    assert halving.optimizer is not None and halving.optimizer.param_groups[0]["lr"] == pytest.approx(0.8 * 0.5**2)
