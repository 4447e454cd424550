"""The contract every registered (task, model) pair must satisfy.

Parametrised over the registries, so a new task or model is tested for free:

* it trains end to end on the task's tiny config and scores every split in range;
* the same seeds give bit-identical results (CPU);
* bundle equivalence: member i of a K=3 bundle equals the lone run with the same seeds
  (parameters after 200 optimizer steps to 1e-5 relative; on a tiny end-to-end run, the
  same selected epoch and metrics to 1e-4), dropout included.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from trainables.errors import ConfigError
from trainables.loop import BundleRun, get_task
from trainables.registry import MODELS, TASKS
from trainables.seeding import derive_seedset
from trainables.spec import RunSpec

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
PAIRS = [(t, m) for t in TASKS for m in MODELS if m.data_kind == t.data_kind]
IDS = [f"{t.name}-{m.name}" for t, m in PAIRS]


def tiny_spec(task_cls: Any, model_cls: Any, **train: Any) -> RunSpec:
    task = dict(task_cls.tiny)
    if "data_dir" in task:
        folder = SHARED_DATA / task["data_dir"]
        if not folder.is_dir():
            pytest.skip(f"{task_cls.name} needs reference data at {folder} (absent in a fresh clone)")
        task["data_dir"] = str(folder)
    raw = {
        "task": {"name": task_cls.name, **task},
        "model": {"name": model_cls.name, **model_cls.tiny},
        "train": {"max_epochs": 2, **task_cls.tiny_train, **train},
    }
    return RunSpec.from_dict(raw)


def _run(spec: RunSpec, indices: list[int], device: str = "cpu") -> BundleRun:
    seeds = [derive_seedset(11, i) for i in indices]
    task = get_task(spec)
    try:
        run = BundleRun(spec, seeds, task, task.build(seeds[0].data_seed), device)
    except ConfigError as exc:
        if exc.field != "model.name":
            raise
        pytest.skip(f"{spec.model_name} cannot take {spec.task_name}'s inputs: {exc}")
    while not run.done:
        run.train_round()
    return run


def _evals(run: BundleRun, k: int) -> dict[tuple[str, str], float]:
    rows = run.finalize()[k]
    return {(r["split"], r["metric"]): r["value"] for r in rows["evals"]}


def test_registry_is_not_empty() -> None:
    assert {"symbol_rewriting", "dyck1", "scan", "mnist_pairs", "toy2d"} <= set(TASKS.names())
    assert {"seq2seq", "rnn_tagger", "convnet", "mlp"} <= set(MODELS.names())
    assert len(PAIRS) >= 5


@pytest.mark.parametrize(("task_cls", "model_cls"), PAIRS, ids=IDS)
def test_pair_trains_scores_and_is_deterministic(task_cls: Any, model_cls: Any, torch_threads: None) -> None:
    spec = tiny_spec(task_cls, model_cls)
    a, b = _run(spec, [0]), _run(spec, [0])
    ev_a, ev_b = _evals(a, 0), _evals(b, 0)
    assert ev_a == ev_b, "same seeds must give bit-identical metrics on CPU"
    roles = {s.role for s in a.data.splits.values()}
    assert "train" in roles and "test" in roles
    assert {split for split, _ in ev_a} == set(a.data.splits)
    for (split, metric), value in ev_a.items():
        if metric in ("accuracy", "exact", "correct"):
            assert 0.0 <= value <= 1.0, (split, metric, value)
        assert np.isfinite(value) or metric == "loss", (split, metric, value)
    assert a.members[0].best_epoch is not None or a.step_based
    other = _evals(_run(spec, [1]), 0)
    assert other != ev_a, "a different seed should give a different run"


@pytest.mark.parametrize(("task_cls", "model_cls"), PAIRS, ids=IDS)
def test_evaluate_batch_equals_metrics_and_predictions(task_cls: Any, model_cls: Any, torch_threads: None) -> None:
    """A model may share work between its evaluation values and its predictions
    (``Model.evaluate_batch``); what it returns must be what the two give apart."""
    run = _run(tiny_spec(task_cls, model_cls, max_epochs=1), [0, 1])
    split = next(s for s in run.data.splits.values() if s.role == "test")
    rows = np.arange(min(len(split), 40))
    batch = run.model.make_batch(split.data, [rows] * run.k, run.device)
    with torch.no_grad():
        values, preds = run.model.evaluate_batch(batch)
        apart = run.model.example_metrics(batch)
        preds_apart = run.model.predict(batch)
    assert values.keys() == apart.keys() and "loss" in values
    for name, v in values.items():
        assert torch.allclose(v, apart[name], rtol=1e-6, atol=1e-6), name
    assert len(preds) == run.k == len(preds_apart)
    for mine, theirs in zip(preds, preds_apart, strict=True):
        assert len(mine) == len(rows) == len(theirs)
        assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(mine, theirs, strict=True))


def _check_200_steps(task_cls: Any, model_cls: Any, device: str) -> None:
    spec = tiny_spec(task_cls, model_cls, max_steps=200, eval_every_steps=200,
                     selection={"mode": "last", "early_stop": False})
    bundle = _run(spec, [0, 1, 2], device)
    for k in range(3):
        lone = _run(spec, [k], device)
        for name, p in bundle.model.named_parameters():
            mine = p.detach()[k]
            ref = dict(lone.model.named_parameters())[name].detach()[0]
            scale = ref.abs().max().clamp(min=1e-3)
            assert torch.allclose(mine, ref, rtol=1e-5, atol=1e-5 * float(scale)), (k, name)


def _check_end_to_end(task_cls: Any, model_cls: Any, device: str) -> None:
    spec = tiny_spec(task_cls, model_cls)
    bundle = _run(spec, [0, 1, 2], device)
    for k in range(3):
        lone = _run(spec, [k], device)
        assert bundle.members[k].best_epoch == lone.members[0].best_epoch
        ev_b, ev_l = _evals(bundle, k), _evals(lone, 0)
        assert ev_b.keys() == ev_l.keys()
        for key in ev_b:
            assert ev_b[key] == pytest.approx(ev_l[key], rel=1e-4, abs=1e-4), key


@pytest.mark.parametrize(("task_cls", "model_cls"), PAIRS, ids=IDS)
def test_bundle_member_equals_lone_run_after_200_steps(task_cls: Any, model_cls: Any, torch_threads: None) -> None:
    _check_200_steps(task_cls, model_cls, "cpu")


@pytest.mark.parametrize(("task_cls", "model_cls"), PAIRS, ids=IDS)
def test_bundle_end_to_end_matches_lone_runs(task_cls: Any, model_cls: Any, torch_threads: None) -> None:
    _check_end_to_end(task_cls, model_cls, "cpu")


@pytest.mark.parametrize(("task_cls", "model_cls"), PAIRS, ids=IDS)
def test_a_stopped_member_leaves_the_computation_and_the_others_go_on_as_lone_runs(
    task_cls: Any, model_cls: Any, torch_threads: None
) -> None:
    """Member 1 stops after the first round: with the generic step it is compacted out of the
    model (rows 0 and 2 remain); members 0 and 2 still equal their lone runs, member 1 equals
    a lone run of one round, and a checkpoint taken after compaction resumes bit-identically."""
    spec = tiny_spec(task_cls, model_cls, selection={"mode": "last", "early_stop": False})
    step_based = spec.train.max_steps is not None or task_cls.fresh_samples
    one_round = {"max_steps": spec.train.eval_every_steps} if step_based else {"max_epochs": 1}
    seeds = [derive_seedset(11, i) for i in range(3)]
    task = get_task(spec)
    data = task.build(seeds[0].data_seed)
    try:
        bundle = BundleRun(spec, seeds, task, data)
    except ConfigError as exc:
        pytest.skip(f"{spec.model_name} cannot take {spec.task_name}'s inputs: {exc}")
    bundle.train_round()
    bundle.members[1].status = "stopped"
    bundle._compact()
    compacts = bundle.fused is None
    assert bundle.slots == ([0, 2] if compacts else [0, 1, 2]) and bundle.model.k == len(bundle.slots)
    bundle.train_round()
    resumed = BundleRun(spec, seeds, task, data)
    resumed.load_state_dict(copy.deepcopy(bundle.state_dict()))
    assert resumed.slots == bundle.slots
    for run in (bundle, resumed):
        while not run.done:
            run.train_round()
    assert _evals(resumed, 0) == _evals(bundle, 0) and _evals(resumed, 2) == _evals(bundle, 2)
    assert bundle.members[1].best_epoch == (None if step_based else 1)
    for k, extra in ((0, {}), (1, one_round), (2, {})):
        lone = _run(tiny_spec(task_cls, model_cls, selection={"mode": "last", "early_stop": False}, **extra), [k])
        assert bundle.members[k].best_step == lone.members[0].best_step
        ev_b, ev_l = _evals(bundle, k), _evals(lone, 0)
        assert ev_b.keys() == ev_l.keys()
        for key in ev_b:
            assert ev_b[key] == pytest.approx(ev_l[key], rel=1e-4, abs=1e-4), (k, key)


@pytest.fixture()
def cuda_fp32() -> Iterator[None]:
    """A CUDA device computing in true float32 (no TF32 in matmuls or convolutions)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.mark.cuda
@pytest.mark.parametrize(("task_cls", "model_cls"), PAIRS, ids=IDS)
def test_cuda_bundle_member_equals_lone_run_after_200_steps(task_cls: Any, model_cls: Any, cuda_fp32: None) -> None:
    _check_200_steps(task_cls, model_cls, "cuda")


@pytest.mark.cuda
@pytest.mark.parametrize(("task_cls", "model_cls"), PAIRS, ids=IDS)
def test_cuda_bundle_end_to_end_matches_lone_runs(task_cls: Any, model_cls: Any, cuda_fp32: None) -> None:
    _check_end_to_end(task_cls, model_cls, "cuda")


@pytest.mark.cuda
@pytest.mark.parametrize(("task_cls", "model_cls"), PAIRS, ids=IDS)
def test_cuda_run_lands_where_the_cpu_run_does(task_cls: Any, model_cls: Any, cuda_fp32: None) -> None:
    """Same seeds on CUDA and CPU: different kernels and dropout streams, so not equal, but
    a run that trains on one device trains on the other (no device-specific bug)."""
    spec = tiny_spec(task_cls, model_cls)
    gpu, cpu = _run(spec, [0], "cuda"), _run(spec, [0], "cpu")
    assert next(gpu.model.parameters()).device.type == "cuda"
    ev_g, ev_c = _evals(gpu, 0), _evals(cpu, 0)
    assert ev_g.keys() == ev_c.keys()
    assert all(np.isfinite(v) for (_, m), v in ev_g.items() if m != "loss")
    if model_cls.name not in ("seq2seq",):  # no dropout: the same computation up to rounding
        for key in ev_g:
            assert ev_g[key] == pytest.approx(ev_c[key], rel=1e-2, abs=2e-2), key


def test_unknown_names_list_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"use one of: .*symbol_rewriting"):
        TASKS.get("symbol_rewritting")
    with pytest.raises(ConfigError, match=r"model\.name"):
        RunSpec.from_dict({"task": {"name": "dyck1"}, "model": {"name": "seq2seq"}})

