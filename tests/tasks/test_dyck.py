"""Dyck-1 task: generators, targets, zigzag, metrics, the published files, config errors."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pytest

from trainables.data import SeqTags, Split
from trainables.errors import ConfigError, DataError
from trainables.registry import TASKS
from trainables.tasks.dyck import (
    Dyck1,
    Dyck1Config,
    LengthConditionedSampler,
    SuzgunSampler,
    _Uniforms,
    decode,
    dyck_count,
    is_dyck,
    length_probs,
    sample_exact_unique,
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


def test_analysis_declares_regressions_and_histogram() -> None:
    spec = Dyck1(Dyck1Config()).analysis()
    overs = {r["over"] for r in spec["regressions"]}
    assert overs == {"runs", "checkpoints"}
    for r in spec["regressions"]:
        assert r["x"] == {"split": "val", "metric": "loss", "transform": "neglog"}
        assert r["y"] == {"split": "very_long", "metric": "fpf"}
    assert spec["histograms"] == [{"split": "very_long", "metric": "fpf"}]


def test_default_build_has_paper_sizes_and_meta() -> None:
    built = Dyck1(Dyck1Config()).build(0)
    sizes = {name: len(s) for name, s in built.splits.items()}
    assert sizes == {"train": 10_000, "val": 5_000, "long": 5_000, "very_long": 100, "zigzag": 10}
    train, val = strings(built.splits["train"].data), strings(built.splits["val"].data)
    assert not set(train) & set(val)
    assert built.meta["input_size"] == 2 and built.meta["output_size"] == 2
    assert built.meta["max_len"] == 2000 and built.meta["train_max_len"] == max(map(len, train))
