"""Study config files: schema, grid expansion, validation with clear errors.

A study file (YAML) looks like::

    name: weber2018              # default study name (--name overrides)
    task:  {name: symbol_rewriting, train_size: 100000}
    model: {name: seq2seq, hidden_size: 32, dropout: 0.1}
    train: {optimizer: sgd, lr: 0.125, batch_size: 64, clip_norm: 5, max_epochs: 30}
    seeds: {count: 50, root: 0, vary: [init, order, dropout]}
    grid:                        # optional: axes over any dotted field
      model.cell:
        lstm: {train.lr: 0.01, seeds.count: 10}    # per-value overrides
        gru:  {train.lr: 0.001}
    execution: {bundle_size: 1, device: auto, cpus_per_trial: 1}

Each grid point is a config (a :class:`Point`) times its seeds. Everything is validated
before Ray starts; the first problem raises :class:`~trainables.errors.ConfigError`
naming the dotted field and the fix.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import itertools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field

from study.manifest import NAME_RE, RESERVED_NAMES, check_name  # noqa: F401 (re-exported)
from trainables.configbase import FrozenConfig
from trainables.errors import ConfigError
from trainables.plugins import import_modules
from trainables.seeding import Source
from trainables.spec import RunSpec, validate

TOP_LEVEL = ("name", "plugins", "task", "model", "train", "seeds", "grid", "execution", "tune")
PER_POINT = ("task", "model", "train", "seeds")
"""Blocks a grid axis or override may set (execution, tune, name, plugins are per study)."""
BLOCKS = ("task", "model", "train", "seeds", "grid", "execution", "tune")
"""Top-level fields that must be a block (a YAML mapping) when given."""
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class SeedsConfig(FrozenConfig):
    """Which seeds a study runs and how they are derived (see trainables.seeding)."""

    count: int = Field(4, ge=1, le=100_000)
    """Number of seed indices 0..count-1 (``--seeds`` overrides)."""
    root: int = Field(0, ge=0)
    """Root seed every run's seeds derive from."""
    vary: tuple[Source, ...] = ("init", "order", "dropout")
    """Seed sources that follow the seed index; the others stay at index 0 (one dataset
    for the whole study unless ``data`` is listed)."""
    pinned: dict[Source, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
    """Explicit seed values for sources (wins over ``vary``), each >= 0 like ``root``."""


class ExecutionConfig(FrozenConfig):
    """How trials execute. Never part of the trial_id."""

    bundle_size: Annotated[int, Field(ge=1)] | Literal["auto"] = 1
    """Seeds trained together as one vectorised computation. An integer K: bundles of K (the
    last one what is left). ``auto``: on a GPU up to 64 per bundle; on CPUs one bundle per
    CPU, at most the model's ``cpu_bundle_cap`` seeds each, split evenly (``study/plan.py``)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where bundles run; ``auto`` is CUDA when the study asks Ray for GPUs
    (``gpus_per_trial`` > 0), else CPU (``study run`` notes GPUs it leaves unused)."""
    cuda_graphs: bool = False
    """On a GPU, replay each training step's loss and gradients from CUDA graphs (one per
    padded batch shape) instead of launching its kernels one by one: several times faster
    for launch-bound models (seq2seq; ``benchmarks/gpu_bundle.py``). Models without a
    captured form run eagerly. With it every device, CPU included, draws dropout masks from
    a counter-based hash (``trainables/models/counter_noise.py``), a different stream from
    the default generators, so results differ from ``false`` as they differ between devices."""
    cpus_per_trial: float = Field(1.0, gt=0)
    """Ray CPUs each trial asks for."""
    gpus_per_trial: float = Field(0.0, ge=0)
    """Ray GPUs each trial asks for (set > 0 to run bundles on GPUs of a cluster)."""
    threads: int = Field(1, ge=1, le=1024)
    """torch threads per trial (one is fastest per core for these small models); a local Ray
    refuses more than the machine's CPUs."""
    max_failures: int = Field(2, ge=0)
    """Retries of a failed trial (from its last checkpoint)."""
    ship_plugins: bool = True
    """Send the study file's ``plugins:`` modules that are not installed to every Ray worker
    with the job (Ray's ``runtime_env`` ``py_modules``). Turn off only where every node
    already imports them (e.g. a shared folder on every node's PYTHONPATH)."""
    loggers: tuple[str, ...] = ()
    """Experiment trackers that get one run per seed with its per-epoch metrics, grouped by
    config: any of ``tensorboard``, ``mlflow``, ``wandb``, ``aim`` (each needs its package
    installed; see docs/trackers.md). Empty: Parquet only."""
    progress_every_s: float = Field(60.0, gt=0)
    """Not on a terminal (a log): seconds between heartbeat lines of the study's progress
    (seeds committed, running, their latest selection metric, the seconds of the running
    bundles' last round in training steps and in evaluation); on a terminal a live bar."""
    report_every_s: float = Field(2.0, gt=0)
    """Seconds of training between a trial's Tune results, each followed by a checkpoint, so
    a killed trial loses at most about this much work. Each result costs some milliseconds,
    so much smaller values slow tiny models; a result always holds at least one round."""
    keep_weights: bool = True
    """Save each seed's selected parameters with its commit (``OUT/<NAME>/weights/``, named by
    the runs row's ``weights`` column), so ``study eval NAME`` can evaluate them later on test
    splits added or changed since, without retraining. False: keep none (saves disk)."""


@dataclass(frozen=True)
class Point:
    """One grid point: a resolved RunSpec, its seed config and its grid values."""

    spec: RunSpec
    seeds: SeedsConfig
    values: dict[str, Any]

    @property
    def seed_extra(self) -> dict[str, Any]:
        return {"seeds": {"root": self.seeds.root, "vary": sorted(self.seeds.vary), "pinned": self.seeds.pinned}}

    @functools.cached_property
    def trial_id(self) -> str:
        """The point's resolved config hash (computed once: planning asks per seed)."""
        return self.spec.trial_id(self.seed_extra)


@dataclass(frozen=True)
class StudyConfig:
    """A whole validated study file."""

    name: str | None
    raw: dict[str, Any]
    points: tuple[Point, ...]
    execution: ExecutionConfig
    tune: dict[str, Any] | None
    plugins: tuple[str, ...] = ()
    """The ``plugins:`` modules (imported before validation; see trainables.plugins)."""
    plugin_dir: str | None = None
    """The study file's folder, searched first for ``plugins:`` (recorded in the manifest,
    so ``study resume`` finds them without the file)."""
    overrides: tuple[str, ...] = ()
    """The command line's ``dotted.field=value`` overrides as given, already applied to
    ``raw`` (recorded in the manifest; see :func:`apply_overrides`)."""

    @functools.cached_property
    def identity_hash(self) -> str:
        """Hash of what the study computes, excluding seed counts (so a study can grow);
        computed once (every unit's payload carries it: recomputed, it held the driver 218 s
        before a 2,000-point grid could start)."""
        ident = [{"trial_id": p.trial_id, "point": p.values} for p in self.points]
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def set_dotted(d: dict[str, Any], path: str, value: Any, where: str | None = None) -> None:
    where = where or f"grid.{path}"
    if not isinstance(path, str):
        raise ConfigError(where, f"{path!r} is not a field path", "use a dotted path like model.cell or train.lr")
    parts = path.split(".")
    if parts[0] in TOP_LEVEL and parts[0] not in PER_POINT:
        raise ConfigError(where, f"{parts[0]}.* cannot vary per grid point (it is set once per study)",
                          f"set {path} in the study's top-level `{parts[0]}:` block instead")
    if parts[0] not in TOP_LEVEL or len(parts) < 2 or not all(parts):
        raise ConfigError(where, "not a config field path",
                          "use a dotted path like model.cell or train.lr")
    cur = d
    for p in parts[:-1]:
        nxt = cur.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"grid.{path}", f"{p} is not a mapping", "fix the path")
        cur = nxt
    cur[parts[-1]] = value


MAX_GRID_POINTS = 10_000
"""Most configs (grid points) one study may have."""


def expand_grid(raw: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(point values, raw config of that point) for every grid point (one if no grid)."""
    grid = raw.get("grid") or {}
    if not isinstance(grid, dict):
        raise ConfigError("grid", "must be a mapping of field path -> values", "see README's study-file section")
    axes: list[list[tuple[str, Any, dict[str, Any]]]] = []
    for path, choices in grid.items():
        if not isinstance(path, str):
            raise ConfigError(f"grid.{path}", f"{path!r} is not a field path", "use a dotted path like model.cell")
        set_dotted({}, path, None)  # refuse a bad path (or an execution.* axis) at once
        if isinstance(choices, dict):
            opts = []
            for v, overrides in choices.items():
                if overrides is not None and not isinstance(overrides, dict):
                    raise ConfigError(f"grid.{path}.{v}", "overrides must be a mapping", "write {field.path: value}")
                for opath in overrides or {}:
                    set_dotted({}, opath, None, f"grid.{path}.{v}.{opath}")
                opts.append((path, v, overrides or {}))
        elif isinstance(choices, list) and choices:
            opts = [(path, v, {}) for v in choices]
        else:
            raise ConfigError(f"grid.{path}", "needs a non-empty list of values or a mapping value -> overrides",
                              "e.g. `model.cell: [lstm, gru]`")
        axes.append(opts)
    points = math.prod(len(a) for a in axes)
    if points > MAX_GRID_POINTS:  # checked before expanding: a million points took minutes, silently
        sizes = " x ".join(f"{len(a)} ({a[0][0]})" for a in axes)
        raise ConfigError(
            "grid", f"{points:,} points ({sizes}), more than the {MAX_GRID_POINTS:,} a study may have",
            "use fewer values per axis, search the space with `study tune` (a tune: block), or split "
            "the grid into several studies",
        )
    out = []
    for combo in itertools.product(*axes) if axes else [()]:
        cfg = copy.deepcopy({k: v for k, v in raw.items() if k != "grid"})
        values: dict[str, Any] = {}
        for path, v, overrides in combo:
            set_dotted(cfg, path, v)
            values[path] = v
            for opath, ov in overrides.items():
                set_dotted(cfg, opath, ov, f"grid.{path}.{v}.{opath}")
        out.append((values, cfg))
    return out


def parse(
    raw: dict[str, Any],
    seeds_override: int | None = None,
    plugin_dir: str | Path | None = None,
    source: str | None = None,
) -> StudyConfig:
    """Validate a raw study dict into a :class:`StudyConfig` (no Ray, no data).

    Its ``plugins:`` are imported first (``plugin_dir`` searched before ``sys.path``);
    ``source`` names the study file in messages."""
    if not isinstance(raw, dict):
        raise ConfigError("(file)", "a study file must be a YAML mapping", "see configs/quickstart.yaml")
    unknown = set(raw) - set(TOP_LEVEL)
    if unknown:
        raise ConfigError(str(sorted(map(str, unknown))[0]), "unknown top-level field",
                          f"use only: {', '.join(TOP_LEVEL)}")
    for block in BLOCKS:
        value = raw.get(block)
        if value is not None and not isinstance(value, dict):
            raise ConfigError(block, f"must be a block of `field: value` lines, got {type(value).__name__} {_short(value)}",
                              f"write `{block}:` followed by indented `field: value` lines (see configs/quickstart.yaml)")
    plugins = _plugins(raw.get("plugins"))
    where = source or (f"the study file in {plugin_dir}" if plugin_dir else "the study file")
    modules = import_modules(plugins, Path(plugin_dir) if plugin_dir else None, where)
    check_registers(plugins, modules)
    name = raw.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise ConfigError("name", f"must be text, got {_short(name)}", "write e.g. `name: my_study`")
        check_name(name, "name")
    execution = validate(ExecutionConfig, dict(raw.get("execution") or {}), "execution")
    points = []
    for point_values, cfg in expand_grid(raw):
        where = f" (grid point {point_values})" if point_values else ""
        try:
            spec = RunSpec.from_dict(cfg)
            seeds = validate(SeedsConfig, dict(cfg.get("seeds") or {}), "seeds")
        except ConfigError as exc:
            raise ConfigError(exc.field, exc.problem + where, exc.fix) from None
        if seeds_override is not None:
            seeds = _override_count(seeds, seeds_override)
        points.append(Point(spec, seeds, point_values))
    ids = [p.trial_id for p in points]
    if len(set(ids)) != len(ids):
        raise ConfigError("grid", "two grid points resolve to the same config", "remove the duplicate values")
    tune = raw.get("tune")
    return StudyConfig(
        name, raw, tuple(points), execution, tune, plugins, str(plugin_dir) if plugin_dir else None
    )


def with_point_counts(cfg: StudyConfig, counts: dict[str, int]) -> StudyConfig:
    """``cfg`` with each grid point's seed count taken from ``counts`` (trial_id -> count; a
    study manifest's ``points``), so a resumed study keeps every point's own count (a grid
    with per-point ``seeds.count``, a ``--seeds`` run, a grown study). Points not in
    ``counts`` keep the config's count."""
    points = tuple(
        dataclasses.replace(p, seeds=_override_count(p.seeds, counts[p.trial_id]))
        if p.trial_id in counts and counts[p.trial_id] != p.seeds.count else p
        for p in cfg.points
    )
    return dataclasses.replace(cfg, points=points)


def _override_count(seeds: SeedsConfig, count: int) -> SeedsConfig:
    """``seeds`` with ``count`` seeds (``--seeds``), validated like the file's ``seeds.count``."""
    try:
        return validate(SeedsConfig, {**seeds.model_dump(), "count": count}, "seeds")
    except ConfigError as exc:
        if exc.field != "seeds.count":
            raise
        raise ConfigError("--seeds", f"{count} is out of range ({exc.problem})",
                          "give --seeds between 1 and 100000 (the limits of seeds.count)") from None


def _short(value: Any, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def check_registers(names: Sequence[str], modules: Sequence[ModuleType]) -> None:
    """Each ``plugins:`` module registers a task or a model (ConfigError on ``plugins``): one
    that registers nothing is a wrong name (``plugins: [os]`` imported the standard library's
    ``os`` without a word) or a module whose ``@TASKS.register`` is missing
    (:func:`trainables.registry.registers`)."""
    from trainables.registry import registers

    for name, module in zip(names, modules, strict=True):
        if registers(name):
            continue
        path = getattr(module, "__file__", None)
        raise ConfigError(
            "plugins",
            f"module {name!r}{f' ({path})' if path else ''} registers no task or model",
            f"decorate its classes with `@TASKS.register` / `@MODELS.register` (docs/plugins.md), "
            f"check the name (a module of that name elsewhere on sys.path is found first), or remove {name!r}",
        )


def _plugins(value: Any) -> tuple[str, ...]:
    """The ``plugins:`` list, checked: importable module names, each once."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError("plugins", f"must be a list of module names, got {value!r}",
                          "write e.g. `plugins: [my_task, mypkg.models]`")
    for v in value:
        if MODULE_RE.match(v) and not v.endswith(".py"):
            continue
        name = ".".join(p for p in PurePosixPath(v.removesuffix(".py")).parts if p != ".")
        where = "" if name == v.removesuffix(".py") else " (a module is looked up beside the study file, then on PYTHONPATH)"
        fix = (f"write the module's name{' without .py' if v.endswith('.py') else ''}: `plugins: [{name}]`{where}"
               if MODULE_RE.match(name) else "give importable module names (no paths, no .py): e.g. `my_task`, "
               "with its file beside the study file or on PYTHONPATH")
        raise ConfigError("plugins", f"{v!r} is {'a file name' if v.endswith('.py') else 'a path'}, not a module name"
                          if name != v else f"{v!r} is not a module name", fix)
    if len(set(value)) != len(value):
        raise ConfigError("plugins", "lists a module twice", "list each module once")
    return tuple(value)


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses a key given twice in one mapping (plain PyYAML
    keeps the last silently, so ``lr: 0.1`` ... ``lr: 1.0`` would run the second)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:
                continue  # an unhashable key: the base class reports it
            if first is not key_node.start_mark:
                raise yaml.constructor.ConstructorError(
                    f"while reading the mapping starting at line {node.start_mark.line + 1}", node.start_mark,
                    f"duplicate key {key!r} (first given at line {first.line + 1})", key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """The first useful line of a PyYAML error: its problem and where (line, column)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        what = exc.problem or exc.context or "invalid YAML"
        return f"{what} at line {mark.line + 1}, column {mark.column + 1}" if mark else what
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def read_yaml(path: Path, field: str = "CONFIG") -> Any:
    """A YAML file's content: an existing regular file, UTF-8, valid YAML, no duplicate keys
    (else ConfigError naming ``field``)."""
    if path.is_dir():
        raise ConfigError(field, f"{str(path)!r} is a folder, not a file",
                          "give the path of a study YAML file, e.g. configs/quickstart.yaml")
    if not path.exists():
        raise ConfigError(field, f"no such file {str(path)!r}", "give the path of a study YAML, e.g. configs/quickstart.yaml")
    if not path.is_file():  # reading a pipe or device could block or never end
        raise ConfigError(field, f"{str(path)!r} is not a regular file (a device, socket or pipe)",
                          "give the path of a study YAML, e.g. configs/quickstart.yaml")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(field, f"cannot read {path} ({exc.strerror or exc})",
                          "give the path of a readable study YAML") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(field, f"{path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
                          "save the study file as UTF-8") from None
    try:
        return yaml.load(text, Loader=StrictLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(field, f"{path} is not valid YAML: {yaml_problem(exc)}", "fix the YAML there") from None
    except RecursionError:
        raise ConfigError(field, f"{path} nests too deeply", "write a plain study file") from None


OVERRIDE_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_][A-Za-z0-9_-]*)*$")
"""A dotted field path of an override (``train.lr``, ``task.long_lengths``)."""
EXPONENT_RE = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")
"""``1e-3``: a float to Hydra, a string to YAML 1.1 (PyYAML wants ``1.0e-3``)."""
OVERRIDE_FIX = "write `dotted.field=value`, e.g. train.lr=0.05 seeds.count=10 model.hidden_size=64"


@dataclass(frozen=True)
class Override:
    """One ``dotted.field=value`` of the command line (Hydra's override syntax)."""

    text: str
    """As given (recorded in the manifest)."""
    path: str
    """The dotted field, e.g. ``train.lr`` (a grid axis: ``grid.model.cell``)."""
    value: Any
    """The value read as YAML: ``0.05``, ``10``, ``true``, ``null``, ``[a, b]``, ``{k: v}``;
    ``1e-3`` is a float (as in Hydra); an empty value is the empty string."""


def parse_override(text: str) -> Override:
    """One override, its path and value checked (ConfigError naming it and the fix)."""
    key, eq, value_text = text.partition("=")
    key = key.strip().removeprefix("+")  # Hydra's "+field=value" (add a field): the same here
    if not eq or not key:
        raise ConfigError(_cut(text), "not an override (no `field=value`)", OVERRIDE_FIX)
    if key.startswith("~"):
        raise ConfigError(key, "deleting a field (`~field`) is not supported",
                          "set the field to the value you want, or edit the study file")
    if not OVERRIDE_KEY_RE.fullmatch(key):
        raise ConfigError(_cut(key), "not a dotted field path", OVERRIDE_FIX)
    block = key.split(".")[0]
    if block not in TOP_LEVEL:
        raise ConfigError(key, f"unknown block {block!r}",
                          f"start the path with one of: {', '.join(TOP_LEVEL)} (e.g. train.lr=0.05)")
    if block in BLOCKS and "." not in key:
        raise ConfigError(key, f"`{block}` is a block, not a field",
                          f"override one field of it, e.g. {block}.FIELD=VALUE")
    if block not in BLOCKS and "." in key:
        raise ConfigError(key, f"`{block}` is a single value, not a block", f"write {block}=VALUE")
    if block == "grid" and key.count(".") < 2:
        raise ConfigError(key, "a grid axis names a field", "write e.g. grid.model.cell=[lstm,gru]")
    if value_text == "":
        return Override(text, key, "")
    try:
        value = yaml.load(value_text, Loader=StrictLoader)
    except yaml.YAMLError as exc:
        quoted = _cut(value_text.replace("'", "''"))
        problem = yaml_problem(exc).replace("found '\\x00'", "found the value's end")
        raise ConfigError(key, f"value {_short(value_text)} is not a YAML value ({problem})",
                          f"quote it: \"{key}='{quoted}'\", or write a number, true/false, "
                          "null, [a, b] or {k: v}") from None
    if isinstance(value, str) and EXPONENT_RE.fullmatch(value):
        value = float(value)
    glued = _glued_keys(value)
    if glued:
        spaced = ", ".join(k.replace(":", ": ", 1) for k in glued)
        raise ConfigError(key, f"value {_short(value_text)} reads as keys {', '.join(map(repr, glued))} without "
                          "values (YAML needs a space after each colon)", f"write {{{spaced}}}")
    return Override(text, key, value)


def _glued_keys(value: Any) -> list[str]:
    """Mapping keys like ``low:0`` with no value, at any depth: ``{low:0,high:0.3}`` in YAML
    is two keys, not two fields."""
    if isinstance(value, dict):
        own = [k for k, v in value.items() if isinstance(k, str) and ":" in k and v is None]
        return own + [g for v in value.values() for g in _glued_keys(v)]
    if isinstance(value, list):
        return [g for v in value for g in _glued_keys(v)]
    return []


def apply_overrides(raw: Any, texts: Sequence[str]) -> tuple[Any, tuple[Override, ...]]:
    """``raw`` (a study file's content) with the overrides applied, each given once; a
    missing block or field is added. ``grid.<dotted field>=[...]`` sets a grid axis, and
    ``tune.space.<dotted field>={low: .., high: ..}`` (or ``...<dotted field>.high=..``) a
    searched field."""
    overrides = tuple(parse_override(t) for t in texts)
    seen: dict[str, str] = {}
    for o in overrides:
        if o.path in seen:
            raise ConfigError(o.path, f"given twice on the command line ({seen[o.path]!r}, {o.text!r})",
                              "give each field once")
        seen[o.path] = o.text
    if not overrides or not isinstance(raw, dict):
        return raw, overrides  # a file that is no mapping: parse() says so
    raw = copy.deepcopy(raw)
    for o in overrides:
        block, _, rest = o.path.partition(".")
        if not rest:
            raw[block] = o.value
            continue
        if block == "grid":
            o = dataclasses.replace(o, value=_keep_value_overrides((raw.get("grid") or {}).get(rest), o.value))
        parts = [block, rest] if block == "grid" else _space_parts(o.path) or o.path.split(".")
        if parts[:2] == ["tune", "space"] and len(parts) == 3 and not isinstance(o.value, dict):
            key, _, attr = parts[2].rpartition(".")
            raise ConfigError(o.path, f"{attr!r} is not a bound of a searched field (a range is "
                              "low, high, log, type)", f"set one of them, e.g. `tune.space.{key}.high="
                              f"{o.value}`, or the whole range: `'tune.space.{key}={{low: 0.01, high: 1}}'`")
        cur = raw
        for i, part in enumerate(parts[:-1]):
            nxt = cur.get(part)
            if nxt is None:
                nxt = cur[part] = {}
            if not isinstance(nxt, dict):
                where = ".".join(parts[: i + 1])
                raise ConfigError(o.path, f"{where} is {_short(nxt)} in the study file, not a block of fields",
                                  f"override {where} itself, or make it a block in the study file")
            cur = nxt
        cur[parts[-1]] = o.value
    _refuse_shadowed(raw, overrides)
    return raw, overrides


def _keep_value_overrides(axis: Any, values: Any) -> Any:
    """A list of values given for a grid axis that the study file writes as a mapping
    (value -> overrides): as a mapping keeping the file's overrides of each value listed, so
    `'grid.task.kind=[addition]'` is the file's addition point, its overrides and trial_id
    included (a value the file lacks gets none). Anything else is returned as it is."""
    if not (isinstance(axis, dict) and isinstance(values, list)):
        return values
    try:
        if len(set(values)) != len(values):  # a repeat: parse() refuses the duplicate point
            return values
    except TypeError:  # an unhashable value (a list): no key of the file's mapping
        return values
    return {v: axis.get(v) for v in values}


def _refuse_shadowed(raw: dict[str, Any], overrides: Sequence[Override]) -> None:
    """Refuse an override of a field that every grid point sets anyway (a grid axis, or a
    field each value of a mapping axis overrides): it would change nothing and never be
    checked (`task.kind=sort` ran all seven tasks of the length study)."""
    grid = raw.get("grid")
    if not isinstance(grid, dict):
        return
    for o in overrides:
        if o.path.split(".")[0] not in ("task", "model", "train", "seeds"):
            continue
        value = o.text.partition("=")[2]
        for axis, choices in grid.items():
            if not isinstance(axis, str):
                continue
            if _within(o.path, axis):
                raise ConfigError(o.path, f"is a grid axis (grid.{axis}): every grid point sets it, so this "
                                  "override would change nothing", f"choose the axis's values instead, e.g. "
                                  f"'grid.{axis}=[{value}]'")
            if isinstance(choices, dict) and choices and all(
                isinstance(ov, dict) and any(_within(o.path, k) for k in ov)
                for ov in choices.values()
            ):
                first = next(iter(choices))
                raise ConfigError(o.path, f"is set by every value of grid.{axis} in the study file, so this "
                                  "override would change nothing", f"give the axis with the value you want "
                                  f"per point, e.g. 'grid.{axis}={{{first}: {{{o.path}: {value}}}}}', or edit "
                                  "the study file")


def partly_shadowed(cfg: StudyConfig) -> list[str]:
    """Notes for the command line's overrides that some values of a mapping grid axis set
    again in the study file (those points keep the file's value): the override applies to
    the other points only, which a user who meant all of them would not see."""
    grid = cfg.raw.get("grid")
    notes: list[str] = []
    if not isinstance(grid, dict):
        return notes
    for o in (parse_override(t) for t in cfg.overrides):
        for axis, choices in grid.items():
            if not isinstance(choices, dict) or o.path.split(".")[0] not in ("task", "model", "train", "seeds"):
                continue
            own = [str(v) for v, ov in choices.items() if isinstance(ov, dict) and any(_within(o.path, k) for k in ov)]
            if own:  # not every value: _refuse_shadowed refused that
                notes.append(f"note: {o.text} applies to {len(choices) - len(own)} of the {len(choices)} values of "
                             f"grid.{axis}; {', '.join(own)} set{'s' if len(own) == 1 else ''} {o.path} in the study "
                             "file, which wins there")
    return notes


def _space_parts(path: str) -> list[str] | None:
    """``tune.space.<dotted field>[.low|high|log|type]`` as the blocks it sets (a space key
    is itself a dotted field: ``tune.space.train.lr.high`` sets ``high`` of ``train.lr``);
    None for any other path."""
    from study.tuning_config import ParamSpace

    if not path.startswith("tune.space.") or path.count(".") < 3:
        return None
    field = path.removeprefix("tune.space.")
    key, _, attr = field.rpartition(".")
    if attr in ParamSpace.model_fields and key.count(".") >= 1:
        return ["tune", "space", key, attr]
    return ["tune", "space", field]


def load(path: Path, seeds_override: int | None = None, overrides: Sequence[str] = ()) -> StudyConfig:
    """Read and validate a study file, with the command line's ``dotted.field=value``
    ``overrides`` applied first (validated like the file; an error a field of an override
    caused says so)."""
    path = Path(path)
    raw, parsed = apply_overrides(read_yaml(path), overrides)  # a missing file or a folder is refused there
    if seeds_override is not None and "seeds.count" in {o.path for o in parsed}:
        raise ConfigError("--seeds", "given together with the override seeds.count",
                          "give one of them (--seeds N is the same as seeds.count=N)")
    task = raw.get("task") if isinstance(raw, dict) else None
    if isinstance(task, dict) and isinstance(task.get("data_dir"), str) and not Path(task["data_dir"]).is_absolute():
        # Ray workers run in other folders: a relative data_dir means relative to where `study` runs.
        task["data_dir"] = str((Path.cwd() / task["data_dir"]).resolve())
    try:
        cfg = parse(raw, seeds_override, path.resolve().parent, str(path))
    except ConfigError as exc:
        culprit = next((o for o in parsed if _caused(o.path, exc.field)), None)
        if culprit is None:
            raise
        raise ConfigError(exc.field, f"{exc.problem} (set on the command line by {culprit.text!r})",
                          exc.fix) from None
    return dataclasses.replace(cfg, overrides=tuple(o.text for o in parsed))


def _cut(text: str, width: int = 60) -> str:
    """``text`` as a field name in a message: at most ``width`` characters."""
    return text if len(text) <= width else text[: width - 3] + "..."


def _within(path: str, field: str) -> bool:
    """Whether setting ``field`` sets ``path`` (the same field, or a block holding it)."""
    return path == field or path.startswith(field + ".")


def _caused(path: str, field: str) -> bool:
    """Whether a ConfigError about ``field`` concerns the override of ``path``."""
    return field == path or field.startswith(path + ".") or path.startswith(field + ".")
