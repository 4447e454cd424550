"""What pinning torch's CPU numerics costs, and whether it changes the bits.

A seed reproduces bit for bit only under the same numerics (``trials.numerics``: the CPU,
the code path torch's operators dispatch to, MKL's code path, the thread count). MKL picks
its matrix-product code by CPU, so one seed of ``configs/quickstart.yaml`` learned on one
machine and did not on another. ``MKL_CBWR=COMPATIBLE`` (and ``ATEN_CPU_CAPABILITY=default``
for torch's own operators, ``FINELINE_PORTABLE_KERNELS=1`` for the C kernels) pin those
paths, at a cost this script measures.

It trains the first seed of a study config (default the quickstart) for ``--epochs`` epochs
(every evaluation included; data generation and the kernels' build excluded) in a fresh
process per setting, the settings interleaved over ``--rounds`` rounds, one thread each (as
a Ray trial), and prints per setting: its ``numerics``, the median seconds per epoch, the
ratio to the unpinned default (LAST column), whether its trained parameters equal the
default's bit for bit (``unstable``: not even its own rounds agree), and whether they
equal the row above's.

    python -m benchmarks.numerics [--epochs 1] [--rounds 3] [--config configs/quickstart.yaml]

(from the repository root, on an otherwise idle machine).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from trainables.models.ckernels import PORTABLE_VAR

SETTINGS: dict[str, dict[str, str]] = {
    "default": {},
    "MKL_CBWR=COMPATIBLE": {"MKL_CBWR": "COMPATIBLE"},
    "+ ATEN_CPU_CAPABILITY=default": {"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "default"},
    "+ FINELINE_PORTABLE_KERNELS=1": {"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "default", PORTABLE_VAR: "1"},
}  # fmt: skip
"""Each setting's environment, on top of this process's with every one of these unset."""


def child(config: Path, epochs: int) -> dict[str, object]:
    """Train seed 0 of ``config``'s first point for ``epochs`` epochs in this process."""
    import torch
    import yaml

    from study.config import parse
    from study.plan import seedsets
    from trainables.loop import BundleRun
    from trainables.models.ckernels import cpu_kernels
    from trainables.runtime import configure_worker, numerics

    configure_worker(1)
    cpu_kernels()  # built (or loaded from the cache) before the clock starts
    point = parse(yaml.safe_load(config.read_text())).points[0]
    seeds = seedsets(point)[:1]
    task = point.spec.make_task()
    data = task.build(seeds[0].data_seed)
    run = BundleRun(point.spec, seeds, task, data, "cpu")
    t0 = time.perf_counter()
    for _ in range(epochs):
        run.train_round()
    wall = time.perf_counter() - t0
    params = torch.cat([p.detach().flatten() for p in run.model.parameters()])
    return {"seconds_per_epoch": wall / epochs, "params_sha256": hashlib.sha256(params.numpy().tobytes()).hexdigest(),
            "numerics": numerics("cpu")}  # fmt: skip


def measure(config: Path, epochs: int, setting: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k not in {n for s in SETTINGS.values() for n in s}}
    env |= SETTINGS[setting]
    res = subprocess.run(
        [sys.executable, "-m", "benchmarks.numerics", "--child", "--config", str(config), "--epochs", str(epochs)],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if res.returncode != 0:
        raise SystemExit(f"{setting}: the training process failed:\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=Path("configs/quickstart.yaml"))
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.config, args.epochs)))
        return
    results: dict[str, list[dict[str, object]]] = {s: [] for s in SETTINGS}
    for r in range(args.rounds):
        for setting in SETTINGS:
            results[setting].append(measure(args.config, args.epochs, setting))
            print(f"round {r + 1}/{args.rounds} {setting}: {results[setting][-1]['seconds_per_epoch']:.2f} s/epoch",
                  flush=True)  # fmt: skip
    base = statistics.median(float(x["seconds_per_epoch"]) for x in results["default"])
    base_bits = results["default"][0]["params_sha256"]
    print(f"\n{args.config}, seed 0, {args.epochs} epoch(s), medians of {args.rounds} interleaved rounds, 1 thread")
    print(f"{'setting':<31} {'numerics':<52} {'s/epoch':>8} {'bits = default':>14} {'= above':>7} {'vs default':>10}")
    above = base_bits
    for setting, runs in results.items():
        bits = {x["params_sha256"] for x in runs}
        mine = runs[0]["params_sha256"]
        same = "unstable" if len(bits) > 1 else ("yes" if mine == base_bits else "no")
        as_above = "yes" if mine == above else "no"
        above = mine
        sec = statistics.median(float(x["seconds_per_epoch"]) for x in runs)
        print(f"{setting:<31} {runs[0]['numerics']!s:<52} {sec:8.2f} {same:>14} {as_above:>7} {sec / base:9.2f}x")


if __name__ == "__main__":
    main()
