"""Zhou et al. (2023)'s length-generalization tasks: every target against a plain-Python
reference, the length of every test split, the index-hint and scratchpad formats, the
determinism of the data, the scoring of free-running answers, refused configs, and the
declaration of the length_generalization aggregate."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np
import pytest

from trainables.data import EOS, TokenRows
from trainables.errors import ConfigError
from trainables.registry import TASKS
from trainables.spec import RunSpec
from trainables.tasks.length_gen import LengthGen, LengthGenConfig, length_split, score_answers
from trainables.tasks.length_gen_data import KINDS


def task(**cfg: Any) -> LengthGen:
    return LengthGen(LengthGenConfig(**cfg))


def _hinted(tokens: list[str]) -> tuple[list[int], list[str]]:
    """``h3 0 h4 4`` -> hint numbers [3, 4] and values ['0', '4'] (pairs hint, value)."""
    assert len(tokens) % 2 == 0 and all(re.fullmatch(r"h\d+", h) for h in tokens[0::2]), tokens
    return [int(h[1:]) for h in tokens[0::2]], tokens[1::2]


def reference(cfg: LengthGenConfig, src: list[str]) -> tuple[int, list[str]]:
    """(length, target tokens) of a source, straight from the task definitions (plain Python)."""
    kind = cfg.kind
    if kind == "count":
        a, b = map(int, src)
        return b - a + 1, [str(i) for i in range(a, b + 1)]
    if kind in ("sort", "copy_unique"):
        assert len(set(src)) == len(src), "inputs of distinct numbers"
        return len(src), sorted(src, key=int) if kind == "sort" else list(src)
    if kind == "copy_repeat":
        return len(src), list(src)
    if kind == "mode":
        counts = Counter(src).most_common()
        assert len(counts) == 1 or counts[0][1] > counts[1][1], f"the mode of {src} is not unique"
        return len(src), [counts[0][0]]
    if kind == "parity":
        hints, bits = _hinted(src) if cfg.index_hints else ([], src)
        running, p = [], 0
        for b in bits:
            p ^= int(b)
            running.append(str(p))
        answer = running if cfg.scratchpad else [running[-1]]
        if cfg.index_hints:
            assert hints == list(range(hints[0], hints[0] + len(bits))), "consecutive hints"
            if cfg.scratchpad:
                answer = [t for h, r in zip(hints, running, strict=True) for t in (f"h{h}", r)]
        return len(bits), answer
    assert kind == "addition"
    plus = src.index("+")
    left, right = src[:plus], src[plus + 1 :]
    if cfg.index_hints:
        (hl, left), (hr, right) = _hinted(left), _hinted(right)
        assert hl == hr == list(range(hl[0], hl[0] + len(left))), "both operands share consecutive hints"
    assert left[0] == right[0] == "0" and len(left) == len(right), "operands padded to L+1 digits"
    digits = list(str(int("".join(left)) + int("".join(right))).rjust(len(left), "0"))
    if cfg.index_hints:
        pairs = [[f"h{h}", d] for h, d in zip(hl, digits, strict=True)]
        pairs = pairs[::-1] if cfg.reverse_output else pairs
        return len(left) - 1, [t for p in pairs for t in p]
    return len(left) - 1, digits[::-1] if cfg.reverse_output else digits


FORMATS = [
    {"kind": "count"}, {"kind": "sort"}, {"kind": "copy_unique"}, {"kind": "mode"},
    {"kind": "mode", "n_symbols": 3}, {"kind": "copy_repeat"}, {"kind": "parity"},
    {"kind": "parity", "scratchpad": True}, {"kind": "parity", "index_hints": True},
    {"kind": "parity", "index_hints": True, "scratchpad": True}, {"kind": "addition"},
    {"kind": "addition", "reverse_output": True}, {"kind": "addition", "index_hints": True},
    {"kind": "addition", "index_hints": True, "reverse_output": True},
    {"kind": "addition", "index_hints": True, "hint_offsets": False},
]  # fmt: skip


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: "-".join(str(v) for v in f.values()))
def test_every_target_equals_the_reference_and_every_split_has_its_lengths(fmt: dict[str, Any]) -> None:
    t = task(**fmt, train_lengths=(1, 8), train_size=1500, test_size=40)
    d = t.build(3)
    cfg = t.config
    assert set(d.splits) == {"train", "val", "val_ood", *(length_split(n) for n in range(1, 17))}
    assert {s: sp.role for s, sp in d.splits.items()} == t.split_roles()
    seen: set[int] = set()
    for name, split in d.splits.items():
        lengths = []
        for i in range(len(split)):
            src, tgt = t.render_example(d, split, i)
            length, want = reference(cfg, src.split())
            assert tgt.split() == want, (name, src)
            lengths.append(length)
        fixed = {"train": (1, 8), "val": (1, 8), "val_ood": (9, 10)}
        lo, hi = fixed[name] if name in fixed else (int(name.removeprefix("len_")),) * 2
        assert min(lengths) == lo and max(lengths) == hi, name
        if name == "train":
            seen = set(lengths)
    assert seen == set(range(1, 9))  # every training length occurs
    assert d.meta["max_src_len"] == max(len(s) for sp in d.splits.values() for s in sp.data.src)
    assert d.meta["max_tgt_len"] == max(len(s) for sp in d.splits.values() for s in sp.data.tgt)


def test_modes_are_unique_and_every_symbol_is_a_mode_somewhere() -> None:
    d = task(kind="mode", n_symbols=4, train_size=4000).build(0)
    answers = Counter(d.splits["train"].data.tgt[i][0] for i in range(4000))
    assert len(answers) == 4 and min(answers.values()) > 700  # uniform over the 4 symbols, roughly


def test_hint_offsets_put_every_hint_token_into_training() -> None:
    cfg = {"kind": "addition", "index_hints": True, "train_lengths": (1, 5), "train_size": 2000}
    on, off = task(**cfg), task(**cfg, hint_offsets=False)
    # the longest example (length 10 in len_10) has 11 positions: h0 .. h10
    assert on.config.n_hints == 11 and on.src_vocab.tokens[-1] == "h10"
    for t, expected in ((on, {f"h{i}" for i in range(11)}), (off, {f"h{i}" for i in range(6)})):
        d = t.build(0)
        hints = {tok for i in range(2000) for tok in t.render_example(d, d.train, i)[0].split() if tok[0] == "h"}
        assert hints == expected
    d = off.build(0)
    assert d.splits["len_10"].data.src[0][0] == off.src_vocab.index["h0"]


def test_random_start_keeps_every_example_within_the_positions_training_reaches() -> None:
    t = task(kind="copy_unique", train_lengths=(1, 6), random_start=5, train_size=3000, test_size=200)
    d = t.build(0)
    starts: dict[str, Counter[int]] = {}
    for name, split in d.splits.items():
        for i in range(len(split)):
            src, tgt = t.render_example(d, split, i)
            tokens = src.split()
            k = next(j for j, tok in enumerate(tokens) if tok != "_")
            assert "_" not in tokens[k:], "filler only before the example"
            assert reference(t.config, tokens[k:])[1] == tgt.split()
            # a copy of length L has 2L tokens; training reaches 5 + 2 * 6 positions (a longer
            # example than that starts at once)
            assert k + len(tokens[k:]) + len(tgt.split()) <= 5 + 12 or k == 0
            starts.setdefault(name, Counter())[k] += 1
    assert sorted(starts["train"]) == [0, 1, 2, 3, 4, 5] and min(starts["train"].values()) > 400  # uniform
    # len_7 may start 0..3, len_8 0..1, len_9 and longer at once; shorter ones 0..5 as in training
    assert [max(starts[f"len_{n}"]) for n in (3, 6, 7, 8, 9, 12)] == [5, 5, 3, 1, 0, 0]
    assert sorted(starts["len_7"]) == [0, 1, 2, 3]
    assert max(len(s) for s in d.train.data.src) == 6 + 5 and d.meta["max_src_len"] == 12  # len_12
    assert "_" not in task(kind="copy_unique").src_vocab.tokens


def test_the_data_is_a_function_of_the_data_seed_and_held_out_splits_ignore_train_size() -> None:
    a, b = task(kind="sort").build(7), task(kind="sort").build(7)
    for name in a.splits:
        assert all(np.array_equal(x, y) for x, y in zip(a.splits[name].data.src, b.splits[name].data.src, strict=True))
    other = task(kind="sort").build(8)
    assert not np.array_equal(other.splits["len_20"].data.src[0], a.splits["len_20"].data.src[0])
    small = task(kind="sort", train_size=100).build(7)
    for name in ("val", "val_ood", "len_3", "len_40"):
        assert all(np.array_equal(x, y) for x, y in zip(a.splits[name].data.tgt, small.splits[name].data.tgt, strict=True))


def test_defaults_lengths_and_band() -> None:
    cfg = LengthGenConfig()
    assert (cfg.train_lengths, cfg.ood_lengths, cfg.test_range) == ((1, 20), (21, 25), (1, 40))
    assert cfg.band_lengths == list(range(30, 41))
    assert LengthGenConfig(train_lengths=(2, 10)).band_lengths == list(range(15, 21))
    assert LengthGenConfig(train_lengths=(1, 7)).band_lengths == [11, 12, 13, 14]  # ceil(10.5) .. 14
    assert TASKS.get("length_gen") is LengthGen


def test_score_cuts_at_the_first_end_token() -> None:
    gold = [np.array([5, 6, 7]), np.array([4])]

    def rows(*preds: list[int]) -> TokenRows:
        width = max(len(p) for p in preds)
        tok = np.zeros((len(preds), width), dtype=np.int64)
        for i, p in enumerate(preds):
            tok[i, : len(p)] = p
        return TokenRows(tok, np.array([len(p) for p in preds]))

    cases = [  # (prediction for gold[0], for gold[1]) -> exact, length_correct, token_accuracy
        (([5, 6, 7, EOS], [4, EOS]), [1, 1], [1, 1], [1, 1]),
        (([5, 6, 7], [4]), [1, 1], [1, 1], [1, 1]),  # no </s> (fixed-length decoding): taken whole
        (([5, 6, EOS, 7], [4, 4, EOS]), [0, 0], [0, 0], [2 / 3, 1]),  # stops early; runs on
        (([5, 9, 7, EOS, 3], [EOS]), [0, 0], [1, 0], [2 / 3, 0]),
        (([5, 6, 7, 8, 9], [3, EOS]), [0, 0], [0, 1], [1, 0]),  # never stops within the answer + 1
    ]
    for (p0, p1), exact, length_ok, tokens in cases:
        out = score_answers(gold, rows(p0, p1))
        assert out["exact"].tolist() == exact and out["length_correct"].tolist() == length_ok, (p0, p1)
        assert out["token_accuracy"].tolist() == pytest.approx(tokens), (p0, p1)
    t = task(kind="count", train_lengths=(1, 4))
    d = t.build(0)
    split = d.splits["len_3"]
    perfect = [np.concatenate([s, [EOS]]) for s in split.data.tgt]
    assert t.score(split, perfect)["exact"].tolist() == [1.0] * len(split)
    assert t.render(split, perfect[0]) == t.render_example(d, split, 0)[1]


@pytest.mark.parametrize(
    ("cfg", "field"),
    [({"kind": "parity", "n_symbols": 4}, "task.n_symbols"), ({"kind": "count", "index_hints": True}, "task.index_hints"),
     ({"kind": "addition", "scratchpad": True}, "task.scratchpad"), ({"kind": "sort", "reverse_output": True}, "task.reverse_output"),
     ({"kind": "sort", "n_symbols": 30}, "task.n_symbols"), ({"kind": "count", "n_symbols": 20}, "task.n_symbols"),
     ({"kind": "mode", "n_symbols": 1}, "task.n_symbols"), ({"train_lengths": (5, 2)}, "task.train_lengths"),
     ({"test_lengths": (1, 35)}, "task.test_lengths"), ({"generalization_band": (2.0, 1.5)}, "task.generalization_band"),
     ({"kind": "reverse"}, "task.kind")],
)  # fmt: skip
def test_bad_configs_name_the_field_and_the_fix(cfg: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match="^" + re.escape(field) + ": .*Fix: "):
        RunSpec.from_dict({"task": {"name": "length_gen", **cfg}, "model": {"name": "transformer"}})


def test_the_declared_aggregate_names_the_band_and_every_length() -> None:
    decl = task(kind="copy_unique", train_lengths=(1, 10)).analysis()
    (agg,) = decl["aggregates"]
    assert agg["kind"] == "length_generalization" and agg["level"] == 0.9 and agg["train_max"] == 10
    assert agg["band_examples"] == 6 * task(kind="copy_unique", train_lengths=(1, 10)).config.test_size
    assert agg["band"] == [length_split(n) for n in range(15, 21)]
    assert agg["lengths"] == {length_split(n): n for n in range(1, 21)}
    assert (agg["metric"], agg["oracle_metric"]) == ("exact", "oracle_exact")
    assert decl["test_splits"] == ["len_10", "len_15", "len_20"] and decl["primary_metric"] == "exact"
    # the verdict speaks about the band value (what decides whether a run length-generalizes)
    from analysis.manifest import parse_declarations
    from analysis.verdict_axis import parse_split

    head, *rest = parse_declarations(decl).verdict_splits
    assert parse_split(head).parts == tuple(agg["band"]) and parse_split(head).name == "len_15..len_20"
    assert rest == ["len_15", "len_20"]
    assert {k for k, g in KINDS.items() if g.rasp_l} == {"count", "sort", "copy_unique", "mode"}
