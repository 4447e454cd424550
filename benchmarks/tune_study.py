"""Side-by-side benchmark of tuning: one candidate per trial vs candidates in bundles.

Two searches, each run two ways in one run through the real ``study tune`` path
(:func:`study.tuning.run_tuning` on a local Ray), over the same fixed list of candidates
(all of them enqueued, so the sampler proposes none and both ways train the same ones):

  (a) one candidate per Ray Tune trial (``tune.batch: 1``: a bundle of its K paired seeds);
  (b) ``tune.batch: B``: B candidates x K seeds as one bundle (per-member hyperparameters).

* Dyck-1 (El-Naggar et al. 2022's set-up, reduced): an LSTM of hidden size 1, batch 1,
  Adam with the fused step (``model.impl: fast``, no compile), searching ``train.lr``;
  objective: val loss. Batch-1 training is per-step overhead, so a bundle of B x K members
  costs about what one of K costs.
* symbol rewriting (Weber et al. 2018's model, reduced data): seq2seq with attention, SGD,
  searching ``train.lr`` and ``model.dropout``; objective: val_ood accuracy. On a CPU a
  thread's throughput grows little with the bundle (docs/performance.md).

Each side's wall time includes its Ray start (each ``study tune`` starts and stops a
local Ray); the time inside the Ray session is printed beside it. The last two lines print
speedup = one-candidate-per-trial wall / bundled wall, the symbol-rewriting one first and
the Dyck-1 one last. ``--tiny`` runs a smoke version (tiny data, 4 candidates).

    python benchmarks/tune_study.py                 # Dyck-1: 40 candidates, 20 per bundle;
                                                    # symbol rewriting: 20, 5 per bundle; 3 seeds
    python benchmarks/tune_study.py --only dyck1    # one search
    python benchmarks/tune_study.py --only symbol_rewriting --device cuda --cuda-graphs   # on a GPU

On a GPU (``--device cuda``: each trial asks Ray for the GPU, so trials run one after
another) a bundle's step costs about what a lone run's does (docs/performance.md, "GPU").
The Dyck-1 search keeps the CPU (batch 1, hidden size 1: its fused step is a CPU kernel).
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import yaml

import study.tuning
from study.config import parse
from study.tuning import run_tuning

ROOT = Path(__file__).resolve().parents[1]


def execution(device: str, cuda_graphs: bool) -> dict[str, Any]:
    """The searches' execution block: the CPU, or one GPU per trial."""
    if device == "cpu":
        return {"device": "cpu"}
    return {"device": device, "gpus_per_trial": 1, "cuda_graphs": cuda_graphs}


def dyck_search(candidates: int, seeds: int, train: int, epochs: int) -> dict[str, Any]:
    """The Dyck-1 search: elnaggar2022's LSTM config with a small dataset, lr candidates."""
    raw = yaml.safe_load((ROOT / "configs" / "elnaggar2022.yaml").read_text())
    cfg = {k: copy.deepcopy(raw[k]) for k in ("task", "model", "train")}
    cfg["task"].update({"train_size": train, "val_size": max(50, train // 4), "long_size": 50,
                        "very_long_size": 5, "very_long_len": 100, "very_long_sampler": "conditioned"})
    cfg["model"].update({"cell": "lstm", "impl": "fast", "compile": False})
    cfg["train"].update({"max_epochs": epochs, "curve_splits": ["train", "val"], "snapshot_epochs": [],
                         "predictions": False})
    lrs = np.geomspace(0.002, 0.05, candidates)
    return {
        **cfg,
        "seeds": {"root": 2022},
        "tune": {
            "space": {"train.lr": {"low": 0.001, "high": 0.1, "log": True}},
            "objective": {"split": "val", "metric": "loss"},
            "seeds_per_candidate": seeds,
            "trials": candidates,
            "enqueue": [{"train.lr": float(v)} for v in lrs],
        },
        "execution": {"device": "cpu"},
    }


def symbol_search(candidates: int, seeds: int, train: int, epochs: int, device: str = "cpu",
                  cuda_graphs: bool = False) -> dict[str, Any]:
    """The symbol-rewriting search: weber2018_tune's model on a reduced dataset, lr x dropout."""
    raw = yaml.safe_load((ROOT / "configs" / "weber2018_tune.yaml").read_text())
    cfg = {k: copy.deepcopy(raw[k]) for k in ("task", "model", "train")}
    cfg["task"].update({"train_size": train, "val_size": 200, "val_ood_size": 200, "test_size": 200})
    cfg["train"].update({"max_epochs": epochs, "selection": {"split": "val", "metric": "accuracy", "mode": "max",
                                                             "early_stop": False}})
    lrs = np.geomspace(0.05, 0.5, candidates)
    drops = [0.0, 0.1, 0.2, 0.3]
    return {
        **cfg,
        "seeds": {"root": 2018, "vary": ["init", "order", "dropout"]},
        "tune": {
            "space": {"train.lr": {"low": 0.01, "high": 1.0, "log": True},
                      "model.dropout": {"low": 0.0, "high": 0.5}},
            "objective": {"split": "val_ood", "metric": "accuracy"},
            "seeds_per_candidate": seeds,
            "trials": candidates,
            "enqueue": [{"train.lr": float(v), "model.dropout": drops[i % len(drops)]} for i, v in enumerate(lrs)],
        },
        "execution": execution(device, cuda_graphs),
    }


SESSION: dict[str, float] = {}
"""When the last Ray session was ready and when its work ended (``perf_counter``)."""
_RAY_SESSION = study.tuning.ray_session


@contextmanager
def _timed_session(*args: Any, **kwargs: Any) -> Iterator[dict[str, float]]:
    """``study.tuning``'s Ray session, noting when it is ready and when the search ends."""
    with _RAY_SESSION(*args, **kwargs) as resources:
        SESSION["ready"] = time.perf_counter()
        yield resources
        SESSION["end"] = time.perf_counter()


def timed(raw: dict[str, Any], batch: int, name: str, out: Path, cpus: int) -> tuple[float, float]:
    """(wall time, time inside the Ray session) of the search ``raw`` with ``tune.batch``."""
    cfg = parse({**raw, "tune": {**raw["tune"], "batch": batch}})
    study.tuning.ray_session = _timed_session  # type: ignore[assignment]
    try:
        t0 = time.perf_counter()
        counts = run_tuning(cfg, name, out, num_cpus=cpus)
        wall = time.perf_counter() - t0
    finally:
        study.tuning.ray_session = _RAY_SESSION
    assert counts["finished"] == raw["tune"]["trials"], counts
    return wall, SESSION["end"] - SESSION["ready"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3, help="paired seeds per candidate")
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--dyck-candidates", type=int, default=40)
    ap.add_argument("--dyck-batch", type=int, default=20, help="Dyck-1 candidates per bundle (bundled run)")
    ap.add_argument("--dyck-train", type=int, default=1000, help="Dyck-1 training sequences")
    ap.add_argument("--dyck-epochs", type=int, default=2)
    ap.add_argument("--symbol-candidates", type=int, default=20)
    ap.add_argument("--symbol-batch", type=int, default=5, help="symbol-rewriting candidates per bundle")
    ap.add_argument("--symbol-train", type=int, default=2000, help="symbol-rewriting training examples")
    ap.add_argument("--symbol-epochs", type=int, default=2)
    ap.add_argument("--only", choices=("dyck1", "symbol_rewriting"), default=None)
    ap.add_argument("--tiny", action="store_true", help="a smoke run: 4 candidates x 2 seeds, tiny data")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--device", default="cpu", help="the symbol-rewriting search's device (cuda: one GPU per trial)")
    ap.add_argument("--cuda-graphs", action="store_true", help="with --device cuda: execution.cuda_graphs")
    args = ap.parse_args()
    if args.tiny:
        args.seeds, args.dyck_candidates, args.symbol_candidates, args.dyck_batch, args.symbol_batch = 2, 4, 4, 2, 2
        args.dyck_train, args.dyck_epochs, args.symbol_train, args.symbol_epochs = 20, 1, 100, 1
    searches = {  # name -> (search, candidates per bundle)
        "symbol_rewriting": (
            symbol_search(args.symbol_candidates, args.seeds, args.symbol_train, args.symbol_epochs,
                          args.device, args.cuda_graphs),
            args.symbol_batch,
        ),
        "dyck1": (dyck_search(args.dyck_candidates, args.seeds, args.dyck_train, args.dyck_epochs), args.dyck_batch),
    }
    out = args.out or Path(tempfile.mkdtemp(prefix="fineline-tune-"))
    ratios: dict[str, float] = {}
    try:
        for name, (raw, batch) in searches.items():  # Dyck-1 last
            if args.only not in (None, name):
                continue
            wall_a, ray_a = timed(raw, 1, f"{name}_per_candidate", out, args.cpus)
            wall_b, ray_b = timed(raw, batch, f"{name}_bundled", out, args.cpus)
            ratios[name] = wall_a / wall_b
            n = raw["tune"]["trials"]
            where = f"{args.cpus} CPUs" + (f", {args.device}" if name == "symbol_rewriting" else "")
            print(f"{name} (a) one candidate per trial: wall {wall_a:.1f} s, {ray_a:.1f} s in Ray "
                  f"({n} candidates x {args.seeds} seeds, {where})")
            print(f"{name} (b) {batch} candidates per bundle: wall {wall_b:.1f} s, {ray_b:.1f} s in Ray "
                  f"(in-Ray ratio {ray_a / ray_b:.2f}x)")
        for name, ratio in ratios.items():
            print(f"{name}: speedup = per-candidate wall / bundled wall = {ratio:.2f}x")
    finally:
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
