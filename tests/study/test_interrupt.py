"""An interrupted ``study run`` through the real CLI: SIGINT (or SIGTERM) in the middle of a
study exits non-zero with the committed / failed / pending counts read from Parquet and the
command that finishes it, without a C++ stack dump, and leaves no Ray process behind (only
the processes this test started are looked at, by pid and start time)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
from raycluster import Proc, family, send, still_alive

from trainables.results import committed

SEEDS = 6
CONFIG = {
    "name": "stopme",
    "task": {"name": "symbol_rewriting", "n_symbols": 12, "train_size": 3000, "val_size": 40,
             "val_ood_size": 40, "test_size": 40, "train_lengths": [2, 4], "val_ood_lengths": [2, 5],
             "repeat_lengths": [3, 5], "short_lengths": [1, 2], "long_lengths": [5, 6]},
    "model": {"name": "seq2seq", "emb_size": 8, "hidden_size": 8},
    "train": {"optimizer": "sgd", "lr": 0.125, "clip_norm": 5.0, "batch_size": 16, "max_epochs": 6,
              "selection": {"early_stop": False}},  # 6 epochs: at 3 a loaded machine committed all 6 seeds
    "seeds": {"count": SEEDS},                          # between the first commit and the signal
    "execution": {"bundle_size": 1, "report_every_s": 0.5},
}


def study_env() -> dict[str, str]:
    """A `study` subprocess's environment: this Python's, no usage stats."""
    env = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "VIRTUAL_ENV", "PYTHONPATH")}
    return env | {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "RAY_USAGE_STATS_ENABLED": "0"}


def first_commit_of(
    tmp_path: Path, config: dict[str, Any], command: str = "run"
) -> tuple[subprocess.Popen[str], Path, dict[int, Proc]]:
    """``study COMMAND`` of ``config`` on a local Ray of one CPU, in a session of its own,
    returned once its first seed has committed: (the driver, OUT, every process of its
    family seen so far, by pid)."""
    cfg = tmp_path / f"{config['name']}.yaml"
    cfg.write_text(yaml.safe_dump(config))
    out = tmp_path / "results"
    proc = subprocess.Popen(
        [sys.executable, "-m", "study.cli", command, str(cfg), "--out", str(out), "--num-cpus", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=study_env(), cwd=tmp_path,
        start_new_session=True,
    )
    seen: dict[int, Proc] = {}
    try:
        deadline = time.monotonic() + 240
        while not committed(out, config["name"]):
            seen.update(family(proc.pid))
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no seed was committed in time"
            time.sleep(0.2)
        seen.update(family(proc.pid))
    except BaseException:
        send(family(proc.pid).values(), signal.SIGKILL)
        proc.wait(timeout=30)
        raise
    return proc, out, seen


@pytest.mark.parametrize(
    ("sig", "to_group"),
    [
        pytest.param(signal.SIGINT, False, id="SIGINT"),
        # SIGTERM to the driver alone takes the same path as SIGINT (one handler); ~16 s, so
        # it runs with -m slow
        pytest.param(signal.SIGTERM, False, id="SIGTERM", marks=pytest.mark.slow),
        # what `timeout`, Slurm and systemd send: SIGTERM to every process of the job, Ray's
        # included (before the shield, the GCS died at once: a 60 s wait, exit 1, no counts)
        pytest.param(signal.SIGTERM, True, id="SIGTERM-to-the-group", marks=pytest.mark.slow),  # SIGINT stays in the default run
        # a closed terminal or SSH session: SIGHUP to the foreground group (was exit 129 with
        # no message and no record for `study status`); same path as SIGTERM, so -m slow
        pytest.param(signal.SIGHUP, True, id="SIGHUP-to-the-group", marks=pytest.mark.slow),
    ],
)
def test_a_stopped_study_exits_nonzero_with_committed_counts_and_leaves_no_ray(
    tmp_path: Path, sig: signal.Signals, to_group: bool
) -> None:
    proc, out, seen = first_commit_of(tmp_path, CONFIG)
    try:
        if to_group:  # the test's own session: the driver and the processes Ray started
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            send(family(proc.pid).values(), signal.SIGKILL)
            proc.wait(timeout=30)
    done = len(committed(out, "stopme"))
    assert 0 < done < SEEDS, f"{done} committed: the signal came too late"
    assert proc.returncode == 128 + sig, (proc.returncode, stderr)
    last = [ln for ln in stderr.splitlines() if ln.strip()][-1]
    match = re.search(r"(\d+)/(\d+) runs committed, (\d+) failed, (\d+) pending", last)
    assert match, stderr
    assert (int(match[1]), int(match[2]), int(match[3]), int(match[4])) == (done, SEEDS, 0, SEEDS - done)
    assert f"interrupted by {sig.name}" in last and f"study resume stopme --out {out}" in last
    assert "Traceback" not in stderr and "*** " not in stderr and "PC: @" not in stderr, stderr
    assert "runs committed" not in stdout
    time.sleep(1)
    left = still_alive(seen.values())
    assert not left, [p.cmd for p in left]


def test_the_first_signals_note_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """The note of a first SIGINT while Tune runs ("stopping the study ...; send it again to
    stop at once") is one line on a log or a narrow terminal, not wrapped mid-sentence."""
    from study.runner import StopSignals

    stopped: list[int] = []
    before = signal.signal(signal.SIGUSR1, lambda signum, frame: stopped.append(signum))  # Tune's graceful stop
    try:
        stops = StopSignals()
        stops.tune_running = True
        capsys.readouterr()
        stops.handle(signal.SIGINT, None)
    finally:
        signal.signal(signal.SIGUSR1, before)
    err = capsys.readouterr().err
    assert stopped == [signal.SIGUSR1] and stops.exit_code == 130
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].endswith("send it again to stop at once"), err


def test_ctrl_c_while_the_cli_is_still_importing_exits_130_with_one_line(tmp_path: Path) -> None:
    """A Ctrl-C in the first ~0.1 s lands in an import. The console script's entry point
    (``study.__main__:main``) catches it there: exit 130 and one line, no traceback. The
    interrupt is raised by an import hook at the import of ``study.cli``, exactly where a
    real SIGINT would surface."""
    hook = (
        "import sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'study.cli':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "sys.argv = ['study', 'ls']\n"
        "from study.__main__ import main\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", hook], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 130, done
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: interrupted before the command started; nothing ran. Fix: re-run the same command"]
    assert not (tmp_path / "results").exists()


def test_the_console_script_runs_the_cli_through_the_interrupt_safe_entry_point() -> None:
    from importlib.metadata import entry_points

    (script,) = [ep for ep in entry_points(group="console_scripts") if ep.name == "study"]
    assert script.value == "study.__main__:main"
    done = subprocess.run([sys.executable, "-m", "study", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "Commands" in done.stdout, done


def test_sighup_ignored_by_nohup_stays_ignored() -> None:
    """`nohup study run ...` ignores SIGHUP so the study outlives its terminal: the driver's
    handler must not take that back (SIGINT and SIGTERM are still handled)."""
    from study.runner import StopSignals

    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        stops = StopSignals()
        stops.install()
        try:
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) == stops.handle
        finally:
            stops.restore()
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        stops = StopSignals()
        stops.install()
        try:
            assert signal.getsignal(signal.SIGHUP) == stops.handle  # a terminal's hang-up stops it cleanly
        finally:
            stops.restore()
    finally:
        signal.signal(signal.SIGHUP, before)
