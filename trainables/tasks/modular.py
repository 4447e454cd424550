"""Modular arithmetic, the grokking task (Power et al. 2022; Nanda et al. 2023).

Every pair ``(a, b)`` with ``0 <= a, b < p`` (``b != 0`` for division) is one example: the
prompt ``a op b =`` (``a b =`` without ``op_token``, as in Nanda et al.'s code) and the
answer ``c = (a op b) mod p``, a single token. The pairs are split once, by the data seed,
into ``train`` (a fraction ``train_fraction`` of them, rounded down as in Nanda et al.'s
``gen_train_test``) and ``test`` (all the others): a model that only memorises its training
pairs scores chance on the test pairs, one that found the algorithm scores 1.

Operations (``op``), as in Power et al.'s Figure / appendix (mod a prime ``p``): ``+``,
``-``, ``*``, ``/`` (``a * b^-1``, ``b != 0``; needs ``p`` prime), ``x2+y2``, ``x2+xy+y2``,
``x2+xy+y2+x``, ``x3+xy``, ``x3+xy2+y`` (``x`` = a, ``y`` = b).

Vocabularies: the source holds the numbers ``0 .. p-1``, the operation's symbol and ``=``;
the target the numbers. Data kind ``seq2seq`` (:class:`~trainables.data.SeqPairs`), so any
seq2seq model trains on it; the grokking studies use the ``transformer`` with ``bos:
false`` and ``eos: false`` (the answer predicted at ``=``, the loss on it alone).

Metric ``accuracy``: the greedy answer (cut at its first ``</s>``) is the one token ``c``.
Declared for analysis (:meth:`ModularArithmetic.analysis`): the events ``memorizes`` (train
accuracy >= ``memorized_accuracy``) and ``groks`` (test accuracy >= ``grokked_accuracy`` at
or after the first evaluation where train accuracy had reached ``memorized_accuracy``),
read from the per-step curves: times to an event, right-censored at the step budget
(``study analyze``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from trainables.configbase import FrozenConfig
from trainables.data import EOS, SPECIALS, Role, SeqPairs, Split, TaskData, Vocab, padded_rows
from trainables.errors import ConfigError
from trainables.registry import TASKS
from trainables.tasks.base import Task

Op = Literal["+", "-", "*", "/", "x2+y2", "x2+xy+y2", "x2+xy+y2+x", "x3+xy", "x3+xy2+y"]

OPS: dict[str, Callable[[np.ndarray, np.ndarray, int], np.ndarray]] = {
    "+": lambda x, y, p: (x + y) % p,
    "-": lambda x, y, p: (x - y) % p,
    "*": lambda x, y, p: (x * y) % p,
    "/": lambda x, y, p: (x * inverses(p)[y]) % p,
    "x2+y2": lambda x, y, p: (x * x + y * y) % p,
    "x2+xy+y2": lambda x, y, p: (x * x + x * y + y * y) % p,
    "x2+xy+y2+x": lambda x, y, p: (x * x + x * y + y * y + x) % p,
    "x3+xy": lambda x, y, p: (x * x % p * x + x * y) % p,
    "x3+xy2+y": lambda x, y, p: (x * x % p * x + x * (y * y % p) + y) % p,
}
"""``op`` -> c(a, b, p) on int64 arrays (the operands are reduced mod p before products grow)."""


def is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, int(n**0.5) + 1))


def inverses(p: int) -> np.ndarray:
    """``inv[b] = b^-1 mod p`` for ``b = 1 .. p-1`` (``inv[0] = 0``, unused); ``p`` prime."""
    inv = np.zeros(p, dtype=np.int64)
    inv[1:] = [pow(b, -1, p) for b in range(1, p)]
    return inv


def all_pairs(p: int, op: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every example in (a, b) order: a (N,), b (N,), c (N,) int64 (``b != 0`` for ``/``)."""
    a, b = (g.ravel() for g in np.meshgrid(np.arange(p), np.arange(p), indexing="ij"))
    if op == "/":
        a, b = a[b != 0], b[b != 0]
    return a, b, OPS[op](a, b, p)


class ModularConfig(FrozenConfig):
    """Modular arithmetic settings (defaults: Power et al.'s p = 97, a + b)."""

    p: int = Field(97, ge=2, le=10_000)
    """The modulus; prime for ``/`` (Power et al.: 97; Nanda et al.: 113)."""
    op: Op = "+"
    """The operation (see the module docstring): +, -, *, /, x2+y2, x2+xy+y2, x2+xy+y2+x,
    x3+xy, x3+xy2+y."""
    train_fraction: float = Field(0.3, gt=0, lt=1)
    """Share of all pairs in the training split, drawn by the data seed (Nanda et al.: 0.3)."""
    op_token: bool = True
    """Prompt ``a op b =`` (Power et al.); false: ``a b =`` (Nanda et al.'s code)."""
    memorized_accuracy: float = Field(0.99, gt=0, le=1)
    """Train accuracy at which a run has memorised (the event ``memorizes``, and what ``groks``
    waits for)."""
    grokked_accuracy: float = Field(0.95, gt=0, le=1)
    """Test accuracy at which a run that had memorised groks (the event ``groks``)."""

    @model_validator(mode="after")
    def _valid(self) -> ModularConfig:
        if self.op == "/" and not is_prime(self.p):
            raise ConfigError(
                "task.p", f"{self.p} is not prime, so some b have no inverse mod p for op '/'",
                "use a prime modulus (e.g. 97 or 113)",
            )
        n = self.p * (self.p - 1) if self.op == "/" else self.p * self.p
        if not 1 <= int(self.train_fraction * n) < n:
            raise ConfigError(
                "task.train_fraction", f"{self.train_fraction} of {n} pairs leaves an empty split",
                f"use a fraction between {1 / n:.3g} and {(n - 1) / n:.3g}",
            )
        return self


@TASKS.register
class ModularArithmetic(Task):
    """``a op b mod p`` with a random train/test split of all pairs (see the module docstring)."""

    name: ClassVar[str] = "modular"
    Config: ClassVar[type[FrozenConfig]] = ModularConfig
    data_kind = "seq2seq"
    primary_metric: ClassVar[str] = "accuracy"
    metrics: ClassVar[tuple[str, ...]] = ("accuracy",)
    tiny: ClassVar[dict[str, Any]] = {"p": 7, "train_fraction": 0.5}
    tiny_train: ClassVar[dict[str, Any]] = {
        "optimizer": "adamw", "lr": 0.01, "weight_decay": 0.1, "adam_betas": (0.9, 0.98),
        "warmup_steps": 2, "batch_size": 24, "max_steps": 6, "eval_every_steps": 3,
        "curve_splits": ["train", "test"], "selection": {"mode": "last", "early_stop": False},
    }  # fmt: skip
    """Full batch (24 of the 49 pairs), AdamW with a warmup, as the grokking studies train."""

    config: ModularConfig

    def __init__(self, config: FrozenConfig) -> None:
        super().__init__(config)
        cfg = self.config
        numbers = [str(i) for i in range(cfg.p)]
        self.src_vocab = Vocab.build([*numbers, cfg.op, "="])
        self.tgt_vocab = Vocab.build(numbers)

    def prompts(self, a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
        """Source ids of ``a op b =`` (``a b =``) per pair."""
        idx = self.src_vocab.index
        a_id, b_id = a + len(SPECIALS), b + len(SPECIALS)
        cols = [a_id, np.full_like(a, idx[self.config.op]), b_id] if self.config.op_token else [a_id, b_id]
        rows = np.stack([*cols, np.full_like(a, idx["="])], axis=1)
        return list(rows)

    def build(self, data_seed: int) -> TaskData:
        cfg = self.config
        a, b, c = all_pairs(cfg.p, cfg.op)
        n = len(a)
        perm = np.random.default_rng(data_seed).permutation(n)
        n_train = int(cfg.train_fraction * n)
        src, offset = self.prompts(a, b), len(SPECIALS)
        splits = {}
        for name, rows in (("train", np.sort(perm[:n_train])), ("test", np.sort(perm[n_train:]))):
            pairs = SeqPairs(
                src=[src[i] for i in rows], tgt=[np.array([c[i] + offset]) for i in rows],
                ids=a[rows] * cfg.p + b[rows],
            )  # fmt: skip
            splits[name] = Split(name, "train" if name == "train" else "test", pairs)
        meta = {
            "src_vocab": self.src_vocab, "tgt_vocab": self.tgt_vocab,
            "max_src_len": 4 if cfg.op_token else 3, "max_tgt_len": 1,
        }  # fmt: skip
        return TaskData(splits=splits, meta=meta)

    def split_roles(self) -> dict[str, Role]:
        return {"train": "train", "test": "test"}

    def score(self, split: Split, predictions: Sequence[Any]) -> dict[str, np.ndarray]:
        """``accuracy``: 1 where the prediction, cut at its first ``</s>``, is the answer token."""
        data = split.data
        if not isinstance(data, SeqPairs):
            raise TypeError(f"split {split.name} holds {type(data).__name__}, not SeqPairs")
        if len(predictions) != len(data):
            raise ValueError(f"{len(predictions)} predictions for a split of {len(data)} examples")
        pred = padded_rows(predictions, 2)  # (N, 2): the answer, then </s> or nothing (-1)
        gold = np.array([t[0] for t in data.tgt], dtype=np.int64)
        return {"accuracy": ((pred[:, 0] == gold) & np.isin(pred[:, 1], (EOS, -1))).astype(np.float64)}

    def render(self, split: Split, prediction: Any, index: int | None = None) -> str:
        """The predicted tokens up to the first ``</s>``, as numbers."""
        out = []
        for t in np.asarray(prediction, dtype=np.int64):
            if t == EOS:
                break
            out.append(self.tgt_vocab.tokens[t] if 0 <= t < len(self.tgt_vocab) else "?")
        return " ".join(out)

    def analysis(self) -> dict[str, Any]:
        """The two events of grokking, read from the per-step train and test curves."""
        cfg = self.config
        memorized = {"split": "train", "metric": "accuracy", "op": ">=", "threshold": cfg.memorized_accuracy}
        return {
            "metric_definitions": {
                "accuracy": f"share of pairs (a, b) whose greedy answer is (a {cfg.op} b) mod {cfg.p}",
                "oracle_exact": "the same with the answer's length given (one token here: the same)",
                "loss": "cross-entropy of the answer token",
            },
            "primary_metric": "accuracy",
            "histograms": [{"split": "test", "metric": "accuracy"}],
            "events": [
                {"name": "memorizes", **memorized},
                {"name": "groks", "split": "test", "metric": "accuracy", "op": ">=",
                 "threshold": cfg.grokked_accuracy, "after": memorized},
            ],
        }  # fmt: skip
