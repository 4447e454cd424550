"""Plugins on a real two-raylet Ray cluster: loaded on every worker of every node.

* An installed plugin (``examples/parity_plugin``, pip-installed by ``.ci/run``) runs a
  study through ``study run --address`` on both nodes, then ``study sql`` and
  ``study report`` read its results; its contract suite passes in its own pytest run.
* A local module named under ``plugins:`` (kept out of the driver's working directory,
  ``PYTHONPATH`` and site-packages) reaches the workers only because fineline ships it
  with the job (``runtime_env`` ``py_modules``): with ``execution.ship_plugins: false`` the
  same study fails on the workers, naming the plugin and the fix.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from raycluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "parity_plugin"
LOCAL_PLUGIN = ROOT / "tests" / "plugins" / "blobs_task.py"


def study(cluster: Cluster, cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = cluster.driver_env()
    env.pop("PYTHONPATH", None)  # a plugin must arrive by install or by shipping, not by path
    return subprocess.run([sys.executable, "-m", "study.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def ok(res: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert res.returncode == 0, f"failed ({res.returncode}):\n{res.stdout}\n{res.stderr[-4000:]}"
    return res


def sql(cluster: Cluster, cwd: Path, out: Path, query: str) -> list[dict]:
    return json.loads(ok(study(cluster, cwd, "sql", "--out", str(out), "--format", "json", query)).stdout)


def test_installed_plugin_runs_on_both_nodes_then_sql_and_report(cluster: Cluster, tmp_path: Path) -> None:
    try:
        md.distribution("fineline-parity")
    except md.PackageNotFoundError:
        msg = f"the example plugin is not installed: `python3 -m pip install {EXAMPLE}` (.ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    out = tmp_path / "results"
    # 24 epochs (the file says 8): each bundle outlasts the worker node's actor start-up, so
    # both nodes train (actors are reused: a head done early would take the second bundle)
    ok(study(cluster, tmp_path, "run", str(EXAMPLE / "study.yaml"), "train.max_epochs=24", "--out", str(out),
             "--address", cluster.address))
    runs = sql(cluster, tmp_path, out, "SELECT trial_id, seed, node, status FROM runs WHERE study = 'parity'")
    assert len(runs) == 6 and {r["status"] for r in runs} == {"ok"}
    assert {r["node"] for r in runs} == {cluster.head.node_id, cluster.workers[0].node_id}, "both nodes trained"
    spread = sql(cluster, tmp_path, out, """
        SELECT t.train_lr AS lr, count(*) AS n, min(e.value) AS lo, max(e.value) AS hi
        FROM evals e JOIN (SELECT DISTINCT trial_id, train_lr FROM trials WHERE study = 'parity') t
        USING (trial_id) WHERE e.study = 'parity' AND e.split = 'test_ood' AND e.metric = 'accuracy'
        GROUP BY ALL ORDER BY lr""")
    assert [r["n"] for r in spread] == [3, 3]
    assert all(0.5 < r["lo"] <= r["hi"] <= 1.0 for r in spread), spread
    bundling = sql(cluster, tmp_path, out, "SELECT DISTINCT bundling, bundle_size FROM trials WHERE study = 'parity'")
    assert bundling == [{"bundling": "vmap", "bundle_size": 3}], "the plain module ran vmapped, 3 seeds a bundle"
    manifest = json.loads((out / "parity" / "study.json").read_text())
    assert "entry point 'parity' of fineline-parity" in manifest["plugins"]["model parity_mlp"]
    report = ok(study(cluster, tmp_path, "report", "parity", "--out", str(out)))
    page = Path(report.stdout.strip().split("report written: ")[-1])
    assert page.is_file() and "test_ood" in page.read_text()


def test_the_example_plugin_passes_the_shipped_contract_in_its_own_pytest_run() -> None:
    if not (EXAMPLE / "src" / "fineline_parity").is_dir():
        pytest.fail("examples/parity_plugin is missing")
    try:
        md.distribution("fineline-parity")
    except md.PackageNotFoundError:
        pytest.skip("the example plugin is not installed (.ci/run installs it)")
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                         cwd=EXAMPLE, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and " passed" in res.stdout, res.stdout[-3000:]
    from trainables.testing import contract_suite

    suite = contract_suite(tasks=["parity"], models=["parity_mlp"])
    checks = sum(name.startswith("test_") for name in dir(suite))  # some are parametrized
    passed = re.search(r"(\d+) passed", res.stdout)
    assert passed and int(passed[1]) >= checks, res.stdout[-500:]
    assert "skipped" not in res.stdout and "failed" not in res.stdout, res.stdout[-500:]


def local_study(tmp_path: Path, ship: bool) -> tuple[Path, Path]:
    """A study file with the local plugin beside it, and another folder to run from."""
    home, cwd = tmp_path / "study", tmp_path / "elsewhere"
    home.mkdir()
    cwd.mkdir()
    shutil.copy(LOCAL_PLUGIN, home / LOCAL_PLUGIN.name)
    cfg = {
        "name": "blobs", "plugins": ["blobs_task"],
        # the two runs meet before training (task.rendezvous), so the head cannot finish the
        # first and take the second (actors are reused) before the worker node's actor is up:
        # a run time longer than that start-up (12 epochs, ~6 s) lost the race under load
        "task": {"name": "blobs", "n": 3000, "rendezvous": str(tmp_path / "meet")},
        "model": {"name": "mlp", "hidden": [16]},
        "train": {"lr": 0.01, "batch_size": 8, "max_epochs": 12},
        "seeds": {"count": 2}, "execution": {"bundle_size": 1, "ship_plugins": ship, "max_failures": 0},
    }
    (home / "study.yaml").write_text(yaml.safe_dump(cfg))
    return home / "study.yaml", cwd


def test_a_local_plugin_module_is_shipped_to_every_worker(cluster: Cluster, tmp_path: Path) -> None:
    path, cwd = local_study(tmp_path, ship=True)
    out = tmp_path / "results"
    res = ok(study(cluster, cwd, "run", str(path), "--out", str(out), "--address", cluster.address))
    assert f"plugins shipped to the Ray workers: blobs_task ({path.parent / 'blobs_task.py'})" in res.stderr
    runs = sql(cluster, cwd, out, "SELECT seed, node FROM runs WHERE study = 'blobs'")
    assert sorted(r["seed"] for r in runs) == [0, 1]
    assert len(list((tmp_path / "meet").iterdir())) == 2  # the two runs' builds met (none in the driver)
    assert {r["node"] for r in runs} == {cluster.head.node_id, cluster.workers[0].node_id}, "both nodes trained"


@pytest.mark.slow  # ~10 s: the negative twin of the shipping test
def test_without_shipping_the_local_plugin_fails_on_the_workers(cluster: Cluster, tmp_path: Path) -> None:
    """The control for the test above: the module is truly out of the workers' reach."""
    path, cwd = local_study(tmp_path, ship=False)
    out = tmp_path / "results"
    res = study(cluster, cwd, "run", str(path), "--out", str(out), "--address", cluster.address)
    assert res.returncode != 0, res.stdout
    log = res.stdout + res.stderr
    assert "plugin blobs_task" in log and "ModuleNotFoundError: No module named 'blobs_task'" in log, log[-3000:]
    assert "execution.ship_plugins is false" in log
    # trials that failed before their first result count as failed (Tune's results give them no config)
    assert "0/2 runs committed, 2 failed, 0 pending" in log, log[-3000:]
    assert not list((out / "tables" / "runs").glob("study=blobs/*.parquet")), "no seed may commit"
