"""The shipped Shah et al. (2020) and Xu et al. (2023) study files, shrunk by command-line
overrides, run end to end through the real CLI (local Ray, 2 CPUs): Parquet rows, the declared
aggregates (extreme simplicity bias, ensembles of seeds from stored predictions) and events
(time to convergence, to fitting the flipped labels, to recovery) in ``study analyze``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

pytestmark = pytest.mark.slow  # a study through the CLI, minutes: run with -m slow

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SHRINK = {
    "shah2020_lms5": ["task.dim=8", "task.n_train=600", "task.n_test=200", "train.max_steps=60",
                      "train.eval_every_steps=20", "seeds.count=4", "execution.bundle_size=2"],
    "shah2020_lms7": ["task.dim=8", "task.n_train=600", "task.n_test=200", "train.max_steps=40",
                      "train.eval_every_steps=20", "seeds.count=3", "execution.bundle_size=3"],
    "xu2023_xor": ["task.dim=300", "task.mu_norm=8.0", "task.n_train=30", "train.batch_size=30",
                   "task.n_test=100", "model.width=20", "train.max_steps=6", "seeds.count=3"],
}  # fmt: skip
"""Overrides that make each study train in seconds (grids as shipped)."""


def study(*args: str) -> subprocess.CompletedProcess[str]:
    import os

    env = {
        k: v for k, v in os.environ.items() if k in ("HOME", "PYTHONPATH", "VIRTUAL_ENV", "LANG")
    }
    res = subprocess.run(
        [sys.executable, "-m", "study.cli", *args], capture_output=True, text=True, timeout=600,
        env={"RAY_USAGE_STATS_ENABLED": "0", "PATH": "/usr/bin:/bin", **env},
    )  # fmt: skip
    if res.returncode != 0:
        raise AssertionError(
            f"study {' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
        )
    return res


def sql(out: Path, query: str) -> list[dict[str, Any]]:
    return json.loads(study("sql", "--out", str(out), "--format", "json", query).stdout)


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("papers") / "results"
    for name, overrides in SHRINK.items():
        study(
            "run", str(CONFIGS / f"{name}.yaml"), *overrides, "--out", str(out), "--num-cpus", "2"
        )
    return out


def analyze(out: Path, name: str) -> dict[str, Any]:
    return json.loads(
        study("analyze", name, "--out", str(out), "--format", "json", "--n-boot", "200").stdout
    )


def _aggregate(report: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    (agg,) = [a for a in report["aggregates"] if a["kind"] == kind]
    return agg["rows"]


def _auc(scores: np.ndarray, positive: np.ndarray) -> float:
    ranks = stats.rankdata(scores)
    n_pos, n_neg = positive.sum(), (~positive).sum()
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def test_slab_studies_commit_every_seed_with_aucs_on_three_test_sets(out: Path) -> None:
    # LMS-5 stops at convergence (a run that never converges: not_learned); L^MS-7 trains its
    # whole budget and keeps its best checkpoint (always ok)
    cases = (("shah2020_lms5", 3, 4, {"ok", "not_learned"}), ("shah2020_lms7", 2, 3, {"ok"}))
    for name, points, seeds, statuses in cases:
        runs = sql(out, f"SELECT trial_id, seed, status FROM runs WHERE study = '{name}'")
        assert len(runs) == points * seeds and {r["status"] for r in runs} <= statuses
        rows = sql(out, f"SELECT split, count(*) AS n, min(value) AS lo, max(value) AS hi FROM evals "
                        f"WHERE study = '{name}' AND metric = 'auc' GROUP BY split ORDER BY split")  # fmt: skip
        assert [r["split"] for r in rows] == [
            "test",
            "test_s_rand",
            "test_sc_rand",
            "train",
            "train_eval",
        ]
        # an AUC is a mean of per-example shares: 1 up to float rounding
        assert all(r["n"] == points * seeds and 0 <= r["lo"] <= r["hi"] <= 1 + 1e-12 for r in rows)
        preds = sql(
            out,
            f"SELECT split, count(*) AS n FROM predictions WHERE study = '{name}' GROUP BY split",
        )
        assert {r["split"]: r["n"] for r in preds} == {s: 200 * points * seeds for s in
                                                       ("test", "test_s_rand", "test_sc_rand")}  # fmt: skip


def test_extreme_sb_and_ensemble_aucs_agree_with_the_stored_values(out: Path) -> None:
    report = analyze(out, "shah2020_lms5")
    extreme = _aggregate(report, "extreme_sb")
    evals = sql(out, "SELECT e.trial_id, e.seed, e.split, e.value FROM evals e JOIN runs r USING "
                     "(study, trial_id, seed) WHERE e.study = 'shah2020_lms5' AND e.metric = 'auc' "
                     "AND r.status = 'ok'")  # fmt: skip
    per_run: dict[tuple[str, int], dict[str, float]] = {}
    for r in evals:
        per_run.setdefault((r["trial_id"], r["seed"]), {})[r["split"]] = r["value"]
    assert sum(row["runs"] for row in extreme) == len(per_run)
    flags = [
        v["test_s_rand"] <= 0.55 and v["test_sc_rand"] >= v["test"] - 0.02 for v in per_run.values()
    ]
    assert sum(row["extreme"] for row in extreme) == sum(flags)
    assert min(row["std_min"] for row in extreme) == pytest.approx(
        min(v["test"] for v in per_run.values())
    )

    ens = _aggregate(report, "ensemble_auc")
    assert {(r["split"]) for r in ens} == {"test", "test_s_rand", "test_sc_rand"}
    # recompute each point's ensemble from the predictions table: mean margin over its ok seeds
    rows = [r for r in ens if r["split"] == "test_sc_rand"]
    preds = sql(out, "SELECT p.trial_id, p.seed, p.example_id, p.target, p.prediction FROM predictions p "
                     "JOIN runs r USING (study, trial_id, seed) WHERE p.study = 'shah2020_lms5' AND "
                     "p.split = 'test_sc_rand' AND r.status = 'ok'")  # fmt: skip
    by_trial: dict[str, dict[int, dict[int, float]]] = {}
    targets: dict[int, bool] = {}
    for p in preds:
        by_trial.setdefault(p["trial_id"], {}).setdefault(p["seed"], {})[p["example_id"]] = float(
            p["prediction"]
        )
        targets[p["example_id"]] = p["target"] == "1"
    ensembles = []
    for seeds in by_trial.values():
        ids = sorted(targets)
        mean = np.mean([[s[i] for i in ids] for s in seeds.values()], axis=0)
        ensembles.append(_auc(mean, np.array([targets[i] for i in ids])))
    assert sorted(r["ensemble_auc"] for r in rows) == pytest.approx(sorted(ensembles))
    assert all(r["seeds"] >= 1 and 0 <= r["member_min"] <= r["member_max"] <= 1 for r in rows)
    assert all(r.get("ens3_n", 0) == (r["seeds"] // 3) for r in ens)


def test_xor_study_varies_init_and_data_apart_and_declares_its_events(out: Path) -> None:
    runs = sql(
        out, "SELECT trial_id, seed, init_seed, data_seed FROM runs WHERE study = 'xu2023_xor'"
    )
    assert len(runs) == 6 * 3
    by_trial: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by_trial.setdefault(r["trial_id"], []).append(r)
    kinds = sorted(
        (len({r["init_seed"] for r in rs}), len({r["data_seed"] for r in rs}))
        for rs in by_trial.values()
    )
    assert kinds == [(1, 3)] * 3 + [(3, 1)] * 3  # data varied with one init; init with one dataset
    curves = sql(out, "SELECT split, min(step) AS first, max(step) AS last, count(*) AS n FROM metrics "
                      "WHERE study = 'xu2023_xor' AND metric = 'accuracy' GROUP BY split ORDER BY split")  # fmt: skip
    assert [(c["split"], c["first"], c["last"], c["n"]) for c in curves] == [
        ("test", 1, 6, 6 * 18),
        ("train", 1, 6, 6 * 18),
    ]
    report = analyze(out, "xu2023_xor")
    events = {e["event"]["name"]: e for e in report["events"]}
    assert set(events) == {"fits_noise", "recovers"}
    assert events["recovers"]["event"]["threshold"] == 0.95
    outcomes = events["fits_noise"]["runs"]
    assert len(outcomes) == 18 and {o["outcome"] for o in outcomes} <= {"event", "budget"}
    assert all(o["time"] is None or 1 <= o["time"] <= 6 for o in outcomes)
