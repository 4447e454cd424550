"""One driver per study, through the real CLI: while ``study run`` holds a study, a second
``study run`` of it is refused (exit 2, one line naming the holder's pid and host, nothing
written); after the holder is SIGKILLed the lock is gone with it and the study finishes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
from raycluster import Proc, family, send, still_alive
from tests_support import TINY_STUDY

from study.lock import LOCK_FILE
from trainables.results import committed, table_dir

SEEDS = 4
CONFIG = {
    **TINY_STUDY,
    "name": "locked",
    "task": {**TINY_STUDY["task"], "train_size": 3000},
    "train": {**TINY_STUDY["train"], "max_epochs": 3, "selection": {"early_stop": False}},
    "seeds": {"count": SEEDS, "root": 5},
    "execution": {"bundle_size": 1, "report_every_s": 0.5},
}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "VIRTUAL_ENV", "PYTHONPATH")}
    return env | {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "RAY_USAGE_STATS_ENABLED": "0"}


def _study(cfg: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "study.cli", "run", str(cfg), "--out", str(out), "--num-cpus", "1"]


def _holder_pid(lock: Path) -> int | None:
    try:
        return int(json.loads(lock.read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


@pytest.mark.slow  # ~48 s: a study held, a second driver, a SIGKILL
def test_second_driver_refused_and_lock_released_by_sigkill(tmp_path: Path) -> None:
    cfg = tmp_path / "locked.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    out = tmp_path / "results"
    lock = out / "locked" / LOCK_FILE
    first = subprocess.Popen(_study(cfg, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=_env(), cwd=tmp_path, start_new_session=True)
    seen: dict[int, Proc] = {}
    try:
        deadline = time.monotonic() + 120
        while _holder_pid(lock) != first.pid:
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first driver never took the lock"
            time.sleep(0.1)
        manifest = out / "locked" / "study.json"
        while not manifest.exists():
            assert time.monotonic() < deadline, "the first driver never wrote its manifest"
            time.sleep(0.1)
        manifest_before = manifest.read_bytes()
        second = subprocess.run(_study(cfg, out), capture_output=True, text=True, env=_env(),
                                cwd=tmp_path, timeout=120)
        seen.update(family(first.pid))
        assert first.poll() is None, "the first driver ended before the check"
        assert second.returncode == 2, (second.returncode, second.stderr)
        lines = [ln for ln in second.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), second.stderr
        assert f"pid {first.pid} on {socket.gethostname()}" in lines[0], lines[0]
        assert "Fix:" in lines[0]
        assert manifest.read_bytes() == manifest_before  # the refused driver wrote nothing
        seen.update(family(first.pid))
        send(seen.values(), signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            send(family(first.pid).values(), signal.SIGKILL)
            first.wait(timeout=30)
    assert first.returncode == -signal.SIGKILL
    time.sleep(1)
    assert not still_alive(seen.values())
    again = subprocess.run(_study(cfg, out), capture_output=True, text=True, env=_env(),
                           cwd=tmp_path, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(committed(out, "locked")) == SEEDS
    rows = [r for p in table_dir(out, "runs", "locked").glob("*.parquet")
            for r in pq.read_table(p, columns=["trial_id", "seed"]).to_pylist()]
    assert len(rows) == len({(r["trial_id"], r["seed"]) for r in rows}) == SEEDS
    assert lock.read_text() == ""  # released: the holder's details are cleared


def test_a_refused_command_leaves_the_lock_files_time_as_it_was(tmp_path: Path) -> None:
    """A command refused under the lock (exit 2: a changed config, an unknown split for
    `study eval`) changes nothing in OUT, the lock file's modification time included; a
    command that ran, or failed (exit 1), leaves its own time."""
    from study.lock import study_lock
    from trainables.errors import ConfigError, StudyIncomplete

    (tmp_path / "s").mkdir()
    lock = tmp_path / "s" / LOCK_FILE
    lock.touch()
    os.utime(lock, (1_600_000_000, 1_600_000_000))
    with pytest.raises(ConfigError), study_lock(tmp_path, "s"):
        raise ConfigError("--split", "no split 'nosuch'", "name a split of the study")
    assert lock.stat().st_mtime == 1_600_000_000 and lock.read_bytes() == b""
    with pytest.raises(StudyIncomplete), study_lock(tmp_path, "s"):
        raise StudyIncomplete("runs failed", exit_code=1)
    assert lock.stat().st_mtime > 1_600_000_000


def test_a_refused_brand_new_study_leaves_no_folder_behind(tmp_path: Path) -> None:
    """A brand-new study refused under its lock (exit 2) removes the lock file and the folders
    the command created (OUT included), but never a folder that holds anything else."""
    from study.lock import study_lock
    from trainables.errors import ConfigError

    out = tmp_path / "new" / "results"
    with pytest.raises(ConfigError), study_lock(out, "s"):
        raise ConfigError("--address", "the cluster refused the token", "give the cluster's token")
    assert not (tmp_path / "new").exists()
    with pytest.raises(ConfigError), study_lock(out, "s") as lock:
        (lock.parent / "keep.txt").write_text("written before the refusal")
        raise ConfigError("--address", "refused", "fix it")
    assert sorted(p.name for p in (out / "s").iterdir()) == ["keep.txt"]


def test_status_says_a_driver_runs_now_or_was_killed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Probes D and G: during a run, and after a SIGKILLed one, `study status` showed an older
    run's "last run ... stopped early" line and nothing else. Now it names the running
    driver (the lock's holder), or the killed one (its details left in the lock file, which
    every other ending clears), with the fix."""
    from analysis.demo import write_demo_study
    from study.cli import cli_main
    from study.lock import study_lock
    from study.status import driver_lines

    out = tmp_path / "results"
    write_demo_study(out, "demo", n_seeds=2)
    assert driver_lines(out, "demo") == []
    with study_lock(out, "demo"):
        (line,) = driver_lines(out, "demo")
        assert line.startswith(f"running now: pid {os.getpid()} on ") and line.endswith(")"), line
    assert driver_lines(out, "demo") == []  # ended normally: nothing to say
    (out / "demo" / LOCK_FILE).write_text(json.dumps(
        {"pid": 4242, "host": "node-7", "started": 1_764_000_000, "command": "study run s.yaml"}))
    capsys.readouterr()
    assert cli_main(["status", "demo", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "last run: pid 4242 on node-7 (since " in text and "study run s.yaml) did not end: its driver was killed" in text
    assert f"Fix: study resume demo --out {out}" in text, text
