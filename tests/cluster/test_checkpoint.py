"""The trainable's fault-tolerance pieces, driven directly through Tune's Trainable API
(no Ray started): the checkpoint round trip a retried trial relies on, and the clear
error a node without the shared results folder gives."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from study.config import load
from study.plan import plan_units, unit_payload
from trainables.errors import DataError

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny_cluster.yaml"


def payload(out: Path, name: str) -> dict[str, Any]:
    """The first unit of the tiny cluster study (a bundle of two seeds) as a trial gets it."""
    cfg = load(CONFIG, 2)
    units, planned, _ = plan_units(cfg, out, name, "cpu", 2)
    assert planned == 2 and len(units) == 1
    return unit_payload(units[0], cfg, out, name, "cpu", {})


@pytest.fixture()
def trainables(torch_threads: None) -> Iterator[list[Any]]:
    """Trainables made by a test; their scratch log folders are removed afterwards."""
    made: list[Any] = []
    yield made
    for t in made:
        t.stop()
        shutil.rmtree(t.logdir, ignore_errors=True)


def make(made: list[Any], unit: dict[str, Any]) -> Any:
    from trainables.trainable import FinelineTrainable

    # one epoch per step, so two trainables can be compared step by step
    t = FinelineTrainable(config={"unit": {**unit, "report_every_s": 0.001}})
    made.append(t)
    return t


def test_restored_trial_continues_exactly_where_it_stopped(
    tmp_path: Path, trainables: list[Any]
) -> None:
    out = tmp_path / "results"
    (out / "ck").mkdir(parents=True)  # the driver creates OUT/<study> before launching
    unit = payload(out, "ck")
    first = make(trainables, unit)
    first.train()
    first.train()
    saved = first.save(str(tmp_path / "checkpoint"))
    assert (tmp_path / "checkpoint" / "bundle.pt").is_file()

    second = make(trainables, unit)  # a fresh actor, as after a crash
    assert second.run.epoch == 0
    second.restore(saved)
    assert (
        (second.run.epoch, second.run.step)
        == (first.run.epoch, first.run.step)
        == (2, first.run.step)
    )
    assert first.run.step > 0
    for (k, a), b in zip(
        first.run.model.state_dict().items(), second.run.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), k
    # the next epoch (data order, dropout, optimizer) is the same computation in both
    a, b = first.train(), second.train()
    assert (a["epoch"], a["opt_step"]) == (b["epoch"], b["opt_step"]) == (3, a["opt_step"])
    assert a["objective"] == b["objective"]
    for (k, pa), pb in zip(
        first.run.model.state_dict().items(), second.run.model.state_dict().values(), strict=True
    ):
        assert torch.equal(pa, pb), k


def test_node_without_the_results_folder_fails_clearly(
    tmp_path: Path, trainables: list[Any]
) -> None:
    out = tmp_path / "results"  # never created: as on a node without the shared mount
    t = make(trainables, payload(out, "nomount"))
    with pytest.raises(DataError) as err:
        t.step()
    message = str(err.value)
    assert str(out / "nomount") in message and "on node" in message
    assert "Fix:" in message and "same path on every node" in message
    assert t.run.epoch == 0, "nothing may train before the folder is checked"
    assert not out.exists(), "the check must not create the folder locally"


def test_a_unit_asks_for_a_checkpoint_after_each_result_but_its_last(
    tmp_path: Path, trainables: list[Any]
) -> None:
    """Seed studies checkpoint only where a result asks (``study.runner.launch``): a
    finished unit has committed its seeds, so a retry has nothing to resume from it."""
    out = tmp_path / "results"
    (out / "ask").mkdir(parents=True)
    unit = payload(out, "ask")
    unit["spec"]["train"]["max_epochs"] = 3
    t = make(trainables, unit)  # one epoch per result
    results = [t.train()]
    while not results[-1].get("done"):
        results.append(t.train())
    assert [r["epoch"] for r in results] == [1, 2, 3]
    assert [r["should_checkpoint"] for r in results] == [True, True, False]
    assert len(stems_of(out, "ask")) == 2, "both seeds committed with the last result"


def stems_of(out: Path, study: str) -> list[str]:
    return sorted(p.stem for p in (out / "tables" / "runs" / f"study={study}").glob("*.parquet"))
