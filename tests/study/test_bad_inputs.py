"""A corpus of bad inputs: malformed study files, CLI arguments and data files.

Each case must be refused with a non-zero exit, ONE ``error: ...`` line on stderr that names
the field (or argument) at fault and the fix, no traceback, and an untouched OUT (not created,
or, where it existed, not changed). Most cases run in-process through the CLI's entry
function :func:`study.cli.cli_main` with Ray made unreachable (a case that got as far as
starting Ray fails loudly), so the whole corpus takes seconds; a dozen run through a real
``python -m study.cli`` subprocess.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from tests_support import TINY_STUDY

from study import cli

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"

TINY: dict[str, Any] = {**TINY_STUDY, "execution": {"bundle_size": 1}}


class RayStarted(BaseException):
    """Raised where a refused input would have started Ray (not an Exception: nothing may catch it)."""


@pytest.fixture(autouse=True)
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    import study.runner
    import study.tuning

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RayStarted("a bad input got as far as starting Ray")

    monkeypatch.setattr(study.runner, "ray_session", refuse)
    monkeypatch.setattr(study.tuning, "ray_session", refuse)


def snapshot(folder: Path) -> dict[str, tuple[int, int]] | None:
    if not folder.exists():
        return None
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


def check_refused(rc: int, stderr: str, needle: str, out: Path, before: Any) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert rc != 0, f"exit 0 for a bad input; stderr: {stderr}"
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    line = lines[0]
    assert needle in line, (needle, line)
    assert "Fix: " in line, line
    assert len(line) <= cli.MAX_ERROR + 10, len(line)
    assert snapshot(out) == before, "OUT was touched"
    return line


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    rc = cli.cli_main(argv)
    return rc, capsys.readouterr().err


def write(tmp: Path, cfg: Any, name: str = "study.yaml") -> Path:
    path = tmp / name
    if isinstance(cfg, bytes):
        path.write_bytes(cfg)
    elif isinstance(cfg, str):
        path.write_text(cfg)
    else:
        path.write_text(yaml.safe_dump(cfg, allow_unicode=True))
    return path


def patched(**blocks: Any) -> dict[str, Any]:
    """TINY with fields replaced: ``train={"lr": 1}`` merges into the block; a non-dict value
    (or a key starting with ``=``) replaces the block."""
    cfg = {k: (dict(v) if isinstance(v, dict) else v) for k, v in TINY.items()}
    for key, value in blocks.items():
        if key.startswith("_"):
            cfg[key[1:]] = value
        elif isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


INF, NAN = float("inf"), float("nan")

# --------------------------------------------------------------------------- study files
CONFIGS: list[tuple[str, dict[str, Any], str]] = [
    # a scalar or list where a block is expected
    ("task-scalar", patched(task=5), "error: task: must be a block"),
    ("task-list", patched(task=["symbol_rewriting"]), "error: task: must be a block"),
    ("model-string", patched(model="seq2seq"), "error: model: must be a block"),
    ("train-list", patched(train=[1, 2]), "error: train: must be a block"),
    ("train-scalar", patched(train=3), "error: train: must be a block"),
    ("seeds-string", patched(seeds="many"), "error: seeds: must be a block"),
    ("execution-scalar", patched(execution=5), "error: execution: must be a block"),
    ("execution-list", patched(execution=["bundle_size"]), "error: execution: must be a block"),
    ("grid-list", patched(grid=["model.hidden_size"]), "error: grid: must be a block"),
    ("tune-scalar", patched(tune=5), "error: tune: must be a block"),
    ("selection-list", patched(train={"selection": ["max"]}), "error: train.selection: "),
    ("lr-halving-scalar", patched(train={"lr_halving": 5}), "error: train.lr_halving: "),
    # infinite and NaN floats, anywhere
    ("lr-inf", patched(train={"lr": INF}), "error: train.lr: "),
    ("lr-nan", patched(train={"lr": NAN}), "error: train.lr: "),
    ("lr-minus-inf", patched(train={"lr": -INF}), "error: train.lr: "),
    ("clip-inf", patched(train={"clip_norm": INF}), "error: train.clip_norm: "),
    ("arm-above-nan", patched(train={"selection": {"arm_above": NAN}}), "error: train.selection.arm_above: "),
    ("report-every-inf", patched(execution={"report_every_s": INF}), "error: execution.report_every_s: "),
    ("cpus-nan", patched(execution={"cpus_per_trial": NAN}), "error: execution.cpus_per_trial: "),
    ("betas-nan", patched(train={"adam_betas": [NAN, 0.9]}), "error: train.adam_betas.0: "),
    ("weight-decay-inf", patched(train={"weight_decay": INF}), "error: train.weight_decay: "),
    ("single-run-prob-nan", patched(task={"single_run_prob": NAN}), "error: task.single_run_prob: "),
    ("dropout-nan", patched(model={"dropout": NAN}), "error: model.dropout: "),
    ("halving-inf", patched(train={"lr_halving": {"every_epochs": INF}}), "error: train.lr_halving.every_epochs: "),
    ("pinned-inf", patched(seeds={"pinned": {"init": INF}}), "error: seeds.pinned.init: "),
    ("grid-value-inf", patched(grid={"train.lr": [0.1, INF]}), "error: train.lr: "),
    # a boolean where a number is expected
    ("lr-bool", patched(train={"lr": True}), "error: train.lr: "),
    ("batch-bool", patched(train={"batch_size": True}), "error: train.batch_size: "),
    ("epochs-bool", patched(train={"max_epochs": False}), "error: train.max_epochs: "),
    ("count-bool", patched(seeds={"count": True}), "error: seeds.count: "),
    ("root-bool", patched(seeds={"root": False}), "error: seeds.root: "),
    ("bundle-bool", patched(execution={"bundle_size": True}), "error: execution.bundle_size: "),
    ("threads-bool", patched(execution={"threads": True}), "error: execution.threads: "),
    ("train-size-bool", patched(task={"train_size": True}), "error: task.train_size: "),
    ("hidden-bool", patched(model={"hidden_size": True}), "error: model.hidden_size: "),
    ("betas-bool", patched(train={"adam_betas": [True, 0.9]}), "error: train.adam_betas: "),
    ("patience-bool", patched(train={"selection": {"patience": True}}), "error: train.selection.patience: "),
    ("snapshots-bool", patched(train={"snapshot_epochs": [True]}), "error: train.snapshot_epochs: "),
    ("grid-value-bool", patched(grid={"model.hidden_size": [8, True]}), "error: model.hidden_size: "),
    # invalid Adam settings
    ("beta1-one", patched(train={"optimizer": "adam", "adam_betas": [1.0, 0.999]}), "error: train.adam_betas.0: "),
    ("beta1-negative", patched(train={"adam_betas": [-0.1, 0.999]}), "error: train.adam_betas.0: "),
    ("beta2-above-one", patched(train={"adam_betas": [0.9, 1.5]}), "error: train.adam_betas.1: "),
    ("betas-one-value", patched(train={"adam_betas": [0.9]}), "error: train.adam_betas"),
    ("betas-three-values", patched(train={"adam_betas": [0.9, 0.99, 0.999]}), "error: train.adam_betas"),
    ("eps-zero", patched(train={"adam_eps": 0}), "error: train.adam_eps: "),
    ("eps-negative", patched(train={"adam_eps": -1e-8}), "error: train.adam_eps: "),
    # bundles
    ("bundle-zero", patched(execution={"bundle_size": 0}), "error: execution.bundle_size: "),
    ("bundle-negative", patched(execution={"bundle_size": -1}), "error: execution.bundle_size: "),
    ("bundle-word", patched(execution={"bundle_size": "many"}), "error: execution.bundle_size: "),
    ("bundle-fraction", patched(execution={"bundle_size": 2.5}), "error: execution.bundle_size: "),
    ("reference-bundled", patched(model={"impl": "reference"}, execution={"bundle_size": 2}),
     "error: execution.bundle_size: "),
    ("reference-bundled-grid", patched(grid={"model.impl": ["fast", "reference"]}, execution={"bundle_size": 3}),
     "error: execution.bundle_size: "),
    # grids
    ("grid-execution-axis", patched(grid={"execution.bundle_size": [1, 2]}), "error: grid.execution.bundle_size: "),
    ("grid-execution-override", patched(grid={"model.hidden_size": {8: {"execution.device": "cpu"}}}),
     "error: grid.model.hidden_size.8.execution.device: "),
    ("grid-name-axis", patched(grid={"name.x": ["a", "b"]}), "error: grid.name.x: "),
    ("grid-tune-axis", patched(grid={"tune.trials": [1, 2]}), "error: grid.tune.trials: "),
    ("grid-empty-values", patched(grid={"train.lr": []}), "error: grid.train.lr: "),
    ("grid-not-dotted", patched(grid={"lr": [0.1]}), "error: grid.lr: "),
    ("grid-scalar-values", patched(grid={"train.lr": 0.1}), "error: grid.train.lr: "),
    ("grid-bad-override", patched(grid={"model.hidden_size": {8: 5}}), "error: grid.model.hidden_size.8: "),
    ("grid-duplicate-points", patched(grid={"train.lr": [0.1, 0.1]}), "error: grid: "),
    ("grid-number-path", patched(grid={5: [1]}), "error: grid.5: "),
    # a million points: refused from the axis sizes (expanding them took minutes, silently)
    ("grid-too-many-points", patched(grid={"train.lr": [round(0.001 * i, 4) for i in range(1, 101)],
                                           "model.hidden_size": list(range(1, 101)),
                                           "train.batch_size": list(range(1, 101))}),
     "error: grid: 1,000,000 points"),
    # names
    ("name-parent", patched(name="../evil"), "error: name: "),
    ("name-slash", patched(name="a/b"), "error: name: "),
    ("name-control", patched(name="bad\x01name"), "error: name: "),
    ("name-newline", patched(name="bad\n"), "error: name: "),
    ("name-dotdot", patched(name=".."), "error: name: "),
    ("name-number", patched(name=5), "error: name: "),
    ("name-list", patched(name=["a"]), "error: name: "),
    ("name-reserved", patched(name="tables"), "error: name: "),
    # other fields
    ("unknown-top-level", patched(_learning_rate=0.1), "error: learning_rate: unknown top-level field"),
    ("unknown-train-field", patched(train={"learning_rate": 0.1}), "error: train.learning_rate: unknown field"),
    ("count-zero", patched(seeds={"count": 0}), "error: seeds.count: "),
    ("count-huge", patched(seeds={"count": 200_000}), "error: seeds.count: "),
    ("vary-unknown", patched(seeds={"vary": ["nope"]}), "error: seeds.vary.0: "),
    ("optimizer-unknown", patched(train={"optimizer": "rmsprop"}), "error: train.optimizer: "),
    ("device-unknown", patched(execution={"device": "tpu"}), "error: execution.device: "),
    ("loggers-not-a-list", patched(execution={"loggers": "tensorboard"}), "Fix: write a list, e.g. [tensorboard]"),
    ("max-failures-negative", patched(execution={"max_failures": -1}), "error: execution.max_failures: "),
    ("report-every-zero", patched(execution={"report_every_s": 0}), "error: execution.report_every_s: "),
    ("lr-text", patched(train={"lr": "fast"}), "error: train.lr: "),
    ("weight-decay-negative", patched(train={"weight_decay": -1}), "error: train.weight_decay: "),
    ("symbols-zero", patched(task={"n_symbols": 0}), "error: task.n_symbols: "),
    ("model-name-missing", patched(model={"hidden_size": 8, "emb_size": 8, "name": None}), "error: model."),
    ("task-name-unknown", patched(task={"name": "nosuch"}), "error: task.name: "),
    ("selection-on-test", patched(train={"selection": {"split": "long"}}), "error: train.selection.split: "),
    ("pinned-negative", patched(seeds={"pinned": {"init": -1}}), "error: seeds.pinned.init: "),  # root < 0 was refused, this not
    # unused with mode: last, but a misspelt name was accepted silently
    ("selection-last-unknown-split", patched(train={"selection": {"split": "val_odd", "mode": "last"}}),
     "error: train.selection.split: task 'symbol_rewriting' has no split 'val_odd'. Fix: use one of: train (train)"),
    ("curve-split-unknown", patched(train={"curve_splits": ["nosuch"]}), "error: train.curve_splits: "),
    ("plugins-scalar", patched(plugins="mine"), "error: plugins: "),
    # a module that registers nothing (here the standard library's) was imported without a word
    ("plugins-registers-nothing", patched(plugins=["os"]), "error: plugins: module 'os' "),
    ("cpus-above-local", patched(execution={"cpus_per_trial": 64}), "error: execution.cpus_per_trial: "),
    # 100,000 threads per trial crashed the driver ("can't start new thread", traceback) and
    # starved the machine; more than its CPUs is refused for a local Ray, more than 1024 anywhere
    ("threads-above-local", patched(execution={"threads": (os.cpu_count() or 1) + 1}), "error: execution.threads: "),
    ("threads-huge", patched(execution={"threads": 100_000}), "error: execution.threads: "),
    ("cuda-without-gpus", patched(execution={"device": "cuda"}), "error: execution.gpus_per_trial: "),
    ("data-dir-missing", patched(task={"data_dir": "/nonexistent/dir"}), "error: task.data_dir: "),
    # a plain module too large for any machine (40 PB): built before Ray, it was a torch
    # allocator traceback (exit 1)
    ("plain-model-too-large", {"name": "huge", "task": {"name": "toy2d"},
                               "model": {"name": "mlp_plain", "hidden": [100_000_000, 100_000_000]},
                               "train": {"max_epochs": 1, "selection": {"split": "train_eval"}},
                               "seeds": {"count": 1}}, "error: model: model 'mlp_plain' has 10,000,000,"),
]


@pytest.mark.parametrize(("cfg", "needle"), [(c, n) for _, c, n in CONFIGS], ids=[i for i, _, _ in CONFIGS])
def test_bad_study_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cfg: dict[str, Any], needle: str
) -> None:
    out = tmp_path / "results"
    rc, err = run_cli(["run", str(write(tmp_path, cfg)), "--out", str(out), "--num-cpus", "2"], capsys)
    assert rc == 2
    check_refused(rc, err, needle, out, None)


def test_gpus_without_a_gpu_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from study.preflight import local_gpus

    if local_gpus():
        pytest.skip("this machine has a GPU")
    out = tmp_path / "results"
    path = write(tmp_path, patched(execution={"gpus_per_trial": 1}))
    rc, err = run_cli(["run", str(path), "--out", str(out)], capsys)
    line = check_refused(rc, err, "error: execution.gpus_per_trial: ", out, None)
    assert "this machine has none" in line


# --------------------------------------------------------------------------- raw YAML
LONG_GARBAGE = "task: {name: symbol_rewriting, " + "x" * 5000 + ": [1, 2\n"
RAW: list[tuple[str, str | bytes, str]] = [
    ("duplicate-top-key", "name: a\nname: b\n" + yaml.safe_dump({k: v for k, v in TINY.items() if k != "name"}),
     "duplicate key 'name'"),
    ("duplicate-nested-key", yaml.safe_dump(TINY).replace("lr: 0.125", "lr: 0.125\n  lr: 1.0"), "duplicate key 'lr'"),
    ("duplicate-flow-key", "name: x\ntask: {name: symbol_rewriting, name: scan}\n", "duplicate key 'name'"),
    ("not-utf8", b"name: caf\xe9\n", "not UTF-8"),
    ("utf16", "name: x\n".encode("utf-16"), "not UTF-8"),
    ("binary", bytes(range(256)), "error: CONFIG: "),
    ("empty", "", "error: (file): "),
    ("only-comment", "# nothing here\n", "error: (file): "),
    ("top-level-list", "- a\n- b\n", "error: (file): "),
    ("top-level-scalar", "hello\n", "error: (file): "),
    ("unclosed-flow", "name: x\ntask: {name: symbol_rewriting\n", "error: CONFIG: "),
    ("bad-indent", "name: x\ntask:\n  name: a\n   b: c\n", "error: CONFIG: "),
    ("tab-indent", "name: x\ntask:\n\tname: a\n", "error: CONFIG: "),
    ("python-tag", "name: !!python/object/apply:os.system ['true']\n", "error: CONFIG: "),
    ("long-garbage", LONG_GARBAGE, "error: CONFIG: "),
    ("unknown-anchor", "name: *nothing\n", "error: CONFIG: "),
]


@pytest.mark.parametrize(("text", "needle"), [(t, n) for _, t, n in RAW], ids=[i for i, _, _ in RAW])
def test_malformed_yaml_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | bytes, needle: str
) -> None:
    out = tmp_path / "results"
    rc, err = run_cli(["run", str(write(tmp_path, text)), "--out", str(out)], capsys)
    line = check_refused(rc, err, needle, out, None)
    assert rc == 2 and len(line) < 400, line


# --------------------------------------------------------------------------- CLI arguments
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Setup = Callable[[Path], list[str]]


def _run(*extra: str) -> Setup:
    def setup(tmp: Path) -> list[str]:
        return ["run", str(write(tmp, TINY)), "--out", str(tmp / "results"), *extra]
    return setup


def _with_out(out_of: Callable[[Path], Path], *args: str) -> Setup:
    def setup(tmp: Path) -> list[str]:
        return [*args, "--out", str(out_of(tmp))]
    return setup


def _file(tmp: Path) -> Path:
    f = tmp / "afile"
    f.write_text("x")
    return f


def _damaged(content: bytes | None) -> Callable[[Path], Path]:
    """An OUT holding study ``s`` whose study.json is ``content`` (None: a folder there)."""
    def out_of(tmp: Path) -> Path:
        path = tmp / "results" / "s" / "study.json"
        path.parent.mkdir(parents=True)
        if content is None:
            path.mkdir()
        else:
            path.write_bytes(content)
        return tmp / "results"
    return out_of


ARGS: list[tuple[str, Setup, str]] = [
    ("seeds-zero", _run("--seeds", "0"), "--seeds"),
    ("seeds-negative", _run("--seeds", "-3"), "--seeds"),
    ("seeds-text", _run("--seeds", "abc"), "--seeds"),
    ("seeds-above-limit", _run("--seeds", "1000000"), "error: --seeds: "),
    ("num-cpus-zero", _run("--num-cpus", "0"), "--num-cpus"),
    ("name-parent", _run("--name", "../x"), "error: --name: "),
    ("name-slash", _run("--name", "a/b"), "error: --name: "),
    ("name-newline", _run("--name", "x\n"), "error: --name: "),
    ("name-dotdot", _run("--name", ".."), "error: --name: "),
    ("name-reserved", _run("--name", "tables"), "error: --name: "),
    ("name-empty", _run("--name", ""), "error: --name: is empty. Fix: pass a name"),  # it said the config had none
    ("address-empty", _run("--address", ""), "error: --address: '' is not a Ray address"),
    ("address-garbage", _run("--address", "not an address"), "error: --address: "),
    ("address-port-range", _run("--address", "127.0.0.1:99999"), "error: --address: "),
    ("address-url", _run("--address", "http://localhost:6379/x"), "error: --address: "),
    ("address-dead", lambda tmp: _run("--address", f"127.0.0.1:{free_port()}")(tmp), "error: --address: "),
    ("unknown-option", _run("--bogus"), "--bogus"),
    ("no-config", lambda tmp: ["run", "--out", str(tmp / "results")], "error: CONFIG: "),
    ("config-and-from-best", _run("--from-best", "x"), "error: CONFIG: "),
    ("config-missing", lambda tmp: ["run", str(tmp / "nope.yaml"), "--out", str(tmp / "results")], "error: CONFIG: "),
    ("config-is-folder", lambda tmp: ["run", str(tmp), "--out", str(tmp / "results")], "error: CONFIG: "),
    ("config-dev-null", lambda tmp: ["run", "/dev/null", "--out", str(tmp / "results")],
     "error: CONFIG: '/dev/null' is not a regular file"),
    ("out-is-file", lambda tmp: ["run", str(write(tmp, TINY)), "--out", str(_file(tmp))], "error: --out: "),
    ("out-under-file", lambda tmp: ["run", str(write(tmp, TINY)), "--out", str(_file(tmp) / "sub")], "error: --out: "),
    ("out-dev-null", lambda tmp: ["run", str(write(tmp, TINY)), "--out", "/dev/null"], "error: --out: "),
    ("out-control-char", lambda tmp: ["run", str(write(tmp, TINY)), "--out", str(tmp / "a\x02b")], "error: --out: "),
    ("tune-trials-zero", lambda tmp: ["tune", str(write(tmp, TINY)), "--trials", "0", "--out", str(tmp / "results")],
     "--trials"),
    ("resume-parent", _with_out(lambda t: t / "results", "resume", "../x"), "error: NAME: "),
    ("resume-slash", _with_out(lambda t: t / "results", "resume", "a/b"), "error: NAME: "),
    ("resume-absolute", _with_out(lambda t: t / "results", "resume", "/etc"), "error: NAME: "),
    ("resume-unknown", _with_out(lambda t: t / "results", "resume", "nosuch"), "error: NAME: "),
    ("status-parent", _with_out(lambda t: t / "results", "status", "../x"), "error: NAME: "),
    ("status-tab", _with_out(lambda t: t / "results", "status", "a\tb"), "error: NAME: "),
    ("report-parent", _with_out(lambda t: t / "results", "report", "../x"), "error: NAME: "),
    ("analyze-parent", _with_out(lambda t: t / "results", "analyze", ".."), "error: NAME: "),
    ("status-out-file", _with_out(_file, "status", "x"), "error: --out: "),
    ("ls-out-dev-null", lambda tmp: ["ls", "--out", "/dev/null"], "error: --out: "),
    ("sql-out-file", _with_out(_file, "sql", "SELECT 1"), "error: --out: "),
    ("resume-damaged-json", _with_out(_damaged(b"{not json"), "resume", "s"), "study.json is damaged"),
    ("resume-damaged-binary", _with_out(_damaged(b"\xff\xfe\x00"), "resume", "s"), "study.json is damaged"),
    ("resume-damaged-keys", _with_out(_damaged(b'{"name": "s"}'), "resume", "s"), "study.json is damaged"),
    ("resume-damaged-list", _with_out(_damaged(b"[1, 2]"), "resume", "s"), "study.json is damaged"),
    ("resume-manifest-folder", _with_out(_damaged(None), "resume", "s"), "study.json is damaged"),
    ("status-damaged-json", _with_out(_damaged(b""), "status", "s"), "study.json is damaged"),
    ("unknown-command", lambda tmp: ["nosuch"], "nosuch"),
    # report options, checked before any results are read (--band named no option and gave no
    # fix; --to under a file was an OS error "File exists" naming neither, exit 1)
    ("report-band", _with_out(lambda t: t / "results", "report", "s", "--band", "wide"), "error: --band: "),
    ("report-to-under-file", lambda tmp: ["report", "s", "--to", str(_file(tmp) / "r.html"),
                                          "--out", str(tmp / "results")], "error: --to: "),
    # --to '' was Path('.'): the charts went into the current folder as PNGs; a folder named
    # with a trailing / over an existing file overwrote the file (Path() drops the slash)
    ("report-to-empty", _with_out(lambda t: t / "results", "report", "s", "--to", ""), "error: --to: is empty"),
    ("report-to-file-as-folder", lambda tmp: ["report", "s", "--to", f"{_file(tmp)}/",
                                              "--out", str(tmp / "results")], "error: --to: "),
]


@pytest.mark.parametrize("setup,needle", [(s, n) for _, s, n in ARGS], ids=[i for i, _, _ in ARGS])
def test_bad_arguments_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setup: Setup, needle: str
) -> None:
    argv = setup(tmp_path)
    out = tmp_path / "results"
    before = snapshot(out)
    rc, err = run_cli(argv, capsys)
    line = check_refused(rc, err, needle, out, before)
    assert rc == 2, line


def test_ray_address_in_the_environment_is_the_address(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``RAY_ADDRESS`` (as ``ray job submit`` sets it) is ``--address``' default, checked as
    one: a dead one is refused before Ray, where Ray itself would fail on ``--num-cpus``."""
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{free_port()}")
    out = tmp_path / "results"
    rc, err = run_cli(["run", str(write(tmp_path, TINY)), "--out", str(out)], capsys)
    line = check_refused(rc, err, "error: --address: no Ray cluster answers at 127.0.0.1:", out, None)
    assert rc == 2, line
    # --num-cpus sizes a local Ray: beside an address (here RAY_ADDRESS's) it would be ignored
    rc, err = run_cli(["run", str(write(tmp_path, TINY)), "--out", str(out), "--num-cpus", "1"], capsys)
    line = check_refused(rc, err, "error: --num-cpus: ", out, None)
    assert "(from RAY_ADDRESS)" in line and "unset RAY_ADDRESS" in line


def test_ls_lists_the_other_studies_beside_a_damaged_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One damaged manifest refused `study ls` for every study; it is now a warning with the
    fix, and the listing goes on (the damaged study without its manifest's facts). The
    analysis side reads manifests with ``analysis.manifest.load_manifest``: not UTF-8 was a
    UnicodeDecodeError traceback, and its fix said "the study rewrites it on its next run"
    (study run refuses a damaged one); each kind of damage is named with the fix."""
    for i, bad in enumerate((b'{"name": "s", "con', b"[1, 2]")):
        rc = cli.cli_main(["ls", "--out", str(_damaged(bad)(tmp_path / str(i)))])
        assert rc == 0 and "Fix: restore " in capsys.readouterr().err
    out = _damaged(b"\xff\xfe{}")(tmp_path)
    good = out / "good" / "study.json"
    good.parent.mkdir()
    good.write_text(json.dumps({"name": "good", "kind": "seeds", "task": "toy2d", "model": "mlp",
                                "config": {}, "seeds": 2, "points": [{"trial_id": "t", "point": {}, "seeds": 2}]}))
    capsys.readouterr()
    rc = cli.cli_main(["ls", "--out", str(out), "--format", "json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    listed = {r["name"]: r for r in json.loads(cap.out)}
    assert set(listed) == {"good", "s"} and listed["good"]["planned"] == 2 and listed["s"]["kind"] is None
    warnings = [ln for ln in cap.err.splitlines() if ln.startswith("warning: ")]
    assert len(warnings) == 1 and "Fix: restore " in warnings[0] and "study s is listed without it" in warnings[0]


def test_a_seed_study_under_a_tuning_studys_name_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``study tune FILE`` then ``study run FILE``: the same default name and the same config
    hash (the tune block is not part of it), so the seed study replaced the tuning study's
    manifest (kind seeds: ``--from-best`` no longer found it). Refused, the manifest kept."""
    from study import manifest
    from study.config import load
    from study.runner import check_before_ray

    out = tmp_path / "results"
    path = write(tmp_path, {**TINY, "tune": {"space": {"train.lr": {"low": 0.01, "high": 1.0}}}})
    cfg = load(path)
    manifest.prepare(out, "tiny", cfg, "tune", check_before_ray(cfg, None, 1))  # as study tune writes it
    before = snapshot(out)
    rc, err = run_cli(["run", str(path), "--out", str(out), "--num-cpus", "1"], capsys)
    err = "\n".join(ln for ln in err.splitlines() if not ln.startswith("note: "))  # the tune-block note
    line = check_refused(rc, err, "error: study 'tiny' in ", out, before)
    assert rc == 2 and "is a tuning study" in line and "--from-best tiny" in line, line
    assert manifest.read(out, "tiny")["kind"] == "tune"


def test_from_best_of_a_seed_study_says_it_is_not_a_tuning_study(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``study run --from-best X`` where X is a seed study (e.g. X-best itself) said "no
    tuning study 'X'", as if X did not exist; it now says what X is."""
    out = tmp_path / "results"
    seeds = out / "s" / "study.json"
    seeds.parent.mkdir(parents=True)
    seeds.write_text(json.dumps({"name": "s", "kind": "seeds", "task": "toy2d", "model": "mlp",
                                 "config": {}, "seeds": 2, "points": [{"trial_id": "t", "point": {}, "seeds": 2}]}))
    before = snapshot(out)
    rc, err = run_cli(["run", "--from-best", "s", "--out", str(out)], capsys)
    line = check_refused(rc, err, "error: --from-best: study 's' in ", out, before)
    assert rc == 2 and "is a seed study, not a tuning study" in line, line


# --------------------------------------------------------------------------- data files
def _dyck(tmp: Path, corrupt: Callable[[Path], None]) -> dict[str, Any]:
    folder = tmp / "dyck"
    shutil.copytree(SHARED / "dyck1", folder)
    for f in folder.iterdir():
        f.chmod(0o644)
    corrupt(folder)
    return {"name": "dyck", "task": {"name": "dyck1", "data_dir": str(folder)},
            "model": {"name": "rnn_tagger", "hidden_size": 1},
            "train": {"loss_reduction": "mean", "selection": {"split": "val", "metric": "loss", "mode": "min"}},
            "seeds": {"count": 1}}


def _scan(tmp: Path, corrupt: Callable[[Path], None]) -> dict[str, Any]:
    folder = tmp / "scan"
    folder.mkdir()
    for name in ("tasks_train_addprim_jump.txt", "tasks_test_addprim_jump.txt"):
        lines = (SHARED / "scan" / name).read_text().splitlines()[:50]
        (folder / name).write_text("\n".join(lines) + "\n")
    corrupt(folder)
    return {"name": "scan", "task": {"name": "scan", "data_dir": str(folder)},
            "model": {"name": "seq2seq", "hidden_size": 8, "emb_size": 8},
            "train": {"selection": {"split": "train_eval", "metric": "exact"}}, "seeds": {"count": 1}}


def _mnist(tmp: Path, corrupt: Callable[[Path], None]) -> dict[str, Any]:
    folder = tmp / "mnist"
    folder.mkdir()
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(SHARED / "mnist" / name, folder / name)
    corrupt(folder)
    return {"name": "mnist", "task": {"name": "mnist_pairs", "data_dir": str(folder)},
            "model": {"name": "convnet"}, "train": {"selection": {"mode": "last", "early_stop": False}},
            "seeds": {"count": 1}}


def _sr(tmp: Path, corrupt: Callable[[Path], None]) -> dict[str, Any]:
    """A symbol-rewriting study on a copy of the published files (first 20 rows each)."""
    from trainables.tasks.symbol_rewriting import PUBLISHED_FILES

    folder = tmp / "sr"
    folder.mkdir()
    for name in PUBLISHED_FILES.values():
        lines = (SHARED / "symbol_rewriting" / name).read_text().splitlines()[:20]
        (folder / name).write_text("\n".join(lines) + "\n")
    corrupt(folder)
    return {"name": "sr", "task": {"name": "symbol_rewriting", "data_dir": str(folder), "train_size": 100},
            "model": {"name": "seq2seq"}, "train": {"max_epochs": 1}, "seeds": {"count": 1}}


def _write(name: str, data: bytes | str) -> Callable[[Path], None]:
    def corrupt(folder: Path) -> None:
        path = folder / name
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return corrupt


def _prepend(name: str, line: str) -> Callable[[Path], None]:
    def corrupt(folder: Path) -> None:
        path = folder / name
        path.write_text(line + "\n" + path.read_text())
    return corrupt


def _gz(name: str, edit: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def corrupt(folder: Path) -> None:
        path = folder / name
        path.write_bytes(gzip.compress(edit(gzip.decompress(path.read_bytes()))))
    return corrupt


def _crop(idx: bytes, side: int) -> bytes:
    """An MNIST images IDX file (uncompressed) cut to its top-left ``side`` x ``side`` pixels."""
    (n,) = struct.unpack(">I", idx[4:8])
    images = np.frombuffer(idx, dtype=np.uint8, offset=16).reshape(n, 28, 28)[:, :side, :side]
    return idx[:8] + struct.pack(">II", side, side) + images.tobytes()


DYCK_TRAIN, SCAN_TRAIN = "Dyck1_Dataset_Suzgun_train_.txt", "tasks_train_addprim_jump.txt"
DATA: list[tuple[str, Callable[..., dict[str, Any]], Callable[[Path], None], str]] = [
    ("dyck-empty", _dyck, _write(DYCK_TRAIN, ""), "rows"),
    ("dyck-not-ascii", _dyck, _prepend(DYCK_TRAIN, "(é),01,x"), "not ascii text"),
    ("dyck-unknown-symbol", _dyck, _prepend(DYCK_TRAIN, "(x),011,x"), "bracket"),
    ("dyck-digits-mismatch", _dyck, _prepend(DYCK_TRAIN, "(()),01,x"), "expected 'sequence,targets"),
    ("dyck-empty-row", _dyck, _prepend(DYCK_TRAIN, ""), "expected 'sequence,targets"),
    ("scan-empty", _scan, _write(SCAN_TRAIN, ""), "no 'IN: <command> OUT: <actions>' lines"),
    ("scan-not-utf8", _scan, _write(SCAN_TRAIN, b"IN: jump OUT: I_JUMP\n\xff\xfe\n"), "not utf-8 text"),
    ("scan-malformed", _scan, _prepend(SCAN_TRAIN, "jump => I_JUMP"), "expected 'IN: <command> OUT: <actions>'"),
    ("scan-unknown-word", _scan, _prepend(SCAN_TRAIN, "IN: leap twice OUT: I_JUMP I_JUMP"), "unknown SCAN token 'leap'"),
    ("scan-unknown-action", _scan, _prepend(SCAN_TRAIN, "IN: jump OUT: I_LEAP"), "unknown SCAN token 'I_LEAP'"),
    ("scan-empty-command", _scan, _prepend(SCAN_TRAIN, "IN:  OUT: I_JUMP"), "empty command"),
    ("mnist-empty", _mnist, _write("t10k-images-idx3-ubyte.gz", b""), "not an IDX file"),
    ("mnist-bad-gzip", _mnist, _write("t10k-images-idx3-ubyte.gz", b"\x1f\x8b\x08garbage"), "corrupt gzip"),
    ("mnist-truncated", _mnist, _gz("t10k-images-idx3-ubyte.gz", lambda b: b[:-100]), "bytes follow"),
    ("mnist-swapped", _mnist, _gz("t10k-labels-idx1-ubyte.gz", lambda b: b[:3] + b"\x03" + b[4:]), "magic"),
    ("mnist-bad-labels", _mnist, _gz("t10k-labels-idx1-ubyte.gz", lambda b: b[:8] + b"\x0b" + b[9:]), "labels outside"),
    # 5x5 images passed the check; the convnet then failed in a Ray worker
    ("mnist-5x5", _mnist, _gz("t10k-images-idx3-ubyte.gz", lambda b: _crop(b, 5)), "images are 5x5 pixels, expected 28x28"),
    ("mnist-fewer-labels", _mnist, _gz("t10k-labels-idx1-ubyte.gz", lambda b: b[:4] + struct.pack(">I", 9000) + b[8:9008]),
     "10000 images but 9000 labels"),
    ("mnist-class-absent", _mnist, _gz("t10k-labels-idx1-ubyte.gz", lambda b: b[:8] + b[8:].replace(b"\x03", b"\x04")),
     "no image of classes [3]"),
    ("sr-empty", _sr, _write("grammar_std.tst.full.tsv", ""), "has no rows"),
    ("sr-not-utf8", _sr, _write("grammar_long.tst.full.tsv", b"A B .\t\xff\n"), "not UTF-8"),
    ("sr-unknown-symbol", _sr, _prepend("grammar.val.tsv", "A ZZ .\tA1_1 B1_1 C1_1\tx"), "unknown symbols"),
    ("sr-malformed", _sr, _prepend("grammar_short.tst.full.tsv", "A B C"), "expected 'input<TAB>output"),
]


@pytest.mark.parametrize(("make", "corrupt", "needle"), [(m, c, n) for _, m, c, n in DATA], ids=[i for i, *_ in DATA])
def test_bad_data_files_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any, corrupt: Any, needle: str
) -> None:
    if not SHARED.is_dir():
        pytest.skip("reference data not present")
    out = tmp_path / "results"
    path = write(tmp_path, make(tmp_path, corrupt))
    rc, err = run_cli(["run", str(path), "--out", str(out)], capsys)
    line = check_refused(rc, err, "error: task.data_dir: ", out, None)
    assert rc == 2 and needle in line, line


def test_an_mnist_train_pool_of_every_image_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A train pool that leaves no test pool is refused by the task's check, naming the field."""
    if not SHARED.is_dir():
        pytest.skip("reference data not present")
    cfg = _mnist(tmp_path, lambda folder: None)
    cfg["task"]["train_pool_size"] = 10_000
    out = tmp_path / "results"
    rc, err = run_cli(["run", str(write(tmp_path, cfg)), "--out", str(out)], capsys)
    check_refused(rc, err, "error: task.train_pool_size: is 10000 but there are only 10000 test images", out, None)
    assert rc == 2


def test_small_mnist_images_are_refused_before_ray_through_a_real_process(tmp_path: Path) -> None:
    """The tester's case: header-valid 5x5 images with labels i % 10 reached Ray and failed
    in torch ("Kernel size can't be greater than actual input size"), exit 1."""
    folder = tmp_path / "mnist5"
    folder.mkdir()
    n = 100
    images = np.arange(n * 25, dtype=np.uint64).astype(np.uint8).tobytes()
    (folder / "t10k-images-idx3-ubyte").write_bytes(struct.pack(">BBBBIII", 0, 0, 8, 3, n, 5, 5) + images)
    labels = bytes(i % 10 for i in range(n))
    (folder / "t10k-labels-idx1-ubyte").write_bytes(struct.pack(">BBBBI", 0, 0, 8, 1, n) + labels)
    config = Path(__file__).resolve().parents[2] / "configs" / "li2021_mnist.yaml"
    out = tmp_path / "results"
    res = study_process("run", str(config), f"task.data_dir={folder}", "task.train_pool_size=50", "task.n_final=0",
                        "task.n_curve=10", "seeds.count=1", "train.max_steps=2", "grid.task.setting=[A]",
                        "--out", str(out), cwd=tmp_path)
    line = check_refused(res.returncode, res.stderr, "error: task.data_dir: ", out, None)
    assert res.returncode == 2 and "images are 5x5 pixels, expected 28x28" in line, line
    assert "ray" not in res.stderr.lower().replace("array", ""), res.stderr


def _symbol_rewriting_files(tmp: Path) -> dict[str, Path]:
    from trainables.tasks.symbol_rewriting import PUBLISHED_FILES

    folder = tmp / "sr"
    folder.mkdir()
    for name in PUBLISHED_FILES.values():
        lines = (SHARED / "symbol_rewriting" / name).read_text().splitlines()[:20]
        (folder / name).write_text("\n".join(lines) + "\n")
    return {split: folder / name for split, name in PUBLISHED_FILES.items()}


@pytest.mark.parametrize(
    ("content", "needle"),
    [("", "has no rows"), (b"A B .\t\xff\n", "not UTF-8"), ("A B C\n", "expected 'input<TAB>output"),
     ("A ZZ .\tA1_1 B1_1 C1_1 A2_1 B2_1 C2_1\tx\n", "unknown symbols"), ("A .\tQ1_1\tx\n", "unknown symbols"),
     (".\tA1_1\tx\n", "no input")],
    ids=["empty", "not-utf8", "malformed", "unknown-symbol", "unknown-token", "no-input"],
)
def test_bad_symbol_rewriting_files_are_refused(tmp_path: Path, content: str | bytes, needle: str) -> None:
    from trainables.errors import ConfigError
    from trainables.tasks.symbol_rewriting_data import check_published_files

    if not SHARED.is_dir():
        pytest.skip("reference data not present")
    paths = _symbol_rewriting_files(tmp_path)
    check_published_files(paths, 40, "ABC", 2)  # the files as published pass
    target = paths["standard"]
    target.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError) as info:
        check_published_files(paths, 40, "ABC", 2)
    assert info.value.field == "task.data_dir" and needle in str(info.value), str(info.value)


# --------------------------------------------------------------------------- error text
@pytest.mark.parametrize(
    ("override", "fix"),
    [("seeds.root=-1", "Fix: use a value >= 0"), ("model.dropout=2", "Fix: use a value < 1"),
     ("train.batch_size=abc", "Fix: write a whole number there"), ("train.lr=fast", "Fix: write a number there"),
     # a union says what each alternative takes; a pair says it needs two values and shows the default
     ("execution.bundle_size=0", "Fix: use a value >= 1; or write 'auto'"),
     ("execution.bundle_size=many", "Fix: write a whole number there, e.g. 8; or write 'auto'"),
     ("train.adam_betas=0.9", "Fix: write 2 values in a list, e.g. [0.9, 0.999]"),
     ("train.adam_betas=[0.9]", "too few values (set on the command line by 'train.adam_betas=[0.9]'). Fix: write 2"),
     ("task.train_lengths=[1,3,5]", "Fix: write 2 values in a list, e.g. [5, 10]"),
     ("train.selection.early_stop=maybe", "Fix: write true or false"),
     # a nested block's unknown field lists that block's fields, not train's
     ("train.selection.patiense=2", "Fix: remove it or use one of: split, metric, mode, early_stop, patience,")],
    ids=["ge", "lt", "int", "float", "union-bound", "union-word", "pair-scalar", "pair-short", "pair-long",
         "bool", "nested-unknown"],
)
def test_a_field_out_of_range_names_the_bound_as_its_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, fix: str
) -> None:
    """The fix of a range or type error says what to write (it repeated the problem:
    "Fix: input should be greater than or equal to 0")."""
    out = tmp_path / "results"
    rc, err = run_cli(["run", str(write(tmp_path, TINY)), override, "--out", str(out)], capsys)
    line = check_refused(rc, err, f"error: {override.split('=')[0]}: ", out, None)
    assert fix in line and "Fix: input should" not in line, line


def test_error_lines_are_one_line_and_capped() -> None:
    line = cli.error_line("a\nb\n\n" + "x" * 10_000)
    assert "\n" not in line and line.startswith("error: a b x") and len(line) <= cli.MAX_ERROR + 10


def test_a_full_disk_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    import study.manifest

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "results" / "tiny" / "study.json"))

    monkeypatch.setattr(study.manifest, "write", full)
    rc, err = run_cli(["run", str(write(tmp_path, TINY)), "--out", str(tmp_path / "results")], capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 1 and len(lines) == 1 and "No space left on device" in lines[0] and "free disk space" in lines[0]


# --------------------------------------------------------------------------- real subprocesses
def study_process(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "VIRTUAL_ENV", "PYTHONPATH")}
    env |= {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run([sys.executable, "-m", "study.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def _pick(cases: list[tuple[str, Any, str]], ids: set[str]) -> Iterator[tuple[str, Any, str]]:
    return (c for c in cases if c[0] in ids)


SUBPROCESS_CONFIGS = {"train-list", "lr-inf", "lr-bool", "beta1-one", "bundle-negative", "reference-bundled",
                      "grid-execution-axis", "name-parent"}
SUBPROCESS_RAW = {"duplicate-nested-key", "not-utf8"}
SUBPROCESS_ARGS = {"address-dead", "seeds-above-limit", "resume-parent", "out-is-file"}


@pytest.mark.parametrize(
    ("kind", "case"),
    [("config", c) for c in _pick(CONFIGS, SUBPROCESS_CONFIGS)]
    + [("raw", c) for c in _pick(RAW, SUBPROCESS_RAW)]
    + [("args", c) for c in _pick(ARGS, SUBPROCESS_ARGS)],
    ids=lambda v: v if isinstance(v, str) else v[0],
)
def test_bad_input_through_a_real_process(tmp_path: Path, kind: str, case: tuple[str, Any, str]) -> None:
    _, value, needle = case
    out = tmp_path / "results"
    if kind == "args":
        argv = value(tmp_path)
    else:
        argv = ["run", str(write(tmp_path, value)), "--out", str(out)]
    before = snapshot(out)
    res = study_process(*argv, cwd=tmp_path)
    check_refused(res.returncode, res.stderr, needle, out, before)
    assert res.returncode == 2
    if "--address" not in needle:  # nothing of Ray ran, so Ray said nothing
        assert "ray" not in res.stderr.lower().replace("array", ""), res.stderr


def test_a_folder_given_as_the_study_file_is_called_a_folder(tmp_path: Path) -> None:
    """A folder named like a study file was "CONFIG: no such file 'adir.yaml'"."""
    (tmp_path / "adir.yaml").mkdir()
    out = tmp_path / "results"
    res = study_process("run", "adir.yaml", "--out", str(out), cwd=tmp_path)
    line = check_refused(res.returncode, res.stderr, "error: CONFIG: 'adir.yaml' is a folder, not a file", out, None)
    assert res.returncode == 2 and "no such file" not in line, line


OUT_ARGS: dict[str, list[str]] = {
    "run": ["CONFIG"], "tune": ["CONFIG"], "resume": ["s"], "eval": ["s"], "status": ["s"], "analyze": ["s"],
    "report": ["s"], "check": [], "ls": [], "sql": ["SELECT 1"], "stop": ["s"],
}
"""Each command that takes --out, with the arguments it needs besides."""


def test_an_empty_out_is_refused_by_every_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--out ''`` was ``Path('.')``: `study run` wrote its study into the current folder."""
    takes_out = {name for name, sub in cli._command().commands.items() if any(p.name == "out" for p in sub.params)}
    assert takes_out == set(OUT_ARGS)
    config = write(tmp_path, TINY)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    for command, extra in OUT_ARGS.items():
        for value in ("", " "):
            argv = [command, *(str(config) if a == "CONFIG" else a for a in extra), "--out", value]
            rc, err = run_cli(argv, capsys)
            check_refused(rc, err, "error: --out: is empty. Fix: give the results folder", here, {})
            assert rc == 2, (argv, err)
    res = study_process("run", str(config), "--out=", cwd=here)
    check_refused(res.returncode, res.stderr, "error: --out: is empty", here, {})
    assert res.returncode == 2


def test_the_corpus_is_large_enough() -> None:
    assert len(CONFIGS) + len(RAW) + len(ARGS) + len(DATA) + 6 >= 100


def test_more_cpus_than_the_machine_has_is_noted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--num-cpus 100000`` on a small machine is allowed (Ray is told what it is told) but
    said: that many trials would share the machine's cores."""
    from study.config import load
    from study.preflight import check_resources

    cfg = load(write(tmp_path, TINY))
    machine = os.cpu_count() or 1
    capsys.readouterr()
    check_resources(cfg, None, machine)
    assert capsys.readouterr().err == ""
    check_resources(cfg, None, 100_000)
    err = capsys.readouterr().err
    assert f"--num-cpus 100000 is more than this machine's {machine} CPUs" in err and "100000 trials" in err


def test_an_unwritable_results_folder_gets_the_fix_of_its_command() -> None:
    """Probe G: `study report` and `study check --repair` on a read-only results folder said
    "give an --out on a writable file system", but another --out has no such study in it:
    the report goes elsewhere with --to, a repair needs the folder (or a copy) writable."""
    import errno

    from study.cli import _os_error

    ro = OSError(errno.EROFS, "Read-only file system", "results/s/report.html")
    assert _os_error(ro, "report").endswith("Fix: write the report elsewhere with --to FILE.html (or --to DIR/ for PNGs)")
    for command in ("check", "resume", "eval"):
        assert "Fix: make the results folder writable (remount it read-write" in _os_error(ro, command)
    assert _os_error(ro, "run").endswith("Fix: give an --out on a writable file system")
    denied = OSError(errno.EACCES, "Permission denied", "results/s/driver.lock")
    assert "repair a writable copy of it (--out COPY)" in _os_error(denied, "check")
