"""Seeding, config validation, grid expansion and planning (no Ray)."""

from __future__ import annotations

from pathlib import Path

import pytest

from study.config import expand_grid, parse
from study.plan import plan_units, seedsets
from trainables.errors import ConfigError
from trainables.results import commit_seed, committed
from trainables.seeding import derive_seed, derive_seedset

BASE = {
    "task": {"name": "symbol_rewriting", "train_size": 200, "val_size": 50, "val_ood_size": 50, "test_size": 50},
    "model": {"name": "seq2seq"},
    "train": {"max_epochs": 2},
    "seeds": {"count": 3, "root": 7},
}


def test_seeds_are_stable_distinct_and_sourced() -> None:
    a = derive_seedset(7, 3)
    assert a == derive_seedset(7, 3)
    assert len({a.init_seed, a.order_seed, a.dropout_seed, a.data_seed}) == 4
    # by default the data seed is the same for every index: one dataset per study
    assert derive_seedset(7, 0).data_seed == derive_seedset(7, 5).data_seed
    assert derive_seedset(7, 0).init_seed != derive_seedset(7, 5).init_seed
    # varying only `order` holds init fixed (variance attribution)
    b = derive_seedset(7, 4, vary=("order",))
    assert b.init_seed == derive_seedset(7, 0).init_seed and b.order_seed == derive_seed(7, "order", 4)
    assert derive_seedset(7, 2, pinned={"init": 123}).init_seed == 123
    assert derive_seed(8, "init", 0) != derive_seed(7, "init", 0)


def test_growing_a_study_reuses_the_first_seeds() -> None:
    small = parse(BASE).points[0]
    big = parse(BASE, seeds_override=6).points[0]
    assert seedsets(big)[:3] == seedsets(small)
    assert small.trial_id == big.trial_id  # seed count is not part of the trial id


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"task": {"name": "nope"}}, "task.name"),
        ({"model": {"name": "seq2seq", "hidden_sise": 3}}, "model.hidden_sise"),
        ({"train": {"lr": "fast"}}, "train.lr"),
        ({"train": {"lr": -1}}, "train.lr"),
        ({"train": {"optimizer": "rmsprop"}}, "train.optimizer"),
        ({"seeds": {"count": 0}}, "seeds.count"),
        ({"seeds": {"vary": ["weather"]}}, "seeds.vary.0"),
        ({"execution": {"device": "tpu"}}, "execution.device"),
        ({"bogus": 1}, "bogus"),
        ({"grid": {"model.cell": []}}, "grid.model.cell"),
    ],
)
def test_bad_config_names_the_field(patch: dict, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse({**BASE, **patch})
    assert info.value.field == field
    assert "Fix:" in str(info.value)


def test_grid_with_per_value_overrides() -> None:
    raw = {**BASE, "grid": {"train.lr": {"0.1": {"seeds.count": 2}, "0.5": None}}}
    points = expand_grid(raw)
    assert [v for v, _ in points] == [{"train.lr": "0.1"}, {"train.lr": "0.5"}]
    cfg = parse({**BASE, "grid": {"train.lr": {0.1: {"seeds.count": 2}, 0.5: None}}})
    assert [p.spec.train.lr for p in cfg.points] == [0.1, 0.5]
    assert [p.seeds.count for p in cfg.points] == [2, 3]
    assert cfg.points[0].trial_id != cfg.points[1].trial_id


def test_planning_skips_committed_and_bundles(tmp_path: Path) -> None:
    cfg = parse({**BASE, "execution": {"bundle_size": 2}})
    units, planned, already = plan_units(cfg, tmp_path, "s", "cpu", 2)
    assert planned == 3 and already == 0
    assert [len(u.seeds) for u in units] == [2, 1]
    tid = cfg.points[0].trial_id
    row = {"study": "s", "trial_id": tid, "unit_id": "u", "seed": 1, "init_seed": 1, "order_seed": 1,
           "dropout_seed": 1, "data_seed": 1, "selected_epoch": 1, "selected_step": 1, "epochs_run": 1,
           "status": "ok", "node": "n", "wall_s": 1.0, "committed_at": None}
    commit_seed(tmp_path, "s", tid, 1, {}, row)
    assert committed(tmp_path, "s") == {(tid, 1)}
    units, planned, already = plan_units(cfg, tmp_path, "s", "cpu", 2)
    assert already == 1 and sorted(s.index for u in units for s in u.seeds) == [0, 2]
    # no temp files left behind by the atomic writes
    assert not list(tmp_path.rglob("*.tmp"))


@pytest.mark.parametrize(
    ("model", "seeds", "device", "cpus", "sizes"),
    [
        # seq2seq caps CPU bundles at 8: 50 seeds -> 7 bundles rounded up to 8 for 2 CPUs
        ({"name": "seq2seq"}, 50, "cpu", 2, [7, 7, 6, 6, 6, 6, 6, 6]),
        ({"name": "seq2seq"}, 16, "cpu", 2, [8, 8]),
        ({"name": "seq2seq"}, 5, "cpu", 2, [3, 2]),
        ({"name": "seq2seq"}, 50, "cuda", 1, [50]),
        ({"name": "seq2seq"}, 70, "cuda", 1, [35, 35]),
    ],
)
def test_auto_bundles_follow_the_device_and_the_models_cap(
    tmp_path: Path, model: dict[str, str], seeds: int, device: str, cpus: int, sizes: list[int]
) -> None:
    cfg = parse({**BASE, "model": model, "seeds": {"count": seeds, "root": 7},
                 "execution": {"bundle_size": "auto"}})
    units, planned, _ = plan_units(cfg, tmp_path, "s", device, cpus)
    assert [len(u.seeds) for u in units] == sizes and planned == seeds
    assert sorted(s.index for u in units for s in u.seeds) == list(range(seeds))


def test_auto_bundles_without_a_cap_take_one_per_cpu(tmp_path: Path) -> None:
    cfg = parse({"task": {"name": "dyck1"}, "model": {"name": "rnn_tagger"}, "train": {"batch_size": 1, "selection": {"metric": "loss", "mode": "min"}},
                 "seeds": {"count": 30, "root": 1}, "execution": {"bundle_size": "auto"}})
    units, _, _ = plan_units(cfg, tmp_path, "s", "cpu", 2)
    assert [len(u.seeds) for u in units] == [15, 15]
