"""A trial's worker killed by Ray's memory monitor: one line that says so, with the fix.

Ray's monitor kills the worker using most memory once the node passes
``RAY_memory_usage_threshold``. Killed in a trial's setup, Tune took it as a trial error
(retried, then 40 lines of Ray's memory report per try); killed in a step, Ray Tune 2.60
re-raised it as a bare ``RuntimeError`` that ended the driver with a 170-line traceback.
Both now end the study with the node's numbers and what to lower; the study resumes.
The tests set the threshold 4 GiB above what the machine uses now and let the plugin task
(``tests/plugins/hog_task.py``) hold 8 GiB in the worker, at its data build or its scoring.
The threshold is the whole machine's, and the other pytest process of the default run
(``-n 2``) starts and stops Rays meanwhile: with 1 GiB and 3 GiB it once crossed the
threshold before the hog did.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests_support import TOY_STUDY

from study.failures import MEMORY_FIX, memory_text

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "hog_task.py"
STUDY = {**TOY_STUDY, "name": "hog", "task": {**TOY_STUDY["task"], "name": "hog2d"}, "plugins": ["hog_task"],
         "seeds": {"count": 1}}


def _threshold() -> str:
    """Ray's kill threshold (a fraction of the node's memory): 4 GiB above what is used now."""
    info = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in Path("/proc/meminfo").read_text().splitlines()}
    used = info["MemTotal"] - info["MemAvailable"]
    if used + 10 * 2**30 > info["MemTotal"]:  # the hog, and room for the other test process
        pytest.skip(f"needs 10 GiB of free memory ({info['MemAvailable'] / 2**30:.1f} GiB available)")
    return f"{(used + 4 * 2**30) / info['MemTotal']:.4f}"


@pytest.mark.parametrize(
    ("at", "counts"),
    [pytest.param("build", "0/1 runs committed, 1 failed, 0 pending (1 trial(s) failed (errors above))",
                  marks=pytest.mark.slow),  # ~12 s; the kill that ended the driver stays in the default run
     ("score", "0/1 runs committed, 0 failed, 1 pending (Ray killed a trial's worker for memory")],
)
def test_a_worker_killed_for_memory_is_one_line_with_the_fix(tmp_path: Path, at: str, counts: str) -> None:
    shutil.copy(PLUGIN, tmp_path / PLUGIN.name)
    cfg = tmp_path / "hog.yaml"
    cfg.write_text(yaml.safe_dump({**STUDY, "execution": {"max_failures": 0}}))
    out = tmp_path / "results"
    keep = ("HOME", "LANG", "PATH", "VIRTUAL_ENV", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_memory_usage_threshold=_threshold(), HOG_AT=at, HOG_GB="8")
    res = subprocess.run(
        [sys.executable, "-m", "study.cli", "run", str(cfg), "--out", str(out), "--num-cpus", "1"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    text = res.stdout + res.stderr
    assert res.returncode == 1, text[-3000:]
    assert "Traceback" not in text and "Object store memory usage" not in text, text[-3000:]
    assert len(text.splitlines()) <= 6, text
    assert f"error: study hog: {counts}" in text, text
    assert "Ray killed a trial's worker for memory on node " in text and MEMORY_FIX in text, text
    assert f"study resume hog --out {out}" in text, text


def test_memory_text_reads_rays_report() -> None:
    """The numbers come from the report's own lines (an excerpt of a real one, Ray 2.60)."""
    report = (
        "1 worker(s) were killed due to the node running low on memory. Memory on the node "
        "(IP: 10.0.0.7, ID: e5ac62e1) was 22.78GB used / 23.54GB limit (0.967881)\n"
        "OOM kill reason: Memory usage 24169283584B exceeded threshold of 24012677120B\n"
        "Top 10 memory users: PID\tMEM(GB)\tCOMMAND\n"
        "19133\t11.56\tray::ResourceTrainable.train\n"
        "19132\t10.11\tray::ResourceTrainable.train\n"
        "18883\t0.29\t/usr/bin/python3 study tune\n"
    )
    assert memory_text(report) == (
        "Ray killed a trial's worker for memory on node 10.0.0.7 "
        "(22.78GB used of its 23.54GB limit; the largest trial worker held 11.56 GB)"
    )
    assert memory_text("killed") == "Ray killed a trial's worker for memory"
