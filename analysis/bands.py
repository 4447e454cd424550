"""What the report draws around means: bootstrap bands of curves and per-split intervals.

Pure functions on long DataFrames. Bootstrap intervals come from
:func:`scipy.stats.bootstrap` (percentile, vectorised over the steps of a curve), so a
band of a mean never leaves ``[min, max]`` of the runs it is drawn over.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from scipy import stats as sps

from analysis import intervals as iv

BANDS = ("ci", "minmax")
"""``ci``: 95% bootstrap band of the mean; ``minmax``: the range over seeds."""


def curve_bands(
    per_seed: pd.DataFrame,
    *,
    band: str = "ci",
    level: float = 0.95,
    n_boot: int = 1000,
    seed: int = 0,
    unit: str = "step",
) -> tuple[pd.DataFrame, list[str]]:
    """Mean and band of each (point, split) curve over a *fixed* set of seeds.

    ``per_seed``: one row per (trial_id, point, seed, split, step) with ``value``. Per
    (point, split) the seeds are those that logged the curve; a step is drawn only when
    every one of them logged it, so the mean never silently changes which seeds it
    averages. When seeds stopped early (their curve ends before the longest one), the
    curve ends at the last step all seeds share and a note says so. Returns (rows with
    columns point, split, step, mean, low, high, count; notes). ``band``: ``ci`` (95%
    percentile bootstrap of the mean across seeds, scipy) or ``minmax``. ``unit`` names
    what the ``step`` column counts in the notes (``step`` or ``epoch``).
    """
    rows: list[pd.DataFrame] = []
    notes: list[str] = []
    cols = ["point", "split", "step", "mean", "low", "high", "count"]
    for g, ((point, split), sub) in enumerate(per_seed.groupby(["point", "split"], sort=True)):
        wide = sub.pivot_table(
            index="step", columns=["trial_id", "seed"], values="value", aggfunc="first"
        )
        full = wide.dropna(axis=0, how="any")  # steps every seed logged
        n_seeds = wide.shape[1]
        if len(full) < len(wide):
            last = wide.apply(lambda c: c.last_valid_index())
            early = int((last < wide.index.max()).sum())
            if early:
                notes.append(
                    f"{point} {split}: {early} of {n_seeds} seeds stopped before {unit} "
                    f"{int(wide.index.max())}; the mean and band end at {unit} "
                    f"{int(full.index.max()) if len(full) else '?'}, the last {unit} all seeds logged"
                )
        if full.empty:
            continue
        m = full.to_numpy(dtype=float)  # (steps, seeds)
        mean = m.mean(axis=1)
        if band == "minmax":
            low, high = m.min(axis=1), m.max(axis=1)
        elif n_seeds < 2:
            low = high = np.full(mean.shape, np.nan)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = sps.bootstrap(
                    (m,),
                    np.mean,
                    axis=-1,
                    n_resamples=n_boot,
                    confidence_level=level,
                    method="percentile",
                    rng=np.random.default_rng(seed + g),
                )
            low = np.where(np.ptp(m, axis=1) == 0, mean, res.confidence_interval.low)
            high = np.where(np.ptp(m, axis=1) == 0, mean, res.confidence_interval.high)
        rows.append(
            pd.DataFrame(
                {"point": point, "split": split, "step": full.index.to_numpy(), "mean": mean,
                 "low": low, "high": high, "count": n_seeds}
            )
        )  # fmt: skip
    df = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=cols)
    return df[cols], notes


def split_intervals(
    values: pd.DataFrame, *, level: float = 0.95, n_boot: int = 2000, seed: int = 0
) -> pd.DataFrame:
    """Per (point, split): mean of ``value`` with its bootstrap interval (BCa, scipy).

    ``values``: one row per run (columns point, split, value). Returns columns point,
    split, n, mean, low, high, method, warn (``n<10`` for fewer than 10 runs).
    """
    rows = []
    for (point, split), sub in values.groupby(["point", "split"], sort=True):
        ci = iv.mean_interval(sub["value"], level=level, n_boot=n_boot, seed=seed)
        rows.append((point, split, ci.n, ci.estimate, ci.low, ci.high, ci.method,
                     iv.seed_warning(ci.n)))  # fmt: skip
    return pd.DataFrame(
        rows, columns=["point", "split", "n", "mean", "low", "high", "method", "warn"]
    )


def performance_profile(values: pd.DataFrame, *, higher_is_better: bool = True) -> pd.DataFrame:
    """Run-score distributions per config (rliable's performance profile).

    ``values``: one row per run (columns point, value). For every observed score tau:
    the fraction of each config's runs scoring above tau (below, for a loss). Returns
    columns point, tau, fraction (a step function per config, from 1 down to 0).
    """
    taus = np.unique(values["value"].dropna().to_numpy(dtype=float))
    rows = []
    for point, sub in values.groupby("point", sort=True):
        v = sub["value"].dropna().to_numpy(dtype=float)
        if not v.size:
            continue
        better = v[None, :] > taus[:, None] if higher_is_better else v[None, :] < taus[:, None]
        frac = better.mean(axis=1)
        # every run beats a threshold just past the worst score: 1 before the lowest tau
        # (higher is better), after the highest (lower is better), where the curve starts
        if higher_is_better:
            tau, fraction = np.r_[taus.min(), taus], np.r_[1.0, frac]
        else:
            tau, fraction = np.r_[taus, taus.max()], np.r_[frac, 1.0]
        rows.append(pd.DataFrame({"point": point, "tau": tau, "fraction": fraction}))
    if not rows:
        return pd.DataFrame(columns=["point", "tau", "fraction"])
    return pd.concat(rows, ignore_index=True)
