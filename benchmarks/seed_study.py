"""Side-by-side benchmark of a symbol-rewriting seed study: baseline vs fineline's fastest.

Runs the SAME seed study (symbol rewriting, N seeds, one epoch of the training set, every
evaluation) two ways, in one run, on this machine, through the real `study run` path:

  (a) baseline: one Ray Tune trial per seed, the plain eager ``nn.LSTM`` model
      (``model.impl: reference``, ``bundle_size: 1``);
  (b) fineline's fastest setting: the fast batched kernels, seeds bundled
      (``bundle_size: auto``), optionally ``torch.compile`` (``--compile``; the inductor
      cache state is reported: a first run is cold, later ones warm).

It prints both wall times, seed-samples per second and, as its LAST line, the speedup
wall(a) / wall(b). ``--full`` instead runs the paper-scale study (100k samples, the
paper's stopping rule, 50 seeds) once with the fastest setting and prints its wall time
and the per-split summary.

    python benchmarks/seed_study.py                 # 16 seeds x 1 epoch of 100k
    python benchmarks/seed_study.py --tiny          # seconds: a smoke run
    python benchmarks/seed_study.py --full          # the whole paper-scale study
    python benchmarks/seed_study.py --full --direct cuda   # one bundle of 50 seeds on a GPU

``--direct DEVICE`` trains all seeds as ONE bundle in this process on DEVICE (``cpu`` or
``cuda``) with the fast kernels, without Ray (a GPU machine needs only torch, numpy and
pydantic for it), and prints the wall time and the per-split summary.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from study.config import parse

PAPER_TASK: dict[str, Any] = {"name": "symbol_rewriting", "train_size": 100_000}
TINY_TASK: dict[str, Any] = {
    "name": "symbol_rewriting", "n_symbols": 12, "train_size": 400, "val_size": 50, "val_ood_size": 50,
    "test_size": 50, "train_lengths": [2, 4], "val_ood_lengths": [2, 5], "repeat_lengths": [3, 5],
    "short_lengths": [1, 2], "long_lengths": [5, 6],
}


def study_config(task: dict[str, Any], seeds: int, fast: bool, compile_: bool, epochs: int, early_stop: bool) -> dict[str, Any]:
    return {
        "task": task,
        "model": {"name": "seq2seq", "impl": "fast" if fast else "reference", "compile": compile_ and fast},
        "train": {
            "max_epochs": epochs,
            "selection": {"split": "val", "metric": "accuracy", "mode": "max", "early_stop": early_stop,
                          "patience": 1, "arm_above": 0.0},
        },
        "seeds": {"count": seeds, "root": 16},
        "execution": {"bundle_size": "auto" if fast else 1, "device": "cpu"},
    }


def timed_study(raw: dict[str, Any], name: str, out: Path, cpus: int) -> float:
    from study.runner import run_study  # imports Ray: not needed by --direct

    t0 = time.perf_counter()
    run_study(parse(raw), name, out, num_cpus=cpus)
    return time.perf_counter() - t0


def direct_bundle(raw: dict[str, Any], device: str) -> tuple[float, str]:
    """Train every seed of ``raw`` as one bundle in this process on ``device`` (no Ray).

    Returns the wall time (data generation excluded, every evaluation included) and a
    per-split summary of test accuracy at each member's selected epoch.
    """
    import torch

    from study.plan import seedsets
    from trainables.loop import BundleRun
    from trainables.runtime import configure_worker

    cfg = parse(raw)
    point = cfg.points[0]
    seeds = seedsets(point)
    configure_worker(torch.get_num_threads())
    task = point.spec.make_task()
    data = task.build(seeds[0].data_seed)
    t0 = time.perf_counter()
    run = BundleRun(point.spec, seeds, task, data, device)
    while not run.done:
        info = run.train_round()
        print(f"  epoch {info['epoch']}: {info['active']} of {len(seeds)} members training, "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    rows = run.finalize()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    acc: dict[str, list[float]] = {}
    for member in rows:
        for r in member["evals"]:
            if r["metric"] == "accuracy":
                acc.setdefault(r["split"], []).append(r["value"])
    lines = [f"{'split':<10} {'seeds':>5} {'mean':>7} {'std':>7} {'min':>7} {'max':>7}"]
    for split, v in sorted(acc.items()):
        a = np.asarray(v)
        lines.append(f"{split:<10} {len(a):>5} {a.mean():7.4f} {a.std(ddof=1) if len(a) > 1 else 0.0:7.4f} "
                     f"{a.min():7.4f} {a.max():7.4f}")
    epochs = [m["run"][0]["selected_epoch"] for m in rows]
    lines.append(f"selected epochs: mean {np.mean(epochs):.1f}, max {max(epochs)}; epochs trained {run.epoch}")
    return wall, "\n".join(lines)


def summary(out: Path, name: str) -> str:
    from analysis.db import run_sql

    return run_sql(out, (
        "SELECT split, count(*) AS seeds, round(avg(value), 4) AS mean, round(stddev_samp(value), 4) AS std, "
        "round(min(value), 4) AS min, round(max(value), 4) AS max FROM evals "
        f"WHERE study = '{name}' AND metric = 'accuracy' GROUP BY split ORDER BY split"
    ))


def cache_state() -> str:
    cache = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR", Path(tempfile.gettempdir()) / f"torchinductor_{os.environ.get('USER', 'root')}"))
    return "warm" if cache.is_dir() and any(cache.iterdir()) else "cold"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=None, help="seeds (default 16; 50 with --full)")
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--tiny", action="store_true", help="tiny data: a smoke run")
    ap.add_argument("--full", action="store_true", help="paper scale with early stopping, fastest setting only")
    ap.add_argument("--compile", action="store_true", help="torch.compile the fast path in (b)")
    ap.add_argument("--out", type=Path, default=None, help="keep results here (default: a temp dir)")
    ap.add_argument("--direct", choices=["cpu", "cuda"], default=None,
                    help="one bundle of all seeds in this process on this device, no Ray")
    ap.add_argument("--epochs", type=int, default=None, help="epochs (default 1; 30 with --full)")
    args = ap.parse_args()
    task = TINY_TASK if args.tiny else PAPER_TASK
    n_train = task["train_size"]
    if args.direct:
        seeds = args.seeds or (50 if args.full else 16)
        epochs = args.epochs or (30 if args.full else 1)
        raw = study_config(task, seeds, True, False, epochs, args.full)
        raw["execution"]["device"] = args.direct
        wall, table = direct_bundle(raw, args.direct)
        print(table)
        what = "paper stopping rule" if args.full else f"{epochs} epoch(s), no early stopping"
        print(f"direct: one bundle of {seeds} seeds on {args.direct}, {n_train} training samples, {what}: "
              f"wall {wall:.1f} s ({wall / 60:.1f} min)")
        return
    out = args.out or Path(tempfile.mkdtemp(prefix="fineline-bench-"))
    try:
        if args.full:
            seeds = args.seeds or 50
            raw = study_config(task, seeds, True, args.compile, 30, True)
            wall = timed_study(raw, "full", out, args.cpus)
            print(summary(out, "full"))
            print(f"full study: {seeds} seeds, {n_train} training samples, paper stopping rule: wall {wall:.1f} s ({wall / 60:.1f} min)")
            return
        seeds = args.seeds or 16
        cache = cache_state() if args.compile else "n/a (no compile)"
        wall_a = timed_study(study_config(task, seeds, False, False, 1, False), "baseline", out, args.cpus)
        wall_b = timed_study(study_config(task, seeds, True, args.compile, 1, False), "fastest", out, args.cpus)
        samples = seeds * n_train
        print(f"(a) baseline: one trial per seed, eager nn.LSTM: wall {wall_a:.1f} s, {samples / wall_a:,.0f} seed-samples/s")
        print(f"(b) fastest: fast kernels, bundles, compile={args.compile} (inductor cache {cache}): "
              f"wall {wall_b:.1f} s, {samples / wall_b:,.0f} seed-samples/s")
        print(f"speedup = wall(a) / wall(b) = {wall_a / wall_b:.2f}x")
    finally:
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
