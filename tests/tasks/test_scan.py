"""SCAN: the grammar generator, the addprim_jump split, settings A/B, the exact metric."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from trainables.data import EOS, PAD, SeqPairs
from trainables.errors import ConfigError
from trainables.registry import TASKS
from trainables.tasks.scan import (
    SRC_VOCAB,
    TGT_VOCAB,
    Scan,
    ScanConfig,
    addprim_split,
    parse_scan_file,
    scan_commands,
)


def _task(**fields: object) -> Scan:
    return Scan(ScanConfig(**fields))


def _texts(data: SeqPairs) -> list[tuple[str, tuple[str, ...]]]:
    return [
        (" ".join(SRC_VOCAB.decode(s)), tuple(TGT_VOCAB.decode(t)))
        for s, t in zip(data.src, data.tgt, strict=True)
    ]


@pytest.fixture(scope="module")
def built_a():
    return _task().build(data_seed=7)


def test_registered():
    assert TASKS.get("scan") is Scan


def test_hand_worked_commands_follow_the_grammar():
    meaning = dict(scan_commands())
    assert meaning["jump"] == ("I_JUMP",)
    assert meaning["turn left twice"] == ("I_TURN_LEFT",) * 2
    assert meaning["turn around right"] == ("I_TURN_RIGHT",) * 4
    assert meaning["turn opposite left thrice"] == ("I_TURN_LEFT",) * 6
    assert meaning["look around left"] == ("I_TURN_LEFT", "I_LOOK") * 4
    assert meaning["walk opposite left after run"] == (
        "I_RUN",
        "I_TURN_LEFT",
        "I_TURN_LEFT",
        "I_WALK",
    )
    assert meaning["jump right and walk twice"] == ("I_TURN_RIGHT", "I_JUMP", "I_WALK", "I_WALK")
    assert "turn" not in meaning and "turn twice" not in meaning


def test_generator_reproduces_published_tasks_txt(shared_data: Path):
    generated = scan_commands()
    published = parse_scan_file(shared_data / "scan" / "tasks.txt")
    assert len(generated) == len(set(generated)) == 20_910
    assert set(generated) == set(published)


def test_addprim_split_matches_published_files(shared_data: Path):
    train, test = addprim_split(scan_commands(), repeats=1467)
    published_train = parse_scan_file(shared_data / "scan" / "tasks_train_addprim_jump.txt")
    published_test = parse_scan_file(shared_data / "scan" / "tasks_test_addprim_jump.txt")
    assert Counter(train) == Counter(published_train)
    assert set(test) == set(published_test) and len(test) == len(published_test)


def test_setting_a_splits(built_a):
    splits = built_a.splits
    assert {n: (s.role, len(s)) for n, s in splits.items()} == {
        "train": ("train", 14_670),
        "train_eval": ("val", 100),
        "test": ("test", 100),
        "test_full": ("test", 7_706),
    }
    jump = SRC_VOCAB.index["jump"]
    train_src = [tuple(s) for s in splits["train"].data.src]
    assert Counter(train_src)[(jump,)] == 1_467
    assert all(jump not in s for s in train_src if s != (jump,))
    test_src = [tuple(s) for s in splits["test_full"].data.src]
    assert all(jump in s and len(s) > 1 for s in test_src)
    assert len(set(test_src)) == 7_706


def test_meta(built_a):
    meta = built_a.meta
    assert meta["src_vocab"] == SRC_VOCAB and meta["tgt_vocab"] == TGT_VOCAB
    assert (meta["max_src_len"], meta["max_tgt_len"]) == (9, 48)
    steps = meta["decode_len"](np.array([1, 5, 9]))
    assert steps.tolist() == [49, 49, 49]


def test_setting_b_trains_on_every_command_including_test():
    data = _task(setting="B").build(data_seed=7)
    train = {tuple(s) for s in data.splits["train"].data.src}
    test = [tuple(s) for s in data.splits["test_full"].data.src]
    assert len(data.splits["train"]) == len(train) == 20_910
    assert len(test) == 7_706 and set(test) <= train


def test_curve_splits_are_subsets_fixed_by_the_data_seed(built_a):
    for name, parent in (("train_eval", "train"), ("test", "test_full")):
        sub, full = built_a.splits[name].data, built_a.splits[parent].data
        assert len(set(sub.ids.tolist())) == 100
        for i, row in enumerate(sub.ids):
            assert np.array_equal(sub.src[i], full.src[row])
            assert np.array_equal(sub.tgt[i], full.tgt[row])
    again = _task().build(data_seed=7).splits
    other = _task().build(data_seed=8).splits
    assert np.array_equal(again["test"].data.ids, built_a.splits["test"].data.ids)
    assert not np.array_equal(other["test"].data.ids, built_a.splits["test"].data.ids)
    assert not np.array_equal(other["train_eval"].data.ids, built_a.splits["train_eval"].data.ids)


@pytest.mark.parametrize("setting", ["A", "B"])
def test_data_dir_gives_the_same_data_as_the_generator(shared_data: Path, setting: str):
    loaded = _task(setting=setting, data_dir=str(shared_data / "scan")).build(data_seed=1)
    generated = _task(setting=setting).build(data_seed=1)
    for name in ("train", "test_full"):
        assert Counter(_texts(loaded.splits[name].data)) == Counter(
            _texts(generated.splits[name].data)
        )


def test_missing_data_dir_files_raise_config_error(tmp_path: Path):
    (tmp_path / "tasks_train_addprim_jump.txt").write_text("IN: jump OUT: I_JUMP\n")
    task = _task(data_dir=str(tmp_path))
    with pytest.raises(ConfigError) as err:
        task.check()
    assert err.value.field == "task.data_dir" and "tasks_test_addprim_jump.txt" in str(err.value)
    with pytest.raises(ConfigError):
        task.build(data_seed=0)
    with pytest.raises(ConfigError, match=r"task\.data_dir"):
        _task().check(data_dir_required=True)
    _task().check()  # generated data needs no files


def test_max_train_and_max_test_subsample_by_the_data_seed(built_a):
    small = _task(max_train=50, max_test=20, n_curve=10).build(data_seed=7)
    assert [len(small.splits[n]) for n in ("train", "train_eval", "test", "test_full")] == [
        50,
        10,
        10,
        20,
    ]
    full = Counter(_texts(built_a.splits["train"].data))
    assert all(full[p] > 0 for p in _texts(small.splits["train"].data))
    assert set(_texts(small.splits["test_full"].data)) <= set(
        _texts(built_a.splits["test_full"].data)
    )
    assert small.meta["max_tgt_len"] == 48  # lengths come from the full splits
    other = _task(max_train=50, max_test=20, n_curve=10).build(data_seed=8)
    assert _texts(other.splits["train"].data) != _texts(small.splits["train"].data)


def test_bad_config_values_raise_config_error():
    with pytest.raises(ConfigError, match=r"task\.n_curve"):
        ScanConfig(n_curve=0)
    with pytest.raises(ConfigError, match=r"task\.jump_repeats"):
        ScanConfig(jump_repeats=0)
    with pytest.raises(ConfigError, match=r"task\.max_train"):
        ScanConfig(max_train=0)


def test_exact_metric_cases(built_a):
    task = _task()
    split = built_a.splits["test"]
    tgt = split.data.tgt[0]
    wrong = tgt.copy()
    wrong[-1] = (
        TGT_VOCAB.index["I_WALK"]
        if wrong[-1] != TGT_VOCAB.index["I_WALK"]
        else TGT_VOCAB.index["I_RUN"]
    )
    cases = {
        "gold_then_eos_then_pad": (np.r_[tgt, EOS, PAD, PAD], 1.0),
        "junk_after_eos": (np.r_[tgt, EOS, tgt[:3]], 1.0),
        "no_eos": (np.r_[tgt, tgt[:1]], 0.0),
        "early_eos": (np.r_[tgt[:-1], EOS, tgt[-1:]], 0.0),
        "late_eos": (np.r_[tgt, tgt[-1:], EOS], 0.0),
        "wrong_token": (np.r_[wrong, EOS], 0.0),
    }
    for name, (pred, expected) in cases.items():
        preds = [pred] + [np.r_[t, EOS] for t in split.data.tgt[1:]]
        exact = task.score(split, preds)["exact"]
        assert exact.shape == (len(split),)
        assert exact[0] == expected, name
        assert exact[1:].all()


def test_analysis_declares_existing_splits(built_a):
    decl = json.loads(json.dumps(_task().analysis()))  # pure data
    named = {a[0] for a in decl["scatter"]} | {h["split"] for h in decl["histograms"]}
    assert named | set(decl["test_splits"]) <= set(built_a.splits)
    assert decl["primary_metric"] == Scan.primary_metric


def test_render_stops_at_eos():
    task = _task()
    walk, left = TGT_VOCAB.index["I_WALK"], TGT_VOCAB.index["I_TURN_LEFT"]
    assert task.render(None, np.array([left, walk, EOS, walk])) == "I_TURN_LEFT I_WALK"  # type: ignore[arg-type]
    assert task.render(None, np.array([walk])).endswith("<no eos>")  # type: ignore[arg-type]


@pytest.mark.parametrize("setting", ["A", "B"])
def test_end_symbol_ends_every_command_with_eos_in_every_split(built_a, setting: str):
    """``end_symbol`` (Li et al.'s ``x_len = len + 1``): every source of every split, the
    curve samples included, is the same command followed by ``</s>`` (id 2, EOS); targets,
    ids, scores and decoding lengths are unchanged, ``max_src_len`` grows by 1."""
    plain = built_a if setting == "A" else _task(setting="B").build(data_seed=7)
    ended = _task(setting=setting, end_symbol=True).build(data_seed=7)
    assert SRC_VOCAB.tokens[EOS] == "</s>" and ended.meta["src_vocab"] == SRC_VOCAB
    assert set(ended.splits) == set(plain.splits) == {"train", "train_eval", "test", "test_full"}
    for name, split in ended.splits.items():
        mine, theirs = split.data, plain.splits[name].data
        assert len(mine) == len(theirs) > 0 and np.array_equal(mine.ids, theirs.ids), name
        for s, t in zip(mine.src, theirs.src, strict=True):
            assert len(s) == len(t) + 1 and s[-1] == EOS and np.array_equal(s[:-1], t)
            assert EOS not in t  # the plain command has no end token
        assert all(np.array_equal(a, b) for a, b in zip(mine.tgt, theirs.tgt, strict=True))
        gold = [np.r_[t, EOS] for t in mine.tgt]
        assert _task(setting=setting, end_symbol=True).score(split, gold)["exact"].all(), name
    assert ended.meta["max_src_len"] == plain.meta["max_src_len"] + 1 == 10
    assert ended.meta["max_src_len"] == max(len(s) for s in ended.splits["train"].data.src)
    lengths = np.array([len(s) for s in ended.splits["test_full"].data.src])
    assert np.array_equal(ended.meta["decode_len"](lengths), plain.meta["decode_len"](lengths - 1))
    assert ended.meta["max_tgt_len"] == plain.meta["max_tgt_len"]


def test_end_symbol_in_loaded_published_files(shared_data: Path):
    loaded = _task(data_dir=str(shared_data / "scan"), end_symbol=True).build(data_seed=1)
    generated = _task(end_symbol=True).build(data_seed=1)
    for name in ("train", "test_full"):
        assert all(s[-1] == EOS for s in loaded.splits[name].data.src)
        texts = Counter(_texts(loaded.splits[name].data))
        assert texts == Counter(_texts(generated.splits[name].data))
        assert all(command.endswith(" </s>") for command, _ in texts)


def test_end_symbol_is_an_added_field_that_keeps_old_trial_ids():
    from trainables.spec import RunSpec

    raw = {
        "task": {"name": "scan", "setting": "B"},
        "model": {"name": "seq2seq"},
        "train": {"selection": {"split": "train_eval", "metric": "exact"}},
    }
    before = RunSpec.from_dict(raw).trial_id()
    assert RunSpec.from_dict({**raw, "task": {**raw["task"], "end_symbol": False}}).trial_id() == before
    assert RunSpec.from_dict({**raw, "task": {**raw["task"], "end_symbol": True}}).trial_id() != before
