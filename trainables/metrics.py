"""How a metric reads: which way is better and which values it can take.

A task lists its metrics in ``Task.metrics``. A bare name is a share in [0, 1] where higher
is better (accuracy, exact match): most metrics of a generalization study are. Anything
else is declared with :class:`Metric`, e.g. ``Metric("mse", better="lower", high=None)``.
The declaration travels to the study manifest (the analysis never imports a task) and
decides, everywhere, which config is better, which way a tuning objective goes by default,
which way selection may go, and the range an interval is kept inside. A model's ``loss``
is :data:`LOSS`; a model's other metrics are shares like a task's bare names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from trainables.plugins import PluginError


@dataclass(frozen=True)
class Metric:
    """One metric's direction and range (per example and so for a mean of examples)."""

    name: str
    """The name :meth:`Task.score` returns it under."""
    better: Literal["higher", "lower"] = "higher"
    """Which way a better run moves it."""
    low: float | None = 0.0
    """The least value it can take (None: unbounded below)."""
    high: float | None = 1.0
    """The greatest value it can take (None: unbounded above)."""

    def __post_init__(self) -> None:
        if self.better not in ("higher", "lower"):
            raise PluginError(f"metric {self.name!r}: better={self.better!r}. Fix: use 'higher' or 'lower'")
        if self.low is not None and self.high is not None and not self.low < self.high:
            raise PluginError(f"metric {self.name!r}: low {self.low} is not below high {self.high}. "
                              "Fix: give low < high, or None for an open end")

    @property
    def higher_is_better(self) -> bool:
        return self.better == "higher"

    @property
    def share(self) -> bool:
        """A share of examples in [0, 1] where higher is better (accuracy, exact match)."""
        return self.higher_is_better and (self.low, self.high) == (0.0, 1.0)

    @property
    def mode(self) -> Literal["max", "min"]:
        """The selection mode that keeps the best epoch."""
        return "max" if self.higher_is_better else "min"

    @property
    def direction(self) -> Literal["maximize", "minimize"]:
        """The Optuna direction that searches for the best config."""
        return "maximize" if self.higher_is_better else "minimize"

    def outside(self, values: np.ndarray) -> np.ndarray:
        """Values outside [low, high] (NaN is not outside: it is a run's divergence)."""
        v = np.asarray(values, dtype=np.float64)
        bad = np.zeros(v.shape, dtype=bool)
        if self.low is not None:
            bad |= v < self.low
        if self.high is not None:
            bad |= v > self.high
        return v[bad]

    def as_dict(self) -> dict[str, Any]:
        """As the manifest stores it (``analysis.metrics``)."""
        return {"better": self.better, "low": self.low, "high": self.high}


LOSS = Metric("loss", better="lower", low=None, high=None)
"""Every model's training loss (a mean per example; unbounded: a plugin's may be negative)."""

LOOKS_LOWER = ("loss", "error", "err", "mse", "mae", "rmse", "nll", "perplexity", "ppl", "distance", "dist",
               "regret", "cost")
"""Words of a metric name that suggest lower is better: a bare name holding one is refused
at registration (declare it), never guessed."""


def declared(entries: Iterable[str | Metric]) -> dict[str, Metric]:
    """``Task.metrics`` (names and :class:`Metric`) as name -> Metric; a bare name is a share
    in [0, 1], higher better. Raises PluginError for a bare name that reads like an error
    (``mse``), an entry of another type, or a name given twice."""
    out: dict[str, Metric] = {}
    for e in entries:
        if isinstance(e, str):
            words = e.lower().replace("-", "_").split("_")
            if e != "loss" and any(w in LOOKS_LOWER for w in words):
                raise PluginError(
                    f"metric {e!r} is a bare name, which means a share in [0, 1] where higher is better, but "
                    f"its name reads like an error. Fix: declare it in the task's `metrics`, e.g. "
                    f"Metric({e!r}, better='lower', high=None) (from trainables.metrics import Metric), or "
                    "Metric(..., better='higher') if higher is better")
            e = LOSS if e == "loss" else Metric(e)
        if not isinstance(e, Metric):
            raise PluginError(f"metric entry {e!r} is neither a name nor a Metric. Fix: write a name "
                              "(a share in [0, 1], higher better) or Metric(name, better=..., low=..., high=...)")
        if e.name in out:
            raise PluginError(f"metric {e.name!r} is declared twice. Fix: list it once")
        out[e.name] = e
    return out


def check_values(metrics: Mapping[str, Metric], name: str, values: np.ndarray, where: str) -> str | None:
    """A problem line when per-example ``values`` of metric ``name`` leave its declared range
    (None when they keep to it, or the metric is not declared)."""
    m = metrics.get(name)
    if m is None:
        return None
    bad = m.outside(values)
    if not len(bad):
        return None
    lo = "-inf" if m.low is None else f"{m.low:g}"
    hi = "inf" if m.high is None else f"{m.high:g}"
    shown = ", ".join(f"{x:.4g}" for x in bad[:3])
    bare = m == Metric(m.name)
    fix = (f"declare it in the task's `metrics` as Metric({name!r}, better=..., low=..., high=...) "
           "(a bare name means a share in [0, 1])" if bare else f"widen Metric({name!r}, ...)'s low/high")
    return f"{where}: metric {name!r} gave {shown} ({len(bad)} value(s)) outside its range [{lo}, {hi}]. Fix: {fix}"

