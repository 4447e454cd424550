"""The symbol-rewriting task: splits, generator invariants, the validity metric, loading."""

from __future__ import annotations

import itertools
import json
import pickle
import re
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainables.data import BOS, EOS, PAD, SeqPairs, Split, TaskData, TokenRows
from trainables.errors import ConfigError, DataError
from trainables.registry import TASKS
from trainables.tasks.symbol_rewriting import (
    PUBLISHED_FILES,
    DecodeLen,
    SymbolRewriting,
    SymbolRewritingConfig,
)
from trainables.tasks.symbol_rewriting_data import (
    NoRepeat,
    Runs,
    compositions,
    input_symbols,
    parse_tsv,
)

SMALL = dict(train_size=2000, val_size=300, val_ood_size=600, test_size=400)
TOKEN = re.compile(r"^([A-Z])(\d+)_(\d+)$")
# Pass rates of the published gold outputs, from ../shared/data/README.md.
PUBLISHED_PASS = {
    "standard": 0.9675,
    "repeat": 0.975,
    "short": 0.9915,
    "long": 0.946,
    "val_ood": 0.9738,
}


@pytest.fixture(scope="module")
def small() -> tuple[SymbolRewriting, TaskData]:
    task = SymbolRewriting(SymbolRewritingConfig(**SMALL))
    return task, task.build(11)


@pytest.fixture(scope="module")
def paper() -> tuple[SymbolRewriting, TaskData, float]:
    """The default (paper-scale) config, built once, with its build time."""
    task = SymbolRewriting()
    start = time.perf_counter()
    data = task.build(2018)
    return task, data, time.perf_counter() - start


def words(task: SymbolRewriting, ids: np.ndarray) -> list[str]:
    return task.src_vocab.decode(ids)


def run_lengths(x: Sequence[Any]) -> list[tuple[Any, int]]:
    """(symbol, run length) for each maximal block of equal symbols."""
    return [(s, len(list(g))) for s, g in itertools.groupby(list(x))]


def with_eos(rows: list[np.ndarray]) -> list[np.ndarray]:
    return [np.append(r, EOS) for r in rows]


# ---- config ---------------------------------------------------------------------------


def test_registered_and_every_field_documented() -> None:
    assert TASKS.get("symbol_rewriting") is SymbolRewriting
    assert SymbolRewriting.data_kind == "seq2seq"
    for name, info in SymbolRewritingConfig.model_fields.items():
        assert info.description, f"field {name} has no docstring"
    cfg = SymbolRewritingConfig()
    assert (cfg.n_symbols, cfg.sub_alphabets, cfg.n_values, cfg.max_run) == (40, "ABC", 2, 6)
    assert (cfg.train_size, cfg.val_size, cfg.val_ood_size, cfg.test_size) == (
        100_000,
        2_000,
        5_000,
        2_000,
    )


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"n_symbols": 0}, "task.n_symbols"),
        ({"n_symbols": 1000}, "task.n_symbols"),
        ({"sub_alphabets": "AAB"}, "task.sub_alphabets"),
        ({"sub_alphabets": "abc"}, "task.sub_alphabets"),
        ({"n_values": 0}, "task.n_values"),
        ({"train_size": 0}, "task.train_size"),
        ({"test_size": -3}, "task.test_size"),
        ({"max_run": 1}, "task.max_run"),
        ({"single_run_prob": 1.0}, "task.single_run_prob"),
        ({"train_lengths": (6, 5)}, "task.train_lengths"),
        ({"short_lengths": (0, 4)}, "task.short_lengths"),
        ({"n_symbols": 12}, "task.long_lengths"),  # length 15 cannot avoid repeats
        ({"repeat_lengths": (1, 5)}, "task.repeat_lengths"),
        (
            {
                "n_symbols": 2,
                "max_run": 2,
                "train_lengths": (1, 2),
                "short_lengths": (1, 2),
                "long_lengths": (2, 2),
                "val_ood_lengths": (2, 5),
                "repeat_lengths": (2, 4),
                **dict(train_size=2, val_size=1, val_ood_size=1, test_size=1),
            },
            "task.val_ood_lengths",
        ),  # 5 needs 3 runs of <= 2 but only 2 symbols
        # 5 + 20 inputs of length 1-2 from 5 symbols, 30 requested
        (
            {
                "n_symbols": 5,
                "train_lengths": (1, 2),
                "short_lengths": (1, 2),
                "long_lengths": (3, 5),
                "repeat_lengths": (2, 3),
                "val_ood_lengths": (2, 3),
                "train_size": 20,
                "val_size": 5,
                "test_size": 5,
                "val_ood_size": 5,
            },
            "task.train_lengths",
        ),
    ],
)
def test_bad_configs_raise_config_error_naming_the_field(overrides: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        SymbolRewritingConfig(**overrides)
    assert err.value.field == field
    assert err.value.fix  # every error says what to do


def test_input_alphabet_and_extension() -> None:
    names = input_symbols(40)
    assert names[:25] == [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c != "S"]
    assert names[25:] == [c + "S" for c in "ABCDEFGHIJKLMNO"]
    more = input_symbols(80)
    assert more[:40] == names and more[40] == "PS" and more[50] == "ASS"
    assert len(set(more)) == 80
    task = SymbolRewriting(SymbolRewritingConfig(n_symbols=60, **SMALL))
    assert len(task.src_vocab) == 3 + 60 and len(task.tgt_vocab) == 3 + 60 * 3 * 2


# ---- splits ---------------------------------------------------------------------------


def test_splits_roles_sizes_and_meta(small: tuple[SymbolRewriting, TaskData]) -> None:
    task, data = small
    roles = {name: split.role for name, split in data.splits.items()}
    assert roles == {
        "train": "train",
        "val": "val",
        "val_ood": "val_ood",
        "standard": "test",
        "repeat": "test",
        "short": "test",
        "long": "test",
    }
    assert task.split_roles() == roles
    sizes = {name: len(split) for name, split in data.splits.items()}
    assert sizes == {"train": 2000, "val": 300, "val_ood": 600, "standard": 400,
                     "repeat": 400, "short": 400, "long": 400}  # fmt: skip
    for split in data.splits.values():
        d = split.data
        assert isinstance(d, SeqPairs)
        assert np.array_equal(d.ids, np.arange(len(d)))
        assert all(
            s.dtype == np.int64 and t.dtype == np.int64 for s, t in zip(d.src, d.tgt, strict=True)
        )
        # no special tokens stored
        assert min(int(s.min()) for s in d.src) >= 3 and min(int(t.min()) for t in d.tgt) >= 3
    every = [d for s in data.splits.values() for d in [s.data]]
    meta = data.meta
    assert meta["src_vocab"] is task.src_vocab and meta["tgt_vocab"] is task.tgt_vocab
    assert meta["max_src_len"] == max(len(s) for d in every for s in d.src) == 15
    assert meta["max_tgt_len"] == max(len(t) for d in every for t in d.tgt) == 45
    lens = np.array([len(s) for s in data.splits["long"].data.src])
    assert np.array_equal(meta["decode_len"](lens), 3 * lens + 1)
    assert np.array_equal(DecodeLen(4)(np.array([1, 2])), [5, 9])
    pickle.loads(pickle.dumps(data))  # travels between processes


@pytest.mark.parametrize(
    ("split", "lo", "hi"),
    [("train", 5, 10), ("val", 5, 10), ("standard", 5, 10), ("val_ood", 3, 12),
     ("repeat", 5, 10), ("short", 1, 4), ("long", 11, 15)],
)  # fmt: skip
def test_lengths_in_range_and_roughly_uniform(
    small: tuple[SymbolRewriting, TaskData], split: str, lo: int, hi: int
) -> None:
    _, data = small
    lengths = Counter(len(s) for s in data.splits[split].data.src)
    assert set(lengths) == set(range(lo, hi + 1))
    n, k = sum(lengths.values()), hi - lo + 1
    expected, sd = n / k, np.sqrt(n * (1 / k) * (1 - 1 / k))
    for length, count in lengths.items():
        assert abs(count - expected) < 5 * sd, (length, count, expected)


def test_no_symbol_repeated_where_forbidden(small: tuple[SymbolRewriting, TaskData]) -> None:
    _, data = small
    for name in ("train", "val", "standard", "short", "long"):
        for x in data.splits[name].data.src:
            assert len(set(x.tolist())) == len(x), (name, x)


@pytest.mark.parametrize("split", ["repeat", "val_ood"])
def test_repeat_inputs_have_runs_of_at_most_max_run(
    small: tuple[SymbolRewriting, TaskData], split: str
) -> None:
    _, data = small
    longest = Counter()
    for x in data.splits[split].data.src:
        runs = run_lengths(x)
        assert max(r for _, r in runs) >= 2  # at least one repeated run
        assert max(r for _, r in runs) <= 6
        symbols = [s for s, _ in runs]
        assert len(set(symbols)) == len(symbols)  # no symbol in two separate runs
        longest[max(r for _, r in runs)] += 1
    assert set(longest) == {2, 3, 4, 5, 6}  # every run length occurs


def test_distinct_within_splits_and_balanced_short(
    small: tuple[SymbolRewriting, TaskData],
) -> None:
    _, data = small
    for name, split in data.splits.items():
        keys = [tuple(x.tolist()) for x in split.data.src]
        if name != "short":
            assert len(set(keys)) == len(keys), name
    short = [tuple(x.tolist()) for x in data.splits["short"].data.src]
    longer = [k for k in short if len(k) > 1]
    assert len(set(longer)) == len(longer)  # only length 1 has fewer inputs than its share
    ones = Counter(k for k in short if len(k) == 1)
    assert len(ones) == 40  # every length-1 input is used ...
    assert max(ones.values()) - min(ones.values()) <= 1  # ... as evenly as possible


def test_splits_are_pairwise_disjoint(small: tuple[SymbolRewriting, TaskData]) -> None:
    _, data = small
    sets = {n: {tuple(x.tolist()) for x in s.data.src} for n, s in data.splits.items()}
    for a, b in itertools.combinations(sets, 2):
        assert not sets[a] & sets[b], (a, b)


def test_deterministic_given_seed_and_held_out_splits_ignore_train_size(
    small: tuple[SymbolRewriting, TaskData],
) -> None:
    task, data = small
    again = task.build(11)
    other = task.build(12)
    bigger = SymbolRewriting(SymbolRewritingConfig(**{**SMALL, "train_size": 2500})).build(11)
    for name, split in data.splits.items():
        for a, b in zip(split.data.src + split.data.tgt, again.splits[name].data.src +
                        again.splits[name].data.tgt, strict=True):  # fmt: skip
            assert np.array_equal(a, b)
        assert [x.tolist() for x in split.data.src] != [
            x.tolist() for x in other.splits[name].data.src
        ]
        if name != "train":
            assert all(
                np.array_equal(a, b)
                for a, b in zip(split.data.tgt, bigger.splits[name].data.tgt, strict=True)
            )


def test_gold_targets_follow_the_rewriting_rule(small: tuple[SymbolRewriting, TaskData]) -> None:
    task, data = small
    orders: Counter[str] = Counter()
    values: Counter[str] = Counter()
    for split in data.splits.values():
        for x, y in zip(split.data.src, split.data.tgt, strict=True):
            inputs = words(task, x)
            tokens = task.tgt_vocab.decode(y)
            assert len(tokens) == 3 * len(inputs)
            for p, symbol in enumerate(inputs):
                span = [TOKEN.match(t) for t in tokens[3 * p : 3 * p + 3]]
                assert all(m is not None for m in span)
                index = input_symbols(40).index(symbol) + 1
                assert {int(m[2]) for m in span if m} == {index}
                order = "".join(m[1] for m in span if m)
                assert sorted(order) == ["A", "B", "C"]
                orders[order] += 1
                values.update(m[3] for m in span if m)
    # letter orders and values are uniform (6 orders, 2 values)
    total = sum(orders.values())
    assert len(orders) == 6 and all(abs(c / total - 1 / 6) < 0.01 for c in orders.values())
    assert set(values) == {"1", "2"} and abs(values["1"] / values.total() - 0.5) < 0.01


def test_small_alphabets_exhaust_lengths_without_breaking_invariants() -> None:
    tiny = dict(
        n_symbols=6, train_lengths=(1, 3), short_lengths=(1, 2), long_lengths=(4, 6),
        repeat_lengths=(2, 4), val_ood_lengths=(2, 5), max_run=3,
        val_size=10, val_ood_size=40, test_size=20,
    )  # fmt: skip
    data = SymbolRewriting(SymbolRewritingConfig(train_size=100, **tiny)).build(3)
    sets = {}
    for name, split in data.splits.items():
        keys = [tuple(x.tolist()) for x in split.data.src]
        want = {"train": 100, "val": 10, "val_ood": 40}.get(name, 20)
        assert len(keys) == want
        if name != "short":
            assert len(set(keys)) == want, name
        sets[name] = set(keys)
    # only 6 + 30 + 120 = 156 inputs of length 1-3 exist: no length is over-used, and
    # length 1 (6 inputs, a third of the uniform share) gave its overflow to longer ones
    assert sum(len(k) == 1 for k in sets["train"] | sets["short"]) <= 6
    for a, b in itertools.combinations(sets, 2):
        assert not sets[a] & sets[b], (a, b)
    # the validator allows 125 + 10 + 20 <= 156, but short also took ~15: found at build
    with pytest.raises(ConfigError) as err:
        SymbolRewriting(SymbolRewritingConfig(train_size=125, **tiny)).build(3)
    assert err.value.field == "task.train_size"


def test_family_counts_match_enumeration() -> None:
    for family in (NoRepeat(5), Runs(4, 3, 0.5)):
        for length in range(2, 6):
            rows = family.enumerate(length)
            assert len(rows) == family.count(length)
            assert len({tuple(r) for r in rows.tolist()}) == len(rows)
            assert family.contains(rows).all()
    assert len(compositions(5, 2)) == 8  # Fibonacci: compositions of 5 into 1s and 2s
    # a run longer than max_run, a symbol in two runs, no repeated run: not in Runs
    bad = np.array([[0, 0, 0, 0, 1], [0, 0, 1, 0, 2], [0, 1, 2, 3, 4]], dtype=np.uint8)
    assert not Runs(5, 3, 0.5).contains(bad).any()


# ---- metric ---------------------------------------------------------------------------


def hand_split(task: SymbolRewriting, inputs: list[str], gold: list[str]) -> Split:
    src = [task.src_vocab.encode(inputs)]
    tgt = [task.tgt_vocab.encode(gold)]
    return Split("hand", "test", SeqPairs(src=src, tgt=tgt, ids=np.arange(1)))


def test_validity_on_hand_made_cases() -> None:
    task = SymbolRewriting(SymbolRewritingConfig(**SMALL))
    gold = ["A1_1", "B1_2", "C1_1", "C3_1", "A3_2", "B3_1"]
    split = hand_split(task, ["A", "C"], gold)
    enc = task.tgt_vocab.encode

    def check(pred: list[int]) -> tuple[float, float]:
        out = task.score(split, [np.array(pred, dtype=np.int64)])
        return float(out["accuracy"][0]), float(out["exact"][0])

    g = enc(gold).tolist()
    assert check([*g, EOS]) == (1.0, 1.0)
    assert check([*g, EOS, 7, 9, EOS]) == (1.0, 1.0)  # anything after EOS is ignored
    other_values = enc(["B1_1", "A1_1", "C1_2", "A3_1", "C3_2", "B3_2"]).tolist()
    assert check([*other_values, EOS]) == (1.0, 0.0)  # values and letter order free
    assert check(g) == (0.0, 0.0)  # missing EOS
    assert check([*g[:-1], EOS]) == (0.0, 0.0)  # too short
    assert check([*g, g[-1], EOS]) == (0.0, 0.0)  # too long
    assert check([EOS, *g]) == (0.0, 0.0)
    assert check([]) == (0.0, 0.0)
    wrong_number = enc(["A1_1", "B1_2", "C1_1", "C4_1", "A3_2", "B3_1"]).tolist()
    assert check([*wrong_number, EOS])[0] == 0.0
    swapped = enc(["C3_1", "A3_2", "B3_1", "A1_1", "B1_2", "C1_1"]).tolist()
    assert check([*swapped, EOS])[0] == 0.0  # spans in the wrong order
    duplicated_letter = enc(["A1_1", "A1_2", "C1_1", "C3_1", "A3_2", "B3_1"]).tolist()
    assert check([*duplicated_letter, EOS])[0] == 0.0
    for special in (PAD, BOS):
        assert check([*g[:3], special, *g[4:], EOS])[0] == 0.0
        assert check([*g, special, EOS])[0] == 0.0
    assert check([*g[:5], len(task.tgt_vocab) + 4, EOS])[0] == 0.0  # out of vocab
    assert check([*g[:5], -1, EOS])[0] == 0.0
    with pytest.raises(ValueError, match="predictions"):
        task.score(split, [])


def test_token_rows_score_like_per_example_arrays(small: tuple[SymbolRewriting, TaskData]) -> None:
    """Models hand over padded TokenRows; scoring them must equal scoring the arrays one by one."""
    task, data = small
    split = data.splits["long"]
    rng = np.random.default_rng(3)
    preds = with_eos(split.data.tgt)
    for i in rng.choice(len(preds), len(preds) // 2, replace=False):  # break half of them
        preds[i] = preds[i].copy()
        preds[i][rng.integers(len(preds[i]))] = rng.integers(0, len(task.tgt_vocab))
    width = max(len(p) for p in preds) + 2
    tokens = np.full((len(preds), width), 7, dtype=np.int64)  # junk beyond each length
    for i, p in enumerate(preds):
        tokens[i, : len(p)] = p
    rows = TokenRows(tokens, np.array([len(p) for p in preds]))
    assert all(np.array_equal(rows[i], p) for i, p in enumerate(preds))
    by_rows, by_list = task.score(split, rows), task.score(split, preds)
    assert 0.2 < by_list["accuracy"].mean() < 0.8
    for metric in by_list:
        assert np.array_equal(by_rows[metric], by_list[metric]), metric


def test_token_rows_pad_cut_and_assemble() -> None:
    rows = TokenRows(np.array([[1, 2, 3], [4, 5, 6]]), np.array([1, 3]))
    assert [r.tolist() for r in rows] == [[1], [4, 5, 6]]
    assert rows.padded(2).tolist() == [[1, -1], [4, 5]]
    assert rows.padded(4, fill=0).tolist() == [[1, 0, 0, 0], [4, 5, 6, 0]]
    other = TokenRows(np.array([[9]]), np.array([1]))
    whole = TokenRows.assemble(3, [(np.array([2, 0]), rows), (np.array([1]), other)])
    assert [r.tolist() for r in whole] == [[4, 5, 6], [9], [1]]
    with pytest.raises(ValueError, match="not given"):
        TokenRows.assemble(4, [(np.array([2, 0]), rows)])
    with pytest.raises(ValueError, match="lengths"):
        TokenRows(np.zeros((2, 3), dtype=np.int64), np.array([1, 4]))


def test_render_stops_at_eos() -> None:
    task = SymbolRewriting(SymbolRewritingConfig(**SMALL))
    split = hand_split(task, ["B"], ["A2_1", "B2_2", "C2_1"])
    pred = np.append(task.tgt_vocab.encode(["C2_1", "A2_2", "B2_1"]), [EOS, 5])
    assert task.render(split, pred) == "C2_1 A2_2 B2_1"
    assert task.render(split, np.array([PAD, EOS])) == "<pad>"


def test_generated_gold_scores_100_percent_and_shuffles_fail(
    small: tuple[SymbolRewriting, TaskData],
) -> None:
    task, data = small
    rng = np.random.default_rng(0)
    for split in data.splits.values():
        out = task.score(split, with_eos(split.data.tgt))
        assert out["accuracy"].mean() == 1.0 and out["exact"].mean() == 1.0
        # reversing a target breaks the span order whenever the input has 2+ distinct symbols
        reversed_ = task.score(split, with_eos([t[::-1] for t in split.data.tgt]))["accuracy"]
        multi = np.array([len(set(s.tolist())) > 1 for s in split.data.src])
        assert not reversed_[multi].any()
        # a target of another example is invalid unless the inputs agree
        perm = rng.permutation(len(split))
        crossed = task.score(split, with_eos([split.data.tgt[i] for i in perm]))["accuracy"]
        same = np.array([np.array_equal(split.data.src[i], split.data.src[j])
                         for i, j in enumerate(perm)])  # fmt: skip
        assert np.array_equal(crossed.astype(bool), same)


def test_paper_scale_build_time_and_scoring_speed(
    paper: tuple[SymbolRewriting, TaskData, float],
) -> None:
    task, data, seconds = paper
    assert len(data.splits["train"]) == 100_000 and len(data.splits["val_ood"]) == 5_000
    assert seconds < 10.0, f"building the paper-scale data took {seconds:.2f} s"
    evals = [s for s in data.splits.values() if s.role != "train"]
    assert sum(len(s) for s in evals) == 15_000
    train = data.splits["train"]
    head = SeqPairs(train.data.src[:2000], train.data.tgt[:2000], np.arange(2000))
    evals.append(Split("train_head", "train", head))  # 17k predictions in all
    preds = {s.name: with_eos(s.data.tgt) for s in evals}
    start = time.perf_counter()
    means = {s.name: task.score(s, preds[s.name])["accuracy"].mean() for s in evals}
    elapsed = time.perf_counter() - start
    assert all(m == 1.0 for m in means.values())
    assert elapsed < 1.0, f"scoring 17k predictions took {elapsed:.2f} s"


def test_analysis_declarations_name_real_splits(small: tuple[SymbolRewriting, TaskData]) -> None:
    task, data = small
    decl = task.analysis()
    json.dumps(decl)  # pure data
    assert set(decl["test_splits"]) == {n for n, s in data.splits.items() if s.role == "test"}
    for split, metric in decl["scatter"]:
        assert split in data.splits and metric in task.score(
            data.splits[split], with_eos(data.splits[split].data.tgt)
        )


# ---- the published files ----------------------------------------------------------------


def test_metric_reproduces_published_pass_rates(shared_data: Path) -> None:
    folder = shared_data / "symbol_rewriting"
    task = SymbolRewriting(SymbolRewritingConfig(**SMALL))
    for split, fname in PUBLISHED_FILES.items():
        pairs = task.load_published(folder / fname)
        rows = parse_tsv(folder / fname)
        assert len(pairs) == len(rows) == (5000 if split == "val_ood" else 2000)
        out = task.score(Split(split, "test", pairs), with_eos(pairs.tgt))
        assert out["accuracy"].mean() == pytest.approx(PUBLISHED_PASS[split], abs=1e-9), split
        assert out["exact"].all()
        # the documented defect: every failing gold output rewrites an input B
        failing = np.flatnonzero(out["accuracy"] == 0)
        assert all("B" in rows[i][0] for i in failing)


def test_generator_resembles_published_repeat_sets(
    shared_data: Path, paper: tuple[SymbolRewriting, TaskData, float]
) -> None:
    """Same share of inputs with 1, 2, 3+ repeated runs and the same mean run length."""
    folder = shared_data / "symbol_rewriting"
    _, data, _ = paper

    def profile(inputs: list[list]) -> np.ndarray:
        n_repeated = Counter(
            min(sum(r > 1 for _, r in run_lengths(np.array(x))), 3) for x in inputs
        )
        runs = [r for x in inputs for _, r in run_lengths(np.array(x))]
        total = len(inputs)
        return np.array([n_repeated[1] / total, n_repeated[2] / total,
                         n_repeated[3] / total, np.mean(runs) / 6])  # fmt: skip

    for split in ("repeat", "val_ood"):
        published = [row[0] for row in parse_tsv(folder / PUBLISHED_FILES[split])]
        ours = [x.tolist() for x in data.splits[split].data.src]
        gap = np.abs(profile(published) - profile(ours))
        assert gap.max() < 0.05, (split, profile(published), profile(ours))


def test_data_dir_replaces_five_splits(shared_data: Path, tmp_path: Path) -> None:
    folder = shared_data / "symbol_rewriting"
    task = SymbolRewriting(SymbolRewritingConfig(data_dir=str(folder), **SMALL))
    task.check()
    data = task.build(5)
    for split, fname in PUBLISHED_FILES.items():
        rows = parse_tsv(folder / fname)
        got = data.splits[split].data
        assert len(got) == len(rows)
        assert [words(task, x) for x in got.src[:50]] == [r[0] for r in rows[:50]]
        assert [task.tgt_vocab.decode(y) for y in got.tgt[:50]] == [r[1] for r in rows[:50]]
    assert len(data.splits["train"]) == 2000 and len(data.splits["val"]) == 300
    held_out = {tuple(x.tolist()) for n in PUBLISHED_FILES for x in data.splits[n].data.src}
    for name in ("train", "val"):
        assert not held_out & {tuple(x.tolist()) for x in data.splits[name].data.src}


def test_missing_data_dir_or_file_is_a_config_error(tmp_path: Path) -> None:
    missing = SymbolRewriting(SymbolRewritingConfig(data_dir=str(tmp_path / "nope"), **SMALL))
    for call in (missing.check, lambda: missing.build(0)):
        with pytest.raises(ConfigError) as err:
            call()
        assert err.value.field == "task.data_dir" and "grammar.val.tsv" in err.value.fix
    for fname in list(PUBLISHED_FILES.values())[:-1]:
        (tmp_path / fname).write_text("")
    partial = SymbolRewriting(SymbolRewritingConfig(data_dir=str(tmp_path), **SMALL))
    with pytest.raises(ConfigError, match=r"grammar\.val\.tsv") as err:
        partial.check()
    assert err.value.field == "task.data_dir"
    SymbolRewriting(SymbolRewritingConfig(**SMALL)).check()  # no data_dir: nothing to check


def test_malformed_or_foreign_files_are_data_errors(tmp_path: Path) -> None:
    good = "A C .\tA1_1 B1_2 C1_1 C3_1 A3_2 B3_1\t0 0 0 1 1 1 2\n"
    for fname in PUBLISHED_FILES.values():
        (tmp_path / fname).write_text(good)
    task = SymbolRewriting(SymbolRewritingConfig(data_dir=str(tmp_path), **SMALL))
    data = task.build(0)  # tiny but well-formed files load
    assert len(data.splits["short"]) == 1 and len(data.splits["train"]) == 2000
    (tmp_path / "grammar_short.tst.full.tsv").write_text("A B . A1_1 B1_2 C1_1 no tabs\n")
    with pytest.raises(DataError, match="grammar_short"):
        task.build(0)
    (tmp_path / "grammar_short.tst.full.tsv").write_text("A QS .\tA1_1\t0\n")
    with pytest.raises(DataError, match="QS"):
        task.build(0)
    (tmp_path / "grammar_short.tst.full.tsv").write_text("\n")
    with pytest.raises(DataError, match="no rows"):
        task.build(0)


def test_end_symbol_ends_every_generated_input_and_keeps_scores_and_decode_lengths(
    small: tuple[SymbolRewriting, TaskData],
) -> None:
    """``end_symbol``: every source gains a final ``.`` (its own vocab id); the splits are
    otherwise the same inputs, validity ignores the marker and decoding lengths do not grow."""
    plain_task, plain = small
    task = SymbolRewriting(SymbolRewritingConfig(**SMALL, end_symbol=True))
    data = task.build(11)
    dot = task.src_vocab.index["."]
    assert dot == len(plain_task.src_vocab) and len(task.src_vocab) == len(plain_task.src_vocab) + 1
    for name, split in data.splits.items():
        mine, theirs = split.data, plain.splits[name].data
        assert all(s[-1] == dot and np.array_equal(s[:-1], t) for s, t in zip(mine.src, theirs.src, strict=True))
        assert all(np.array_equal(a, b) for a, b in zip(mine.tgt, theirs.tgt, strict=True))
        lengths = np.array([len(s) for s in mine.src])
        assert np.array_equal(data.meta["decode_len"](lengths), plain.meta["decode_len"](lengths - 1))
        out = task.score(split, with_eos(mine.tgt))
        assert out["accuracy"].all() and out["exact"].all(), name
    assert task.render_example(data, data.splits["standard"], 0)[0].endswith(" .")


def test_end_symbol_in_loaded_published_files(shared_data: Path) -> None:
    folder = shared_data / "symbol_rewriting"
    task = SymbolRewriting(SymbolRewritingConfig(data_dir=str(folder), end_symbol=True, train_size=200))
    data = task.build(0)
    dot = task.src_vocab.index["."]
    for split, fname in PUBLISHED_FILES.items():
        rows = parse_tsv(folder / fname)
        src = data.splits[split].data.src
        assert all(s[-1] == dot and len(s) == len(r[0]) + 1 for s, r in zip(src, rows, strict=True))
        out = task.score(data.splits[split], with_eos(data.splits[split].data.tgt))
        assert out["accuracy"].mean() == pytest.approx(PUBLISHED_PASS[split], abs=1e-9), split


def test_end_symbol_is_an_added_field_that_keeps_old_trial_ids() -> None:
    from trainables.spec import RunSpec

    raw = {"task": {"name": "symbol_rewriting", **SMALL}, "model": {"name": "seq2seq"}}
    before = RunSpec.from_dict(raw).trial_id()
    assert RunSpec.from_dict({**raw, "task": {**raw["task"], "end_symbol": False}}).trial_id() == before
    assert RunSpec.from_dict({**raw, "task": {**raw["task"], "end_symbol": True}}).trial_id() != before
