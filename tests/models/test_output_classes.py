"""Seq2seq ``output_classes: targets``: the output softmax over the ids a target can hold.

Li et al.'s SCAN code (``s2s_model.py`` l. 201, ``tf.layers.dense(outputs, self.U)`` with
``U = len(act) + 1``, main.py l. 64) scores 7 classes: its EOS/padding id 0 and the 6
actions. fineline's target vocabulary also holds ``<pad>`` and ``<s>``, which are never
targets; ``targets`` leaves them out of the output layer. Checked here against the plain
implementation of ``test_input_feeding.py`` (one example at a time, float64), whose output
layer then has exactly the restricted classes, so its softmax is the 7-class one TF computes;
against the fast path (bundle members, lone runs, both kernel choices); for decoding
(``<pad>`` and ``<s>`` never come out, where a model with every class emits them) and for
TF's Glorot bound of the smaller output kernel.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from test_input_feeding import VARIANTS, Plain, feeding_model, make_meta, pairs, plain_grads
from tests_support import TINY_STUDY

from study.config import parse
from trainables.data import BOS, EOS, PAD
from trainables.models.base import MemberNoise
from trainables.models.seq2seq import Seq2Seq, Seq2SeqConfig
from trainables.models.seq2seq.layout import EXCLUDED_LOGIT
from trainables.seeding import torch_generator
from trainables.tasks.scan import SRC_VOCAB, TGT_VOCAB

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
LI2021 = {**VARIANTS["li2021_scan"], "output_classes": "targets"}
"""Li et al.'s model (input feeding, BiLSTM, TF's init, no tanh) with their output classes."""
CPU = torch.device("cpu")
SCAN_META = {"src_vocab": SRC_VOCAB, "tgt_vocab": TGT_VOCAB, "max_src_len": 10, "max_tgt_len": 48}


@pytest.fixture(autouse=True)
def _one_thread(torch_threads: None) -> Iterator[None]:
    yield


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("dropout_seed", [None, 42])
def test_reference_equals_a_plain_model_whose_softmax_has_only_the_target_classes(
    dropout_seed: int | None,
) -> None:
    """float64, per example: the reference's logits of EOS and the symbols are the plain
    model's (whose output layer has V - 2 units), ``<pad>`` and ``<s>`` get the excluded
    logit; the loss (``sum_per_sequence``, TF's ``reduce_sum(ce * mask / batch)``) and every
    gradient are those of the plain model's restricted cross-entropy."""
    data = pairs(12, seed=1)
    m = feeding_model(**LI2021, dropout=0.2 if dropout_seed is not None else 0.0)
    v = len(make_meta()["tgt_vocab"])
    assert m.out_weight.shape == (1, v - 2, 10) and m.out_bias.shape == (1, v - 2)
    rows = m.train_layout(data, [np.arange(8)])[0]
    batch = m.make_batch(data, [rows], CPU)
    noise = MemberNoise([dropout_seed]) if dropout_seed is not None else None
    params = dict(m.named_parameters())
    with torch.no_grad():
        logits = m.engine.logits(params, batch, noise)  # (B, T, V)
    again = MemberNoise([dropout_seed]) if dropout_seed is not None else None  # the same masks
    loss = m.loss(batch, again, "sum_per_sequence")
    loss.sum().backward()

    plain = Plain(m, dropout_seed, [(data.src[i], data.tgt[i]) for i in rows])
    assert plain.mods["out"].out_features == v - 2
    total = torch.zeros((), dtype=torch.float64)
    for j, r in enumerate(rows):
        mine = plain.teacher_forced(data.src[r], data.tgt[r], j)  # (n, V - 2): class c = id c + 2
        n = len(mine)
        assert torch.allclose(logits[j, :n, EOS:], mine, rtol=0, atol=1e-12), j
        assert (logits[j, :n, :EOS] == EXCLUDED_LOGIT).all()
        gold = torch.as_tensor([*data.tgt[r].tolist(), EOS]) - EOS
        total = total + F.cross_entropy(mine, gold, reduction="sum")
    total = total / len(rows)
    assert torch.allclose(loss[0], total, rtol=1e-12, atol=0)
    total.backward()
    theirs = plain_grads(plain)
    assert theirs.keys() == params.keys()
    for name, p in params.items():
        assert p.grad is not None
        assert torch.allclose(p.grad[0], theirs[name], rtol=1e-10, atol=1e-13), name

    # the same weights with every class in the softmax: another loss (PAD and BOS take mass)
    every = Seq2Seq(m.cfg.model_copy(update={"output_classes": "all"}), make_meta(), 1).double()
    state = m.member_state(0)
    state["out_weight"] = torch.cat([torch.zeros(2, 10, dtype=torch.float64), state["out_weight"]])
    state["out_bias"] = torch.cat([torch.zeros(2, dtype=torch.float64), state["out_bias"]])
    every.load_member_state(0, state)
    with torch.no_grad():
        assert float(every.loss(batch, None, "sum_per_sequence")[0]) > float(
            m.loss(batch, None, "sum_per_sequence")[0]
        ) + 1e-3


def plain_greedy(plain: Plain, src: np.ndarray, steps: int) -> list[int]:
    """Greedy decoding with the plain model over its own classes (class c = id c + 2)."""
    return plain.greedy(src, steps, offset=EOS)


def test_teacher_forced_metrics_and_greedy_decoding_equal_the_plain_model() -> None:
    """Losses, ``tf_exact`` / ``tf_token`` and greedy outputs per example against the plain
    model's argmax over its own classes (class c = target id c + 2)."""
    data = pairs(16, seed=5)
    m = feeding_model(seed=7, **LI2021, teacher_forced_exact=True)
    rows = np.argsort([len(s) for s in data.src], kind="stable")
    batch = m.make_batch(data, [rows], CPU)
    metrics, preds = m.evaluate_batch(batch)
    plain = Plain(m, None, [])
    with torch.no_grad():
        for j, r in enumerate(rows):
            z = plain.teacher_forced(data.src[r], data.tgt[r], 0)
            gold = torch.as_tensor([*data.tgt[r].tolist(), EOS]) - EOS
            loss = float(F.cross_entropy(z, gold, reduction="sum"))
            assert abs(loss - float(metrics["loss"][0, j])) <= 1e-12 * max(1.0, loss), j
            right = (z.argmax(1) == gold).double()
            assert float(right.min()) == float(metrics["tf_exact"][0, j])
            assert abs(float(right.mean()) - float(metrics["tf_token"][0, j])) <= 1e-12
            assert preds[0][j].tolist() == plain_greedy(plain, data.src[r], len(preds[0][j])), j
    assert len({tuple(p) for p in preds[0]}) > 3  # predictions really vary


def test_decoding_never_emits_pad_or_bos_where_every_class_would() -> None:
    """Untrained models of the same seeds emit ``<pad>`` and ``<s>`` under ``all``; under
    ``targets`` no greedy step or beam does, even with every real class's bias at -1e4 (an
    argmax over the restricted classes, not merely unlikely ones), and the argmax is then
    unchanged (the same shift of every class)."""
    data = pairs(40, seed=5)
    rows = [np.arange(40)]
    emitted_all = 0
    for seed in range(3):
        every = feeding_model(seed=seed, **VARIANTS["li2021_scan"])
        toks = np.concatenate(list(every.predict(every.make_batch(data, rows, CPU))[0]))
        emitted_all += int((toks < EOS).sum())
        m = feeding_model(seed=seed, **LI2021)
        batch = m.make_batch(data, rows, CPU)
        greedy = m.predict(batch)[0]
        assert all((p >= EOS).all() for p in greedy)
        with torch.no_grad():
            m.out_bias.sub_(1e4)
        shifted = m.predict(batch)[0]
        assert all(np.array_equal(a, b) for a, b in zip(greedy, shifted, strict=True))
        beam = Seq2Seq(m.cfg.model_copy(update={"beam_width": 3}), make_meta(), 1).double()
        beam.load_member_state(0, m.member_state(0))
        assert all((p >= EOS).all() for p in beam.predict(batch)[0])
    assert emitted_all > 50  # the check has teeth: with every class they do come out


# --- the fast path: bundle members, lone runs, the reference -----------------------------------


def fast_model(k: int, seeds: list[int], **cfg: Any) -> Seq2Seq:
    config = Seq2SeqConfig(
        emb_size=6, hidden_size=5, bidirectional=True, init="tf", tgt_emb_size=8,
        attention_activation="none", output_classes="targets", dropout=0.1, **cfg,
    )
    m = Seq2Seq(config, make_meta(), k)
    for i, s in enumerate(seeds):
        m.init_member(i, torch_generator(s))
    return m


def test_fast_path_equals_the_reference_exactly_in_float64() -> None:
    data = pairs(12, seed=1)
    fast = fast_model(1, [5]).double()
    assert fast.cfg.impl == "fast" and fast.out_weight.shape[1] == len(make_meta()["tgt_vocab"]) - 2
    ref = fast.to_reference(0).double()
    losses = []
    for m in (fast, ref):
        m.zero_grad(set_to_none=True)
        loss = m.loss(m.make_batch(data, [np.arange(7)], CPU), MemberNoise([42]), "sum_per_sequence")
        loss.sum().backward()
        losses.append(loss.detach())
    assert losses[0].dtype == torch.float64 and rel(losses[0], losses[1]) < 1e-12
    for (name, pf), (_, pr) in zip(fast.named_parameters(), ref.named_parameters(), strict=True):
        assert pf.grad is not None and pr.grad is not None
        assert rel(pf.grad, pr.grad) < 1e-10, name


def test_bundle_members_train_as_lone_runs_and_the_reference(kernels: str) -> None:
    """40 Adam steps (dropout 0.1, own batches per member, ``sum_per_sequence``): a K=2
    bundle's members end where their lone fast runs and the reference end (float32), and
    evaluate to the same losses and greedy outputs, none of them ``<pad>`` or ``<s>``."""
    data = pairs(120, seed=3)
    init, drop, order = [11, 12], [21, 22], [31, 32]

    def train(m: Seq2Seq, members: list[int]) -> Seq2Seq:
        for slot, i in enumerate(members):
            m.init_member(slot, torch_generator(init[i]))
        noise = MemberNoise([drop[i] for i in members])
        rngs = [np.random.default_rng(order[i]) for i in members]
        opt = torch.optim.Adam(m.parameters(), lr=0.01, foreach=False)
        for _ in range(40):
            rows = m.train_layout(data, [r.choice(len(data), 8, replace=False) for r in rngs])
            opt.zero_grad(set_to_none=True)
            m.loss(m.make_batch(data, rows, CPU), noise, "sum_per_sequence").sum().backward()
            opt.step()
        return m

    bundle = train(fast_model(2, []), [0, 1])
    start = fast_model(1, [init[0]]).member_state(0)
    assert max(rel(bundle.member_state(0)[n], start[n]) for n in start) > 0.05  # it trained
    order_ = np.argsort([len(s) for s in data.src], kind="stable")[:48]
    with torch.no_grad():
        metrics, preds = bundle.evaluate_batch(bundle.make_batch(data, [order_] * 2, CPU))
    for i in range(2):
        lone = train(fast_model(1, []), [i])
        ref = train(Seq2Seq(lone.cfg.model_copy(update={"impl": "reference"}), make_meta(), 1), [i])
        mine = bundle.member_state(i)
        for other in (lone, ref):
            for name, value in other.member_state(0).items():
                assert rel(mine[name], value) < 1e-5, (i, name)
        with torch.no_grad():
            lone_metrics, lone_preds = lone.evaluate_batch(lone.make_batch(data, [order_], CPU))
        assert torch.allclose(metrics["loss"][i], lone_metrics["loss"][0], rtol=1e-5)
        assert all(np.array_equal(a, b) for a, b in zip(preds[i], lone_preds[0], strict=True))
        assert all((p >= EOS).all() for p in preds[i])


def test_fast_greedy_and_beam_never_emit_pad_or_bos(kernels: str) -> None:
    """The fast path's decoders (the C decoder where it applies, torch ops otherwise, beam
    search) with the real classes' biases at -1e4: never below EOS. (Such a shift changes
    nothing exactly but rounds float32 logits to ~1e-3, so near-ties may flip here.)"""
    data = pairs(40, seed=6)
    m = fast_model(2, [3, 4])
    state = {n: p.detach().clone() for n, p in m.state_dict().items()}
    tanh = Seq2Seq(m.cfg.model_copy(update={"attention_activation": "tanh"}), make_meta(), 2)
    for model in (m, tanh):  # tanh: the C decoder where it applies; none: torch ops
        model.load_state_dict(state)
        batch = model.make_batch(data, [np.arange(40)] * 2, CPU)
        outputs = [model.predict(batch)]
        with torch.no_grad():
            model.out_bias.sub_(1e4)
        outputs.append(model.predict(batch))
        beam = Seq2Seq(model.cfg.model_copy(update={"beam_width": 4}), make_meta(), 2)
        beam.load_state_dict(model.state_dict())
        outputs.append(beam.predict(batch))
        for preds in outputs:
            for k in range(2):
                assert len(preds[k]) == 40 and all((p >= EOS).all() for p in preds[k])


# --- config, identity, TF's Glorot bound, the study file ---------------------------------------


def test_output_classes_keeps_ids_and_the_glorot_bound_uses_the_restricted_fan_out() -> None:
    assert Seq2SeqConfig().output_classes == "all"
    assert "output_classes" not in Seq2SeqConfig(output_classes="all").identity()
    assert Seq2SeqConfig(output_classes="targets").identity()["output_classes"] == "targets"
    plain = parse(TINY_STUDY)
    stated = parse({**TINY_STUDY, "model": {**TINY_STUDY["model"], "output_classes": "all"}})
    on = parse({**TINY_STUDY, "model": {**TINY_STUDY["model"], "output_classes": "targets"}})
    assert stated.points[0].trial_id == plain.points[0].trial_id != on.points[0].trial_id

    # SCAN's sizes: a Dense of 7 units over h~ (64): Glorot U(+-sqrt(6 / (64 + 7)))
    cfg = Seq2SeqConfig(
        emb_size=32, hidden_size=32, bidirectional=True, init="tf", tgt_emb_size=8,
        output_classes="targets",
    )
    bound, every_class = math.sqrt(6.0 / (64 + 7)), math.sqrt(6.0 / (64 + 9))
    largest = 0.0
    for seed in range(5):
        m = Seq2Seq(cfg, SCAN_META, 1)
        m.init_member(0, torch_generator(seed))
        assert m.out_weight.shape == (1, 7, 64) and not m.out_bias.any()
        largest = max(largest, float(m.out_weight.detach().abs().max()))
    # 2,240 draws: their largest is within 0.1% of the bound, above the 9-class bound
    assert every_class < bound * 0.99 < largest <= bound


def test_the_li2021_scan_study_sets_both_options() -> None:
    study = parse(yaml.safe_load((CONFIGS / "li2021_scan.yaml").read_text()))
    for point in study.points:
        assert point.spec.model.output_classes == "targets"  # type: ignore[attr-defined]
        assert point.spec.task.end_symbol is True  # type: ignore[attr-defined]
        m = Seq2Seq(point.spec.model, SCAN_META, 1)
        assert m.arch.out_offset == EOS and m.out_weight.shape[1] == len(TGT_VOCAB) - 2 == 7
        assert TGT_VOCAB.tokens[PAD] == "<pad>" and TGT_VOCAB.tokens[BOS] == "<s>"  # left out
