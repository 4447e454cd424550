"""Side-by-side benchmark of the Dyck-1 study: one trial per seed vs bundled seeds.

Runs the same `elnaggar2022`-shaped study (LSTM, GRU and ReLU cells, each with its seeds)
two ways in one run through the real `study run` path:

  (a) per seed: one Ray Tune trial per seed, plain ``nn.LSTM``/``nn.GRU``/``nn.RNN``
      (``model.impl: reference``, ``bundle_size: 1``);
  (b) bundled: each cell type's seeds as bundles (``bundle_size: auto``) with the fused
      fast path (``model.impl: fast``; ``--compile`` adds torch.compile).

Sizes are reduced for the side-by-side run (``--train``, ``--epochs``, ``--seeds``); the
last line prints speedup = per-seed wall time / bundled wall time. ``--full`` runs the
whole configs/elnaggar2022.yaml study bundled and prints its wall time.

    python benchmarks/dyck_study.py                  # 3 cells x 6 seeds, 1,000 sequences, 2 epochs
    python benchmarks/dyck_study.py --full --compile # the paper-scale study
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from study.config import parse
from study.runner import run_study

ROOT = Path(__file__).resolve().parents[1]


def reduced(raw: dict[str, Any], seeds: int, train: int, epochs: int, fast: bool, compile_: bool) -> dict[str, Any]:
    cfg = copy.deepcopy(raw)
    cfg.pop("name", None)
    cfg["task"].update({"train_size": train, "val_size": max(100, train // 4), "long_size": max(100, train // 4),
                        "very_long_size": 10})
    cfg["train"].update({"max_epochs": epochs, "snapshot_epochs": [1]})
    cfg["model"].update({"impl": "fast" if fast else "reference", "compile": compile_ and fast})
    for overrides in cfg["grid"]["model.cell"].values():
        overrides["seeds.count"] = seeds
    cfg["execution"] = {"bundle_size": "auto" if fast else 1, "device": "cpu"}
    return cfg


def timed(raw: dict[str, Any], name: str, out: Path, cpus: int) -> float:
    t0 = time.perf_counter()
    run_study(parse(raw), name, out, num_cpus=cpus)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=6, help="seeds per cell type in the side-by-side run")
    ap.add_argument("--train", type=int, default=1000, help="training sequences in the side-by-side run")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--full", action="store_true", help="run configs/elnaggar2022.yaml bundled, report wall time")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    raw = yaml.safe_load((ROOT / "configs" / "elnaggar2022.yaml").read_text())
    out = args.out or Path(tempfile.mkdtemp(prefix="fineline-dyck-"))
    try:
        if args.full:
            raw["model"]["compile"] = args.compile or raw["model"].get("compile", False)
            raw.pop("name", None)
            wall = timed(raw, "elnaggar2022", out, args.cpus)
            print(f"full elnaggar2022 study (50 runs x 30 epochs, snapshots, all tests): wall {wall:.1f} s ({wall / 60:.1f} min)")
            return
        wall_a = timed(reduced(raw, args.seeds, args.train, args.epochs, False, False), "per_seed", out, args.cpus)
        wall_b = timed(reduced(raw, args.seeds, args.train, args.epochs, True, args.compile), "bundled", out, args.cpus)
        steps = 3 * args.seeds * args.train * args.epochs
        print(f"(a) one trial per seed, nn.RNN reference: wall {wall_a:.1f} s, {steps / wall_a:,.0f} member-steps/s")
        print(f"(b) bundled fused (compile={args.compile}): wall {wall_b:.1f} s, {steps / wall_b:,.0f} member-steps/s")
        print(f"speedup = per-seed wall / bundled wall = {wall_a / wall_b:.2f}x")
    finally:
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
