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
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from study.config import parse
from study.runner import run_study

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
    t0 = time.perf_counter()
    run_study(parse(raw), name, out, num_cpus=cpus)
    return time.perf_counter() - t0


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
    args = ap.parse_args()
    task = TINY_TASK if args.tiny else PAPER_TASK
    out = args.out or Path(tempfile.mkdtemp(prefix="fineline-bench-"))
    n_train = task["train_size"]
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
