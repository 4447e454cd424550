"""Seq2seq ``init: tf``: Li et al.'s TensorFlow 1 initialisation (``trainables/models/seq2seq/init.py``).

Every parameter of every member is checked against the distribution TF 1 would draw for
it, with the fans computed here from the architecture (not read from the code under test):
embeddings U(-1, 1); a ``BasicLSTMCell``'s one kernel over ``[x; h]`` Glorot-uniform with
fan_in = input + H, fan_out = 4H (input and recurrent weights alike); dense kernels
Glorot-uniform; zero biases except the forget gate's 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from scipy import stats

from study.config import parse
from trainables.data import Vocab
from trainables.models.seq2seq import Seq2Seq, Seq2SeqConfig
from trainables.seeding import torch_generator

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
N_SRC, N_TGT = 40, 60  # vocabularies big enough for the statistics below
SCAN_SIZES: dict[str, Any] = {
    "emb_size": 32,
    "hidden_size": 32,
    "bidirectional": True,
    "tgt_emb_size": 8,
}


@pytest.fixture(autouse=True)
def _one_thread(torch_threads: None) -> Iterator[None]:
    yield


def meta() -> dict[str, Any]:
    return {
        "src_vocab": Vocab.build([f"s{i}" for i in range(N_SRC)]),
        "tgt_vocab": Vocab.build([f"t{i}" for i in range(N_TGT)]),
        "max_src_len": 9,
        "max_tgt_len": 48,
    }


def tf_model(seeds: list[int], **cfg: Any) -> Seq2Seq:
    m = Seq2Seq(Seq2SeqConfig(**{**SCAN_SIZES, "init": "tf", **cfg}), meta(), len(seeds))
    for i, s in enumerate(seeds):
        m.init_member(i, torch_generator(s))
    return m


def expected(cfg: Seq2SeqConfig) -> dict[str, tuple[str, float]]:
    """Per parameter name: ("uniform", bound), ("zeros", 0) or ("forget", 0) (forget rows 1)."""
    h = cfg.hidden_size
    dirs = 2 if cfg.bidirectional else 1
    he = hd = dirs * h
    e_tgt = cfg.tgt_emb_size or cfg.emb_size
    out: dict[str, tuple[str, float]] = {
        "src_emb_weight": ("uniform", 1.0),
        "tgt_emb_weight": ("uniform", 1.0),
    }
    for module, hid, first_in, upper_in, suffixes in (
        ("encoder", h, cfg.emb_size, he, ["", "_reverse"][:dirs]),
        ("decoder", hd, e_tgt + (hd if cfg.input_feeding else 0), hd, [""]),
    ):
        for layer in range(cfg.layers):
            n_in = first_in if layer == 0 else upper_in
            bound = math.sqrt(6.0 / ((n_in + hid) + 4 * hid))  # TF kernel [in + H, 4H]
            for sfx in suffixes:
                out[f"{module}_weight_ih_l{layer}{sfx}"] = ("uniform", bound)
                out[f"{module}_weight_hh_l{layer}{sfx}"] = ("uniform", bound)
                out[f"{module}_bias_ih_l{layer}{sfx}"] = ("forget", 0.0)
                out[f"{module}_bias_hh_l{layer}{sfx}"] = ("zeros", 0.0)
    out["attn_weight"] = ("uniform", math.sqrt(6.0 / (he + hd)))  # memory layer [He, Hd]
    out["combine_weight"] = ("uniform", math.sqrt(6.0 / ((he + hd) + hd)))  # attention layer
    classes = N_TGT + (1 if cfg.output_classes == "targets" else 3)  # + EOS (+ pad, BOS)
    out["out_weight"] = ("uniform", math.sqrt(6.0 / (hd + classes)))  # a Dense of that many units
    out["out_bias"] = ("zeros", 0.0)
    return out


@pytest.mark.parametrize(
    "cfg",
    [
        {},
        {"input_feeding": True},
        {"bidirectional": False, "layers": 2, "tgt_emb_size": None},
        {"output_classes": "targets"},
    ],
    ids=["scan", "scan_input_feeding", "uni_2_layers", "scan_target_classes"],
)
def test_every_parameter_has_tfs_distribution(cfg: dict[str, Any]) -> None:
    seeds = [11, 12, 13]
    # input feeding runs one seed per model (the reference implementation)
    models = (
        [tf_model([s], **cfg) for s in seeds]
        if cfg.get("input_feeding")
        else [tf_model(seeds, **cfg)]
    )
    members = [m.member_state(k) for m in models for k in range(m.k)]
    want = expected(models[0].cfg)
    assert want.keys() == members[0].keys()
    for name in want:
        kind, bound = want[name]
        for state in members:
            x = state[name].double().flatten()
            if kind == "zeros":
                assert not x.any(), name
            elif kind == "forget":  # torch's gate order i, f, g, o: rows H..2H are the forget gate
                rows = state[name]
                hid = rows.shape[0] // 4
                assert torch.equal(rows[hid : 2 * hid], torch.ones(hid)), name
                assert not rows[:hid].any() and not rows[2 * hid :].any(), name
            else:
                n = x.numel()
                assert float(x.abs().max()) <= bound, name
                assert float(x.abs().max()) > bound * (1 - 10 / n), name  # reaches the bound
                # variance bound^2 / 3 within 5 standard errors, and uniform by Kolmogorov-Smirnov
                var, se = bound**2 / 3, bound**2 * math.sqrt(4 / 45 / n)
                assert abs(float(x.var(unbiased=False)) - var) < 5 * se, (name, float(x.var()), var)
                assert stats.kstest(x.numpy() / bound, "uniform", args=(-1, 2)).pvalue > 1e-4, name


def test_recurrent_and_input_weights_share_tfs_one_kernel() -> None:
    """TF's cell has one kernel over [x; h]: the recurrent weights are Glorot over that
    kernel's fans, NOT orthogonal (Keras's LSTM layer default, not what this code used)."""
    m = tf_model([4])
    w_hh = m.encoder_weight_hh_l0[0].detach().double()  # (4H, H)
    gram = w_hh.T @ w_hh
    assert float((gram - torch.diag(torch.diag(gram))).abs().max()) > 0.05  # not orthogonal
    both = torch.cat([m.encoder_weight_ih_l0[0], m.encoder_weight_hh_l0[0]], 1).detach().double()
    assert (
        stats.kstest(
            both.flatten().numpy() / math.sqrt(6 / (32 + 32 + 128)), "uniform", args=(-1, 2)
        ).pvalue
        > 1e-4
    )


def test_members_are_independent_and_drawn_from_their_own_generator() -> None:
    global_state = torch.random.get_rng_state()
    a = tf_model([1, 2, 3])
    b = tf_model([2, 9])
    assert torch.equal(torch.random.get_rng_state(), global_state)
    want = expected(a.cfg)
    for name, p in a.named_parameters():
        assert torch.equal(p[1], b.get_parameter(name)[0]), name  # same seed, same draw
        if want[name][0] == "uniform":
            assert not torch.equal(p[0], p[1]) and not torch.equal(p[1], p[2]), name
    before = a.member_state(0)
    a.init_member(2, torch_generator(7))
    assert all(torch.equal(before[n], v) for n, v in a.member_state(0).items())


def test_forget_bias_one_is_tfs_forget_bias() -> None:
    """One step of the member's torch LSTM equals TF's ``BasicLSTMCell`` with the same kernel,
    a zero bias and ``forget_bias=1.0`` (TF's gates i, j, f, o; torch's i, f, g, o)."""
    m = tf_model([5])
    lstm = m.reference_modules(0)["encoder"]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 1, 32, generator=gen)
    h0, c0 = torch.randn(2, 4, 32, generator=gen), torch.randn(2, 4, 32, generator=gen)
    with torch.no_grad():
        _, (h, c) = lstm(x, (h0, c0))
    w = torch.cat(
        [m.encoder_weight_ih_l0[0], m.encoder_weight_hh_l0[0]], 1
    ).detach()  # (4H, in + H)
    i, f, g, o = w.chunk(4)
    kernel = torch.cat([i, g, f, o]).T  # TF's [in + H, 4H], gates i, j, f, o
    gates = torch.cat([x[:, 0], h0[0]], 1) @ kernel  # TF's bias: zeros
    ti, tj, tf_, to = gates.chunk(4, 1)
    new_c = c0[0] * torch.sigmoid(tf_ + 1.0) + torch.sigmoid(ti) * torch.tanh(tj)
    new_h = torch.tanh(new_c) * torch.sigmoid(to)
    assert torch.allclose(c[0], new_c, atol=1e-6) and torch.allclose(h[0], new_h, atol=1e-6)


def test_the_scan_study_uses_the_original_init_and_target_embedding() -> None:
    cfg = parse(yaml.safe_load((CONFIGS / "li2021_scan.yaml").read_text()))
    for point in cfg.points:
        model = point.spec.model
        assert isinstance(model, Seq2SeqConfig)
        assert (model.init, model.tgt_emb_size, model.emb_size, model.hidden_size) == (
            "tf",
            8,
            32,
            32,
        )
    m = Seq2Seq(cfg.points[0].spec.model, meta(), 1)
    # decoder layer 0 reads [emb(y); h~] (input feeding): 8 + 64 inputs
    assert m.tgt_emb_weight.shape[2] == 8 and m.decoder_weight_ih_l0.shape[2] == 8 + 64
