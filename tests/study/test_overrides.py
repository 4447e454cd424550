"""Overrides from the command line, Hydra style: ``study run CONFIG train.lr=0.05 seeds.count=2``.

Bad overrides are refused in-process through :func:`study.cli.cli_main` with Ray made
unreachable (one error line naming the dotted field and the fix, OUT untouched). One real
tiny study runs with overrides through a ``python -m study.cli`` subprocess: its rows,
its manifest, the refusal of a changed override (showing what changed) and the resume.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests_support import TINY_STUDY

from study import cli
from study.config import load, parse_override, partly_shadowed

TINY: dict[str, Any] = {**TINY_STUDY, "name": "ovr"}
OVERRIDES = ["train.lr=0.25", "seeds.count=2", "model.hidden_size=6"]


class RayStarted(BaseException):
    """Raised where a refused input would have started Ray (nothing may catch it)."""


@pytest.fixture()
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    import study.runner
    import study.tuning

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RayStarted("a bad override got as far as starting Ray")

    monkeypatch.setattr(study.runner, "ray_session", refuse)
    monkeypatch.setattr(study.tuning, "ray_session", refuse)


def write(tmp: Path, data: dict[str, Any], name: str = "study.yaml") -> Path:
    path = tmp / name
    path.write_text(yaml.safe_dump(data))
    return path


def study(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    import os

    env = {k: v for k, v in os.environ.items() if k in ("HOME", "PYTHONPATH", "VIRTUAL_ENV", "LANG", "PATH")}
    res = subprocess.run([sys.executable, "-m", "study.cli", *args], capture_output=True, text=True,
                         timeout=600, env={"RAY_USAGE_STATS_ENABLED": "0", **env})
    if check and res.returncode != 0:
        raise AssertionError(f"study {' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


# ------------------------------------------------------------------------ parsing and merging
@pytest.mark.parametrize(
    ("text", "path", "value"),
    [
        ("train.lr=0.05", "train.lr", 0.05),
        ("seeds.count=10", "seeds.count", 10),
        ("train.lr=1e-3", "train.lr", 0.001),  # a float, as in Hydra (YAML 1.1 would keep text)
        ("model.bidirectional=true", "model.bidirectional", True),
        ("seeds.vary=[init,order]", "seeds.vary", ["init", "order"]),
        ("task.data_dir=null", "task.data_dir", None),
        ("train.selection={split: val, metric: loss}", "train.selection", {"split": "val", "metric": "loss"}),
        ("+train.weight_decay=0.1", "train.weight_decay", 0.1),
        ("grid.model.cell=[lstm,gru]", "grid.model.cell", ["lstm", "gru"]),
        ("name=other", "name", "other"),
        ("task.note=a=b", "task.note", "a=b"),
    ],
)
def test_values_read_as_yaml_like_hydra(text: str, path: str, value: Any) -> None:
    o = parse_override(text)
    assert (o.path, o.value, o.text) == (path, value, text)
    assert type(o.value) is type(value)


def test_an_override_is_the_same_config_as_the_edited_file(tmp_path: Path) -> None:
    base = write(tmp_path, TINY)
    edited = write(tmp_path, {**TINY, "train": {**TINY["train"], "lr": 0.25}, "seeds": {**TINY["seeds"], "count": 2},
                              "model": {**TINY["model"], "hidden_size": 6}}, "edited.yaml")
    over, plain = load(base, None, OVERRIDES), load(edited)
    assert over.points[0].trial_id == plain.points[0].trial_id
    assert over.identity_hash == plain.identity_hash and over.raw == plain.raw
    assert over.points[0].seeds.count == 2 and over.points[0].spec.train.lr == 0.25
    assert over.overrides == tuple(OVERRIDES) and plain.overrides == ()
    assert TINY["train"]["lr"] == 0.125  # the file's content was not changed in place


def test_a_grid_override_sets_every_point(tmp_path: Path) -> None:
    cfg = load(write(tmp_path, {**TINY, "grid": {"train.lr": [0.1, 0.2]}}), None, ["model.hidden_size=6"])
    assert [p.spec.model.hidden_size for p in cfg.points] == [6, 6]
    cfg = load(write(tmp_path, TINY), None, ["grid.train.lr=[0.1,0.2,0.3]"])
    assert [p.spec.train.lr for p in cfg.points] == [0.1, 0.2, 0.3]


def test_a_list_of_an_axis_the_file_maps_keeps_each_values_overrides(tmp_path: Path) -> None:
    """``grid.AXIS=[v]`` where the file writes the axis as value -> overrides: the file's point
    for v, its overrides and trial_id included (before: the overrides were dropped, and
    `'grid.task.kind=[addition]'` of the length study trained another config silently); a
    value the file lacks gets none, and a field outside the kept values' overrides applies."""
    grid = {"train.lr": {0.1: {"model.hidden_size": 6}, 0.2: {"model.hidden_size": 5}, 0.3: None}}
    path = write(tmp_path, {**TINY, "grid": grid})
    whole = {p.values["train.lr"]: p for p in load(path).points}
    picked = load(path, None, ["grid.train.lr=[0.2,0.4]", "model.hidden_size=7"]).points
    assert [(p.spec.train.lr, p.spec.model.hidden_size) for p in picked] == [(0.2, 5), (0.4, 7)]
    assert picked[0].trial_id == whole[0.2].trial_id
    assert load(path, None, ["grid.train.lr=[0.3]"]).points[0].trial_id == whole[0.3].trial_id


SHADOWED = [
    (["train.lr=0.5"], {"train.lr": [0.1, 0.2]},
     "train.lr: is a grid axis (grid.train.lr): every grid point sets it, so this override would change nothing. "
     "Fix: choose the axis's values instead, e.g. 'grid.train.lr=[0.5]'"),
    (["train.lr=abc"], {"train.lr": [0.1, 0.2]}, "train.lr: is a grid axis"),  # never checked before either
    (["model.hidden_size=8"], {"train.lr": {0.1: {"model.hidden_size": 6}, 0.2: {"model.hidden_size": 5}}},
     "model.hidden_size: is set by every value of grid.train.lr in the study file, so this override would change "
     "nothing. Fix: give the axis with the value you want per point, e.g. "
     "'grid.train.lr={0.1: {model.hidden_size: 8}}', or edit the study file"),
]


@pytest.mark.parametrize(("argv", "grid", "message"), SHADOWED)
def test_an_override_every_grid_point_replaces_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_ray: None, argv: list[str], grid: dict, message: str
) -> None:
    """Before, it was silently ignored and never validated (`task.kind=sort` ran all seven
    tasks of the length study, `task.kind=sortt` too). An override that only some points
    replace still applies to the others."""
    config = write(tmp_path, {**TINY, "grid": grid})
    out = tmp_path / "results"
    rc = cli.cli_main(["run", str(config), *argv, "--out", str(out)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"error: {message}"), err
    assert not out.exists()
    some = {"train.lr": {0.1: {"model.hidden_size": 6}, 0.2: None}}
    points = load(write(tmp_path, {**TINY, "grid": some}), None, ["model.hidden_size=8"]).points
    assert [p.spec.model.hidden_size for p in points] == [6, 8]


def test_an_override_some_grid_points_replace_is_noted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_ray: None
) -> None:
    """It applies to the other points only, and said nothing (`task.random_start=0` on the
    length study trains addition with the file's 30)."""
    some = {"train.lr": {0.1: {"model.hidden_size": 6}, 0.2: None, 0.3: {"train.batch_size": 2}}}
    config = write(tmp_path, {**TINY, "grid": some})
    assert partly_shadowed(load(config, None, ["train.batch_size=4"])) == [
        "note: train.batch_size=4 applies to 2 of the 3 values of grid.train.lr; 0.3 sets train.batch_size "
        "in the study file, which wins there"]
    assert partly_shadowed(load(config, None, ["train.clip_norm=1"])) == []
    with pytest.raises(RayStarted):  # a note, not a refusal: the study goes on to Ray
        cli.cli_main(["run", str(config), "model.hidden_size=8", "--out", str(tmp_path / "results")])
    assert ("note: model.hidden_size=8 applies to 2 of the 3 values of grid.train.lr; 0.1 sets "
            "model.hidden_size in the study file") in capsys.readouterr().err


def test_a_tune_space_override_sets_one_searched_field(tmp_path: Path) -> None:
    """A space key is itself a dotted field: ``tune.space.train.lr.high`` is ``high`` of
    ``train.lr`` (it was split into blocks ``train`` and ``lr``)."""
    space = {"train.lr": {"low": 0.01, "high": 1.0, "log": True}, "model.dropout": {"low": 0.0, "high": 0.5}}
    path = write(tmp_path, {**TINY, "tune": {"trials": 2, "space": space}})
    cfg = load(path, None, ["tune.space.train.lr.high=0.5", "tune.space.model.hidden_size={low: 4, high: 16, type: int}"])
    assert cfg.raw["tune"]["space"] == {
        "train.lr": {"low": 0.01, "high": 0.5, "log": True},
        "model.dropout": {"low": 0.0, "high": 0.5},
        "model.hidden_size": {"low": 4, "high": 16, "type": "int"},
    }
    cfg = load(path, None, ["tune.space={train.lr: {low: 0.1, high: 0.2}}"])  # the whole space
    assert cfg.raw["tune"]["space"] == {"train.lr": {"low": 0.1, "high": 0.2}}


BAD: list[tuple[str, list[str], str]] = [
    ("unknown-block", ["trian.lr=0.1"], "error: trian.lr: unknown block 'trian'. Fix: start the path with one of"),
    ("unknown-field", ["train.lrr=0.1"], "error: train.lrr: unknown field (set on the command line by 'train.lrr=0.1')"),
    ("bad-type", ["train.batch_size=big"], "error: train.batch_size: "),
    ("out-of-range", ["seeds.count=0"], "error: seeds.count: "),
    ("bool-for-number", ["train.lr=true"], "error: train.lr: "),
    ("no-equals", ["train.lr"], "error: train.lr: not an override (no `field=value`). Fix: write `dotted.field=value`"),
    ("bad-yaml", ["task.long_lengths=[5,"], "error: task.long_lengths: value '[5,' is not a YAML value"),
    ("twice", ["train.lr=0.1", "train.lr=0.2"], "error: train.lr: given twice on the command line"),
    # a documented value YAML cannot read bare: the fix quotes the user's field (it showed task.data_dir, and '\x00')
    ("bare-star", ["task.op=*"], "error: task.op: value '*' is not a YAML value (expected alphabetic or numeric "
     "character, but found the value's end at line 1, column 2). Fix: quote it: \"task.op='*'\""),
    ("whole-block", ["train=0.1"], "error: train: `train` is a block, not a field"),
    ("into-a-value", ["train.lr.x=1"], "error: train.lr.x: train.lr is 0.125 in the study file, not a block"),
    ("delete", ["~train.lr=1"], "error: ~train.lr: deleting a field"),
    ("unknown-model-field", ["model.hiden_size=8"], "error: model.hiden_size: unknown field"),
    ("with-seeds", ["seeds.count=3", "--seeds", "4"], "error: --seeds: given together with the override seeds.count"),
    # YAML reads {low:0,high:0.3} as two keys without values (before: "low: required field missing")
    # a misspelt bound (was "Input should be a valid dictionary", the fix pointing at a file without tune:)
    ("misspelt-bound", ["tune.space.train.lr.hgh=0.5"],
     "error: tune.space.train.lr.hgh: 'hgh' is not a bound of a searched field (a range is low, high, log, "
     "type). Fix: set one of them, e.g. `tune.space.train.lr.high=0.5`"),
    ("no-space-after-colon", ["tune.space.model.dropout={low:0,high:0.3}"],
     "error: tune.space.model.dropout: value '{low:0,high:0.3}' reads as keys 'low:0', 'high:0.3' without values "
     "(YAML needs a space after each colon). Fix: write {low: 0, high: 0.3}"),
]


CASES = [(c, a, n) for c in ("run", "tune") for _, a, n in BAD if not (c == "tune" and "--seeds" in a)]
CASES.append(("run", ["tune.space.train.lr.high=0.5"], "error: tune.space.train.lr.high: only `study tune` reads the "
              "tune: block, so on `study run` this override would change nothing. Fix: leave it out"))


@pytest.mark.parametrize(
    ("command", "argv", "needle"), CASES,
    ids=[*(f"{c}-{i}" for c in ("run", "tune") for i, a, _ in BAD if not (c == "tune" and "--seeds" in a)),
         "run-tune-override"],
)
def test_bad_overrides_are_refused_before_ray(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_ray: None, command: str, argv: list[str], needle: str
) -> None:
    config = write(tmp_path, {**TINY, "tune": {"trials": 2, "seeds_per_candidate": 1}})
    out = tmp_path / "results"
    rc = cli.cli_main([command, str(config), *argv, "--out", str(out)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(needle) and "Fix:" in err[0], err[0]
    assert not out.exists()


def test_from_best_takes_no_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str], no_ray: None) -> None:
    rc = cli.cli_main(["run", "--from-best", "t", "train.lr=0.1", "--out", str(tmp_path / "results")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: train.lr=0.1: overrides need a CONFIG") and "Fix:" in err


@pytest.mark.parametrize("command", ["run", "tune"])
def test_an_override_in_place_of_the_file_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_ray: None, command: str
) -> None:
    rc = cli.cli_main([command, "train.lr=0.1", "--out", str(tmp_path / "results")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: CONFIG: 'train.lr=0.1' is an override, not a study file"), err


# ------------------------------------------------------------------------ a real tiny study
@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("overrides")
    cfg = write(root, TINY)
    out = root / "results"
    study("run", str(cfg), *OVERRIDES, "--out", str(out), "--num-cpus", "1")
    return cfg, out


def sql(out: Path, query: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(study("sql", "--out", str(out), "--format", "json", query).stdout)
    return rows


def test_overrides_reach_the_trials_and_the_manifest(ran: tuple[Path, Path]) -> None:
    _, out = ran
    assert [r["seed"] for r in sql(out, "SELECT seed FROM runs WHERE study = 'ovr' ORDER BY seed")] == [0, 1]
    trials = sql(out, "SELECT DISTINCT train_lr, model_hidden_size FROM trials WHERE study = 'ovr'")
    assert trials == [{"train_lr": 0.25, "model_hidden_size": 6}]
    m = json.loads((out / "ovr" / "study.json").read_text())
    assert m["overrides"] == OVERRIDES
    assert m["config"]["train"]["lr"] == 0.25 and m["config"]["model"]["hidden_size"] == 6
    assert m["config"]["seeds"]["count"] == 2 and m["seeds"] == 2


def test_a_changed_override_is_refused_showing_the_difference(ran: tuple[Path, Path]) -> None:
    cfg, out = ran
    before = (out / "ovr" / "study.json").read_bytes()
    res = study("run", str(cfg), "train.lr=0.5", "seeds.count=2", "model.hidden_size=6", "--out", str(out), check=False)
    assert res.returncode == 2 and "different config" in res.stderr and "--name" in res.stderr
    assert "changed: train.lr 0.25 -> 0.5." in res.stderr, res.stderr
    res = study("run", str(cfg), "--out", str(out), check=False)  # the file alone: both overrides undone
    assert res.returncode == 2 and "changed: model.hidden_size 6 -> 8; train.lr 0.25 -> 0.125." in res.stderr
    assert "Traceback" not in res.stderr and (out / "ovr" / "study.json").read_bytes() == before


def test_resume_reuses_the_recorded_overrides(ran: tuple[Path, Path]) -> None:
    _, out = ran
    res = study("resume", "ovr", "--out", str(out))
    assert "ovr: 2/2 runs committed" in res.stdout
    m = json.loads((out / "ovr" / "study.json").read_text())
    assert m["overrides"] == OVERRIDES and m["config"]["train"]["lr"] == 0.25
    status = json.loads(study("status", "ovr", "--out", str(out), "--format", "json").stdout)
    assert [(s["planned"], s["done"], s["pending"]) for s in status] == [(2, 2, 0)]


def test_run_on_a_tuning_file_says_the_tune_block_is_not_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_ray: None
) -> None:
    config = write(tmp_path, {**TINY, "tune": {"trials": 2, "seeds_per_candidate": 1}})
    with pytest.raises(RayStarted):  # a valid study: it gets as far as starting Ray
        cli.cli_main(["run", str(config), "--out", str(tmp_path / "results")])
    assert "has a tune: block, which `study tune` searches with" in capsys.readouterr().err
    with pytest.raises(RayStarted):
        cli.cli_main(["run", str(write(tmp_path, TINY, "plain.yaml")), "--out", str(tmp_path / "results")])
    assert "tune: block" not in capsys.readouterr().err
