"""``study tune`` and ``study run --from-best``: a real search on a real local Ray.

The module fixture runs the tiny symbol-rewriting config of test_cli_e2e as a tuning
study through the CLI: 3 candidates, then a run to 6 that is killed (SIGKILL of the
driver we started) after its first new candidate, then the resume to 6. The other tests
read what it left: Parquet through ``study sql``, the Optuna storage through the optuna
API. The searcher's bookkeeping (reproducible sequential proposals across an
interruption, pruned candidates) is driven in-process without starting Ray.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pyarrow.parquet as pq
import pytest
import yaml
from test_cli_e2e import TINY

from study.config import parse
from study.tuning import (
    candidate_template,
    finished_count,
    ray_classes,
    reconcile,
    storage_url,
    tune_block,
)
from trainables.errors import ConfigError
from trainables.tuning_unit import objective_stats

NAME = "tt"
K = 2
TUNE: dict[str, Any] = {
    "space": {
        "train.lr": {"low": 0.01, "high": 1.0, "log": True},
        "model.dropout": {"low": 0.0, "high": 0.5},
    },
    "objective": {"split": "val_ood", "metric": "loss"},  # continuous: a strict ranking
    "seeds_per_candidate": K,
    "sampler_seed": 3,
    "trials": 6,
}
CONFIG: dict[str, Any] = {**TINY, "name": NAME, "tune": TUNE}
TRAIN: dict[str, Any] = dict(CONFIG["train"])
TEST_SPLITS = {"standard", "repeat", "short", "long"}


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(
        [sys.executable, "-m", "study.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )
    if check and res.returncode != 0:
        raise AssertionError(f"study {' '.join(args)} failed ({res.returncode}):\n{res.stderr}")
    return res


def _env() -> dict[str, str]:
    keep = ("HOME", "PYTHONPATH", "VIRTUAL_ENV", "LANG", "PATH")
    return {"RAY_USAGE_STATS_ENABLED": "0", **{k: v for k, v in os.environ.items() if k in keep}}


def sql(out: Path, query: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(
        cli("sql", "--out", str(out), "--format", "json", query).stdout
    )
    return rows


def load_study(out: Path, name: str = NAME) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=storage_url(out, name))


def completed(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))


# ---------------------------------------------------------------- killing what we started
def _proc_start(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _descendants(root: int) -> dict[int, str]:
    """pid -> start time of every live descendant of ``root`` (from /proc)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
                )
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = {}, [root]
    while frontier:
        p = frontier.pop()
        for child, par in parent.items():
            if par == p and child not in found:
                start = _proc_start(child)
                if start is not None:
                    found[child] = start
                    frontier.append(child)
    return found


def kill_driver(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the driver we started; then reap the Ray processes it started that outlive it
    (Ray's agents are re-parented to init), by pid and only if still the same process."""
    tree = _descendants(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_proc_start(p) == s for p, s in tree.items()):
        time.sleep(0.5)
    for pid, start in tree.items():
        if _proc_start(pid) == start:
            os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- the real search
@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("tune")
    cfg, out = root / "tt.yaml", root / "results"
    cfg.write_text(yaml.safe_dump(CONFIG))
    base = ("--out", str(out), "--num-cpus", "2")
    first = cli("tune", str(cfg), "--trials", "3", *base)
    after_first = len(completed(load_study(out)))
    trials_dir = out / "tables" / "trials" / f"study={NAME}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "study.cli", "tune", str(cfg), "--trials", "6", *base],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_env(),
    )
    try:
        deadline = time.monotonic() + 300
        while len(list(trials_dir.glob("*.parquet"))) < 4 and time.monotonic() < deadline:
            assert proc.poll() is None, "the driver ended before it could be interrupted"
            time.sleep(0.1)
    finally:
        kill_driver(proc)
    killed = load_study(out)
    states = [t.state for t in killed.get_trials(deepcopy=False)]
    resumed = cli("tune", str(cfg), "--trials", "6", *base)
    return {
        "cfg": cfg,
        "out": out,
        "first": first,
        "after_first": after_first,
        "after_kill": states,
        "resumed": resumed,
    }


def test_first_run_finishes_the_requested_candidates(tuned: dict[str, Any]) -> None:
    assert tuned["after_first"] == 3
    assert "3/3 candidates finished" in tuned["first"].stdout
    # nothing of the libraries' own warnings reaches the user's terminal (Optuna's
    # ExperimentalWarning for set_metric_names did)
    assert "Warning" not in tuned["first"].stderr, tuned["first"].stderr


def test_kill_then_resume_ends_with_exactly_the_requested_candidates(tuned: dict[str, Any]) -> None:
    after_kill = tuned["after_kill"]
    assert after_kill.count(optuna.trial.TrialState.COMPLETE) < 6, "the kill came too late"
    study = load_study(tuned["out"])
    assert finished_count(study) == 6 and len(completed(study)) == 6
    assert "6/6 candidates finished" in tuned["resumed"].stdout
    ids = [t.user_attrs["trial_id"] for t in completed(study)]
    assert len(set(ids)) == 6, "a finished candidate ran twice"
    out = tuned["out"]
    trials = sql(out, f"SELECT trial_id, unit_id FROM trials WHERE study = '{NAME}'")
    assert sorted(t["trial_id"] for t in trials) == sorted(ids)
    for table, key in (
        ("runs", ("trial_id", "seed")),
        ("evals", ("trial_id", "seed", "split", "metric")),
    ):
        rows = pq.read_table(out / "tables" / table / f"study={NAME}").to_pylist()  # every file
        keys = [tuple(r[k] for k in key) for r in rows]
        assert len(keys) == len(set(keys)), f"duplicate {table} rows"
        assert {k[0] for k in keys} == set(ids), f"{table} rows of a candidate Optuna does not know"
    assert len(pq.read_table(out / "tables" / "runs" / f"study={NAME}")) == 6 * K


def test_storage_reads_back_with_the_optuna_api(tuned: dict[str, Any]) -> None:
    study = load_study(tuned["out"])
    assert study.direction == optuna.study.StudyDirection.MINIMIZE
    trials = {
        r["trial_id"]: r for r in sql(tuned["out"], f"SELECT * FROM trials WHERE study = '{NAME}'")
    }
    for t in completed(study):
        assert 0.01 <= t.params["train.lr"] <= 1.0 and 0.0 <= t.params["model.dropout"] <= 0.5
        row = trials[t.user_attrs["trial_id"]]
        assert t.value == pytest.approx(row["objective"], rel=1e-12)
        assert t.user_attrs["objective_std"] == pytest.approx(
            row["objective_std"], rel=1e-9, abs=1e-12
        )
        assert t.user_attrs["seeds"] == list(range(K))
        assert row["param_train_lr"] == pytest.approx(t.params["train.lr"], rel=1e-12)


def test_status_lists_each_candidate_with_its_state_and_the_best_so_far(tuned: dict[str, Any]) -> None:
    """`study status` of a tuning study: one row per Optuna candidate (it showed the base
    config as one pending grid point), its seeds committed, and the best candidate."""
    out = tuned["out"]
    as_json = cli("status", NAME, "--out", str(out), "--format", "json")
    rows = json.loads(as_json.stdout)  # the rows alone; the search and best lines on stderr
    assert "search: 6 of 6 requested candidates finished" in as_json.stderr and "best so far: candidate" in as_json.stderr
    study = load_study(out)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    assert [r["candidate"] for r in rows] == sorted(trials)
    for r in rows:
        t = trials[r["candidate"]]
        assert r["trial_id"] == t.user_attrs["trial_id"] and json.loads(r["point"]) == t.params
        assert r["state"] == "complete" and (r["planned"], r["done"], r["ok"], r["pending"]) == (K, K, K, 0)
        assert r["objective"] == pytest.approx(t.value, rel=1e-12)
    table = cli("status", NAME, "--out", str(out)).stdout
    assert "search: 6 of 6 requested candidates finished (6 complete), 0 failed, 0 running or waiting" in table
    best = min(completed(study), key=lambda t: t.value)
    assert f"best so far: candidate {best.number} (" in table and f"val_ood loss {best.value:.6g} (minimize)" in table


def test_candidates_are_paired_and_scored_on_val_ood_only(tuned: dict[str, Any]) -> None:
    out = tuned["out"]
    runs = sql(
        out, f"SELECT trial_id, seed, init_seed, order_seed FROM runs WHERE study = '{NAME}'"
    )
    by_seed: dict[int, set[tuple[int, int]]] = {}
    for r in runs:
        by_seed.setdefault(r["seed"], set()).add((r["init_seed"], r["order_seed"]))
    assert sorted(by_seed) == list(range(K))
    assert all(len(v) == 1 for v in by_seed.values()), "candidates did not share their seeds"
    values = sql(
        out,
        f"SELECT trial_id, seed, value FROM evals WHERE study = '{NAME}' AND split = 'val_ood' AND metric = 'loss'",
    )
    per_trial: dict[str, list[float]] = {}
    for v in values:
        per_trial.setdefault(v["trial_id"], []).append(v["value"])
    trials = sql(
        out,
        f"SELECT trial_id, objective, objective_std, objective_n FROM trials WHERE study = '{NAME}'",
    )
    assert len(trials) == 6
    for t in trials:
        vals = per_trial[t["trial_id"]]
        assert t["objective"] == pytest.approx(statistics.fmean(vals), rel=1e-12)
        assert t["objective_std"] == pytest.approx(statistics.stdev(vals), rel=1e-9)
        assert t["objective_n"] == K
    splits = sql(out, f"SELECT DISTINCT split FROM evals WHERE study = '{NAME}' AND role = 'test'")
    assert {s["split"] for s in splits} == TEST_SPLITS, "test splits must still be evaluated"


def test_candidates_ran_concurrently(tuned: dict[str, Any]) -> None:
    """With 2 CPUs the search keeps two candidates in flight: a candidate is asked before the
    one asked before it is told (Optuna's start and completion times). The trials rows'
    training windows are no measure of that: a tiny candidate trains in ~0.25 s, less than
    the gap between two actors' starts on a loaded machine (they did not overlap in one CI
    run while the search kept two in flight)."""
    trials = sorted(load_study(tuned["out"]).get_trials(deepcopy=False), key=lambda t: t.datetime_start)
    spans = [(t.datetime_start, t.datetime_complete) for t in trials]
    assert all(a is not None and b is not None for a, b in spans)
    overlaps = sum(1 for a, b in itertools.pairwise(spans) if b[0] < a[1])
    assert overlaps >= 1, f"no two candidates were in flight together: {spans}"


def test_rerun_when_finished_starts_nothing_and_changed_search_is_refused(
    tuned: dict[str, Any], tmp_path: Path
) -> None:
    out, cfg = tuned["out"], tuned["cfg"]
    before = len(load_study(out).get_trials(deepcopy=False))
    res = cli("tune", str(cfg), "--out", str(out), "--num-cpus", "2")
    assert "6/6 already finished" in res.stderr
    assert len(load_study(out).get_trials(deepcopy=False)) == before
    res = cli("resume", NAME, "--out", str(out), "--num-cpus", "2")  # says what `study tune` says
    assert "6/6 candidates finished" in res.stdout and f"study run --from-best {NAME} --out {out}" in res.stdout
    changed = tmp_path / "changed.yaml"
    space = {**TUNE["space"], "train.lr": {"low": 0.05, "high": 1.0, "log": True}}
    changed.write_text(yaml.safe_dump({**CONFIG, "tune": {**TUNE, "space": space}}))
    res = cli("tune", str(changed), "--out", str(out), check=False)
    assert res.returncode == 2 and "--name" in res.stderr
    # what changed, by name (before: "a different tune.space" and nothing else)
    low = TUNE["space"]["train.lr"]["low"]
    assert f"changed: tune.space.train.lr.low {json.dumps(low)} -> 0.05" in " ".join(res.stderr.split()), res.stderr
    assert f"`study resume {NAME} --out {out}` resumes it" in " ".join(res.stderr.split())


@pytest.mark.slow  # ~14 s: a second study after the tuning
def test_from_best_runs_the_candidate_study_sql_ranks_first(tuned: dict[str, Any]) -> None:
    out = tuned["out"]
    first = sql(
        out,
        f"SELECT trial_id, objective FROM trials WHERE study = '{NAME}' ORDER BY objective LIMIT 1",
    )[0]
    cli("run", "--from-best", NAME, "--seeds", "3", "--out", str(out), "--num-cpus", "2")
    manifest = json.loads((out / f"{NAME}-best" / "study.json").read_text())
    src = manifest["tuned_from"]
    assert src["study"] == NAME and src["trial_id"] == first["trial_id"]
    assert src["objective"] == pytest.approx(first["objective"], rel=1e-12)
    assert manifest["kind"] == "seeds"
    runs = sql(out, f"SELECT trial_id, seed FROM runs WHERE study = '{NAME}-best' ORDER BY seed")
    assert [r["seed"] for r in runs] == [0, 1, 2]
    assert {r["trial_id"] for r in runs} == {first["trial_id"]}, "not the candidate's config"
    again = sql(
        out,
        f"SELECT e.seed, e.value AS a, t.value AS b FROM evals e JOIN evals t USING (trial_id, seed, split, metric) WHERE e.study = '{NAME}-best' AND t.study = '{NAME}' AND split = 'val_ood' AND metric = 'loss'",
    )
    assert sorted(r["seed"] for r in again) == list(range(K))
    # the same seeds: equal up to float noise from bundling (K=2 there, 1 here); another seed
    # differs by ~1e-3 relative here
    assert all(r["a"] == pytest.approx(r["b"], rel=1e-4) for r in again), "not the tuned seeds"


# ---------------------------------------------------------------- before anything runs
def test_test_split_as_objective_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    cfg = tmp_path / "leak.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "tune": {**TUNE, "objective": {"split": "short"}}}))
    out = tmp_path / "results"
    res = cli("tune", str(cfg), "--out", str(out), check=False)
    assert res.returncode == 2, res.stderr
    assert "tune.objective.split" in res.stderr and "'test'" in res.stderr and "Fix:" in res.stderr
    assert "val_ood" in res.stderr.split("Fix:")[1]
    assert not out.exists()


@pytest.mark.parametrize("batch", [1, pytest.param(2, marks=pytest.mark.slow)])  # ~12 s each
def test_a_config_the_workers_refuse_fails_each_candidate_once_without_tracebacks(tmp_path: Path, batch: int) -> None:
    """A batch larger than the training split of a task the driver does not build (a plugin's,
    ``rehearsable()`` False: only its workers know the split's size) is refused in each
    trial's setup: every candidate is a FAIL in Optuna at once (Tune retried each
    ``max_failures`` times and printed the workers' tracebacks), the cause is printed once,
    and the counts are candidates, also when a bundle holds two (``tune.batch``)."""
    from tests.study.test_plugins_cli import BASE, unbuilt_plugin

    unbuilt_plugin(tmp_path)
    cfg = tmp_path / "big.yaml"
    cfg.write_text(yaml.safe_dump({**BASE, "name": NAME, "task": {"name": "unbuilt", "n": 64},
                                   "train": {"max_epochs": 2, "batch_size": 1000},
                                   "tune": {**TUNE, "space": {"train.lr": TUNE["space"]["train.lr"]}, "trials": 2,
                                            "batch": batch}}))
    out = tmp_path / "results"
    res = cli("tune", str(cfg), "--out", str(out), "--num-cpus", "2", check=False)
    text = res.stdout + res.stderr
    assert res.returncode == 1, text[-3000:]
    assert "Traceback" not in text and "Trial task failed" not in text, text[-3000:]
    cause = "train.batch_size: 1000 is larger than the training split (64 examples)"
    what = "2 candidates failed" if batch == 1 else "bundle of candidates failed"
    assert len([ln for ln in text.splitlines() if ln.startswith(f"{what}: {cause}")]) == 1, text
    assert f"error: tuning study {NAME}: 0/2 candidates finished, 2 failed, 0 pending" in text, text
    assert f"run it under a new name (`study tune CONFIG --name NEW --out {out}`)" in text, text
    states = [t.state for t in load_study(out).get_trials(deepcopy=False)]
    assert states == [optuna.trial.TrialState.FAIL] * 2
    rows = json.loads(cli("status", NAME, "--out", str(out), "--format", "json").stdout)
    assert [(r["state"], r["failed"], r["pending"]) for r in rows] == [("failed", K, 0)] * 2
    table = cli("status", NAME, "--out", str(out)).stdout
    assert "search: 0 of 2 requested candidates finished (none yet), 2 failed" in table and "best so far" not in table
    assert f"): {what}: {cause}" in table, table  # the last run's cause, recorded by the driver


def test_a_batch_larger_than_a_built_in_tasks_split_is_refused_before_ray(tmp_path: Path) -> None:
    """The driver builds a built-in task's data before Ray: the batch is refused there, exit
    2, one line, nothing written (before: every candidate failed on its worker)."""
    cfg = tmp_path / "big.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "train": {**TRAIN, "batch_size": 1000}, "tune": {**TUNE, "trials": 2}}))
    out = tmp_path / "results"
    res = cli("tune", str(cfg), "--out", str(out), "--num-cpus", "2", check=False)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stdout + res.stderr
    assert lines[0].startswith("error: train.batch_size: 1000 is larger than the training split (300 examples)")
    assert not out.exists()


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"train": {**TRAIN, "selection": {"split": "long"}}}, "train.selection.split"),
        ({"tune": {**TUNE, "objective": {"split": "nosuch"}}}, "tune.objective.split"),
        (
            {"tune": {**TUNE, "space": {"model.hiden_size": {"low": 1, "high": 4}}}},
            "tune.space.model.hiden_size",
        ),
        (
            {"tune": {**TUNE, "space": {"model.cell": {"low": 1, "high": 4}}}},
            "tune.space.model.cell",
        ),
        (
            {"tune": {**TUNE, "space": {"train.lr": {"low": 0.0, "high": 1.0, "log": True}}}},
            "tune.space.train.lr",
        ),
        (
            {"tune": {**TUNE, "space": {"model.dropout": {"low": 0.0, "high": 1.5}}}},
            "tune.space.model.dropout",
        ),
        ({"tune": {**TUNE, "seeds_per_candidate": 0}}, "tune.seeds_per_candidate"),
        ({"tune": {**TUNE, "enqueue": [{"train.lr": 5.0}]}}, "tune.enqueue[0].train.lr"),
        ({"seeds": {"count": 3, "vary": ["init", "data"]}}, "seeds.vary"),
    ],
)
def test_bad_tune_blocks_name_the_field(patch: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        tune_block(parse({**CONFIG, **patch}))
    assert err.value.field == field, str(err.value)
    assert err.value.fix


def test_values_inside_a_range_that_the_config_refuses_are_found_before_ray() -> None:
    """Before, only the bounds were checked: 5 heads for d_model 8, inside [1, 8], stopped the
    search after Ray had started (every resume again), and a float range on d_model passed
    because both bounds were whole numbers."""
    cfg = {"name": "h", "model": {"name": "transformer", "d_model": 8, "n_heads": 2, "n_layers": 1, "d_ff": 16},
           "task": {"name": "length_gen", "kind": "count", "train_lengths": [1, 4], "test_lengths": [1, 8],
                    "train_size": 64, "val_size": 8, "val_ood_size": 8, "test_size": 4},
           "train": {"optimizer": "adamw", "lr": 0.001, "batch_size": 8, "max_steps": 10,
                     "selection": {"split": "val", "metric": "exact", "mode": "last", "early_stop": False}}}

    def refusal(space: dict[str, Any]) -> str:
        with pytest.raises(ConfigError) as err:
            tune_block(parse({**cfg, "tune": {"space": space, "objective": {"split": "val_ood", "metric": "exact"}}}))
        return str(err.value)

    heads = refusal({"model.n_heads": {"low": 1, "high": 8, "type": "int"}})
    assert heads == ("tune.space.model.n_heads: the config refuses values inside the range [1, 8]: 3, 5, 6, 7 "
                     "(model.n_heads: 3 heads do not divide d_model 8). Fix: search a range whose every value the "
                     "config takes, or try the valid values as a grid axis (a grid: block) instead")
    width = refusal({"model.d_model": {"low": 8, "high": 16}})
    assert width.startswith("tune.space.model.d_model: a float range on a whole-number field (10.96 is refused: ")
    assert width.endswith("Fix: add `type: int` to the range"), width
    ok = {"model.n_heads": {"low": 1, "high": 2, "type": "int"}, "model.dropout": {"low": 0.0, "high": 0.5}}
    assert set(tune_block(parse({**cfg, "tune": {"space": ok, "objective": {"split": "val_ood", "metric": "exact"}}}))
               .space or {}) == set(ok)


def test_default_space_and_direction() -> None:
    block = tune_block(
        parse({**CONFIG, "tune": {"objective": {"split": "val_ood", "metric": "loss"}}})
    )
    assert block.direction == "minimize"
    assert block.space is not None and set(block.space) == {"train.lr", "model.dropout"}
    lr, dropout = block.space["train.lr"], block.space["model.dropout"]
    assert (lr.low, lr.high, lr.log) == (0.01, 1.0, True)
    assert (dropout.low, dropout.high, dropout.log) == (0.0, 0.5, False)
    assert tune_block(parse({**CONFIG, "tune": {}})).direction == "maximize"


def test_objective_aggregates() -> None:
    values = [3.0, 1.0, 10.0, 2.0, float("nan")]
    finite = [3.0, 1.0, 10.0, 2.0]
    mean = objective_stats(values, "mean")
    assert mean["objective"] == pytest.approx(sum(finite) / 4)
    assert mean["objective_std"] == pytest.approx(statistics.stdev(finite))
    assert (mean["objective_min"], mean["objective_max"], mean["objective_n"]) == (1.0, 10.0, 4)
    assert objective_stats(values, "median")["objective"] == pytest.approx(
        statistics.median(finite)
    )
    assert objective_stats(values, "iqm")["objective"] == pytest.approx(
        (2.0 + 3.0) / 2
    )  # middle half
    assert math.isnan(objective_stats([float("nan")], "mean")["objective"])


# ---------------------------------------------------------------- the searcher, in-process
def _score(params: dict[str, float]) -> float:
    """A deterministic stand-in for training (the searcher only sees numbers)."""
    return (math.log10(params["train.lr"]) + 1.2) ** 2 + (params["model.dropout"] - 0.3) ** 2


def _final(value: float) -> dict[str, float]:
    return {
        "objective": value,
        "objective_std": 0.0,
        "objective_min": value,
        "objective_max": value,
        "objective_n": float(K),
    }


def _search(out: Path, n: int, stop_after: int | None = None) -> list[dict[str, float]]:
    """Run a sequential search to ``n`` finished candidates; with ``stop_after``, abandon a
    candidate mid-run after that many (a killed driver) and resume with a new searcher."""
    cfg = parse({**CONFIG, "tune": {**TUNE, "sequential": True, "startup_trials": 3}})
    block = tune_block(cfg)
    (out / NAME).mkdir(parents=True)  # the study folder (run_tuning's manifest makes it)
    template = candidate_template(cfg, block, NAME, out)
    storage = optuna.storages.RDBStorage(storage_url(out, NAME))
    search_cls, _ = ray_classes()
    searcher = search_cls(block, template, storage)
    for i in range(stop_after if stop_after is not None else n):
        searcher.on_trial_complete(f"t{i}", _final(_score(searcher.suggest(f"t{i}"))))
    if stop_after is not None:
        searcher.suggest("abandoned")  # left RUNNING, as by a SIGKILL
        study = optuna.load_study(study_name=NAME, storage=storage)
        assert reconcile(study, storage, out, block, template) == [stop_after]
        searcher = search_cls(block, template, storage)
        for i in range(stop_after, n):
            searcher.on_trial_complete(f"r{i}", _final(_score(searcher.suggest(f"r{i}"))))
    study = optuna.load_study(study_name=NAME, storage=storage)
    return [t.params for t in sorted(completed(study), key=lambda t: t.number)]


def test_sequential_search_is_reproducible_across_an_interruption(tmp_path: Path) -> None:
    a = _search(tmp_path / "a", 8)
    b = _search(tmp_path / "b", 8)
    c = _search(tmp_path / "c", 8, stop_after=5)
    assert len(a) == 8 and len({json.dumps(p, sort_keys=True) for p in a}) == 8
    assert a == b, "same seed, same history: the same proposals"
    assert a == c, "an interrupted and resumed search proposes what an uninterrupted one did"
    d = _search(tmp_path / "d", 4)
    assert d == a[:4]


def _in_process_search(tmp_path: Path, cfg: Any) -> tuple[Any, Any, dict[str, Any], Any]:
    """(searcher class, tune block, candidate template, Optuna storage) of ``cfg`` under
    ``tmp_path``: the searcher driven in-process, without Ray."""
    block = tune_block(cfg)
    template = candidate_template(cfg, block, NAME, tmp_path)
    (tmp_path / NAME).mkdir()
    search_cls, _ = ray_classes()
    return search_cls, block, template, optuna.storages.RDBStorage(storage_url(tmp_path, NAME))


def test_a_pruned_candidate_is_pruned_in_optuna_and_listed_in_trials(tmp_path: Path) -> None:
    cfg = parse(CONFIG)
    search_cls, block, template, storage = _in_process_search(tmp_path, cfg)
    searcher = search_cls(block, template, storage)
    params = searcher.suggest("p")
    searcher.on_trial_complete("p", {"objective": 50.0, "epoch": 1, "opt_step": 19})
    (trial,) = optuna.load_study(study_name=NAME, storage=storage).get_trials(deepcopy=False)
    assert trial.state == optuna.trial.TrialState.PRUNED and trial.params == params
    rows = sql(
        tmp_path,
        "SELECT trial_id, status, objective, pruned_objective, pruned_epoch, param_train_lr FROM trials",
    )
    assert len(rows) == 1 and rows[0]["status"] == "pruned" and rows[0]["objective"] is None
    assert rows[0]["trial_id"] == trial.user_attrs["trial_id"]
    assert (rows[0]["pruned_objective"], rows[0]["pruned_epoch"]) == (50.0, 1)
    assert rows[0]["param_train_lr"] == pytest.approx(params["train.lr"], rel=1e-12)


def test_the_pruner_compares_a_resumed_searchs_candidates_with_earlier_ones(tmp_path: Path) -> None:
    """``pruner: asha`` with one candidate per trial is Optuna's SuccessiveHalvingPruner, which
    keeps each rung's values in the storage. Ray's ASHA kept them in the driver's memory, so
    after a resume (a fresh searcher, as here) a candidate far worse than one finished before
    trained to its end. Rungs at 1, 2, 4 epochs (grace 1, factor 2); objective: a loss."""
    cfg = parse({**CONFIG, "tune": {**TUNE, "pruner": "asha", "grace_period": 1, "reduction_factor": 2}})
    search_cls, block, template, storage = _in_process_search(tmp_path, cfg)
    first = search_cls(block, template, storage)
    first.suggest("a")
    assert first.should_prune("a", {"objective_curve": [[1, 10.0]]}) is False  # alone at rung 0
    final = {"objective": 9.0, "objective_std": 0.0, "objective_min": 9.0, "objective_max": 9.0, "objective_n": 2}
    first.on_trial_complete("a", {**final, "objective_curve": [[2, 9.0]]})
    resumed = search_cls(block, template, storage)  # the next `study tune`: a new driver
    resumed.suggest("b")
    assert resumed.should_prune("b", {"objective_curve": [[1, 50.0]]}) is True  # worse than a at rung 0
    resumed.suggest("c")
    assert resumed.should_prune("c", {"objective_curve": [[1, 5.0]]}) is False  # better: promoted
    assert [list(t.intermediate_values.items()) for t in load_study(tmp_path).get_trials(deepcopy=False)] == [
        [(1, 10.0), (2, 9.0)], [(1, 50.0)], [(1, 5.0)]]


def test_a_task_declares_its_default_space(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Task.default_search_space`` (a plugin's task declares its own); without one, a
    ``tune:`` block must name its space and the error says where a default would go."""
    from trainables.registry import TASKS
    from trainables.tasks.toy2d import Toy2D

    toy = {"task": {"name": "toy2d"}, "model": {"name": "mlp"}, "seeds": {"count": 2},
           "train": {"selection": {"split": "train_eval"}},
           "tune": {"objective": {"split": "train_eval", "metric": "accuracy"}, "trials": 2}}
    with pytest.raises(ConfigError, match=r"Task\.default_search_space") as err:
        tune_block(parse(toy))
    assert err.value.field == "tune.space"
    monkeypatch.setattr(TASKS.get("toy2d"), "default_search_space", {"train.lr": {"low": 0.001, "high": 0.1, "log": True}})
    assert TASKS.get("toy2d") is Toy2D
    block = tune_block(parse(toy))
    assert block.space is not None and list(block.space) == ["train.lr"] and block.space["train.lr"].high == 0.1


def test_a_driver_killed_between_the_pruned_row_and_optuna_is_settled_as_pruned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One candidate per trial, ASHA: the driver told Optuna PRUNED, then wrote the pruned
    ``trials`` row; killed in between, the candidate stayed PRUNED without its row. The row
    is now written first (with its ``optuna_number``, as in a bundle), so a driver killed
    before Optuna heard is settled from it: PRUNED, nothing re-run."""
    cfg = parse(CONFIG)
    search_cls, block, template, storage = _in_process_search(tmp_path, cfg)
    searcher = search_cls(block, template, storage)
    searcher.suggest("p")

    def killed(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt  # the driver dies before Optuna hears
    with monkeypatch.context() as m:
        m.setattr(optuna.study.Study, "tell", killed)
        with pytest.raises(KeyboardInterrupt):
            searcher.on_trial_complete("p", {"objective": 50.0, "epoch": 1, "opt_step": 19})
    study = optuna.load_study(study_name=NAME, storage=storage)
    assert reconcile(study, storage, tmp_path, block, template) == []
    (trial,) = study.get_trials(deepcopy=False)
    assert trial.state == optuna.trial.TrialState.PRUNED
    rows = sql(tmp_path, "SELECT status, optuna_number, pruned_epoch FROM trials")
    assert rows == [{"status": "pruned", "optuna_number": 0, "pruned_epoch": 1}]


def test_a_resume_that_finds_the_search_finished_removes_the_search_folders(tmp_path: Path) -> None:
    """A driver killed after its last candidate committed leaves ``OUT/NAME/ray`` (Ray Tune's
    storage) and ``OUT/NAME/pruned``; the resume settles the candidate and finds the search
    finished, and returned before removing them (docs: removed when the search ends)."""
    from study.tuning import run_tuning

    _search(tmp_path, 3)  # 3 finished candidates, no Ray
    for left in ("ray/tune-1", "pruned"):
        (tmp_path / NAME / left).mkdir(parents=True)
    (tmp_path / NAME / "pruned" / "b1.json").write_text('{"numbers": [0]}')
    cfg = parse({**CONFIG, "tune": {**TUNE, "sequential": True, "startup_trials": 3}})
    res = run_tuning(cfg, NAME, tmp_path, trials=3, num_cpus=1)
    assert res == {"requested": 3, "finished": 3, "ran": 0}
    assert not (tmp_path / NAME / "ray").exists() and not (tmp_path / NAME / "pruned").exists()


JOINT: dict[str, Any] = {
    "name": "joint",
    "task": {"name": "length_gen", "kind": "count", "train_lengths": [1, 4], "test_lengths": [1, 8],
             "train_size": 64, "val_size": 8, "val_ood_size": 8, "test_size": 4},
    "model": {"name": "transformer", "d_model": 16, "n_heads": 1, "n_layers": 1, "d_ff": 16},
    "train": {"optimizer": "adamw", "lr": 0.001, "batch_size": 8, "max_steps": 4, "eval_every_steps": 2,
              "selection": {"split": "val", "metric": "exact", "mode": "last", "early_stop": False}},
    "seeds": {"count": 1},
    "tune": {"trials": 3, "seeds_per_candidate": 1, "sampler": "random", "sampler_seed": 0,
             "objective": {"split": "val_ood", "metric": "exact"},
             "space": {"model.d_model": {"low": 16, "high": 17, "type": "int"},
                       "model.n_heads": {"low": 1, "high": 2, "type": "int"}}},
}


@pytest.mark.parametrize("batch", [1, pytest.param(2, marks=pytest.mark.slow)])  # ~18 s each
def test_a_candidate_the_config_refuses_is_told_failed_and_another_is_drawn(tmp_path: Path, batch: int) -> None:
    """Two searched fields that pass alone but not together (17 wide with 2 heads): each is
    checked before Ray, the pair only once drawn. Seeded random draws 0-2 are (17, 2): each is
    told to Optuna as FAIL with its reason, said on the console, never trained, and the search
    draws on until 3 candidates finished (before: the first ConfigError ended the search,
    exit 2 after Ray had started, and every resume drew it again), one at a time and in bundles."""
    cfg = tmp_path / "joint.yaml"
    cfg.write_text(yaml.safe_dump({**JOINT, "tune": {**JOINT["tune"], "batch": batch}}))
    out = tmp_path / "results"
    res = cli("tune", str(cfg), "--out", str(out), "--num-cpus", "2")
    refused = [ln for ln in (res.stdout + res.stderr).splitlines() if "refused by the config, not trained" in ln]
    assert len(refused) == 3 and all(ln.startswith("candidate ") and "(model.d_model=17, model.n_heads=2)" in ln
                                     and ln.endswith("model.n_heads: 2 heads do not divide d_model 17. Fix: choose "
                                                     "n_heads dividing d_model (e.g. d_model 128 with 4 heads)")
                                     for ln in refused), res.stdout
    study = load_study(out, "joint")
    failed = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))
    assert len(failed) == 3 and all("refused" in t.user_attrs for t in failed)
    done = completed(study)
    assert len(done) == 3 and all((t.params["model.d_model"], t.params["model.n_heads"]) != (17, 2) for t in done)
    rows = sql(out, "SELECT count(*) AS n FROM runs WHERE study = 'joint'")
    assert rows == [{"n": 3}]
