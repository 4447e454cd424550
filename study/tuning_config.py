"""The ``tune:`` block of a study file: search space, objective, sampler, validated.

:func:`tune_block` resolves and checks a study's ``tune:`` block before anything runs:
every searched field must exist, both bounds must make a valid config, and the objective
(and epoch selection) may only look at splits whose role is ``val`` or ``val_ood``, so
test data never reaches the sampler. Running the search is :mod:`study.tuning`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from study.config import Point, StudyConfig
from study.plan import seedsets
from trainables.configbase import FrozenConfig
from trainables.errors import ConfigError
from trainables.optim import PER_MEMBER
from trainables.registry import MODELS, TASKS
from trainables.spec import RunSpec, validate
from trainables.tuning_unit import apply_params

TUNABLE_ROLES = ("val", "val_ood")
"""Split roles tuning may look at (objective, epoch selection, pruning)."""

SEARCH_IDENTITY = (
    "space",
    "objective",
    "direction",
    "seeds_per_candidate",
    "sampler",
    "sampler_seed",
    "startup_trials",
)
"""TuneBlock fields a resumed search must keep (``trials``, ``sequential``, ``batch``, pruning
may change)."""

BUNDLABLE = tuple(f"{block}.{name}" for block, name in PER_MEMBER.values() if name != "adam_betas")
"""Searched fields in which candidates of one bundle may differ (the numeric per-member
hyperparameters of :mod:`trainables.optim`): a space of only these can be tuned in bundles."""

AUTO_MEMBERS = 64
"""``batch: auto``: members of one bundle on a GPU, or on a CPU when the model sets no
``cpu_bundle_cap`` (as ``execution.bundle_size: auto`` does for seeds)."""


class ParamSpace(FrozenConfig):
    """One searched numeric field."""

    low: float
    """Lower bound (inclusive)."""
    high: float
    """Upper bound (inclusive)."""
    log: bool = False
    """Sample on a log scale (log-uniform); needs ``low > 0``."""
    type: Literal["float", "int"] = "float"
    """``float`` or ``int`` (integer bounds, integer values)."""


class Objective(FrozenConfig):
    """What a candidate is scored on."""

    split: str = "val_ood"
    """Split whose metric is the objective; its role must be ``val`` or ``val_ood``."""
    metric: str | None = None
    """Metric on that split (``loss`` or any metric the task scores); unset: ``accuracy`` when
    the task scores it, else the task's ``primary_metric``."""
    aggregate: Literal["mean", "median", "iqm"] = "mean"
    """How the per-seed values combine (IQM: mean of the middle 50%)."""


class TuneBlock(FrozenConfig):
    """The ``tune:`` block of a study file."""

    space: dict[str, ParamSpace] | None = None
    """Dotted field path -> range, e.g. ``train.lr: {low: 0.01, high: 1.0, log: true}``;
    omitted: the task's default (symbol rewriting: lr log-uniform in [0.01, 1],
    dropout uniform in [0, 0.5])."""
    objective: Objective = Objective()
    """The objective split, metric and aggregate."""
    direction: Literal["maximize", "minimize"] | None = None
    """Whether a larger objective is better; omitted: the way the objective's metric is
    better, as the task declares it (``minimize`` for loss or an error, ``maximize`` for
    accuracy); the other way is refused."""
    seeds_per_candidate: int = Field(3, ge=1)
    """K: seed indices 0..K-1 (from the ``seeds:`` block's root and vary) every candidate trains."""
    trials: int = Field(20, ge=1)
    """Candidates to finish (``--trials`` overrides); a resumed search runs only the missing ones."""
    sampler: Literal["tpe", "random"] = "tpe"
    """Optuna sampler."""
    sampler_seed: int = Field(0, ge=0)
    """Seed of the sampler (each proposal is seeded from it and its position)."""
    startup_trials: int = Field(10, ge=0)
    """TPE: random candidates before TPE starts modelling."""
    sequential: bool = False
    """One candidate at a time: bit-reproducible, but uses one CPU. Default: one per CPU."""
    enqueue: tuple[dict[str, float], ...] = ()
    """Candidates evaluated first, before the sampler proposes (e.g. the published config)."""
    pruner: Literal["none", "asha"] = "none"
    """Early stopping of poor candidates: ``asha``, asynchronous successive halving (Optuna's
    SuccessiveHalvingPruner) on the per-epoch objective; off by default."""
    grace_period: int = Field(2, ge=1)
    """ASHA: epochs (optimizer steps for step-based training) before a candidate can be stopped."""
    reduction_factor: int = Field(3, ge=2)
    """ASHA: keep about 1/reduction_factor of the candidates at each rung."""
    batch: Annotated[int, Field(ge=1)] | Literal["auto"] = 1
    """Candidates asked of Optuna at once and trained, each with its paired seeds, as ONE
    bundle of ``batch x seeds_per_candidate`` members (docs/tuning.md, "Tuning in bundles").
    1: one candidate per bundle. ``auto``: as many as fit where bundling still pays on the
    device (a CPU: the model's ``cpu_bundle_cap`` members, else 64; a GPU: 64). Needs a space
    of per-member hyperparameters only (train.lr, train.weight_decay, train.momentum,
    train.clip_norm, model.dropout); any other searched field trains one candidate per bundle."""


def tune_block(cfg: StudyConfig) -> TuneBlock:
    """The validated ``tune:`` block, space and direction resolved; raises ConfigError."""
    if not isinstance(cfg.tune, dict):
        raise ConfigError(
            "tune",
            "the study file has no `tune:` mapping",
            "add one, e.g. `tune: {trials: 20}` (see configs/weber2018_tune.yaml)",
        )
    if len(cfg.points) != 1:
        raise ConfigError(
            "grid",
            "a tuning study cannot also have a grid",
            "remove `grid:` or tune each point separately",
        )
    block: TuneBlock = validate(TuneBlock, dict(cfg.tune), "tune")
    point = cfg.points[0]
    if block.space is None:
        declared = TASKS.get(point.spec.task_name).default_search_space
        if declared is None:
            raise ConfigError(
                "tune.space",
                f"task {point.spec.task_name!r} has no default search space",
                "name one, e.g. `space: {train.lr: {low: 0.001, high: 0.1, log: true}}` (a task "
                "declares its default as Task.default_search_space)",
            )
        default = {k: ParamSpace(**r) for k, r in declared.items()}
        block = block.model_copy(update={"space": default})
    assert block.space is not None
    if not block.space:
        raise ConfigError("tune.space", "is empty", "name at least one field to search")
    base = point.spec.to_dict()
    for path, rng in block.space.items():
        _check_param(base, path, rng)
    for i, cand in enumerate(block.enqueue):
        for path, value in cand.items():
            bounds = block.space.get(path)
            if bounds is None or not bounds.low <= value <= bounds.high:
                raise ConfigError(
                    f"tune.enqueue[{i}].{path}",
                    "not a searched field or outside its range",
                    f"use fields of tune.space within their bounds: {', '.join(block.space)}",
                )
    if block.objective.metric is None:  # resolved as train.selection's is
        metrics, primary = point.spec.metrics(), TASKS.get(point.spec.task_name).primary_metric
        objective = block.objective.model_copy(update={"metric": "accuracy" if "accuracy" in metrics else primary})
        block = block.model_copy(update={"objective": objective})
    _check_leakage(cfg, block)
    seeds = seedsets(candidate_point(point, block))
    if len({s.data_seed for s in seeds}) > 1:
        raise ConfigError(
            "seeds.vary",
            "every candidate trains its K seeds as one bundle on one dataset",
            "remove `data` from seeds.vary for a tuning study",
        )
    metric = point.spec.metrics()[str(block.objective.metric)]  # a metric it scores: _check_leakage
    if block.direction is not None and block.direction != metric.direction:
        raise ConfigError(
            "tune.direction",
            f"{block.direction} would search for the worst config: {point.spec.task_name} with "
            f"{point.spec.model_name} declares that {metric.better} {metric.name} is better",
            f"use direction: {metric.direction}, or leave it unset (it follows the objective's metric)",
        )
    return block.model_copy(update={"direction": metric.direction})


def _check_param(base: dict[str, Any], path: str, rng: ParamSpace) -> None:
    field = f"tune.space.{path}"
    parts = path.split(".")
    if parts[0] not in ("task", "model", "train") or len(parts) < 2:
        raise ConfigError(
            field,
            "not a task/model/train field",
            "use a dotted path like train.lr or model.dropout",
        )
    cur: Any = base
    for p in parts:
        if not isinstance(cur, dict) or p not in cur:
            raise ConfigError(
                field,
                "no such config field",
                "check the spelling against the task/model/train config",
            )
        cur = cur[p]
    if isinstance(cur, bool) or not (cur is None or isinstance(cur, int | float)):
        raise ConfigError(
            field,
            f"is not numeric (it is {cur!r})",
            "search only numeric fields; use a grid for choices",
        )
    if rng.low >= rng.high or (rng.log and rng.low <= 0):
        raise ConfigError(
            field,
            f"invalid range [{rng.low}, {rng.high}]",
            "need low < high, and low > 0 with log: true",
        )
    if rng.type == "int" and not (float(rng.low).is_integer() and float(rng.high).is_integer()):
        raise ConfigError(
            field, "an int range needs integer bounds", "use whole numbers for low and high"
        )
    for value in (rng.low, rng.high):
        problem = _refusal(base, path, int(value) if rng.type == "int" else value)
        if problem is not None:
            raise ConfigError(field, f"bound {value}: {problem.problem}", problem.fix)
    _check_inside(base, path, rng, whole=isinstance(cur, int))


INT_VALUES_CHECKED = 256
"""An int range of at most this many values has each one checked before Ray; a wider one its
bounds and a few values between."""


def _refusal(base: dict[str, Any], path: str, value: Any) -> ConfigError | None:
    """What the config says of ``path`` = ``value`` (None: it is accepted)."""
    try:
        RunSpec.from_dict(apply_params(base, {path: value}))
    except ConfigError as exc:
        return exc
    return None


def _check_inside(base: dict[str, Any], path: str, rng: ParamSpace, whole: bool) -> None:
    """Values inside the range that the config refuses, found before Ray (before: only the
    bounds were checked, and a candidate inside, such as 5 heads for d_model 8, stopped the
    search after Ray had started, every resume again): each value of a small int range, a
    few values of a float one, and a float range on a field whose value in the file is a
    whole number (``whole``) that refuses a fraction."""
    field = f"tune.space.{path}"
    lo, hi = rng.low, rng.high
    values: list[Any]
    if rng.type == "float":
        values = [lo * (hi / lo) ** f if rng.log else lo + (hi - lo) * f for f in (0.37, 0.5, 0.75)]
    elif hi - lo + 1 <= INT_VALUES_CHECKED:
        values = list(range(int(lo), int(hi) + 1))
    else:
        values = sorted({int(lo + (hi - lo) * f) for f in (0.1, 0.25, 0.37, 0.5, 0.75, 0.9)})
    refused = [(v, problem) for v in values if (problem := _refusal(base, path, v)) is not None]
    if rng.type == "float" and whole and refused and refused[0][0] == values[0] and refused[0][1].field == path:
        raise ConfigError(field, f"a float range on a whole-number field ({values[0]:.4g} is refused: "
                          f"{refused[0][1].problem})", "add `type: int` to the range")
    if refused:
        shown = ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v, _ in refused[:8])
        more = f" and {len(refused) - 8} more" if len(refused) > 8 else ""
        raise ConfigError(field, f"the config refuses values inside the range [{lo:g}, {hi:g}]: {shown}{more} "
                          f"({refused[0][1].field}: {refused[0][1].problem})", "search a range whose every value "
                          "the config takes, or try the valid values as a grid axis (a grid: block) instead")


def _check_leakage(cfg: StudyConfig, block: TuneBlock) -> None:
    """Objective and epoch selection may only look at val / val_ood splits."""
    spec = cfg.points[0].spec
    roles = spec.make_task().split_roles()
    allowed = ", ".join(sorted(n for n, r in roles.items() if r in TUNABLE_ROLES))
    looks = [("tune.objective.split", block.objective.split)]
    if spec.train.selection.mode != "last":
        looks.append(("train.selection.split", spec.train.selection.split))
    metrics = spec.metric_names()
    if block.objective.metric not in metrics:
        raise ConfigError(
            "tune.objective.metric",
            f"{spec.task_name} with {spec.model_name} scores no metric {block.objective.metric!r}",
            f"use one of: {', '.join(metrics)}",
        )
    for field, split in looks:
        if split not in roles:
            raise ConfigError(field, f"no split {split!r}", f"use one of: {allowed}")
        if roles[split] not in TUNABLE_ROLES:
            raise ConfigError(
                field,
                f"split {split!r} has role {roles[split]!r}: tuning may only look at val or val_ood "
                "splits (a test split would leak into model selection)",
                f"use one of: {allowed}",
            )


def bundle_batch(cfg: StudyConfig, block: TuneBlock, device: str) -> tuple[int, str]:
    """Candidates per bundle for ``block`` on ``device`` (``cpu`` or ``cuda``) and, when that
    is not what ``tune.batch`` asks for, why (a line for the console; "" otherwise).

    Raises ConfigError when an integer ``batch`` makes bundles larger than the model allows
    (``Model.max_bundle``, e.g. a one-seed reference implementation)."""
    assert block.space is not None
    if block.batch == 1:
        return 1, ""
    other = [p for p in block.space if p not in BUNDLABLE]
    if other:
        return 1, (
            f"note: tune.batch {block.batch} not used: candidates that differ in {other[0]} cannot "
            f"share a bundle (only {', '.join(BUNDLABLE)} can); one candidate per bundle"
        )
    spec, k = cfg.points[0].spec, block.seeds_per_candidate
    model_cls = MODELS.get(spec.model_name)
    limit = model_cls.max_bundle(spec.model)
    if block.batch != "auto":
        if limit is not None and int(block.batch) * k > limit:
            raise ConfigError(
                "tune.batch",
                f"{block.batch} candidates x {k} seeds = {int(block.batch) * k} members, but model "
                f"{spec.model_name!r} with this config trains at most {limit} in one bundle",
                f"use tune.batch <= {max(1, limit // k)} (or `auto`)",
            )
        return int(block.batch), ""
    cap = AUTO_MEMBERS if device == "cuda" else (model_cls.cpu_bundle_cap or AUTO_MEMBERS)
    if limit is not None:
        cap = min(cap, limit)
    batch = max(1, cap // k)
    return batch, f"tune.batch auto: {batch} candidate(s) x {k} seeds per bundle on {device}"


def candidate_point(point: Point, block: TuneBlock) -> Point:
    return Point(
        point.spec, point.seeds.model_copy(update={"count": block.seeds_per_candidate}), {}
    )
