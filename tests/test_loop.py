"""BundleRun behaviour beyond the contract test: the learning-rate schedule, evaluation batching."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from trainables.errors import ConfigError
from trainables.loop import BundleRun
from trainables.seeding import derive_seedset
from trainables.spec import RunSpec


def _run(lr_halving: dict[str, Any] | None, members: int | list[int] = 2, **train: Any) -> BundleRun:
    """A tiny symbol-rewriting bundle of seed indices ``members`` (a count: 0..n-1) of root 3."""
    spec = RunSpec.from_dict({
        "task": {"name": "symbol_rewriting", "n_symbols": 12, "train_size": 160, "val_size": 20,
                 "val_ood_size": 20, "test_size": 20, "train_lengths": [2, 4], "val_ood_lengths": [2, 5],
                 "repeat_lengths": [3, 5], "short_lengths": [1, 2], "long_lengths": [5, 6]},
        "model": {"name": "seq2seq", "emb_size": 8, "hidden_size": 8},
        "train": {"optimizer": "sgd", "lr": 0.8, "batch_size": 16, "lr_halving": lr_halving, **train},
    })
    seeds = [derive_seedset(3, i) for i in (range(members) if isinstance(members, int) else members)]
    task = spec.make_task()
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


def test_a_members_lr_halves_from_the_epoch_its_own_val_loss_rose_and_it_trains_as_its_lone_run() -> None:
    """OpenNMT-py 0.x's rule (``lr_halving.on_loss_rise``): a member's halving starts after
    the first epoch whose loss on the split is above the previous epoch's (here before
    ``start_epoch``), then every epoch; members rise at different epochs, and each trains
    bitwise as its lone run does."""
    sched = {"start_epoch": 6, "every_epochs": 1, "on_loss_rise": "val_ood"}
    bundle = _run(sched, members=4, max_epochs=5, selection={"early_stop": False})
    while not bundle.done:
        bundle.train_round()
    rises = []
    for m in bundle.members:
        losses = [r["value"] for r in m.metrics if r["split"] == "val_ood" and r["metric"] == "loss"]
        rise = next((e + 1 for e in range(1, len(losses)) if losses[e] > losses[e - 1]), None)
        assert m.halving_from == rise
        rises.append(rise)
    assert len(set(rises)) > 1, rises  # the members' schedules really differ
    assert bundle.optimizer is not None  # the last step ran at epoch 4.9: halvings since each rise
    assert bundle.optimizer.param_groups[0]["lr"] == pytest.approx(
        [0.8 * 0.5 ** (int(4.9 - r) + 1) for r in rises])
    for k in range(4):
        lone = _run(sched, members=[k], max_epochs=5, selection={"early_stop": False})
        while not lone.done:
            lone.train_round()
        assert lone.members[0].halving_from == rises[k]
        mine, alone = bundle.model.member_state(k), lone.model.member_state(0)
        assert all(torch.equal(mine[n], alone[n]) for n in mine), k


def test_a_loss_rise_trigger_needs_epochs_and_a_validation_split() -> None:
    with pytest.raises(ConfigError, match=r"train\.lr_halving\.on_loss_rise: .*trains by steps"):
        _run({"on_loss_rise": "val_ood"}, max_steps=5)
    with pytest.raises(ConfigError, match=r"train\.lr_halving\.on_loss_rise: split 'long' has role 'test'"):
        _run({"on_loss_rise": "long"})
    with pytest.raises(ConfigError, match=r"train\.lr_halving\.on_loss_rise: task 'symbol_rewriting' has no split"):
        _run({"on_loss_rise": "vall"})


def test_evaluation_batches_are_capped_by_the_models_eval_rows_and_change_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A K-bundle evaluates at most ``eval_rows // K`` examples per batch on a CPU, longest
    chunk first (later chunks then fit in freed memory); how a split is chunked changes no
    prediction and no loss beyond float rounding."""
    run = _run(None, members=3, eval_batch_size=1000)
    run.train_round()
    split = run.data.splits["long"]
    sizes: list[int] = []
    longest: list[int] = []
    make_batch = run.model.make_batch

    def spy(data: Any, rows: Any, device: Any) -> Any:
        sizes.append(len(rows[0]))
        longest.append(max(len(data.src[r]) for r in rows[0]))
        return make_batch(data, rows, device)

    monkeypatch.setattr(run.model, "make_batch", spy)
    whole = run.evaluate(split, predictions=True)
    assert run.model.eval_rows is not None and run.model.eval_rows // 3 > len(split)
    assert sizes == [len(split)]  # one batch: the split is smaller than the cap
    monkeypatch.setattr(type(run.model), "eval_rows", 6)  # batches of 2
    sizes.clear()
    chunked = run.evaluate(split, predictions=True)
    assert max(sizes) == 2 and sum(sizes) == len(split)
    assert longest == sorted(longest, reverse=True) and longest[0] > longest[-1]
    for k in range(3):
        assert all(np.array_equal(a, b) for a, b in zip(whole.predictions[k], chunked.predictions[k], strict=True))
        assert whole.means[k]["accuracy"] == chunked.means[k]["accuracy"]
        assert whole.means[k]["loss"] == pytest.approx(chunked.means[k]["loss"], rel=1e-5)


def test_a_run_that_never_reaches_the_arming_level_is_not_learned_and_never_stops_early() -> None:
    """arm_above 0.99 is never reached in 3 epochs of a tiny run: no member may stop early
    (the rule is unarmed), and each ends at max_epochs with the status ``not_learned``; at
    an arming level every run passes, the same runs are ``ok``."""
    sel = {"split": "val", "metric": "accuracy", "mode": "max", "early_stop": True, "patience": 1}
    unarmed = _run(None, members=2, max_epochs=3, selection={**sel, "arm_above": 0.99})
    while not unarmed.done:
        unarmed.train_round()
    assert all(m.rounds_run == 3 for m in unarmed.members), "an unlearned run must not stop early"
    assert all(m.best_value is not None and m.best_value <= 0.99 for m in unarmed.members)
    assert [r["run"][0]["status"] for r in unarmed.finalize()] == ["not_learned", "not_learned"]
    armed = _run(None, members=2, max_epochs=3, selection={**sel, "arm_above": -1.0})
    while not armed.done:
        armed.train_round()
    assert [r["run"][0]["status"] for r in armed.finalize()] == ["ok", "ok"]
