"""End to end: a tiny real study (two configs x four seeds of the 2-D toy, local Ray, one CPU)
-> `study analyze --event ... --format json` holds the time to the event, the seed counts and
the Multi-Bootstrap, each checked against the tables read independently."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import yaml
from scipy import stats as sps

from analysis.db import outside_views_sql

EPOCHS = 8
EVENT = "train_eval accuracy >= 0.98"


def study(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if k in ("HOME", "PYTHONPATH", "VIRTUAL_ENV", "LANG")
    }
    res = subprocess.run(
        [sys.executable, "-m", "study.cli", *args], capture_output=True, text=True, timeout=600,
        env={"RAY_USAGE_STATS_ENABLED": "0", "PATH": "/usr/bin:/bin", **env},
    )  # fmt: skip
    if check and res.returncode != 0:
        raise AssertionError(
            f"study {' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
        )
    return res


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory, project_root: Path) -> Path:
    root = tmp_path_factory.mktemp("questions-e2e")
    cfg = yaml.safe_load((project_root / "configs" / "li2021_toy.yaml").read_text())
    cfg["name"] = "toy"
    cfg["train"]["max_epochs"] = EPOCHS  # mode last, early_stop false: every run to its budget
    cfg["grid"] = {"train.lr": [0.1, 0.02]}
    cfg["seeds"] = {"count": 4, "root": 7}
    cfg["execution"] = {"bundle_size": 4}
    (root / "toy.yaml").write_text(yaml.safe_dump(cfg))
    o = root / "results"
    study("run", str(root / "toy.yaml"), "--out", str(o), "--num-cpus", "1")
    return o


@pytest.fixture(scope="module")
def doc(out: Path) -> dict:
    res = study(
        "analyze", "toy", "--out", str(out), "--event", EVENT, "--format", "json", "--n-boot", "400"
    )
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def con(out: Path) -> duckdb.DuckDBPyConnection:
    c = duckdb.connect()
    c.execute(outside_views_sql(out))
    return c


def test_time_to_event_matches_the_curves(doc: dict, con: duckdb.DuckDBPyConnection) -> None:
    (ev,) = doc["events"]
    assert ev["event"]["label"] == EVENT and ev["unit"] == "epoch"
    curves = con.execute(
        "SELECT trial_id, seed, min(epoch) FILTER (WHERE value >= 0.98), max(epoch) FROM metrics "
        "WHERE split = 'train_eval' AND metric = 'accuracy' GROUP BY ALL"
    ).fetchall()
    runs = {(r["trial_id"], r["seed"]): r for r in ev["runs"]}
    assert len(runs) == len(curves) == 8
    for tid, seed, first, last in curves:
        r = runs[(tid, seed)]
        assert last == EPOCHS and r["budget"] == EPOCHS
        assert (r["outcome"], r["time"]) == (
            ("event", first) if first is not None else ("budget", EPOCHS)
        )
    for s in ev["summary"]:
        mine = [r for r in ev["runs"] if r["point"] == s["point"]]
        times = sorted(r["time"] for r in mine if r["outcome"] == "event")
        assert s["events"] == len(times) and s["censored_budget"] == 4 - len(times)
        assert s["reached"] == pytest.approx(len(times) / 4)  # censoring only at the budget
        # the KM median: the first time at least half of the 4 runs had the event
        assert s["median"] == (times[1] if len(times) >= 2 else None)
        assert s["reached_low"] <= s["reached"] <= s["reached_high"]
    assert not any("informative" in w for w in doc["warnings"])


def test_seed_counts_match_the_evals(doc: dict, con: duckdb.DuckDBPyConnection) -> None:
    c = doc["seed_counts"]
    assert c["metric"] == "accuracy" and c["half_width"] == 0.02
    for r in c["estimate"]:
        vals = [v for (v,) in con.execute(
            "SELECT e.value FROM evals e JOIN trials t USING (study, trial_id) WHERE e.split = ? "
            "AND e.metric = 'accuracy' AND t.point_json LIKE ?", [r["split"], f"%{r['point'][3:]}%"]
        ).fetchall()]  # fmt: skip
        assert r["n"] == len(vals) == 4
        mean = sum(vals) / 4
        sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / 3)
        assert r["sd"] == pytest.approx(sd)
        n = 2
        while sps.t.ppf(0.975, n - 1) * sd / math.sqrt(n) > 0.02:
            n += 1
        assert r["seeds_needed"] == n
    assert [(p["split"], p["better"], p["worse"]) for p in c["comparisons"]] == [
        (v["split"], v["better"], v["worse"]) for v in doc["verdict"]["comparisons"]
    ]


def test_multiboot_holds_configs_and_splits(doc: dict, con: duckdb.DuckDBPyConnection) -> None:
    rows = doc["multi_bootstrap"]["rows"]
    assert doc["multi_bootstrap"]["n_boot"] == 400
    assert sorted((r["kind"], r["where"]) for r in rows) == [
        ("configs", "grid"),
        ("configs", "test"),
        ("splits", "lr=0.02"),
        ("splits", "lr=0.1"),
    ]
    for r in rows:
        assert r["paired_seeds"] and r["seeds_a"] == r["seeds_b"] == 4
        assert r["low"] <= r["diff"] <= r["high"] and 0 <= r["p"] <= 1
        assert r["paired_examples"] == (r["kind"] == "configs")
        split, lr = (r["where"], r["a"]) if r["kind"] == "configs" else (r["a"], r["where"])
        (mean,) = con.execute(
            "SELECT avg(p.correct::INT) FROM predictions p JOIN trials t USING (study, trial_id) "
            "WHERE p.split = ? AND t.point_json LIKE ?", [split, f"%{lr[3:]}%"]
        ).fetchone()  # fmt: skip
        assert r["mean_a"] == pytest.approx(mean)


def test_text_sections_and_a_bad_event(out: Path) -> None:
    text = study("analyze", "toy", "--out", str(out), "--event", EVENT, "--n-boot", "200").stdout
    for title in ("Time to event " + EVENT, "Share reached by each epoch", "How many seeds",
                  "Power of each config comparison", "Multi-Bootstrap over seeds and test examples"):  # fmt: skip
        assert title in text
    bad = study("analyze", "toy", "--out", str(out), "--event", "val accuracy >= 0.5", check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "--event" in bad.stderr and "'train_eval accuracy'" in bad.stderr
