"""Stable identities: the ``trial_id`` of every shipped study file is pinned, and the rule
for new fields (``trainables.configbase.added_field``) keeps ids of unchanged configs.

If a pinned id changes, a study run with an earlier fineline can no longer resume or grow:
do not update the pins, fix the change (state a moved default in the study file, or
declare a new field with ``added_field``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import Field

from study.config import parse
from trainables.configbase import FrozenConfig, added_field
from trainables.spec import RunSpec

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

PINNED = {
    "elnaggar2022": ["aaf281a180df4c10", "9362acd110524d98", "e607453ba50497f1"],  # ec9167e0..., 23ef44bd..., b456e27b... before the final weights and the authors' checkpoints; e2f5446d..., 20f997f6..., 47ec4093... before Suzgun's very-long sampler
    "grokking_cpu": ["aef8eedee84bf11c", "024bcaf9216fcca5", "505b0e615067f4b0", "0df7a0e64150fd58"],
    "grokking_gpu": ["0163a0587efe8be2", "15f16968e3a69d84", "643907bf0740331b", "3cad894cbc31b179",
                     "07327d621631af66", "473cde2c84793038", "e04b0a0cf20dd481", "416a5779ec64db85",
                     "3d13ad28158bc116", "c49679e6cf60b406", "a6f747dbf6ede170", "b46dc09e07001943"],
    "li2021_mnist": ["80acb374a5d64eed", "5ee6bb29f41bf4cd"],  # 7d4861de..., 6619ecb7... before Keras's hinge, Adam epsilon and fixed data stream; 13cda084..., b45cdede... before init: keras
    "li2021_scan": ["761dfe18b6640d23", "60faff2c4dd7ca47"],  # 0e55d077..., 3805a73e... on impl: reference, before the fast path's input feeding; 3f5ea4b5..., 68c50f47... before the end-of-input token and 7 output classes; 59f55847..., f2348b3a... before init: tf, 8-dim targets; 513686de..., 8e6f2631... before input feeding, no tanh, sum / batch; 2f4d265b..., 29cfe1ff... before batches drawn with replacement
    "li2021_toy": ["2d2bcc41e9c45a94"],  # 13e03d858b7a2505 before Playground's training; d7d4864107d7926f before its fixed data order
    "quickstart": ["b38ef157b3f8acb0"],  # bef8b71cc8cc0099 before the end symbol
    "sine": ["3175e94998e2fc36", "a2ef3f598a493458"],
    "shah2020_lms5": ["c36cd9ff7cb629c1", "8a6c28066069cc78", "2f9acbbfdff2c677"],
    "shah2020_lms7": ["67fca6990a939f2a", "c9c0e1c4add2f3f4"],
    "shah2020_ms57": ["ef2cfe1f4abb5425", "29a54a2f6aaa423b", "b959986fd86666d5"],
    "sutskever2014": ["4cc21a4168a0b359"],  # 06ab600dff85979f before the fidelity fixes
    "tiny_cluster": ["0c7e92a70f29f30b"],
    "weber2018": ["14b09893334957a7"],  # d2f1484e3fd46ece before OpenNMT-py's stopping split, lr decay and dropout placement; 769e99719d5418a3 before input feeding and sum / sentences; f5fc75ecee43564a before the fidelity fixes
    "weber2018_tune": ["14b09893334957a7"],  # d2f1484e3fd46ece before OpenNMT-py's stopping split, lr decay and dropout placement; 769e99719d5418a3 before input feeding and sum / sentences
    "xu2023_xor": ["f76ac5b4f57a6143", "4e2f01aeebeaf2ad", "fd45220ca74668fa", "302a3c34d6e7d693",
                   "af6e84b0f7f37fe3", "ddce5916ea7fc14e"],
    "zhou2023_hints_gpu": ["63ddccf2471de4b3", "6ddfcfd5084ba099"],
    "zhou2023_length_cpu": ["51225f1382458f29", "f9e83c34aae31421", "7a1ba6dd7f366300", "af5fa51ed1abb3c6",
                            "3152f76c3555923f", "1eb0c745197f8193", "770145fd121d4833"],
    "zhou2023_length_gpu": ["dec705b545f6058e", "a28472b7a4638023", "6ddcc96dce51bb3c", "297003aefae594a5",
                            "5732786ad43fe6c7", "9d893d7c89c812b0", "9634218454c2aa9f"],
}
"""Every point's trial_id, computed by fineline before the plugins change (d547e14). Eight
moved on purpose, since they now compute something else (issue 24: the end symbol in
weber2018 and the quickstart, the arming level in weber2018 and then OpenNMT-py's input
feeding and sum / sentences loss in weber2018 and its tuning study, the paper's loss scale and step
budget in sutskever2014, Keras's init in li2021_mnist, TF's init and the 8-dim target
embedding in li2021_scan and then its TensorFlow 1 attention wrapper (input feeding, no tanh)
and loss (sum / batch) and then its batches drawn with replacement and then its end-of-input
token and 7 output classes and then its move to the fast path's bundled input feeding, Suzgun et al.'s very-long sampler in elnaggar2022 and then its final-epoch weights and the authors' checkpoint epochs, TensorFlow
Playground's training in li2021_toy and then its fixed data order, and at stop 48 the
uncharacteristic stopping split and OpenNMT-py's lr decay and dropout placement in weber2018 and its tuning study,
Keras's hinge, Adam epsilon and one data stream in li2021_mnist); the comments keep their
earlier ids. Every other change must keep them."""


def test_every_shipped_study_file_is_pinned() -> None:
    assert {p.stem for p in CONFIGS.glob("*.yaml")} == set(PINNED), "pin the new study file's ids"


@pytest.mark.parametrize("name", sorted(PINNED))
def test_shipped_trial_ids_do_not_move(name: str) -> None:
    cfg = parse(yaml.safe_load((CONFIGS / f"{name}.yaml").read_text()))
    assert [p.trial_id for p in cfg.points] == PINNED[name]


class Before(FrozenConfig):
    """A config as first released."""

    width: int = 8
    """A width."""


class After(Before):
    """The same config with two fields added later."""

    scale: float = added_field(1.0, gt=0)
    """New; 1.0 computes what configs did before it existed."""
    mode: str = added_field("fast", identity_default="exact")
    """New, with a new default: at ``exact`` it computes what configs did before it."""


class Careless(Before):
    """A field added without the rule."""

    scale: float = Field(1.0, gt=0)
    """Forgot added_field."""


def _id(model_cfg: FrozenConfig) -> str:
    spec = RunSpec.from_dict({"task": {"name": "toy2d"}, "model": {"name": "mlp"}})
    return RunSpec(spec.task_name, spec.task, spec.model_name, model_cfg, spec.train).trial_id()


def test_an_added_field_at_its_identity_default_keeps_the_id() -> None:
    before = _id(Before(width=8))
    assert _id(After(width=8, scale=1.0, mode="exact")) == before
    assert _id(After(width=8, scale=2.0, mode="exact")) != before, "a new value is a new config"
    assert _id(After(width=8)) != before, "the new default computes something else: a new id"
    assert _id(Careless(width=8)) != before, "without added_field the id moves (the rule is needed)"


def test_a_moved_default_keeps_the_id_when_the_resolved_value_is_stated() -> None:
    """TrainConfig's optimizer default moved from sgd to adam: a study file that states sgd
    keeps its id; resolved values, not defaults, are hashed."""
    raw = {"task": {"name": "toy2d"}, "model": {"name": "mlp"}, "train": {"optimizer": "sgd"}}
    spec = RunSpec.from_dict(raw)
    assert spec.train.optimizer == "sgd"
    assert spec.trial_id() == RunSpec.from_dict(raw).trial_id()
    assert RunSpec.from_dict({**raw, "train": {}}).trial_id() != spec.trial_id()
