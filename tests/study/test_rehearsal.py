"""A plugin pair's rehearsal before Ray (``trainables.rehearsal``), through the real CLI:
each mistake a plugin author makes that would fail every trial inside Ray, or worse run
and store wrong results, is one line (exit 2) naming the pair, what is wrong and the fix,
and nothing is written to OUT. Each case appends a faulty task or model to the blobs
plugin; the same study with the plugin's good pair runs (test_plugins_cli, cluster)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.study.test_plugins_cli import BASE, PLUGIN, refused, study, with_

HEAD = """
import random
import numpy as np
import torch
from torch import nn
from trainables.models.mlp_plain import MLPPlainConfig
from trainables.models.plain import PlainClassifier
from trainables.registry import MODELS, TASKS


class Model(PlainClassifier):
    Config = MLPPlainConfig
    width = 2  # outputs of the last layer

    def build_module(self, config, meta):
        return nn.Sequential(nn.Linear(meta["input_shape"][0], 8), nn.ReLU(), nn.Linear(8, self.width))
"""

CASES: dict[str, tuple[str, dict[str, Any], str]] = {
    # name: (source appended, study blocks, what the one error line says)
    "five outputs for two classes": (
        "@MODELS.register\nclass Wide(Model):\n    name = 'wide'\n    width = 5\n",
        {"model": {"name": "wide"}},
        "error: model: 'wide': build_module's module maps a batch (8, 2) to (8, 5); a classifier's "
        "module returns logits (batch, n_classes) = (8, 2)",
    ),
    "Python's random in forward": (
        "class Noisy(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.lin = nn.Linear(2, 2)\n"
        "    def forward(self, x):\n        return self.lin(x) * (1 + random.random())\n"
        "@MODELS.register\nclass PyRandom(Model):\n    name = 'py_random'\n"
        "    def build_module(self, config, meta):\n        return Noisy()\n",
        {"model": {"name": "py_random"}},
        "error: model: task 'blobs' with model 'py_random': two runs from the same seeds give different "
        "training losses: something draws random numbers from a generator that is not the seed's",
    ),
    "BatchNorm's running statistics": (
        "@MODELS.register\nclass Normed(Model):\n    name = 'normed'\n"
        "    def build_module(self, config, meta):\n"
        "        return nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))\n",
        {"model": {"name": "normed"}},
        "error: model: 'normed': module 1 is torch.nn.BatchNorm1d with running statistics",
    ),
    "a buffer changed by training": (
        "class Counting(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.lin = nn.Linear(2, 2)\n        self.register_buffer('calls', torch.zeros(()))\n"
        "    def forward(self, x):\n        if self.training:\n            self.calls.add_(1)\n"
        "        return self.lin(x)\n"
        "@MODELS.register\nclass Counts(Model):\n    name = 'counts'\n"
        "    def build_module(self, config, meta):\n        return Counting()\n",
        {"model": {"name": "counts"}},
        "error: model: model 'counts': buffer 'calls' changes in a training step",
    ),
    "build_module returning a function": (
        "@MODELS.register\nclass NotModule(Model):\n    name = 'not_module'\n"
        "    def build_module(self, config, meta):\n        return lambda x: x\n",
        {"model": {"name": "not_module"}},
        "error: model: 'not_module': build_module returned function, not a torch.nn.Module",
    ),
    "a score() that raises": (
        "@TASKS.register\nclass BadScore(Blobs):\n    name = 'bad_score'\n"
        "    def score(self, split, predictions):\n        return {'accuracy': split.data.labels}\n",
        {"task": {"name": "bad_score", "n": 64}},
        "error: task: task 'bad_score' with model 'mlp': the first training step (and its evaluation "
        "round) fails with AttributeError: 'Arrays' object has no attribute 'labels' (at ",
    ),
    "a metric score() returns but metrics does not declare": (
        "@TASKS.register\nclass Extra(Blobs):\n    name = 'extra_metric'\n"
        "    def score(self, split, predictions):\n"
        "        return {**super().score(split, predictions), 'err': np.zeros(len(split))}\n",
        {"task": {"name": "extra_metric", "n": 64}},
        "error: task: task 'extra_metric' with model 'mlp' produces metrics ['err'] that are not declared",
    ),
    "labels beyond n_classes": (
        "@TASKS.register\nclass Shifted(Blobs):\n    name = 'shifted'\n"
        "    def build(self, data_seed):\n        data = super().build(data_seed)\n"
        "        data.splits['test'].data.y[:] += 1\n        return data\n",
        {"task": {"name": "shifted", "n": 64}},
        "error: task: task 'shifted': split 'test' has labels [2] outside 0..1 (its meta n_classes is 2)",
    ),
    "data that ignores the data seed": (
        "@TASKS.register\nclass Unseeded(Blobs):\n    name = 'unseeded'\n"
        "    def build(self, data_seed):\n        return super().build(random.randrange(10**6))\n",
        {"task": {"name": "unseeded", "n": 64}},
        "error: task: task 'unseeded': two builds with data seed 0 give different data (split 'train')",
    ),
    "a NaN input": (  # was blamed on seeding: NaN != NaN made two builds "differ"
        "@TASKS.register\nclass NanInputs(Blobs):\n    name = 'nan_inputs'\n"
        "    def build(self, data_seed):\n        data = super().build(data_seed)\n"
        "        data.splits['val'].data.x[3, 0] = np.nan\n        return data\n",
        {"task": {"name": "nan_inputs", "n": 64}},
        "error: task: task 'nan_inputs': split 'val' has NaN or infinite inputs x (examples [3] of 64)",
    ),
    "one label short": (  # each split lost an example, runs committed ok
        "@TASKS.register\nclass Short(Blobs):\n    name = 'short_labels'\n"
        "    def build(self, data_seed):\n        data = super().build(data_seed)\n"
        "        d = data.splits['test'].data\n        d.y = d.y[:-1]\n        return data\n",
        {"task": {"name": "short_labels", "n": 64}},
        "error: task: task 'short_labels': split 'test' has 64 inputs x, 63 labels y, 64 ids",
    ),
    "fractional labels": (  # 0.5 was trained and reported as class 0
        "@TASKS.register\nclass Halves(Blobs):\n    name = 'halves'\n"
        "    def build(self, data_seed):\n        data = super().build(data_seed)\n"
        "        d = data.splits['train'].data\n        d.y = d.y.astype(np.float32)\n        d.y[0] = 0.5\n"
        "        return data\n",
        {"task": {"name": "halves", "n": 64}},
        "error: task: task 'halves': split 'train' has labels y that are not whole numbers ([0.5])",
    ),
    "a build that cannot find its file": (
        "@TASKS.register\nclass Reads(Blobs):\n    name = 'reads'\n"
        "    def build(self, data_seed):\n        open('/nonexistent/blobs.csv')\n",
        {"task": {"name": "reads", "n": 64}},
        "error: task: task 'reads' with model 'mlp': building the task's data (data seed 0) fails with "
        "FileNotFoundError: [Errno 2] No such file or directory: '/nonexistent/blobs.csv' (at ",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_plugin_mistake_is_one_error_before_ray(tmp_path: Path, case: str) -> None:
    source, blocks, expected = CASES[case]
    home, cwd = tmp_path / "study", tmp_path / "elsewhere"
    home.mkdir()
    cwd.mkdir()
    (home / PLUGIN.name).write_text(PLUGIN.read_text() + HEAD + source)
    line = refused(home, cwd, with_(BASE, **blocks))
    assert line.startswith(expected), line
    assert "Fix: " in line
    if "(at " in expected:  # the plugin's own line, not fineline's or a library's
        assert f"(at {home / PLUGIN.name}:" in line, line


@pytest.mark.slow  # 15-20 s of subprocess study; CI's default run keeps under 15 minutes
def test_a_task_that_is_not_rehearsable_is_not_built_before_ray(tmp_path: Path) -> None:
    """``Task.rehearsable()`` False (a slow or side-effecting build): the driver does not
    build it; the study runs, its trials build the data."""
    home, cwd = tmp_path / "study", tmp_path / "elsewhere"
    home.mkdir()
    cwd.mkdir()
    marks = tmp_path / "builds"
    marks.mkdir()
    source = (
        "import os\n@TASKS.register\nclass Counted(Blobs):\n    name = 'counted'\n"
        f"    def build(self, data_seed):\n        open(os.path.join({str(marks)!r}, str(os.getpid())), 'w').close()\n"
        "        return super().build(data_seed)\n"
        "    def rehearsable(self):\n        return False\n"
    )
    (home / PLUGIN.name).write_text(PLUGIN.read_text() + HEAD + source)
    cfg = with_(BASE, task={"name": "counted", "n": 64}, seeds={"count": 1})
    (home / "study.yaml").write_text(yaml.safe_dump(cfg))
    import os

    res = study(cwd, "run", str(home / "study.yaml"), "--out", str(cwd / "results"), "--num-cpus", "1")
    assert res.returncode == 0, res.stderr
    assert str(os.getpid()) not in os.listdir(marks)
    assert len(os.listdir(marks)) >= 1, "the trial builds the data"


def test_a_model_too_large_for_the_machine_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    """Before: ``model.d_model=65536`` had the driver build the Transformer for one seed, and
    the kernel's out-of-memory killer ended it (rc 137, no message, after 76 s); a seq2seq
    of ``hidden_size=100000`` started Ray and failed in the worker. Now the model is sized
    on torch's meta device first (nothing allocated)."""
    config = Path(__file__).resolve().parents[2] / "configs" / "grokking_cpu.yaml"
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    out = cwd / "results"
    res = study(cwd, "run", str(config), "model.d_model=65536", "seeds.count=1", "--out", str(out))
    assert res.returncode == 2, res.stderr
    (line,) = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert line.startswith("error: model: model 'transformer' has 17,220,698,368 parameters per seed: "
                           "training one seed needs about 320.8 GiB"), line
    assert "GiB this machine has available" in line
    assert "Fix: lower its sizes" in line
    assert not out.exists()


@pytest.mark.parametrize("config", ["quickstart", "grokking_cpu", "elnaggar2022", "li2021_toy", "zhou2023_length_cpu",
                                    "shah2020_lms7"])
def test_sizing_on_the_meta_device_counts_what_a_real_build_holds(config: str) -> None:
    """``seed_bytes`` builds on the meta device with initialisers skipped: its parameter count
    is a real one-seed build's, and nothing is allocated (the tensors are meta)."""
    import torch

    from study.config import load
    from trainables.registry import MODELS
    from trainables.rehearsal import MetaShapes, seed_bytes

    spec = load(Path(__file__).resolve().parents[2] / "configs" / f"{config}.yaml").points[0].spec
    meta = spec.make_task().build(0).meta
    real = MODELS.get(spec.model_name)(spec.model, meta, 1)
    params, need = seed_bytes(spec, meta)
    assert params == sum(p.numel() for p in real.parameters())
    assert need >= 3 * sum(p.numel() * p.element_size() for p in real.parameters())
    with MetaShapes():
        shapes = MODELS.get(spec.model_name)(spec.model, meta, 1)
    assert {t.device.type for t in [*shapes.parameters(), *shapes.buffers()]} == {"meta"}
    assert [t.shape for t in shapes.parameters()] == [t.shape for t in real.parameters()]
    assert torch.zeros(2).device.type == "cpu"  # the mode ends with the block


def test_a_study_on_cuda_is_not_rehearsed_on_the_driver(tmp_path: Path) -> None:
    """The driver may have no GPU and a plugin model may run only on one: a ``device: cuda``
    study skips the rehearsal (and the check against this machine's memory); the same study
    on the CPU is refused for the model's Python ``random``."""
    from study.config import load
    from study.runner import check_pairs
    from trainables.errors import ConfigError

    home = tmp_path / "study"
    home.mkdir()
    source = CASES["Python's random in forward"][0]
    source = source.replace("'py_random'", "'gpu_only_noisy'")
    (home / "gpu_blobs.py").write_text(PLUGIN.read_text().replace('name: ClassVar[str] = "blobs"', 'name: ClassVar[str] = "gpu_blobs"') + HEAD + source)
    cfg = with_(BASE, plugins=["gpu_blobs"], task={"name": "gpu_blobs", "n": 64}, model={"name": "gpu_only_noisy"})
    (home / "cpu.yaml").write_text(yaml.safe_dump(cfg))
    (home / "gpu.yaml").write_text(yaml.safe_dump({**cfg, "execution": {"device": "cuda", "gpus_per_trial": 1}}))
    check_pairs(load(home / "gpu.yaml"), local=False)
    with pytest.raises(ConfigError, match="two runs from the same seeds give different training losses"):
        check_pairs(load(home / "cpu.yaml"))


def test_blame_names_plugin_code_but_keeps_a_fineline_bug_as_it_is() -> None:
    """An exception in a built-in pair is a bug in fineline: it keeps its type and traceback
    (``blame`` turns only plugin code's exceptions into a refusal)."""
    from trainables.rehearsal import blame
    from trainables.spec import RunSpec

    builtin = RunSpec.from_dict({"task": {"name": "toy2d"}, "model": {"name": "mlp"}})
    with pytest.raises(ValueError, match="a bug"), blame(builtin, "the first training step"):
        raise ValueError("a bug")


@pytest.mark.slow  # 15-20 s of subprocess study; CI's default run keeps under 15 minutes
def test_a_plugin_model_the_meta_device_cannot_build_is_rehearsed_for_real(tmp_path: Path) -> None:
    """A constructor that reads a value (``.item()``) cannot run on the meta device: sizing
    gives up on it and the rehearsal builds it for real, so a correct plugin is not refused
    (and a mistake in it is still found)."""
    home, cwd = tmp_path / "study", tmp_path / "elsewhere"
    home.mkdir()
    cwd.mkdir()
    source = (
        "class Scaled(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.lin = nn.Linear(2, 2)\n        self.scale = float(self.lin.weight.abs().max().item()) + 1.0\n"
        "    def forward(self, x):\n        return self.lin(x) / self.scale\n"
        "@MODELS.register\nclass Reads(Model):\n    name = 'reads_values'\n"
        "    def build_module(self, config, meta):\n        return Scaled()\n"
    )
    (home / PLUGIN.name).write_text(PLUGIN.read_text() + HEAD + source)
    (home / "study.yaml").write_text(yaml.safe_dump(with_(BASE, model={"name": "reads_values"}, seeds={"count": 1})))
    res = study(cwd, "run", str(home / "study.yaml"), "--out", str(cwd / "results"), "--num-cpus", "1")
    assert res.returncode == 0, res.stderr


@pytest.mark.slow  # 15-20 s of subprocess study; CI's default run keeps under 15 minutes
def test_a_plugin_pair_trained_with_a_loss_rise_schedule_is_rehearsed_and_runs(tmp_path: Path) -> None:
    """Before: the rehearsal's one-step run (max_steps) refused ``lr_halving.on_loss_rise``,
    blaming a max_steps the user never set."""
    home, cwd = tmp_path / "study", tmp_path / "elsewhere"
    home.mkdir()
    cwd.mkdir()
    (home / PLUGIN.name).write_text(PLUGIN.read_text())
    halving = {"start_epoch": 8, "every_epochs": 1, "on_loss_rise": "val_ood"}
    (home / "study.yaml").write_text(yaml.safe_dump(with_(BASE, train={"max_epochs": 2, "lr_halving": halving},
                                                          seeds={"count": 1})))
    res = study(cwd, "run", str(home / "study.yaml"), "--out", str(cwd / "results"), "--num-cpus", "1")
    assert res.returncode == 0, res.stderr
