"""A real study of a task whose headline metric is an error (tests/plugins/misses_task.py):
selection, the manifest, the verdict and the predictions read it as lower-is-better.

Before, the verdict named the config with the larger error "Best", and the predictions
table marked an example "correct" where its error was above 0.5 (the plugin probe)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "misses_task.py"


def study(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "VIRTUAL_ENV", "PYTHONPATH")}
    env |= {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run([sys.executable, "-m", "study.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_study_of_an_error_metric_calls_the_lower_error_better(tmp_path: Path) -> None:
    shutil.copy(PLUGIN, tmp_path / PLUGIN.name)
    cfg = {"name": "misses", "plugins": ["misses_task"], "task": {"name": "misses", "n": 96},
           "model": {"name": "mlp", "hidden": [8]},
           "train": {"max_epochs": 4, "batch_size": 16, "predictions": True, "selection": {"early_stop": False}},
           "grid": {"train.lr": [0.0003, 0.05]}, "seeds": {"count": 3}, "execution": {"bundle_size": 3}}  # fmt: skip
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "results"
    ran = study(tmp_path, "run", "study.yaml", "--out", str(out), "--num-cpus", "2")
    assert ran.returncode == 0, ran.stderr
    analysis = json.loads((out / "misses" / "study.json").read_text())["analysis"]
    assert analysis["primary_metric"] == "miss"
    assert analysis["metrics"]["miss"] == {"better": "lower", "low": 0.0, "high": 1.0}
    assert analysis["metrics"]["margin"] == {"better": "higher", "low": None, "high": None}
    assert analysis["metrics"]["loss"]["better"] == "lower"

    def sql(query: str) -> list[dict]:
        res = study(tmp_path, "sql", "--out", str(out), "--format", "json", query)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    # selection kept the epoch of least val miss: the selected value is each seed's minimum
    picked = sql("SELECT r.seed, r.trial_id, e.value, (SELECT min(m.value) FROM metrics m WHERE m.study = r.study "
                 "AND m.trial_id = r.trial_id AND m.seed = r.seed AND m.split = 'val' AND m.metric = 'miss') AS least "
                 "FROM runs r JOIN evals e USING (study, trial_id, seed) WHERE e.split = 'val' AND e.metric = 'miss'")
    assert len(picked) == 6 and all(abs(p["value"] - p["least"]) < 1e-12 for p in picked), picked
    assert sql("SELECT count(*) AS n, count(correct) AS known FROM predictions") == [{"n": 6 * 2 * 96, "known": 0}]

    res = study(tmp_path, "analyze", "misses", "--out", str(out), "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    verdict = doc["verdict"]
    assert doc["multi_bootstrap"]["rows"] == [] and any(
        n.startswith("Multi-Bootstrap: none, as the primary metric miss is no share") for n in doc["notes"])
    assert (verdict["metric"], verdict["higher_is_better"]) == ("miss", False)
    means = {r["point"]: r["m"] for r in sql("SELECT t.point_json AS point, avg(e.value) AS m FROM evals e JOIN "
                                             "trials t USING (study, trial_id) WHERE e.split = 'test' AND "
                                             "e.metric = 'miss' GROUP BY t.point_json")}  # fmt: skip
    head = next(c for c in verdict["comparisons"] if c["split"] == "test")
    assert head["mean_better"] == pytest.approx(min(means.values())) != pytest.approx(max(means.values()))
    assert head["mean_worse"] == pytest.approx(max(means.values())), (head, means)
    assert "lr=0.05" in head["better"] and head["diff"] < 0
