"""The decoder-only Transformer (trainables.models.transformer): the one-seed module, the
sequence layout, answer-only losses, greedy generation (free-running and oracle length)
against a one-example-at-a-time reference decoder, and the bundle's vmap against its loop."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tests_support import assert_replayed_round_equals_eager

from trainables.data import BOS, EOS
from trainables.errors import ConfigError
from trainables.loop import BundleRun
from trainables.models.transformer import (
    IGNORE,
    DecoderLM,
    Transformer,
    TransformerConfig,
    lay_out,
)
from trainables.seeding import derive_seedset
from trainables.spec import RunSpec


@pytest.fixture(autouse=True)
def _one_thread(torch_threads: None) -> None:
    """One torch thread, as in a trial."""


REWRITING = {"name": "symbol_rewriting", "n_symbols": 8, "train_size": 64, "val_size": 16, "val_ood_size": 16,
             "test_size": 16, "train_lengths": [1, 3], "val_ood_lengths": [2, 3], "repeat_lengths": [2, 3],
             "short_lengths": [1, 1], "long_lengths": [4, 5]}  # fmt: skip
"""Symbol rewriting, tiny: sources of 1-5 symbols, targets three times as long."""


def _run(task: dict[str, Any], k: int = 2, **model: Any) -> BundleRun:
    spec = RunSpec.from_dict({
        "task": task,
        "model": {"name": "transformer", "d_model": 16, "n_heads": 2, "n_layers": 2, "d_ff": 32, **model},
        "train": {"optimizer": "adamw", "lr": 0.01, "batch_size": 8, "max_steps": 4, "eval_every_steps": 4,
                  "selection": {"mode": "last", "early_stop": False}},
    })  # fmt: skip
    seeds = [derive_seedset(1, i) for i in range(k)]
    t = spec.make_task()
    return BundleRun(spec, seeds, t, t.build(seeds[0].data_seed))


def test_the_module_is_causal_and_sized_by_the_config() -> None:
    cfg = TransformerConfig(d_model=16, n_heads=4, n_layers=2, d_ff=24)
    torch.manual_seed(0)
    lm = DecoderLM(cfg, vocab_in=11, vocab_out=7, context=9).eval()
    x = torch.randint(0, 11, (3, 9))
    y = lm(x)
    assert y.shape == (3, 9, 7)
    x2 = x.clone()
    x2[:, 5:] = (x2[:, 5:] + 1) % 11  # change the future: the past's outputs stay
    assert torch.equal(lm(x2)[:, :5], y[:, :5])
    assert not torch.allclose(lm(x2)[:, 5:], y[:, 5:])
    names = dict(lm.named_parameters())
    assert names["pos.weight"].shape == (9, 16) and names["head.weight"].shape == (7, 16)
    assert "blocks.1.attn.k.bias" not in names and "blocks.1.attn.q.bias" in names  # no key bias
    assert sum(1 for n in names if n.startswith("blocks.")) == 2 * 15  # 2 LN, q v proj fc proj: w+b, k: w


def test_nope_layer_norm_and_bias_switches() -> None:
    cfg = TransformerConfig(d_model=8, n_heads=2, d_ff=8, pos="none", layer_norm=False, bias=False)
    names = [n for n, _ in DecoderLM(cfg, 5, 4, 6).named_parameters()]
    assert names == ["tok.weight", "blocks.0.attn.q.weight", "blocks.0.attn.k.weight", "blocks.0.attn.v.weight",
                     "blocks.0.attn.proj.weight", "blocks.0.mlp.fc.weight", "blocks.0.mlp.proj.weight",
                     "head.weight"]  # fmt: skip


def test_inits_have_the_published_scales() -> None:
    torch.manual_seed(0)
    nanda = dict(DecoderLM(TransformerConfig(d_model=128, init="nanda"), 200, 100, 4).named_parameters())
    assert nanda["tok.weight"].std().item() == pytest.approx(1 / math.sqrt(128), rel=0.02)
    assert nanda["blocks.0.mlp.proj.weight"].std().item() == pytest.approx(1 / math.sqrt(128), rel=0.02)
    assert nanda["head.weight"].std().item() == pytest.approx(1 / math.sqrt(100), rel=0.02)
    assert nanda["blocks.0.mlp.fc.bias"].abs().max().item() == 0.0
    gpt2 = dict(DecoderLM(TransformerConfig(d_model=128, n_layers=2), 200, 100, 4).named_parameters())
    assert gpt2["tok.weight"].std().item() == pytest.approx(0.02, rel=0.02)
    assert gpt2["blocks.1.attn.proj.weight"].std().item() == pytest.approx(0.02 / 2, rel=0.05)
    assert gpt2["blocks.0.ln1.weight"].eq(1).all()


def test_bad_config_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"model\.n_heads.*Fix"):
        RunSpec.from_dict({"task": {"name": "modular"}, "model": {"name": "transformer", "d_model": 30, "n_heads": 4}})
    with pytest.raises(ConfigError, match=r"model\.pos"):
        RunSpec.from_dict({"task": {"name": "modular"}, "model": {"name": "transformer", "pos": "rotary"}})
    with pytest.raises(ConfigError, match=r"model\.name"):  # a classify task
        RunSpec.from_dict({"task": {"name": "toy2d"}, "model": {"name": "transformer"}})


@pytest.mark.parametrize(("bos", "eos"), [(True, True), (False, False), (True, False), (False, True)])
def test_layout_by_hand(bos: bool, eos: bool) -> None:
    """Two examples: src [5 6 7] -> tgt [3 4]; src [5] -> tgt [4]; target ids shift by 10."""
    src = np.array([[5, 6, 7], [5, 0, 0]])
    tgt = np.array([[3, 4], [4, 0]])
    inputs, targets, prompt = lay_out(src, np.array([3, 1]), tgt, np.array([2, 1]), offset=10, bos=bos, eos=eos, width=8)
    b = [BOS + 10] if bos else []
    first = [5, 6, 7, *b, 13, *([14] if eos else [])]
    second = [5, *b, *([14] if eos else [])]
    assert inputs.tolist() == [first + [0] * (8 - len(first)), second + [0] * (8 - len(second))]
    assert prompt.tolist() == [3 + bos, 1 + bos]
    want0 = [IGNORE] * (2 + bos) + [3, 4] + ([EOS] if eos else [])
    want1 = [IGNORE] * bos + [4] + ([EOS] if eos else [])
    assert targets.tolist() == [want0 + [IGNORE] * (8 - len(want0)), want1 + [IGNORE] * (8 - len(want1))]


def test_the_loss_is_the_answer_tokens_cross_entropy() -> None:
    """Grokking's layout (no <s>, no </s>): the loss is the cross-entropy at '=' alone."""
    run = _run({"name": "modular", "p": 5, "train_fraction": 0.5}, bos=False, eos=False)
    split = run.data.splits["test"]
    rows = np.arange(len(split))
    batch = run.model.make_batch(split.data, [rows] * 2, run.device)
    got = run.model.example_losses(batch)
    tgt_ids = torch.tensor([t[0] for t in split.data.tgt])
    for k in range(2):
        module = run.model.member_module(k).eval()
        src = torch.tensor(np.stack(split.data.src))  # (N, 4): a + b =
        logits = module(src)[:, -1]  # at '='
        assert torch.allclose(got[k], F.cross_entropy(logits, tgt_ids, reduction="none"), atol=1e-5)
    mean = run.model.loss(batch, None, "token_mean")
    assert torch.allclose(mean, got.mean(1), atol=1e-6)
    assert torch.allclose(run.model.loss(batch, None, "sum"), got.sum(1), atol=1e-4)


def _reference_decode(module: torch.nn.Module, prompt: list[int], steps: int, offset: int, banned: list[int],
                      stop_at_eos: bool) -> list[int]:  # fmt: skip
    """One example, one token at a time, on the one-seed module."""
    seq, out = list(prompt), []
    for _ in range(steps):
        logits = module(torch.tensor([seq]))[0, -1].clone()
        logits[banned] = float("-inf")
        tok = int(logits.argmax())
        out.append(tok)
        if stop_at_eos and tok == EOS:
            break
        seq.append(tok + offset)
    return out


def test_greedy_generation_free_running_and_oracle_equal_a_reference_decoder() -> None:
    run = _run(REWRITING, k=2)
    model = run.model
    assert isinstance(model, Transformer)
    for _ in range(3):  # a little training, so the members differ from their init and each other
        run.train_round() if not run.done else None
    split = run.data.splits["long"]  # sources of 4-5 symbols, longer than any training source
    rows = np.arange(len(split))
    batch = model.make_batch(split.data, [rows] * 2, run.device)
    with torch.no_grad():
        free = model.predict(batch)
        oracle, _ = model.generate(batch, oracle=True)
        metrics, preds = model.evaluate_batch(batch)
    assert all(np.array_equal(a, b) for a, b in zip(preds[1], free[1], strict=True))
    max_tgt = int(model.meta["max_tgt_len"])
    for k in range(2):
        module = model.member_module(k).eval()
        for i in rows:
            prompt = [*split.data.src[i].tolist(), BOS + model.offset]
            ref = _reference_decode(module, prompt, max_tgt + 1, model.offset, [0, BOS], stop_at_eos=True)
            assert free[k][i].tolist() == ref, (k, i)
            n = len(split.data.tgt[i])
            ref = _reference_decode(module, prompt, n, model.offset, [0, BOS, EOS], stop_at_eos=False)
            assert oracle[k, i, :n].tolist() == ref, (k, i)
            assert metrics["oracle_exact"][k, i].item() == float(ref == split.data.tgt[i].tolist())


@pytest.mark.parametrize(("pos", "layer_norm"), [("learned", True), ("none", False)])
def test_cached_steps_give_the_logits_of_the_whole_sequence(pos: str, layer_norm: bool) -> None:
    """The cached call that generation uses: prompts of 2-5 tokens (padded to 5: slots the
    mask hides), then one token per example per step at that example's own position, its
    keys and values cached in the slot after the last (all examples alike); each step's
    logits equal those a full forward of the sequence so far gives at that position
    (Nanda et al.'s init: weights large enough that attending one slot too many shows)."""
    cfg = TransformerConfig(d_model=16, n_heads=2, n_layers=2, d_ff=32, pos=pos, layer_norm=layer_norm, init="nanda")
    torch.manual_seed(0)
    net = DecoderLM(cfg, vocab_in=12, vocab_out=7, context=12).eval()
    prompt = torch.tensor([2, 5, 3, 4])  # (B,)
    steps, top, b = 6, 5, 4
    seqs = torch.randint(1, 12, (b, top + steps))  # each row: its prompt, then its "answer"
    keys = torch.zeros(cfg.n_layers, b, cfg.n_heads, top + steps, cfg.d_model // cfg.n_heads)
    values = torch.zeros_like(keys)
    slots = torch.arange(top + steps)
    padded = torch.where(torch.arange(top) < prompt[:, None], seqs[:, :top], 0)
    with torch.no_grad():
        logits, keys[..., :top, :], values[..., :top, :] = net(
            padded, keys[..., :0, :], values[..., :0, :], torch.zeros(b, 0, dtype=torch.bool), torch.zeros_like(prompt))
        got = [logits[torch.arange(b), prompt - 1]]
        for i in range(steps):
            fed = seqs[torch.arange(b), prompt + i]  # each example's next token, at its own position
            visible = (slots < prompt[:, None]) | ((slots >= top) & (slots < top + i))
            logits, keys[..., top + i : top + i + 1, :], values[..., top + i : top + i + 1, :] = net(
                fed[:, None], keys, values, visible, prompt + i)
            got.append(logits[:, 0])
        for e in range(b):
            n = int(prompt[e])
            whole = net(torch.cat([seqs[e, :n], seqs[e, n : n + steps]])[None])[0]  # (n + steps, V)
            for i, step_logits in enumerate(got):
                torch.testing.assert_close(step_logits[e], whole[n - 1 + i], rtol=1e-5, atol=1e-5)


def test_the_bundles_vmap_equals_its_member_loop() -> None:
    run = _run(REWRITING, k=3, dropout=0.2)
    data = run.data.train.data
    rows = [np.arange(8) + 8 * k for k in range(3)]
    batch = run.model.make_batch(data, run.model.train_layout(data, rows), run.device)
    assert run.model.bundling == "vmap"
    state = run.noise.state()
    vmapped = run.model.loss(batch, run.noise, "token_mean")
    run.noise.set_state(state)
    run.model.bundling = "loop"
    looped = run.model.loss(batch, run.noise, "token_mean")
    assert torch.allclose(vmapped, looped, rtol=1e-5)
    assert batch.inputs.shape[-1] == 3 + 1 + 9  # the split's longest: 3 symbols -> 9 tokens + </s>


def test_full_batch_training_shares_one_input_across_the_bundle() -> None:
    run = _run({"name": "modular", "p": 5, "train_fraction": 0.5}, k=3, bos=False, eos=False)
    data = run.data.train.data
    perms = [np.random.default_rng(k).permutation(len(data)) for k in range(3)]
    batch = run.model.make_batch(data, run.model.train_layout(data, perms), run.device)
    assert batch.inputs.shape == (1, len(data), 4)


def test_a_graph_batch_is_the_training_batch_and_trains_the_same() -> None:
    """What a captured step runs (``graph_batch``) is the training batch: the same loss."""
    run = _run(REWRITING, k=3, dropout=0.2)
    data = run.data.train.data
    layout = run.model.train_layout(data, [np.arange(8) + 8 * k for k in range(3)])
    plain, graph = run.model.make_batch(data, layout, run.device), run.model.graph_batch(data, layout, run.device)
    state = run.noise.state()
    want = run.model.loss(plain, run.noise, "token_mean")
    run.noise.set_state(state)
    assert torch.equal(run.model.loss(graph, run.noise, "token_mean"), want)


@pytest.mark.cuda
def test_replayed_training_steps_equal_eager_steps_on_cuda() -> None:
    """The transformer's training step replayed from CUDA graphs (``execution.cuda_graphs``)
    equals the same steps run op by op, dropout masks (drawn inside the graph) included."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    spec = RunSpec.from_dict({
        "task": REWRITING,
        "model": {"name": "transformer", "d_model": 16, "n_heads": 2, "n_layers": 2, "d_ff": 32, "dropout": 0.2},
        "train": {"optimizer": "adamw", "lr": 0.01, "batch_size": 8, "max_steps": 12, "eval_every_steps": 12,
                  "selection": {"mode": "last", "early_stop": False}},
    })  # fmt: skip
    seeds = [derive_seedset(1, i) for i in range(3)]
    task = spec.make_task()
    data = task.build(seeds[0].data_seed)
    graphed, eager = (BundleRun(spec, seeds, task, data, "cuda", cuda_graphs=True) for _ in range(2))
    assert_replayed_round_equals_eager(graphed, eager)
