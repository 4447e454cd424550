"""Side-by-side benchmark of the auto-bundled transformer on grokking's modular arithmetic.

In one process, on the same data and seeds (training steps only, full batch, one torch
thread), K seeds of ``transformer`` trained:

  (a) as K lone runs (K BundleRuns of one seed; each still goes through vmap, K = 1);
  (b) auto-bundled: ONE BundleRun of K seeds (torch.func: vmap over functional_call);
  (c) the same bundle with ``bundling = "loop"`` (one functional_call per member);
  (d) with ``--sdpa``: (b) with attention through ``F.scaled_dot_product_attention``
      (torch 2.13 has no vmap batching rule for its CPU kernel: vmap loops inside it; and
      fineline refuses it in training, its kernel being tagged a seeded random op, so this
      case skips the random-op probe).

Interleaved ``--repeats`` times, each reports its median. It prints member-steps per second
for each and, as its LAST line, the ratio auto-bundled / K lone runs.

    python benchmarks/transformer_bundle.py                    # the grokking CPU config's sizes
    python benchmarks/transformer_bundle.py --k 8 --p 97 --d-model 128 --sdpa
    python benchmarks/transformer_bundle.py --config configs/zhou2023_length_cpu.yaml --k 8

``--config`` takes the first grid point of a study config instead (its task, model and
training; ``--set`` adds overrides), trained for ``--steps`` steps: e.g. the length tasks,
whose config runs one seed per bundle (``execution.bundle_size: 1``) on this measurement.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from trainables.loop import BundleRun
from trainables.models.plain import PlainModel
from trainables.models.transformer import CausalSelfAttention
from trainables.registry import TASKS
from trainables.seeding import derive_seedset
from trainables.spec import RunSpec


def make_spec(args: argparse.Namespace) -> RunSpec:
    if args.config:
        from study.config import load

        steps = [f"train.max_steps={args.steps}", f"train.eval_every_steps={args.steps}"]
        return load(args.config, overrides=[*args.set, *steps]).points[0].spec
    return RunSpec.from_dict({
        "task": {"name": "modular", "p": args.p, "train_fraction": args.frac},
        "model": {"name": "transformer", "d_model": args.d_model, "n_heads": 4, "n_layers": args.layers,
                  "d_ff": 4 * args.d_model, "bos": False, "eos": False, "layer_norm": False, "init": "nanda"},
        "train": {"optimizer": "adamw", "lr": 1e-3, "weight_decay": 1.0, "adam_betas": (0.9, 0.98),
                  "batch_size": int(args.frac * args.p * args.p), "max_steps": args.steps,
                  "eval_every_steps": args.steps, "selection": {"mode": "last", "early_stop": False}},
    })  # fmt: skip


def sdpa_forward(self: CausalSelfAttention, x: torch.Tensor) -> torch.Tensor:
    b, t, d = x.shape
    h = self.n_heads
    q, k, v = (z(x).reshape(b, t, h, d // h).transpose(1, 2) for z in (self.q, self.k, self.v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
    return self.resid_drop(self.proj(y))  # type: ignore[no-any-return]


def steps_wall(args: argparse.Namespace, groups: list[list[Any]], loop: bool = False) -> float:
    """Seconds to train every group (a BundleRun each) to the step budget, evaluation excluded."""
    spec = make_spec(args)
    task = TASKS.get(spec.task_name)(spec.task)
    data = task.build(groups[0][0].data_seed)
    runs = [BundleRun(spec, g, task, data) for g in groups]
    for r in runs:
        r.model.bundling = "loop" if loop else "vmap"  # type: ignore[assignment]
        r._evaluate_round = lambda *a: None  # type: ignore[method-assign]  # training steps only
    t0 = time.perf_counter()
    for r in runs:
        while not r.done:
            r.train_round()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=8, help="seeds")
    ap.add_argument("--p", type=int, default=59, help="modulus")
    ap.add_argument("--frac", type=float, default=0.4, help="training fraction (full batch)")
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sdpa", action="store_true", help="also time attention through SDPA")
    ap.add_argument("--config", type=Path, help="a study config: its first grid point instead of modular")
    ap.add_argument("--set", action="append", default=[], help="an override for --config (repeatable)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", UserWarning)  # SDPA's "no batching rule" warning
    seeds = [derive_seedset(0, i) for i in range(args.k)]
    explicit = CausalSelfAttention.forward
    cases: dict[str, Callable[[], float]] = {
        "(a) K lone runs": lambda: steps_wall(args, [[s] for s in seeds]),
        "(b) auto-bundled (vmap)": lambda: steps_wall(args, [seeds]),
        "(c) member loop": lambda: steps_wall(args, [seeds], loop=True),
    }

    def sdpa() -> float:
        # fineline refuses SDPA in training: its CPU kernel is tagged as a seeded random op
        # (for its dropout_p). Here (dropout 0) the probe is skipped to time it anyway.
        CausalSelfAttention.forward = sdpa_forward  # type: ignore[method-assign]
        probe = PlainModel._probe
        PlainModel._probe = lambda self, inputs, buffers: ()  # type: ignore[method-assign]
        try:
            return steps_wall(args, [seeds])
        finally:
            CausalSelfAttention.forward = explicit  # type: ignore[method-assign]
            PlainModel._probe = probe  # type: ignore[method-assign]

    if args.sdpa:
        cases["(d) vmap, SDPA attention"] = sdpa
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, fn in cases.items():
            times[name].append(fn())
    median = {name: statistics.median(t) for name, t in times.items()}
    work = args.k * args.steps
    spec = make_spec(args)
    if args.config:
        print(f"K={args.k} {args.config} {' '.join(args.set)}: task {spec.task_name}, "
              f"batch={spec.train.batch_size} steps={args.steps} (one thread)")
    else:
        print(f"K={args.k} p={args.p} frac={args.frac} d_model={args.d_model} layers={args.layers} "
              f"batch={spec.train.batch_size} steps={args.steps} (one thread)")
    for name, t in median.items():
        print(f"{name:28s} {work / t:8.1f} member-steps/s  ({t:.2f} s)")
    print(f"auto-bundled / K lone runs: speedup = {median['(a) K lone runs'] / median['(b) auto-bundled (vmap)']:.2f}x")


if __name__ == "__main__":
    main()
