"""A training process never imports ``torch._dynamo``.

fineline compiles nothing, but several torch entry points import ``torch._dynamo`` on
their first call (functions wrapped in ``torch._disable_dynamo``: ``torch.optim.Optimizer``'s
methods, a ``TorchDispatchMode``'s dispatch, random init on the ``meta`` device). That
import costs about a core-second in every new Ray worker process, i.e. per trial. Each
shipped (task, model) pair trains a tiny bundle, evaluates, checkpoints and restores in
one fresh process, which reports the first pair after which the module was loaded.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tests_support import SHARED_DATA

SCRIPT = """
import io, sys
from pathlib import Path
import torch
from trainables.registry import MODELS, TASKS
from trainables.testing.contract import new_run, pairs, tiny_spec

data_root = Path(sys.argv[1])
tasks = [t.name for t in TASKS if t.__module__.startswith("trainables.")]
models = [m.name for m in MODELS if m.__module__.startswith("trainables.")]
trained = []
for task, model in pairs(tasks, models):
    try:
        run = new_run(tiny_spec(task, model, data_root), [0, 1])
    except BaseException as exc:  # a pair the model cannot size, or missing data: skipped
        if type(exc).__name__ not in ("Skipped", "ConfigError"):
            raise
        continue
    run.train_round()
    buf = io.BytesIO()
    torch.save(run.state_dict(), buf)
    buf.seek(0)
    run.load_state_dict(torch.load(buf, weights_only=False))
    while not run.done:
        run.train_round()
    run.finalize()
    trained.append(f"{task.name}-{model.name}")
    if "torch._dynamo" in sys.modules:
        print("imported after", trained[-1])
        break
print("trained", len(trained), " ".join(trained))
"""


@pytest.mark.slow  # ~13 s: trains every built-in pair
def test_training_every_builtin_pair_never_imports_dynamo() -> None:
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(SHARED_DATA)],
        capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[1],
    )
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.splitlines()
    assert not any(ln.startswith("imported after") for ln in lines), lines
    trained = lines[-1].split()
    # the shipped studies' families all trained here
    for pair in ("symbol_rewriting-seq2seq", "dyck1-rnn_tagger", "length_gen-transformer",
                 "mnist_pairs-convnet", "toy2d-mlp", "slabs-two_layer_relu"):
        assert pair in trained, trained
