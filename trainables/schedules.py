"""Learning-rate schedules: linear warmup, then a constant or cosine-decayed rate.

``train.warmup_steps`` and ``train.lr_schedule`` (:class:`~trainables.spec.TrainConfig`)
set a factor on every member's base learning rate, a pure function of the number of
optimizer steps already taken (:func:`lr_factor`). The trainer applies it before each
step through the bundled optimizer's ``set_lr_factor`` (times ``lr_halving``'s factor,
where a study has both), so members with their own learning rates each get their own
rate times the same factor.

The conventions are those of ``torch.optim.lr_scheduler.LambdaLR`` driven once per step,
as Nanda et al.'s grokking code (``LambdaLR(opt, lambda step: min(step / 10, 1))``) and
Hugging Face's ``get_cosine_schedule_with_warmup`` use them: the step taken after ``t``
steps runs at ``lr * factor(t)``, so the first step of a warmup runs at rate 0 (its
gradient still enters Adam's moment estimates).
"""

from __future__ import annotations

import math
from typing import Literal

Schedule = Literal["constant", "cosine"]
SCHEDULES: tuple[str, ...] = ("constant", "cosine")


def lr_factor(step: int, schedule: str, warmup_steps: int, total_steps: int | None = None) -> float:
    """The factor on the base learning rate of the optimizer step taken after ``step`` steps.

    * warmup: ``step / warmup_steps`` while ``step < warmup_steps`` (0 at the first step);
    * ``constant``: 1 after the warmup;
    * ``cosine``: ``0.5 * (1 + cos(pi * q))`` with ``q = (step - warmup_steps) /
      (total_steps - warmup_steps)`` clipped to [0, 1]: from 1 right after the warmup to 0
      at ``total_steps`` (the run's step budget), and 0 beyond it.

    ``total_steps`` is needed for ``cosine`` only; a budget no longer than the warmup leaves
    nothing to decay (factor 1 after the warmup)."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if step < warmup_steps:
        return step / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule != "cosine":
        raise ValueError(f"unknown lr schedule {schedule!r}; use one of {', '.join(SCHEDULES)}")
    if total_steps is None:
        raise ValueError("the cosine schedule needs the run's total number of steps")
    span = total_steps - warmup_steps
    if span <= 0:
        return 1.0
    q = min(1.0, (step - warmup_steps) / span)
    return 0.5 * (1.0 + math.cos(math.pi * q))
