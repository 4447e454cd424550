"""RNN tagger: PyTorch-default init, fast vs reference, manual backward vs autograd, and
bundle members trained 200 Adam steps equal lone plain-PyTorch runs (eager and fused)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainables.data import SeqTags, TaskData
from trainables.errors import ConfigError
from trainables.models.rnn_tagger import RNNTagger, RNNTaggerConfig
from trainables.models.rnn_tagger_fused import loss_and_grads
from trainables.registry import MODELS
from trainables.seeding import torch_generator
from trainables.tasks.dyck import Dyck1, Dyck1Config

CELLS = ("lstm", "gru", "relu")
TORCH_RNN: dict[str, Callable[..., nn.Module]] = {
    "lstm": nn.LSTM,
    "gru": nn.GRU,
    "relu": functools.partial(nn.RNN, nonlinearity="relu"),
}
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def dyck() -> TaskData:
    cfg = Dyck1Config(
        train_size=300,
        val_size=50,
        long_size=20,
        very_long_size=2,
        very_long_len=200,
        zigzag_len=2000,
        zigzag_js=(1000, 10),
    )
    return Dyck1(cfg).build(0)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_model(dyck: TaskData, k: int, seeds: list[int], **cfg: Any) -> RNNTagger:
    model = RNNTagger(RNNTaggerConfig(**cfg), dyck.meta, k)
    for member, seed in enumerate(seeds):
        model.init_member(member, torch_generator(seed))
    return model


def train_cfg(**over: Any) -> SimpleNamespace:
    base = dict(
        optimizer="adam",
        lr=0.01,
        clip_norm=None,
        loss_reduction="mean",
        adam_betas=(0.9, 0.999),
        adam_eps=1e-8,
        weight_decay=0.0,
        compile=False,
    )
    return SimpleNamespace(**{**base, **over})


def plain_torch(cell: str, seed: int, hidden: int = 1) -> tuple[nn.Module, nn.Linear]:
    """A lone PyTorch model initialised the ordinary way: manual_seed, then construct."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        rnn = TORCH_RNN[cell](2, hidden, batch_first=True)
        lin = nn.Linear(hidden, 2)
    return rnn, lin


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))


def as_member_state(rnn: nn.Module, lin: nn.Linear) -> dict[str, torch.Tensor]:
    names = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")
    state = {
        ours: getattr(rnn, theirs).detach()
        for ours, theirs in zip(("w_ih", "w_hh", "b_ih", "b_hh"), names, strict=True)
    }
    return {**state, "w_out": lin.weight.detach(), "b_out": lin.bias.detach()}


def test_registered_and_config_errors() -> None:
    assert MODELS.get("rnn_tagger") is RNNTagger
    with pytest.raises(ConfigError) as err:
        RNNTaggerConfig(hidden_size=0)
    assert err.value.field == "model.hidden_size"


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("hidden", [1, 3])
def test_init_is_pytorch_default_from_the_members_generator(
    dyck: TaskData, cell: str, hidden: int
) -> None:
    model = make_model(dyck, 2, [11, 12], cell=cell, hidden_size=hidden)
    for member, seed in enumerate([11, 12]):
        want = as_member_state(*plain_torch(cell, seed, hidden))
        got = model.member_state(member)
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), (cell, member, name)


@pytest.mark.parametrize("cell", CELLS)
def test_fast_equals_reference_outputs_and_grads(dyck: TaskData, cell: str) -> None:
    seeds = [1, 2, 3]
    fast = make_model(dyck, 3, seeds, cell=cell, hidden_size=2)
    ref = make_model(dyck, 3, seeds, cell=cell, hidden_size=2, impl="reference")
    rng = np.random.default_rng(0)
    rows = [rng.integers(0, 300, 4) for _ in range(3)]  # each member its own rows, mixed lengths
    batch = fast.make_batch(dyck.splits["train"].data, rows, CPU)
    assert batch.x.shape[0] == 3 and bool((~batch.mask).any()), "the batch should need padding"
    for model in (fast, ref):
        model.loss(batch, None, "mean").sum().backward()
    assert torch.allclose(fast.outputs(batch), ref.outputs(batch), atol=1e-6)
    for (name, p_fast), p_ref in zip(fast.named_parameters(), ref.parameters(), strict=True):
        assert p_fast.grad is not None and p_ref.grad is not None
        assert rel_diff(p_fast.grad, p_ref.grad) < 1e-5, name
    # evaluation: every member the same rows, including 2000-step zigzag sequences
    zig = dyck.splits["zigzag"].data
    eval_batch = fast.make_batch(zig, [np.arange(2)] * 3, CPU)
    assert eval_batch.x.shape == (1, 2, 2000)
    with torch.no_grad():
        assert torch.allclose(
            fast.example_losses(eval_batch), ref.example_losses(eval_batch), atol=1e-5
        )
        preds_fast, preds_ref = fast.predict(eval_batch), ref.predict(eval_batch)
    for k in range(3):
        for a, b in zip(preds_fast[k], preds_ref[k], strict=True):
            assert a.shape == (2000, 2) and np.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("cell", CELLS)
def test_predict_and_example_losses_match_plain_torch(dyck: TaskData, cell: str) -> None:
    model = make_model(dyck, 2, [5, 6], cell=cell)
    data = dyck.splits["val"].data
    assert isinstance(data, SeqTags)
    rows = np.argsort([len(x) for x in data.x])[:7]
    batch = model.make_batch(data, [rows, rows], CPU)
    with torch.no_grad():
        losses = model.example_losses(batch)
        preds = model.predict(batch)
    assert losses.shape == (2, 7) and len(preds) == 2 and len(preds[0]) == 7
    for k, seed in enumerate([5, 6]):
        rnn, lin = plain_torch(cell, seed)
        for j, r in enumerate(rows):
            x = F.one_hot(torch.from_numpy(data.x[r]), 2).float()[None]
            with torch.no_grad():
                out = torch.sigmoid(lin(rnn(x)[0]))[0]
            want_loss = F.mse_loss(out, torch.from_numpy(data.y[r]))
            assert preds[k][j].shape == data.y[r].shape
            assert np.allclose(preds[k][j], out.numpy(), atol=1e-6)
            assert float(losses[k, j]) == pytest.approx(float(want_loss), rel=1e-5)


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("hidden", [1, 3])
@pytest.mark.parametrize("reduction", ["mean", "token_mean", "sum"])
def test_manual_backward_equals_autograd(
    dyck: TaskData, cell: str, hidden: int, reduction: str
) -> None:
    seeds = [7, 8, 9]
    model = make_model(dyck, 3, seeds, cell=cell, hidden_size=hidden)
    rng = np.random.default_rng(1)
    rows = [rng.integers(0, 300, 2) for _ in range(3)]
    batch = model.make_batch(dyck.splits["train"].data, rows, CPU)
    model.loss(batch, None, reduction).sum().backward()  # the trainer SUMS member losses
    with torch.no_grad():
        losses, grads = loss_and_grads(
            model.cell, model.params(), batch.x, batch.y, batch.mask, reduction
        )
    assert torch.allclose(losses, model.loss(batch, None, reduction).detach(), rtol=1e-6)
    for (name, p), g in zip(model.named_parameters(), grads, strict=True):
        assert p.grad is not None and g.shape == p.shape
        assert rel_diff(g, p.grad) < 1e-5, name
    # each member's gradient is its lone gradient: no 1/K factor, no cross-talk
    lone = make_model(dyck, 1, [seeds[2]], cell=cell, hidden_size=hidden)
    lone_batch = lone.make_batch(dyck.splits["train"].data, [rows[2]], CPU)
    lone.loss(lone_batch, None, reduction).sum().backward()
    for (name, p), g in zip(lone.named_parameters(), grads, strict=True):
        assert p.grad is not None
        assert rel_diff(g[2], p.grad[0]) < 1e-5, name


# ----------------------------------------------------------------- 200-step equivalence
STEPS = 200


def member_orders(n_train: int, k: int) -> list[np.ndarray]:
    return [np.random.default_rng(100 + i).integers(0, n_train, STEPS) for i in range(k)]


_LONE: dict[tuple[str, int, float | None], dict[str, torch.Tensor]] = {}


def lone_run(
    cell: str, seed: int, data: SeqTags, order: np.ndarray, clip: float | None
) -> dict[str, torch.Tensor]:
    """A plain PyTorch training script: nn.RNN + nn.Linear, MSE, Adam(foreach=False), batch 1.

    Memoised per (cell, seed, clip): the generic and fused tests share the lone runs (the
    module's data and orders are fixed).
    """
    key = (cell, seed, clip)
    if key not in _LONE:
        _LONE[key] = _train_lone(cell, seed, data, order, clip)
    return _LONE[key]


def _train_lone(
    cell: str, seed: int, data: SeqTags, order: np.ndarray, clip: float | None
) -> dict[str, torch.Tensor]:
    rnn, lin = plain_torch(cell, seed)
    params = [*rnn.parameters(), *lin.parameters()]
    opt = torch.optim.Adam(params, lr=0.01, foreach=False)
    for r in order:
        x = F.one_hot(torch.from_numpy(data.x[r]), 2).float()[None]
        out = torch.sigmoid(lin(rnn(x)[0]))
        loss = F.mse_loss(out, torch.from_numpy(data.y[r])[None])
        opt.zero_grad()
        loss.backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(params, clip)
        opt.step()
    return as_member_state(rnn, lin)


def generic_step_loop(model: RNNTagger, data: SeqTags, orders: list[np.ndarray]) -> None:
    """The trainer's generic step: the summed member losses' backward, then stacked Adam."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01, foreach=False)
    active = torch.ones(model.k, dtype=torch.bool)
    for step in range(STEPS):
        batch = model.make_batch(data, [o[step : step + 1] for o in orders], CPU)
        opt.zero_grad(set_to_none=True)
        losses = model.loss(batch, None, "mean")
        torch.where(active, losses, torch.zeros_like(losses)).sum().backward()
        opt.step()


def fused_step_loop(
    model: RNNTagger, data: SeqTags, orders: list[np.ndarray], clip: float | None, compile: bool
) -> None:
    fused = model.make_fused_step(train_cfg(clip_norm=clip, compile=compile))
    assert fused is not None
    active = torch.ones(model.k)  # a float mask also works
    for step in range(STEPS):
        losses = fused(model.make_batch(data, [o[step : step + 1] for o in orders], CPU), active)
        assert losses.shape == (model.k,) and bool(torch.isfinite(losses).all())


def check_bundle_equals_lone(dyck: TaskData, cell: str, path: str, clip: float | None) -> None:
    data = dyck.splits["train"].data
    assert isinstance(data, SeqTags)
    seeds = [21, 22, 23]
    orders = member_orders(len(data), 3)
    model = make_model(dyck, 3, seeds, cell=cell)
    if path == "generic":
        assert clip is None
        generic_step_loop(model, data, orders)
    else:
        fused_step_loop(model, data, orders, clip, compile=path == "compiled")
    for k, seed in enumerate(seeds):
        want = lone_run(cell, seed, data, orders[k], clip)
        got, init = model.member_state(k), as_member_state(*plain_torch(cell, seed))
        moved = max(rel_diff(want[n], init[n]) for n in want)
        assert moved > 1e-2, "training should have moved the parameters"
        for name in want:
            assert rel_diff(got[name], want[name]) <= 1e-5, (cell, path, k, name)


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("path", ["generic", "fused"])
def test_bundle_member_equals_lone_plain_torch_run(dyck: TaskData, cell: str, path: str) -> None:
    check_bundle_equals_lone(dyck, cell, path, clip=None)


def test_fused_bundle_equivalence_with_active_clipping(dyck: TaskData) -> None:
    check_bundle_equals_lone(dyck, "lstm", "fused", clip=0.05)


@pytest.mark.slow
@pytest.mark.parametrize("cell", CELLS)
def test_compiled_fused_bundle_equals_lone_run(dyck: TaskData, cell: str) -> None:
    check_bundle_equals_lone(dyck, cell, "compiled", clip=None)


# ----------------------------------------------------------------- fused step details
def test_inactive_members_keep_params_and_adam_state(dyck: TaskData) -> None:
    data = dyck.splits["train"].data
    model = make_model(dyck, 3, [1, 2, 3])
    fused = model.make_fused_step(train_cfg())
    rows = [np.array([5]), np.array([6]), np.array([7])]
    fused(model.make_batch(data, rows, CPU), torch.ones(3, dtype=torch.bool))
    before = {k: model.member_state(k) for k in range(3)}
    state_before = fused.state_dict()
    fused(model.make_batch(data, rows, CPU), torch.tensor([True, False, True]))
    state = fused.state_dict()
    assert state["steps"].tolist() == [2, 1, 2]
    for name, p in model.named_parameters():
        assert torch.equal(p.detach()[1], before[1][name])
        assert not torch.equal(p.detach()[0], before[0][name])
    for key in ("exp_avg", "exp_avg_sq"):
        for new, old in zip(state[key], state_before[key], strict=True):
            assert torch.equal(new[1], old[1]) and not torch.equal(new[0], old[0])


def test_fused_state_dict_resumes_exactly(dyck: TaskData) -> None:
    data = dyck.splits["train"].data
    orders = member_orders(300, 2)

    def steps(model: RNNTagger, fused: Any, lo: int, hi: int) -> None:
        for s in range(lo, hi):
            fused(model.make_batch(data, [o[s : s + 1] for o in orders], CPU), torch.ones(2))

    a = make_model(dyck, 2, [4, 5])
    fa = a.make_fused_step(train_cfg(lr=0.02))
    steps(a, fa, 0, 10)
    saved_model, saved_opt = {k: v.clone() for k, v in a.state_dict().items()}, fa.state_dict()
    steps(a, fa, 10, 15)
    b = make_model(dyck, 2, [0, 0])
    fb = b.make_fused_step(train_cfg(lr=0.5))
    b.load_state_dict(saved_model)
    fb.load_state_dict(saved_opt)
    assert fb.lr == pytest.approx(0.02)
    steps(b, fb, 10, 15)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name


def test_fused_sgd_with_weight_decay_matches_torch_sgd(dyck: TaskData) -> None:
    data = dyck.splits["train"].data
    orders = member_orders(300, 2)
    fused_model = make_model(dyck, 2, [3, 4], cell="gru")
    generic_model = make_model(dyck, 2, [3, 4], cell="gru")
    fused = fused_model.make_fused_step(train_cfg(optimizer="sgd", lr=0.5, weight_decay=0.01))
    opt = torch.optim.SGD(generic_model.parameters(), lr=0.5, weight_decay=0.01, foreach=False)
    for s in range(30):
        rows = [o[s : s + 1] for o in orders]
        fused(fused_model.make_batch(data, rows, CPU), torch.ones(2, dtype=torch.bool))
        opt.zero_grad()
        generic_model.loss(generic_model.make_batch(data, rows, CPU), None, "mean").sum().backward()
        opt.step()
    for (name, p), q in zip(
        fused_model.named_parameters(), generic_model.parameters(), strict=True
    ):
        assert rel_diff(p.detach(), q.detach()) < 1e-5, name


def test_fused_step_availability_and_reduction_errors(dyck: TaskData) -> None:
    assert make_model(dyck, 1, [0], impl="reference").make_fused_step(train_cfg()) is None
    assert make_model(dyck, 1, [0], fused=False).make_fused_step(train_cfg()) is None
    model = make_model(dyck, 1, [0])
    with pytest.raises(ConfigError) as err:
        model.make_fused_step(train_cfg(loss_reduction="step_mean_sum"))
    assert err.value.field == "train.loss_reduction"
    batch = model.make_batch(dyck.splits["train"].data, [np.array([0])], CPU)
    with pytest.raises(ConfigError, match="mean"):
        model.loss(batch, None, "average")
