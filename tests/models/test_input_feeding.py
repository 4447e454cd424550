"""Seq2seq input feeding (Luong et al. 2015, sec. 3.3; OpenNMT-py's ``-input_feed 1``).

The reference implementation is checked against a small implementation written here: one
example at a time, no padding, no packing, plain ``nn`` modules holding the member's
weights, the decoder stepped by hand with ``[emb(y_{t-1}); h~_{t-1}]`` as its input and the
dropout masks drawn as the protocol in ``trainables/models/seq2seq/layout.py`` says. In
float64 both must give the same logits, losses, gradients and greedy outputs.

The same implementation checks the rest of Li et al.'s TensorFlow 1 model (variant
``li2021_scan``; ``s2s_model.py`` of github.com/yuanpeng16/BCDLSG): the attention layer
without ``tanh`` (``attention_activation: none``, on both implementations) and its loss,
summed over tokens and divided by the batch size (``sum_per_sequence``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from pydantic import ValidationError
from tests_support import TINY_STUDY

from study.config import parse
from study.plan import plan_units
from study.runner import check_bundles
from trainables.data import BOS, EOS, SeqPairs, Vocab
from trainables.errors import ConfigError
from trainables.models.base import MemberNoise
from trainables.models.seq2seq import REDUCTIONS, Seq2Seq, Seq2SeqConfig
from trainables.models.seq2seq.reference import ReferenceEngine
from trainables.seeding import torch_generator

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
N_SRC, N_TGT, MAX_SRC = 7, 14, 6
VARIANTS: dict[str, dict[str, Any]] = {
    "paper": {},
    "bi2": {"bidirectional": True, "layers": 2},
    "tgt_emb_reversed": {"tgt_emb_size": 3, "reverse_source": True},
    "h_dropout_only": {"embedding_dropout": False},  # OpenNMT-py 0.x: dropout on h~ (the feed) only
    # Li et al.'s SCAN model (TensorFlow 1's AttentionWrapper): BiLSTM, TF's init, 8-dim
    # action embeddings, the attention layer without tanh
    "li2021_scan": {
        "bidirectional": True, "init": "tf", "tgt_emb_size": 8, "attention_activation": "none",
    },
}


@pytest.fixture(autouse=True)
def _one_thread(torch_threads: None) -> Iterator[None]:
    yield


def make_meta(n_tgt: int = N_TGT, steps: Any = None) -> dict[str, Any]:
    return {
        "src_vocab": Vocab.build([f"s{i}" for i in range(N_SRC)]),
        "tgt_vocab": Vocab.build([f"t{i}" for i in range(n_tgt)]),
        "max_src_len": MAX_SRC,
        "max_tgt_len": 2 * MAX_SRC,
        "decode_len": steps or (lambda lengths: 2 * np.asarray(lengths) + 1),
    }


def pairs(n: int, seed: int) -> SeqPairs:
    """Source symbol s becomes the target tokens 2s, 2s + 1 (lengths 1..MAX_SRC)."""
    rng = np.random.default_rng(seed)
    src = [rng.integers(3, 3 + N_SRC, rng.integers(1, MAX_SRC + 1)) for _ in range(n)]
    tgt = [np.stack([2 * (s - 3) + 3, 2 * (s - 3) + 4], 1).ravel() for s in src]
    return SeqPairs(src=src, tgt=tgt, ids=np.arange(n))


def feeding_model(seed: int = 3, k: int = 1, **cfg: Any) -> Seq2Seq:
    """A float64 input-feeding model of ``k`` members (seeds ``seed``, ``seed + 1``, ...), on
    the reference implementation unless ``impl`` is given."""
    config = Seq2SeqConfig(
        **{
            "emb_size": 6, "hidden_size": 5, "init_range": 0.6, "input_feeding": True,
            "impl": "reference", **cfg,
        }
    )
    m = Seq2Seq(config, make_meta(), k)
    for member in range(k):
        m.init_member(member, torch_generator(seed + member))
    return m.double()


# --- the independent implementation ---------------------------------------------------------


class Plain:
    """Input-feeding seq2seq for ONE example with plain modules (see the module doc)."""

    def __init__(
        self, m: Seq2Seq, dropout_seed: int | None, rows: list[tuple[np.ndarray, np.ndarray]]
    ) -> None:
        self.cfg = m.cfg
        self.mods = m.reference_modules(0).double()
        self.masks: dict[str, list[torch.Tensor]] | None = None
        if (
            dropout_seed is not None
        ):  # the protocol: per member, src, tgt emb, h~; (example, time) rows
            g = torch_generator(dropout_seed)
            keep = 1.0 - self.cfg.dropout
            n_src = sum(len(s) for s, _ in rows)
            n_tgt = sum(len(t) + 1 for _, t in rows)
            e_tgt = self.cfg.tgt_emb_size or self.cfg.emb_size
            h_dec = self.cfg.hidden_size * (2 if self.cfg.bidirectional else 1)
            sizes = ((n_src, self.cfg.emb_size), (n_tgt, e_tgt), (n_tgt, h_dec))
            # without embedding dropout (OpenNMT-py's) only h~'s masks are drawn
            drawn = [
                torch.rand((n, f), generator=g) if self.cfg.embedding_dropout or i == 2 else torch.ones(n, f)
                for i, (n, f) in enumerate(sizes)
            ]
            drawn = [
                (u < keep).float().mul_(1.0 / keep).double() if self.cfg.embedding_dropout or i == 2 else u.double()
                for i, u in enumerate(drawn)
            ]  # float32 as drawn
            src_cut = np.cumsum([0] + [len(s) for s, _ in rows])
            tgt_cut = np.cumsum([0] + [len(t) + 1 for _, t in rows])
            self.masks = {
                "src": [drawn[0][a:b] for a, b in itertools.pairwise(src_cut)],
                "tgt": [drawn[1][a:b] for a, b in itertools.pairwise(tgt_cut)],
                "u": [drawn[2][a:b] for a, b in itertools.pairwise(tgt_cut)],
            }

    def encode(
        self, src: np.ndarray, j: int
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        ids = torch.as_tensor(src[::-1].copy() if self.cfg.reverse_source else src)
        x = self.mods["src_emb"](ids)
        if self.masks is not None:
            x = x * self.masks["src"][j]
        enc, (h, c) = self.mods["encoder"](x[None])  # unpadded: the final state is its own
        dirs, layers = (2 if self.cfg.bidirectional else 1), self.cfg.layers
        h = h.view(layers, dirs, 1, -1).permute(0, 2, 1, 3).reshape(layers, 1, -1)
        c = c.view(layers, dirs, 1, -1).permute(0, 2, 1, 3).reshape(layers, 1, -1)
        return enc[0], (h, c)

    def step(
        self, enc: torch.Tensor, state: Any, prev: int, feed: torch.Tensor, j: int | None, t: int
    ) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """One decoder step -> (logits (V,), h~ fed to the next step (Hd,), state)."""
        y = self.mods["tgt_emb"](torch.tensor(prev))
        if self.masks is not None and j is not None:
            y = y * self.masks["tgt"][j][t]
        out, state = self.mods["decoder"](torch.cat([y, feed])[None, None], state)
        h = out[0, 0]
        weights = torch.softmax(self.mods["attn"](enc) @ h, 0)  # (S,)
        u = self.mods["combine"](torch.cat([weights @ enc, h]))
        if self.cfg.attention_activation == "tanh":
            u = torch.tanh(u)
        if self.masks is not None and j is not None:
            u = u * self.masks["u"][j][t]
        return self.mods["out"](u), u, state

    def teacher_forced(self, src: np.ndarray, tgt: np.ndarray, j: int) -> torch.Tensor:
        """Logits (len(tgt) + 1, V) of ``BOS tgt`` predicting ``tgt EOS``."""
        enc, state = self.encode(src, j)
        feed = torch.zeros(self.mods["combine"].out_features, dtype=torch.float64)
        logits = []
        for t, prev in enumerate([BOS, *tgt.tolist()]):
            z, feed, state = self.step(enc, state, prev, feed, j, t)
            logits.append(z)
        return torch.stack(logits)

    def greedy(self, src: np.ndarray, steps: int, offset: int = 0) -> list[int]:
        """Greedy decoding; class c is target id c + ``offset`` (output_classes: targets)."""
        with torch.no_grad():
            enc, state = self.encode(src, 0)
            feed = torch.zeros(self.mods["combine"].out_features, dtype=torch.float64)
            prev, out = BOS, []
            for t in range(steps):
                z, feed, state = self.step(enc, state, prev, feed, None, t)
                prev = int(z.argmax()) + offset
                out.append(prev)
        return out


# --- the reference implementation vs the plain one ------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("dropout_seed", [None, 42])
def test_logits_losses_and_gradients_equal_the_plain_implementation(
    variant: str, dropout_seed: int | None
) -> None:
    data = pairs(12, seed=1)
    m = feeding_model(**VARIANTS[variant])
    assert isinstance(m.engine, ReferenceEngine) and m.cfg.impl == "reference"
    rows = m.train_layout(data, [np.arange(8)])[0]  # lengths 1-6: a padded batch
    assert len({len(data.src[i]) for i in rows}) > 2
    batch = m.make_batch(data, [rows], torch.device("cpu"))
    noise = MemberNoise([dropout_seed]) if dropout_seed is not None else None
    params = dict(m.named_parameters())
    logits = m.engine.logits(params, batch, noise)  # (B, T, V)
    again = MemberNoise([dropout_seed]) if dropout_seed is not None else None  # the same masks
    m.loss(batch, again, "sum").sum().backward()

    plain = Plain(m, dropout_seed, [(data.src[i], data.tgt[i]) for i in rows])
    total = torch.zeros((), dtype=torch.float64)
    for j, r in enumerate(rows):
        mine = plain.teacher_forced(data.src[r], data.tgt[r], j)
        n = len(mine)
        assert torch.allclose(logits[j, :n], mine, rtol=0, atol=1e-12), j
        gold = torch.as_tensor([*data.tgt[r].tolist(), EOS])
        total = total + F.cross_entropy(mine, gold, reduction="sum")
    total.backward()
    by_module = {
        f"{mod}_{name}": p
        for mod, module in plain.mods.items()
        for name, p in module.named_parameters()
    }
    assert by_module.keys() == params.keys()
    for name, p in params.items():
        assert p.grad is not None and by_module[name].grad is not None, name
        assert torch.allclose(p.grad[0], by_module[name].grad, rtol=1e-10, atol=1e-13), name
    assert float(params["decoder_weight_ih_l0"].grad[0, :, -1].abs().max()) > 1e-6  # h~ really fed
    if dropout_seed is not None:  # dropout is really on (and the plain run fed the dropped h~)
        with torch.no_grad():
            assert float((m.engine.logits(params, batch, None) - logits).abs().max()) > 1e-3


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_decoding_equals_the_plain_implementation(variant: str) -> None:
    data = pairs(16, seed=5)
    m = feeding_model(seed=7, **VARIANTS[variant])
    rows = np.argsort([len(s) for s in data.src], kind="stable")
    batch = m.make_batch(data, [rows], torch.device("cpu"))
    preds = m.predict(batch)[0]
    metrics, preds_again = m.evaluate_batch(batch)
    plain = Plain(m, None, [])
    for j, r in enumerate(rows):
        assert preds[j].tolist() == plain.greedy(data.src[r], len(preds[j])), j
        assert np.array_equal(preds[j], preds_again[0][j])
    assert len({tuple(p) for p in preds}) > 3  # predictions really vary
    with torch.no_grad():
        assert torch.allclose(metrics["loss"], m.example_losses(batch))


def test_beam_search_is_exact_when_the_beam_holds_every_prefix() -> None:
    """Width V^2 over 3 steps finds the best sequence; the fed-back h~ follows each
    hypothesis when the beam reorders (checked exhaustively with the plain implementation)."""
    meta = make_meta(n_tgt=3, steps=lambda lengths: np.full(len(lengths), 3))
    v = len(meta["tgt_vocab"])
    cfg = Seq2SeqConfig(
        emb_size=6, hidden_size=5, init_range=1.0, input_feeding=True, beam_width=v * v,
        impl="reference",
    )
    m = Seq2Seq(cfg, meta, 1)
    m.init_member(0, torch_generator(3))
    m = m.double()
    data = pairs(3, seed=6)
    beam = m.predict(m.make_batch(data, [np.arange(3)], torch.device("cpu")))[0]
    plain = Plain(m, None, [])
    seqs = [
        s
        for s in itertools.product(range(v), repeat=3)
        if EOS not in s or all(x == EOS for x in s[s.index(EOS) :])
    ]
    for b in range(3):
        scores = []
        with torch.no_grad():
            enc, state0 = plain.encode(data.src[b], 0)
            for seq in seqs:
                feed = torch.zeros(plain.mods["combine"].out_features, dtype=torch.float64)
                state, prev, score, alive = state0, BOS, 0.0, True
                for t, tok in enumerate(seq):
                    z, feed, state = plain.step(enc, state, prev, feed, None, t)
                    score += float(F.log_softmax(z, 0)[tok]) if alive else 0.0
                    alive &= tok != EOS
                    prev = tok
                scores.append(score)
        assert beam[b].tolist() == list(seqs[int(np.argmax(scores))]), b


# --- config, identity, bundles ----------------------------------------------------------------


def test_input_feeding_is_a_config_choice_on_both_implementations() -> None:
    assert Seq2SeqConfig(input_feeding=True).impl == "fast"
    assert Seq2SeqConfig(input_feeding=True, impl="reference").impl == "reference"
    assert Seq2SeqConfig().input_feeding is False
    with pytest.raises(ValidationError, match="attention: bilinear"):
        Seq2SeqConfig(input_feeding=True, attention="none")
    with pytest.raises(ConfigError) as info:
        Seq2Seq(Seq2SeqConfig(input_feeding=True, impl="reference"), make_meta(), 2)
    assert info.value.field == "model.impl"
    # the decoder's layer 0 reads [emb; h~]
    for impl in ("fast", "reference"):
        assert feeding_model(impl=impl).decoder_weight_ih_l0.shape == (1, 4 * 5, 6 + 5)


def test_study_files_keep_their_ids_and_a_feeding_study_trains_bundles(tmp_path: Path) -> None:
    plain = parse(TINY_STUDY)
    stated = parse(
        {**TINY_STUDY, "model": {**TINY_STUDY["model"], "input_feeding": False, "init": "uniform"}}
    )
    assert stated.points[0].trial_id == plain.points[0].trial_id
    model = {**TINY_STUDY["model"], "input_feeding": True}
    fed = parse({**TINY_STUDY, "model": model, "execution": {"bundle_size": "auto"}})
    assert fed.points[0].trial_id != plain.points[0].trial_id
    assert fed.points[0].spec.model.impl == "fast"
    units, planned, _ = plan_units(fed, tmp_path, "tiny", "cpu", 1)
    assert planned == 3 and len(units) == 1 and len(units[0].seeds) == 3
    ref = {**model, "impl": "reference"}
    with pytest.raises(ConfigError) as info:
        check_bundles(parse({**TINY_STUDY, "model": ref, "execution": {"bundle_size": 2}}))
    assert info.value.field == "execution.bundle_size"


# --- the fast path's input feeding (bundled) against the reference -------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("reduction", ["sum", "sum_per_sequence"])
def test_a_fast_bundle_member_feeds_as_the_reference_does(variant: str, reduction: str) -> None:
    """Member 1 of a fast K=2 bundle (its own rows and dropout stream, member 0 with others)
    against the reference run of its weights, float64: losses, every gradient, evaluation's
    teacher-forced losses and hits, greedy outputs."""
    cfg = {**VARIANTS[variant], "dropout": 0.2}
    fast = feeding_model(seed=11, k=2, impl="fast", **cfg)
    ref = fast.to_reference(1).double()
    assert isinstance(ref.engine, ReferenceEngine) and ref.cfg.input_feeding
    data = pairs(20, seed=8)
    rows = fast.train_layout(data, [np.arange(3, 12), np.arange(9)])
    assert len({len(data.src[i]) for i in rows[1]}) > 2  # a padded batch
    cpu = torch.device("cpu")
    lf = fast.loss(fast.make_batch(data, rows, cpu), MemberNoise([41, 42]), reduction)
    lf.sum().backward()
    lr = ref.loss(ref.make_batch(data, rows[1:], cpu), MemberNoise([42]), reduction)
    lr.sum().backward()
    assert torch.allclose(lf[1], lr[0], rtol=1e-12, atol=0)
    for (name, pf), (_, pr) in zip(fast.named_parameters(), ref.named_parameters(), strict=True):
        assert pf.grad is not None and pr.grad is not None
        assert torch.allclose(pf.grad[1], pr.grad[0], rtol=1e-10, atol=1e-13), name
    assert float(fast.decoder_weight_ih_l0.grad[1, :, -1].abs().max()) > 1e-6  # h~ really fed
    # dropout is really on: the same rows without it give another loss
    assert not torch.allclose(lf[1], fast.loss(fast.make_batch(data, rows, cpu), None, reduction)[1])

    order = np.argsort([len(s) for s in data.src], kind="stable")
    batch = fast.make_batch(data, [order, order], cpu)
    metrics, preds = fast.evaluate_batch(batch)
    ref_metrics, ref_preds = ref.evaluate_batch(ref.make_batch(data, [order], cpu))
    assert len({tuple(p) for p in ref_preds[0]}) > 3  # predictions really vary
    for name, value in ref_metrics.items():
        assert torch.allclose(metrics[name][1], value[0], rtol=1e-10, atol=1e-12), name
    assert all(np.array_equal(a, b) for a, b in zip(preds[1], ref_preds[0], strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(preds[0], preds[1], strict=True))


def test_a_fast_bundle_searches_the_beam_as_the_reference_does() -> None:
    """Beam search with input feeding: the fed-back h~ follows each hypothesis when the
    fast stepper reorders, as in the reference (exhaustively checked above)."""
    meta = make_meta(n_tgt=3, steps=lambda lengths: np.full(len(lengths), 4))
    cfg = Seq2SeqConfig(emb_size=6, hidden_size=5, init_range=1.0, input_feeding=True, beam_width=3)
    fast = Seq2Seq(cfg, meta, 2)
    for member, seed in enumerate([3, 4]):
        fast.init_member(member, torch_generator(seed))
    fast = fast.double()
    data = pairs(6, seed=6)
    rows = [np.arange(6)] * 2
    beams = fast.predict(fast.make_batch(data, rows, torch.device("cpu")))
    for member in range(2):
        ref = fast.to_reference(member).double()
        ref_beam = ref.predict(ref.make_batch(data, rows[:1], torch.device("cpu")))[0]
        assert all(np.array_equal(a, b) for a, b in zip(beams[member], ref_beam, strict=True))


# --- Li et al.'s TensorFlow 1 model: the attention layer without tanh, the loss sum / batch ---


def plain_grads(plain: Plain) -> dict[str, torch.Tensor]:
    """The plain implementation's gradients under the stacked parameter names."""
    return {
        f"{mod}_{name}": p.grad
        for mod, module in plain.mods.items()
        for name, p in module.named_parameters()
        if p.grad is not None
    }


def test_the_loss_is_tensorflows_token_sum_divided_by_the_batch_size() -> None:
    """Li et al.'s loss, ``tf.reduce_sum(ce * target_mask / batch_size)`` over the padded
    (batch, time) grid, is ``sum_per_sequence``: value and gradients against the plain
    implementation of their model (input feeding, no tanh, BiLSTM, TF's init)."""
    data = pairs(12, seed=2)
    m = feeding_model(seed=4, **VARIANTS["li2021_scan"])
    rows = m.train_layout(data, [np.arange(9)])[0]
    batch = m.make_batch(data, [rows], torch.device("cpu"))
    loss = m.loss(batch, None, "sum_per_sequence")
    loss.sum().backward()

    plain = Plain(m, None, [])
    t_max = max(len(data.tgt[r]) + 1 for r in rows)
    ce = torch.zeros(len(rows), t_max, dtype=torch.float64)  # padded grid, as TF computes it
    mask = torch.zeros(len(rows), t_max, dtype=torch.float64)
    for j, r in enumerate(rows):
        gold = torch.as_tensor([*data.tgt[r].tolist(), EOS])
        logits = plain.teacher_forced(data.src[r], data.tgt[r], j)
        ce[j, : len(gold)] = F.cross_entropy(logits, gold, reduction="none")
        mask[j, : len(gold)] = 1.0
    tf_loss = (ce * mask / len(rows)).sum()
    assert len(rows) == 9 and torch.allclose(loss[0], tf_loss, rtol=1e-12, atol=0)
    assert not torch.allclose(loss[0], m.loss(batch, None, "token_mean")[0])  # not a mean
    tf_loss.backward()
    theirs = plain_grads(plain)
    for name, p in m.named_parameters():
        assert p.grad is not None
        assert torch.allclose(p.grad[0], theirs[name], rtol=1e-10, atol=1e-13), name


def test_the_li2021_models_gradients_pass_a_finite_difference_check() -> None:
    """Autograd through the reference's input-feeding decoder without tanh agrees with
    central differences (float64) for the attention, combine and fed decoder weights."""
    cfg = {**VARIANTS["li2021_scan"], "emb_size": 4, "hidden_size": 3, "tgt_emb_size": 3}
    m = feeding_model(seed=6, **cfg)
    data = pairs(4, seed=7)
    batch = m.make_batch(data, m.train_layout(data, [np.arange(3)]), torch.device("cpu"))
    params = {n: p.detach() for n, p in m.named_parameters()}
    names = ["attn_weight", "combine_weight", "decoder_weight_ih_l0"]

    def loss(*values: torch.Tensor) -> torch.Tensor:
        ce = m.engine.token_ce({**params, **dict(zip(names, values, strict=True))}, batch, None)
        return REDUCTIONS["sum_per_sequence"](ce, batch)

    inputs = tuple(params[n].clone().requires_grad_() for n in names)
    assert torch.autograd.gradcheck(loss, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_the_fast_path_computes_the_attention_layer_without_tanh(kernels: str) -> None:
    """``attention_activation: none`` without input feeding trains on the fast path: a bundle
    member's loss, gradients, teacher-forced losses and greedy outputs equal the reference's
    (float32; the C decoder has only tanh, so its decoding falls back to torch ops)."""
    cfg = Seq2SeqConfig(
        emb_size=6, hidden_size=5, bidirectional=True, init="tf", tgt_emb_size=8,
        attention_activation="none", dropout=0.2,
    )
    assert cfg.impl == "fast"
    fast = Seq2Seq(cfg, make_meta(), 2)
    for k, seed in enumerate([11, 12]):
        fast.init_member(k, torch_generator(seed))
    ref = fast.to_reference(1)
    data = pairs(16, seed=3)
    rows = fast.train_layout(data, [np.arange(8), np.arange(8, 16)])
    cpu = torch.device("cpu")
    lf = fast.loss(fast.make_batch(data, rows, cpu), MemberNoise([41, 42]), "sum_per_sequence")
    lf.sum().backward()
    lr = ref.loss(ref.make_batch(data, rows[1:], cpu), MemberNoise([42]), "sum_per_sequence")
    lr.sum().backward()
    assert torch.allclose(lf[1], lr[0], rtol=1e-6, atol=0)
    for (name, pf), (_, pr) in zip(fast.named_parameters(), ref.named_parameters(), strict=True):
        assert pf.grad is not None and pr.grad is not None
        scale = float(pr.grad.abs().max())
        assert float((pf.grad[1] - pr.grad[0]).abs().max()) <= 1e-5 * scale, name

    order = np.argsort([len(s) for s in data.src], kind="stable")
    batch, ref_batch = fast.make_batch(data, [order] * 2, cpu), ref.make_batch(data, [order], cpu)
    with torch.no_grad():
        metrics, preds = fast.evaluate_batch(batch)
        ref_metrics, ref_preds = ref.evaluate_batch(ref_batch)
        greedy = fast.predict(batch)
    assert torch.allclose(metrics["loss"][1], ref_metrics["loss"][0], rtol=1e-5)
    for j in range(len(order)):
        assert np.array_equal(preds[1][j], ref_preds[0][j]), j
        assert np.array_equal(greedy[1][j], ref_preds[0][j]), j
    assert len({tuple(p) for p in ref_preds[0]}) > 3  # predictions really vary

    # the tanh really is left out: the same weights with it compute other losses
    tanh = Seq2Seq(cfg.model_copy(update={"attention_activation": "tanh"}), make_meta(), 1)
    tanh.load_member_state(0, ref.member_state(0))
    with torch.no_grad():
        assert not torch.allclose(tanh.example_losses(ref_batch), ref.example_losses(ref_batch))


def test_attention_activation_keeps_ids_and_needs_attention() -> None:
    assert Seq2SeqConfig().attention_activation == "tanh"
    assert "attention_activation" not in Seq2SeqConfig(attention_activation="tanh").identity()
    assert Seq2SeqConfig(attention_activation="none").identity()["attention_activation"] == "none"
    with pytest.raises(ValidationError, match="attention: bilinear"):
        Seq2SeqConfig(attention_activation="none", attention="none")
    with pytest.raises(ConfigError) as info:
        parse({**TINY_STUDY, "model": {**TINY_STUDY["model"], "attention_activation": "relu"}})
    assert info.value.field == "model.attention_activation"


def test_the_li2021_scan_study_follows_the_original_code(tmp_path: Path) -> None:
    """configs/li2021_scan.yaml states what s2s_model.py computes, validates, and trains its
    input-feeding model in bundles of seeds on the fast path."""
    study = parse(yaml.safe_load((CONFIGS / "li2021_scan.yaml").read_text()))
    assert len(study.points) == 2
    for point in study.points:
        model, train = point.spec.model, point.spec.train
        assert isinstance(model, Seq2SeqConfig)
        assert (model.input_feeding, model.impl, model.attention_activation) == (True, "fast", "none")
        assert (model.bidirectional, model.attention, model.init, model.tgt_emb_size) == (
            True, "bilinear", "tf", 8,
        )
        assert train.loss_reduction == "sum_per_sequence"
        assert train.data_order == "with_replacement"  # np.random.choice per step
    check_bundles(study)
    units, planned, _ = plan_units(study, tmp_path, "li2021_scan", "cpu", 2)
    assert planned == 10 and len(units) < 10 and all(len(u.seeds) > 1 for u in units)


# --- Li et al.'s decoder input (the rolled target) and its decoding length ------------------


def original_targets(tgt: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Targets laid out as Li et al.'s ``data_generator.py`` (``Formarter``) does: action ids
    from 1 with 0 the padding, which doubles as EOS (fineline's id a is their a - 2), padded
    with 0 to the longest target + 1 (``get_maximum_length``), lengths counting the one EOS
    position (``padding``: ``len(seq) + 1``)."""
    width = max(len(t) for t in tgt) + 1
    y = np.zeros((len(tgt), width), dtype=np.int64)
    for i, t in enumerate(tgt):
        y[i, : len(t)] = t - 2
    return y, np.array([len(t) + 1 for t in tgt])


def original_decoder(
    plain: Plain, src: np.ndarray, y: np.ndarray, y_len: int
) -> tuple[float, float, float, float]:
    """``s2s_model.py`` for one example: the decoder runs all ``max_output_length`` steps
    (``TrainingHelper(decoder_emb_inp, lengths = max_output_length)``, l. 195-197), its input
    at step t the embedding of ``roll(y, 1)[t]`` (l. 159-160), so ``y[-1]`` (always 0) at t = 0.
    Their table is fineline's relabelled: their row 0 is the BOS row, row a the row of a + 2
    (the output classes likewise, class 0 being EOS). Returns the    masked loss (l. 234-236), the sentence (l. 246) and word accuracy (l. 239-243), and what
    the sentence accuracy would be without the mask (every step's argmax scored)."""
    enc, state = plain.encode(src, 0)
    feed = torch.zeros(plain.mods["combine"].out_features, dtype=torch.float64)
    logits = []
    for t, prev in enumerate(np.roll(y, 1).tolist()):
        z, feed, state = plain.step(enc, state, BOS if prev == 0 else prev + 2, feed, None, t)
        logits.append(z)
    z = torch.stack(logits)  # (max_output_length, V)
    gold = torch.as_tensor(np.where(y == 0, EOS, y + 2))
    mask = torch.arange(len(y)) < y_len  # tf.sequence_mask(y_len, max_output_length)
    ce = F.cross_entropy(z, gold, reduction="none")
    top = z.argmax(1)
    theirs = torch.where(top == EOS, 0, torch.where(top > EOS, top - 2, -1))  # PAD, BOS: no class
    prediction = theirs * mask  # l. 239: argmax * target_mask
    equal = (torch.as_tensor(y) == prediction).double()
    unmasked = float((torch.as_tensor(y) == theirs).all())
    return float((ce * mask).sum()), float(equal.min()), float((equal * mask).sum() / y_len), unmasked


def test_the_rolled_target_input_is_a_relabelled_start_symbol_and_extra_steps_change_nothing() -> None:
    """Li et al.'s decoder reads ``roll(embed(y), 1)`` for all ``max_output_length`` steps and
    scores ``argmax * target_mask``. Re-implemented that way (float64, the SCAN model, trained
    a little so that some examples are right), it gives every example fineline's summed loss,
    ``tf_exact`` (their sentence accuracy) and ``tf_token`` (their word accuracy): their
    first input is their padding/EOS row, used at no other scored step, i.e. a start symbol
    under another name, and the steps past an example's EOS, though computed, count for nothing."""
    data = pairs(40, seed=8)
    m = feeding_model(seed=5, **VARIANTS["li2021_scan"], teacher_forced_exact=True)
    cpu = torch.device("cpu")
    train = m.make_batch(data, m.train_layout(data, [np.arange(40)]), cpu)
    opt = torch.optim.Adam(m.parameters(), lr=0.03)
    for _ in range(25):
        opt.zero_grad()
        m.loss(train, None, "sum_per_sequence").sum().backward()
        opt.step()
    rows = np.argsort([len(t) for t in data.tgt], kind="stable")[:24]  # not the longest
    batch = m.make_batch(data, [rows], cpu)
    with torch.no_grad():
        metrics, _ = m.evaluate_batch(batch)
        y, y_len = original_targets(data.tgt)  # padded to the longest of ALL the data + 1
        assert y.shape[1] > batch.tgt_in.shape[2]  # they run more steps than this batch has
        plain = Plain(m, None, [])
        unmasked = []
        for j, r in enumerate(rows):
            loss, sentence, word, whole = original_decoder(plain, data.src[r], y[r], y_len[r])
            assert abs(loss - float(metrics["loss"][0, j])) <= 1e-12 * max(1.0, loss), j
            assert sentence == float(metrics["tf_exact"][0, j]), j
            assert abs(word - float(metrics["tf_token"][0, j])) <= 1e-12, j
            unmasked.append(whole)
    exact = metrics["tf_exact"][0]
    assert 0 < float(exact.sum()) < len(rows), "some examples right, some wrong"
    # scoring the steps past EOS too would lose examples: the mask (l. 239) is what counts
    assert sum(unmasked) < float(exact.sum())
    # the first input really is the start symbol: another row there changes the losses
    other = m.make_batch(data, [rows], cpu)
    other.tgt_in[..., 0] = EOS
    with torch.no_grad():
        assert not torch.allclose(m.example_losses(other), metrics["loss"])


@pytest.mark.parametrize("setting", ["A", "B"])
def test_on_scan_the_first_input_is_always_their_padding_and_the_steps_are_theirs(
    setting: str,
) -> None:
    """With SCAN's targets (train and test, as their ``get_maximum_length`` takes both) the
    original's rolled input at t = 0 is the padding/EOS id 0 for every command, the id never
    enters at another scored step, and their ``max_output_length`` (49) is the number of
    steps fineline's greedy decoding runs."""
    from trainables.tasks.scan import Scan, ScanConfig

    data = Scan(ScanConfig(setting=setting)).build(0)
    every = [*data.splits["train"].data.tgt, *data.splits["test_full"].data.tgt]
    y, y_len = original_targets(every)
    rolled = np.roll(y, 1, axis=1)
    scored = np.arange(y.shape[1]) < y_len[:, None]
    assert (rolled[:, 0] == 0).all()
    assert (rolled[:, 1:][scored[:, 1:]] != 0).all()
    assert y.shape[1] == 49 and (data.meta["decode_len"](np.array([1, 9])) == 49).all()
