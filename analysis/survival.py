"""Time to an event: when does a run learn, generalise, grok - and which runs never do?

An **event** is a metric crossing a threshold on a split, e.g. ``val accuracy >= 0.5``
(:class:`Event`, :func:`parse_event`); a run's *time to the event* is the first epoch
(or optimizer step, for step-based training) at which its learning curve in the
``metrics`` table crosses it. Runs that never cross are not dropped:

* ``budget``: the run trained to its budget (``max_epochs`` / ``max_steps``) without the
  event - **right-censored** at its last logged time;
* ``early_stop``: the run stopped before its budget (early stopping) without the event -
  censored too, but **informatively** (the stopping rule looked at the same curves), so
  the estimates are biased towards "never"; study such runs with
  ``train.selection.early_stop: false``;
* ``stopped``: the run ended early for another reason (censored);
* ``diverged``: the run diverged before the event - a **competing outcome**, not a
  censoring: it is left out of the Kaplan-Meier estimate (which is therefore *among runs
  that did not diverge*) and counted apart; :func:`cumulative_incidence` gives the share of
  *all* runs that reached the event with divergence as the competing risk
  (Aalen-Johansen).

Pure functions on small tables (rliable style: the shape of every table is stated):

* :func:`run_outcomes`: per-run curves -> one row per run (time, outcome);
* :func:`kaplan_meier`: times and event flags -> the survival table with a pointwise 95%
  log-log (exponential Greenwood) band, from :func:`scipy.stats.ecdf` on
  :class:`scipy.stats.CensoredData`;
* :func:`median_time`: the median time with its interval, read from the band the
  Brookmeyer-Crowley way: the median is the first time ``S(t) <= 0.5``; the interval runs
  from the first time the band's *lower* curve reaches 0.5 to the first time its *upper*
  curve does (``None``: not reached within the study's times);
* :func:`reached_by`: the fraction of runs that reached the event by a time, ``1 - S(t)``
  with the band;
* :func:`cumulative_incidence`: Aalen-Johansen cumulative incidence of the event and of
  the competing outcome;
* :func:`event_summary`: all of the above per grid point;
* :func:`restricted_times`: each run's ``min(T, C)`` and whether it had the event, whose
  spreads :func:`analysis.seed_questions.study_events` splits between seed sources where
  configs varied them one at a time (e.g. init seeds on one split, split seeds with one init).
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

from analysis import intervals as iv
from analysis.errors import AnalysisError

OPERATORS: dict[str, Any] = {
    ">=": np.greater_equal,
    ">": np.greater,
    "<=": np.less_equal,
    "<": np.less,
}
"""The comparisons an event may use."""

OUTCOMES: tuple[str, ...] = ("event", "budget", "early_stop", "stopped", "diverged")
"""A run's outcome (see the module docstring); every one but ``event`` and ``diverged``
is a censoring."""

CENSORED: tuple[str, ...] = ("budget", "early_stop", "stopped")
"""Outcomes that right-censor a run at its last logged time."""

EARLY_STOP_FIX = (
    "rerun time-to-event studies with train.selection.early_stop: false so every run "
    "trains to its budget"
)

_EVENT_RE = re.compile(
    r"^\s*(?:(?P<name>[A-Za-z_][\w.-]*)\s*:\s*)?"
    r"(?P<split>[^\s<>=:]+)\s+(?P<metric>[^\s<>=]+)\s*(?P<op>>=|<=|>|<)\s*(?P<thr>\S+)\s*$"
)


@dataclass(frozen=True)
class Event:
    """A run reaches this event at the first logged time its ``split`` ``metric`` compares
    to ``threshold`` as ``op`` says (``val accuracy >= 0.5``)."""

    split: str
    """Split whose learning curve is read (``metrics`` table)."""
    metric: str
    """Metric of that curve."""
    op: str
    """One of ``>=``, ``>``, ``<=``, ``<``."""
    threshold: float
    """The level to cross."""
    name: str = ""
    """A word for it (``learns``, ``groks``); empty: none."""
    after: Event | None = None
    """A precondition: the event counts only at or after the first logged time this other
    event was reached (``groks``: test accuracy >= 0.95 after train accuracy >= 0.99)."""

    @property
    def label(self) -> str:
        """``learns: val accuracy >= 0.5`` (``val accuracy >= 0.5`` without a name; with
        ``after``, ``... after train accuracy >= 0.99``)."""
        base = f"{self.split} {self.metric} {self.op} {self.threshold:g}"
        if self.after is not None:
            base += f" after {self.after.split} {self.after.metric} {self.after.op} {self.after.threshold:g}"
        return f"{self.name}: {base}" if self.name else base

    def reached(self, values: Any) -> np.ndarray:
        """Whether each value (n,) meets the event (NaN never does)."""
        v = np.asarray(values, dtype=float)
        with np.errstate(invalid="ignore"):
            return np.asarray(OPERATORS[self.op](v, self.threshold)) & ~np.isnan(v)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "split": self.split, "metric": self.metric, "op": self.op,
                "threshold": self.threshold, "label": self.label,
                **({"after": self.after.as_dict()} if self.after is not None else {})}  # fmt: skip


def parse_event(text: str, where: str = "--event") -> Event:
    """``"[NAME:] SPLIT METRIC OP THRESHOLD [after SPLIT METRIC OP THRESHOLD]"`` (e.g.
    ``"learns: val accuracy >= 0.5"``) as an :class:`Event`; raises :class:`AnalysisError`
    naming ``where`` and the form."""
    head, sep, tail = (text or "").partition(" after ")
    if sep:
        event, after = parse_event(head, where), parse_event(tail, where)
        return Event(event.split, event.metric, event.op, event.threshold, event.name, after)
    m = _EVENT_RE.match(text or "")
    thr = _number(m.group("thr")) if m else None
    if m is None or thr is None:
        raise AnalysisError(
            f"{where}: cannot read {text!r} as an event; write SPLIT METRIC OP THRESHOLD with OP "
            f"one of {', '.join(OPERATORS)}, optionally preceded by 'NAME:', e.g. "
            "'val accuracy >= 0.5' or 'learns: val accuracy >= 0.5'"
        )
    return Event(m.group("split"), m.group("metric"), m.group("op"), thr, m.group("name") or "")


def _number(text: str) -> float | None:
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def event_from_declaration(value: Any, where: str) -> Event:
    """A task's declared event: the text form of :func:`parse_event`, or a dict
    ``{"name"?, "split", "metric", "op", "threshold", "after"?}`` (``after``: an event in
    either form, the precondition)."""
    if isinstance(value, str):
        return parse_event(value, where)
    if isinstance(value, dict) and {"split", "metric", "op", "threshold"} <= set(value):
        op, thr = str(value["op"]), _number(str(value["threshold"]))
        after = value.get("after")
        if op in OPERATORS and thr is not None:
            return Event(str(value["split"]), str(value["metric"]), op, thr, str(value.get("name") or ""),
                         None if after is None else event_from_declaration(after, f"{where}.after"))  # fmt: skip
    raise AnalysisError(
        f"analysis declaration {where}: expected 'SPLIT METRIC OP THRESHOLD' or "
        f"{{'name', 'split', 'metric', 'op', 'threshold'}} with op one of {', '.join(OPERATORS)}, "
        f"got {value!r}. Fix the task's analysis() declaration"
    )


# ---------------------------------------------------------------------------- run outcomes

OUTCOME_COLUMNS = ("point", "trial_id", "seed", "status", "time", "last_time", "budget", "outcome")


def run_outcomes(
    curves: pd.DataFrame, runs: pd.DataFrame, event: Event, after_curves: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Each run's time to ``event`` and its outcome.

    ``curves``: the event's split and metric, one row per (trial_id, seed, time) with
    columns trial_id, seed, time, value (time: epoch or step, increasing). ``runs``: one
    row per committed run, columns point, trial_id, seed, status, budget (the run's
    ``max_epochs``/``max_steps``; NaN: unknown, then the longest run of its trial stands
    for it), early_stop (bool: whether the run could stop early). Runs without a curve are
    left out. Returns :data:`OUTCOME_COLUMNS`, one row per run: ``time`` is the event's
    time, or the censoring/divergence time (the run's last logged time); ``outcome`` one
    of :data:`OUTCOMES`. ``after_curves`` (same columns): the curve of ``event.after``, whose
    first crossing a hit must not precede (a run that never crosses it has no event).
    """
    c = curves.dropna(subset=["time"]).sort_values(["trial_id", "seed", "time"], kind="stable")
    c = c.drop_duplicates(["trial_id", "seed", "time"], keep="first")
    hit = c[event.reached(c["value"].to_numpy())]
    if event.after is not None:
        if after_curves is None:
            raise AnalysisError(f"event {event.label!r}: the curve of its 'after' condition is missing")
        a = after_curves.dropna(subset=["time"])
        since = a[event.after.reached(a["value"].to_numpy())].groupby(["trial_id", "seed"])["time"].min()
        start = hit.join(since.rename("since"), on=["trial_id", "seed"])["since"]
        hit = hit[start.notna() & (hit["time"] >= start)]
    first = hit.groupby(["trial_id", "seed"])["time"].min()
    last = c.groupby(["trial_id", "seed"])["time"].max()
    longest = c.groupby("trial_id")["time"].max()
    rows = []
    for r in runs.itertuples(index=False):
        key = (r.trial_id, int(r.seed))
        if key not in last.index:
            continue
        status = "ok" if pd.isna(r.status) else str(r.status)
        end = float(last[key])
        budget = float(r.budget) if pd.notna(r.budget) else float(longest[r.trial_id])
        if key in first.index:
            outcome, time = "event", float(first[key])
        elif status == "diverged":
            outcome, time = "diverged", end
        elif end >= budget:
            outcome, time = "budget", end
        elif bool(r.early_stop):
            outcome, time = "early_stop", end
        else:
            outcome, time = "stopped", end
        rows.append((r.point, r.trial_id, int(r.seed), status, time, end, budget, outcome))
    return pd.DataFrame(rows, columns=list(OUTCOME_COLUMNS))


def restricted_times(outcomes: pd.DataFrame) -> pd.DataFrame:
    """Each run's *restricted* time to the event and whether it happened, for spreads.

    ``outcomes``: :func:`run_outcomes`. A run with the event keeps its time; a censored run
    (budget, early stop, stopped) its censoring time, i.e. ``min(T, C)``, whose mean over
    runs sharing one budget is the restricted mean survival time. Diverged runs (a
    competing outcome) are left out. Returns one row per run, columns point, trial_id, seed,
    time, reached (1.0: the event; 0.0: censored).
    """
    o = outcomes[outcomes["outcome"] != "diverged"]
    return pd.DataFrame({"point": o["point"], "trial_id": o["trial_id"], "seed": o["seed"].astype(int),
                         "time": o["time"].astype(float),
                         "reached": (o["outcome"] == "event").astype(float)}).reset_index(drop=True)  # fmt: skip


# ---------------------------------------------------------------------------- Kaplan-Meier

KM_COLUMNS = ("time", "at_risk", "events", "censored", "survival", "low", "high")


def kaplan_meier(times: Any, observed: Any, *, level: float = 0.95) -> pd.DataFrame:
    """The Kaplan-Meier survival table of ``times`` (n,) with ``observed`` (n,) flags (True:
    the event at that time; False: right-censored there).

    Returns :data:`KM_COLUMNS`, one row per distinct time (events and censorings; at a tie
    events come first): runs at risk just before, events, censorings, the survival
    ``S(t)`` = P(no event by t) and its pointwise ``level`` band (log-log, i.e. exponential
    Greenwood; :meth:`scipy.stats.ecdf`'s ``confidence_interval``). Where the log-log band
    is undefined it is completed by exact (Clopper-Pearson) bounds: before the first event
    (``S = 1``, no event among the n_j runs followed to t) upper 1 and lower
    ``((1 - level) / 2) ** (1 / n_j)``, so 20 runs censored at the budget without the event
    say "at most 17% would reach it", not "none would"; where ``S`` reaches 0 (all n_j runs
    at risk had the event) lower 0 and upper the bound of 0 survivors among the effective
    number of runs ``n_j / S(t-)`` (Dorey & Korn 1987; without censoring, all the runs):
    ``1 - ((1 - level) / 2) ** (S(t-) / n_j)``. Empty input: no rows.
    """
    t = np.asarray(times, dtype=float).ravel()
    e = np.asarray(observed, dtype=bool).ravel()
    if t.size == 0:
        return pd.DataFrame(columns=list(KM_COLUMNS))
    grid = np.unique(t)
    at_risk = np.array([(t >= x).sum() for x in grid])
    events = np.array([((t == x) & e).sum() for x in grid])
    censored = np.array([((t == x) & ~e).sum() for x in grid])
    surv = np.ones(grid.size)
    low, high = ((1 - level) / 2) ** (1 / at_risk), np.ones(grid.size)  # no event yet
    if e.any():
        res = sps.ecdf(sps.CensoredData(uncensored=t[e], right=t[~e]))
        surv = res.sf.evaluate(grid)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "undefined at some observations": handled below
            band = res.sf.confidence_interval(level, method="log-log")
        none_yet = surv >= 1
        low = np.where(none_yet, low, band.low.evaluate(grid))
        high = np.where(none_yet, 1.0, band.high.evaluate(grid))
        low = np.where(np.isnan(low), 0.0, low)
        for i in np.flatnonzero(np.isnan(high)):  # S = 0: every run at risk had the event
            before = high[i - 1] if i > 0 else 1.0
            s_before = surv[i - 1] if i > 0 else 1.0
            n_eff = at_risk[i] / s_before  # Dorey-Korn: runs a binomial share would rest on
            high[i] = min(before, 1 - ((1 - level) / 2) ** (1 / n_eff)) if events[i] else before
    return pd.DataFrame({"time": grid, "at_risk": at_risk, "events": events, "censored": censored,
                         "survival": surv, "low": low, "high": high})  # fmt: skip


def _first_time(km: pd.DataFrame, column: str, level: float = 0.5) -> float | None:
    below = km.loc[km[column] <= level + 1e-12, "time"]
    return float(below.iloc[0]) if not below.empty else None


def median_time(
    km: pd.DataFrame, level: float = 0.95
) -> tuple[float | None, float | None, float | None]:
    """(median, low, high) of the time to the event from a :func:`kaplan_meier` table (its
    band at ``level``).

    The median is the first time with ``S(t) <= 0.5``; the interval (Brookmeyer-Crowley,
    read from the band) runs from the first time the band's lower curve is ``<= 0.5`` to
    the first time its upper curve is. ``None`` where that never happens within the
    table's times (e.g. fewer than half the runs reached the event: no median). With 5 runs
    or fewer the lower curve is ``<= 0.5`` from the start (before any time, the exact bound
    ``((1 - level) / 2) ** (1 / n)``), so nothing bounds the median from below: low is 0."""
    if km.empty:
        return None, None, None
    low = _first_time(km, "low")
    if ((1 - level) / 2) ** (1 / float(km["at_risk"].iloc[0])) <= 0.5 + 1e-12:
        low = 0.0
    return _first_time(km, "survival"), low, _first_time(km, "high")


def reached_by(km: pd.DataFrame, time: float) -> tuple[float, float, float]:
    """(fraction, low, high): the share of runs that reached the event by ``time``,
    ``1 - S(time)`` with the band of a :func:`kaplan_meier` table (0 before any time)."""
    rows = km[km["time"] <= time]
    if rows.empty:
        return 0.0, 0.0, 0.0
    r = rows.iloc[-1]
    return 1.0 - float(r["survival"]), 1.0 - float(r["high"]), 1.0 - float(r["low"])


CIF_COLUMNS = ("time", "at_risk", "events", "competing", "censored", "cif_event", "cif_competing")


def cumulative_incidence(times: Any, codes: Any) -> pd.DataFrame:
    """Aalen-Johansen cumulative incidence with one competing outcome.

    ``times`` (n,), ``codes`` (n,): 1 = the event, 2 = the competing outcome (divergence),
    0 = right-censored. At each distinct time t_j with n_j runs at risk, d1_j events and
    d2_j competing outcomes: ``CIF1(t) = sum_{t_j <= t} S(t_{j-1}) d1_j / n_j`` (likewise
    CIF2) where ``S`` is the Kaplan-Meier probability of neither outcome yet. Without
    competing outcomes ``CIF1 = 1 - S`` of :func:`kaplan_meier`. Returns :data:`CIF_COLUMNS`.
    """
    t = np.asarray(times, dtype=float).ravel()
    c = np.asarray(codes, dtype=int).ravel()
    rows, s, f1, f2 = [], 1.0, 0.0, 0.0
    for x in np.unique(t):
        n = int((t >= x).sum())
        d1, d2 = int(((t == x) & (c == 1)).sum()), int(((t == x) & (c == 2)).sum())
        f1 += s * d1 / n
        f2 += s * d2 / n
        s *= 1.0 - (d1 + d2) / n
        rows.append((x, n, d1, d2, int(((t == x) & (c == 0)).sum()), f1, f2))
    return pd.DataFrame(rows, columns=list(CIF_COLUMNS))


# ---------------------------------------------------------------------------- per grid point

SUMMARY_COLUMNS = (
    "point", "runs", "events", "censored_budget", "censored_early_stop", "censored_other",
    "diverged", "budget", "median", "median_low", "median_high", "reached", "reached_low",
    "reached_high", "reached_all", "warn",
)  # fmt: skip
"""Columns of :func:`event_summary` (``reached*``: by the budget)."""

CURVE_COLUMNS = ("point", *KM_COLUMNS, "reached", "reached_all")


def event_summary(
    outcomes: pd.DataFrame, *, level: float = 0.95, points: Sequence[str] | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per grid point: the Kaplan-Meier estimate of :func:`run_outcomes`' table.

    Returns (summary, curves). ``summary``: :data:`SUMMARY_COLUMNS`, one row per point:
    runs, events, censorings by kind, diverged (competing, not in the KM), the budget
    (largest), the median time with its interval (:func:`median_time`; NaN: not reached),
    ``reached``: the share of non-diverged runs that reached the event by the budget with
    its band, ``reached_all``: the share of *all* runs (Aalen-Johansen, divergence
    competing), ``warn``: ``n<10`` under :data:`analysis.intervals.MIN_SEEDS` runs.
    ``curves``: :data:`CURVE_COLUMNS`, the KM table of each point with ``reached = 1 - S``
    and the Aalen-Johansen ``reached_all`` at each time. ``points``: order of the rows.
    """
    order = list(points) if points is not None else list(dict.fromkeys(outcomes["point"]))
    rows, curves = [], []
    for p in order:
        sub = outcomes[outcomes["point"] == p]
        if sub.empty:
            continue
        kinds = sub["outcome"].value_counts()
        km_runs = sub[sub["outcome"] != "diverged"]
        km = kaplan_meier(km_runs["time"], km_runs["outcome"] == "event", level=level)
        code = np.select([sub["outcome"] == "event", sub["outcome"] == "diverged"], [1, 2], 0)
        cif = cumulative_incidence(sub["time"], code)
        budget = float(sub["budget"].max())
        med, lo, hi = median_time(km, level)
        r, r_lo, r_hi = reached_by(km, budget) if not km.empty else (np.nan,) * 3
        all_by = cif.loc[cif["time"] <= budget, "cif_event"]
        rows.append((p, len(sub), int(kinds.get("event", 0)), int(kinds.get("budget", 0)),
                     int(kinds.get("early_stop", 0)), int(kinds.get("stopped", 0)),
                     int(kinds.get("diverged", 0)), budget, _nan(med), _nan(lo), _nan(hi), r,
                     r_lo, r_hi, float(all_by.iloc[-1]) if not all_by.empty else 0.0,
                     iv.seed_warning(len(sub))))  # fmt: skip
        if not km.empty:
            km = km.assign(point=p, reached=1.0 - km["survival"])
            km["reached_all"] = [
                float(cif.loc[cif["time"] <= x, "cif_event"].iloc[-1]) for x in km["time"]
            ]
            curves.append(km[list(CURVE_COLUMNS)])
    summary = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
    curve = (
        pd.concat(curves, ignore_index=True)
        if curves
        else pd.DataFrame(columns=list(CURVE_COLUMNS))
    )
    return summary, curve


def _nan(v: float | None) -> float:
    return float("nan") if v is None else float(v)
