"""One member's state out of a bundle, and a bundle rebuilt from saved members, for every
built-in model family (hand-bundled and plain ``nn.Module``s bundled by ``torch.func``):
what kept weights (``trainables.weights``) and ``study eval`` rely on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tests_support import SHARED_DATA

from trainables.loop import BundleRun
from trainables.registry import MODELS, TASKS
from trainables.testing.contract import new_run, tiny_spec
from trainables.weights import load_weights, save_weights

FAMILIES = {  # a built-in model -> a built-in task of its data kind
    "seq2seq": "symbol_rewriting",
    "rnn_tagger": "dyck1",
    "mlp": "toy2d",
    "mlp_plain": "toy2d",
    "convnet": "mnist_pairs",
    "two_layer_relu": "xor_cluster",
    "transformer": "modular",
    "mlp_regressor": "sine",
}


def bundle(model: str, seeds: list[int]) -> BundleRun:
    spec = tiny_spec(TASKS.get(FAMILIES[model]), MODELS.get(model), SHARED_DATA, max_steps=3, eval_every_steps=3)
    run = new_run(spec, seeds)
    run.train_round()  # a few optimizer steps: trained rows, not just their initialisation
    return run


def test_every_builtin_family_is_covered() -> None:
    builtin = {m.name for m in MODELS if m.__module__.startswith("trainables.")}
    assert builtin == set(FAMILIES)


@pytest.mark.parametrize("model", sorted(FAMILIES))
def test_kept_members_rebuild_the_bundle_and_its_numbers_exactly(
    model: str, tmp_path: Path, torch_threads: None
) -> None:
    run = bundle(model, [0, 1, 2])
    split = next(s for s in run.data.splits.values() if s.role == "test")
    want = run.evaluate(split, predictions=True)
    for k in range(3):  # through the file format study eval reads
        save_weights(tmp_path / f"seed-{k}.pt", run.model.member_state(k), {"member": k})
    loaded = [load_weights(tmp_path / f"seed-{k}.pt") for k in range(3)]
    assert [meta["member"] for _, meta in loaded] == [0, 1, 2]
    fresh = new_run(run.spec, [0, 1, 2])  # the same seeds, untrained
    assert any(not torch.equal(a, b) for a, b in zip(
        fresh.model.member_state(1).values(), run.model.member_state(1).values(), strict=True))
    fresh.model.load_member_states([state for state, _ in loaded])
    for k in range(3):
        mine, theirs = fresh.model.member_state(k), run.model.member_state(k)
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[n], theirs[n]) for n in mine), k
    got = fresh.evaluate(split, predictions=True)
    assert got.means == want.means
    for mine_p, theirs_p in zip(got.predictions, want.predictions, strict=True):
        assert len(mine_p) == len(theirs_p) == len(split)
        assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(mine_p, theirs_p, strict=True))


@pytest.mark.parametrize("model", sorted(FAMILIES))
def test_members_load_into_any_row_and_none_keeps_a_row(model: str, torch_threads: None) -> None:
    run = bundle(model, [0, 1, 2])
    other = new_run(run.spec, [5, 6, 7])
    own = other.model.member_state(1)
    other.model.load_member_states([run.model.member_state(2), None, run.model.member_state(0)])
    for row, (src, k) in enumerate(((run, 2), (None, None), (run, 0))):
        expect = own if src is None else src.model.member_state(k)  # type: ignore[arg-type]
        assert all(torch.equal(other.model.member_state(row)[n], t) for n, t in expect.items()), row
    one = new_run(run.spec, [9])  # a lone model from one saved member
    one.model.load_member_states([run.model.member_state(1)])
    split = next(s for s in run.data.splits.values() if s.role == "test")
    lone, bundled = one.evaluate(split).means[0], run.evaluate(split).means[1]
    assert lone.keys() == bundled.keys()
    for name, value in bundled.items():
        assert lone[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name


@pytest.mark.parametrize("model", sorted(FAMILIES))
def test_a_state_that_does_not_fit_names_the_tensor(model: str, torch_threads: None) -> None:
    run = bundle(model, [0, 1])
    state = run.model.member_state(0)
    name = next(iter(state))
    with pytest.raises(ValueError, match=rf"member 1: tensor '{name}' is missing"):
        run.model.load_member_states([None, {n: t for n, t in state.items() if n != name}])
    bad = {**state, name: torch.zeros(*state[name].shape, 3)}
    with pytest.raises(ValueError, match=rf"tensor '{name}' is \("):
        run.model.load_member_states([bad, None])
    with pytest.raises(ValueError, match="1 member states for a bundle of 2"):
        run.model.load_member_states([state])
