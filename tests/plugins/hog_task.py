"""A local plugin for the worker-memory tests: the 2-D toy task that, in a Ray worker only,
holds ``HOG_GB`` GiB of touched memory at ``HOG_AT``: its data build (a trial's setup) or
its scoring (a trial's step), so that Ray's memory monitor kills that worker."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from trainables.data import Split, TaskData
from trainables.registry import TASKS
from trainables.tasks.toy2d import Toy2D

HELD: list[np.ndarray] = []


def _hog(at: str) -> None:
    import ray  # the driver's preflight builds the data too, before Ray: it holds nothing

    if os.environ.get("HOG_AT") == at and ray.is_initialized() and ray.get_runtime_context().get_actor_id():
        HELD.append(np.ones(int(float(os.environ["HOG_GB"]) * 2**30), dtype=np.uint8))
        time.sleep(60)  # Ray's memory monitor kills this worker meanwhile


@TASKS.register
class Hog(Toy2D):
    name: ClassVar[str] = "hog2d"

    def build(self, data_seed: int) -> TaskData:
        _hog("build")
        return super().build(data_seed)

    def score(self, split: Split, predictions: Sequence[Any]) -> dict[str, np.ndarray]:
        _hog("score")
        return super().score(split, predictions)
