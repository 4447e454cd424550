"""Study manifests (``OUT/<NAME>/study.json``) and the task's analysis declarations.

The study writes a manifest beside its tables; what a task wants analysed or drawn lives
there as data (``analysis``), so this package never imports the task. Every optional key
may be missing: loading tolerates absent and unknown keys and keeps the raw dict.

Declarations understood (all optional, under ``manifest["analysis"]``):

* ``scatter``: ``[[split_a, metric], [split_b, metric]]`` - the seed scatter's axes;
* ``regressions``: ``[{"x": {"split", "metric", "transform"?}, "y": {"split", "metric",
  "transform"?}, "over": "runs" | "checkpoints"}]``;
* ``histograms``: ``[{"split", "metric"}]``;
* ``charts``: ``[{"type": "histogram" | "scatter" | "regression", ...}]`` - the same
  declarations in the list form of ``Task.analysis()``; ``curve`` charts name extra curve metrics
  (the primary metric and the loss are always drawn);
* ``test_splits``: the splits whose seed-by-seed correlations to report (default: every
  split with role ``test``);
* ``metric_definitions``: ``{metric: "what it measures"}`` - drawn under every chart of
  that metric and in the report's verdict;
* ``primary_metric``: the metric of the distribution chart and summaries (default
  ``accuracy`` when present);
* ``metrics``: ``{metric: {"better": "higher" | "lower", "low": x | null, "high": x | null}}``
  - how each metric reads, written by the study from the task's declaration
  (``trainables.metrics``): which config is better and the range intervals stay in
  (:meth:`Declarations.sense`);
* ``verdict``: ``{"metric"?: str, "splits"?: [spec]}`` - what the verdict speaks about,
  headline split first (default: the primary metric on the test splits); a spec is a split
  or a pooled split ``NAME=A+B+...``, the per-run mean over those splits
  (:mod:`analysis.verdict_axis`);
* ``aggregates``: ``[{"kind": "best_k" | "checkpoint_regression" | "baseline", ...}]`` - a
  paper's own summaries, kept raw here and parsed by :mod:`analysis.aggregates`;
* ``events``: ``["val accuracy >= 0.5" | {"name"?, "split", "metric", "op", "threshold"}]`` -
  times to an event read from the ``metrics`` curves (:mod:`analysis.survival`);
* ``decision_boundary``: ``{"grid": [low, high, n], "split"?: "grid", "metric"?: "p_y1",
  "axes"?: ["x1", "x2"], "id"?: "i1 * n + i2"}`` - a 2-D decision surface per seed. The
  ``split``'s rows in the ``predictions`` table are the points of the regular grid
  ``g = linspace(low, high, n)`` over ``[low, high]^2``: ``example_id = i1 * n + i2`` is
  the point ``(axes[0], axes[1]) = (g[i1], g[i2])`` and ``prediction`` is the value drawn
  (a probability as a decimal string, e.g. ``"0.734215"``). A grid point of the study
  that overrides ``task.grid`` gets its own grid. The report draws one heatmap per seed
  with the 0.5 contour (see :func:`analysis.charts.decision_boundary`). Also accepted in
  ``charts`` as ``{"type": "decision_boundary", ...}``.

Unknown keys are kept in :attr:`Declarations.unknown` and named in the report.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.errors import AnalysisError

MANIFEST = "study.json"


@dataclass(frozen=True)
class Axis:
    """One side of a declared chart: a split's metric, optionally transformed."""

    split: str
    metric: str
    transform: str | None = None


@dataclass(frozen=True)
class RegressionDecl:
    """Regress ``y`` on ``x`` across runs (final evals) or checkpoints (metrics snapshots)."""

    x: Axis
    y: Axis
    over: str = "runs"


@dataclass(frozen=True)
class BoundaryDecl:
    """A decision surface over a regular 2-D grid (see the module docstring)."""

    low: float
    high: float
    n: int
    """Points per axis: the split has ``n * n`` examples."""
    split: str = "grid"
    metric: str = "p_y1"
    """What ``prediction`` holds (the colour's title)."""
    axes: tuple[str, str] = ("x1", "x2")
    """Names of the two input coordinates (x axis, y axis)."""

    def with_grid(self, grid: Any) -> BoundaryDecl:
        """This declaration with another ``[low, high, n]`` (raises AnalysisError if bad)."""
        low, high, n = _grid(grid, "decision_boundary.grid")
        return BoundaryDecl(low, high, n, self.split, self.metric, self.axes)


LOWER_IS_BETTER: tuple[str, ...] = ("loss", "nll", "error", "perplexity", "ppl", "mse", "mae", "rmse", "distance",
                                     "regret", "cost")
"""Metric names (or name parts) taken as lower-is-better in a study whose manifest declares
no ``metrics`` (one written before the declarations existed)."""


@dataclass(frozen=True)
class MetricSense:
    """How a metric reads: which way is better and, where declared, its range."""

    higher_is_better: bool = True
    low: float | None = None
    """The least value it can take (None: unbounded, or not declared)."""
    high: float | None = None
    """The greatest value it can take (None: unbounded, or not declared)."""
    declared: bool = False
    """Whether the task declared it; else guessed from the name (:data:`LOWER_IS_BETTER`)."""

    @property
    def span(self) -> float | None:
        """``high - low`` when both ends are known: a difference of two means lies in +-span."""
        return None if self.low is None or self.high is None else self.high - self.low

    @property
    def unit(self) -> bool:
        """A metric within [0, 1] (a share, a probability)."""
        return (self.low, self.high) == (0.0, 1.0)


def guessed_sense(metric: str) -> MetricSense:
    """A metric no declaration names: lower is better for loss-like names, range unknown."""
    m = metric.lower()
    return MetricSense(higher_is_better=not any(part in m for part in LOWER_IS_BETTER))


def _senses(value: Any, unknown: list[str]) -> dict[str, MetricSense]:
    out = {}
    for name, d in value.items() if isinstance(value, dict) else ():
        try:
            low, high = (None if d.get(k) is None else float(d[k]) for k in ("low", "high"))
            if d.get("better") not in ("higher", "lower"):
                raise ValueError(d.get("better"))
        except (AttributeError, TypeError, ValueError):
            unknown.append(f"metrics.{name} (not {{better, low, high}})")
            continue
        out[str(name)] = MetricSense(d["better"] == "higher", low, high, declared=True)
    return out


@dataclass(frozen=True)
class Declarations:
    """What the task declared for analysis, normalised."""

    scatter: tuple[Axis, Axis] | None = None
    regressions: tuple[RegressionDecl, ...] = ()
    histograms: tuple[Axis, ...] = ()
    test_splits: tuple[str, ...] = ()
    primary_metric: str | None = None
    verdict_metric: str | None = None
    """The verdict's metric, when the task names one (default: the primary metric)."""
    verdict_splits: tuple[str, ...] = ()
    """The verdict's split specs, headline first (:func:`analysis.verdict_axis.parse_split`)."""
    decision_boundary: BoundaryDecl | None = None
    curve_metrics: tuple[str, ...] = ()
    metric_definitions: dict[str, str] = field(default_factory=dict)
    """metric name -> what it measures, as the task declares it (shown where it is drawn)."""
    aggregates: tuple[Any, ...] = ()
    """The raw ``aggregates`` entries (parsed by :func:`analysis.aggregates.parse_aggregates`)."""
    events: tuple[Any, ...] = ()
    """The raw ``events`` entries (parsed by :func:`analysis.survival.event_from_declaration`)."""
    metrics: dict[str, MetricSense] = field(default_factory=dict)
    """metric name -> how it reads, as the task declared it (see :meth:`sense`)."""
    unknown: tuple[str, ...] = ()

    def sense(self, metric: str) -> MetricSense:
        """How ``metric`` reads: the task's declaration, else guessed from its name."""
        return self.metrics.get(metric) or guessed_sense(metric)


@dataclass(frozen=True)
class Manifest:
    """A study's manifest, tolerant of missing optional keys (``raw`` keeps everything)."""

    name: str
    kind: str = "seeds"
    task: str | None = None
    model: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    config_hash: str | None = None
    created_at: str | None = None
    git_sha: str | None = None
    version: str | None = None
    seeds: int | None = None
    splits: tuple[tuple[str, str], ...] = ()
    """(name, role) per split, in the task's order."""
    points: tuple[dict[str, Any], ...] = ()
    declarations: Declarations = field(default_factory=Declarations)
    tuned_from: Any = None
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def planned(self) -> int | None:
        """Planned runs: sum over points of their seed counts (``None`` if unknown)."""
        if self.points:
            total = 0
            for p in self.points:
                n = p.get("seeds", self.seeds)
                if n is None:
                    return None
                total += int(n)
            return total
        return self.seeds

    def point_labels(self) -> dict[str, str]:
        """trial_id -> readable grid-point label, from the manifest's points."""
        return {
            str(p["trial_id"]): point_label(p.get("point") or {})
            for p in self.points
            if "trial_id" in p
        }


def point_label(point: dict[str, Any] | str | None) -> str:
    """``{"model.cell": "gru", "train.lr": 0.01}`` -> ``"cell=gru, lr=0.01"``; ``{}`` -> ``"default"``."""
    if isinstance(point, str):
        text = point
        try:
            point = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError:
            return text
    if not point or not isinstance(point, dict):
        return "default"

    def value(v: Any) -> str:
        return f"{v:.6g}" if isinstance(v, float) else str(v)

    return ", ".join(f"{str(k).rsplit('.', 1)[-1]}={value(v)}" for k, v in sorted(point.items()))


def manifest_path(out: Path, study: str) -> Path:
    return Path(out) / study / MANIFEST


def study_names(out: Path) -> list[str]:
    """Names of the studies with a manifest under ``out`` (sorted)."""
    out = Path(out)
    if not out.is_dir():
        return []
    return sorted(p.parent.name for p in out.glob(f"*/{MANIFEST}") if p.parent.name != "tables")


def damaged_fix(out: Path, study: str) -> str:
    """The fix for a damaged manifest, the same wherever it is read (``study run`` refuses a
    damaged manifest rather than rewriting it)."""
    return (
        f"restore {manifest_path(out, study)} from a backup, or move it away and re-create it "
        f"with `study run CONFIG --name {study} --out {out}` (committed runs are kept)"
    )


def read_json(path: Path) -> Any:
    """The JSON document in ``path``; a ``ValueError`` whose text says briefly why it does
    not read (unreadable, not UTF-8, not JSON)."""
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:  # not UTF-8 is a ValueError too
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0][:120]
        raise ValueError(why) from None


def load_manifest(out: Path, study: str) -> Manifest | None:
    """The manifest of ``study``, or ``None`` when the study has none (yet)."""
    path = manifest_path(out, study)
    if not path.is_file():
        return None
    try:
        raw = read_json(path)
    except ValueError as e:
        raise AnalysisError(f"cannot read the manifest {path} ({e}). Fix: {damaged_fix(out, study)}") from None
    if not isinstance(raw, dict):
        raise AnalysisError(f"the manifest {path} is not a JSON object. Fix: {damaged_fix(out, study)}")
    return parse_manifest(raw, default_name=study)


def _as_int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def parse_manifest(raw: dict[str, Any], default_name: str = "") -> Manifest:
    """A :class:`Manifest` from the parsed JSON; unknown keys are kept in ``raw``."""
    splits: list[tuple[str, str]] = []
    for s in raw.get("splits") or []:
        if isinstance(s, dict) and "name" in s:
            splits.append((str(s["name"]), str(s.get("role", "test"))))
        elif isinstance(s, list | tuple) and len(s) == 2:
            splits.append((str(s[0]), str(s[1])))
    points = tuple(p for p in raw.get("points") or [] if isinstance(p, dict))
    config = raw.get("config")
    return Manifest(
        name=str(raw.get("name") or default_name),
        kind=str(raw.get("kind") or "seeds"),
        task=raw.get("task"),
        model=raw.get("model"),
        config=config if isinstance(config, dict) else {},
        config_hash=raw.get("config_hash"),
        created_at=None if raw.get("created_at") is None else str(raw.get("created_at")),
        git_sha=raw.get("git_sha"),
        version=None if raw.get("version") is None else str(raw.get("version")),
        seeds=_as_int(raw.get("seeds")),
        splits=tuple(splits),
        points=points,
        declarations=parse_declarations(raw.get("analysis") or {}),
        tuned_from=raw.get("tuned_from"),
        raw=raw,
    )


def _axis(value: Any, where: str) -> Axis:
    if isinstance(value, dict) and "split" in value and "metric" in value:
        t = value.get("transform")
        return Axis(str(value["split"]), str(value["metric"]), None if t is None else str(t))
    if isinstance(value, list | tuple) and len(value) >= 2:
        return Axis(str(value[0]), str(value[1]), str(value[2]) if len(value) > 2 else None)
    raise AnalysisError(
        f"analysis declaration {where}: expected {{'split': ..., 'metric': ...}} or "
        f"[split, metric], got {value!r}. Fix the task's analysis() declaration"
    )


def _regression(value: Any, where: str) -> RegressionDecl:
    if not isinstance(value, dict) or "x" not in value or "y" not in value:
        raise AnalysisError(
            f"analysis declaration {where}: a regression needs 'x' and 'y', got {value!r}. "
            "Fix the task's analysis() declaration"
        )
    over = str(value.get("over", "runs"))
    if over not in ("runs", "checkpoints"):
        raise AnalysisError(
            f"analysis declaration {where}.over: {over!r} is not 'runs' or 'checkpoints'"
        )
    return RegressionDecl(_axis(value["x"], f"{where}.x"), _axis(value["y"], f"{where}.y"), over)


ID_LAYOUT = "i1*n+i2"
"""The one grid id layout understood (spaces ignored): row-major in (axes[0], axes[1])."""


def _grid(value: Any, where: str) -> tuple[float, float, int]:
    """``[low, high, n]`` checked: numbers, ``low < high``, integer ``n >= 2``."""
    try:
        low, high, n = value
        low, high = float(low), float(high)
        ok = float(n) == int(n) and low < high and int(n) >= 2
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise AnalysisError(
            f"analysis declaration {where}: expected [low, high, n] with low < high and an "
            f"integer n >= 2, got {value!r}. Fix the task's analysis() declaration"
        )
    return low, high, int(n)


def _boundary(value: Any, where: str, unknown: list[str]) -> BoundaryDecl | None:
    """A :class:`BoundaryDecl`; an id layout other than :data:`ID_LAYOUT` goes to ``unknown``."""
    if not isinstance(value, dict) or "grid" not in value:
        raise AnalysisError(
            f"analysis declaration {where}: expected {{'grid': [low, high, n], ...}}, got "
            f"{value!r}. Fix the task's analysis() declaration"
        )
    layout = str(value.get("id", ID_LAYOUT)).replace(" ", "")
    if layout != ID_LAYOUT:
        unknown.append(f"{where}.id ({value.get('id')}: only 'i1 * n + i2' is understood)")
        return None
    low, high, n = _grid(value["grid"], f"{where}.grid")
    axes = value.get("axes") or ("x1", "x2")
    if not (isinstance(axes, list | tuple) and len(axes) == 2):
        raise AnalysisError(
            f"analysis declaration {where}.axes: expected two names, got {axes!r}. Fix the "
            "task's analysis() declaration"
        )
    return BoundaryDecl(
        low,
        high,
        n,
        split=str(value.get("split", "grid")),
        metric=str(value.get("metric", "p_y1")),
        axes=(str(axes[0]), str(axes[1])),
    )


def parse_declarations(decl: dict[str, Any]) -> Declarations:
    """Normalise the manifest's ``analysis`` dict (see the module docstring)."""
    if not isinstance(decl, dict):
        return Declarations(unknown=("analysis (not an object)",))
    scatter: tuple[Axis, Axis] | None = None
    regressions: list[RegressionDecl] = []
    histograms: list[Axis] = []
    test_splits: tuple[str, ...] = ()
    boundary: BoundaryDecl | None = None
    curve_metrics: list[str] = []
    definitions: dict[str, str] = {}
    aggregates: tuple[Any, ...] = ()
    events: tuple[Any, ...] = ()
    verdict_metric: str | None = None
    verdict_splits: tuple[str, ...] = ()
    senses: dict[str, MetricSense] = {}
    unknown: list[str] = []
    for key, value in decl.items():
        if key == "scatter" and isinstance(value, list | tuple) and len(value) >= 2:
            scatter = (_axis(value[0], "scatter[0]"), _axis(value[1], "scatter[1]"))
        elif key == "regressions":
            regressions += [_regression(v, f"regressions[{i}]") for i, v in enumerate(value)]
        elif key == "histograms":
            histograms += [_axis(v, f"histograms[{i}]") for i, v in enumerate(value)]
        elif key == "charts":
            for i, chart in enumerate(value or []):
                kind = chart.get("type") if isinstance(chart, dict) else None
                if kind == "histogram":
                    histograms.append(_axis(chart, f"charts[{i}]"))
                elif kind == "regression":
                    regressions.append(_regression(chart, f"charts[{i}]"))
                elif kind == "scatter" and scatter is None and "x" in chart and "y" in chart:
                    scatter = (
                        _axis(chart["x"], f"charts[{i}].x"),
                        _axis(chart["y"], f"charts[{i}].y"),
                    )
                elif kind == "decision_boundary" and boundary is None:
                    boundary = _boundary(chart, f"charts[{i}]", unknown)
                elif kind == "curve":
                    if "metric" in chart:
                        curve_metrics.append(str(chart["metric"]))
                else:
                    unknown.append(f"charts[{i}] ({kind})")
        elif key == "test_splits" and isinstance(value, list | tuple):
            test_splits = tuple(str(v) for v in value)
        elif key == "decision_boundary":
            boundary = _boundary(value, key, unknown)
        elif key == "primary_metric":
            pass
        elif key == "metrics" and isinstance(value, dict):
            senses = _senses(value, unknown)
        elif key == "metric_definitions" and isinstance(value, dict):
            definitions = {str(k): str(v) for k, v in value.items()}
        elif key == "aggregates" and isinstance(value, list | tuple):
            aggregates = tuple(value)
        elif key == "events" and isinstance(value, list | tuple):
            events = tuple(value)
        elif key == "verdict" and _verdict_decl(value):
            metric = value.get("metric")
            verdict_metric = None if metric is None else str(metric)
            verdict_splits = tuple(str(v) for v in value.get("splits", ()))
        else:
            unknown.append(str(key))
    primary = decl.get("primary_metric")
    return Declarations(
        scatter=scatter,
        regressions=tuple(regressions),
        histograms=tuple(histograms),
        test_splits=test_splits,
        primary_metric=None if primary is None else str(primary),
        decision_boundary=boundary,
        curve_metrics=tuple(dict.fromkeys(curve_metrics)),
        metric_definitions=definitions,
        aggregates=aggregates,
        events=events,
        verdict_metric=verdict_metric,
        verdict_splits=verdict_splits,
        metrics=senses,
        unknown=tuple(unknown),
    )


def _verdict_decl(value: Any) -> bool:
    """``{"metric"?: str, "splits"?: [str]}`` and nothing else."""
    return (
        isinstance(value, dict)
        and set(value) <= {"metric", "splits"}
        and isinstance(value.get("metric", ""), str)
        and isinstance(value.get("splits", []), list | tuple)
        and all(isinstance(v, str) for v in value.get("splits", []))
    )


def candidate_rank(objective: float, objective_std: float | None, trial_id: str, *, maximize: bool) -> tuple[float, float, str]:
    """The sort key that ranks tuning candidates, best first, everywhere (``study tune``'s
    ranking and ``--from-best``, ``study status``'s best so far, the tuning verdict): the
    better objective, then the smaller spread across its seeds, then the trial_id."""
    spread = float(objective_std) if objective_std is not None and math.isfinite(objective_std) else float("inf")
    return (-float(objective) if maximize else float(objective), spread, str(trial_id))
