"""The contract every registered (task, model) pair must satisfy.

Parametrised over the registries, so a new task or model is tested for free:

* it trains end to end on the task's tiny config and scores every split in range;
* the same seeds give bit-identical results (CPU);
* bundle equivalence: member i of a K=3 bundle equals the lone run with the same seeds
  (parameters after 200 optimizer steps to 1e-5 relative; on a tiny end-to-end run, the
  same selected epoch and metrics to 1e-4), dropout included.
"""

from __future__ import annotations

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


def _run(spec: RunSpec, indices: list[int]) -> BundleRun:
    seeds = [derive_seedset(11, i) for i in indices]
    task = get_task(spec)
    try:
        run = BundleRun(spec, seeds, task, task.build(seeds[0].data_seed))
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
def test_bundle_member_equals_lone_run_after_200_steps(task_cls: Any, model_cls: Any, torch_threads: None) -> None:
    spec = tiny_spec(task_cls, model_cls, max_steps=200, eval_every_steps=200,
                     selection={"mode": "last", "early_stop": False})
    bundle = _run(spec, [0, 1, 2])
    for k in range(3):
        lone = _run(spec, [k])
        for name, p in bundle.model.named_parameters():
            mine = p.detach()[k]
            ref = dict(lone.model.named_parameters())[name].detach()[0]
            scale = ref.abs().max().clamp(min=1e-3)
            assert torch.allclose(mine, ref, rtol=1e-5, atol=1e-5 * float(scale)), (k, name)


@pytest.mark.parametrize(("task_cls", "model_cls"), PAIRS, ids=IDS)
def test_bundle_end_to_end_matches_lone_runs(task_cls: Any, model_cls: Any, torch_threads: None) -> None:
    spec = tiny_spec(task_cls, model_cls)
    bundle = _run(spec, [0, 1, 2])
    for k in range(3):
        lone = _run(spec, [k])
        assert bundle.members[k].best_epoch == lone.members[0].best_epoch
        ev_b, ev_l = _evals(bundle, k), _evals(lone, 0)
        assert ev_b.keys() == ev_l.keys()
        for key in ev_b:
            assert ev_b[key] == pytest.approx(ev_l[key], rel=1e-4, abs=1e-4), key


def test_unknown_names_list_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"use one of: .*symbol_rewriting"):
        TASKS.get("symbol_rewritting")
    with pytest.raises(ConfigError, match=r"model\.name"):
        RunSpec.from_dict({"task": {"name": "dyck1"}, "model": {"name": "seq2seq"}})

