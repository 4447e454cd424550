"""The seq2seq training step as CUDA graphs (``execution.cuda_graphs``; ``trainables/graphs.py``).

On the CPU: a batch padded to buckets (what a graph is captured for) gives the losses and
gradients of the unpadded batch, under generator and counter noise, with the C kernels and
with torch ops (CUDA's), and the same evaluation (per-example values and decoded tokens);
positional masks give a lone run and a bundle member the same multipliers. On CUDA
(``-m cuda``): replayed steps and evaluations equal eager ones on the same batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from tests_support import assert_replayed_round_equals_eager

from trainables.loop import BundleRun
from trainables.models.base import MemberNoise
from trainables.models.counter_noise import CounterNoise
from trainables.models.seq2seq.layout import LENGTH_BUCKET, TOKEN_BUCKET, collate
from trainables.seeding import derive_seedset
from trainables.spec import RunSpec


@pytest.fixture(autouse=True)
def _one_thread(torch_threads: None) -> Iterator[None]:
    yield


def spec(train: dict[str, Any] | None = None, **model: Any) -> RunSpec:
    return RunSpec.from_dict({
        "task": {"name": "symbol_rewriting", "train_size": 400, "val_size": 50, "val_ood_size": 50, "test_size": 50},
        "model": {"name": "seq2seq", "emb_size": 16, "hidden_size": 16, "dropout": 0.3, **model},
        "train": {"max_steps": 30, "eval_every_steps": 30, "batch_size": 16, "optimizer": "adam", "lr": 0.01,
                  "clip_norm": 1.0, "selection": {"mode": "last", "early_stop": False}, **(train or {})},
    })


def new_run(s: RunSpec, indices: list[int], device: str = "cpu", cuda_graphs: bool = False) -> BundleRun:
    seeds = [derive_seedset(3, i) for i in indices]
    task = s.make_task()
    return BundleRun(s, seeds, task, task.build(seeds[0].data_seed), device, cuda_graphs=cuda_graphs)


def loss_and_grads(run: BundleRun, batch: Any, noise: MemberNoise) -> tuple[torch.Tensor, list[torch.Tensor]]:
    for p in run.model.parameters():
        p.grad = None
    losses = run.model.loss(batch, noise, run.train_cfg.loss_reduction or "sum")
    losses.sum().backward()
    return losses.detach(), [p.grad.clone() for p in run.model.parameters() if p.grad is not None]


@pytest.mark.parametrize("feeding", [False, True], ids=["plain", "input_feeding"])
@pytest.mark.parametrize("noise_kind", [MemberNoise, CounterNoise], ids=["generators", "counter"])
def test_a_batch_padded_to_buckets_gives_the_same_losses_and_gradients(
    kernels: str, feeding: bool, noise_kind: type[MemberNoise]
) -> None:
    run = new_run(spec(input_feeding=feeding, bidirectional=True), [0, 1, 2])
    model, data = run.model, run.train_split.data
    rng = np.random.default_rng(1)
    layout = model.train_layout(data, [rng.choice(len(run.train_split), 13, replace=False) for _ in range(3)])
    plain = model.make_batch(data, layout, torch.device("cpu"))
    padded = collate(data, layout, "cpu", model.cfg.reverse_source, model.decode_len, buckets=True)
    s, t, n = padded.src.shape[2], padded.tgt_in.shape[2], padded.tok_pos.shape[1]
    assert s % LENGTH_BUCKET == 0 and t % LENGTH_BUCKET == 0 and n % TOKEN_BUCKET == 0
    assert n > plain.tok_pos.shape[1] and (s, t) >= (plain.src.shape[2], plain.tgt_in.shape[2])
    seeds = [m.seeds.dropout_seed for m in run.members]
    want_loss, want_grads = loss_and_grads(run, plain, noise_kind(seeds))
    if noise_kind is CounterNoise:  # what a graph runs: the padded batch without generator positions
        padded = model.graph_batch(data, layout, torch.device("cpu"))
    got_loss, got_grads = loss_and_grads(run, padded, noise_kind(seeds))
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-6, atol=1e-6)
    assert len(got_grads) == len(want_grads)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("feeding", [False, True], ids=["plain", "input_feeding"])
@pytest.mark.parametrize("width", [1, 2], ids=["greedy", "beam2"])
def test_a_graph_batch_evaluates_as_the_plain_batch(kernels: str, feeding: bool, width: int) -> None:
    """What a captured evaluation computes (``eval_tensors`` of the padded batch, decoding
    steps read on the device) gives every example the values and tokens of the plain batch."""
    run = new_run(spec(input_feeding=feeding, teacher_forced_exact=True, beam_width=width), [0, 1, 2])
    model, split = run.model, run.data.splits["long"]
    rows = [np.arange(min(len(split), 23))] * 3
    cpu = torch.device("cpu")
    plain = model.make_batch(split.data, rows, cpu)
    padded = model.graph_batch(split.data, rows, cpu)
    assert padded is not None and padded.decode_steps_t is not None
    assert padded.src.shape[2] > plain.src.shape[2] or padded.tok_pos.shape[1] > plain.tok_pos.shape[1]
    with torch.no_grad():
        want_values, want_preds = model.evaluate_batch(plain)
        got_values, got_preds = model.eval_from_tensors(model.eval_tensors(padded), padded)
    assert got_values.keys() == want_values.keys() == {"loss", "tf_exact", "tf_token"}
    for name, want in want_values.items():
        torch.testing.assert_close(got_values[name], want, rtol=1e-5, atol=1e-5, msg=name)
    for got, want in zip(got_preds, want_preds, strict=True):
        assert [list(r) for r in got] == [list(r) for r in want]


def test_graph_batches_need_the_fast_implementation() -> None:
    run = new_run(spec(), [0])
    assert run.model.graph_batch(run.train_split.data, [np.arange(4)], torch.device("cpu")) is not None
    ref = new_run(spec(impl="reference"), [0])
    assert ref.model.graph_batch(ref.train_split.data, [np.arange(4)], torch.device("cpu")) is None


def test_the_reference_implementation_refuses_counter_noise_by_name() -> None:
    from trainables.errors import ConfigError

    run = new_run(spec(impl="reference"), [0], cuda_graphs=True)
    with pytest.raises(ConfigError, match=r"execution\.cuda_graphs"):
        run.train_round()


def test_counter_noise_trains_a_member_as_its_lone_run_on_the_cpu() -> None:
    """No graph on a CPU, but the same counter masks: bundle members equal lone runs."""
    s = spec(input_feeding=True)
    bundle = new_run(s, [0, 1, 2], cuda_graphs=True)
    assert isinstance(bundle.noise, CounterNoise) and bundle.captured is None
    bundle.train_round()
    for k in range(3):
        lone = new_run(s, [k], cuda_graphs=True)
        lone.train_round()
        for (name, p), q in zip(bundle.model.named_parameters(), lone.model.parameters(), strict=True):
            torch.testing.assert_close(p.detach()[k], q.detach()[0], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.cuda
@pytest.mark.parametrize("feeding", [False, True], ids=["plain", "input_feeding"])
def test_replayed_steps_equal_eager_steps_on_cuda(feeding: bool) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    s = spec(input_feeding=feeding)
    assert_replayed_round_equals_eager(new_run(s, [0, 1, 2], "cuda", cuda_graphs=True),
                                       new_run(s, [0, 1, 2], "cuda", cuda_graphs=True))  # same padded batches
    # the same masks as a CPU run (counter noise): the device changes only float rounding
    # (SGD: Adam would turn rounding-level gradients into full steps)
    s = spec({"optimizer": "sgd", "lr": 0.1, "max_steps": 10, "eval_every_steps": 10}, input_feeding=feeding)
    runs = [new_run(s, [0, 1, 2], device, cuda_graphs=True) for device in ("cuda", "cpu")]
    for run in runs:
        run.train_round()
    assert runs[0].captured is not None and runs[0].captured.replays > 0
    for (name, p), q in zip(runs[0].model.named_parameters(), runs[1].model.parameters(), strict=True):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.cuda
@pytest.mark.parametrize("feeding", [False, True], ids=["plain", "input_feeding"])
def test_replayed_evaluations_equal_eager_ones_on_cuda(feeding: bool) -> None:
    """An evaluation replayed from CUDA graphs (the third: the first runs eagerly, the second
    captures) gives the values and predictions of the eager evaluation of the same padded
    batches, and of the plain batches to float rounding."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    s = spec(input_feeding=feeding, teacher_forced_exact=True)
    graphed = new_run(s, [0, 1, 2], "cuda", cuda_graphs=True)
    assert graphed.captured_eval is not None
    split = graphed.data.splits["long"]
    evaluations = [graphed.evaluate(split, predictions=True) for _ in range(3)]
    c = graphed.captured_eval
    assert c.failed is None, c.failed
    assert c.replays > 0 and len(c.graphs) > 0
    eager = new_run(s, [0, 1, 2], "cuda", cuda_graphs=True)
    assert eager.captured_eval is not None
    eager.captured_eval.warm_sightings = 10**9  # the same padded batches, never captured
    plain = new_run(s, [0, 1, 2], "cuda")  # plain batches, no graphs
    assert plain.captured_eval is None
    same, unpadded = eager.evaluate(split, predictions=True), plain.evaluate(split, predictions=True)
    for got in evaluations[1:]:  # captured, then replayed
        for k in range(3):
            assert got.means[k].keys() == same.means[k].keys() == unpadded.means[k].keys()
            for name, value in got.means[k].items():
                assert value == pytest.approx(same.means[k][name], rel=1e-6, abs=1e-7), (k, name)
                assert value == pytest.approx(unpadded.means[k][name], rel=1e-4, abs=1e-5), (k, name)
            assert [list(r) for r in got.predictions[k]] == [list(r) for r in same.predictions[k]]


def test_per_example_sums_on_a_dense_grid_equal_index_add() -> None:
    """CUDA's deterministic per-example sums (each token its own slot, then a sum over T)
    equal the CPU's ``index_add_`` (run here on the CPU both ways)."""
    from trainables.models.seq2seq.model import _per_example

    run = new_run(spec(), [0, 1, 2])
    data = run.train_split.data
    rng = np.random.default_rng(2)
    batch = run.model.make_batch(data, [rng.choice(len(run.train_split), 9, replace=False) for _ in range(3)], torch.device("cpu"))
    values = torch.rand(batch.tok_pos.shape, dtype=torch.float64) * (batch.tok_target != -100)
    torch.testing.assert_close(_per_example(values, batch, dense=True), _per_example(values, batch, dense=False))
    assert _per_example(values, batch).shape == batch.src_len.shape


def test_cuda_graphs_with_the_reference_implementation_is_refused_before_ray() -> None:
    from tests_support import TINY_STUDY

    from study.config import parse
    from study.runner import check_bundles
    from trainables.errors import ConfigError

    ref = {**TINY_STUDY["model"], "impl": "reference"}
    check_bundles(parse({**TINY_STUDY, "model": ref, "execution": {"bundle_size": 1}}))
    with pytest.raises(ConfigError, match=r"execution\.cuda_graphs.*impl: reference.*impl: fast"):
        check_bundles(parse({**TINY_STUDY, "model": ref, "execution": {"bundle_size": 1, "cuda_graphs": True}}))
    check_bundles(parse({**TINY_STUDY, "execution": {"bundle_size": 2, "cuda_graphs": True}}))
