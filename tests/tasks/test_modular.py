"""Modular arithmetic (grokking): answers against a reference, the split, the prompt, the
scoring, and the declared ``groks`` event (test accuracy after train accuracy) read from
curves by the time-to-event analysis."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd
import pytest

from analysis import survival as sv
from trainables.data import EOS, SPECIALS, Split, TokenRows
from trainables.errors import ConfigError
from trainables.registry import MODELS, TASKS
from trainables.spec import RunSpec
from trainables.tasks.modular import OPS, ModularArithmetic, ModularConfig, all_pairs

REFERENCE = {
    "+": lambda x, y, p: (x + y) % p,
    "-": lambda x, y, p: (x - y) % p,
    "*": lambda x, y, p: (x * y) % p,
    "/": lambda x, y, p: (x * pow(y, p - 2, p)) % p,  # Fermat: y^(p-2) = y^-1 mod a prime
    "x2+y2": lambda x, y, p: (x**2 + y**2) % p,
    "x2+xy+y2": lambda x, y, p: (x**2 + x * y + y**2) % p,
    "x2+xy+y2+x": lambda x, y, p: (x**2 + x * y + y**2 + x) % p,
    "x3+xy": lambda x, y, p: (x**3 + x * y) % p,
    "x3+xy2+y": lambda x, y, p: (x**3 + x * y**2 + y) % p,
}
"""Python integers, straight from Power et al.'s definitions."""


def task(**cfg: Any) -> ModularArithmetic:
    return ModularArithmetic(ModularConfig(**cfg))


def test_registered_with_the_transformer() -> None:
    assert TASKS.get("modular") is ModularArithmetic
    spec = RunSpec.from_dict({"task": {"name": "modular"}, "model": {"name": "transformer"}})
    assert spec.task.p == 97 and MODELS.get("transformer").data_kind == "seq2seq"


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("p", [7, 97])
def test_every_answer_equals_the_reference(op: str, p: int) -> None:
    a, b, c = all_pairs(p, op)
    want = [(x, y, REFERENCE[op](x, y, p)) for x in range(p) for y in range(p) if not (op == "/" and y == 0)]
    assert list(zip(a.tolist(), b.tolist(), c.tolist(), strict=True)) == want
    if op == "/":
        assert ((c * b) % p == a).all()  # c = a / b


def test_the_split_is_every_pair_once_drawn_by_the_data_seed() -> None:
    t = task(p=11, train_fraction=0.3)
    d = t.build(0)
    train, test = d.splits["train"], d.splits["test"]
    assert (train.role, test.role) == ("train", "test") and t.split_roles() == {"train": "train", "test": "test"}
    assert len(train) == int(0.3 * 121) == 36 and len(test) == 121 - 36  # rounded down, as Nanda et al.
    assert sorted([*train.data.ids.tolist(), *test.data.ids.tolist()]) == list(range(121))
    assert np.array_equal(t.build(0).splits["train"].data.ids, train.data.ids)
    assert not np.array_equal(t.build(1).splits["train"].data.ids, train.data.ids)
    for split in (train, test):  # each example: a + b = -> (a + b) mod 11
        for i, ex in enumerate(split.data.ids):
            a, b = divmod(int(ex), 11)
            assert t.src_vocab.decode(split.data.src[i]) == [str(a), "+", str(b), "="]
            assert t.tgt_vocab.decode(split.data.tgt[i]) == [str((a + b) % 11)]
    assert d.meta["max_src_len"] == 4 and d.meta["max_tgt_len"] == 1


def test_without_the_op_token_the_prompt_is_nandas() -> None:
    t = task(p=5, op="-", op_token=False)
    d = t.build(0)
    split = d.splits["train"]
    assert t.render_example(d, split, 0)[0].split()[-1] == "="
    assert all(len(s) == 3 for s in split.data.src) and d.meta["max_src_len"] == 3
    a, b = divmod(int(split.data.ids[0]), 5)
    assert t.render_example(d, split, 0) == (f"{a} {b} =", str((a - b) % 5))


def test_score_and_render_cut_at_the_end_token() -> None:
    t = task(p=5)
    d = t.build(0)
    split: Split = d.splits["test"]
    gold = np.array([s[0] for s in split.data.tgt])
    wrong = np.where(gold == len(SPECIALS), gold + 1, gold - 1)
    n = len(gold)
    tokens = np.full((n, 3), EOS)
    tokens[:, 0] = gold
    cases = {  # predictions (tokens, lengths) -> accuracy
        "answer": (tokens, np.ones(n, dtype=np.int64), 1.0),
        "answer </s>": (tokens, np.full(n, 2), 1.0),
        "wrong </s>": (np.stack([wrong, tokens[:, 1], tokens[:, 2]], 1), np.full(n, 2), 0.0),
        "answer answer": (np.stack([gold, gold, gold], 1), np.full(n, 2), 0.0),
        "nothing": (tokens, np.zeros(n, dtype=np.int64), 0.0),
    }
    for what, (tok, lengths, acc) in cases.items():
        assert t.score(split, TokenRows(tok, lengths))["accuracy"].tolist() == [acc] * n, what
    assert t.render(split, np.array([gold[0], EOS, 7])) == t.tgt_vocab.tokens[gold[0]]


@pytest.mark.parametrize(
    ("cfg", "field"),
    [({"p": 12, "op": "/"}, "task.p"), ({"p": 3, "train_fraction": 0.1}, "task.train_fraction"),
     ({"op": "^"}, "task.op"), ({"p": 1}, "task.p")],
)  # fmt: skip
def test_bad_configs_name_the_field(cfg: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match="^" + re.escape(field) + ": .*Fix: "):
        RunSpec.from_dict({"task": {"name": "modular", **cfg}, "model": {"name": "transformer"}})
    assert RunSpec.from_dict({"task": {"name": "modular", "p": 12, "op": "+"}, "model": {"name": "transformer"}})


def test_the_declared_groks_event_waits_for_memorisation() -> None:
    """Seed 0 reaches 0.95 on test at step 2 while train is at 0.5, memorises at step 3 and
    is at 0.96 on test at step 4: it groks at 4, not 2. Seed 1 memorises but never reaches
    0.95 on test: censored at the budget. Seed 2 memorises at 1 and groks at 3."""
    events = {e["name"]: sv.event_from_declaration(e, e["name"]) for e in task().analysis()["events"]}
    groks = events["groks"]
    assert groks.label == "groks: test accuracy >= 0.95 after train accuracy >= 0.99"
    assert sv.parse_event(groks.label) == groks
    steps = [1, 2, 3, 4]
    train = {0: [0.2, 0.5, 1.0, 1.0], 1: [0.9, 1.0, 1.0, 1.0], 2: [1.0, 1.0, 1.0, 1.0]}
    test = {0: [0.1, 0.97, 0.5, 0.96], 1: [0.0, 0.1, 0.2, 0.3], 2: [0.1, 0.5, 0.95, 0.99]}

    def curves(values: dict[int, list[float]]) -> pd.DataFrame:
        return pd.DataFrame([{"trial_id": "t", "seed": s, "time": t, "value": v}
                             for s, vs in values.items() for t, v in zip(steps, vs, strict=True)])  # fmt: skip

    runs = pd.DataFrame({"point": "p", "trial_id": "t", "seed": [0, 1, 2], "status": "ok", "budget": 4.0,
                         "early_stop": False})  # fmt: skip
    out = sv.run_outcomes(curves(test), runs, groks, curves(train)).set_index("seed")
    assert out["outcome"].to_dict() == {0: "event", 1: "budget", 2: "event"}
    assert out["time"].to_dict() == {0: 4.0, 1: 4.0, 2: 3.0}
    memorises = sv.run_outcomes(curves(train), runs, events["memorizes"]).set_index("seed")
    assert memorises["time"].to_dict() == {0: 3.0, 1: 2.0, 2: 1.0}
    with pytest.raises(sv.AnalysisError, match="after"):
        sv.run_outcomes(curves(test), runs, groks)
