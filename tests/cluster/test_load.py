"""The 500-trial load benchmark finishes with every row (slow: minutes on 2 cores).

Completeness and the number of trial actors are asserted; its timings and CPU times are
reported, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_500_tiny_trials_commit_every_row() -> None:
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "load_500.py"), "--trials", "500", "--json"],
        capture_output=True, text=True, timeout=1800, cwd=ROOT,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    figures = json.loads(res.stdout[res.stdout.index("{") :])
    assert figures["rows_runs"] == figures["rows_trials"] == figures["rows_seeds"] == 500
    assert figures["rows_evals"] == 500 * 21  # 7 splits x 3 metrics per seed
    assert figures["busy_s"] > 0 and figures["span_s"] > 0
    # one trial actor per CPU, each reused: none started only to be stopped (study.runner.launch)
    assert figures["trial_actors"] == 2
    assert figures["cpu_total_s"] > figures["cpu_trials_s"] > figures["own_cpu_s"] > 0
