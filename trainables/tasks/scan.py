"""SCAN (Lake & Baroni 2018), the "add primitive: jump" split, as used by Li et al. 2021.

The whole task is generated from its grammar; no download is needed::

    C -> S and S | S after S | S
    S -> V twice | V thrice | V
    V -> D opposite {left,right} | D around {left,right} | D {left,right} | U
    D -> U | turn
    U -> walk | look | run | jump

with the interpretation ``[[u left]] = LTURN [[u]]``, ``[[u opposite left]] = LTURN LTURN
[[u]]``, ``[[u around left]] = (LTURN [[u]]) x 4``, ``[[x twice]] = [[x]] [[x]]``,
``[[x1 and x2]] = [[x1]] [[x2]]`` and ``[[x1 after x2]] = [[x2]] [[x1]]`` (``turn``
contributes no action of its own). That is 34 verb phrases, 102 ``S`` and
102 + 2 * 102^2 = 20,910 commands: exactly the published ``tasks.txt``.

Settings (config ``setting``):

* ``"A"`` - the addprim_jump split: train on every command without ``jump`` (13,203) plus
  the bare ``jump`` command, which the published train file repeats 1,467 times (14,670
  lines); ``test_full`` is every other command containing ``jump`` (7,706).
* ``"B"`` - as in Li et al.'s code: train on all 20,910 commands, *test commands included*.
  Setting B removes the redundant correlation between ``jump`` and its contexts; its
  "test" splits are therefore NOT held out (they measure fit on training commands).

Splits: ``train`` (role train), ``train_eval`` (role val: ``n_curve`` rows of ``train``
drawn by the data seed, for per-step curves), ``test`` (role test: ``n_curve`` commands of
``test_full`` drawn by the data seed, for per-step curves) and ``test_full`` (role test:
all test commands, for the final evaluation). ``max_train`` / ``max_test`` shrink ``train``
/ ``test_full`` to random subsets for quick runs. ``ids`` are row indices into the parent
split: ``train`` and ``test_full`` number their own rows 0..N-1, ``train_eval`` carries
the ``train`` row of each example and ``test`` the ``test_full`` row, so the two can be
joined.

``end_symbol`` ends every command with the source vocabulary's ``</s>`` (EOS, id 2), as Li
et al.'s code does (see :class:`ScanConfig`); the targets, the metric and the decoding
length do not change.

Metric ``exact``: a prediction (an int array of generated target ids, possibly containing
EOS=2 and anything after it) is correct iff its first EOS sits right after the gold
action sequence and every token before it matches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import ValidationInfo, field_validator

from trainables.configbase import FrozenConfig, added_field
from trainables.data import EOS, SeqPairs, Split, TaskData, Vocab
from trainables.errors import ConfigError, DataError
from trainables.registry import TASKS
from trainables.tasks.base import Task, check_data_dir, check_files, decode_text

PRIMITIVES: dict[str, str] = {"walk": "I_WALK", "look": "I_LOOK", "run": "I_RUN", "jump": "I_JUMP"}
TURNS: dict[str, str] = {"left": "I_TURN_LEFT", "right": "I_TURN_RIGHT"}
COMMAND_WORDS: tuple[str, ...] = (
    *PRIMITIVES,
    "turn",
    *TURNS,
    "opposite",
    "around",
    "twice",
    "thrice",
    "and",
    "after",
)
ACTIONS: tuple[str, ...] = (*PRIMITIVES.values(), *TURNS.values())
SRC_VOCAB = Vocab.build(COMMAND_WORDS)
TGT_VOCAB = Vocab.build(ACTIONS)
HELD_OUT = "jump"
"""The primitive of the addprim split (seen in training only as the bare command)."""
PUBLISHED_FILES = {
    "all": "tasks.txt",
    "train": "tasks_train_addprim_jump.txt",
    "test": "tasks_test_addprim_jump.txt",
}

Pair = tuple[str, tuple[str, ...]]
"""(command, actions): a command as a space-joined string and its action tokens."""


def _verb_phrases() -> list[Pair]:
    """The 34 ``V`` phrases with their meanings, in a fixed order."""
    phrases: list[Pair] = [(u, (act,)) for u, act in PRIMITIVES.items()]
    doers: list[tuple[str, tuple[str, ...]]] = [(u, (a,)) for u, a in PRIMITIVES.items()]
    doers.append(("turn", ()))
    for direction, turn in TURNS.items():
        for word, act in doers:
            phrases.append((f"{word} {direction}", (turn, *act)))
            phrases.append((f"{word} opposite {direction}", (turn, turn, *act)))
            phrases.append((f"{word} around {direction}", (turn, *act) * 4))
    return phrases


def scan_commands() -> list[Pair]:
    """Every SCAN command with its action sequence (20,910 pairs), in grammar order."""
    sentences: list[Pair] = []
    for phrase, acts in _verb_phrases():
        sentences.append((phrase, acts))
        sentences.append((f"{phrase} twice", acts * 2))
        sentences.append((f"{phrase} thrice", acts * 3))
    commands = list(sentences)
    for left, left_acts in sentences:
        for right, right_acts in sentences:
            commands.append((f"{left} and {right}", left_acts + right_acts))
            commands.append((f"{left} after {right}", right_acts + left_acts))
    return commands


def parse_scan_file(path: Path) -> list[Pair]:
    """Read a published SCAN file (lines ``IN: <command> OUT: <actions>``)."""
    pairs: list[Pair] = []
    for lineno, line in enumerate(decode_text(path).splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        if not line.startswith("IN: ") or " OUT: " not in line:
            raise DataError(
                f"{path}:{lineno}: expected 'IN: <command> OUT: <actions>', got {line[:60]!r}; "
                "point task.data_dir at the published SCAN files"
            )
        command, actions = line[4:].split(" OUT: ", 1)
        if not command.split() or not actions.split():
            raise DataError(f"{path}:{lineno}: an empty command or action sequence")
        pairs.append((command.strip(), tuple(actions.split())))
    if not pairs:
        raise DataError(f"{path} holds no 'IN: <command> OUT: <actions>' lines")
    return pairs


def _is_addprim_test(command: str) -> bool:
    return HELD_OUT in command.split() and command != HELD_OUT


def addprim_split(commands: Sequence[Pair], repeats: int) -> tuple[list[Pair], list[Pair]]:
    """(train, test) of the addprim_jump split: train = commands without ``jump`` plus the
    bare ``jump`` repeated ``repeats`` times (appended last); test = the other ``jump`` commands."""
    train = [p for p in commands if HELD_OUT not in p[0].split()]
    bare = [p for p in commands if p[0] == HELD_OUT]
    test = [p for p in commands if _is_addprim_test(p[0])]
    return train + bare * repeats, test


@dataclass(frozen=True)
class FixedDecodeLen:
    """``meta["decode_len"]`` for SCAN: every example decodes ``steps`` greedy steps."""

    steps: int

    def __call__(self, src_lengths: np.ndarray) -> np.ndarray:
        return np.full(len(src_lengths), self.steps, dtype=np.int64)


def _encode(pairs: Sequence[Pair], ids: np.ndarray, end_symbol: bool = False) -> SeqPairs:
    """``pairs`` as vocab ids; with ``end_symbol`` every source ends with EOS."""
    src_index, tgt_index = SRC_VOCAB.index, TGT_VOCAB.index
    end = [EOS] if end_symbol else []
    try:
        src = [np.array([src_index[w] for w in c.split()] + end, dtype=np.int64) for c, _ in pairs]
        tgt = [np.array([tgt_index[a] for a in acts], dtype=np.int64) for _, acts in pairs]
    except KeyError as exc:
        raise DataError(
            f"unknown SCAN token {exc.args[0]!r}: commands use {COMMAND_WORDS}, actions "
            f"{ACTIONS}; check the files in task.data_dir"
        ) from exc
    return SeqPairs(src=src, tgt=tgt, ids=ids)


def _subset(data: SeqPairs, rows: np.ndarray) -> SeqPairs:
    return SeqPairs(
        src=[data.src[r] for r in rows], tgt=[data.tgt[r] for r in rows], ids=data.ids[rows]
    )


def _some_rows(rng: np.random.Generator, n: int, keep: int | None) -> np.ndarray:
    """``keep`` distinct rows of ``n`` (all if ``keep`` is None or larger), sorted."""
    if keep is None or keep >= n:
        return np.arange(n)
    return np.sort(rng.permutation(n)[:keep])


def exact_match(prediction: Any, target: np.ndarray) -> bool:
    """True iff ``prediction`` truncated at its first EOS equals ``target`` and EOS is present."""
    pred = np.asarray(prediction).reshape(-1)
    eos = np.flatnonzero(pred == EOS)
    n = len(target)
    return bool(eos.size > 0 and eos[0] == n and np.array_equal(pred[:n], target))


class ScanConfig(FrozenConfig):
    """SCAN task settings."""

    setting: Literal["A", "B"] = "A"
    """"A": train on the addprim_jump train set (no jump contexts); "B": train on all
    20,910 commands, the test commands included (B is not a held-out test)."""
    data_dir: str | None = None
    """Optional folder with the published files (tasks.txt, tasks_train_addprim_jump.txt,
    tasks_test_addprim_jump.txt); when given, the splits are read from them instead of
    generated from the grammar."""
    jump_repeats: int = 1467
    """Setting A, generated data: how many times the bare `jump` command appears in train
    (the published train file has 1,467)."""
    n_curve: int = 100
    """Size of the fixed `train_eval` and `test` samples evaluated for per-step curves."""
    max_train: int | None = None
    """Keep only this many `train` lines (a subset drawn by the data seed, in file order);
    null keeps all. For quick runs and tests, not for paper results."""
    max_test: int | None = None
    """Keep only this many `test_full` commands (drawn like `max_train`); null keeps all."""
    end_symbol: bool = added_field(False)
    """End every command with an end-of-input token, the source vocabulary's ``</s>`` (EOS,
    id 2; a learned embedding row like any word), in generated and loaded data alike:
    sources and ``max_src_len`` grow by 1. Li et al.'s code does this (data_generator.py,
    ``Formarter.padding``: ``x_len = len + 1``, the extra position holding id 0, their
    padding/EOS id, which has its own embedding row; main.py subtracts the 1 only with
    ``--remove_x_eos``, which their SCAN scripts do not set), so their BiLSTM reads it
    last (first in the backward direction) and attention can attend to it. Targets,
    scoring and decoding lengths do not change."""

    @field_validator("jump_repeats", "n_curve", "max_train", "max_test")
    @classmethod
    def _positive(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value < 1:
            raise ConfigError(f"task.{info.field_name}", f"is {value}", "use a value >= 1")
        return value


@TASKS.register
class Scan(Task):
    """SCAN add-primitive-jump (setting A) or all commands (setting B); see module docstring."""

    name: ClassVar[str] = "scan"
    Config: ClassVar[type[FrozenConfig]] = ScanConfig
    data_kind = "seq2seq"
    primary_metric: ClassVar[str] = "exact"
    metrics: ClassVar[tuple[str, ...]] = ("exact",)
    tiny: ClassVar[dict[str, Any]] = {"max_train": 128, "max_test": 32, "n_curve": 16}
    tiny_train: ClassVar[dict[str, Any]] = {
        "optimizer": "adam",
        "lr": 1e-3,
        "batch_size": 16,
        "selection": {"split": "train_eval", "metric": "exact"},
    }

    config: ScanConfig

    def _files_needed(self) -> list[str]:
        setting_a = self.config.setting == "A"
        return [PUBLISHED_FILES["train" if setting_a else "all"], PUBLISHED_FILES["test"]]

    def check(self, data_dir_required: bool = False) -> None:
        """Raise ConfigError if ``data_dir`` is needed but unset, lacks a published file, or a
        file is malformed (not UTF-8, not ``IN: ... OUT: ...`` lines, unknown words)."""
        self._check_paths(data_dir_required)
        if self.config.data_dir is not None:
            check_files(self._read_files, "SCAN")

    def _check_paths(self, data_dir_required: bool = False) -> None:
        check_data_dir(
            self.config.data_dir, self._files_needed(), "SCAN",
            required=data_dir_required, fallback="generate the data from the grammar",
        )

    def _read_files(self) -> None:
        for pairs in self._pairs():
            _encode(pairs, np.arange(len(pairs)), self.config.end_symbol)

    def _pairs(self) -> tuple[list[Pair], list[Pair]]:
        """(train, test) pairs, generated or read from ``data_dir``."""
        self._check_paths()
        if self.config.data_dir is not None:
            train_file, test_file = self._files_needed()
            root = Path(self.config.data_dir)
            return parse_scan_file(root / train_file), parse_scan_file(root / test_file)
        commands = scan_commands()
        train, test = addprim_split(commands, self.config.jump_repeats)
        return (train if self.config.setting == "A" else commands), test

    def build(self, data_seed: int) -> TaskData:
        train_pairs, test_pairs = self._pairs()
        every = [*train_pairs, *test_pairs]  # lengths from the full splits, even when subsetted
        max_src = max(len(command.split()) for command, _ in every) + int(self.config.end_symbol)
        max_tgt = max(len(actions) for _, actions in every)
        seeds = [np.random.default_rng(s) for s in np.random.SeedSequence(data_seed).spawn(4)]
        cfg = self.config
        train_pairs = [
            train_pairs[i] for i in _some_rows(seeds[2], len(train_pairs), cfg.max_train)
        ]
        test_pairs = [test_pairs[i] for i in _some_rows(seeds[3], len(test_pairs), cfg.max_test)]
        train = _encode(train_pairs, np.arange(len(train_pairs)), cfg.end_symbol)
        test_full = _encode(test_pairs, np.arange(len(test_pairs)), cfg.end_symbol)
        train_rows = _some_rows(seeds[0], len(train), cfg.n_curve)
        test_rows = _some_rows(seeds[1], len(test_full), cfg.n_curve)
        splits = [
            Split("train", "train", train),
            Split("train_eval", "val", _subset(train, train_rows)),
            Split("test", "test", _subset(test_full, test_rows)),
            Split("test_full", "test", test_full),
        ]
        meta = {
            "src_vocab": SRC_VOCAB,
            "tgt_vocab": TGT_VOCAB,
            "max_src_len": max_src,
            "max_tgt_len": max_tgt,
            "decode_len": FixedDecodeLen(max_tgt + 1),
            "setting": self.config.setting,
        }
        return TaskData(splits={s.name: s for s in splits}, meta=meta)

    def score(self, split: Split, predictions: Sequence[Any]) -> dict[str, np.ndarray]:
        data = split.data
        assert isinstance(data, SeqPairs)
        if len(predictions) != len(data):
            raise ValueError(f"{len(predictions)} predictions for {len(data)} examples")
        exact = [exact_match(p, t) for p, t in zip(predictions, data.tgt, strict=True)]
        return {"exact": np.asarray(exact, dtype=np.float64)}

    def render(self, split: Split, prediction: Any, index: int | None = None) -> str:
        """Action tokens up to the first EOS (``<no eos>`` appended when there is none)."""
        pred = [int(i) for i in np.asarray(prediction).reshape(-1)]
        stop = pred.index(EOS) if EOS in pred else len(pred)
        tokens = [TGT_VOCAB.tokens[i] if 0 <= i < len(TGT_VOCAB) else f"<{i}>" for i in pred[:stop]]
        return " ".join(tokens) + ("" if stop < len(pred) else " <no eos>")

    def analysis(self) -> dict[str, Any]:
        """Seed histogram and correlations on ``test_full``; curves on the 100-example samples."""
        return {
            "metric_definitions": {
                "exact": "share of commands whose greedy decoding reproduces the whole action sequence",
                "tf_exact": "share of commands where, fed the gold prefix, the argmax is right at every position",
                "tf_token": "share of target positions whose argmax is right, fed the gold prefix",
                "loss": "cross-entropy summed over the command's target tokens",
            },
            "primary_metric": "exact",
            "test_splits": ["test_full"],
            "histograms": [{"split": "test_full", "metric": "exact"}],
            "scatter": [["train_eval", "exact"], ["test_full", "exact"]],
            "charts": [
                {"type": "curve", "splits": ["train_eval", "test"], "metric": "exact"},
                # present when the model scores it (seq2seq ``teacher_forced_exact``)
                {"type": "curve", "splits": ["train_eval", "test"], "metric": "tf_exact"},
                {"type": "curve", "splits": ["train_eval", "test"], "metric": "tf_token"},
            ],
        }
