"""The seq2seq family: fast bundle vs reference equivalence, padding invariance, decoding.

Tiny sizes (embedding/hidden 5-6, vocabularies of 6-17, batches of 1-16) except in the
200-step training test, which needs the paper's 32 (see there). "Relative error" of a
tensor is ``max|a - b| / max|b|``.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from trainables.data import BOS, EOS, SeqPairs, Vocab
from trainables.errors import ConfigError
from trainables.models import ckernels
from trainables.models.base import MemberNoise
from trainables.models.seq2seq import REDUCTIONS, Seq2Seq, Seq2SeqConfig
from trainables.models.seq2seq import cells as seq2seq_cells
from trainables.models.seq2seq import fast as seq2seq_fast
from trainables.models.seq2seq import weights as seq2seq_weights
from trainables.models.seq2seq.decode import beam_decode, greedy_decode
from trainables.models.seq2seq.layout import IGNORE
from trainables.models.seq2seq.reference import ReferenceEngine
from trainables.registry import MODELS
from trainables.seeding import torch_generator

N_SRC, N_TGT = 7, 14  # symbols (ids start at 3 after pad, BOS, EOS)
MAX_SRC = 6

VARIANTS: dict[str, dict[str, Any]] = {
    "paper": {},
    "bi2": {"bidirectional": True, "layers": 2},
    "plain_reversed": {"attention": "none", "reverse_source": True},
    "h_dropout_only": {"embedding_dropout": False},  # OpenNMT-py 0.x: no dropout on the embeddings
}


@pytest.fixture(autouse=True)
def _one_thread(torch_threads: None) -> Iterator[None]:
    yield


@pytest.fixture()
def torch_ops_cell(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The fast model's LSTM cell as torch ops (the path CUDA and compiler-less CPUs take)."""
    monkeypatch.setenv(ckernels.SWITCH, "0")
    ckernels.cpu_kernels.cache_clear()
    yield
    ckernels.cpu_kernels.cache_clear()


def make_meta(n_tgt: int = N_TGT, decode: Any = None) -> dict[str, Any]:
    return {
        "src_vocab": Vocab.build([f"s{i}" for i in range(N_SRC)]),
        "tgt_vocab": Vocab.build([f"t{i}" for i in range(n_tgt)]),
        "max_src_len": MAX_SRC,
        "max_tgt_len": 2 * MAX_SRC,
        "decode_len": decode or (lambda lengths: 2 * np.asarray(lengths) + 1),
    }


def pairs(n: int, seed: int, lengths: tuple[int, int] = (1, MAX_SRC)) -> SeqPairs:
    """A learnable task: source symbol s becomes the two target tokens 2s, 2s + 1."""
    rng = np.random.default_rng(seed)
    src = [rng.integers(3, 3 + N_SRC, rng.integers(lengths[0], lengths[1] + 1)) for _ in range(n)]
    tgt = [np.stack([2 * (s - 3) + 3, 2 * (s - 3) + 4], 1).ravel() for s in src]
    return SeqPairs(src=src, tgt=tgt, ids=np.arange(n))


def model(k: int, seeds: list[int] | None = None, **cfg: Any) -> Seq2Seq:
    base = {"emb_size": 6, "hidden_size": 5}
    m = Seq2Seq(Seq2SeqConfig(**{**base, **cfg}), make_meta(), k)
    for i, s in enumerate(seeds or list(range(100, 100 + k))):
        m.init_member(i, torch_generator(s))
    return m


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def grads(m: Seq2Seq) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}


def loss_and_grads(
    m: Seq2Seq,
    data: SeqPairs,
    rows: list[np.ndarray],
    seeds: list[int] | None,
    reduction: str = "sum",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    m.zero_grad(set_to_none=True)
    noise = MemberNoise(seeds) if seeds is not None else None
    losses = m.loss(m.make_batch(data, rows, torch.device("cpu")), noise, reduction)
    losses.sum().backward()
    return losses.detach(), grads(m)


def clip_per_member(m: Seq2Seq, k: int, max_norm: float) -> torch.Tensor:
    """The trainer's clipping (:func:`trainables.optim.clip_grad_norms_`): each member's norm
    over all its parameter slices, summed over its own row (bitwise as in a lone run)."""
    gs = [p.grad for p in m.parameters() if p.grad is not None]
    norms = torch.stack([g.reshape(k, -1).pow(2).sum(1) for g in gs], 1).sum(1).sqrt()  # (K,)
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in gs:
        g.mul_(coef.view(-1, *[1] * (g.dim() - 1)))
    return norms


# --- registry, config, init ----------------------------------------------------------------


def test_registered_under_its_name() -> None:
    assert MODELS.get("seq2seq") is Seq2Seq
    assert Seq2Seq.data_kind == "seq2seq"


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValidationError, match="compile: false"):
        Seq2SeqConfig(compile=True)
    with pytest.raises(ValidationError, match="dropout"):
        Seq2SeqConfig(dropout=1.0)
    with pytest.raises(ValidationError, match="attention"):
        Seq2SeqConfig(attention="dot")  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as info:
        Seq2Seq(Seq2SeqConfig(impl="reference"), make_meta(), 2)
    assert info.value.field == "model.impl"
    with pytest.raises(ConfigError) as info:
        Seq2Seq(Seq2SeqConfig(), {"src_vocab": make_meta()["src_vocab"]}, 1)
    assert "tgt_vocab" in str(info.value)
    m = model(1)
    batch = m.make_batch(pairs(4, 0), [np.arange(4)], torch.device("cpu"))
    with pytest.raises(ConfigError) as info:
        m.loss(batch, None, "mean")
    assert info.value.field == "train.loss_reduction"


def test_init_member_uses_only_its_generator() -> None:
    global_state = torch.random.get_rng_state()
    a = model(3, [1, 2, 3], init_range=0.2)
    b = model(2, [2, 9])
    assert torch.equal(torch.random.get_rng_state(), global_state)
    for p in a.parameters():
        assert float(p.detach().abs().max()) <= 0.2
    # member 1 of `a` and member 0 of `b` share seed 2, and init_range scales the same draws
    for name, p in a.named_parameters():
        assert torch.allclose(p[1], 2 * b.get_parameter(name)[0])
    before = a.member_state(0)
    a.init_member(2, torch_generator(7))
    assert all(torch.equal(before[n], v) for n, v in a.member_state(0).items())
    # really U(-0.2, 0.2), not zeros
    assert float(a.get_parameter("encoder_weight_hh_l0").detach().std()) > 0.05


# --- batches and reductions ----------------------------------------------------------------


def test_make_batch_layout() -> None:
    data = SeqPairs(
        src=[np.array([3, 4, 5]), np.array([6]), np.array([7, 8])],
        tgt=[np.array([10, 11]), np.array([12, 13, 14, 15]), np.array([], dtype=np.int64)],
        ids=np.arange(3),
    )
    m = model(2, reverse_source=True)
    b = m.make_batch(data, [np.array([0, 1]), np.array([2, 0])], torch.device("cpu"))
    assert b.src.shape == (2, 2, 3) and b.tgt_in.shape == (2, 2, 5)
    assert b.src[0].tolist() == [[5, 4, 3], [6, 0, 0]]  # reversed within length, 0-padded
    assert b.src_len.tolist() == [[3, 1], [2, 3]]
    assert b.tgt_out[0, 1].tolist() == [12, 13, 14, 15, EOS]
    assert b.tgt_in[0, 1].tolist() == [BOS, 12, 13, 14, 15]
    assert b.tgt_out[1, 0].tolist() == [EOS, 0, 0, 0, 0]  # empty target: just EOS
    assert b.tgt_in[0, 0].tolist() == [BOS, 10, 11, 0, 0]
    assert b.tgt_mask.sum(-1).tolist() == [[3, 5], [1, 3]]
    # token list: each member's real targets in (example, time) order, IGNORE-padded
    assert b.tok_target[0].tolist() == [10, 11, EOS, 12, 13, 14, 15, EOS]
    assert b.tok_target[1].tolist() == [EOS, 10, 11, EOS] + [IGNORE] * 4
    flat_out = b.tgt_out.flatten()
    real = b.tok_target != IGNORE
    assert torch.equal(flat_out[b.tok_pos[real]], b.tok_target[real])
    assert b.n_tokens.tolist() == [8, 4] and b.tgt_counts == (8, 4) and b.src_counts == (4, 5)
    assert b.decode_steps.tolist() == [[7, 3], [5, 7]]
    # src_rev reverses within each source's length and is its own inverse
    assert b.src_rev[1].tolist() == [[1, 0, 2], [2, 1, 0]]
    assert torch.equal(b.src_rev.gather(2, b.src_rev), torch.arange(3).expand(2, 2, 3))


def test_a_batch_of_members_with_the_same_rows_equals_the_general_layout() -> None:
    """Evaluation batches give every member the same rows; collate then builds one member's
    batch and repeats it. Members 0 and 2 must get what the general layout gives them in a
    batch whose member 1 has the same rows in another order (so the same padded sizes)."""
    data = pairs(30, seed=6)
    m = model(3, reverse_source=True)
    rows = np.array([4, 9, 17, 2, 25, 11])
    same = m.make_batch(data, [rows] * 3, torch.device("cpu"))
    general = m.make_batch(data, [rows, rows[::-1].copy(), rows], torch.device("cpu"))
    checked = 0
    for field in dataclasses.fields(same):
        a, g = getattr(same, field.name), getattr(general, field.name)
        if field.name.endswith("_active"):
            continue  # rows in another order may need other prefixes
        if a is None and g is None:
            continue  # set only in a graph batch
        if isinstance(g, tuple):
            assert a == (g[0],) * 3, field.name
        elif field.name.endswith(("_tm_pos", "list_pos")):  # flat, member after member
            a3, g3 = a.view(3, -1), g.view(3, -1)
            assert torch.equal(a3[0], g3[0]) and torch.equal(a3[2], g3[2]), field.name
        else:
            a_, g_ = (torch.as_tensor(x) for x in (a, g))
            assert a_.shape == g_.shape, field.name
            assert torch.equal(a_[0], g_[0]) and torch.equal(a_[2], g_[2]), field.name
        checked += 1
    assert checked >= 17
    assert not torch.equal(same.src[1], general.src[1])  # member 1 really differs


def test_reductions_on_a_hand_made_batch() -> None:
    data = SeqPairs(
        src=[np.array([3]), np.array([4])], tgt=[np.array([5, 6]), np.array([7])], ids=np.arange(2)
    )
    m = model(1)
    b = m.make_batch(data, [np.array([0, 1])], torch.device("cpu"))
    ce = torch.tensor([[1.0, 2.0, 4.0, 8.0, 16.0]])  # tokens (0,0) (0,1) (0,2) (1,0) (1,1)
    assert REDUCTIONS["sum"](ce, b).item() == 31.0
    assert REDUCTIONS["token_mean"](ce, b).item() == pytest.approx(31.0 / 5)
    # steps: t=0 both examples, t=1 both, t=2 only example 0
    assert REDUCTIONS["step_mean_sum"](ce, b).item() == pytest.approx(
        (1 + 8) / 2 + (2 + 16) / 2 + 4
    )
    assert REDUCTIONS["sum_per_sequence"](ce, b).item() == pytest.approx(31.0 / 2)  # 2 sequences


def test_sum_per_sequence_scales_the_summed_gradient_by_one_over_the_batch() -> None:
    """Sutskever et al.'s ``sum / batch``: every gradient is the summed loss's over B."""
    data = pairs(12, seed=3)
    rows = [np.arange(8)]
    grads = {}
    for reduction in ("sum", "sum_per_sequence"):
        m = model(1, [4], init_range=0.5)
        m.loss(m.make_batch(data, rows, torch.device("cpu")), None, reduction).sum().backward()
        grads[reduction] = [p.grad.clone() for p in m.parameters()]
    for g_sum, g_seq in zip(grads["sum"], grads["sum_per_sequence"], strict=True):
        assert torch.allclose(g_seq * 8, g_sum, rtol=1e-5, atol=1e-7)


# --- equivalence: fast vs reference --------------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("reduction", list(REDUCTIONS))
@pytest.mark.parametrize("k", [1, 2])
def test_fast_matches_reference_loss_and_gradients(
    k: int, variant: str, reduction: str, kernels: str
) -> None:
    """Member k-1 of a fast K=k model (member 0 with other rows when K=2) vs the reference.

    Float32, init U(-0.5, 0.5): at the paper's 0.1 the attention is nearly uniform and
    its weight's gradient (~1e-8) is float32 cancellation noise in both implementations
    (they differ by up to 5e-5 there); the float64 test below covers that init exactly."""
    data = pairs(12, seed=1)
    fast = model(k, [9, 5][-k:], init_range=0.5, **VARIANTS[variant])
    ref = fast.to_reference(k - 1)
    assert isinstance(ref.engine, ReferenceEngine)
    rows = fast.train_layout(data, [np.arange(7)])[-1:]  # lengths 1-6: a padded batch
    assert len({len(data.src[i]) for i in rows[0]}) > 2
    other = [np.arange(7, 12)[[0, 1, 2, 3, 4, 0, 1]]] * (k - 1)  # another member's own rows
    batch = fast.make_batch(data, other + rows, torch.device("cpu"))
    assert min(batch.tgt_active) < 7  # ended rows are skipped
    lf, gf = loss_and_grads(fast, data, other + rows, [41] * (k - 1) + [42], reduction)
    lr, gr = loss_and_grads(ref, data, rows, [42], reduction)
    assert rel(lf[-1], lr[0]) < 1e-6
    assert gf.keys() == gr.keys() == {n for n, _ in fast.named_parameters()}
    for name in gf:
        assert rel(gf[name][-1], gr[name][0]) < 1e-5, name
    # dropout is really on: another dropout seed changes the loss
    assert rel(loss_and_grads(ref, data, rows, [43], reduction)[0], lr) > 1e-4


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fast_matches_reference_exactly_in_float64(variant: str) -> None:
    data = pairs(12, seed=1)
    fast = model(1, [5], **VARIANTS[variant]).double()
    ref = fast.to_reference(0).double()
    lf, gf = loss_and_grads(fast, data, [np.arange(7)], [42])
    lr, gr = loss_and_grads(ref, data, [np.arange(7)], [42])
    assert lf.dtype == torch.float64 and rel(lf, lr) < 1e-12
    for name in gf:
        assert rel(gf[name], gr[name]) < 1e-10, name


@pytest.mark.parametrize("chunk_floats", [1, 1000])  # 1 and 4 steps per chunk
def test_backward_chunking_does_not_change_gradients(
    chunk_floats: int, monkeypatch: pytest.MonkeyPatch, torch_ops_cell: None
) -> None:
    """The torch-ops cell's backward computes gate derivatives per chunk of steps (sized for
    cache); one step per chunk, or a few, must give the gradients of one chunk for everything."""
    data = pairs(12, seed=9)
    m = model(2, bidirectional=True)
    rows = [np.arange(6), np.arange(6, 12)]
    whole = loss_and_grads(m, data, rows, [1, 2])[1]
    monkeypatch.setattr(seq2seq_cells, "CHUNK_FLOATS", chunk_floats)
    chunked = loss_and_grads(m, data, rows, [1, 2])[1]
    for name in whole:
        assert torch.equal(whole[name], chunked[name]), name


def test_padding_never_changes_a_members_loss_or_gradient() -> None:
    data = pairs(20, seed=2)
    lengths = np.array([len(s) for s in data.src])
    mine = np.flatnonzero((lengths >= 2) & (lengths <= 3))[:3]
    short, long_ = np.flatnonzero(lengths <= 2)[-3:], np.flatnonzero(lengths == MAX_SRC)[:3]
    assert len(mine) == len(short) == len(long_) == 3
    m = model(2, [5, 6])
    la, ga = loss_and_grads(m, data, [mine, short], [1, 2])
    lb, gb = loss_and_grads(m, data, [mine, long_], [1, 2])
    pa, pb = (m.make_batch(data, [mine, o], torch.device("cpu")) for o in (short, long_))
    assert pb.src.shape[2] > pa.src.shape[2] and pb.tgt_in.shape[2] > pa.tgt_in.shape[2]
    assert rel(la[0], lb[0]) < 1e-6
    for name in ga:
        assert rel(ga[name][0], gb[name][0]) < 1e-5, name
    assert rel(ga["out_bias"][1], gb["out_bias"][1]) > 1e-3  # member 1 did change
    el_a, el_b = m.example_losses(pa), m.example_losses(pb)
    assert torch.allclose(el_a[0], el_b[0], rtol=1e-5)


@pytest.mark.parametrize("feeding", [False, True], ids=["no_feeding", "input_feeding"])
def test_bundle_member_training_equals_lone_and_reference_runs(kernels: str, feeding: bool) -> None:
    """200 SGD steps (lr 0.125, per-member clip 5, dropout 0.1, own batches per member),
    without and with input feeding (the fast path's :mod:`feeding` decoder).

    Paper sizes (32/32): with the summed loss every update is clipped to norm 5, and at
    sizes of 8 that moves the parameters ~20% per step, a chaotic regime in which float
    rounding grows past 1e-5 within 200 steps (the runs stay within 4e-6 at 32). The
    output layer's kernel works in blocks of 16 and 32 tokens, so a batch (~80) spans
    several.

    With input feeding the member equals its lone run bitwise (both step the same
    :mod:`feeding` ops; the trainer's clip norm sums each member's own row), but the
    reference steps other ops (``torch.lstm_cell`` on ``[y; h~]``), and in float32 this
    chaotic regime grows their 1e-7 rounding to ~1e-4 in 200 steps; one step agrees to
    1e-10 in float64 (``test_input_feeding.py``)."""
    data = pairs(200, seed=3)
    k, steps, batch = 3, 200, 8
    ref_tol = 1e-3 if feeding else 1e-5
    cfg = {"emb_size": 32, "hidden_size": 32, "input_feeding": feeding}
    init, drop, order = [11, 12, 13], [21, 22, 23], [31, 32, 33]

    def train(m: Seq2Seq, members: list[int]) -> tuple[Seq2Seq, list[float], torch.Tensor]:
        for slot, i in enumerate(members):
            m.init_member(slot, torch_generator(init[i]))
        noise = MemberNoise([drop[i] for i in members])
        rngs = [np.random.default_rng(order[i]) for i in members]
        opt = torch.optim.SGD(m.parameters(), lr=0.125, foreach=False)
        first_losses: list[float] = []
        norms = torch.zeros(len(members))
        for step in range(steps):
            rows = m.train_layout(data, [r.choice(len(data), batch, replace=False) for r in rngs])
            opt.zero_grad(set_to_none=True)
            losses = m.loss(m.make_batch(data, rows, torch.device("cpu")), noise, "sum")
            losses.sum().backward()
            norms = clip_per_member(m, len(members), 5.0)
            opt.step()
            if step == 0:
                first_losses = losses.tolist()
        return m, first_losses, norms

    meta = make_meta()
    bundle, first, norms = train(Seq2Seq(Seq2SeqConfig(**cfg), meta, k), [0, 1, 2])
    assert (norms > 5.0).all()  # clipping was active (the sum loss has large gradients)
    init_state = model(1, [init[0]], **cfg).member_state(0)
    moved = max(rel(bundle.member_state(0)[n], init_state[n]) for n in init_state)
    assert moved > 0.1
    for i in range(k):
        lone, lone_first, _ = train(Seq2Seq(Seq2SeqConfig(**cfg), meta, 1), [i])
        assert lone_first[0] == pytest.approx(first[i], rel=1e-6)
        mine = bundle.member_state(i)
        for name, value in lone.member_state(0).items():
            assert rel(mine[name], value) < (1e-7 if feeding else 1e-5), (i, name)
    # The reference implementation against the last member only: each member already equals
    # its own lone fast run, so one member ties the fast path to the reference.
    ref, _, _ = train(Seq2Seq(Seq2SeqConfig(**cfg, impl="reference"), meta, 1), [k - 1])
    mine = bundle.member_state(k - 1)
    for name, value in ref.member_state(0).items():
        assert rel(mine[name], value) < ref_tol, name


def test_example_losses_equal_unpadded_single_example_losses(kernels: str) -> None:
    data = pairs(10, seed=4)
    m = model(2, bidirectional=True)
    rows = np.arange(6)
    batch = m.make_batch(data, [rows, rows], torch.device("cpu"))
    with torch.no_grad():
        per_example = m.example_losses(batch)  # (K, B)
        total = m.loss(batch, None, "sum")
    assert per_example.shape == (2, 6)
    assert torch.allclose(per_example.sum(1), total, rtol=1e-5)
    for j, r in enumerate(rows):
        alone = m.make_batch(data, [np.array([r])] * 2, torch.device("cpu"))
        with torch.no_grad():
            assert torch.allclose(m.example_losses(alone)[:, 0], per_example[:, j], rtol=1e-5)


# --- decoding -------------------------------------------------------------------------------


def plain_greedy(mods: torch.nn.ModuleDict, src: np.ndarray, steps: int) -> list[int]:
    """Greedy decoding of one unpadded source with plain torch modules (paper variant)."""
    with torch.no_grad():
        enc, state = mods["encoder"](mods["src_emb"](torch.as_tensor(src)[None]))
        prev, out = BOS, []
        for _ in range(steps):
            dec, state = mods["decoder"](mods["tgt_emb"](torch.tensor([[prev]])), state)
            attn = torch.softmax(dec @ mods["attn"](enc).transpose(1, 2), -1)
            u = torch.tanh(mods["combine"](torch.cat([attn @ enc, dec], -1)))
            prev = int(mods["out"](u).argmax(-1))
            out.append(prev)
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_predict_equals_stepwise_greedy_of_the_reference(variant: str, kernels: str) -> None:
    data = pairs(16, seed=5)
    m = model(2, [7, 8], init_range=0.6, **VARIANTS[variant])
    order = np.argsort([len(s) for s in data.src], kind="stable")
    batch = m.make_batch(data, [order, order], torch.device("cpu"))
    preds = m.predict(batch)
    assert len(preds) == 2 and all(len(p) == len(order) for p in preds)
    for k in range(2):
        ref_preds = m.to_reference(k).predict(
            m.to_reference(k).make_batch(data, [order], torch.device("cpu"))
        )[0]
        mods = m.reference_modules(k)
        for j, r in enumerate(order):
            p = preds[k][j]
            assert p.dtype == np.int64 and len(p) == 2 * len(data.src[r]) + 1
            assert np.array_equal(p, ref_preds[j])
            if variant == "paper":
                assert p.tolist() == plain_greedy(mods, data.src[r], len(p))
    assert len({tuple(p) for p in preds[0]}) > 3  # predictions really vary


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_in_one_call_equals_step_by_step_greedy(variant: str, kernels: str) -> None:
    """The fast stepper's ``greedy`` (one C call on a CPU: ``kernels/decode.c``) decodes what
    the step-by-step loop decodes, for members with their own rows (40 each, more than one
    block of 16, each row its own number of steps), and a member decodes in the bundle what
    it decodes alone."""
    data = pairs(60, seed=11)
    m = model(3, [21, 22, 23], init_range=0.8, **VARIANTS[variant])
    rng = np.random.default_rng(2)
    rows = [np.sort(rng.choice(60, 40, replace=False)) for _ in range(3)]
    batch = m.make_batch(data, rows, torch.device("cpu"))
    steps = torch.from_numpy(batch.decode_steps)
    params = dict(m.named_parameters())
    with torch.no_grad():
        fast = m.engine.start_decode(params, batch, 1).greedy(steps, batch.max_steps)  # (K, B, T)
        slow = greedy_decode(m.engine.start_decode(params, batch, 1), steps, batch.max_steps)
        lone = m.to_impl("fast", 1)
        one = lone.make_batch(data, [rows[1]], torch.device("cpu"))
        alone = lone.engine.start_decode(dict(lone.named_parameters()), one, 1).greedy(steps[1:2], one.max_steps)
    for k, b in itertools.product(range(3), range(40)):
        n = int(steps[k, b])
        assert fast[k, b, :n].tolist() == slow[k, b, :n].tolist()
        if k == 1:
            assert alone[0, b, :n].tolist() == fast[1, b, :n].tolist()
    assert len({tuple(r[: int(n)].tolist()) for r, n in zip(fast[0], steps[0], strict=True)}) > 5


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_evaluation_in_one_pass_equals_teacher_forcing_and_greedy_apart(variant: str, kernels: str) -> None:
    """``evaluate_batch`` (on a CPU one C call: greedy decoding goes on from the
    teacher-forced pass where a row's argmax leaves its gold) gives the teacher-forced losses
    and hits of the torch ops and the tokens of step-by-step greedy decoding. Member 0's
    gold is a prefix of its own greedy output: all of it but the EOS position (it follows
    the gold to its last step), half of it (decoding goes on past the gold), longer than
    its steps (decoding stops inside the gold), or with one token changed (it leaves the
    gold there); the other members leave it early. A member evaluates alone what it
    evaluates in the bundle."""
    src = pairs(60, seed=13).src
    m = model(3, [31, 32, 33], init_range=0.8, teacher_forced_exact=True, **VARIANTS[variant])
    rows = [np.arange(len(src))] * 3
    any_tgt = SeqPairs(src, [np.array([3])] * len(src), np.arange(len(src)))
    greedy0 = m.predict(m.make_batch(any_tgt, rows, torch.device("cpu")))[0]
    tgt, right = [], []  # right: leading gold tokens that are member 0's greedy tokens
    for i, out in enumerate(greedy0):
        g, kind = out.copy(), i % 4
        t = [g[:-1], g[: len(g) // 2], np.concatenate([g, [3, 4]]), g[:-1].copy()][kind]
        ok = min(len(t), len(g))
        if kind == 3:
            ok = int(np.random.default_rng(i).integers(0, len(t)))
            t[ok] = 3 + (t[ok] - 3 + 1) % N_TGT  # another real token
        tgt.append(t)
        right.append(ok)
    data = SeqPairs(src, tgt, np.arange(len(src)))
    batch = m.make_batch(data, rows, torch.device("cpu"))
    params = dict(m.named_parameters())
    with torch.no_grad():
        values, preds = m.evaluate_batch(batch)
        engine = m.engine
        assert isinstance(engine, seq2seq_fast.FastEngine)
        w = seq2seq_weights.build_weights(m.arch, params, evaluation=True)
        ce, hit = engine._token_outputs(w, batch, None, True, engine.encode(w, batch, None))
        apart = m._metrics(ce, hit, batch)  # the torch ops' teacher forcing
        steps = torch.from_numpy(batch.decode_steps)
        slow = greedy_decode(m.engine.start_decode(params, batch, 1), steps, batch.max_steps)  # step by step
        lone = m.to_impl("fast", 1)
        one = lone.make_batch(data, rows[:1], torch.device("cpu"))
        lone_values, lone_preds = lone.evaluate_batch(one)
    for name, v in values.items():
        assert torch.allclose(v, apart[name], rtol=1e-5, atol=1e-5), name
    for k, b in itertools.product(range(3), range(len(src))):
        assert preds[k][b].tolist() == slow[k, b, : int(steps[k, b])].tolist()
    for name, v in lone_values.items():  # bitwise in C; torch's gemms may round otherwise
        same = torch.equal if kernels == "fused" else functools.partial(torch.allclose, rtol=1e-6)
        assert same(v[0], values[name][1]), name
    assert all(np.array_equal(a, b) for a, b in zip(lone_preds[0], preds[1], strict=True))
    followed = torch.tensor([r / (len(t) + 1) for r, t in zip(right, tgt, strict=True)])
    assert bool((values["tf_token"][0] >= followed - 1e-6).all())
    assert float(values["tf_token"][0].mean()) > 0.5 > float(values["tf_token"][1:].mean())
    assert len({tuple(p) for p in preds[0]}) > 5  # predictions really vary


def test_beam_search_is_exact_when_the_beam_holds_every_prefix(kernels: str) -> None:
    """Beam width V^2 over 3 steps must find the best sequence (checked exhaustively)."""
    meta = make_meta(n_tgt=3, decode=lambda lengths: np.full(len(lengths), 3))
    data = pairs(2, seed=6)
    v = len(meta["tgt_vocab"])
    m = Seq2Seq(Seq2SeqConfig(emb_size=6, hidden_size=5, init_range=1.0, beam_width=v * v), meta, 1)
    m.init_member(0, torch_generator(3))
    rows = [np.arange(2)]
    batch = m.make_batch(data, rows, torch.device("cpu"))
    beam = m.predict(batch)[0]
    # exhaustive: every sequence, frozen after its first EOS
    seqs = [
        s
        for s in itertools.product(range(v), repeat=3)
        if EOS not in s or all(x == EOS for x in s[s.index(EOS) :])
    ]
    params = dict(m.named_parameters())
    with torch.no_grad():
        stepper = m.engine.start_decode(params, batch, len(seqs))
        tokens = torch.tensor(seqs).repeat(2, 1)  # (2 * S, 3), example-major
        score = torch.zeros(len(tokens))
        alive = torch.ones(len(tokens), dtype=torch.bool)
        prev = torch.full((1, len(tokens)), BOS)
        for t in range(3):
            logp = F.log_softmax(stepper.step(prev)[0], -1)
            score += torch.where(
                alive, logp.gather(1, tokens[:, t : t + 1]).squeeze(1), torch.zeros(())
            )
            alive &= tokens[:, t] != EOS
            prev = tokens[:, t].view(1, -1)
    for b in range(2):
        best = int(score[b * len(seqs) : (b + 1) * len(seqs)].argmax())
        assert beam[b].tolist() == list(seqs[best])
    # the same search through the reference implementation
    ref_beam = m.to_reference(0).predict(batch)[0]
    assert all(np.array_equal(x, y) for x, y in zip(beam, ref_beam, strict=True))


def test_beam_width_one_equals_greedy_up_to_eos() -> None:
    data = pairs(8, seed=7)
    m = model(2, init_range=0.6)
    batch = m.make_batch(data, [np.arange(8)] * 2, torch.device("cpu"))
    steps = torch.from_numpy(batch.decode_steps)
    params = dict(m.named_parameters())
    with torch.no_grad():
        greedy = greedy_decode(m.engine.start_decode(params, batch, 1), steps, batch.max_steps)
        beam = beam_decode(m.engine.start_decode(params, batch, 1), steps, 1, batch.max_steps)
    for k, b in itertools.product(range(2), range(8)):
        g = greedy[k, b, : batch.decode_steps[k, b]].tolist()
        cut = g.index(EOS) + 1 if EOS in g else len(g)
        assert beam[k, b].tolist()[:cut] == g[:cut]


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_teacher_forced_exact_on_targets_made_from_the_models_own_greedy_output(impl: str) -> None:
    """Targets built from the model's greedy output: an example whose greedy output reaches EOS
    at step m gets the target greedy[:m], so teacher forcing replays greedy decoding and must
    score tf_exact 1; an example with its first target token changed must score 0, and so
    must one whose greedy output never emits EOS (its EOS position is wrong)."""
    src = pairs(40, seed=9).src
    m = model(1, [12], init_range=1.0, teacher_forced_exact=True, impl=impl)
    with torch.no_grad():
        m.out_bias[0, EOS] += 1.75  # EOS becomes the argmax at some steps of some examples
    rows = [np.arange(len(src))]
    any_target = SeqPairs(src, [np.array([3])] * len(src), np.arange(len(src)))
    greedy = m.predict(m.make_batch(any_target, rows, torch.device("cpu")))[0]
    tgt, expect = [], []
    for out in greedy:
        g = out.tolist()
        stop = g.index(EOS) if EOS in g else len(g) - 1
        t = np.asarray(g[:stop], dtype=np.int64)
        ok = EOS in g
        if ok and len(t) >= 1:
            t = t.copy()
            t[0] = 3 + (t[0] - 3 + 1) % N_TGT  # another real token
            ok = False
        tgt.append(t)
        expect.append(float(ok))
    data = SeqPairs(src, tgt, np.arange(len(src)))
    with torch.no_grad():
        out = m.example_metrics(m.make_batch(data, rows, torch.device("cpu")))
    assert set(out) == {"loss", "tf_exact", "tf_token"}
    assert out["tf_exact"][0].tolist() == expect
    # tf_token: all len + 1 positions right; only the EOS position wrong (greedy never
    # emitted EOS); the first position wrong, later ones free (their gold prefix changed)
    for i, (t, ok) in enumerate(zip(tgt, expect, strict=True)):
        one_wrong = 1.0 - 1.0 / (len(t) + 1)
        if ok:
            assert float(out["tf_token"][0, i]) == 1.0
        elif EOS not in greedy[i].tolist():
            assert float(out["tf_token"][0, i]) == pytest.approx(one_wrong)
        else:
            assert float(out["tf_token"][0, i]) <= one_wrong + 1e-6
    assert 3 <= sum(expect) <= len(expect) - 3, "the check needs both outcomes"
    assert torch.allclose(out["loss"], m.example_losses(m.make_batch(data, rows, torch.device("cpu"))))


# --- the evaluation form: sigmoid-only cell, token tables, fast argmax ----------------------


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.float64, 1e-13)])
def test_eval_cell_equals_the_training_cell(dtype: torch.dtype, tol: float, kernels: str) -> None:
    """``tanh = 2 sigmoid(2x) - 1`` with doubled g weights and a doubled cell: the same h and c."""
    gen = torch.Generator().manual_seed(0)
    k, t, b, h = 3, 9, 5, 4
    xp = torch.randn(k, t, b, 4 * h, generator=gen, dtype=dtype) * 2
    w = torch.randn(k, 4 * h, h, generator=gen, dtype=dtype) * 0.5
    h0, c0 = (torch.randn(k, b, h, generator=gen, dtype=dtype) for _ in range(2))
    eye = torch.eye(4 * h, dtype=dtype).expand(k, -1, -1)  # W_ih = I: the inputs are xp
    with torch.no_grad():
        hs, cs = seq2seq_cells.lstm_sequence(xp, eye, w, h0, c0)
        xp2, w2 = seq2seq_cells.double_g(xp, h), seq2seq_cells.double_g(w, h, 1)
        hs_e, cs_e = seq2seq_cells.lstm_sequence_eval(xp2, w2, h0, c0)
    assert torch.equal(xp2[..., : 3 * h], xp[..., : 3 * h]) and torch.equal(xp2[..., 3 * h :], 2 * xp[..., 3 * h :])
    assert rel(hs_e, hs) < tol and rel(cs_e, cs) < tol
    assert rel(hs_e, seq2seq_cells.lstm_sequence(xp, eye, w * 1.01, h0, c0)[0]) > 1e-4  # it can fail


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_evaluation_losses_equal_the_training_form(variant: str, kernels: str) -> None:
    """Without gradients the fast engine uses its evaluation form (token tables, sigmoid-only
    cell, doubled combine); its per-token losses and argmax hits equal the training form's."""
    data = pairs(16, seed=8)
    m = model(2, [3, 4], init_range=0.6, **VARIANTS[variant])
    order = np.argsort([len(s) for s in data.src], kind="stable")
    batch = m.make_batch(data, [order, order[::-1].copy()], torch.device("cpu"))
    params = dict(m.named_parameters())
    ce_train, hit_train = m.engine.token_outputs(params, batch, None, hits=True)  # grad on
    assert ce_train.requires_grad
    with torch.no_grad():
        ce_eval, hit_eval = m.engine.token_outputs(params, batch, None, hits=True)
    assert rel(ce_eval, ce_train.detach()) < 1e-5
    assert hit_eval is not None and hit_train is not None and torch.equal(hit_eval, hit_train)


@pytest.mark.parametrize("v", [5, 16, 243])
def test_fast_argmax_equals_torch_argmax_with_ties_and_nan(v: int, kernels: str) -> None:
    """Ties in one lane of the C kernel's 16 and across lanes, NaN (it wins, also after
    an inf), infinities, all-equal and all--inf rows; V below, at and above the lane count."""
    from trainables.models.seq2seq.logits import argmax_last

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(8, 50, v, generator=gen)
    x[0, 0, [3, v - 1]] = 9.0  # a tie: the first wins
    x[1, 1, 2] = float("nan")  # NaN counts as the maximum
    x[2, 2] = 0.0  # all equal
    x[3, 3, [0, v - 1]] = float("inf")
    x[4, 4] = float("-inf")
    x[5, 5, [1, v - 1]] = torch.tensor([float("inf"), float("nan")])  # the NaN after an inf wins
    x[6, 6, [v - 1, v // 2]] = 9.0  # a tie whose later entry sits in an earlier lane
    x[7, 7, [4, v - 1]] = torch.tensor([9.0, 9.5])
    got = argmax_last(x)
    assert got.dtype == torch.int64 and torch.equal(got, x.argmax(-1))
    assert got[0, 0] == 3 and got[1, 1] == 2 and got[2, 2] == 0 and got[3, 3] == 0
    assert got[4, 4] == 0 and got[5, 5] == v - 1 and got[6, 6] == v // 2 and got[7, 7] == v - 1


def test_predictions_are_token_rows_of_each_examples_decode_length() -> None:
    from trainables.data import TokenRows

    data = pairs(9, seed=9)
    m = model(2, init_range=0.6)
    batch = m.make_batch(data, [np.arange(9), np.arange(9)[::-1].copy()], torch.device("cpu"))
    preds = m.predict(batch)
    assert all(isinstance(p, TokenRows) for p in preds)
    for k, rows in enumerate([np.arange(9), np.arange(9)[::-1]]):
        assert [len(p) for p in preds[k]] == [2 * len(data.src[r]) + 1 for r in rows]
