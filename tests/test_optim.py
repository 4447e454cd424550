"""fineline's bundled optimizers and per-member hyperparameters (trainables.optim).

Real torch throughout: each bundled optimizer against ``torch.optim`` (bitwise while the
members share their values; each member against a torch optimizer on its own copy when
they differ), per-member clipping against ``clip_grad_norm_``, and bundles whose members
differ in their hyperparameters against lone runs of each member's config, on the fused
Dyck-1 step, seq2seq dropout and plain modules.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

from trainables.configbase import FrozenConfig
from trainables.errors import ConfigError
from trainables.loop import BundleRun
from trainables.models.base import MemberNoise
from trainables.models.classify import ClassifyBatch
from trainables.models.plain import Dropout, PlainClassifier, PlainClassifierConfig
from trainables.optim import (
    BundledAdam,
    BundledAdamW,
    BundledOptimizer,
    BundledSGD,
    MemberHparams,
    bundle_hparams,
    clip_grad_norms_,
    with_hparams,
)
from trainables.registry import MODELS, TASKS
from trainables.spec import RunSpec
from trainables.testing.contract import (
    assert_states_close,
    member_params,
    new_run,
    tiny_spec,
    train,
    with_train,
)

K = 3
LRS = (0.1, 0.03, 0.2)
WDS = (0.0, 0.01, 0.1)
MOMENTA = (0.0, 0.9, 0.5)
BETAS = ((0.9, 0.999), (0.8, 0.99), (0.5, 0.9))


@pytest.fixture(autouse=True)
def _one_thread(torch_threads: None) -> None:
    """One torch thread, as in a trial."""


def hparams(shared: bool, kind: str, k: int = K) -> MemberHparams:
    """Per-member values (the same for all members when ``shared``)."""

    def pick(values: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(values[1] for _ in range(k)) if shared else tuple(values[:k])

    names = {"lr", "weight_decay", "momentum", "betas", "clip_norm", "dropout"}
    return MemberHparams(
        lr=pick(LRS), weight_decay=pick(WDS), momentum=pick(MOMENTA) if kind == "sgd" else (0.0,) * k,
        betas=pick(BETAS), clip_norm=(None,) * k, dropout=None,
        shared=frozenset(names if shared or k == 1 else {"clip_norm", "dropout"}),
    )


def bundled(kind: str, params: list[torch.Tensor], hp: MemberHparams) -> BundledOptimizer:
    return {"sgd": BundledSGD, "adam": BundledAdam, "adamw": BundledAdamW}[kind](params, hp)


def torch_optimizer(kind: str, params: list[torch.Tensor], hp: MemberHparams, k: int) -> torch.optim.Optimizer:
    """torch.optim's optimizer with member ``k``'s values."""
    if kind == "sgd":
        return torch.optim.SGD(params, lr=hp.lr[k], weight_decay=hp.weight_decay[k], momentum=hp.momentum[k], foreach=False)
    cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
    return cls(params, lr=hp.lr[k], weight_decay=hp.weight_decay[k], betas=hp.betas[k], foreach=False)


def grads(n: int, shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=dtype) for _ in range(n)]


# --- the optimizers against torch.optim ---------------------------------------------------


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
def test_with_shared_values_an_update_is_bitwise_torch_optims(kind: str) -> None:
    """The trainer's arithmetic for a bundle of one config: torch.optim's on the stacked
    tensor, bit for bit (float32, weight decay and momentum on), and a lone member's."""
    hp = hparams(shared=True, kind=kind)
    start = torch.randn(K, 4, 5)
    mine, theirs = start.clone().requires_grad_(), start.clone().requires_grad_()
    lone, lone_ref = start[:1].clone().requires_grad_(), start[0].clone().requires_grad_()
    opt, ref = bundled(kind, [mine], hp), torch_optimizer(kind, [theirs], hp, 0)
    opt1, ref1 = bundled(kind, [lone], hparams(True, kind, k=1)), torch_optimizer(kind, [lone_ref], hp, 0)
    for g in grads(6, (K, 4, 5), torch.float32):
        mine.grad, theirs.grad, lone.grad, lone_ref.grad = g.clone(), g.clone(), g[:1].clone(), g[0].clone()
        for o in (opt, ref, opt1, ref1):
            o.step()
        assert torch.equal(mine, theirs)
        assert torch.equal(lone[0], lone_ref)


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
def test_each_member_updates_as_torch_optim_on_its_own_copy(kind: str) -> None:
    """Members with their own lr, weight decay (one at 0) and momentum / betas equal torch
    optimizers on separate copies (float64, several steps); compacting to rows 0 and 2
    keeps them so."""
    hp = hparams(shared=False, kind=kind)
    start = torch.randn(K, 3, 4, dtype=torch.float64)
    mine = start.clone().requires_grad_()
    copies = [start[k].clone().requires_grad_() for k in range(K)]
    opt = bundled(kind, [mine], hp)
    refs = [torch_optimizer(kind, [c], hp, k) for k, c in enumerate(copies)]
    rows = list(range(K))
    for step, g in enumerate(grads(8, (K, 3, 4), torch.float64)):
        if step == 4:  # compaction: member 1 leaves
            rows = [0, 2]
            with torch.no_grad():
                mine.data = mine.data[rows].contiguous()
            opt.keep_rows([0, 2])
        mine.grad = g[: len(rows)].clone()
        opt.step()
        for row, k in enumerate(rows):
            copies[k].grad = g[row].clone()
            refs[k].step()
            assert torch.allclose(mine[row], copies[k], rtol=1e-7, atol=1e-12), (step, k)
    assert len(opt.hparams) == 2 and opt.hparams.lr == (LRS[0], LRS[2])


def test_differing_values_move_members_apart_and_lr_factor_scales_each() -> None:
    """The per-member values are used (not the first member's): rows given the same start
    and gradients end apart; a schedule factor scales every member's own rate."""
    hp = hparams(shared=False, kind="sgd")
    p = torch.zeros(K, 2, dtype=torch.float64, requires_grad=True)
    opt = BundledSGD([p], hp)
    opt.set_lr_factor(0.25)
    p.grad = torch.ones(K, 2, dtype=torch.float64)
    opt.step()
    assert opt.param_groups[0]["lr"] == tuple(lr * 0.25 for lr in LRS)
    assert torch.equal(p[:, 0], torch.tensor([-lr * 0.25 for lr in LRS], dtype=torch.float64))


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_per_member_values_become_tensors_only_when_they_change(kind: str) -> None:
    """A per-member value is sent to the device once while it holds (on a GPU each copy
    from pageable memory made the host wait for the step before it): SGD's learning rates
    once over five steps; Adam's bias corrections change every step, its betas never; a
    new schedule factor makes the learning rates anew."""
    hp = hparams(shared=False, kind=kind)
    p = torch.zeros(K, 3, requires_grad=True)
    opt = bundled(kind, [p], hp)
    made = []
    for step in range(5):
        p.grad = torch.full((K, 3), 1.0 + step)
        opt.step()
        made.append(opt.rows.made)
    per_step = 2 if kind == "adam" else 0  # Adam: "bc2_sqrt" and "neg_step" follow the step count
    # (SGD's momentum rows first appear at step 2: step 1 starts the buffer)
    assert [b - a for a, b in itertools.pairwise(made[1:])] == [per_step] * 3, made
    opt.set_lr_factor(0.5)
    p.grad = torch.ones(K, 3)
    before = opt.rows.made
    opt.step()
    assert opt.rows.made - before == (2 if kind == "adam" else 1)


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
def test_a_step_with_per_member_values_never_makes_the_host_wait_on_cuda(kind: str) -> None:
    """Clipping and the update with per-member learning rates, weight decay, betas or
    momentum and clip norms (``lr_halving.on_loss_rise`` makes every weber2018 bundle's
    learning rates per member) run without a host synchronisation: torch's sync debug mode
    raises at one. Until stop 49 these values were copied from pageable memory at every
    step, a wait for the GPU's queue each time (on an H200 the 50-seed weber2018 bundle's
    replayed step took 50.6 ms against the 16.8 ms measured before per-member rates)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    plain = hparams(shared=False, kind=kind)
    clips = tuple((1.0, None, 0.5)[k % 3] for k in range(K))
    hp = dataclasses.replace(plain, clip_norm=clips, shared=plain.shared - {"clip_norm"})
    params = [torch.zeros(K, 4, 3, device="cuda", requires_grad=True), torch.zeros(K, 5, device="cuda", requires_grad=True)]
    opt = bundled(kind, params, hp)
    for step in range(2):  # state made; the rows made once
        for p in params:
            p.grad = torch.full_like(p, 1.0 + step)
        clip_grad_norms_([p.grad for p in params], hp)
        opt.step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(3):
            for p in params:
                p.grad.fill_(0.5 + step)
            clip_grad_norms_([p.grad for p in params], hp)
            opt.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(bool(torch.isfinite(p).all()) for p in params)


def test_torch_optim_checkpoints_load_into_the_bundled_optimizer() -> None:
    """A run checkpointed by an older fineline (torch.optim.Adam's state) resumes exactly."""
    hp = hparams(shared=True, kind="adam")
    start = torch.randn(K, 6)
    a, b = start.clone().requires_grad_(), start.clone().requires_grad_()
    old = torch_optimizer("adam", [a], hp, 0)
    gs = grads(6, (K, 6), torch.float32)
    for g in gs[:3]:
        a.grad = g.clone()
        old.step()
    with torch.no_grad():
        b.copy_(a)
    new = bundled("adam", [b], hp)
    new.load_state_dict(copy.deepcopy(old.state_dict()))  # as a checkpoint's copy
    for g in gs[3:]:
        a.grad, b.grad = g.clone(), g.clone()
        old.step()
        new.step()
    assert torch.equal(a, b)


def test_each_member_is_clipped_by_its_own_norm_and_value() -> None:
    """Clips (1.0, none, 0.1) of members whose gradients span two tensors: each as
    ``clip_grad_norm_`` on the member alone; the unclipped member exactly unchanged."""
    gs = [torch.randn(K, 3, 4, dtype=torch.float64) * 5, torch.randn(K, 7, dtype=torch.float64) * 5]
    before = [g.clone() for g in gs]
    clips = (1.0, None, 0.1)
    hp = MemberHparams(
        lr=(0.1,) * K, weight_decay=(0.0,) * K, momentum=(0.0,) * K, betas=((0.9, 0.999),) * K,
        clip_norm=clips, dropout=None, shared=frozenset({"lr", "weight_decay", "momentum", "betas", "dropout"}),
    )
    clip_grad_norms_(gs, hp)
    for k, c in enumerate(clips):
        if c is None:
            assert all(torch.equal(g[k], b[k]) for g, b in zip(gs, before, strict=True))
            continue
        alone = [nn.Parameter(torch.zeros_like(b[k])) for b in before]
        for p, b in zip(alone, before, strict=True):
            p.grad = b[k].clone()
        torch.nn.utils.clip_grad_norm_(alone, c)
        for p, g in zip(alone, gs, strict=True):
            assert p.grad is not None and torch.allclose(g[k], p.grad, rtol=1e-12, atol=0)


# --- bundles of members with their own configs --------------------------------------------


def dyck_spec(**train: Any) -> RunSpec:
    base = {"max_steps": 20, "eval_every_steps": 10, "selection": {"mode": "last", "early_stop": False}}
    return tiny_spec(TASKS.get("dyck1"), MODELS.get("rnn_tagger"), None, **{**base, **train})


def assert_members_are_lone_runs(bundle: BundleRun, members: Sequence[RunSpec]) -> None:
    for k, spec in enumerate(members):
        assert_states_close(member_params(bundle, k), member_params(train(spec, [k]), 0), f"member {k}")


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_fused_dyck_step_trains_members_with_their_own_values(optimizer: str) -> None:
    """The fused step takes per-member lr, weight decay, betas and clips (one member
    without) and each member equals its lone run (itself on the fused step)."""
    base = dyck_spec(optimizer=optimizer, lr=0.05, clip_norm=1.0)
    members = [
        base,
        with_hparams(base, {"lr": 0.02, "weight_decay": 0.01, "betas": (0.8, 0.99), "clip_norm": 0.1}),
        with_hparams(base, {"lr": 0.1, "clip_norm": None}),
    ]
    bundle = train(base, [0, 1, 2], member_specs=members)
    assert bundle.fused is not None and bundle.fused.lr == (0.05, 0.02, 0.1)
    assert_members_are_lone_runs(bundle, members)


def test_a_momentum_the_fused_step_lacks_falls_back_to_the_generic_step() -> None:
    base = dyck_spec(optimizer="sgd", lr=0.05)
    members = [base, with_hparams(base, {"momentum": 0.9}), with_hparams(base, {"lr": 0.01})]
    bundle = train(base, [0, 1, 2], member_specs=members)
    assert bundle.fused is None and isinstance(bundle.optimizer, BundledSGD)
    assert_members_are_lone_runs(bundle, members)


def test_members_given_the_bundles_own_config_train_bitwise_as_before() -> None:
    """``member_specs`` that all equal ``spec`` change nothing (fused Dyck-1 and seq2seq)."""
    seq = tiny_spec(TASKS.get("symbol_rewriting"), MODELS.get("seq2seq"), None, optimizer="sgd",
                    lr=0.1, clip_norm=1.0, max_steps=6, eval_every_steps=3,
                    selection={"mode": "last", "early_stop": False})
    for spec in (dyck_spec(), seq):
        plain, given = train(spec, [0, 1]), train(spec, [0, 1], member_specs=[spec, spec])
        for k in range(2):
            mine, ref = member_params(given, k), member_params(plain, k)
            assert all(torch.equal(v, ref[n]) for n, v in mine.items()), (spec.model_name, k)


def test_seq2seq_members_with_their_own_dropout_draw_from_their_own_streams() -> None:
    """Rates 0.1 (the bundle's), 0 (draws nothing, as its lone run) and 0.3, with AdamW."""
    base = tiny_spec(TASKS.get("symbol_rewriting"), MODELS.get("seq2seq"), None, optimizer="adamw",
                     lr=0.01, weight_decay=0.05, max_steps=6, eval_every_steps=6,
                     selection={"mode": "last", "early_stop": False})
    members = [base, with_hparams(base, {"dropout": 0.0}), with_hparams(base, {"dropout": 0.3, "lr": 0.02})]
    bundle = train(base, [0, 1, 2], member_specs=members)
    assert bundle.noise.rates == (0.1, 0.0, 0.3) and isinstance(bundle.optimizer, BundledAdamW)
    assert_members_are_lone_runs(bundle, members)


# --- plain modules: dropout per member ---------------------------------------------------

META = {"input_shape": (2,), "n_classes": 2}


class _DropConfig(PlainClassifierConfig):
    dropout: float = 0.0
    """Rate of both Dropout layers (present at any rate)."""
    fixed: float | None = None
    """A third Dropout layer at this fixed rate (None: none)."""


class _DropNet(PlainClassifier):
    """Two Dropout layers at ``dropout``, present at every rate (0 included)."""

    name: ClassVar[str] = "drop_test_net"
    Config: ClassVar[type[FrozenConfig]] = _DropConfig

    def build_module(self, config: FrozenConfig, meta: dict[str, Any]) -> nn.Module:
        assert isinstance(config, _DropConfig)
        extra = [Dropout(config.fixed)] if config.fixed is not None else []
        return nn.Sequential(
            nn.Linear(2, 16), nn.ReLU(), Dropout(config.dropout), nn.Linear(16, 16), nn.ReLU(),
            Dropout(config.dropout), *extra, nn.Linear(16, 2),
        )


def test_plain_members_at_their_own_rates_equal_lone_modules_at_those_rates() -> None:
    """A bundle built at rate 0 (its Dropout layers idle) with members at 0, 0.5 and 0.2:
    member k's training logits are those of a lone model at its rate, same dropout seed."""
    rates = (0.0, 0.5, 0.2)
    bundle = _DropNet(_DropConfig(dropout=0.0), META, K)
    bundle.set_member_dropout(rates)
    lone = [_DropNet(_DropConfig(dropout=r), META, 1) for r in rates]
    for k in range(K):
        bundle.init_member(k, torch.Generator().manual_seed(40 + k))
        lone[k].init_member(0, torch.Generator().manual_seed(40 + k))
    x = torch.randn(K, 8, 2)
    batch = batch_of(x)
    logits = bundle(batch, MemberNoise([7, 8, 9], rates=rates))
    for k in range(K):
        mine = lone[k](batch_of(x[k : k + 1]), MemberNoise([7 + k]))
        assert torch.allclose(logits[k], mine[0], rtol=1e-6, atol=1e-6), k
    assert not torch.allclose(logits[1], bundle(batch, None)[1])  # member 1 did drop units


def batch_of(x: torch.Tensor) -> ClassifyBatch:
    return ClassifyBatch(x=x, y=torch.zeros(x.shape[:2], dtype=torch.long))


def test_per_member_dropout_is_refused_where_the_rate_changes_the_module() -> None:
    """mlp_plain has no Dropout layers at 0 (its tensors' names shift); a layer at a fixed
    rate cannot take a member's rate. Both refused before training, naming the field."""
    spec = RunSpec.from_dict({
        "task": {"name": "toy2d", "n_train": 64, "n_eval": 64, "grid": (-1.0, 1.0, 5)},
        "model": {"name": "mlp_plain", "hidden": (8,), "dropout": 0.2},
        "train": {"max_steps": 2, "batch_size": 8, "selection": {"split": "train_eval"}},
    })
    with pytest.raises(ConfigError, match=r"^model\.dropout: 'mlp_plain' builds other tensors at dropout 0\.0"):
        new_run(spec, [0, 1], member_specs=[spec, with_hparams(spec, {"dropout": 0.0})])
    with pytest.raises(ConfigError, match=r"^model\.dropout: .* has Dropout layer 6 at rate 0\.5"):
        _DropNet(_DropConfig(dropout=0.1, fixed=0.5), META, 2).set_member_dropout((0.1, 0.3))


# --- what may differ, and errors ---------------------------------------------------------


def test_members_may_differ_only_in_per_member_fields() -> None:
    base = dyck_spec()
    with pytest.raises(ConfigError, match=r"^train\.batch_size: member 1 of the bundle has 2 where the bundle has 1"):
        bundle_hparams(base, [base, with_train(base, batch_size=2)])
    hp = bundle_hparams(base, [base, with_hparams(base, {"lr": 0.5, "clip_norm": 2.0})])
    assert hp.lr == (0.01, 0.5) and hp.clip_norm == (None, 2.0)
    assert hp.shared == {"weight_decay", "momentum", "betas", "dropout"} and hp.dropout is None


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"eps": 1e-6}, "member_hparams"),  # not per member
        ({"dropout": 0.2}, "model.dropout"),  # rnn_tagger has no dropout
        ({"momentum": 0.9}, "train.momentum"),  # Adam has no momentum
        ({"lr": -1.0}, "train.lr"),
        ({"betas": (0.9, 1.0)}, "train.adam_betas.1"),
    ],
)
def test_bad_member_values_name_the_field(values: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        with_hparams(dyck_spec(), values)
    assert exc.value.field == field
