"""Load benchmark: a study of 500 tiny trials, end to end through ``study run``.

Each trial is one seed of a tiny symbol-rewriting seq2seq (one epoch on 64 examples,
about 0.1 s of compute), so nearly all of a trial's cost is the platform's: Tune
scheduling with reused actors, the per-step checkpoint, the five atomic Parquet writes
of a commit. The script runs the study on a fresh local Ray (or ``--address``), checks
that every trial committed all its rows (exit status 1 if not), and reports:

* ``wall``: the whole ``study run`` command (imports, Ray start, planning, trials);
* ``span``: first trial start to last trial end (from the ``trials`` table);
* ``busy``: the sum over trials of their own time (setup of the unit to its commit);
* ``overhead per trial`` = (span x concurrent slots - busy) / trials: the slot time a
  trial costs beyond its own work, i.e. what the platform adds per trial at this load.

Wall time depends on what else the machine runs; CPU time much less. So it also reports
**core-seconds per trial**, from the CPU time (user + system) of the whole process tree of
``study run``: the command itself, every Ray process it starts (GCS, raylet, agents, log
monitor, the trial workers) and anything they start. ``getrusage(RUSAGE_CHILDREN)`` cannot
give it: the raylet ignores SIGCHLD (``SigIgn`` in ``/proc/<pid>/status``), so a worker
that exits is reaped by the kernel and its CPU time is added to no one. So the tree is
sampled every 0.2 s (``psutil``): each process's own CPU time, the last
value seen, summed over every process ever seen; what a process spends in its last 0.2 s
is missed (at Ray's shutdown, mostly). On Linux this script makes itself the *subreaper*
of the tree (``prctl(PR_SET_CHILD_SUBREAPER)``), so the workers that outlive the raylet
stay in the tree (and are waited for here) instead of passing to init. The samples also
split the CPU time at the first trial's start and the last trial's end. From it is
subtracted the trials' **own compute**: the same units trained and evaluated in this
process without Ray, Tune, checkpoints or commits (the dataset built once, one unit of
warm-up first), measured with ``time.process_time``:

* ``core-s per trial`` = (tree CPU - own compute) / trials: everything the platform costs,
  Ray's start and stop and the imports of every process included;
* ``core-s per trial, during trials`` = (tree CPU between the first trial's start and the
  last one's end - own compute) / trials: what each further trial adds (Ray's release test
  of 10,000 short trials costs about 0.15 core-seconds per trial).

With ``--address`` only the local processes would be counted, so no CPU figures are given.

    python benchmarks/load_500.py                  # 500 trials on 2 local CPUs
    python benchmarks/load_500.py --trials 40      # a quick look at the per-trial overhead
    python benchmarks/load_500.py --trials 100 --num-cpus 4 --keep /tmp/load
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml

ROOT = Path(__file__).resolve().parents[1]
NAME = "load500"


def tiny_study(trials: int) -> dict[str, Any]:
    """A study of ``trials`` one-seed trials (bundle_size 1: one Tune trial per seed)."""
    return {
        "name": NAME,
        "task": {
            "name": "symbol_rewriting",
            "n_symbols": 12,
            "train_size": 64,
            "val_size": 16,
            "val_ood_size": 16,
            "test_size": 16,
            "train_lengths": [2, 4],
            "val_ood_lengths": [2, 5],
            "repeat_lengths": [3, 5],
            "short_lengths": [1, 2],
            "long_lengths": [5, 6],
        },
        "model": {"name": "seq2seq", "emb_size": 8, "hidden_size": 8},
        "train": {"batch_size": 16, "max_epochs": 1},
        "seeds": {"count": trials, "root": 0},
        "execution": {"bundle_size": 1, "device": "cpu", "cpus_per_trial": 1},
    }


SAMPLE_S = 0.2
"""Seconds between samples of the study's process tree."""
PR_SET_CHILD_SUBREAPER = 36
"""``prctl`` option (Linux >= 3.4): orphaned descendants are re-parented to this process."""


def become_subreaper() -> bool:
    """Make this process the subreaper of what it starts (Linux; False elsewhere or on failure)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class TreeCpu:
    """CPU seconds (user + system) of every process ``root`` starts, by sampling (see the
    module docstring): each process's own CPU time, the latest value seen, summed over every
    process ever seen in the tree. A process's last moments before it exits (under one
    sampling interval) are missed, as is a process that lives less than one interval."""

    def __init__(self, root: subprocess.Popen[str]) -> None:
        import psutil

        self.psutil, self.root, self.me = psutil, root, psutil.Process()
        self.seen: dict[tuple[int, float], float] = {}
        """(pid, start time) -> own CPU seconds of that process, as last seen."""
        self.kinds: dict[tuple[int, float], str] = {}
        """(pid, start time) -> what the process is (:meth:`kind`), as last seen."""
        self.samples: list[tuple[float, float]] = []
        """(time.time(), CPU seconds of the tree so far)."""
        self.stragglers = 0
        """Processes of the tree still running a while after ``root`` exited (then stopped)."""

    def sample(self) -> int:
        """Record the tree's CPU time now; wait for its exited orphans re-parented here (never
        for ``root``: Popen does). Returns how many processes of the tree (``root`` aside) exist."""
        found = 0
        for p in self.me.children(recursive=True):
            try:
                with p.oneshot():
                    t, key = p.cpu_times(), (p.pid, p.create_time())
                    zombie = p.status() == self.psutil.STATUS_ZOMBIE
                    if not zombie and self.kinds.get(key) != "trial actors":
                        self.kinds[key] = self.kind(p)
                self.seen[key] = max(self.seen.get(key, 0.0), t.user + t.system)
                if p.pid == self.root.pid:
                    continue
                found += 1
                if zombie and p.ppid() == self.me.pid:
                    os.waitpid(p.pid, os.WNOHANG)
            except (self.psutil.Error, ChildProcessError):
                pass
        self.samples.append((time.time(), sum(self.seen.values())))
        return found

    def kind(self, p: Any) -> str:
        """``study run``, ``trial actors`` (a Ray worker that ever held a trainable),
        ``ray workers`` (the others), ``raylet``, ``gcs_server``, the name of one of Ray's
        agents and monitors, or of a program they run."""
        if p.pid == self.root.pid:
            return "study run"
        cmd = p.cmdline() or [p.name()]
        if "Trainable" in cmd[0]:  # a worker's title, e.g. ray::ResourceTrainable.train
            parent = p.parent()  # a child it forks has its title until it execs
            if parent is not None and "Trainable" in (parent.cmdline() or [""])[0]:
                return "children of trial actors"
            return "trial actors"
        if cmd[0].startswith("ray::") and not cmd[0].endswith("Agent"):
            return "ray workers"
        if any(c.endswith("default_worker.py") or c.endswith("setup_worker.py") for c in cmd):
            return "ray workers"
        if cmd[0].startswith("ray::"):
            return cmd[0][5:]
        script = next((c for c in cmd[1:] if c.endswith(".py")), cmd[0])
        return Path(script).name

    def by_kind(self) -> dict[str, float]:
        """CPU seconds per kind of process, largest first."""
        sums: dict[str, float] = {}
        for key, cpu in self.seen.items():
            kind = self.kinds.get(key, "other")
            sums[kind] = sums.get(kind, 0.0) + cpu
        return dict(sorted(sums.items(), key=lambda kv: -kv[1]))

    def finish(self, grace_s: float = 30.0) -> float:
        """After ``root`` exited: follow the rest of the tree until it has exited, stopping
        what outlives ``grace_s``; returns the CPU seconds of the whole tree."""
        deadline = time.monotonic() + grace_s
        while self.sample():
            if time.monotonic() > deadline:
                left = [p for p in self.me.children(recursive=True) if p.pid != self.root.pid]
                self.stragglers = len(left)
                for p in left:
                    with contextlib.suppress(self.psutil.Error):
                        p.terminate()
                deadline = float("inf")
            time.sleep(SAMPLE_S)
        return self.samples[-1][1]

    def at(self, t: float) -> float:
        """The tree's CPU seconds at time ``t`` (linear between samples)."""
        s = self.samples
        if not s or t <= s[0][0]:
            return s[0][1] if s else 0.0
        for (t0, c0), (t1, c1) in itertools.pairwise(s):
            if t <= t1:
                return c0 + (c1 - c0) * (t - t0) / max(t1 - t0, 1e-9)
        return s[-1][1]


def run_study(
    config: Path, out: Path, num_cpus: int, address: str | None
) -> tuple[float, str, TreeCpu | None]:
    """``study run`` as a user runs it; returns (wall seconds, combined output, its process
    tree's CPU time: None with ``address`` or where this process cannot be its subreaper)."""
    cmd = [sys.executable, "-m", "study.cli", "run", str(config), "--out", str(out)]
    cmd += ["--address", address] if address else ["--num-cpus", str(num_cpus)]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    measure = address is None and become_subreaper()
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT
        )
        tree = TreeCpu(proc) if measure else None
        while proc.poll() is None:
            if tree is not None:
                tree.sample()
            time.sleep(SAMPLE_S)
        wall = time.perf_counter() - t0
        if tree is not None:
            tree.finish()
        log.seek(0)
        output = log.read()
    if proc.returncode != 0:
        raise SystemExit(f"study run failed ({proc.returncode}):\n{output[-6000:]}")
    return wall, output, tree


def own_compute(config: Path, trials: int, sample: int = 40) -> float:
    """CPU seconds of the trials' own work (training and evaluating each unit), measured in
    this process without Ray: the dataset built once, one unit of warm-up, then up to
    ``sample`` units (all alike but for their seeds), scaled to ``trials``."""
    import torch

    from study.config import load
    from study.plan import plan_units
    from trainables.loop import BundleRun
    from trainables.runtime import configure_worker

    cfg = load(config)
    with tempfile.TemporaryDirectory() as empty:
        units, _, _ = plan_units(cfg, Path(empty), NAME, "cpu", 1)
    configure_worker(int(cfg.execution.threads))
    spec = cfg.points[0].spec

    def train(unit: Any) -> None:
        run = BundleRun(spec, list(unit.seeds), task, data, torch.device("cpu"))
        while not run.done:
            run.train_round()
        run.finalize()

    t0 = time.process_time()
    task = spec.make_task()
    data = task.build(units[0].seeds[0].data_seed)
    built = time.process_time() - t0
    train(units[0])  # warm-up: first-use costs (kernel loading, lazy imports) are a worker's
    timed = units[: max(1, min(sample, len(units)))]
    t0 = time.process_time()
    for unit in timed:
        train(unit)
    return built + (time.process_time() - t0) * trials / len(timed)


def check_rows(out: Path, trials: int) -> dict[str, int]:
    """Every seed committed once with its rows; every Parquet file reads. Returns row counts."""
    from analysis.db import run_sql

    for path in (out / "tables").rglob("*.parquet"):
        pq.read_table(path)
    counts = json.loads(
        run_sql(
            out,
            (
                "SELECT (SELECT count(*) FROM runs) AS runs, (SELECT count(DISTINCT seed) FROM runs) AS seeds, "
                "(SELECT count(*) FROM trials) AS trials, (SELECT count(*) FROM evals) AS evals, "
                "(SELECT count(*) FROM metrics) AS metrics, (SELECT count(*) FROM predictions) AS predictions, "
                "(SELECT count(DISTINCT seed) FROM evals) AS seeds_with_evals"
            ),
            "json",
        )
    )[0]
    problems = [
        f"{k}={counts[k]}"
        for k in ("runs", "seeds", "trials", "seeds_with_evals")
        if counts[k] != trials
    ]
    if problems:
        raise SystemExit(f"rows missing for a {trials}-trial study: {', '.join(problems)}")
    return {k: int(v) for k, v in counts.items()}


def timings(out: Path, trials: int, slots: float, wall: float) -> dict[str, float]:
    """Overhead figures from the ``trials`` table (see the module docstring)."""
    from analysis.db import run_sql

    t = json.loads(
        run_sql(
            out,
            (
                "SELECT epoch(max(ended_at)) - epoch(min(started_at)) AS span, "
                "sum(epoch(ended_at) - epoch(started_at)) AS busy, "
                "epoch(min(started_at)) AS first_start, epoch(max(ended_at)) AS last_end FROM trials"
            ),
            "json",
        )
    )[0]
    span, busy = float(t["span"]), float(t["busy"])
    return {
        "trials": trials,
        "slots": slots,
        "wall_s": wall,
        "span_s": span,
        "busy_s": busy,
        "startup_s": wall - span,
        "wall_per_trial_ms": 1000 * wall / trials,
        "busy_per_trial_ms": 1000 * busy / trials,
        "overhead_per_trial_ms": 1000 * (span * slots - busy) / trials,
        "first_start": float(t["first_start"]),
        "last_end": float(t["last_end"]),
    }


def cpu_figures(
    tree: TreeCpu, own: float, trials: int, first_start: float, last_end: float
) -> dict[str, Any]:
    """Core-second figures (see the module docstring) from the tree's CPU time and the
    trials' own compute ``own`` (CPU seconds, all trials)."""
    total = tree.samples[-1][1]
    before, until = tree.at(first_start), tree.at(last_end)
    return {
        "cpu_total_s": total,
        "cpu_startup_s": before,
        "cpu_trials_s": until - before,
        "cpu_after_s": total - until,
        "own_cpu_s": own,
        "own_cpu_per_trial_ms": 1000 * own / trials,
        "core_s_per_trial": (total - own) / trials,
        "core_s_per_trial_during_trials": (until - before - own) / trials,
        "cpu_samples": len(tree.samples),
        "processes": len(tree.seen),
        "trial_actors": sum(1 for kind in tree.kinds.values() if kind == "trial actors"),
        "cpu_by_process": {k: round(v, 2) for k, v in tree.by_kind().items()},
        "stragglers": tree.stragglers,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=500, help="Tune trials (one seed each)")
    parser.add_argument(
        "--num-cpus",
        type=int,
        default=2,
        help="CPUs of the local Ray (with --address: the cluster's, for the figures)",
    )
    parser.add_argument("--address", default=None, help="run on this Ray cluster instead")
    parser.add_argument("--keep", type=Path, default=None, help="keep the results in this folder")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="fl-load-"))
    out = args.keep or work / "results"
    config = work / "load500.yaml"
    config.write_text(yaml.safe_dump(tiny_study(args.trials)))
    if (out / NAME).exists():
        raise SystemExit(f"{out} already holds study {NAME}: give --keep a fresh folder")
    try:
        wall, _, tree = run_study(config, out, args.num_cpus, args.address)
        counts = check_rows(out, args.trials)
        figures: dict[str, Any] = timings(out, args.trials, float(args.num_cpus), wall)
        if tree is not None:
            own = own_compute(config, args.trials)
            figures.update(
                cpu_figures(tree, own, args.trials, figures["first_start"], figures["last_end"])
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps({**figures, **{f"rows_{k}": v for k, v in counts.items()}}, indent=2))
    else:
        print(
            f"{args.trials} trials, all committed: {counts['runs']} runs, {counts['evals']} evals, "
            f"{counts['metrics']} metrics, {counts['predictions']} predictions rows"
        )
        print(
            f"wall {wall:.1f} s (startup {figures['startup_s']:.1f} s, trials span {figures['span_s']:.1f} s "
            f"on {figures['slots']:g} slots)"
        )
        print(
            f"per trial: {figures['wall_per_trial_ms']:.0f} ms of wall, {figures['busy_per_trial_ms']:.0f} ms "
            f"of its own work, {figures['overhead_per_trial_ms']:.0f} ms of platform overhead"
        )
        if "cpu_total_s" in figures:
            print(
                f"CPU of the study's process tree {figures['cpu_total_s']:.1f} core-s (before the first trial "
                f"{figures['cpu_startup_s']:.1f}, during the trials {figures['cpu_trials_s']:.1f}, after "
                f"{figures['cpu_after_s']:.1f}); the trials' own compute {figures['own_cpu_s']:.1f} core-s "
                f"({figures['own_cpu_per_trial_ms']:.0f} ms per trial, without Ray)"
            )
            print(
                f"CPU by process ({figures['trial_actors']} trial actors started): "
                + ", ".join(f"{k} {v:.1f}" for k, v in figures["cpu_by_process"].items())
            )
            print(
                f"core-seconds per trial: {figures['core_s_per_trial']:.3f} in all, "
                f"{figures['core_s_per_trial_during_trials']:.3f} during the trials"
            )
        else:
            print(
                "core-seconds per trial: not measured (a remote cluster, or no subreaper on this OS)"
            )
    return figures


if __name__ == "__main__":
    main()
