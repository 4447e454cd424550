"""A Ray Tune callback that shows a study's progress as a rich progress bar."""

from __future__ import annotations

from typing import Any

from ray.tune import Callback
from rich.progress import Progress


class ProgressCallback(Callback):
    """Seeds committed, as a progress bar (the bar is not pickled with the Tuner's state)."""

    def __init__(self, progress: Progress, title: str, total: int, done: int, unit_sizes: list[int]) -> None:
        self.progress: Progress | None = progress
        self.unit_sizes = unit_sizes
        self.bar = progress.add_task(title, total=total, completed=done, info="")

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "progress": None}

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if self.progress is not None:
            running = sum(1 for t in trials if t.status == "RUNNING")
            self.progress.update(self.bar, info=f"{running} running, epoch {result.get('epoch')}")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if self.progress is not None:
            self.progress.advance(self.bar, self.unit_sizes[trial.config["unit_index"]])
