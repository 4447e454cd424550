"""Progress in a log: a study run with its output going to a file (not a terminal) prints a
line when Ray has started, one line per committed seed, heartbeats, and a last line with the
next commands; nothing of the terminal bar."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests_support import TINY_STUDY, TOY_STUDY

STUDY = {
    **TOY_STUDY,
    "name": "logged",
    "grid": {"train.lr": [0.01, 0.003]},
    "execution": {"bundle_size": 2, "progress_every_s": 0.2, "report_every_s": 0.1},
}


def test_a_study_logged_to_a_file_prints_ray_start_each_seed_heartbeats_and_next_steps(tmp_path: Path) -> None:
    cfg = tmp_path / "logged.yaml"
    cfg.write_text(yaml.safe_dump(STUDY))
    out, log = tmp_path / "results", tmp_path / "study.log"
    env = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "PATH", "VIRTUAL_ENV")}
    with log.open("w") as fh:  # a file: not a terminal
        rc = subprocess.run(
            [sys.executable, "-m", "study.cli", "run", str(cfg), "--out", str(out), "--num-cpus", "2"],
            stdout=fh, stderr=subprocess.STDOUT, env={**env, "RAY_USAGE_STATS_ENABLED": "0"}, timeout=300,
        ).returncode
    text = log.read_text()
    assert rc == 0, text[-3000:]
    lines = text.splitlines()
    started = [i for i, ln in enumerate(lines) if re.match(r"study logged: Ray started \(2 CPUs, 0 GPUs\); 4 runs planned", ln)]
    seeds = [ln for ln in lines if re.match(r"study logged: seed [01] \(train\.lr=0\.0(1|03)\) committed: ok, selected step \d+, train_eval accuracy [0-9.]+ \([1-4]/4 seeds, eta \d:\d\d:\d\d\)$", ln)]
    assert len(started) == 1, text
    assert len(seeds) == 4, text
    assert len({(ln.split(" (")[0], ln.split("(")[1].split(")")[0]) for ln in seeds}) == 4, "each seed once"
    assert [ln.rsplit("(", 1)[1].split()[0] for ln in seeds] == ["1/4", "2/4", "3/4", "4/4"], "a running count"
    assert seeds[-1].endswith("eta 0:00:00)"), seeds
    beats = [ln for ln in lines if re.match(r"study logged: \d/4 seeds committed.*\(\d+:\d\d:\d\d\)$", ln)]
    assert beats, f"no heartbeat line in:\n{text}"
    timed = [ln for ln in beats if re.search(r", last round: train [0-9.]+ s \+ eval [0-9.]+ s \(", ln)]
    assert timed, f"no heartbeat says where the rounds' time went:\n{text}"
    assert lines[-1].startswith("study logged: 4/4 runs committed") and "Next: study analyze logged" in lines[-1]
    assert "study report logged" in lines[-1] and "SELECT ..." not in lines[-1], "next commands, no placeholder"
    assert "━" not in text and "\x1b[" not in text, "no terminal bar or escape codes in a log"
    # `study resume` ends the same way (it printed only "4/4 runs committed")
    res = subprocess.run([sys.executable, "-m", "study.cli", "resume", "logged", "--out", str(out)],
                         capture_output=True, text=True, env={**env, "RAY_USAGE_STATS_ENABLED": "0"}, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    last = res.stdout.strip().splitlines()[-1]
    assert last.startswith("study logged: 4/4 runs committed (0 run now)"), last
    assert f"Next: study analyze logged --out {out}; study report logged --out {out}" in last, last


@pytest.mark.slow  # ~15 s: waits for heartbeats
def test_heartbeats_keep_coming_while_a_bundle_reports_rarely(tmp_path: Path) -> None:
    """A bundle whose results come rarely (a long round, or a large report_every_s) still
    gets heartbeat lines by the clock, before its first seed commits."""
    slow = {**STUDY, "name": "quiet", "grid": {}, "seeds": {"count": 1},
            "train": {**STUDY["train"], "max_steps": 1500, "eval_every_steps": 1500},
            "execution": {"bundle_size": 1, "progress_every_s": 0.3, "report_every_s": 600}}
    del slow["grid"]
    cfg = tmp_path / "quiet.yaml"
    cfg.write_text(yaml.safe_dump(slow))
    out, log = tmp_path / "results", tmp_path / "study.log"
    env = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "PATH", "VIRTUAL_ENV")}
    with log.open("w") as fh:
        rc = subprocess.run(
            [sys.executable, "-m", "study.cli", "run", str(cfg), "--out", str(out), "--num-cpus", "1"],
            stdout=fh, stderr=subprocess.STDOUT, env={**env, "RAY_USAGE_STATS_ENABLED": "0"}, timeout=300,
        ).returncode
    lines = log.read_text().splitlines()
    assert rc == 0, lines[-20:]
    first_commit = next(i for i, ln in enumerate(lines) if "committed: ok" in ln)
    beats = [ln for ln in lines[:first_commit] if re.match(r"study quiet: 0/1 seeds committed.*\(\d+:\d\d:\d\d\)$", ln)]
    assert len(beats) >= 2, "\n".join(lines)


@pytest.mark.slow  # 15-20 s of subprocess study; CI's default run keeps under 15 minutes
def test_a_config_the_worker_refuses_fails_once_without_retries_or_tracebacks(tmp_path: Path) -> None:
    """A ConfigError raised in a trial's setup (here: a batch larger than the training split
    of a plugin task the driver does not build before Ray, ``rehearsable()`` False: only its
    worker knows the split's size) ends that unit at once. Before, Tune retried it
    ``execution.max_failures`` times and printed each worker's traceback (269 lines for 2
    units); now each unit's line and one summary line per cause say it, the other grid point
    trains and commits, and the study exits 1 saying to correct the config (resuming would
    rerun the refused one)."""
    from tests.study.test_plugins_cli import BASE, unbuilt_plugin

    home = tmp_path / "home"
    home.mkdir()
    unbuilt_plugin(home)
    study = {**BASE, "name": "refused", "task": {"name": "unbuilt", "n": 64}, "grid": {"train.batch_size": [16, 1000]},
             "seeds": {"count": 2}, "execution": {"bundle_size": 2, "max_failures": 2}}
    cfg = home / "refused.yaml"
    cfg.write_text(yaml.safe_dump(study))
    out = tmp_path / "results"
    env = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "PATH", "VIRTUAL_ENV")}
    res = subprocess.run(
        [sys.executable, "-m", "study.cli", "run", str(cfg), "--out", str(out), "--num-cpus", "2"],
        capture_output=True, text=True, env={**env, "RAY_USAGE_STATS_ENABLED": "0"}, timeout=300, cwd=tmp_path,
    )
    text = res.stdout + res.stderr
    assert res.returncode == 1, text[-3000:]
    assert "Traceback" not in text and "Trial task failed" not in text, text[-3000:]
    cause = ("train.batch_size: 1000 is larger than the training split (64 examples): a batch would hold "
             "some examples twice. Fix: set train.batch_size to at most 64")
    lines = text.splitlines()
    unit = [ln for ln in lines if ln.startswith("study refused: a trial of 2 seed(s) (train.batch_size=1000) "
                                                "failed (its config was refused, not retried): " + cause)]
    summary = [ln for ln in lines if ln.startswith(f"unit failed (train.batch_size=1000): {cause}")]
    assert len(unit) == 1 and len(summary) == 1, text
    assert len([ln for ln in lines if "(train.batch_size=16) committed: ok" in ln]) == 2, text
    assert "error: study refused: 2/4 runs committed, 2 failed, 0 pending (1 trial(s) refused" in text, text
    # resuming would rerun the refused config: the fix is a corrected config under a new name
    assert f"run it under a new name (`study run CONFIG --name NEW --out {out}`)" in text, text
    assert "study resume" not in text.split("error: ")[-1], text
    # `study status` says it after the log is gone: 2 failed seeds of that point and why
    status = subprocess.run([sys.executable, "-m", "study.cli", "status", "refused", "--out", str(out)],
                            capture_output=True, text=True, env=env, timeout=120)
    assert status.returncode == 0, status.stderr
    rows = {ln.split()[0]: ln.split() for ln in status.stdout.splitlines() if ln.startswith("batch_size=")}
    assert rows["batch_size=1000"][-2:] == ["2", "0"] and rows["batch_size=16"][-2:] == ["0", "0"], status.stdout
    last = status.stdout.strip().splitlines()[-1]  # no "then: ... resume" line: resuming refuses it again
    assert re.match(rf"last run \(ended [0-9-]+ [0-9:]+ UTC\): 2 seed\(s\) failed \(batch_size=1000: seeds 0, 1\): "
                    rf"{re.escape(cause)}", last), last


def test_a_batch_larger_than_a_built_in_tasks_training_split_is_refused_before_ray(tmp_path: Path) -> None:
    """The driver knows a built-in task's split sizes (it builds the data before Ray): the
    batch is refused there, naming the grid point, exit 2 and nothing written (before: the
    worker refused it after Ray had started, and the study's name was used up)."""
    study = {**TINY_STUDY, "name": "big", "grid": {"train.batch_size": [16, 1000]}}
    cfg = tmp_path / "big.yaml"
    cfg.write_text(yaml.safe_dump(study))
    out = tmp_path / "results"
    env = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "PATH", "VIRTUAL_ENV")}
    res = subprocess.run([sys.executable, "-m", "study.cli", "run", str(cfg), "--out", str(out)],
                         capture_output=True, text=True, env={**env, "RAY_USAGE_STATS_ENABLED": "0"}, timeout=300)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0] == ("error: train.batch_size: 1000 is larger than the training split (300 examples): a batch "
                        "would hold some examples twice (grid point {'train.batch_size': 1000}). Fix: set "
                        "train.batch_size to at most 300 (300 is full batch), or train.data_order: with_replacement")
    assert not out.exists() and "Ray" not in res.stdout


def test_the_last_runs_record_names_failures_until_their_seeds_commit_and_goes_when_nothing_is_left(
    tmp_path: Path,
) -> None:
    """``study.status.record_last_run`` / ``last_run_lines``: one line per cause with the
    seeds still uncommitted; a seed committed since (a resume) is no longer counted; a run
    that ends with no failure and no early stop removes the record."""
    from study.status import LAST_RUN, committed_runs, last_run_lines, record_last_run
    from trainables.results import write_rows

    (tmp_path / "s").mkdir()
    boom = "RuntimeError: boom"
    record_last_run(tmp_path, "s", [
        {"trial_id": "a", "point": "{}", "seeds": [0, 1], "error": boom},
        {"trial_id": "b", "point": "{}", "seeds": [2], "error": boom},
        {"trial_id": "c", "point": "{}", "seeds": [0], "error": "other. Fix: x"},
    ], "interrupted by SIGINT")
    labels = {"a": "lr=0.1", "b": "lr=0.2", "c": ""}
    lines = last_run_lines(tmp_path, "s", labels, committed_runs(tmp_path, "s"))
    assert [ln.split(": ", 1)[1] for ln in lines] == [
        f"3 seed(s) failed (lr=0.1: seeds 0, 1; lr=0.2: seed 2): {boom}", "1 seed(s) failed (seed 0): other. Fix: x",
        f"fix the cause and `study resume s --out {tmp_path}` runs them again; or `study resume s --out {tmp_path} "
        "--skip-failed` records them as failed runs (not run again)", "interrupted by SIGINT"]
    write_rows(tmp_path, "s", "runs", "a-1", [{"study": "s", "trial_id": "a", "seed": 1, "status": "ok"}])
    assert last_run_lines(tmp_path, "s", labels, committed_runs(tmp_path, "s"))[0].endswith(
        f"2 seed(s) failed (lr=0.1: seed 0; lr=0.2: seed 2): {boom}")
    record_last_run(tmp_path, "s", [], None)
    assert not (tmp_path / "s" / LAST_RUN).exists() and last_run_lines(tmp_path, "s", labels, {}) == []


def test_a_tuning_searchs_lines_name_its_progress_its_best_candidate_and_the_last_runs_causes(tmp_path: Path) -> None:
    """``study.status.tuning_lines`` on candidate rows worked out by hand: the best is the
    largest objective when maximising, the smallest when minimising; pruned candidates count
    as finished; the last run's recorded causes follow."""
    from study.status import record_last_run, tuning_lines

    def row(n: int, state: str, objective: float | None) -> dict[str, object]:
        return {"candidate": n, "state": state, "objective": objective}

    rows = [row(0, "complete", 0.5), row(1, "pruned", None), row(2, "complete", 0.9), row(3, "failed", None),
            row(4, "running", None)]
    labels = {0: "lr=0.1", 2: "lr=0.3"}
    (tmp_path / "t").mkdir()
    m = {"tune_trials": 8, "objective": {"split": "val_ood", "metric": "accuracy", "direction": "maximize"}}
    assert tuning_lines(tmp_path, "t", rows, m, labels) == [
        "search: 3 of 8 requested candidates finished (2 complete, 1 pruned), 1 failed, 1 running or waiting",
        "best so far: candidate 2 (lr=0.3): val_ood accuracy 0.9 (maximize)",
    ]
    # ties: the smaller spread across seeds, then the trial_id, as `study tune`'s ranking,
    # --from-best and the verdict order them (before: the first maximum in candidate order)
    tied = [{**row(0, "complete", 1.0), "objective_std": 0.0, "trial_id": "feb7"},
            {**row(1, "complete", 1.0), "objective_std": 0.0, "trial_id": "0d59"},
            {**row(2, "complete", 1.0), "objective_std": 0.1, "trial_id": "0000"}]
    assert tuning_lines(tmp_path, "t", tied, m, {})[1].startswith("best so far: candidate 1 ")
    m["objective"]["direction"] = "minimize"
    record_last_run(tmp_path, "t", [{"error": "boom", "line": "candidate failed: boom"}], "interrupted by SIGINT")
    lines = tuning_lines(tmp_path, "t", rows, m, labels)
    assert lines[1] == "best so far: candidate 0 (lr=0.1): val_ood accuracy 0.5 (minimize)"
    assert lines[2].endswith("): candidate failed: boom") and lines[3].endswith("stopped early: interrupted by SIGINT")


def test_a_running_candidate_without_a_driver_is_shown_as_interrupted(tmp_path: Path) -> None:
    """Before: after a driver was stopped (`study stop --now`, a kill), `study status` showed a
    candidate Optuna still holds as RUNNING as "running", with no driver left to run it."""
    import optuna

    from study import manifest
    from study.lock import study_lock
    from study.status import tuning_lines, tuning_status

    (tmp_path / "t").mkdir()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    search = optuna.create_study(study_name="t", storage=manifest.storage_url(tmp_path, "t"))
    trial = search.ask({"train.lr": optuna.distributions.FloatDistribution(0.01, 1.0)})
    trial.set_user_attr("trial_id", "abc")
    trial.set_user_attr("seeds", [0, 1])
    m = {"tune": {"seeds_per_candidate": 2}, "tune_trials": 3}
    rows = tuning_status(tmp_path, "t", m, {})
    assert (rows[0]["state"], rows[0]["pending"]) == ("interrupted", 2)
    line = tuning_lines(tmp_path, "t", rows, m, {})[0]
    assert line.endswith(f"0 running or waiting, 1 interrupted (the driver stopped while they ran; `study resume t "
                         f"--out {tmp_path}` settles them from the committed seeds)"), line
    with study_lock(tmp_path, "t"):  # a driver runs it now
        assert tuning_status(tmp_path, "t", m, {})[0]["state"] == "running"
