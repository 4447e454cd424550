"""fineline's built-ins under the shipped contract suite (:mod:`trainables.testing.contract`),
the same checks a plugin author runs on their own task and model.

Every registered pair whose task and model both come from fineline itself is kept, so an
installed plugin in the environment does not add its pairs here (its own repository runs
them). CUDA variants: ``python3 -m pytest -m cuda``.
"""

from __future__ import annotations

import pytest
from tests_support import SHARED_DATA

from trainables.errors import ConfigError
from trainables.registry import MODELS, TASKS
from trainables.spec import RunSpec
from trainables.testing import contract_suite
from trainables.testing.contract import pairs

BUILTIN_TASKS = [t.name for t in TASKS if t.__module__.startswith("trainables.")]
BUILTIN_MODELS = [m.name for m in MODELS if m.__module__.startswith("trainables.")]

# Cross pairs that no shipped study uses and that cost most of the suite's time: the
# Transformer on SCAN (~95 s) and on symbol rewriting (~35 s). Run them with -m slow.
SLOW_PAIRS = {
    "scan-transformer": pytest.mark.slow,
    "symbol_rewriting-transformer": pytest.mark.slow,
}

TestBuiltins = contract_suite(
    tasks=BUILTIN_TASKS, models=BUILTIN_MODELS, data_root=SHARED_DATA, pair_marks=SLOW_PAIRS
)
TestBuiltinsOnCuda = pytest.mark.cuda(
    contract_suite(tasks=BUILTIN_TASKS, models=BUILTIN_MODELS, data_root=SHARED_DATA, device="cuda")
)
# execution.cuda_graphs: counter-based dropout masks for every family; on CUDA the seq2seq
# training step replayed from CUDA graphs (every other family runs eagerly with those masks)
TestCounterNoise = contract_suite(
    tasks=["symbol_rewriting", "toy2d", "modular"], models=["seq2seq", "mlp", "transformer"], cuda_graphs=True,
    pair_marks={"symbol_rewriting-transformer": pytest.mark.slow, "modular-seq2seq": pytest.mark.slow},
)
TestBuiltinsOnCudaGraphs = pytest.mark.cuda(
    contract_suite(tasks=BUILTIN_TASKS, models=BUILTIN_MODELS, data_root=SHARED_DATA, device="cuda", cuda_graphs=True)
)


def test_the_builtins_are_registered_through_their_entry_points() -> None:
    assert {"symbol_rewriting", "dyck1", "scan", "mnist_pairs", "toy2d"} <= set(BUILTIN_TASKS)
    assert {"seq2seq", "rnn_tagger", "convnet", "mlp"} <= set(BUILTIN_MODELS)
    assert len(pairs(BUILTIN_TASKS, BUILTIN_MODELS)) >= 5
    for entry in [*TASKS.entries(), *MODELS.entries()]:
        if entry.cls.__module__.startswith("trainables."):
            assert "entry point" in entry.source and "of fineline" in entry.source, entry.source


def test_unknown_names_list_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"use one of: .*symbol_rewriting"):
        TASKS.get("symbol_rewritting")
    with pytest.raises(ConfigError, match=r"model\.name"):
        RunSpec.from_dict({"task": {"name": "dyck1"}, "model": {"name": "seq2seq"}})


def test_a_suite_of_unknown_names_is_an_error_not_zero_tests() -> None:
    with pytest.raises(ConfigError, match="unknown task 'parityy'"):
        contract_suite(tasks=["parityy"])


def test_a_mark_for_a_pair_the_suite_does_not_run_is_an_error() -> None:
    with pytest.raises(
        ConfigError, match="pair_marks names pairs the suite does not run: dyck1-seq2seq"
    ):
        contract_suite(tasks=["dyck1"], pair_marks={"dyck1-seq2seq": pytest.mark.slow})
