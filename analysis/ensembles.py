"""Simplicity bias and ensembles of seeds (Shah et al. 2020), as declared aggregates.

Two kinds for :data:`analysis.aggregates.KINDS` (declared by a task's ``analysis()``):

* ``extreme_sb``: ``{"metric", "standard", "s_randomized", "sc_randomized", "s_max"?,
  "sc_tolerance"?}`` - per grid point, each run's ``metric`` (an AUC) on the standard test
  set and on the test sets with the simple feature S or the complex ones S^c randomized
  (mean, min, max over the ok runs), and the fraction of runs with **extreme simplicity
  bias**: a run relies on S alone and ignores S^c, i.e. randomizing S^c costs it at most
  ``sc_tolerance`` (``AUC(S^c-rand) >= AUC(std) - sc_tolerance``) while randomizing S
  leaves it near chance (``AUC(S-rand) <= s_max``); with a Wilson 95% interval
  (:func:`extreme_sb`);
* ``ensemble_auc``: ``{"splits", "sizes"?, "positive"?}`` - per grid point and split, the
  AUC of the ensemble of every ok seed: each example's score is the mean over the seeds of
  the score stored as its ``prediction`` text (Shah et al.'s ``EnsembleAverage`` averages
  logits, so the mean logit margin is the ensemble's margin), ranked against ``target``
  (``positive``: the target text of the positive class, default ``"1"``). For each size
  ``k`` in ``sizes``, the ensembles of disjoint groups of ``k`` seeds in seed order (the
  paper's ensembles have 3 members): their AUCs' count, mean, min and max
  (:func:`ensemble_aucs`). Read from the ``predictions`` table, so it depends on which
  runs committed, never on how seeds were bundled.

The statistics are pure functions on DataFrames whose docstrings give the table shapes.
Only runs with status ``ok`` enter, as everywhere in the analysis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from scipy import stats as sps

from analysis import intervals as iv
from analysis.aggregates import Aggregate, AggregateResult, _fail, _ok, register
from analysis.context import StudyContext
from analysis.manifest import Axis

# ---------------------------------------------------------------------------- pure functions


def auc(scores: Any, labels: Any) -> float:
    """Mann-Whitney AUC of ``scores`` (n,) for boolean ``labels`` (n,) (True = positive):
    the probability that a random positive outscores a random negative, ties 1/2. NaN
    without both classes; non-finite scores rank as the extremes they are (NaN dropped)."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    keep = ~np.isnan(s)
    s, y = s[keep], y[keep]
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = sps.rankdata(s)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


EXTREME_COLUMNS = ("point", "runs", "extreme", "fraction", "low", "high", "std_mean", "std_min",
                   "std_max", "s_rand_mean", "s_rand_min", "s_rand_max", "sc_rand_mean",
                   "sc_rand_min", "sc_rand_max")  # fmt: skip


def extreme_sb(runs: pd.DataFrame, s_max: float, sc_tolerance: float) -> pd.DataFrame:
    """Per grid point, the three AUCs over runs and the fraction of runs with extreme SB.

    ``runs``: one row per run, columns point, trial_id, seed, std, s_rand, sc_rand (the
    metric on the standard, S-randomized and S^c-randomized test sets; a run missing one is
    left out). A run is extreme when ``s_rand <= s_max`` and ``sc_rand >= std - sc_tolerance``.
    Returns :data:`EXTREME_COLUMNS`, one row per point in order of first appearance:
    runs, extreme (count), fraction with its Wilson 95% interval (low, high), and mean,
    min, max of each AUC.
    """
    r = runs.dropna(subset=["std", "s_rand", "sc_rand"])
    rows = []
    for point, sub in r.groupby("point", sort=False):
        flags = (sub["s_rand"] <= s_max) & (sub["sc_rand"] >= sub["std"] - sc_tolerance)
        ci = iv.proportion_interval(int(flags.sum()), len(sub))
        cells: list[Any] = [point, len(sub), int(flags.sum()), ci.estimate, ci.low, ci.high]
        for col in ("std", "s_rand", "sc_rand"):
            cells += [float(sub[col].mean()), float(sub[col].min()), float(sub[col].max())]
        rows.append(cells)
    return pd.DataFrame(rows, columns=list(EXTREME_COLUMNS))


def is_extreme(runs: pd.DataFrame, s_max: float, sc_tolerance: float) -> pd.Series:
    """The per-run flag of :func:`extreme_sb` (False where a value is missing)."""
    return (runs["s_rand"] <= s_max) & (runs["sc_rand"] >= runs["std"] - sc_tolerance)


def ensemble_aucs(preds: pd.DataFrame, sizes: Sequence[int] = ()) -> pd.DataFrame:
    """Per (point, split): the AUC of the ensemble of every seed, and of disjoint groups.

    ``preds``: one row per (run, split, example), columns point, trial_id, seed, split,
    example_id, positive (bool), score (float; NaN rows dropped). An ensemble's score of an
    example is the mean of its members' scores over the members that scored it. Seeds are
    taken in ascending order (trial_id breaks ties); for each ``k`` in ``sizes`` the groups
    are seeds ``[0..k-1], [k..2k-1], ...`` of that order (a last incomplete group is left
    out). Returns one row per (point, split) in order of first appearance: point, split,
    seeds, ensemble_auc (all seeds), member_mean, member_min, member_max (each seed's own
    AUC), and per k: ens{k}_n, ens{k}_mean, ens{k}_min, ens{k}_max.
    """
    p = preds.dropna(subset=["score"])
    rows = []
    for (point, split), sub in p.groupby(["point", "split"], sort=False):
        runs = sub[["trial_id", "seed"]].drop_duplicates().sort_values(["seed", "trial_id"])
        keys = list(zip(runs["trial_id"], runs["seed"], strict=True))
        score = sub.pivot_table(index="example_id", columns=["trial_id", "seed"], values="score",
                                aggfunc="mean")  # fmt: skip
        positive = sub.groupby("example_id")["positive"].first().reindex(score.index)
        members = [auc(score[key], positive) for key in keys]
        row: dict[str, Any] = {
            "point": point, "split": split, "seeds": len(keys),
            "ensemble_auc": auc(score[keys].mean(axis=1), positive),
            "member_mean": float(np.nanmean(members)), "member_min": float(np.nanmin(members)),
            "member_max": float(np.nanmax(members)),
        }  # fmt: skip
        for k in sizes:
            groups = [keys[i : i + k] for i in range(0, len(keys) - k + 1, k)]
            vals = [auc(score[g].mean(axis=1), positive) for g in groups]
            d = {"n": len(vals), "mean": np.nan, "min": np.nan, "max": np.nan}
            if vals:
                d.update(
                    mean=float(np.mean(vals)), min=float(np.min(vals)), max=float(np.max(vals))
                )
            row.update({f"ens{k}_{stat}": v for stat, v in d.items()})
        rows.append(row)
    return pd.DataFrame(rows)


def prediction_scores(ctx: StudyContext, splits: Sequence[str], positive: str) -> pd.DataFrame:
    """The ok runs' predictions on ``splits`` as :func:`ensemble_aucs` takes them: the
    ``prediction`` text parsed as a number (text that is none becomes NaN)."""
    marks = ", ".join("?" for _ in splits)
    df = ctx.con.execute(
        "SELECT e.trial_id, e.seed, e.split, e.example_id, e.target, e.prediction "
        "FROM predictions e JOIN runs r USING (study, trial_id, seed) "
        f"WHERE e.study = ? AND e.split IN ({marks}) AND coalesce(r.status, 'ok') = 'ok'",
        [ctx.name, *splits],
    ).df()
    points = ctx.evals.drop_duplicates("trial_id").set_index("trial_id")["point"]
    return pd.DataFrame({
        "point": df["trial_id"].map(points).fillna(df["trial_id"]),
        "trial_id": df["trial_id"], "seed": df["seed"].astype(int), "split": df["split"],
        "example_id": df["example_id"], "positive": df["target"].astype(str).str.strip() == positive,
        "score": pd.to_numeric(df["prediction"], errors="coerce"),
    })  # fmt: skip


# ---------------------------------------------------------------------------- the kinds


def _number(raw: dict[str, Any], key: str, default: float, where: str) -> float:
    v = raw.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or not np.isfinite(v):
        raise _fail(f"{where}.{key}", f"{v!r} is not a number")
    return float(v)


@register
@dataclass(frozen=True)
class ExtremeSB(Aggregate):
    """AUCs on the standard and randomized test sets and the fraction with extreme SB."""

    kind: ClassVar[str] = "extreme_sb"
    metric: str
    """The per-run metric compared (an AUC)."""
    standard: str
    """The standard test split."""
    s_randomized: str
    """The test split with the simple feature S randomized."""
    sc_randomized: str
    """The test split with every complex feature S^c randomized."""
    s_max: float = 0.55
    """A run is extreme only if its S-randomized value is at most this (near chance)."""
    sc_tolerance: float = 0.02
    """... and its S^c-randomized value is within this of its standard one."""

    @classmethod
    def parse(cls, raw: dict[str, Any], where: str) -> ExtremeSB:
        keys = ("metric", "standard", "s_randomized", "sc_randomized")
        if not all(isinstance(raw.get(k), str) for k in keys):
            raise _fail(where, f"extreme_sb needs text values for {', '.join(keys)}, got {raw!r}")
        return cls(
            str(raw["metric"]), str(raw["standard"]), str(raw["s_randomized"]),
            str(raw["sc_randomized"]), _number(raw, "s_max", 0.55, where),
            _number(raw, "sc_tolerance", 0.02, where),
        )  # fmt: skip

    def axes(self) -> dict[str, Axis]:
        return {"std": Axis(self.standard, self.metric), "s_rand": Axis(self.s_randomized, self.metric),
                "sc_rand": Axis(self.sc_randomized, self.metric)}  # fmt: skip

    def needs(self) -> list[tuple[Axis, str]]:
        return [(a, "evals") for a in self.axes().values()]

    def declaration(self) -> dict[str, Any]:
        return {"kind": self.kind, "metric": self.metric, "standard": self.standard,
                "s_randomized": self.s_randomized, "sc_randomized": self.sc_randomized,
                "s_max": self.s_max, "sc_tolerance": self.sc_tolerance}  # fmt: skip

    def compute(self, ctx: StudyContext, baselines: pd.DataFrame) -> AggregateResult:
        ok = _ok(ctx)
        ok = ok[ok["metric"] == self.metric]
        runs = ok[["point", "trial_id", "seed"]].drop_duplicates().set_index(["trial_id", "seed"])
        for col, a in self.axes().items():
            v = ok[ok["split"] == a.split].set_index(["trial_id", "seed"])["value"]
            runs[col] = v.groupby(level=[0, 1]).first()
        runs = runs.reset_index()
        runs["extreme"] = is_extreme(runs, self.s_max, self.sc_tolerance)
        table = extreme_sb(runs, self.s_max, self.sc_tolerance)
        table["warn"] = [iv.seed_warning(int(n)) for n in table["runs"]]
        title = (f"{self.metric} on {self.standard} / {self.s_randomized} (S randomized) / "
                 f"{self.sc_randomized} (S^c randomized) over ok runs, and the runs with extreme "
                 f"simplicity bias ({self.s_randomized} <= {self.s_max:g} and {self.sc_randomized} "
                 f">= {self.standard} - {self.sc_tolerance:g}); low/high: Wilson 95%")  # fmt: skip
        return AggregateResult(self, title, table, runs)


@register
@dataclass(frozen=True)
class EnsembleAUC(Aggregate):
    """The AUC of ensembles of seeds, from the stored per-example scores."""

    kind: ClassVar[str] = "ensemble_auc"
    splits: tuple[str, ...]
    """The test splits whose predictions hold a score per example."""
    sizes: tuple[int, ...] = ()
    """Besides every seed: ensembles of disjoint groups of this many seeds."""
    positive: str = "1"
    """The ``target`` text of the positive class."""

    @classmethod
    def parse(cls, raw: dict[str, Any], where: str) -> EnsembleAUC:
        splits, sizes = raw.get("splits"), raw.get("sizes", [])
        if (
            not isinstance(splits, list | tuple)
            or not splits
            or not all(isinstance(s, str) for s in splits)
        ):
            raise _fail(
                f"{where}.splits", f"expected a non-empty list of split names, got {splits!r}"
            )
        if not isinstance(sizes, list | tuple) or not all(
            isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in sizes
        ):
            raise _fail(f"{where}.sizes", f"expected a list of integers >= 1, got {sizes!r}")
        return cls(tuple(splits), tuple(int(k) for k in sizes), str(raw.get("positive", "1")))

    def needs(self) -> list[tuple[Axis, str]]:
        return []  # predictions, checked in compute

    def declaration(self) -> dict[str, Any]:
        return {"kind": self.kind, "splits": list(self.splits), "sizes": list(self.sizes),
                "positive": self.positive}  # fmt: skip

    def compute(self, ctx: StudyContext, baselines: pd.DataFrame) -> AggregateResult:
        preds = prediction_scores(ctx, self.splits, self.positive)
        bad = int(preds["score"].isna().sum())
        if bad:
            ctx.notes.append(f"ensemble_auc: {bad} predictions whose text is not a number left out")
        table = ensemble_aucs(preds, self.sizes)
        if not table.empty:
            rank = {s: i for i, s in enumerate(self.splits)}
            table = table.sort_values(["point", "split"], key=lambda c: c.map(rank) if c.name == "split"
                                      else c, kind="stable").reset_index(drop=True)  # fmt: skip
            table["warn"] = [iv.seed_warning(int(n)) for n in table["seeds"]]
        groups = ", ".join(f"disjoint groups of {k}" for k in self.sizes)
        title = ("AUC of the ensemble of every ok seed (mean score per example over seeds) beside "
                 f"each seed's own AUC{'; and of ' + groups if groups else ''}")  # fmt: skip
        return AggregateResult(self, title, table)
