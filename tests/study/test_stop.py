"""``study stop``: a running study asked from another terminal to finish the bundles running
now and start no new one (a drain), or to stop at once (``--now``: SIGINT to its driver).

The end-to-end test runs a real ``study run`` on a local Ray of one CPU (one bundle at a
time) and drains it through the real CLI once its first seed has committed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
from raycluster import family, send, still_alive
from test_interrupt import CONFIG as STOPME
from test_interrupt import SEEDS, first_commit_of, study_env

from study import lock
from study.steer import DRAINED_EXIT, STOP_FILE, StopRequest, request_stop
from trainables.errors import StudyStateError
from trainables.results import committed

CONFIG = {**STOPME, "name": "drainme"}  # six one-seed bundles of a tiny symbol-rewriting config


def _study(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "study.cli", *args], capture_output=True, text=True,
                          env=study_env(), cwd=cwd, timeout=120)


def test_study_stop_drains_a_running_study_and_it_exits_3_with_counts(tmp_path: Path) -> None:
    proc, out, seen = first_commit_of(tmp_path, CONFIG)  # asked once the first seed is committed
    try:
        asked = _study("stop", "drainme", "--out", str(out), cwd=tmp_path)
        at_request = len(committed(out, "drainme"))
        _, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            send(family(proc.pid).values(), signal.SIGKILL)
            proc.wait(timeout=30)
    assert asked.returncode == 0, asked
    assert f"asked pid {proc.pid} on " in asked.stdout and "start no new one" in asked.stdout, asked.stdout
    assert f"`study stop drainme --now --out {out}` stops them too" in asked.stdout, asked.stdout
    done = len(committed(out, "drainme"))
    # one bundle runs at a time: the one running when asked finishes (not cut short), no other starts
    assert at_request <= done <= at_request + 1 and done < SEEDS, (at_request, done, stderr)
    assert proc.returncode == DRAINED_EXIT, (proc.returncode, stderr)
    assert "stop requested (study stop)" in stderr, stderr
    last = [ln for ln in stderr.splitlines() if ln.strip()][-1]
    assert last.startswith("stopped: study drainme: "), last  # asked for: not an "error:"
    match = re.search(r"(\d+)/(\d+) runs committed, (\d+) failed, (\d+) pending", last)
    assert match and (int(match[1]), int(match[2]), int(match[3]), int(match[4])) == (done, SEEDS, 0, SEEDS - done)
    assert "stopped by `study stop`" in last and f"study resume drainme --out {out}" in last, last
    assert "Traceback" not in stderr, stderr
    assert not (out / "drainme" / STOP_FILE).exists()  # the request was for that run only
    status = _study("status", "drainme", "--out", str(out), cwd=tmp_path)
    assert "stopped early: stopped by `study stop`" in status.stdout, status.stdout
    again = _study("stop", "drainme", "--out", str(out), cwd=tmp_path)
    assert again.returncode == 2 and "no driver is running study drainme" in again.stderr, again
    time.sleep(1)
    left = still_alive(seen.values())
    assert not left, [p.cmd for p in left]


def test_stop_without_a_running_driver_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StudyStateError, match=r"no study 's1' in .*study ls --out"):
        request_stop(tmp_path, "s1")
    (tmp_path / "s1").mkdir()
    with pytest.raises(StudyStateError, match=r"no driver is running study s1 .*study status s1"):
        request_stop(tmp_path, "s1")
    with lock.study_lock(tmp_path, "s1"):
        pass  # a driver that ended: its lock file is left, released
    with pytest.raises(StudyStateError, match="no driver is running"):
        request_stop(tmp_path, "s1", now=True)
    assert not (tmp_path / "s1" / STOP_FILE).exists()


def _rewrite_holder(path: Path, **changes: object) -> None:
    """Change the details the lock's holder wrote (as another driver's would read)."""
    info = json.loads(path.read_text())
    path.write_text(json.dumps({**info, **changes}))


def test_drain_writes_one_request_and_says_so_again(tmp_path: Path) -> None:
    with lock.study_lock(tmp_path, "s1") as path:
        _rewrite_holder(path, command="study run configs/x.yaml")
        first = request_stop(tmp_path, "s1")
        assert f"asked pid {os.getpid()} on" in first and "(study run configs/x.yaml)" in first
        record = json.loads((tmp_path / "s1" / STOP_FILE).read_text())
        assert record["by"].startswith(f"pid {os.getpid()} on ") and record["requested_at"]
        assert "already requested" in request_stop(tmp_path, "s1")
        assert [p.name for p in (tmp_path / "s1").iterdir() if p.name.startswith(".")] == []  # no temp file


def test_drain_is_refused_for_a_command_that_takes_no_requests(tmp_path: Path) -> None:
    with lock.study_lock(tmp_path, "s1") as path:
        _rewrite_holder(path, command="study eval s1 --split long")
        with pytest.raises(StudyStateError, match=r"does not take stop requests. Fix: .*study stop s1 --now"):
            request_stop(tmp_path, "s1")
    assert not (tmp_path / "s1" / STOP_FILE).exists()


def test_now_sends_sigint_to_the_driver_here_and_is_refused_for_another_machine(tmp_path: Path) -> None:
    got: list[int] = []
    before = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        with lock.study_lock(tmp_path, "s1") as path:
            said = request_stop(tmp_path, "s1", now=True)
            assert got == [signal.SIGINT] and "sent SIGINT" in said
            _rewrite_holder(path, host="node-7.example")
            with pytest.raises(StudyStateError, match=r"on another machine.*run `study stop s1 --now --out OUT` on "
                                                      r"node-7\.example"):
                request_stop(tmp_path, "s1", now=True)
            assert got == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_request_left_from_an_earlier_run_is_cleared_and_a_new_one_is_seen(tmp_path: Path) -> None:
    (tmp_path / "s1").mkdir()
    stale = tmp_path / "s1" / STOP_FILE
    stale.write_text("{}")
    request = StopRequest(tmp_path, "s1")
    assert not stale.exists() and request() is False
    stale.write_text("{}")
    assert request() is False  # looked at most once a second
    request._next = 0.0
    assert request() is True and request.seen
    stale.unlink()
    assert request() is True  # once seen, the run drains to its end
    request.clear()


@pytest.mark.slow  # ~35 s: a search drained, then resumed
def test_study_stop_drains_a_tuning_search_and_resume_finishes_it(tmp_path: Path) -> None:
    import optuna
    from test_tuning import CONFIG as TUNING

    from study.manifest import storage_url

    trials = 8
    config = {**TUNING, "name": "tdrain", "tune": {**TUNING["tune"], "trials": trials, "sequential": True}}
    proc, out, _ = first_commit_of(tmp_path, config, "tune")  # the first candidate's seeds are committing
    try:
        asked = _study("stop", "tdrain", "--out", str(out), cwd=tmp_path)
        _, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            send(family(proc.pid).values(), signal.SIGKILL)
            proc.wait(timeout=30)
    assert asked.returncode == 0 and "finish the candidates running now" in asked.stdout, asked
    assert proc.returncode == DRAINED_EXIT, (proc.returncode, stderr)
    last = [ln for ln in stderr.splitlines() if ln.strip()][-1]
    match = re.search(r"(\d+)/8 candidates finished, 0 failed, (\d+) pending", last)
    assert match and 1 <= int(match[1]) < trials and int(match[1]) + int(match[2]) == trials, last
    assert "stopped by `study stop`: the candidates running then finished" in last, last
    study = optuna.load_study(study_name="tdrain", storage=storage_url(out, "tdrain"))
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states == [optuna.trial.TrialState.COMPLETE] * int(match[1]), states  # none asked and dropped
    resumed = _study("resume", "tdrain", "--out", str(out), "--num-cpus", "1", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    study = optuna.load_study(study_name="tdrain", storage=storage_url(out, "tdrain"))
    done = study.get_trials(deepcopy=False)
    assert [t.state for t in done] == [optuna.trial.TrialState.COMPLETE] * trials
    assert len({tuple(sorted(t.params.items())) for t in done}) == trials
