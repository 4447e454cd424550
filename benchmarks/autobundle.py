"""Side-by-side benchmark of automatic bundling: K seeds of a small MLP trained three ways.

In one process, on the same toy2d data and seeds (training steps only, one torch thread):

  (a) K lone runs: K BundleRuns of one seed each, the plain-module model ``mlp_plain``;
  (b) auto-bundled: ONE BundleRun of K seeds of ``mlp_plain`` (torch.func: vmap over
      functional_call with the stacked parameters);
  (c) hand-bundled: ONE BundleRun of K seeds of ``mlp`` (parameters with a member dim,
      one baddbmm per layer).

The three are interleaved (a, b, c, a, b, c, ...) ``--repeats`` times and each reports its
median. It prints seed-samples per second (K x steps x batch / training wall time) for each
and, as its LAST line, the ratio auto-bundled / K lone runs. ``--profile`` also prints
where the time of (b)'s training steps goes (cProfile, top functions by own time).

    python benchmarks/autobundle.py                 # K = 8, hidden (64, 64), batch 32
    python benchmarks/autobundle.py --k 16 --dropout 0.2
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from typing import Any

import torch

from trainables.loop import BundleRun
from trainables.registry import TASKS
from trainables.seeding import derive_seedset
from trainables.spec import RunSpec


def make_spec(model: str, args: argparse.Namespace) -> RunSpec:
    extra = {"dropout": args.dropout} if model == "mlp_plain" else {}
    return RunSpec.from_dict({
        "task": {"name": "toy2d", "n_train": 4096, "n_eval": 64, "grid": (-1.0, 1.0, 5)},
        "model": {"name": model, "hidden": tuple(args.hidden), **extra},
        "train": {
            "optimizer": "adam", "lr": 0.01, "batch_size": args.batch, "loss_reduction": "mean",
            "max_steps": args.steps, "eval_every_steps": args.steps,
            "selection": {"mode": "last", "early_stop": False, "split": "train_eval", "metric": "accuracy"},
        },
    })


def make_runs(model: str, seeds: list[Any], lone: bool, args: argparse.Namespace) -> list[BundleRun]:
    spec = make_spec(model, args)
    task = TASKS.get(spec.task_name)(spec.task)
    data = task.build(seeds[0].data_seed)
    groups = [[s] for s in seeds] if lone else [seeds]
    return [BundleRun(spec, g, task, data) for g in groups]


def train_wall(runs: list[BundleRun]) -> float:
    """Seconds to train every run to its step budget (construction excluded)."""
    t0 = time.perf_counter()
    for run in runs:
        while not run.done:
            run.train_round()
    return time.perf_counter() - t0


def profile_bundle(args: argparse.Namespace, seeds: list[Any]) -> str:
    (run,) = make_runs("mlp_plain", seeds, lone=False, args=args)
    prof = cProfile.Profile()
    prof.enable()
    train_wall([run])
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
    return out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=8, help="seeds (default 8)")
    ap.add_argument("--hidden", type=int, nargs="+", default=[64, 64], help="hidden sizes (default 64 64)")
    ap.add_argument("--batch", type=int, default=32, help="batch size per seed (default 32)")
    ap.add_argument("--steps", type=int, default=300, help="optimizer steps per seed (default 300)")
    ap.add_argument("--dropout", type=float, default=0.0, help="mlp_plain dropout (default 0)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats (default 3)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--profile", action="store_true", help="profile (b)'s training steps")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    seeds = [derive_seedset(0, i) for i in range(args.k)]
    ways = {
        "(a) K lone runs, mlp_plain": ("mlp_plain", True),
        "(b) auto-bundled, mlp_plain": ("mlp_plain", False),
        "(c) hand-bundled, mlp": ("mlp", False),
    }
    walls: dict[str, list[float]] = {name: [] for name in ways}
    train_wall(make_runs("mlp_plain", seeds[:1], lone=True, args=args))  # warm-up
    for _ in range(args.repeats):
        for name, (model, lone) in ways.items():
            walls[name].append(train_wall(make_runs(model, seeds, lone, args)))
    samples = args.k * args.steps * args.batch
    print(f"autobundle: K={args.k} seeds, hidden {tuple(args.hidden)}, batch {args.batch}, "
          f"{args.steps} steps each, dropout {args.dropout}, {args.threads} torch thread(s), "
          f"toy2d, median of {args.repeats} interleaved repeats")
    rate = {}
    for name, w in walls.items():
        wall = statistics.median(w)
        rate[name] = samples / wall
        print(f"{name:30s} wall {wall:6.2f} s  {rate[name]:>10,.0f} seed-samples/s")
    if args.profile:
        print(profile_bundle(args, seeds))
    a, b = rate["(a) K lone runs, mlp_plain"], rate["(b) auto-bundled, mlp_plain"]
    print(f"auto-bundled / K lone runs = {b / a:.2f}x")


if __name__ == "__main__":
    main()
