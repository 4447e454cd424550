"""Seq2seq training and decoding throughput on one CPU thread.

Random data shaped like symbol rewriting (source length 5-10 over 40 symbols, target 3x
as long over 240, vocabularies with specials 43 -> 243), the paper model (embedding 32,
LSTM 32, bilinear attention, dropout 0.1), batch 64 per member, SGD lr 0.125 with
per-member clipping at 5, summed loss: the trainer's generic step.

Prints samples/s for training (bundle: seed-samples/s, i.e. K * 64 per step) for the
reference implementation (K=1) and the fast one (K=1, 8, 16; at K=8 with its CPU kernels
as torch ops and as compiled C, ``trainables/models/ckernels.py``: the LSTM layer, the
output layer's loss and argmax, the decoding attention), and the time to evaluate 17k
examples (lengths 1-15, as the six symbol-rewriting evaluation splits: teacher-forced
losses and greedy decoding, ``Model.evaluate_batch``) per member: reference, fast K=1,
and fast K=8 with 1,024 examples per batch and with the trainer's cap
(``Seq2Seq.eval_rows``), the latter with the kernels as torch ops and compiled. There is no
torch.compile variant: see ``trainables/models/seq2seq/cells.py`` for what it was measured
to do.

    python -m benchmarks.seq2seq_kernels [--steps 60] [--repeats 3] [--threads 1]
    python -m benchmarks.seq2seq_kernels --input-feeding   # the same with input feeding

(from the repository root). The machine should be otherwise idle: the "cpu" columns
(rates per second of this thread's CPU time) are steadier than wall clock under load,
but shared caches still slow a loaded machine down.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from trainables.data import SeqPairs, Vocab
from trainables.models import ckernels
from trainables.models.base import MemberNoise
from trainables.models.seq2seq import Seq2Seq, Seq2SeqConfig
from trainables.runtime import configure_worker
from trainables.seeding import torch_generator

BATCH = 64


def symbol_rewriting_like(n: int, lengths: tuple[int, int], seed: int) -> SeqPairs:
    """Random pairs: source length uniform in ``lengths`` over 40 symbols, target 3x over 240."""
    rng = np.random.default_rng(seed)
    src = [rng.integers(3, 43, rng.integers(lengths[0], lengths[1] + 1)) for _ in range(n)]
    tgt = [rng.integers(3, 243, 3 * len(s)) for s in src]
    return SeqPairs(src=src, tgt=tgt, ids=np.arange(n))


def meta() -> dict[str, object]:
    return {
        "src_vocab": Vocab.build([f"s{i}" for i in range(40)]),
        "tgt_vocab": Vocab.build([f"t{i}" for i in range(240)]),
        "max_src_len": 15,
        "max_tgt_len": 45,
        "decode_len": lambda lengths: 3 * np.asarray(lengths) + 1,
    }


def build(k: int, impl: str, feeding: bool = False) -> Seq2Seq:
    cfg = Seq2SeqConfig(impl=impl, input_feeding=feeding)  # type: ignore[arg-type]
    model = Seq2Seq(cfg, meta(), k)
    for i in range(k):
        model.init_member(i, torch_generator(1000 + i))
    return model


class TrainCase:
    """One model trained with the trainer's generic step on its own random batches."""

    def __init__(
        self, k: int, impl: str, data: SeqPairs, kernels: str = "fused", feeding: bool = False
    ) -> None:
        self.k, self.impl, self.data, self.kernels = k, impl, data, kernels
        self.model = build(k, impl, feeding)
        self.rngs = [np.random.default_rng(i) for i in range(k)]
        self.noise = MemberNoise([7 + i for i in range(k)])
        self.params = list(self.model.parameters())
        self.opt = torch.optim.SGD(self.params, lr=0.125, foreach=False)

    def step(self) -> None:
        k, model = self.k, self.model
        rows = model.train_layout(self.data, [r.integers(0, len(self.data), BATCH) for r in self.rngs])
        batch = model.make_batch(self.data, rows, torch.device("cpu"))
        self.opt.zero_grad(set_to_none=True)
        model.loss(batch, self.noise, "sum").sum().backward()
        grads = [p.grad for p in self.params if p.grad is not None]
        sq = torch.stack([g.reshape(k, -1).pow(2).sum(1) for g in grads]).sum(0)
        coef = (5.0 / (sq.sqrt() + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(coef.view(-1, *([1] * (g.dim() - 1))))
        self.opt.step()


def use_kernels(kernels: str) -> None:
    """The fast model's CPU kernels from now on: ``fused`` (compiled C) or ``torch_ops``."""
    os.environ[ckernels.SWITCH] = "1" if kernels == "fused" else "0"
    ckernels.cpu_kernels.cache_clear()


def train_rates(
    cases: list[TrainCase], steps: int, warmup: int, repeats: int
) -> list[tuple[float, float]]:
    """Seed-samples per second (wall clock, CPU time) of each case. The cases take turns,
    ``steps`` steps each, ``repeats`` times, and keep their best turn: every case sees
    the same machine load."""
    for case in cases:
        use_kernels(case.kernels)
        for _ in range(warmup):
            case.step()
    best = [(float("inf"), float("inf"))] * len(cases)
    for _ in range(repeats):
        for i, case in enumerate(cases):
            use_kernels(case.kernels)
            t0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(steps):
                case.step()
            wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
            best[i] = (min(best[i][0], wall), min(best[i][1], cpu))
    return [
        (steps * c.k * BATCH / w, steps * c.k * BATCH / c_)
        for c, (w, c_) in zip(cases, best, strict=True)
    ]


def decode_seconds(
    k: int, impl: str, chunk: int | None = None, kernels: str = "fused", feeding: bool = False
) -> tuple[float, float]:
    """(wall, CPU) seconds to evaluate 17k examples sorted by length (teacher-forced losses
    and greedy decoding, as the trainer does), ``chunk`` examples per batch (default: what
    the trainer uses, 1,024 capped at the model's ``eval_rows // k``)."""
    use_kernels(kernels)
    model = build(k, impl, feeding)
    if chunk is None:
        chunk = min(1024, max(1, (model.eval_rows or 1024 * k) // k))
    parts = [
        symbol_rewriting_like(n, lens, seed=10 + i)
        for i, (n, lens) in enumerate(
            [(2000, (5, 10))] * 2
            + [(2000, (1, 4)), (2000, (11, 15)), (5000, (3, 12)), (4000, (5, 10))]
        )
    ]
    data = SeqPairs(
        src=[s for p in parts for s in p.src],
        tgt=[t for p in parts for t in p.tgt],
        ids=np.arange(17_000),
    )
    order = np.argsort([len(s) for s in data.src], kind="stable")
    t0, c0 = time.perf_counter(), time.thread_time()
    with torch.no_grad():
        for start in reversed(range(0, len(order), chunk)):  # longest first, as the trainer
            rows = order[start : start + chunk]
            batch = model.make_batch(data, [rows] * k, torch.device("cpu"))
            model.evaluate_batch(batch)
    return time.perf_counter() - t0, time.thread_time() - c0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per turn")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--repeats", type=int, default=6, help="turns per case (best kept)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--no-decode", action="store_true", help="skip the decoding benchmark")
    parser.add_argument(
        "--input-feeding", action="store_true",
        help="the paper config with input feeding: reference K=1 against the fast path's "
        "bundled feeding (trainables/models/seq2seq/feeding.py) at K=1, 4, 8",
    )
    args = parser.parse_args()
    configure_worker(args.threads)
    data = symbol_rewriting_like(20_000, (5, 10), seed=1)
    feeding = args.input_feeding
    plan = [
        ("reference", 1, "fused"), ("fast", 1, "fused"), ("fast", 8, "torch_ops"),
        ("fast", 8, "fused"), ("fast", 16, "fused"),
    ]
    if feeding:
        plan = [("reference", 1, "fused"), ("fast", 1, "fused"), ("fast", 4, "fused"), ("fast", 8, "fused")]
    cases = [TrainCase(k, impl, data, kern, feeding) for impl, k, kern in plan]
    shown_cfg = "paper config" + (" with input feeding" if feeding else "")
    print(f"torch {torch.__version__}, {args.threads} thread(s), batch {BATCH}/member, {shown_cfg}")
    print(
        "training, seed-samples/s (K x 64 per step); 'cpu' = per second of this thread's CPU time"
    )
    print(f"{'impl':<10}{'kernels':<10}{'K':>4}{'wall':>10}{'cpu':>10}{'cpu/seed':>10}{'vs ref':>8}")
    rates = train_rates(cases, args.steps, args.warmup, args.repeats)
    for case, (wall, cpu) in zip(cases, rates, strict=True):
        ratio = cpu / rates[0][1]
        print(
            f"{case.impl:<10}{case.kernels if case.impl == 'fast' else '-':<10}{case.k:>4}{wall:>10,.0f}{cpu:>10,.0f}{cpu / case.k:>10,.0f}{ratio:>7.2f}x"
        )
    if not args.no_decode:
        print(
            "\nevaluation (example losses + greedy decoding) of 17k examples (6 splits), per member:"
        )
        decode_plan = [
            ("reference", 1, None, "fused"), ("fast", 1, None, "fused"), ("fast", 8, 1024, "fused"),
            ("fast", 8, None, "torch_ops"), ("fast", 8, None, "fused"),
        ]
        if feeding:
            decode_plan = [("reference", 1, None, "fused"), ("fast", 1, None, "fused"), ("fast", 8, None, "fused")]
        for impl, k, chunk, kern in decode_plan:
            wall, cpu = decode_seconds(k, impl, chunk, kern, feeding)
            rows = chunk or min(1024, (Seq2Seq.eval_rows or 1024 * k) // k)
            shown = kern if impl == "fast" else "-"
            print(f"{impl:<10}{shown:<10}{k:>4}  {rows:>5} examples/batch  wall {wall / k:5.2f} s  cpu {cpu / k:5.2f} s")


if __name__ == "__main__":
    main()
