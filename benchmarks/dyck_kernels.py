"""Training throughput of the Dyck-1 RNN taggers: member-steps per second, batch size 1.

One *member-step* is one optimizer step of one seed (one sequence, batch size 1), so a
bundle of K members doing one step counts K. Every variant runs the whole per-step work
the trainer does: ``make_batch`` from the member's own random rows, then forward,
backward, clipping (off, as in the paper) and Adam.

Variants:

* ``plain``: a lone PyTorch script (nn.LSTM/GRU/RNN + nn.Linear + Adam), the notes' baseline;
* ``reference K=1``: the model's reference impl through the trainer's generic step;
* ``fast eager K=10``: the hand-written bundled cell, autograd, the trainer's generic step;
* ``fused K=10/50``: :class:`~trainables.models.rnn_tagger_fused.FusedStep` (forward +
  manual backward + Adam), uncompiled and ``torch.compile``'d (cold compile time shown).

Timing: one torch thread; each variant runs ``--windows`` windows of ``--steps`` steps
and reports the best window, by wall clock and by process CPU time (the CPU figure is
the one to trust on a busy machine). Run: ``python benchmarks/dyck_kernels.py --cells
lstm gru relu`` (add ``--no-compile`` to skip the compiled variants, each compile takes
about a minute).
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trainables.data import SeqTags, TaskData
from trainables.models.rnn_tagger import RNNTagger, RNNTaggerConfig
from trainables.seeding import torch_generator
from trainables.tasks.dyck import Dyck1, Dyck1Config

CPU = torch.device("cpu")
TORCH_RNN: dict[str, Callable[..., nn.Module]] = {
    "lstm": nn.LSTM,
    "gru": nn.GRU,
    "relu": functools.partial(nn.RNN, nonlinearity="relu"),
}


def train_cfg(compile: bool) -> SimpleNamespace:
    """The fields of the trainer's train config that the fused step reads (paper settings)."""
    return SimpleNamespace(
        optimizer="adam",
        lr=0.01,
        clip_norm=None,
        loss_reduction="mean",
        adam_betas=(0.9, 0.999),
        adam_eps=1e-8,
        weight_decay=0.0,
        compile=compile,
    )


def make_model(data: TaskData, cell: str, k: int, impl: str) -> RNNTagger:
    model = RNNTagger(RNNTaggerConfig.model_validate({"cell": cell, "impl": impl}), data.meta, k)
    for member in range(k):
        model.init_member(member, torch_generator(1000 + member))
    return model


def plain_step(cell: str, data: SeqTags) -> Callable[[np.ndarray], None]:
    """One step of a lone plain-PyTorch training script on row ``rows[0]``."""
    torch.manual_seed(0)
    rnn, lin = TORCH_RNN[cell](2, 1, batch_first=True), nn.Linear(1, 2)
    opt = torch.optim.Adam([*rnn.parameters(), *lin.parameters()], lr=0.01, foreach=False)

    def step(rows: np.ndarray) -> None:
        r = int(rows[0])
        x = F.one_hot(torch.from_numpy(data.x[r]), 2).float()[None]
        loss = F.mse_loss(torch.sigmoid(lin(rnn(x)[0])), torch.from_numpy(data.y[r])[None])
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def generic_step(model: RNNTagger, data: SeqTags) -> Callable[[list[np.ndarray]], None]:
    """The trainer's generic step: summed member losses, backward, stacked Adam."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01, foreach=False)
    active = torch.ones(model.k, dtype=torch.bool)

    def step(rows: list[np.ndarray]) -> None:
        batch = model.make_batch(data, rows, CPU)
        opt.zero_grad(set_to_none=True)
        losses = model.loss(batch, None, "mean")
        torch.where(active, losses, torch.zeros_like(losses)).sum().backward()
        opt.step()

    return step


def fused_step(
    model: RNNTagger, data: SeqTags, compile: bool
) -> Callable[[list[np.ndarray]], None]:
    fused = model.make_fused_step(train_cfg(compile))
    assert fused is not None
    active = torch.ones(model.k, dtype=torch.bool)

    def step(rows: list[np.ndarray]) -> None:
        fused(model.make_batch(data, rows, CPU), active)

    return step


def measure(
    step: Callable[..., None], k: int, n_train: int, steps: int, windows: int
) -> dict[str, float]:
    """Best-window member-steps/s (wall and CPU) and the first step's time (compile)."""
    rng = np.random.default_rng(0)

    def rows() -> list[np.ndarray]:
        return [rng.integers(0, n_train, 1) for _ in range(k)]

    t0 = time.perf_counter()
    step(rows())
    first = time.perf_counter() - t0
    for _ in range(10):
        step(rows())
    best_wall = best_cpu = float("inf")
    for _ in range(windows):
        plan = [rows() for _ in range(steps)]
        w, c = time.perf_counter(), time.process_time()
        for r in plan:
            step(r)
        best_wall = min(best_wall, time.perf_counter() - w)
        best_cpu = min(best_cpu, time.process_time() - c)
    return {"wall": k * steps / best_wall, "cpu": k * steps / best_cpu, "first_s": first}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cells", nargs="+", default=["lstm"], choices=sorted(TORCH_RNN))
    parser.add_argument("--steps", type=int, default=100, help="steps per timing window")
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled variants")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data_all = Dyck1(Dyck1Config()).build(0)
    train = data_all.splits["train"].data
    assert isinstance(train, SeqTags)
    n = len(train)
    print(
        f"torch {torch.__version__}, {args.threads} thread(s); Dyck-1 train set: {n} strings, "
        f"lengths 2-{data_all.meta['train_max_len']}; batch size 1, Adam"
    )
    print(
        f"{'cell':5} {'variant':22} {'member-steps/s (cpu)':>21} {'(wall)':>9} {'first step s':>13}"
    )
    for cell in args.cells:
        variants: list[tuple[str, int, Callable[..., None]]] = [
            ("plain nn script K=1", 1, lambda rows, s=plain_step(cell, train): s(rows[0])),
            ("reference K=1", 1, generic_step(make_model(data_all, cell, 1, "reference"), train)),
            ("fast eager K=10", 10, generic_step(make_model(data_all, cell, 10, "fast"), train)),
            ("fused K=10", 10, fused_step(make_model(data_all, cell, 10, "fast"), train, False)),
            ("fused K=50", 50, fused_step(make_model(data_all, cell, 50, "fast"), train, False)),
        ]
        if not args.no_compile:
            variants += [
                (
                    "fused compiled K=10",
                    10,
                    fused_step(make_model(data_all, cell, 10, "fast"), train, True),
                ),
                (
                    "fused compiled K=50",
                    50,
                    fused_step(make_model(data_all, cell, 50, "fast"), train, True),
                ),
            ]
        for name, k, step in variants:
            steps = max(20, args.steps // (5 if k == 1 else 1))
            res = measure(step, k, n, steps, args.windows)
            print(
                f"{cell:5} {name:22} {res['cpu']:21.0f} {res['wall']:9.0f} {res['first_s']:13.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
