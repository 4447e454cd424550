"""A symbol-rewriting seed bundle on a GPU: eager steps vs steps replayed from CUDA graphs.

Trains ONE bundle of K seeds (default 50) of a study config's first grid point (default
``configs/weber2018.yaml``: the paper's model with input feeding) in this process, no Ray,
three ways, in one run, on the same device:

  (a) before: the eager step with per-member generator masks (``execution.cuda_graphs: false``);
  (b) eager steps on bucket-padded batches with the batched counter masks (what a graph
      captures, run op by op: the masks' share of the gain);
  (c) after: ``execution.cuda_graphs: true``, the loss and gradients replayed from CUDA graphs.

Each trains ``--warm`` untimed steps (graphs are captured there, at a shape's second
sighting), 20 profiled ones on CUDA (the GPU kernel time per step), then ``--steps`` timed ones, then evaluates every member on ``--eval`` examples
(teacher-forced losses and greedy decoding) three times: (c) runs the first evaluation
eagerly, captures the second and replays the third, as every evaluation after a study's
second does. It prints per-step wall times, each evaluation's time, the ratios (a)/(c) and
(b)/(c) (evaluation: the third), how many graphs (c) captured and replayed, and how far
(c)'s parameters are from (b)'s after the same steps (the same batches and masks: float
rounding only). Needs only torch, numpy and pydantic (no Ray):

    python benchmarks/gpu_bundle.py                       # K=50, 200 steps, 5,000 examples
    python benchmarks/gpu_bundle.py --config configs/grokking_gpu.yaml --k 20   # the Transformer (full batch)
    python benchmarks/gpu_bundle.py --device cpu --k 2 --steps 3 --warm 2 --eval 40 --train-size 400   # smoke
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from study.config import parse
from study.plan import seedsets
from trainables.data import SeqPairs, Split
from trainables.loop import BundleRun
from trainables.runtime import configure_worker

ROOT = Path(__file__).resolve().parents[1]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def bundle(cfg_path: Path, k: int, train_size: int | None, device: torch.device, graphs: bool) -> tuple[BundleRun, Any]:
    import yaml

    raw = yaml.safe_load(cfg_path.read_text())
    raw["seeds"]["count"] = k
    if train_size is not None:
        raw["task"]["train_size"] = train_size
    point = parse(raw).points[0]
    seeds = seedsets(point)
    task = point.spec.make_task()
    data = task.build(seeds[0].data_seed)
    if graphs:
        return BundleRun(point.spec, seeds, task, data, device, cuda_graphs=True), data
    # without the keyword when off: --only a also runs on checkouts from before it existed
    return BundleRun(point.spec, seeds, task, data, device), data


def eval_split(data: Any, n: int) -> Split:
    """The first ``n`` examples of the training split, as a split to evaluate."""
    src: SeqPairs = data.train.data
    n = min(n, len(src))
    return Split(f"train[:{n}]", "test", SeqPairs(src.src[:n], src.tgt[:n], src.ids[:n]))


def train_steps(run: BundleRun, n: int) -> None:
    """``n`` training steps; the losses are checked once at the end (as the loop does on a
    GPU: a check per step would make the host wait for the GPU every step)."""
    finite = torch.ones((), dtype=torch.bool, device=run.device)
    for _ in range(n):
        d, rows = run._train_batch()
        losses = run._optimizer_step(d, rows)
        run.step += 1
        finite &= torch.isfinite(losses).all()
    if not bool(finite):
        raise RuntimeError(f"a member's loss was not finite before step {run.step}")


def kernel_ms_per_step(run: BundleRun, n: int) -> float:
    """GPU kernel time per training step over ``n`` steps (torch.profiler's CUDA activity)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        train_steps(run, n)
        sync(run.device)
    total_us = sum(e.self_device_time_total for e in prof.key_averages())
    return total_us / 1000 / n


def measure(name: str, run: BundleRun, split: Split, warm: int, steps: int) -> dict[str, float]:
    dev = run.device
    train_steps(run, warm)
    sync(dev)
    if dev.type == "cuda":
        print(f"{name}: GPU kernels {kernel_ms_per_step(run, 20):.2f} ms per step (20 steps, profiled)", flush=True)
    t0 = time.perf_counter()
    train_steps(run, steps)
    sync(dev)
    train_s = time.perf_counter() - t0
    evals = []
    for _ in range(3):
        t0 = time.perf_counter()
        run.evaluate(split)
        sync(dev)
        evals.append(time.perf_counter() - t0)
    print(f"{name}: {steps} steps {train_s:.2f} s ({1000 * train_s / steps:.1f} ms/step){graph_counts(run, 'captured')}; "
          f"evaluations of {len(split)} examples {', '.join(f'{e:.2f}' for e in evals)} s"
          f"{graph_counts(run, 'captured_eval')}", flush=True)
    return {"train": train_s, "eval": evals[-1]}


def graph_counts(run: BundleRun, attr: str) -> str:
    """How many graphs ``run.<attr>`` (training or evaluation) captured and replayed."""
    c = getattr(run, attr, None)
    if c is None:
        return ""
    failed = f", CAPTURE FAILED: {c.failed}" if c.failed else ""
    return f" (graphs {len(c.graphs)}, replays {c.replays}, eager {c.eager}{failed})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "weber2018.yaml")
    ap.add_argument("--k", type=int, default=50, help="seeds in the bundle")
    ap.add_argument("--steps", type=int, default=200, help="timed training steps")
    ap.add_argument("--warm", type=int, default=30, help="untimed steps first (captures happen here)")
    ap.add_argument("--eval", type=int, default=5000, help="examples evaluated")
    ap.add_argument("--train-size", type=int, default=None, help="override task.train_size (smoke runs)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--only", default=None, help="the variants to run, e.g. 'a' or 'ac' (default: abc)")
    ap.add_argument("--label", default=None, help="name the one variant run in the output (e.g. another checkout's (a))")
    args = ap.parse_args()
    device = torch.device(args.device)
    configure_worker(torch.get_num_threads())
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    results: dict[str, dict[str, float]] = {}
    runs: dict[str, BundleRun] = {}
    variants = {"a": ("(a) before: eager, generator masks", False, True),
                "b": ("(b) eager, padded batches, counter masks", True, False),
                "c": ("(c) after: CUDA graphs", True, True)}
    for key in args.only or "abc":
        name, graphs, capture = variants[key]
        run, data = bundle(args.config, args.k, args.train_size, device, graphs)
        for attr in ("captured", "captured_eval"):
            captured = getattr(run, attr, None)
            if captured is not None and not capture:
                captured.warm_sightings = 10**9  # never captured: the same batches op by op
        results[key] = measure(args.label or name, run, eval_split(data, args.eval), args.warm, args.steps)
        runs[key] = run
    if {"b", "c"} <= set(runs):
        gap = max(float((p - q).detach().abs().max()) for p, q in zip(runs["b"].model.parameters(), runs["c"].model.parameters(), strict=True))
        print(f"(c) vs (b) after {runs['c'].step} steps: largest parameter difference {gap:.3g}")
        print(f"training steps (b)/(c) = {results['b']['train'] / results['c']['train']:.2f}x (graphs over eager, same masks)")
    if {"a", "c"} <= set(results):
        a, c = results["a"], results["c"]
        print(f"evaluation (a)/(c) = {a['eval'] / c['eval']:.2f}x (the third evaluation: replayed in (c))")
        print(f"training steps (a)/(c) = {a['train'] / c['train']:.2f}x (before / after, K={args.k}, {args.device})")


if __name__ == "__main__":
    main()
