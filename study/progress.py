"""A study's progress, shown as it goes: a live bar on a terminal, lines in a log.

:class:`ProgressCallback` is a Ray Tune callback fed by the trainable's results (each
carries the bundle's epoch, its running members and their latest selection metric; the
last one the seeds it committed, see ``FinelineTrainable.step``).

* On a terminal: a bar of seeds committed out of planned, with the running bundles' epoch,
  the selection metric's median and range over their running seeds, and an estimate of
  the time left; nothing stale is left once the study ends.
* Not on a terminal (nohup, a batch job, CI): a line when Ray has started, a line per
  committed seed (grid point, seed, status, selected epoch, selection metric), and a
  heartbeat line every ``execution.progress_every_s`` seconds with the same summary and the
  running bundles' last round: seconds in training steps and in evaluation (where a slow
  study's time goes; each unit's totals land in ``trials``: ``train_s``, ``eval_s``,
  ``final_eval_s``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ray.tune import Callback
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Column
from rich.text import Text

from trainables.errors import REFUSED

Emit = Callable[[str], None]


@dataclass
class Running:
    """The latest result of one running bundle."""

    at: str = ""
    """``epoch 3`` or ``step 400``: how far it has trained."""
    active: int = 0
    values: list[float] = field(default_factory=list)
    """The selection metric of its running seeds (median and range are shown)."""
    round_s: tuple[float, float] | None = None
    """Its last round's seconds: training steps, evaluation (where a slow study's time goes)."""


class ProgressCallback(Callback):
    """Seeds committed, as a bar (``progress``) or as log lines (``emit``); neither is pickled
    with the Tuner's state."""

    def __init__(
        self,
        title: str,
        total: int,
        done: int,
        unit_sizes: list[int],
        points: list[str],
        *,
        progress: Progress | None = None,
        emit: Emit | None = None,
        every_s: float = 60.0,
        trial_errors: Mapping[str, BaseException] | None = None,
        retries: int = 2,
    ) -> None:
        self.progress, self.emit = progress, emit
        self.title, self.total, self.done = title, total, done
        self.unit_sizes, self.points = unit_sizes, points
        self.every_s = every_s
        self.running: dict[str, Running] = {}
        self.failed = 0
        self.failed_units: list[int] = []
        """Indices of the units whose trials failed after their retries or were refused
        (Tune's results give a trial that never reported no config, so they cannot say which)."""
        self.failures: dict[int, str] = {}
        """Why each failed unit failed, by index: its error as :func:`study.failures.failure_text`
        gives it, or the worker's refusal of its config (:data:`trainables.errors.REFUSED`)."""
        self.refused: set[int] = set()
        """Indices of the failed units whose config their worker refused (never retried)."""
        self.retries = retries
        """``execution.max_failures``: how often Tune retried a trial before it failed."""
        self.trial_errors: Mapping[str, BaseException] = trial_errors if trial_errors is not None else {}
        """Each failed trial's exception by its name, as Tune logged it (``study.failures.TrialErrors``)."""
        self.metric = ""
        self.started = self.last_line = time.monotonic()
        self.done_at_start = done
        self.ended = False
        """Set by :meth:`finish`: seeds still left will not run in this driver."""
        self.last_commit = self.started
        """When the latest seed committed (the ETA extrapolates from it)."""
        self.wave = 0
        """The most seeds seen running at once: seeds train in waves of about that many (two
        bundles of three on two CPUs: six), so the time per seed is the time so far over at
        least one wave (over the first commit alone, the first ETA was several times too high)."""
        self.bar = progress.add_task(title, total=total, completed=done, info="", eta=self.eta()) if progress else None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "progress": None, "emit": None}

    # ----------------------------------------------------------------- summary
    def summary(self) -> str:
        """``done/total committed, N running (epoch e), metric median [min, max], last round:
        train t s + eval e s`` (the round's times: the median over the running bundles)."""
        return ", ".join([f"{self.done}/{self.total} seeds committed", *self._state(), *self._round_times()])

    def _round_times(self) -> list[str]:
        times = [r.round_s for r in self.running.values() if r.round_s is not None]
        if not times:
            return []
        train, evaluation = (statistics.median(t[i] for t in times) for i in (0, 1))
        return [f"last round: train {_seconds(train)} + eval {_seconds(evaluation)}"]

    def info(self) -> str:
        """The bar's text: failed seeds, running bundles and their metric (no committed count:
        the bar shows it)."""
        return ", ".join(self._state())

    def _state(self) -> list[str]:
        """What the committed count leaves out: failed seeds, running bundles, their metric."""
        parts = []
        if self.failed:
            parts.append(f"{self.failed} failed")
        active = sum(r.active for r in self.running.values())
        if self.running:
            ats = sorted({r.at for r in self.running.values() if r.at}, key=_number)
            at = f", {ats[0]}" + (f" to {ats[-1].split()[-1]}" if len(ats) > 1 else "") if ats else ""
            parts.append(f"{active} running{at}")
        values = [v for r in self.running.values() for v in r.values]
        if values and self.metric:
            parts.append(f"{self.metric} {statistics.median(values):.4g} [{min(values):.4g}, {max(values):.4g}]")
        return parts

    def eta(self, now: float | None = None) -> str:
        """Time left, ``H:MM:SS``: the mean time per seed committed by this driver so far
        (over at least one wave of seeds running at once), times the seeds left, counted down
        from the latest commit (``-:--:--`` before the first). Rich's own estimate only looks
        at the last 30 s, so it is blank whenever seeds commit further apart than that (most
        studies)."""
        ran, left_seeds = self.done - self.done_at_start, self.total - self.done - self.failed
        if left_seeds <= 0:  # every seed committed or failed: nothing is left to wait for
            return _clock(0)
        if ran <= 0 or self.ended:  # nothing committed yet, or stopped with seeds left
            return "-:--:--"
        per_seed = (self.last_commit - self.started) / max(ran, min(self.wave, ran + left_seeds))
        left = self.last_commit + per_seed * left_seeds - (time.monotonic() if now is None else now)
        return _clock(max(left, 0.0))

    def _show(self) -> None:
        if self.progress is not None and self.bar is not None:
            self.progress.update(self.bar, completed=self.done, info=self.info(), eta=self.eta())
        now = time.monotonic()
        if self.emit is not None and now - self.last_line >= self.every_s:
            self._line(f"{self.summary()} ({_clock(now - self.started)})")

    def _line(self, text: str) -> None:
        self.last_line = time.monotonic()
        if self.emit is not None:
            self.emit(f"{self.title}: {text}")

    def finish(self) -> None:
        """The study has stopped (finished, failed or interrupted): nothing runs any more, so
        the bar's last frame shows no running bundle or metric."""
        self.running.clear()
        self.ended = True
        self._show()

    # ----------------------------------------------------------------- Tune hooks
    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if REFUSED in result:  # the worker refused the unit's config: it ends now, not retried
            self.refused.add(trial.config["unit_index"])
            self._failed(trial, str(result[REFUSED]), "failed (its config was refused, not retried)")
            return
        values = result.get("sel_values") or []
        self.metric = result.get("sel_metric", self.metric)
        times = result.get("round_s")
        self.running[trial.trial_id] = Running(
            str(result.get("at", "")), int(result.get("active", 0)), list(values),
            (float(times[0]), float(times[1])) if times else None,
        )
        self.wave = max(self.wave, sum(r.active for r in self.running.values()))
        committed = result.get("committed_seeds") or []
        before, self.done = self.done, self.done + len(committed)  # a bundle's seeds commit together:
        if committed:  # the ETA counts them all at once (one at a time it ran far too high)
            self.last_commit = time.monotonic()
        point = self.points[trial.config["unit_index"]]
        for k, seed in enumerate(committed, start=before + 1):
            value = seed.get("value")
            shown = f", {self.metric} {value:.4g}" if value is not None and self.metric else ""
            self._line(  # a log's running count: heartbeats pause while seeds commit
                f"seed {seed['seed']}{f' ({point})' if point else ''} committed: {seed['status']}, "
                f"selected {seed['selected']}{shown} ({k}/{self.total} seeds, eta {self.eta()})"
            )
        if committed:
            self.running.pop(trial.trial_id, None)
        self._show()

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        """Every turn of Tune's loop (a few per second): the heartbeat is due by the clock,
        not only when a bundle reports (a bundle's round can take minutes)."""
        now = time.monotonic()
        if self.progress is not None and self.bar is not None:
            self.progress.update(self.bar, eta=self.eta(now))  # counts down between commits
        if self.emit is not None and now - self.last_line >= self.every_s:
            self._line(f"{self.summary()} ({_clock(now - self.started)})")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.running.pop(trial.trial_id, None)
        self._show()

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        from study.failures import IN_RAYS_LOG, failure_text, trial_error

        error = trial_error(trial, self.trial_errors)
        text = failure_text(error) if error is not None else IN_RAYS_LOG
        tries = f"after {self.retries} retr{'y' if self.retries == 1 else 'ies'}" if self.retries else "(no retries)"
        self._failed(trial, text, f"failed {tries}")

    def _failed(self, trial: Any, text: str, how: str) -> None:
        """A unit failed: its seeds count as failed (the ETA stops waiting for them), its
        cause is kept for the driver's summary and its line names the grid point."""
        self.running.pop(trial.trial_id, None)
        index = trial.config["unit_index"]
        if index in self.failures:  # Tune reports a trial's end once; never count it twice
            return
        said = text if text not in self.failures.values() else "the same cause as above"
        self.failed_units.append(index)
        self.failures[index] = text
        self.failed += self.unit_sizes[index]
        point = f" ({self.points[index]})" if self.points[index] else ""
        self._line(f"a trial of {self.unit_sizes[index]} seed(s){point} {how}: {said}")
        self._show()


def _number(at: str) -> int:
    return int(at.split()[-1]) if at.split() and at.split()[-1].isdigit() else 0


def _seconds(seconds: float) -> str:
    """``0.42 s``, ``12 s``, ``3 min 05 s``: a duration short enough for a progress line."""
    if seconds < 10:
        return f"{seconds:.2g} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s:02d} s"


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


def progress_bar(target: Console) -> Progress:
    """The terminal's bar: ``title ━━━ done/planned info elapsed eta``. The info (failed and
    running seeds, the selection metric) is the one column that shrinks, with an ellipsis,
    on a narrow terminal: the counts, the clock and the ETA always show. The ETA is the
    callback's (``eta`` field, :meth:`study.progress.ProgressCallback.eta`)."""
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        _InfoColumn(), TimeElapsedColumn(), TextColumn("eta {task.fields[eta]}"),
        console=target,
    )


class _InfoColumn(ProgressColumn):
    """``task.fields['info']`` on one line, cut with an ellipsis when the terminal is narrow
    (a wrappable table column, so the table shrinks this one first; a no-wrap text)."""

    def __init__(self) -> None:
        super().__init__(table_column=Column(no_wrap=False, overflow="ellipsis"))

    def render(self, task: Any) -> Text:
        return Text(str(task.fields.get("info", "")), no_wrap=True, overflow="ellipsis")
