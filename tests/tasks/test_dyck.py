"""Dyck-1 task: generators, targets, zigzag, metrics, the published files, config errors."""

from __future__ import annotations

import collections
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from trainables.data import SeqTags, Split
from trainables.errors import ConfigError, DataError
from trainables.registry import TASKS
from trainables.tasks.dyck import Dyck1, Dyck1Config, trivial_failure
from trainables.tasks.dyck_strings import (
    LengthConditionedSampler,
    SuzgunLengthSampler,
    SuzgunSampler,
    _Uniforms,
    decode,
    dyck_count,
    is_dyck,
    length_probs,
    sample_exact_unique,
    suzgun_length_table,
    zigzag_j,
)

SMALL = {
    "train_size": 400,
    "val_size": 200,
    "long_size": 100,
    "very_long_size": 5,
    "zigzag_len": 300,
    "zigzag_js": (100, 7, 1),
}


def depth_bits(s: str) -> list[int]:
    """1 where the depth after the token is > 0 (a plain loop, independent of the task code)."""
    depth, out = 0, []
    for ch in s:
        depth += 1 if ch == "(" else -1
        out.append(int(depth > 0))
    return out


def balanced(s: str) -> bool:
    depth = 0
    for ch in s:
        depth += 1 if ch == "(" else -1
        if depth < 0:
            return False
    return depth == 0 and len(s) > 0


def strings(data: SeqTags) -> list[str]:
    return [decode(x) for x in data.x]


@pytest.fixture(scope="module")
def small() -> tuple[Dyck1, dict[str, Split]]:
    task = Dyck1(Dyck1Config(**SMALL))
    return task, task.build(7).splits


def test_registered() -> None:
    assert TASKS.get("dyck1") is Dyck1
    assert Dyck1.data_kind == "tagging" and Dyck1.primary_metric == "correct"


def test_generated_splits_are_unique_valid_and_in_range(
    small: tuple[Dyck1, dict[str, Split]],
) -> None:
    task, splits = small
    assert task.split_roles() == {s.name: s.role for s in splits.values()}
    assert {n: s.role for n, s in splits.items()} == {
        "train": "train",
        "val": "val",
        "long": "test",
        "very_long": "test",
        "zigzag": "test",
    }
    train, val, long = (strings(splits[n].data) for n in ("train", "val", "long"))
    assert (len(train), len(val), len(long)) == (400, 200, 100)
    assert len(set(train)) == 400 and len(set(val)) == 200 and len(set(long)) == 100
    assert not set(train) & set(val), "val must be disjoint from train"
    for group, lo, hi in ((train, 2, 50), (val, 2, 50), (long, 52, 100)):
        assert all(lo <= len(s) <= hi for s in group)
        assert all(balanced(s) for s in group)
    # the sampler reaches the whole range, not just its bottom
    assert max(map(len, train)) >= 40 and max(map(len, long)) >= 90
    very_long = strings(splits["very_long"].data)
    assert len(set(very_long)) == 5 and all(len(s) == 1000 and balanced(s) for s in very_long)


def test_targets_are_depth_bits(small: tuple[Dyck1, dict[str, Split]]) -> None:
    _, splits = small
    for split in splits.values():
        data = split.data
        assert isinstance(data, SeqTags)
        for x, y in zip(data.x, data.y, strict=True):
            s = decode(x)
            assert x.dtype == np.int64 and y.dtype == np.float32 and y.shape == (len(s), 2)
            assert np.all(y[:, 0] == 1)
            assert y[:, 1].astype(int).tolist() == depth_bits(s)


def test_build_is_deterministic_by_seed() -> None:
    cfg = Dyck1Config(**{**SMALL, "train_size": 50, "val_size": 20, "long_size": 10})
    a, b, c = (Dyck1(cfg).build(seed).splits for seed in (3, 3, 4))
    for name in a:
        assert strings(a[name].data) == strings(b[name].data)
    assert strings(a["train"].data) != strings(c["train"].data)
    assert strings(a["very_long"].data) != strings(c["very_long"].data)


def suzgun_recursive(u: _Uniforms, size: int, max_len: int, p: float, q: float) -> str:
    """Suzgun et al.'s generator as published (recursive), drawing from the same stream."""
    if size >= max_len:
        return ""
    r = u.next()
    if r < p:
        sample = "(" + suzgun_recursive(u, size + 2, max_len, p, q) + ")"
    elif r < p + q:
        sample = suzgun_recursive(u, size, max_len, p, q) + suzgun_recursive(u, size, max_len, p, q)
    else:
        return ""
    return sample if len(sample) <= max_len else ""


def test_iterative_sampler_equals_the_recursive_original() -> None:
    fast = SuzgunSampler(np.random.default_rng(5), 30, 0.5, 0.25)
    slow = _Uniforms(np.random.default_rng(5))
    got = [fast.sample() for _ in range(3000)]
    want = [suzgun_recursive(slow, 0, 30, 0.5, 0.25) for _ in range(3000)]
    assert got == want
    assert all(len(s) <= 30 for s in got) and sum(len(s) > 20 for s in got) > 10


def plain_pcfg(rng: np.random.Generator, limit: int, p: float, q: float) -> str | None:
    """An unconditioned PCFG draw, or None as soon as it exceeds ``limit`` symbols."""
    out: list[str] = []
    todo: list[str] = ["S"]
    while todo:
        sym = todo.pop()
        if sym != "S":
            out.append(sym)
            continue
        r = rng.random()
        if r < p:
            out.append("(")
            todo += [")", "S"]
        elif r < p + q:
            todo += ["S", "S"]
        if len(out) + todo.count(")") > limit:
            return None
    return "".join(out)


def test_length_distribution_matches_monte_carlo() -> None:
    rng = np.random.default_rng(0)
    draws = [plain_pcfg(rng, 8, 0.5, 0.25) for _ in range(40_000)]
    lengths = collections.Counter(len(s) for s in draws if s is not None)
    probs = length_probs(8, 0.5, 0.25)  # P[m] = P(length 2m)
    for m in range(5):
        assert lengths[2 * m] / len(draws) == pytest.approx(probs[m], abs=0.01)
    # P(length = 1000) is about 3e-5: rejection sampling is hopeless there
    assert 1e-5 < length_probs(1000, 0.5, 0.25)[500] < 1e-4


def test_length_conditioned_sampler_has_the_grammar_distribution() -> None:
    rng = np.random.default_rng(1)
    plain = [plain_pcfg(rng, 6, 0.5, 0.25) for _ in range(60_000)]
    want = collections.Counter(s for s in plain if s is not None and len(s) == 6)
    sampler = LengthConditionedSampler(6, 0.5, 0.25)
    u = _Uniforms(np.random.default_rng(2))
    got = collections.Counter(sampler.sample(u, 6) for _ in range(20_000))
    assert set(got) == set(want) and len(got) == dyck_count(6) == 5
    total = sum(want.values())
    for s in want:
        assert got[s] / 20_000 == pytest.approx(want[s] / total, abs=0.02), s


def test_conditioned_sampler_gives_exact_length_1000() -> None:
    out = sample_exact_unique(np.random.default_rng(3), 20, 1000, 0.5, 0.25)
    assert len(set(out)) == 20
    assert all(len(s) == 1000 and balanced(s) and is_dyck(s) for s in out)


def max_depth(s: str) -> int:
    depth = deepest = 0
    for ch in s:
        depth += 1 if ch == "(" else -1
        deepest = max(deepest, depth)
    return deepest


def first_return(s: str) -> int:
    """0-based index where the depth first comes back to 0 (the trivial predictor's FPF)."""
    depth = 0
    for i, ch in enumerate(s):
        depth += 1 if ch == "(" else -1
        if depth == 0:
            return i
    raise ValueError(s)


def kept_at(length: int, n: int, seed: int) -> tuple[list[str], int]:
    """Suzgun et al.'s own way: plain draws (abandon limit ``length``) kept at exactly
    ``length`` (their generate_list(n, length, length) without the uniqueness); and the
    number of draws it took."""
    sampler = SuzgunSampler(np.random.default_rng(seed), length, 0.5, 0.25)
    kept: list[str] = []
    draws = 0
    while len(kept) < n:
        s = sampler.sample()
        draws += 1
        if len(s) == length:
            kept.append(s)
    return kept, draws


def two_sample_p(a: Sequence[object], b: Sequence[object]) -> float:
    """Chi-square test that two samples of categories come from one distribution (categories
    seen fewer than 20 times in both together are pooled into one)."""
    ca, cb = collections.Counter(a), collections.Counter(b)
    common = sorted((c for c in ca | cb if ca[c] + cb[c] >= 20), key=str)
    table = [[x[c] for c in common] + [sum(x.values()) - sum(x[c] for c in common)] for x in (ca, cb)]
    table = [row for row in zip(*table, strict=True) if sum(row) > 0]  # drop an empty pool
    return float(stats.chi2_contingency(np.array(table).T).pvalue)


@pytest.fixture(scope="module")
def kept_20() -> tuple[list[str], int]:
    return kept_at(20, 3000, 11)


def test_suzgun_length_table_by_hand() -> None:
    # max_len 2: '()' from ( S ) (the inner S is at the depth cap) or from '()' + '';
    # '' from the empty rule, '' + '', or '()' + '()' (length 4, abandoned):
    # z = r + q (z^2 + (1 - z)^2), i.e. 2q z^2 - (1 + 2q) z + r + q = 0
    for p, q in ((0.5, 0.25), (0.3, 0.4)):
        r = 1 - p - q
        z = ((1 + 2 * q) - math.sqrt((1 + 2 * q) ** 2 - 8 * q * (r + q))) / (4 * q)
        table = suzgun_length_table(2, p, q)
        assert table.tolist() == [pytest.approx([z, 1 - z], abs=1e-12), [1.0, 0.0]]
    assert suzgun_length_table(2, 0.5, 0.25)[0, 0] == pytest.approx((3 - math.sqrt(5)) / 2, abs=1e-12)
    table = suzgun_length_table(200, 0.5, 0.25)
    assert table.shape == (101, 101) and np.allclose(table.sum(1), 1, atol=1e-10)
    assert (table >= 0).all() and not table.flags.writeable


def test_suzgun_length_sampler_agrees_with_rejection_from_the_plain_sampler(
    kept_20: tuple[list[str], int],
) -> None:
    kept, draws = kept_20
    p20 = suzgun_length_table(20, 0.5, 0.25)[0, 10]  # P(a plain draw has length 20)
    assert abs(len(kept) / draws - p20) < 4 * math.sqrt(p20 * (1 - p20) / draws)
    u = _Uniforms(np.random.default_rng(12))
    sampler = SuzgunLengthSampler(20, 0.5, 0.25)
    drawn = [sampler.sample(u, 20) for _ in range(3000)]
    assert all(len(s) == 20 and balanced(s) for s in drawn)
    assert two_sample_p([max_depth(s) for s in drawn], [max_depth(s) for s in kept]) > 0.01
    assert two_sample_p([first_return(s) for s in drawn], [first_return(s) for s in kept]) > 0.01
    # whole strings, where there are few enough of them (42 of length 10; 70% are the
    # fully nested one, which the depth cap at 5 favours)
    kept10, _ = kept_at(10, 6000, 13)
    drawn10 = [SuzgunLengthSampler(10, 0.5, 0.25).sample(u, 10) for _ in range(6000)]
    both = set(drawn10) | set(kept10)
    assert len(both) <= dyck_count(10) == 42 and all(len(s) == 10 and balanced(s) for s in both)
    assert two_sample_p(drawn10, kept10) > 0.01


def test_the_length_conditioned_grammar_draws_other_depths(kept_20: tuple[list[str], int]) -> None:
    """The check above has the power to tell the two samplers apart: the grammar conditioned
    on the length ignores the abandoned branches and the depth cap."""
    kept, _ = kept_20
    u = _Uniforms(np.random.default_rng(14))
    conditioned = [LengthConditionedSampler(20, 0.5, 0.25).sample(u, 20) for _ in range(3000)]
    assert two_sample_p([max_depth(s) for s in conditioned], [max_depth(s) for s in kept]) < 1e-6


def test_very_long_split_from_suzguns_sampler() -> None:
    cfg = Dyck1Config(**SMALL, very_long_sampler="suzgun_rejection")
    a, b = (Dyck1(cfg).build(seed).splits["very_long"].data for seed in (7, 7))
    conditioned = Dyck1(Dyck1Config(**SMALL)).build(7).splits
    strings_a = strings(a)
    assert strings_a == strings(b) and len(set(strings_a)) == 5
    assert all(len(s) == 1000 and balanced(s) and is_dyck(s) for s in strings_a)
    for s, y in zip(strings_a, a.y, strict=True):
        assert y[:, 1].astype(int).tolist() == depth_bits(s)
    assert strings_a != strings(conditioned["very_long"].data)
    # the other splits do not move
    other = Dyck1(cfg).build(7).splits
    assert all(strings(other[n].data) == strings(conditioned[n].data) for n in ("train", "val", "long"))
    assert "very_long_sampler" not in Dyck1Config().identity()  # old trial_ids stand
    out = sample_exact_unique(np.random.default_rng(3), 5, 200, 0.5, 0.25, "suzgun_rejection")
    assert len(set(out)) == 5 and all(len(s) == 200 and is_dyck(s) for s in out)


def test_zigzag_construction(small: tuple[Dyck1, dict[str, Split]]) -> None:
    _, splits = small
    data = splits["zigzag"].data
    assert isinstance(data, SeqTags)
    assert data.ids.tolist() == [0, 1, 2]
    for i, j in enumerate(SMALL["zigzag_js"]):
        s = decode(data.x[i])
        assert len(s) == 300
        assert s[:j] == "(" * j and s[j : 2 * j] == ")" * j
        assert s == (("(" * j + ")" * j) * 300)[:300]
        assert zigzag_j(data.x[i]) == j == SMALL["zigzag_js"][data.ids[i]]


def tags(*seqs: str) -> Split:
    x = [np.array([{"(": 0, ")": 1}[c] for c in s], dtype=np.int64) for s in seqs]
    y = [np.stack([np.ones(len(s)), depth_bits(s)], 1).astype(np.float32) for s in seqs]
    return Split("t", "test", SeqTags(x=x, y=y, ids=np.arange(len(seqs))))


def test_fpf_and_sequence_accuracy_on_hand_made_sequences() -> None:
    task = Dyck1(Dyck1Config(**SMALL))
    split = tags("(())", "()()", "(()())")
    # targets: (()) -> 1,1,1,0 ; ()() -> 0,... ; second output per step
    perfect = np.array([[0.9, 0.8], [0.7, 0.6], [0.99, 0.51], [0.8, 0.1]])
    all_zero_second = np.array([[0.9, 0.1], [0.9, 0.1], [0.9, 0.1], [0.9, 0.1]])  # ()(): 1,0,1,0
    first_wrong_at_4 = np.array([[1, 1], [1, 1], [1, 1], [1, 1], [0.2, 1], [1, 0]], dtype=float)
    out = task.score(split, [perfect, all_zero_second, first_wrong_at_4])
    assert out["fpf"].tolist() == [4, 0, 4]  # ()() second output: target 1 at step 0
    assert out["correct"].tolist() == [1, 0, 0]
    exactly_half = perfect.copy()
    exactly_half[3, 1] = 0.5  # 0.5 counts as 0, the target there is 0
    exactly_half[2, 1] = 0.5  # target 1 -> wrong at step 2
    out = task.score(tags("(())"), [exactly_half])
    assert out["fpf"].tolist() == [2] and out["correct"].tolist() == [0]
    ok = np.array([[1, 1], [1, 0], [1, 1], [1, 0]], dtype=float)
    assert task.score(tags("()()"), [ok])["fpf"].tolist() == [4]
    assert task.render(tags("()()"), ok, index=0) == "fpf=4"
    assert task.render(split, all_zero_second, index=1) == "fpf=0"
    assert task.render(split, ok) == "1010"
    with pytest.raises(ValueError, match="shape"):
        task.score(tags("()"), [np.zeros((3, 2))])


def test_published_files_match_the_target_function(shared_data: Path) -> None:
    folder = shared_data / "dyck1"
    task = Dyck1(Dyck1Config(data_dir=str(folder)))
    task.check()
    built = task.build(0)
    sizes = {name: len(s) for name, s in built.splits.items()}
    assert sizes == {"train": 10_000, "val": 5_000, "long": 5_000, "very_long": 100, "zigzag": 10}
    assert built.splits["val"].data.ids[0] == 15_000
    for split in built.splits.values():
        data = split.data
        assert isinstance(data, SeqTags)
        for x, y in zip(data.x, data.y, strict=True):
            s = decode(x)
            assert is_dyck(s)
            assert y[:, 1].astype(int).tolist() == depth_bits(s)
    zig = built.splits["zigzag"].data
    assert isinstance(zig, SeqTags)
    assert [zigzag_j(x) for x in zig.x] == list(Dyck1Config().zigzag_js)
    long = strings(built.splits["long"].data)
    assert min(map(len, long)) >= 52 and max(map(len, long)) <= 100
    assert built.meta["max_len"] == 2000 and built.meta["train_max_len"] == 50


def test_data_dir_errors_name_the_field(tmp_path: Path) -> None:
    missing = Dyck1(Dyck1Config(data_dir=str(tmp_path / "nope")))
    for call in (missing.check, lambda: missing.build(0)):
        with pytest.raises(ConfigError) as err:
            call()
        assert err.value.field == "task.data_dir"
    with pytest.raises(ConfigError) as required:
        Dyck1(Dyck1Config()).check(data_dir_required=True)
    assert required.value.field == "task.data_dir"
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "Dyck1_Dataset_Suzgun_train_.txt").write_text("(),10,[]\n")
    with pytest.raises(ConfigError, match="lacks"):
        Dyck1(Dyck1Config(data_dir=str(partial))).check()


def test_short_or_malformed_files_raise_data_errors(tmp_path: Path) -> None:
    from trainables.tasks.dyck import PUBLISHED_FILES

    for name in PUBLISHED_FILES.values():
        (tmp_path / name).write_text("(()),1110,[]\n()(),1010,[]\n")
    with pytest.raises(DataError, match="train_size"):
        Dyck1(Dyck1Config(data_dir=str(tmp_path))).build(0)
    (tmp_path / PUBLISHED_FILES["zigzag"]).write_text("(()),111,[]\n")
    cfg = {"train_size": 2, "val_size": 1, "long_size": 2, "very_long_size": 2}
    with pytest.raises(DataError, match="one 0/1 digit per"):
        Dyck1(Dyck1Config(data_dir=str(tmp_path), **cfg)).build(0)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"p": 0.7, "q": 0.3}, "task.p"),
        ({"q": 0.5}, "task.p"),
        ({"min_len": 2, "max_len": 6, "train_size": 5, "val_size": 5}, "task.max_len"),
        ({"very_long_len": 999}, "task.very_long_len"),
        ({"train_size": 0}, "task.train_size"),
        ({"zigzag_js": (0,)}, "task.zigzag_js"),
    ],
)
def test_config_errors_name_the_field(override: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        Dyck1Config(**override)  # type: ignore[arg-type]
    assert err.value.field == field


def test_trivial_predictor_fpf_by_hand() -> None:
    task = Dyck1(Dyck1Config(**SMALL))
    # "depth > 0" everywhere fails at the first return to depth 0
    split = tags("(())", "()()", "(()())", "((()))()")
    assert trivial_failure(split.data.y).tolist() == [3, 1, 5, 5]
    ones = [np.ones((len(x), 2)) for x in split.data.x]
    out = task.score(split, ones)  # the trivial predictor itself, scored as a model
    assert out["fpf"].tolist() == out["fpf_trivial"].tolist() == [3, 1, 5, 5]
    assert out["correct"].tolist() == [0, 0, 0, 0]
    perfect = [y.copy() for y in split.data.y]
    assert task.score(split, perfect)["fpf_trivial"].tolist() == [3, 1, 5, 5]  # not the run's
    assert task.score(tags("()()"), [perfect[1]])["fpf_trivial"].tolist() == [1]  # new data, same name
    assert set(out) <= set(Dyck1.declared_metrics())


def test_analysis_declares_the_papers_aggregates() -> None:
    from analysis.aggregates import BestK, CheckpointRegression, parse_aggregates
    from analysis.manifest import Axis, parse_declarations

    spec = json.loads(json.dumps(Dyck1(Dyck1Config()).analysis()))  # pure data
    very_long_fpf = {"split": "very_long", "metric": "fpf"}
    assert spec["regressions"] == [
        {"x": {"split": "val", "metric": "loss", "transform": "neglog"}, "y": very_long_fpf, "over": "runs"}
    ]
    assert spec["histograms"] == [very_long_fpf]
    decl = parse_declarations(spec)
    assert not decl.unknown
    best, reg, base = parse_aggregates(decl.aggregates)
    assert isinstance(best, BestK) and (best.subset.k, best.subset.by, best.subset.mode) == (10, Axis("val", "loss"), "min")
    assert Axis("very_long", "fpf") in best.of
    assert isinstance(reg, CheckpointRegression) and reg.y == Axis("very_long", "fpf")
    assert [x.split for x in reg.xs] == ["train", "val", "long"] and {x.transform for x in reg.xs} == {"neglog"}
    assert reg.runs == best.subset
    assert (base.metric, base.baseline) == ("fpf", "fpf_trivial")  # type: ignore[attr-defined]
    assert "fpf_trivial" in spec["metric_definitions"] and "fpf_trivial" in Dyck1.declared_metrics()


def test_default_build_has_paper_sizes_and_meta() -> None:
    built = Dyck1(Dyck1Config()).build(0)
    sizes = {name: len(s) for name, s in built.splits.items()}
    assert sizes == {"train": 10_000, "val": 5_000, "long": 5_000, "very_long": 100, "zigzag": 10}
    train, val = strings(built.splits["train"].data), strings(built.splits["val"].data)
    assert not set(train) & set(val)
    assert built.meta["input_size"] == 2 and built.meta["output_size"] == 2
    assert built.meta["max_len"] == 2000 and built.meta["train_max_len"] == max(map(len, train))
