"""A local plugin (not installed): a two-blob classification task, for the plugin tests.

The tests copy this file beside a study file in a temporary folder, away from the
driver's working directory, ``PYTHONPATH`` and site-packages, so a Ray worker can import
it only if fineline ships it with the job.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from pydantic import Field

from trainables.configbase import FrozenConfig
from trainables.data import Arrays, Role, Split, TaskData
from trainables.registry import TASKS
from trainables.tasks.base import Task


class BlobsConfig(FrozenConfig):
    """Two Gaussian blobs in 2-D; the out-of-distribution splits move them apart."""

    n: int = Field(200, ge=4)
    """Examples per split."""
    shift: float = 1.5
    """How far the val_ood and test_ood blobs sit from the training ones."""
    rendezvous: str | None = None
    """A folder shared by two runs (the cluster tests'): each build drops a file there and
    waits, up to two minutes, until both have, so the runs really overlap whatever the
    machine's load (a run that ends first lets its reused actor take the next trial).
    None: no waiting."""


def _blobs(rng: np.random.Generator, n: int, offset: float) -> Arrays:
    y = rng.integers(0, 2, n)  # (n,)
    centre = np.where(y[:, None] == 1, 1.0 + offset, -1.0 - offset) * np.array([1.0, 0.5])
    x = centre + rng.normal(0.0, 0.7, (n, 2))  # (n, 2)
    return Arrays(x=x.astype(np.float32), y=y.astype(np.int64), ids=np.arange(n))


ROLES: dict[str, Role] = {"train": "train", "val": "val", "val_ood": "val_ood", "test": "test", "test_ood": "test"}
"""Each split's role, in build order."""


def _meet(folder: Path, runs: int, timeout: float = 120.0) -> None:
    """Drop this process's file in ``folder``; wait until ``runs`` files are there (or ``timeout``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{socket.gethostname()}-{os.getpid()}").touch()
    deadline = time.monotonic() + timeout
    while len(list(folder.iterdir())) < runs and time.monotonic() < deadline:
        time.sleep(0.1)


@TASKS.register
class Blobs(Task):
    """Two blobs; label = which blob."""

    name: ClassVar[str] = "blobs"
    Config: ClassVar[type[FrozenConfig]] = BlobsConfig
    data_kind = "classify"
    primary_metric: ClassVar[str] = "accuracy"
    metrics: ClassVar[tuple[str, ...]] = ("accuracy",)
    tiny: ClassVar[dict[str, Any]] = {"n": 64}
    tiny_train: ClassVar[dict[str, Any]] = {"lr": 0.01, "batch_size": 16}

    config: BlobsConfig

    def build(self, data_seed: int) -> TaskData:
        if self.config.rendezvous is not None:
            _meet(Path(self.config.rendezvous), runs=2)
        rng = np.random.default_rng(data_seed)
        n, shift = self.config.n, self.config.shift
        offsets = {"train": 0.0, "val": 0.0, "val_ood": shift, "test": 0.0, "test_ood": -0.8}
        return TaskData(
            {name: Split(name, role, _blobs(rng, n, offsets[name])) for name, role in ROLES.items()},
            {"input_shape": (2,), "n_classes": 2},
        )

    def split_roles(self) -> dict[str, Role]:
        """Without building (the driver asks; a build would join the rendezvous)."""
        return dict(ROLES)

    def rehearsable(self) -> bool:
        """Not with a rendezvous: the driver's build would count as one of the two runs."""
        return self.config.rendezvous is None

    def score(self, split: Split, predictions: Sequence[Any]) -> dict[str, np.ndarray]:
        predicted = np.array([int(np.argmax(p)) for p in predictions])
        return {"accuracy": (predicted == split.data.y).astype(np.float64)}  # type: ignore[union-attr]
