"""The shipped Zhou et al. (2023) length-generalization study, shrunk by command-line
overrides, run end to end through the real CLI (local Ray, 2 CPUs): one test split per
length with free-running and oracle-length exact match in ``evals``, the declared
``length_generalization`` aggregate in ``study analyze`` recomputed from those rows, and its
charts in ``study report``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_simplicity_xor_studies import CONFIGS, analyze, sql, study

pytestmark = pytest.mark.slow  # a study through the CLI, minutes: run with -m slow

SHRINK = ["grid.task.kind=[count,parity]", "task.train_lengths=[1,3]", "task.test_lengths=[1,6]",
          "task.train_size=64", "task.val_size=16", "task.val_ood_size=16", "task.test_size=8",
          "task.random_start=3", "model.d_model=16", "model.n_heads=2", "model.d_ff=32",
          "train.max_steps=20", "train.eval_every_steps=10", "train.warmup_steps=2",
          "train.batch_size=16", "seeds.count=3"]  # fmt: skip
"""Two tasks, N = 3 (band len_5..len_6), three seeds: seconds per run."""


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("zhou") / "results"
    study("run", str(CONFIGS / "zhou2023_length_cpu.yaml"), *SHRINK, "--out", str(out), "--num-cpus", "2")
    return out


def test_every_length_is_a_test_split_scored_free_running_and_with_the_oracle_length(out: Path) -> None:
    runs = sql(out, "SELECT status, count(*) AS n FROM runs WHERE study = 'zhou2023_length_cpu' GROUP BY status")
    assert sum(r["n"] for r in runs) == 2 * 3 and {r["status"] for r in runs} <= {"ok", "not_learned"}
    rows = sql(out, "SELECT split, role, metric, count(*) AS n, min(value) AS lo, max(value) AS hi FROM evals "
                    "WHERE study = 'zhou2023_length_cpu' GROUP BY split, role, metric")  # fmt: skip
    got = {(r["split"], r["metric"]): r for r in rows}
    for n in range(1, 7):
        for metric in ("exact", "oracle_exact", "length_correct", "token_accuracy", "loss"):
            r = got[(f"len_{n}", metric)]
            assert r["role"] == "test" and r["n"] == 6, (n, metric)
            assert metric == "loss" or 0 <= r["lo"] <= r["hi"] <= 1
    preds = sql(out, "SELECT split, count(*) AS n FROM predictions WHERE study = 'zhou2023_length_cpu' "
                     "AND split = 'len_4' GROUP BY split")  # fmt: skip
    assert preds == [{"split": "len_4", "n": 8 * 6}]


def test_the_aggregate_counts_the_runs_that_length_generalize(out: Path) -> None:
    report: dict[str, Any] = analyze(out, "zhou2023_length_cpu")
    (agg,) = [a for a in report["aggregates"] if a["kind"] == "length_generalization"]
    assert agg["declaration"]["band"] == ["len_5", "len_6"] and agg["declaration"]["level"] == 0.9
    evals = sql(out, "SELECT e.trial_id, e.seed, e.split, e.metric, e.value FROM evals e JOIN runs r USING "
                     "(study, trial_id, seed) WHERE e.study = 'zhou2023_length_cpu' AND r.status = 'ok' AND "
                     "e.split IN ('len_5', 'len_6') AND e.metric IN ('exact', 'oracle_exact')")  # fmt: skip
    band: dict[tuple[str, str, int], list[float]] = {}
    for r in evals:
        band.setdefault((r["metric"], r["trial_id"], r["seed"]), []).append(r["value"])
    assert all(len(v) == 2 for v in band.values())
    rows = agg["rows"]
    assert sum(r["runs"] for r in rows) == len({(t, s) for _, t, s in band})
    for prefix, metric in (("", "exact"), ("oracle_", "oracle_exact")):
        good = sorted((t, s) for (m, t, s), v in band.items() if m == metric and sum(v) / 2 >= 0.9)
        assert sum(r[prefix + "generalize"] for r in rows) == len(good)
        assert sum(len(r[prefix + "seeds"].split()) for r in rows) == len(good)
        means = [sum(v) / 2 for (m, _, _), v in band.items() if m == metric]
        assert min(r[prefix + "min"] for r in rows) == pytest.approx(min(means))
        assert all(0 <= r[prefix + "boot_low"] <= r[prefix + "boot_high"] <= 1 for r in rows)


def test_the_verdict_speaks_about_the_band(out: Path) -> None:
    v = analyze(out, "zhou2023_length_cpu")["verdict"]
    assert v["splits"] == ["len_5..len_6", "len_5", "len_6"] and v["axis_from"] == "declared by the task"
    assert v["pooled_splits"] == {"len_5..len_6": ["len_5", "len_6"]} and v["metric"] == "exact"
    assert "len_5..len_6 exact" in v["sentence"]
    (band,) = [s for s in v["shares"] if s["split"] == "len_5..len_6"]
    assert band["configs"] == 2 and band["runs"] == sum(r["ok"] for r in v["excluded"])


def test_the_report_draws_exact_match_by_length(out: Path) -> None:
    study("report", "zhou2023_length_cpu", "--out", str(out))
    html = (out / "zhou2023_length_cpu" / "report.html").read_text()
    for title in ("exact by test length (free-running)", "oracle_exact by test length (oracle length)"):
        assert json.dumps(title)[1:-1] in html
