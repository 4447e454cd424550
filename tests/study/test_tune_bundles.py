"""``tune.batch``: tuning candidates x their paired seeds trained as one bundle (issue 28.2).

In-process, without Ray: a bundle of candidates commits what each candidate commits alone;
a candidate the driver prunes leaves the bundle (masked, compacted out) and commits nothing
while the others go on unchanged; the searcher asks Optuna for a batch at a time
(reproducible across an interruption), consults the pruner per candidate through the
storage, and ``reconcile`` settles a candidate pruned just before the driver died. Then a
real batched search with pruning on a local Ray through the CLI, its driver SIGKILLed
mid-study and resumed: every candidate finished exactly once, no row written twice.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pyarrow.parquet as pq
import pytest
import yaml
from test_tuning import _env, cli, kill_driver, load_study, sql
from tests_support import TINY_STUDY

from analysis.db import connect
from study.config import parse
from study.tuning import (
    candidate_template,
    finished_count,
    reconcile,
    storage_url,
    tune_block,
)
from study.tuning_bundles import bundle_search_class
from study.tuning_config import bundle_batch
from study.tuning_search import write_pruned_row
from trainables.errors import ConfigError
from trainables.trainable import FinelineTrainable
from trainables.tuning_unit import (
    OBJECTIVE_KEYS,
    bundle_from_template,
    read_pruned,
    unit_from_template,
    write_pruned,
)

NAME = "tb"
K = 2
TUNE: dict[str, Any] = {
    "space": {
        "train.lr": {"low": 0.01, "high": 1.0, "log": True},
        "model.dropout": {"low": 0.0, "high": 0.5},
    },
    "objective": {"split": "val_ood", "metric": "loss"},  # continuous: a strict ranking
    "seeds_per_candidate": K,
    "sampler_seed": 3,
    "batch": 3,
    "trials": 9,
}
CONFIG: dict[str, Any] = {
    **TINY_STUDY, "name": NAME, "tune": TUNE,
    "train": {**TINY_STUDY["train"], "max_epochs": 3, "selection": {"early_stop": False}},
}
CANDIDATES = [
    [0, {"train.lr": 0.1, "model.dropout": 0.1}],
    [1, {"train.lr": 0.5, "model.dropout": 0.0}],
    [2, {"train.lr": 0.02, "model.dropout": 0.3}],
]


def _template(out: Path, raw: dict[str, Any] = CONFIG) -> dict[str, Any]:
    cfg = parse(raw)
    (out / NAME).mkdir(parents=True, exist_ok=True)  # the driver creates OUT/<study>
    tpl = candidate_template(cfg, tune_block(cfg), NAME, out)
    return {**tpl, "report_every_s": 1e-4, "each_round": True}  # one evaluation per result


def _train(template: dict[str, Any], candidates: list[list[Any]], prune: dict[int, int] | None = None) -> list[dict[str, Any]]:
    """Train a bundle of ``candidates`` to its end; ``prune``: after result i, the driver
    prunes candidate number ``prune[i]``. Returns every result."""
    trainable = FinelineTrainable(config={"template": template, "candidates": candidates})
    unit_id, results, pruned = trainable.unit["unit_id"], [], []
    try:
        while not results or not results[-1].get("done"):
            results.append(trainable.train())
            if prune and len(results) in prune:
                pruned.append(prune[len(results)])
                write_pruned(template["out"], NAME, unit_id, pruned)
    finally:
        trainable.stop()
    return results


def _evals(out: Path) -> dict[tuple[str, int, str, str], float]:
    con = connect(out)
    try:
        rows = con.execute("SELECT trial_id, seed, split, metric, value FROM evals").fetchall()
    finally:
        con.close()
    return {(t, s, sp, m): v for t, s, sp, m, v in rows}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, torch_threads_module: None) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("bundles")
    outs = {name: root / name for name in ("bundle", "alone", "pruned")}
    results = {"bundle": _train(_template(outs["bundle"]), CANDIDATES)}
    for cand in CANDIDATES:
        _train(_template(outs["alone"]), [cand])
    results["pruned"] = _train(_template(outs["pruned"]), CANDIDATES, prune={1: 1})
    ids = [unit_from_template(_template(root / "ids"), p)["trial_id"] for _, p in CANDIDATES]
    return {"outs": outs, "results": results, "ids": ids}


@pytest.fixture(scope="module")
def torch_threads_module() -> Any:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _assert_same(a: dict[Any, float], b: dict[Any, float], keys: set[Any]) -> None:
    assert keys and keys <= a.keys() and keys <= b.keys()
    for key in keys:  # per-member hyperparameters agree with a lone run to float rounding
        assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key


# ---------------------------------------------------------------- the trainable, in-process
def test_a_bundle_of_candidates_commits_what_each_commits_alone(trained: dict[str, Any]) -> None:
    outs, ids = trained["outs"], trained["ids"]
    bundle, alone = _evals(outs["bundle"]), _evals(outs["alone"])
    assert {k[0] for k in bundle} == set(ids) and len(set(ids)) == 3
    _assert_same(bundle, alone, set(alone))
    con = connect(outs["bundle"])
    try:
        trials = con.execute(
            "SELECT trial_id, unit_id, seeds, status, bundle_size, bundle_members, optuna_number, "
            "objective, objective_n FROM trials ORDER BY optuna_number"
        ).df()
        runs = con.execute("SELECT trial_id, seed, unit_id FROM runs").fetchall()
    finally:
        con.close()
    assert list(trials["trial_id"]) == ids and list(trials["optuna_number"]) == [0, 1, 2]
    assert trials["unit_id"].nunique() == 1, "one row per candidate of the one bundle"
    assert all(list(s) == list(range(K)) for s in trials["seeds"])
    assert set(trials["bundle_size"]) == {K} and set(trials["bundle_members"]) == {3 * K}
    assert sorted((t, s) for t, s, _ in runs) == sorted((t, s) for t in ids for s in range(K))
    final = {row[0]: dict(zip(OBJECTIVE_KEYS, row[1:], strict=True)) for row in trained["results"]["bundle"][-1]["candidates_final"]}
    for number, objective in zip(trials["optuna_number"], trials["objective"], strict=True):
        assert final[number]["objective"] == pytest.approx(objective, rel=1e-12)
        mine = [v for (t, _, sp, m), v in bundle.items() if t == ids[number] and (sp, m) == ("val_ood", "loss")]
        assert objective == pytest.approx(sum(mine) / len(mine), rel=1e-12)


def test_a_pruned_candidate_leaves_the_bundle_and_the_others_go_on_unchanged(trained: dict[str, Any]) -> None:
    outs, ids, results = trained["outs"], trained["ids"], trained["results"]["pruned"]
    assert [n for n, _ in results[0]["candidate_curves"]] == [0, 1, 2]
    assert all([n for n, _ in r["candidate_curves"]] == [0, 2] for r in results[1:]), "a pruned curve went on"
    assert [row[0] for row in results[-1]["candidates_final"]] == [0, 2]
    assert len(results) == 3, "the others trained every epoch"
    pruned, alone = _evals(outs["pruned"]), _evals(outs["alone"])
    assert {k[0] for k in pruned} == {ids[0], ids[2]}, "a pruned candidate committed rows"
    _assert_same(pruned, alone, set(pruned))
    runs = pq.read_table(outs["pruned"] / "tables" / "runs").to_pylist()
    assert sorted((r["trial_id"], r["seed"]) for r in runs) == sorted((t, s) for t in (ids[0], ids[2]) for s in range(K))


def test_pruning_compacts_the_members_out(tmp_path: Path, torch_threads: None) -> None:
    template = _template(tmp_path)
    trainable = FinelineTrainable(config={"template": template, "candidates": CANDIDATES[:2]})
    try:
        trainable.train()
        assert trainable.run.k == 2 * K
        write_pruned(template["out"], NAME, trainable.unit["unit_id"], [0])
        assert read_pruned(template["out"], NAME, trainable.unit["unit_id"]) == {0}
        trainable.train()
        assert trainable.run.k == K and trainable.run.slots == [2, 3], "candidate 0's rows were not dropped"
        assert [m.status for m in trainable.run.members][:K] == ["pruned"] * K
    finally:
        trainable.stop()


# ---------------------------------------------------------------- the searcher, in-process
def _score(params: dict[str, float]) -> float:
    """A deterministic stand-in for training (the searcher only sees numbers)."""
    return (math.log10(params["train.lr"]) + 1.2) ** 2 + (params["model.dropout"] - 0.3) ** 2


def _final(number: int, value: float) -> list[float]:
    return [number, value, 0.0, value, value, float(K)]


def _searcher(out: Path, tune: dict[str, Any], to_run: int, done: int = 0) -> tuple[Any, Any, Any, dict[str, Any]]:
    cfg = parse({**CONFIG, "tune": tune})
    block = tune_block(cfg)
    (out / NAME).mkdir(parents=True, exist_ok=True)
    template = candidate_template(cfg, block, NAME, out)
    storage = optuna.storages.RDBStorage(storage_url(out, NAME))
    optuna.create_study(study_name=NAME, storage=storage, direction=block.direction, load_if_exists=True)
    search = bundle_search_class()(block, template, storage, int(tune["batch"]), to_run, 9, done)
    return search, block, storage, template


def _batched_search(out: Path, stop_after: int | None = None) -> list[dict[str, float]]:
    """A sequential batched search to 9 candidates (3 per bundle); with ``stop_after``, a
    bundle is abandoned mid-run after that many bundles (a killed driver) and resumed."""
    tune = {**TUNE, "sequential": True, "startup_trials": 3}
    search, block, storage, template = _searcher(out, tune, 9)
    for i in range(stop_after if stop_after is not None else 3):
        cands = search.suggest(f"t{i}")["candidates"]
        assert len(cands) == 3 and len({json.dumps(p, sort_keys=True) for _, p in cands}) == 3
        search.on_trial_complete(f"t{i}", {"candidates_final": [_final(n, _score(p)) for n, p in cands]})
    if stop_after is not None:
        abandoned = [n for n, _ in search.suggest("abandoned")["candidates"]]  # left RUNNING
        study = optuna.load_study(study_name=NAME, storage=storage)
        assert reconcile(study, storage, out, block, template) == abandoned
        search, *_ = _searcher(out, tune, 9 - 3 * stop_after, 3 * stop_after)
        for i in range(stop_after, 3):
            cands = search.suggest(f"r{i}")["candidates"]
            search.on_trial_complete(f"r{i}", {"candidates_final": [_final(n, _score(p)) for n, p in cands]})
    assert search.suggest("more") == "FINISHED"
    study = optuna.load_study(study_name=NAME, storage=storage)
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return [t.params for t in sorted(done, key=lambda t: t.number)]


def test_batched_asks_are_reproducible_across_an_interruption(tmp_path: Path) -> None:
    a = _batched_search(tmp_path / "a")
    b = _batched_search(tmp_path / "b")
    c = _batched_search(tmp_path / "c", stop_after=1)
    assert len(a) == 9 and len({json.dumps(p, sort_keys=True) for p in a}) == 9
    assert a == b, "same seed, same history: the same proposals"
    assert a == c, "an interrupted and resumed batched search proposes what an uninterrupted one did"


def test_the_pruner_is_consulted_per_candidate_through_the_storage(tmp_path: Path) -> None:
    tune = {**TUNE, "batch": 4, "pruner": "asha", "grace_period": 1, "reduction_factor": 2}
    search, block, storage, template = _searcher(tmp_path, tune, 8)
    cands = search.suggest("b0")["candidates"]
    numbers = [n for n, _ in cands]
    unit_id = bundle_from_template(template, cands)["unit_id"]
    curves = [[n, [[1, v]]] for n, v in zip(numbers, [1.0, 2.0, 0.5, 3.0], strict=True)]
    search.on_trial_result("b0", {"candidate_curves": curves, "epoch": 1, "opt_step": 19, "at": "epoch 1"})
    # successive halving at rung 0 (reduction factor 2, minimising): a candidate goes on only
    # if it is in the better half of the values seen there, counted in bundle order
    study = optuna.load_study(study_name=NAME, storage=storage)
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    pruned = {numbers[1], numbers[3]}
    assert {n for n, s in states.items() if s == optuna.trial.TrialState.PRUNED} == pruned
    assert read_pruned(tmp_path, NAME, unit_id) == pruned, "the bundle was not told"
    rows = sql(tmp_path, "SELECT trial_id, unit_id, status, optuna_number, pruned_objective, pruned_epoch FROM trials")
    assert sorted(r["optuna_number"] for r in rows) == sorted(pruned)
    assert all(r["status"] == "pruned" and r["unit_id"] == unit_id and r["pruned_epoch"] == 1 for r in rows)
    assert {r["pruned_objective"] for r in rows} == {2.0, 3.0}
    curves = [[n, [[2, 0.4]]] for n in (numbers[0], numbers[2])]
    search.on_trial_complete("b0", {"candidate_curves": curves, "candidates_final": [_final(numbers[0], 0.4), _final(numbers[2], 0.45)]})
    done = {t.number: t for t in optuna.load_study(study_name=NAME, storage=storage).get_trials(deepcopy=False)}
    assert done[numbers[0]].state == optuna.trial.TrialState.COMPLETE and done[numbers[0]].value == 0.4
    assert done[numbers[0]].intermediate_values == {1: 1.0, 2: 0.4}
    # a driver killed after writing a pruned row, before telling Optuna: settled from the row
    cands = search.suggest("b1")["candidates"]
    n, params = cands[0]
    write_pruned_row(template, params, {"objective": 9.0, "epoch": 1, "opt_step": 19},
                  unit_id=bundle_from_template(template, cands)["unit_id"], extra={"optuna_number": n})
    assert reconcile(optuna.load_study(study_name=NAME, storage=storage), storage, tmp_path, block, template) == [c[0] for c in cands[1:]]
    after = {t.number: t.state for t in optuna.load_study(study_name=NAME, storage=storage).get_trials(deepcopy=False)}
    assert after[n] == optuna.trial.TrialState.PRUNED
    assert all(after[m] == optuna.trial.TrialState.FAIL for m, _ in cands[1:])


# ---------------------------------------------------------------- before anything runs
def test_batch_size_is_resolved_or_refused_before_ray() -> None:
    cfg = parse(CONFIG)
    assert bundle_batch(cfg, tune_block(cfg), "cpu") == (3, "")
    other = {**TUNE, "space": {**TUNE["space"], "model.hidden_size": {"low": 4, "high": 16, "type": "int"}}}
    cfg = parse({**CONFIG, "tune": other})
    batch, note = bundle_batch(cfg, tune_block(cfg), "cpu")
    assert batch == 1 and "model.hidden_size" in note
    auto = parse({**CONFIG, "tune": {**TUNE, "batch": "auto"}})
    assert bundle_batch(auto, tune_block(auto), "cpu")[0] == 8 // K  # seq2seq's cpu_bundle_cap
    assert bundle_batch(auto, tune_block(auto), "cuda")[0] == 64 // K
    lone = parse({**CONFIG, "model": {**CONFIG["model"], "impl": "reference"}})
    with pytest.raises(ConfigError) as err:
        bundle_batch(lone, tune_block(lone), "cpu")
    assert err.value.field == "tune.batch" and "<= 1" in err.value.fix
    with pytest.raises(ConfigError) as err:
        tune_block(parse({**CONFIG, "tune": {**TUNE, "batch": 0}}))
    assert err.value.field == "tune.batch"


# ---------------------------------------------------------------- a real search, killed and resumed
@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("tune_bundles")
    cfg, out = root / "tb.yaml", root / "results"
    tune = {**TUNE, "pruner": "asha", "grace_period": 1, "reduction_factor": 2}
    cfg.write_text(yaml.safe_dump({**CONFIG, "tune": tune}))
    args = ("tune", str(cfg), "--out", str(out), "--num-cpus", "2")
    runs_dir = out / "tables" / "runs" / f"study={NAME}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "study.cli", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        text=True, env=_env(),
    )
    try:
        deadline = time.monotonic() + 300
        while not list(runs_dir.glob("*.parquet")) and time.monotonic() < deadline:
            assert proc.poll() is None, "the driver ended before it could be interrupted"
            time.sleep(0.05)
    finally:
        kill_driver(proc)
    killed = load_study(out, NAME)
    running = [t.number for t in killed.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.RUNNING]
    after_kill = finished_count(killed)
    resumed = cli(*args)
    return {"out": out, "after_kill": after_kill, "running": running, "resumed": resumed}


@pytest.mark.slow  # a SIGKILLed search through the CLI, then its resume: run with -m slow
def test_killed_batched_search_resumes_with_every_candidate_finished_once(searched: dict[str, Any]) -> None:
    out = searched["out"]
    assert searched["after_kill"] < 9, "the kill came too late"
    assert searched["running"], "the kill left no candidate running (it commits before Optuna hears)"
    assert "9/9 candidates finished" in searched["resumed"].stdout
    study = load_study(out, NAME)
    trials = study.get_trials(deepcopy=False)
    states = optuna.trial.TrialState
    finished = [t for t in trials if t.state in (states.COMPLETE, states.PRUNED)]
    assert finished_count(study) == 9 and len(finished) == 9
    complete = [t for t in finished if t.state == states.COMPLETE]
    ids = [t.user_attrs["trial_id"] for t in complete]
    assert len(set(ids)) == len(ids), "a finished candidate ran twice"
    for n in searched["running"]:  # settled from Parquet, or failed and replayed
        assert trials[n].state in (states.COMPLETE, states.PRUNED, states.FAIL)
    for t in trials:  # each interrupted candidate was re-run exactly once, with its params
        if t.state == states.FAIL:
            (replay,) = [r for r in trials if r.user_attrs.get("replay_of") == t.number]
            assert replay.params == t.params and replay.state in (states.COMPLETE, states.PRUNED)
    runs = pq.read_table(out / "tables" / "runs" / f"study={NAME}").to_pylist()  # every file
    keys = [(r["trial_id"], r["seed"]) for r in runs]
    assert len(keys) == len(set(keys)) and sorted(keys) == sorted((i, s) for i in ids for s in range(K))
    view = {(r["trial_id"], r["status"]): r for r in sql(out, f"SELECT * FROM trials WHERE study = '{NAME}'")}
    for t in complete:
        row = view[(t.user_attrs["trial_id"], "ok")]
        assert t.value == pytest.approx(row["objective"], rel=1e-12) and row["bundle_size"] == K
    for t in finished:
        if t.state == states.PRUNED:
            row = view[(t.user_attrs["trial_id"], "pruned")]
            assert row["optuna_number"] == t.number and row["unit_id"] == t.user_attrs["bundle"]
    units = sql(out, f"SELECT unit_id, count(*) AS n FROM trials WHERE study = '{NAME}' GROUP BY unit_id")
    assert max(u["n"] for u in units) > 1, "no bundle held several candidates"
    assert not (out / NAME / "pruned").exists(), "the bundles' pruned files were left behind"
