"""``train.data_order``: reshuffle the training split on every pass, keep one order, or
draw every batch with replacement.

``fixed`` is TensorFlow Playground's way (Li et al.'s 2-D toy): the points are shuffled
once and every pass visits them in that order. Each member draws its one order from its own
``order_seed``, so a bundle member trains exactly as its lone run does. ``with_replacement``
is Li et al.'s SCAN code (``np.random.choice(len(train), size=batch_size)`` per step). The
rows each member trains on are recorded from the run's own batches (no mock of the order).
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
import torch

from trainables.errors import ConfigError
from trainables.loop import BundleRun
from trainables.seeding import SeedSet, derive_seedset, numpy_rng
from trainables.spec import RunSpec

ROOT = 11


def toy_spec(order: str | None, n_train: int = 30, fresh: bool = False, **train: Any) -> RunSpec:
    """li2021_toy's model and training on a small fixed training split."""
    order_field = {} if order is None else {"data_order": order}
    return RunSpec.from_dict({
        "task": {"name": "toy2d", "fresh_samples": fresh, "n_train": n_train, "n_eval": 16,
                 "grid": [-1.0, 1.0, 3]},
        "model": {"name": "mlp", "hidden": [8, 8], "activation": "tanh",
                  "output_activation": "tanh", "init": "playground", "loss": "square"},
        "train": {"optimizer": "sgd", "lr": 0.1, "batch_size": 10, "loss_reduction": "mean",
                  "max_epochs": 3, "selection": {"mode": "last", "early_stop": False},
                  **order_field, **train},
    })


class Recorded:
    """A BundleRun whose members' training rows are recorded batch by batch."""

    def __init__(self, spec: RunSpec, seeds: list[SeedSet]) -> None:
        task = spec.make_task()
        self.run = BundleRun(spec, seeds, task, task.build(seeds[0].data_seed))
        self.rows: list[list[np.ndarray]] = [[] for _ in seeds]  # per member, per batch
        train_batch = self.run._train_batch

        def record() -> Any:
            data, rows = train_batch()
            for k, r in zip(self.run.slots, rows, strict=True):
                self.rows[k].append(np.array(r))
            return data, rows

        self.run._train_batch = record  # type: ignore[method-assign]

    def passes(self, member: int, size: int) -> list[np.ndarray]:
        """Member ``member``'s rows cut into consecutive passes of ``size`` rows."""
        flat = np.concatenate(self.rows[member])
        return [flat[i : i + size] for i in range(0, len(flat), size)]


def seeds(n: int) -> list[SeedSet]:
    return [derive_seedset(ROOT, i) for i in range(n)]


def test_a_fixed_order_is_the_same_every_epoch_and_each_members_own() -> None:
    rec = Recorded(toy_spec("fixed"), seeds(3))
    for _ in range(3):
        rec.run.train_round()
    orders = []
    for k, s in enumerate(seeds(3)):
        epochs = rec.passes(k, 30)
        assert len(epochs) == 3
        assert sorted(epochs[0].tolist()) == list(range(30))  # a permutation of the split
        assert all(np.array_equal(e, epochs[0]) for e in epochs[1:])
        # the first permutation of the member's order stream (what reshuffle starts with)
        assert np.array_equal(epochs[0], numpy_rng(s.order_seed).permutation(30))
        orders.append(tuple(epochs[0]))
    assert len(set(orders)) == 3  # order seeds differ, so do the orders


def test_reshuffle_starts_with_the_same_pass_and_then_moves_on() -> None:
    """The default: a new permutation every pass, its first one the fixed order."""
    fixed = Recorded(toy_spec("fixed"), seeds(2))
    moving = Recorded(toy_spec(None), seeds(2))
    for rec in (fixed, moving):
        for _ in range(2):
            rec.run.train_round()
    for k in range(2):
        first, second = moving.passes(k, 30)
        assert np.array_equal(first, fixed.passes(k, 30)[0])
        assert sorted(second.tolist()) == list(range(30)) and not np.array_equal(first, second)


def test_step_based_training_cycles_the_one_order_across_passes() -> None:
    """With ``max_steps`` the batches run on across passes (23 rows, batches of 10): the
    stream is the fixed order over and over."""
    spec = toy_spec("fixed", n_train=23, max_steps=7, eval_every_steps=7)
    rec = Recorded(spec, seeds(2))
    rec.run.train_round()
    for k, s in enumerate(seeds(2)):
        order = numpy_rng(s.order_seed).permutation(23)
        assert np.array_equal(np.concatenate(rec.rows[k]), np.tile(order, 4)[:70])


@pytest.mark.parametrize("order", ["fixed", "with_replacement"])
def test_bundle_members_train_as_their_lone_runs(order: str) -> None:
    group = seeds(3)
    bundle = Recorded(toy_spec(order), group)
    for _ in range(3):
        bundle.run.train_round()
    for k, s in enumerate(group):
        lone = Recorded(toy_spec(order), [s])
        for _ in range(3):
            lone.run.train_round()
        assert np.array_equal(np.concatenate(lone.rows[0]), np.concatenate(bundle.rows[k]))
        mine, theirs = lone.run.model.member_state(0), bundle.run.model.member_state(k)
        for name in mine:
            assert torch.allclose(mine[name], theirs[name], rtol=0, atol=1e-6), (k, name)
    # training really moved the parameters, and the members apart
    first, second = bundle.run.model.member_state(0), bundle.run.model.member_state(1)
    assert any(not torch.allclose(first[n], second[n]) for n in first)


def test_a_resumed_run_keeps_the_order() -> None:
    spec = toy_spec("fixed")
    rec = Recorded(spec, seeds(2))
    rec.run.train_round()
    state = rec.run.state_dict()
    resumed = Recorded(spec, seeds(2))
    resumed.run.load_state_dict(state)
    resumed.run.train_round()
    for k in range(2):
        assert np.array_equal(resumed.passes(k, 30)[0], rec.passes(k, 30)[0])


def test_the_default_keeps_trial_ids_and_fresh_samples_refuse_a_fixed_order() -> None:
    assert toy_spec(None).train.data_order == "reshuffle"
    assert toy_spec("reshuffle").trial_id() == toy_spec(None).trial_id()
    assert toy_spec("fixed").trial_id() != toy_spec(None).trial_id()
    with pytest.raises(ConfigError) as info:
        toy_spec("fixed", fresh=True)
    assert info.value.field == "train.data_order" and "fresh_samples" in str(info.value)
    toy_spec("reshuffle", fresh=True)  # fresh samples with the default are fine
    with pytest.raises(ConfigError) as info:
        toy_spec("sorted")
    assert info.value.field == "train.data_order"


# --- with_replacement: Li et al.'s SCAN code, ``np.random.choice(len(train), size=batch)`` ---


def draws(spec: RunSpec, group: list[SeedSet], batches: int) -> Recorded:
    """``batches`` training batches of each member, drawn by the run (no training)."""
    rec = Recorded(spec, group)
    for _ in range(batches):
        rec.run._train_batch()
    return rec


def test_draws_with_replacement_are_uniform_and_each_members_own_stream() -> None:
    """Every batch is ``batch_size`` independent uniform draws over the whole split from the
    member's own order stream: repeats within a batch are as frequent as drawing with
    replacement makes them (a permutation never repeats), and every row is equally likely."""
    from scipy.stats import chisquare

    n, b, batches = 30, 10, 3000
    group = seeds(2)
    rec = draws(toy_spec("with_replacement", n_train=n), group, batches)
    for k, s in enumerate(group):
        rng = numpy_rng(s.order_seed)
        assert all(np.array_equal(r, rng.choice(n, size=b)) for r in rec.rows[k])
        flat = np.concatenate(rec.rows[k])
        assert flat.min() == 0 and flat.max() == n - 1
        counts = np.bincount(flat, minlength=n)
        assert chisquare(counts).pvalue > 1e-3  # uniform over the split (30,000 draws)
        repeats = np.mean([len(np.unique(r)) < b for r in rec.rows[k]])
        expected = 1 - np.prod(1 - np.arange(b) / n)  # P(a repeat among 10 of 30) = 0.814
        assert abs(repeats - expected) < 0.04, (repeats, expected)
        # consecutive draws are independent: the pair (draw i, draw i + 1) is uniform too
        pairs = np.bincount(flat[:-1] * n + flat[1:], minlength=n * n)
        assert chisquare(pairs).pvalue > 1e-3
    assert not np.array_equal(np.concatenate(rec.rows[0]), np.concatenate(rec.rows[1]))


def test_a_pass_with_replacement_is_len_train_over_batch_size_draws() -> None:
    """Epoch-based training: an epoch is ceil(23 / 10) = 3 batches, and the stream runs on
    across epochs (no permutation is drawn between them)."""
    group = seeds(2)
    rec = Recorded(toy_spec("with_replacement", n_train=23), group)
    rec.run.train_round()
    assert rec.run.step == 3 and rec.run.epoch == 1
    rec.run.train_round()
    assert rec.run.step == 6
    for k, s in enumerate(group):
        rng = numpy_rng(s.order_seed)
        assert len(rec.rows[k]) == 6
        assert all(np.array_equal(r, rng.choice(23, size=10)) for r in rec.rows[k])


@pytest.mark.parametrize("step_based", [False, True])
def test_a_resumed_run_draws_on_where_it_stopped(step_based: bool) -> None:
    """Resumed from a checkpoint after one round, a run draws exactly the batches and ends
    with exactly the parameters of the run that was never interrupted."""
    extra: dict[str, Any] = {"max_steps": 6, "eval_every_steps": 3} if step_based else {}
    spec = toy_spec("with_replacement", n_train=23, **extra)
    straight = Recorded(spec, seeds(2))
    straight.run.train_round()
    state = pickle.loads(pickle.dumps(straight.run.state_dict()))
    straight.run.train_round()
    resumed = Recorded(spec, seeds(2))
    resumed.run.load_state_dict(state)
    resumed.run.train_round()
    assert resumed.run.step == straight.run.step == 6
    for k in range(2):
        assert len(resumed.rows[k]) == 3
        assert all(np.array_equal(a, b) for a, b in zip(resumed.rows[k], straight.rows[k][3:], strict=True))
        assert not np.array_equal(np.concatenate(straight.rows[k][:3]), np.concatenate(resumed.rows[k]))
        mine, theirs = resumed.run.model.member_state(k), straight.run.model.member_state(k)
        assert all(torch.equal(mine[name], theirs[name]) for name in mine)


def test_with_replacement_keeps_the_default_id_and_refuses_fresh_samples() -> None:
    assert toy_spec("with_replacement").trial_id() not in {
        toy_spec(None).trial_id(), toy_spec("fixed").trial_id()
    }
    with pytest.raises(ConfigError) as info:
        toy_spec("with_replacement", fresh=True)
    assert info.value.field == "train.data_order"
    assert "fresh_samples" in str(info.value) and "draw batches from" in str(info.value)


def test_a_batch_larger_than_the_training_split_is_refused_unless_drawn_with_replacement() -> None:
    """30 training points: a batch of 30 is full batch; 40 would repeat 10 points in every
    batch from the next shuffle (a full-batch study whose split shrank but not its batch)."""
    seeds = [derive_seedset(ROOT, 0)]
    task = toy_spec("reshuffle").make_task()
    data = task.build(seeds[0].data_seed)
    BundleRun(toy_spec("reshuffle", batch_size=30), seeds, task, data)
    for order in ("reshuffle", "fixed"):
        with pytest.raises(ConfigError) as info:
            BundleRun(toy_spec(order, batch_size=40), seeds, task, data)
        assert info.value.field == "train.batch_size" and "at most 30" in str(info.value)
    BundleRun(toy_spec("with_replacement", batch_size=40), seeds, task, data)  # draws may repeat
