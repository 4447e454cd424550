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

    python benchmarks/load_500.py                  # 500 trials on 2 local CPUs
    python benchmarks/load_500.py --trials 100 --num-cpus 4 --keep /tmp/load
"""

from __future__ import annotations

import argparse
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


def run_study(config: Path, out: Path, num_cpus: int, address: str | None) -> tuple[float, str]:
    """``study run`` as a user runs it; returns (wall seconds, combined output)."""
    cmd = [sys.executable, "-m", "study.cli", "run", str(config), "--out", str(out)]
    cmd += ["--address", address] if address else ["--num-cpus", str(num_cpus)]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(
            f"study run failed ({res.returncode}):\n{res.stdout}\n{res.stderr[-4000:]}"
        )
    return wall, res.stdout + res.stderr


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
                "sum(epoch(ended_at) - epoch(started_at)) AS busy FROM trials"
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
    }


def main(argv: list[str] | None = None) -> dict[str, float]:
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
        wall, _ = run_study(config, out, args.num_cpus, args.address)
        counts = check_rows(out, args.trials)
        figures = timings(out, args.trials, float(args.num_cpus), wall)
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
    return figures


if __name__ == "__main__":
    main()
