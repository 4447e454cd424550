"""Decision surfaces of 2-D tasks: per-seed predictions on a grid split and their contour.

A task such as ``toy2d`` declares ``decision_boundary`` (see :mod:`analysis.manifest`):
its grid split holds the points of ``g = linspace(low, high, n)`` squared, example
``i1 * n + i2`` at ``(g[i1], g[i2])``, and each run's ``prediction`` there is a number
(e.g. ``P(Y1 = 1)`` as ``"0.734215"``). :func:`surface_cells` turns the ``predictions``
rows into coordinates, :func:`contour_segments` traces the 0.5 level of one surface
(marching squares with linear interpolation) and :func:`boundary_data` does both for a
whole study, one grid per grid point of the study.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.manifest import BoundaryDecl, Manifest

CELL_COLUMNS = ["trial_id", "point", "seed", "x1", "x2", "p", "half"]
SEGMENT_COLUMNS = ["trial_id", "point", "seed", "x1", "x2", "x1_end", "x2_end"]


def grid_axis(decl: BoundaryDecl) -> np.ndarray:
    """The ``n`` coordinates of either axis: ``linspace(low, high, n)``, shape (n,)."""
    return np.linspace(decl.low, decl.high, decl.n)


def surface_cells(preds: pd.DataFrame, decl: BoundaryDecl) -> tuple[pd.DataFrame, int]:
    """Grid coordinates of each prediction, and how many rows were dropped.

    ``preds``: columns trial_id, point, seed, example_id, prediction (text). Rows whose
    ``example_id`` is outside ``[0, n*n)`` or whose prediction is not a finite number are
    dropped. Returns (cells, dropped); cells has :data:`CELL_COLUMNS`: one row per kept
    prediction with ``x1 = g[id // n]``, ``x2 = g[id % n]``, ``p`` the number and
    ``half`` half the grid spacing (a cell spans ``x +- half``).
    """
    g = grid_axis(decl)  # (n,)
    ids = preds["example_id"].to_numpy(dtype=np.int64)  # (R,)
    p = pd.to_numeric(preds["prediction"], errors="coerce").to_numpy(dtype=np.float64)  # (R,)
    keep = (ids >= 0) & (ids < decl.n * decl.n) & np.isfinite(p)
    ids = ids[keep]
    cells = pd.DataFrame(
        {
            "trial_id": preds["trial_id"].to_numpy()[keep],
            "point": preds["point"].to_numpy()[keep],
            "seed": preds["seed"].to_numpy(dtype=np.int64)[keep],
            "x1": g[ids // decl.n],
            "x2": g[ids % decl.n],
            "p": p[keep],
            "half": (decl.high - decl.low) / (decl.n - 1) / 2,
        }
    )
    return cells, int((~keep).sum())


def contour_segments(values: np.ndarray, axis: np.ndarray, level: float = 0.5) -> np.ndarray:
    """Line segments of the ``level`` contour of a surface on a square grid.

    ``values``: (n, n), ``values[i1, i2]`` at ``(axis[i1], axis[i2])``; NaN marks a missing
    point (cells touching it get no segment). Returns (M, 4) rows ``x1, x2, x1_end,
    x2_end``. Marching squares: each cell whose corners lie on both sides of ``level``
    (a corner equal to ``level`` counts as above) gets one segment between the crossing
    points on its edges, interpolated linearly; a saddle cell gets two, paired by the
    mean of its corners.
    """
    v = np.asarray(values, dtype=np.float64)
    n = len(axis)
    if v.shape != (n, n) or n < 2:
        raise ValueError(f"values must be ({n}, {n}) for an axis of {n} points, got {v.shape}")
    a, b, c, d = v[:-1, :-1], v[1:, :-1], v[1:, 1:], v[:-1, 1:]  # (n-1, n-1) corners
    lo, hi = axis[:-1][:, None], axis[1:][:, None]  # (n-1, 1) cell extent along x1
    lo2, hi2 = axis[:-1][None, :], axis[1:][None, :]  # (1, n-1) along x2
    shape = a.shape
    valid = np.isfinite(a) & np.isfinite(b) & np.isfinite(c) & np.isfinite(d)

    def crossing(
        v0: np.ndarray, v1: np.ndarray, p0: tuple[np.ndarray, ...], p1: tuple[np.ndarray, ...]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where the edge p0 -> p1 crosses ``level``: mask, x1, x2 (each (n-1, n-1))."""
        hit = valid & ((v0 >= level) != (v1 >= level))
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(hit, (level - v0) / (v1 - v0), 0.0)
        x1 = np.broadcast_to(p0[0] + t * (p1[0] - p0[0]), shape)
        x2 = np.broadcast_to(p0[1] + t * (p1[1] - p0[1]), shape)
        return hit, x1, x2

    # edges in order around the cell: bottom (a-b), right (b-c), top (d-c), left (a-d)
    edges = [
        crossing(a, b, (lo, lo2), (hi, lo2)),
        crossing(b, c, (hi, lo2), (hi, hi2)),
        crossing(d, c, (lo, hi2), (hi, hi2)),
        crossing(a, d, (lo, lo2), (lo, hi2)),
    ]
    hit = np.stack([e[0] for e in edges], axis=-1)  # (n-1, n-1, 4)
    pts = np.stack([np.stack([e[1], e[2]], axis=-1) for e in edges], axis=-2)  # (n-1, n-1, 4, 2)
    count = hit.sum(axis=-1)  # (n-1, n-1)
    segments = []
    two = count == 2
    if two.any():
        first = np.argsort(~hit[two], axis=-1, kind="stable")[:, :2]  # (K, 2) edge indices
        p = pts[two]  # (K, 4, 2)
        rows = np.arange(len(p))
        segments.append(np.concatenate([p[rows, first[:, 0]], p[rows, first[:, 1]]], axis=1))
    for i, j in zip(*np.nonzero(count == 4), strict=True):
        centre_above = (a[i, j] + b[i, j] + c[i, j] + d[i, j]) / 4 >= level
        # the contour cuts off the two corners that differ from the centre
        pairs = ((0, 1), (2, 3)) if centre_above == (a[i, j] >= level) else ((0, 3), (1, 2))
        for e0, e1 in pairs:
            segments.append(np.concatenate([pts[i, j, e0], pts[i, j, e1]])[None, :])
    return np.concatenate(segments) if segments else np.empty((0, 4))


def surface(run: pd.DataFrame, decl: BoundaryDecl) -> np.ndarray:
    """One run's predictions as an (n, n) array ``[i1, i2]``; NaN where none is usable.

    ``run``: columns example_id, prediction of a single run (see :func:`surface_cells`).
    """
    ids = run["example_id"].to_numpy(dtype=np.int64)  # (R,)
    p = pd.to_numeric(run["prediction"], errors="coerce").to_numpy(dtype=np.float64)  # (R,)
    keep = (ids >= 0) & (ids < decl.n * decl.n)
    out = np.full(decl.n * decl.n, np.nan)
    out[ids[keep]] = p[keep]
    return out.reshape(decl.n, decl.n)


def _contours(preds: pd.DataFrame, decl: BoundaryDecl, level: float) -> pd.DataFrame:
    """:data:`SEGMENT_COLUMNS` rows of the ``level`` contour of every run in ``preds``."""
    g = grid_axis(decl)
    out = []
    for (trial, point, seed), run in preds.groupby(["trial_id", "point", "seed"], sort=False):
        seg = contour_segments(surface(run, decl), g, level)  # (M, 4)
        frame = pd.DataFrame(seg, columns=SEGMENT_COLUMNS[3:])
        out.append(frame.assign(trial_id=trial, point=point, seed=seed))
    if not out:
        return pd.DataFrame(columns=SEGMENT_COLUMNS)
    return pd.concat(out, ignore_index=True)[SEGMENT_COLUMNS]


@dataclass
class BoundaryData:
    """A study's decision surfaces, ready for :func:`analysis.charts.decision_boundary`."""

    cells: pd.DataFrame
    """:data:`CELL_COLUMNS`, one row per (run, grid point)."""
    segments: pd.DataFrame
    """:data:`SEGMENT_COLUMNS`, one row per contour segment of a run."""
    extent: tuple[float, float]
    """Smallest and largest coordinate over every point's grid, cells' edges included."""
    notes: list[str] = field(default_factory=list)


def point_grids(manifest: Manifest | None, decl: BoundaryDecl) -> dict[str, BoundaryDecl]:
    """trial_id -> its grid where the study's grid point sets ``task.grid``."""
    grids: dict[str, BoundaryDecl] = {}
    for p in manifest.points if manifest else ():
        values = p.get("point") or {}
        if isinstance(values, dict) and "task.grid" in values and "trial_id" in p:
            grids[str(p["trial_id"])] = decl.with_grid(values["task.grid"])
    return grids


def boundary_data(
    preds: pd.DataFrame,
    decl: BoundaryDecl,
    grids: Mapping[str, BoundaryDecl] | None = None,
    *,
    max_seeds: int = 12,
    level: float = 0.5,
) -> BoundaryData:
    """Cells and ``level`` contours of each run's surface, at most ``max_seeds`` per point.

    ``preds``: :func:`analysis.queries.split_predictions` rows (columns trial_id, point,
    seed, example_id, prediction). ``grids``: trial_id -> grid for trials whose grid
    differs from ``decl``'s. The lowest seed indices are kept; what was left out or
    dropped is said in ``notes``.
    """
    grids = grids or {}
    notes: list[str] = []
    seeds = preds[["point", "seed"]].drop_duplicates()
    kept = seeds.groupby("point", sort=False)["seed"].apply(lambda s: set(sorted(s)[:max_seeds]))
    shown = [s in kept[p] for p, s in zip(preds["point"], preds["seed"], strict=True)]
    if not all(shown):
        notes.append(
            f"decision boundary: {len(seeds) - sum(len(v) for v in kept)} runs left out "
            f"(the first {max_seeds} seeds of each grid point are drawn)"
        )
    preds = preds[np.asarray(shown, dtype=bool)]
    cells, segments, dropped = [], [], 0
    lows, highs = [], []
    for trial, rows in preds.groupby("trial_id", sort=False):
        d = grids.get(str(trial), decl)
        c, n_bad = surface_cells(rows, d)
        dropped += n_bad
        cells.append(c)
        segments.append(_contours(rows, d, level))
        half = (d.high - d.low) / (d.n - 1) / 2
        lows.append(d.low - half)
        highs.append(d.high + half)
    if dropped:
        notes.append(
            f"decision boundary: {dropped} predictions on split {decl.split!r} dropped "
            f"(not a number, or an example_id outside the {decl.n}x{decl.n} grid)"
        )
    return BoundaryData(
        cells=pd.concat(cells, ignore_index=True) if cells else pd.DataFrame(columns=CELL_COLUMNS),
        segments=pd.concat(segments, ignore_index=True)
        if segments
        else pd.DataFrame(columns=SEGMENT_COLUMNS),
        extent=(min(lows, default=decl.low), max(highs, default=decl.high)),
        notes=notes,
    )
