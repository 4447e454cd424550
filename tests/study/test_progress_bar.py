"""Progress on a terminal: the live bar keeps its seed counts, its clock and its ETA on an
80-column terminal, the ETA is known once a seed has committed (however far apart seeds
commit), failed seeds stay shown, and the end leaves nothing stale.

The fast tests drive the real callback (:class:`study.progress.ProgressCallback`) with Ray
Tune's own ``Trial`` objects and render the real bar (:func:`study.progress.progress_bar`)
into a rich console of a given width; the slow one runs a study under a pseudo-terminal."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from ray.tune.experiment import Trial
from rich.console import Console
from tests_support import TOY_STUDY

from study.progress import ProgressCallback, progress_bar


def _bar(width: int = 80) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=width, force_terminal=True, color_system=None), buf


def _render(console: Console, buf: io.StringIO, callback: ProgressCallback) -> str:
    assert callback.progress is not None
    buf.seek(0)
    buf.truncate()
    console.print(callback.progress.make_tasks_table(callback.progress.tasks))
    return buf.getvalue().rstrip("\n")


RUNNING = {"at": "epoch 12", "active": 7, "sel_metric": "val accuracy",
           "sel_values": [0.9731, 0.9123, 0.9871, 0.95, 0.96, 0.97, 0.98]}


def test_an_80_column_bar_keeps_counts_clock_and_eta_while_bundles_run() -> None:
    console, buf = _bar(80)
    cb = ProgressCallback("study quickstart: seeds", 50, 7, [7] * 7, [""] * 7, progress=progress_bar(console))
    trial = Trial("fineline", config={"unit_index": 0}, stub=True)
    cb.on_trial_result(1, [trial], trial, RUNNING)
    line = _render(console, buf, cb)
    assert len(line) <= 80, line
    assert "7/50" in line and re.search(r"\d:\d\d:\d\d eta -:--:--$", line), line
    assert "7 running" in line, line  # the info shows, shortened if need be
    wide, wbuf = _bar(200)
    assert "val accuracy 0.97 [0.9123, 0.9871]" in _render(wide, wbuf, cb)


def test_eta_is_known_after_the_first_commit_even_minutes_apart() -> None:
    """Seeds 2 minutes apart: the ETA is the mean time per seed times the seeds left (rich's
    own estimate, over the last 30 s only, showed -:--:-- for the whole study)."""
    console, buf = _bar(120)
    cb = ProgressCallback("study s: seeds", 4, 0, [1] * 4, [""] * 4, progress=progress_bar(console))
    cb.started -= 120.0  # the first seed took two minutes
    trial = Trial("fineline", config={"unit_index": 0}, stub=True)
    assert cb.eta() == "-:--:--"
    cb.on_trial_result(1, [trial], trial, {"committed_seeds": [
        {"seed": 0, "status": "ok", "selected": "epoch 3", "value": 0.5}]})
    left = cb.eta()
    assert left in ("0:05:59", "0:06:00"), left
    assert re.search(r"1/4 .*eta 0:0(5:59|6:00)$", _render(console, buf, cb))
    # it counts down between commits
    assert cb.eta(time.monotonic() + 60) in ("0:04:59", "0:05:00")
    assert cb.eta(time.monotonic() + 3600) == "0:00:00"


def test_failed_seeds_stay_on_the_bar_when_nothing_runs() -> None:
    console, buf = _bar(120)
    cb = ProgressCallback("study s: seeds", 4, 0, [2, 2], ["", ""], progress=progress_bar(console))
    trial = Trial("fineline", config={"unit_index": 1}, stub=True)
    cb.on_trial_result(1, [trial], trial, RUNNING)
    cb.on_trial_error(2, [trial], trial)
    line = _render(console, buf, cb)
    assert "0/4" in line and "2 failed" in line and "running" not in line, line
    # the other bundle commits: nothing is left, so the ETA is 0, not a stale estimate
    other = Trial("fineline", config={"unit_index": 0}, stub=True)
    cb.started -= 120.0  # its two seeds took two minutes
    cb.on_trial_result(3, [other], other, {"committed_seeds": [
        {"seed": s, "status": "ok", "selected": "epoch 3", "value": 0.5} for s in (0, 1)]})
    assert cb.eta() == "0:00:00"
    assert re.search(r"2/4 2 failed .*eta 0:00:00$", _render(console, buf, cb))


def test_a_stopped_study_leaves_no_running_bundle_on_the_bar() -> None:
    """SIGINT mid-bundle: Tune reports no completion for the stopped trial, so the last frame
    showed "1 running, step 17..." and a countdown; it shows the counts only."""
    console, buf = _bar(120)
    cb = ProgressCallback("study s: seeds", 4, 0, [1] * 4, [""] * 4, progress=progress_bar(console))
    cb.started -= 60.0
    first, second = (Trial("fineline", config={"unit_index": i}, stub=True) for i in (0, 1))
    cb.on_trial_result(1, [first], first, {"committed_seeds": [
        {"seed": 0, "status": "ok", "selected": "epoch 3", "value": 0.5}]})
    cb.on_trial_result(2, [second], second, RUNNING)
    assert "7 running" in _render(console, buf, cb)
    cb.finish()
    line = _render(console, buf, cb)
    assert "running" not in line and "val accuracy" not in line, line
    assert re.search(r"1/4 +\d:\d\d:\d\d eta -:--:--$", line), line


def test_a_heartbeat_says_where_the_running_bundles_last_round_went() -> None:
    """Training steps vs evaluation of the last round, the median over the bundles running
    (what says whether a slow study waits on its steps or on its evaluations); a bundle that
    has not reported a round yet adds nothing, and a committed one leaves the median."""
    lines: list[str] = []
    cb = ProgressCallback("study t", 9, 0, [3, 3, 3], ["", "", ""], emit=lines.append, every_s=0.0)
    trials = [Trial("fineline", config={"unit_index": i}, stub=True) for i in range(3)]
    cb.on_trial_result(1, trials, trials[0], {**RUNNING, "round_s": [1.0, 3.0]})
    assert lines[-1].endswith("val accuracy 0.97 [0.9123, 0.9871], last round: train 1 s + eval 3 s (0:00:00)"), lines
    cb.on_trial_result(1, trials, trials[1], {**RUNNING, "round_s": [3.0, 95.0]})
    cb.on_trial_result(1, trials, trials[2], RUNNING)  # no round timed (a result from before it was kept)
    assert "last round: train 2 s + eval 49 s (0:00:00)" in lines[-1], lines[-1]
    cb.on_trial_result(1, trials, trials[1], {**RUNNING, "round_s": [30.0, 125.0], "committed_seeds": [
        {"seed": s, "status": "ok", "selected": "epoch 1", "value": 0.9} for s in range(3)]})
    cb.on_step_end(1, trials)
    assert lines[-1].split(", last round: ")[1].startswith("train 1 s + eval 3 s"), lines[-1]
    cb.on_trial_result(1, trials, trials[0], {**RUNNING, "round_s": [0.123, 200.0]})
    assert "last round: train 0.12 s + eval 3 min 20 s" in lines[-1], lines[-1]


def test_a_failed_trial_line_in_a_log_names_its_grid_point() -> None:
    lines: list[str] = []
    cb = ProgressCallback("study g", 6, 0, [3, 3], ["model.width=32", "model.width=33"], emit=lines.append)
    trial = Trial("fineline", config={"unit_index": 1}, stub=True)
    cb.on_trial_error(1, [trial], trial)  # a stub trial: Tune wrote no error file beside it
    assert lines == ["study g: a trial of 3 seed(s) (model.width=33) failed after 2 retries: "
                     "the error is in Ray's log above"]
    assert cb.failures == {1: "the error is in Ray's log above"} and cb.failed == 3
    once = ProgressCallback("study g", 6, 0, [3, 3], ["", ""], emit=lines.append, retries=0)
    once.on_trial_error(1, [trial], trial)  # execution.max_failures: 0 (it said "after its retries")
    assert lines[-1] == "study g: a trial of 3 seed(s) failed (no retries): the error is in Ray's log above"


def test_a_refused_unit_fails_at_its_one_result_and_a_shared_cause_is_said_once() -> None:
    """A worker's refusal of a unit's config (its one result, ``REFUSED``) fails the unit's
    seeds at once; a second unit refused alike says so instead of the text again."""
    from trainables.errors import REFUSED

    lines: list[str] = []
    cb = ProgressCallback("study g", 7, 0, [3, 3, 1], ["b=1", "b=2", "b=3"], emit=lines.append)
    first, second = (Trial("fineline", config={"unit_index": i}, stub=True) for i in (0, 2))
    cb.on_trial_result(1, [first], first, {REFUSED: "train.batch_size: 9 is larger. Fix: less", "done": True})
    cb.on_trial_result(2, [second], second, {REFUSED: "train.batch_size: 9 is larger. Fix: less", "done": True})
    cb.on_trial_complete(3, [second], second)
    assert lines == [
        "study g: a trial of 3 seed(s) (b=1) failed (its config was refused, not retried): "
        "train.batch_size: 9 is larger. Fix: less",
        "study g: a trial of 1 seed(s) (b=3) failed (its config was refused, not retried): the same cause as above",
    ]
    assert cb.failed_units == [0, 2] and cb.failed == 4 and not cb.running


STUDY = {
    **TOY_STUDY,
    "name": "barred",
    "train": {**TOY_STUDY["train"], "max_steps": 3000, "eval_every_steps": 200},
    "execution": {"bundle_size": 1, "report_every_s": 0.3},
}


@pytest.mark.slow  # ~25 s: a real study under a pseudo-terminal
def test_a_study_on_an_80_column_terminal_shows_counts_running_and_eta(tmp_path: Path) -> None:
    cfg = tmp_path / "barred.yaml"
    cfg.write_text(yaml.safe_dump(STUDY))
    env = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "PATH", "VIRTUAL_ENV", "PYTHONPATH")}
    env |= {"RAY_USAGE_STATS_ENABLED": "0", "COLUMNS": "80", "LINES": "24", "TERM": "xterm"}
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "study.cli", "run", str(cfg), "--out", str(tmp_path / "r"), "--num-cpus", "1"],
        stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True,
    )
    os.close(follower)
    raw = b""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            raw += chunk
        elif proc.poll() is not None:
            break
    os.close(leader)
    assert proc.wait(timeout=60) == 0, raw.decode(errors="replace")[-3000:]
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw.decode(errors="replace"))
    frames = [f.strip() for f in re.split(r"[\r\n]", text) if "study barred: seeds" in f]
    running = [f for f in frames if "running" in f]
    assert running, text[-3000:]
    assert all(re.search(r" [012]/2 ", f) and re.search(r"eta (-:--:--|\d:\d\d:\d\d)$", f) for f in running), running
    assert any(re.search(r" 1/2 .*eta \d:\d\d:\d\d$", f) for f in running), running  # an ETA after seed 0
    assert re.search(r" 2/2 +\d:\d\d:\d\d eta 0:00:00$", frames[-1]), frames[-1]  # nothing stale


def test_the_first_eta_counts_the_seeds_running_at_once() -> None:
    """Probe G: two bundles of three running at once, the first seed committed after 60 s:
    the ETA was 60 s x 11 seeds left = 11 min, while the 12 seeds train in two waves of six
    (about 1 min more). The time per seed is now taken over at least one wave."""
    cb = ProgressCallback("study s: seeds", 12, 0, [3] * 4, [""] * 4)
    cb.started -= 60.0
    a, b = (Trial("fineline", config={"unit_index": i}, stub=True) for i in (0, 1))
    for t in (a, b):
        cb.on_trial_result(1, [a, b], t, {"at": "epoch 5", "active": 3, "sel_values": [0.5] * 3})
    assert cb.wave == 6
    cb.on_trial_result(2, [a, b], a, {"committed_seeds": [
        {"seed": 0, "status": "ok", "selected": "epoch 3", "value": 0.5}]})
    assert cb.eta() in ("0:01:49", "0:01:50")  # 60 s / 6 per seed x 11 left
