"""Plugins through the real CLI: a study file's ``plugins:`` found beside it, and every
bad plugin or bad split / metric / reduction name refused before Ray starts, with one
line naming the field (or plugin) and the fix, and nothing written to OUT."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "blobs_task.py"

BASE: dict[str, Any] = {
    "name": "blobs",
    "plugins": ["blobs_task"],
    "task": {"name": "blobs", "n": 64},
    "model": {"name": "mlp", "hidden": [8]},
    "train": {"max_epochs": 2},
    "seeds": {"count": 2},
}


def study(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "VIRTUAL_ENV", "PYTHONPATH")}
    env |= {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run([sys.executable, "-m", "study.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture()
def folders(tmp_path: Path) -> tuple[Path, Path]:
    """(the study file's folder with the plugin beside it, another working directory)."""
    home, cwd = tmp_path / "study", tmp_path / "elsewhere"
    home.mkdir()
    cwd.mkdir()
    shutil.copy(PLUGIN, home / PLUGIN.name)
    return home, cwd


def refused(home: Path, cwd: Path, cfg: dict[str, Any], *, command: str = "run") -> str:
    path = home / "study.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = cwd / "results"
    res = study(cwd, command, str(path), "--out", str(out))
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert not out.exists(), "nothing may be written before the checks pass"
    assert "Traceback" not in res.stderr and "ray" not in res.stderr.lower().replace("array", "")
    return lines[0]


UNBUILT = "\n@TASKS.register\nclass Unbuilt(Blobs):\n    name = 'unbuilt'\n    def rehearsable(self):\n        return False\n"
"""The blobs task as one the driver does not build before Ray (``rehearsable()`` False): only
its workers know its splits' sizes, so what depends on them is refused there (the tests of a
worker's refusal use it)."""


def unbuilt_plugin(home: Path) -> None:
    """Write the blobs plugin with task ``unbuilt`` (:data:`UNBUILT`) into ``home``."""
    (home / PLUGIN.name).write_text(PLUGIN.read_text() + UNBUILT)


def with_(cfg: dict[str, Any], **blocks: Any) -> dict[str, Any]:
    return {**cfg, **blocks}


def test_study_plugins_lists_a_local_plugin_found_beside_the_study_file(folders: tuple[Path, Path]) -> None:
    home, cwd = folders
    (home / "study.yaml").write_text(yaml.safe_dump(BASE))
    res = study(cwd, "plugins", str(home / "study.yaml"), "--format", "json")
    assert res.returncode == 0, res.stderr
    import json

    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert rows["blobs"]["source"].startswith("blobs_task.Blobs (plugins: of")
    assert "n=200" in rows["blobs"]["fields"] and "shift=1.5" in rows["blobs"]["fields"]
    assert "entry point 'mlp' of fineline" in rows["mlp"]["source"]
    assert "blobs" not in {r["name"] for r in json.loads(study(cwd, "plugins", "--format", "json").stdout)}


def test_plugin_fields_on_a_terminal_are_a_block_per_plugin(folders: tuple[Path, Path]) -> None:
    home, cwd = folders
    (home / "study.yaml").write_text(yaml.safe_dump(BASE))
    res = study(cwd, "plugins", str(home / "study.yaml"), "--fields")
    assert res.returncode == 0, res.stderr
    block = res.stdout.split("\n\n")
    blobs = next(b for b in block if b.startswith("task blobs (classify): blobs_task.Blobs (plugins: of"))
    lines = blobs.splitlines()
    assert lines[1] == "  n=200: Examples per split.", lines
    assert lines[-1].startswith("  metrics: ")
    assert max(len(ln) for ln in res.stdout.splitlines() if not ln.startswith(("task ", "model "))) <= 100


@pytest.mark.parametrize(
    ("train", "field", "fix"),
    [
        ({"selection": {"split": "vall"}}, "train.selection.split", "use one of: train (train), val (val)"),
        ({"selection": {"split": "test"}}, "train.selection.split", "select on a val or val_ood split: val, val_ood"),
        ({"curve_splits": ["val", "tst"]}, "train.curve_splits", "use one of:"),
        ({"selection": {"metric": "acc"}}, "train.selection.metric", "use one of: loss, accuracy"),
        ({"loss_reduction": "token_mean"}, "train.loss_reduction", "use one of: mean, sum"),
    ],
)
def test_bad_split_metric_and_reduction_names_are_refused_before_ray(
    folders: tuple[Path, Path], train: dict[str, Any], field: str, fix: str
) -> None:
    line = refused(*folders, with_(BASE, train={**BASE["train"], **train}))
    assert line.startswith(f"error: {field}: ") and fix in line, line


def test_a_tuning_objective_on_an_unknown_split_is_refused_before_ray(folders: tuple[Path, Path]) -> None:
    tune = {"objective": {"split": "val_odd", "metric": "accuracy"}, "trials": 2,
            "space": {"train.lr": {"type": "float", "low": 0.001, "high": 0.1, "log": True}}}
    line = refused(*folders, with_(BASE, tune=tune), command="tune")
    assert line.startswith("error: tune.objective.split: ") and "val_ood" in line, line


@pytest.mark.parametrize("batch", [pytest.param(1, marks=pytest.mark.slow), 2])  # one at a time: 27 s, -m slow
def test_a_search_over_a_study_files_plugin_trains_its_candidates(folders: tuple[Path, Path], batch: int) -> None:
    """Before: every candidate of `study tune` failed on its worker with "unknown task 'blobs'"
    (exit 1): the worker resolved the candidate's config before importing the study's plugins."""
    home, cwd = folders
    tune = {"objective": {"split": "val_ood", "metric": "accuracy"}, "trials": 2, "seeds_per_candidate": 1,
            "batch": batch, "space": {"train.lr": {"type": "float", "low": 0.001, "high": 0.1, "log": True}}}
    (home / "study.yaml").write_text(yaml.safe_dump(with_(BASE, tune=tune)))
    res = study(cwd, "tune", str(home / "study.yaml"), "--out", str(cwd / "results"), "--num-cpus", "1")
    assert res.returncode == 0, res.stderr
    assert "unknown task" not in res.stderr and res.stderr.count("-> objective") == 2, res.stderr
    # a progress count, then the candidate by its values (`study status` numbers candidates from 0)
    done = sorted(re.search(r"(\d/2) done: candidate train\.lr=", line).group(1)  # type: ignore[union-attr]
                  for line in res.stderr.splitlines() if "-> objective" in line)
    assert done == ["1/2", "2/2"], res.stderr


def test_a_tuning_objective_metric_the_pair_does_not_score_is_refused_before_ray(
    folders: tuple[Path, Path],
) -> None:
    tune = {"objective": {"split": "val_ood", "metric": "exact"}, "trials": 2,
            "space": {"train.lr": {"type": "float", "low": 0.001, "high": 0.1, "log": True}}}
    line = refused(*folders, with_(BASE, tune=tune), command="tune")
    assert line.startswith("error: tune.objective.metric: ") and "use one of: loss, accuracy" in line, line


def test_a_plugin_config_is_validated_like_a_builtin(folders: tuple[Path, Path]) -> None:
    line = refused(*folders, with_(BASE, task={"name": "blobs", "n": 2}))
    assert line.startswith("error: task.n: invalid value 2") and "greater than or equal to 4" in line, line
    line = refused(*folders, with_(BASE, task={"name": "blobs", "size": 9}))
    assert line.startswith("error: task.size: unknown field") and "use one of: n, shift" in line, line


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (None, "plugin blobs_task (plugins: of"),  # the module is not there
        ("import numpy\nraise_here = undefined_name\n", "NameError: name 'undefined_name' is not defined"),
        # the plugin's own file and line (it used to say importlib/__init__.py)
        ("x = 1\ndef broken(:\n", "SyntaxError: invalid syntax (blobs_task.py, line 2) (at {home}/blobs_task.py:2)"),
        ("from trainables.registry import TASKS\nfrom trainables.tasks.toy2d import Toy2D\n\n"
         "@TASKS.register\nclass Mine(Toy2D):\n    pass\n",
         "task 'toy2d' is registered twice: by trainables.tasks.toy2d.Toy2D (entry point 'toy2d' of "
         "fineline"),
        ("from trainables.registry import TASKS\nfrom trainables.tasks.toy2d import Toy2D\n\n"
         "@TASKS.register\nclass Mine(Toy2D):\n    name = 'mine'\n    Config = dict\n",
         "Config must subclass trainables.configbase.FrozenConfig"),
        ("from trainables.registry import MODELS\nfrom trainables.models.base import Model\n\n"
         "@MODELS.register\nclass Half(Model):\n    name = 'half'\n    Config = None\n",
         "model class blobs_task.Half lacks data_kind, reductions"),
        # a script calling sys.exit() (or argparse) at import: one error, not a silent exit 3
        ("import sys\nsys.exit(3)\n", "plugin blobs_task (plugins: of"),
        # a class with every attribute but no Task base: refused at registration, not a
        # TypeError traceback when the study builds it
        ("from trainables.configbase import FrozenConfig\nfrom trainables.registry import TASKS\n\n"
         "class C(FrozenConfig):\n    pass\n\n"
         "@TASKS.register\nclass Fake:\n    name = 'blobs'\n    Config = C\n"
         "    data_kind = 'classify'\n    primary_metric = 'accuracy'\n    metrics = ('accuracy',)\n",
         "task class blobs_task.Fake does not subclass trainables.tasks.base.Task"),
        # every config field documented, as docs/plugins.md asks (--fields shows the docs)
        ("from trainables.configbase import FrozenConfig\nfrom trainables.registry import TASKS\n"
         "from trainables.tasks.toy2d import Toy2D\n\n"
         "class C(FrozenConfig):\n    n: int = 9\n    \"\"\"Documented.\"\"\"\n    width: int = 3\n    depth: int = 2\n\n"
         "@TASKS.register\nclass Mine(Toy2D):\n    name = 'mine'\n    Config = C\n",
         "task class blobs_task.Mine: config field(s) width, depth of C have no docstring. Fix: write one "
         "under each field"),
        # the task the study names is a class of the module that was never registered (it said
        # only "unknown task 'blobs'"); the module registers another, so it is loaded
        ("from trainables.registry import TASKS\nfrom trainables.tasks.toy2d import Toy2D\n\n"
         "class Blobs(Toy2D):\n    name = 'blobs'\n\n@TASKS.register\nclass Other(Toy2D):\n    name = 'other'\n",
         "task.name: unknown task 'blobs': class blobs_task.Blobs has that name but is not registered. "
         "Fix: decorate it with @TASKS.register"),
        # a metric named like an error must say which way it reads (trainables.metrics)
        ("from trainables.registry import TASKS\nfrom trainables.tasks.toy2d import Toy2D\n\n"
         "@TASKS.register\nclass Mine(Toy2D):\n    name = 'mine'\n    primary_metric = 'mse'\n    metrics = ('mse',)\n",
         "metric 'mse' is a bare name, which means a share in [0, 1] where higher is better, but its name reads "
         "like an error. Fix: declare it in the task's `metrics`, e.g. Metric('mse', better='lower', high=None)"),
    ],
    ids=["missing", "import-error", "syntax-error", "duplicate-name", "bad-config-class", "incomplete-model", "sys-exit",
         "not-a-task", "undocumented-fields", "unregistered", "undeclared-error-metric"],
)
def test_a_broken_plugin_is_one_error_naming_it(folders: tuple[Path, Path], source: str | None, expected: str) -> None:
    home, cwd = folders
    if source is None:
        (home / "blobs_task.py").unlink()
    else:
        (home / "blobs_task.py").write_text(source)
    line = refused(home, cwd, BASE)
    assert expected.format(home=home) in line, line
    assert "Fix: " in line, line
    if source is None:
        assert "ModuleNotFoundError" in line and str(home) in line
    if source is not None and "sys.exit" in source:
        assert "called sys.exit(3) while being imported" in line and "__main__" in line, line
    if source is not None and "undefined_name" in source:  # found, then raised: not "make it importable"
        assert "Fix: fix the error at the place shown (the module was found" in line, line


def test_a_plugin_importing_a_missing_package_names_that_package(folders: tuple[Path, Path]) -> None:
    home, cwd = folders
    (home / "blobs_task.py").write_text("import fineline_no_such_dependency\n")
    line = refused(home, cwd, BASE)
    assert "No module named 'fineline_no_such_dependency'" in line, line
    assert "Fix: install the package that provides `fineline_no_such_dependency`" in line, line


TORCH_DROPOUT_MODEL = """
from torch import nn
from trainables.models.mlp_plain import MLPPlainConfig
from trainables.models.plain import PlainClassifier
from trainables.registry import MODELS


@MODELS.register
class TorchDropoutMLP(PlainClassifier):
    name = "torch_dropout_mlp"
    Config = MLPPlainConfig

    def build_module(self, config, meta):
        n, c = meta["input_shape"][0], meta["n_classes"]
        return nn.Sequential(nn.Linear(n, 8), nn.ReLU(), nn.Dropout(0.1), nn.Linear(8, c))
"""


def test_a_plain_model_with_torch_dropout_is_refused_before_ray(folders: tuple[Path, Path]) -> None:
    """The module is built once before Ray (not first in every trial, where Ray retried it
    and printed a traceback per try)."""
    home, cwd = folders
    (home / "blobs_task.py").write_text((home / "blobs_task.py").read_text() + TORCH_DROPOUT_MODEL)
    line = refused(home, cwd, with_(BASE, model={"name": "torch_dropout_mlp"}))
    assert line.startswith("error: model: 'torch_dropout_mlp': module 2 is torch.nn.Dropout"), line
    assert "Fix: use trainables.models.plain.Dropout(p)" in line, line


def test_plugins_must_be_module_names(folders: tuple[Path, Path]) -> None:
    line = refused(*folders, with_(BASE, plugins=["./blobs_task.py"]))
    assert line.startswith("error: plugins: './blobs_task.py' is a file name, not a module name"), line
    line = refused(*folders, with_(BASE, plugins=["blobs_task.py"]))
    assert line == ("error: plugins: 'blobs_task.py' is a file name, not a module name. Fix: write the "
                    "module's name without .py: `plugins: [blobs_task]`"), line
    line = refused(*folders, with_(BASE, plugins=["./blobs_task"]))
    assert line.startswith("error: plugins: './blobs_task' is a path, not a module name"), line
    # the fix offered for a path is a module name that works (it used to offer './blobs_task')
    line = refused(*folders, with_(BASE, plugins=["./blobs_task.py"]))
    assert "Fix: write the module's name without .py: `plugins: [blobs_task]`" in line, line
    line = refused(*folders, with_(BASE, plugins=["blobs_task"], task={"name": "blobs", "n": "x"}))
    assert line.startswith("error: task.n: "), line  # blobs_task imported: the next check speaks


HALF_LOADED = (
    "from trainables.models.mlp import MLP\nfrom trainables.registry import MODELS\n\n"
    "@MODELS.register\nclass Half(MLP):\n    name = 'half_loaded_mlp'\n\n"
    "import fineline_missing_dependency\n"
)
"""Registers a model, then fails to import: what it registered must not be used."""


def broken_installed_plugin(root: Path, source: str = HALF_LOADED, value: str = "broken_plugin") -> dict[str, str]:
    """A distribution ``broken-plugin 1.0`` on ``PYTHONPATH`` (a dist-info folder, as pip
    writes it, found by importlib.metadata) whose module ``broken_plugin`` is ``source`` and
    whose entry point's value is ``value``."""
    site = root / "site"
    info = site / "broken_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[fineline.plugins]\nbroken = {value}\n")
    (site / "broken_plugin.py").write_text(source)
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)}


@pytest.mark.slow  # 15-20 s of subprocess study; CI's default run keeps under 15 minutes
def test_a_broken_installed_plugin_is_a_warning_for_studies_that_do_not_use_it(
    folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: one broken installed plugin stopped every command, `study plugins` included.
    Now its tasks and models are unavailable, with a warning naming it and both fixes; a
    study naming something it might provide is refused with its error."""
    home, cwd = folders
    for key, value in broken_installed_plugin(cwd.parent).items():
        monkeypatch.setenv(key, value)
    listed = study(cwd, "plugins", "--format", "csv")
    assert listed.returncode == 0, listed.stderr
    assert "symbol_rewriting" in listed.stdout and "half_loaded_mlp" not in listed.stdout
    (warning,) = [ln for ln in listed.stderr.splitlines() if ln.strip()]
    assert warning.startswith("warning: plugin broken_plugin (entry point 'broken' of broken-plugin 1.0) "
                              "failed to import: ModuleNotFoundError"), warning
    assert "install the package that provides `fineline_missing_dependency`" in warning
    assert "pip uninstall broken-plugin" in warning and "unavailable" in warning
    (home / "study.yaml").write_text(yaml.safe_dump(with_(BASE, model={"name": "half_loaded_mlp"})))
    res = study(cwd, "run", str(home / "study.yaml"), "--out", str(cwd / "results"))
    assert res.returncode == 2, res.stderr
    error = res.stderr.strip().splitlines()[-1]
    assert error.startswith("error: model.name: unknown model 'half_loaded_mlp' (an installed plugin that may "
                            "provide it failed to import: plugin broken_plugin"), error
    assert not (cwd / "results").exists()
    ok = study(cwd, "run", str(home / "study.yaml"), "model.name=mlp", "seeds.count=1", "--out",
               str(cwd / "results"), "--num-cpus", "1")
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize(("value", "problem"), [
    ("json", "json registers no task or model"),  # the wrong module: it imports without a word
    ("broken_plugin:register_all", "broken_plugin has no 'register_all'"),
])
def test_an_entry_point_at_the_wrong_module_or_object_is_warned_about(
    folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, value: str, problem: str
) -> None:
    """Before: an installed entry point naming a module that registers nothing (or an object
    that does not exist) was silent; a study naming its task was then told to install the
    package, which it was."""
    _, cwd = folders
    source = "from trainables.models.mlp import MLP\nfrom trainables.registry import MODELS\n\n" \
             "@MODELS.register\nclass Mine(MLP):\n    name = 'mine_mlp'\n"
    for key, env in broken_installed_plugin(cwd.parent, source, value).items():
        monkeypatch.setenv(key, env)
    listed = study(cwd, "plugins", "--format", "csv")
    assert listed.returncode == 0, listed.stderr
    (warning,) = [ln for ln in listed.stderr.splitlines() if ln.strip()]
    assert warning.startswith(f"warning: entry point 'broken' of broken-plugin 1.0 names '{value}', but {problem}. "
                              "Fix: point it at the module that registers them"), warning


def test_a_field_a_plugin_added_is_named_when_it_moves_the_config(folders: tuple[Path, Path]) -> None:
    """Before: growing a study after its plugin gained a config field (plainly declared) was
    refused with "changed: nothing ... (a default of fineline or of a plugin changed?)"."""
    home, cwd = folders
    (home / "study.yaml").write_text(yaml.safe_dump(with_(BASE, seeds={"count": 1})))
    out = cwd / "results"
    first = study(cwd, "run", str(home / "study.yaml"), "--out", str(out), "--num-cpus", "1")
    assert first.returncode == 0, first.stderr
    plugin = home / "blobs_task.py"
    plugin.write_text(plugin.read_text().replace(
        '    rendezvous: str | None = None\n', '    spread: float = 0.7\n    """Noise."""\n    rendezvous: str | None = None\n'))
    again = study(cwd, "run", str(home / "study.yaml"), "seeds.count=2", "--out", str(out))
    assert again.returncode == 2, again.stderr
    line = again.stderr.strip().splitlines()[-1]
    assert "the resolved config moved: task.spread (unset) -> 0.7" in line and "added_field" in line, line


@pytest.mark.slow  # 27 s of subprocess studies
def test_changed_plugin_code_is_recorded_per_trial_and_warned_about(folders: tuple[Path, Path]) -> None:
    """Before: a plugin edited between two runs of one study mixed old-code and new-code
    seeds silently, and nothing recorded the plugin's code. Now each trial's versions_json
    holds the plugin's SHA-256, and adding seeds after a change warns, naming it."""
    import duckdb

    home, cwd = folders
    (home / "study.yaml").write_text(yaml.safe_dump(with_(BASE, seeds={"count": 1})))
    out = cwd / "results"
    first = study(cwd, "run", str(home / "study.yaml"), "--out", str(out), "--num-cpus", "1")
    assert first.returncode == 0, first.stderr
    assert "plugin code" not in first.stderr
    plugin = home / "blobs_task.py"
    plugin.write_text(plugin.read_text().replace("x = centre + rng.normal(0.0, 0.7", "x = centre + rng.normal(0.0, 0.6"))
    second = study(cwd, "run", str(home / "study.yaml"), "seeds.count=2", "--out", str(out), "--num-cpus", "1")
    assert second.returncode == 0, second.stderr
    warning = " ".join(second.stderr.split())
    assert "warning: the plugin code of study 'blobs' changed since its committed runs (task blobs: " \
           "blobs_task.py, sha256:" in warning, second.stderr
    assert "run the changed code under a new --name" in warning
    rows = duckdb.sql(
        f"SELECT json_extract_string(versions_json, '$.\"plugin task blobs\"') AS code, count(*) AS n "
        f"FROM read_parquet('{out}/tables/trials/**/*.parquet') GROUP BY code ORDER BY code"
    ).fetchall()
    assert len(rows) == 2 and all(code.startswith("blobs_task.py, sha256:") for code, _ in rows), rows
    # the model is fineline's own: its code is fineline's version and git sha, not a plugin entry
    (keys,) = duckdb.sql(f"SELECT versions_json FROM read_parquet('{out}/tables/trials/**/*.parquet') LIMIT 1").fetchall()
    assert "plugin model" not in keys[0]


def test_an_installed_plugin_that_takes_a_builtin_name_stops_every_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name registered twice is never a mere warning: a study naming it could run the
    other class."""
    clash = ("from trainables.registry import TASKS\nfrom trainables.tasks.toy2d import Toy2D\n\n"
             "@TASKS.register\nclass Mine(Toy2D):\n    pass\n")
    for key, value in broken_installed_plugin(tmp_path, clash).items():
        monkeypatch.setenv(key, value)
    res = study(tmp_path, "plugins")
    assert res.returncode == 2, res.stderr
    assert "error: task 'toy2d' is registered twice: by trainables.tasks.toy2d.Toy2D" in res.stderr

