"""What one trial trains: the task, model and training-procedure configs, resolved.

A :class:`RunSpec` is the part of a study config that decides the numbers a run
produces; its canonical JSON hashes to the ``trial_id``. Execution details (how many
seeds, bundle size, device, resources) are deliberately NOT part of it: a resumed study,
on any machine and with any bundling, finds its completed work.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, ValidationError, model_validator

from trainables.configbase import FrozenConfig, added_field
from trainables.errors import ConfigError
from trainables.metrics import LOSS, Metric

if TYPE_CHECKING:
    from trainables.models.base import Model
    from trainables.tasks.base import Task


class SelectionConfig(FrozenConfig):
    """Which epoch's parameters a run keeps, and when it stops early."""

    split: str = "val"
    """Split whose metric selects the epoch (its role must be ``val`` or ``val_ood``: never
    a test split)."""
    metric: str | None = None
    """Metric on that split (``loss`` or any metric the task scores); unset: ``accuracy`` when
    the task scores it (or ``mode`` is ``last``, which reads none), else the task's
    ``primary_metric``."""
    mode: Literal["max", "min", "last"] | None = None
    """``max``/``min``: keep the best epoch (ties keep the earlier); ``last``: keep the final
    one. Unset: the way the metric is better (``max`` for accuracy, ``min`` for loss, as the
    task declares its metrics); the other way is refused."""
    early_stop: bool = True
    """Stop a run once the metric fails to improve for ``patience`` consecutive evaluations."""
    patience: int = Field(1, ge=1)
    """Consecutive non-improving evaluations that stop a run (1: the first one stops it)."""
    arm_above: float | None = None
    """Early stopping is armed only once the best value is above this (max mode) or below it
    (min mode); ``null`` arms it at once. With early stopping the level also defines a run
    that *learned*: one that never passes it ends at ``max_epochs`` with the status
    ``not_learned`` (committed, counted apart). (Weber et al.'s rule fires at epoch 2 while
    val accuracy still sits at 0, so their study file arms it at 0.5.)"""
    min_epochs: int = Field(1, ge=1)
    """Never stop before this many epochs."""


class LrHalving(FrozenConfig):
    """Halve the learning rate on a schedule (Sutskever et al. 2014), or from the first epoch
    a validation loss rises (OpenNMT-py 0.x)."""

    start_epoch: float = Field(5.0, ge=0)
    """The first halving applies once this many epochs (fractional allowed) are done."""
    every_epochs: float = Field(0.5, gt=0)
    """Then halve again every this many epochs (lr / 2^n after start + (n - 1) * every)."""
    on_loss_rise: str | None = added_field(None)
    """A split whose loss is evaluated after every epoch: a member's halving also starts,
    earlier than ``start_epoch``, once an epoch ends with that loss above the previous
    epoch's (each member by its own loss; its lr then halves every ``every_epochs``):
    OpenNMT-py 0.x's rule (``Optim.update_learning_rate``: decay once the epoch reaches
    ``-start_decay_at`` or validation perplexity rises, then every epoch). Epoch-based
    training only. None: the schedule alone."""


AdamBeta = Annotated[float, Field(ge=0, lt=1)]
"""One of Adam's betas: torch.optim.Adam refuses values outside [0, 1)."""


class TrainConfig(FrozenConfig):
    """The training procedure."""

    optimizer: Literal["sgd", "adam", "adamw"] = "adam"
    """SGD (with ``momentum``, 0 by default), Adam, or AdamW (Adam with decoupled weight decay;
    ``weight_decay`` defaults to 0 here, not torch's 0.01). fineline's own bundled optimizers
    (``trainables/optim.py``), torch.optim's arithmetic."""
    lr: float = Field(1e-3, gt=0)
    """Learning rate."""
    batch_size: int = Field(32, ge=1)
    """Examples per member per optimizer step."""
    clip_norm: float | None = Field(None, gt=0)
    """Per-member global gradient-norm clip; ``null`` disables clipping."""
    loss_reduction: str | None = None
    """How the loss of a batch is reduced: one of the model's ``reductions`` (seq2seq: ``sum``
    over every target token, ``token_mean``, ``step_mean_sum``; classifiers: ``mean``,
    ``sum``). Unset: the model's first, its default; the resolved config records it."""
    max_epochs: int = Field(30, ge=1)
    """Cap on epochs (epoch-based training)."""
    max_steps: int | None = Field(None, ge=1)
    """Step-based training: total optimizer steps (then ``eval_every_steps`` sets the curve)."""
    eval_every_steps: int = Field(1, ge=1)
    """Step-based training: evaluate the curve splits every this many steps."""
    curve_splits: tuple[str, ...] = ()
    """Splits evaluated after every epoch (or eval round) for learning curves, besides the
    selection split."""
    snapshot_epochs: tuple[int, ...] = ()
    """Epochs after which EVERY split is evaluated and stored in ``metrics``."""
    adam_betas: tuple[AdamBeta, AdamBeta] = (0.9, 0.999)
    """Adam's betas, each in [0, 1)."""
    adam_eps: float = Field(1e-8, gt=0)
    """Adam's epsilon (> 0)."""
    weight_decay: float = Field(0.0, ge=0)
    """L2 weight decay (added to the gradient; with adamw, decoupled: ``p *= 1 - lr * wd``)."""
    momentum: float = added_field(0.0, ge=0, lt=1)
    """SGD's momentum, in [0, 1) (torch.optim.SGD's: dampening 0, no Nesterov); 0: plain SGD.
    Only with optimizer sgd (Adam's are ``adam_betas``)."""
    lr_halving: LrHalving | None = None
    """Optional learning-rate halving schedule."""
    lr_schedule: Literal["constant", "cosine"] = added_field("constant")
    """The learning rate after the warmup: ``constant``, or ``cosine``: decayed from ``lr`` to 0
    over the rest of the step budget (``max_steps``, else ``max_epochs`` epochs) as
    ``0.5 * (1 + cos(pi * progress))`` (``trainables/schedules.py``; times ``lr_halving``'s
    factor if both are set)."""
    warmup_steps: int = added_field(0, ge=0)
    """Linear warmup: the step taken after ``t < warmup_steps`` steps runs at ``lr * t /
    warmup_steps`` (0 at the first step, as torch's LambdaLR; Nanda et al.'s grokking code
    warms up over 10 steps); 0: no warmup."""
    data_order: Literal["reshuffle", "fixed", "with_replacement"] = added_field("reshuffle")
    """The order of the training examples in each pass over the training split, each
    member's from its own ``order_seed``: ``reshuffle``: a new permutation for every pass;
    ``fixed``: one permutation (the one ``reshuffle`` starts with), kept for every pass, as
    TensorFlow Playground passes over its points in the one order they were shuffled into
    when the data were made; ``with_replacement``: every batch is ``batch_size`` independent
    uniform draws from the whole split (numpy's ``Generator.choice(n, size=batch_size)``), as
    Li et al.'s SCAN code draws ``np.random.choice(len(train), size=batch_size)``; a pass
    (epoch) is then ``ceil(len(train) / batch_size)`` such batches. Not for a task that draws
    fresh samples (``fresh_samples``)."""
    compile: bool = False
    """Use a model's compiled fast path where it has one (costs a cold compile)."""
    eval_batch_size: int = Field(1024, ge=1)
    """Examples per evaluation chunk (on a CPU at most the model's ``eval_rows`` / K rows
    for a K-seed bundle, where its throughput peaks)."""
    predictions: bool = True
    """Write per-example predictions of the test splits (the ``predictions`` table)."""
    selection: SelectionConfig = SelectionConfig()
    """Model selection and early stopping."""

    @model_validator(mode="after")
    def _loss_rise_needs_epochs(self) -> TrainConfig:
        if self.lr_halving is not None and self.lr_halving.on_loss_rise is not None and self.max_steps is not None:
            raise ConfigError(
                "train.lr_halving.on_loss_rise", "compares the loss of one epoch with the previous one's, "
                "and this config trains by steps (max_steps)", "train by epochs (max_epochs), or leave it unset",
            )
        return self

    @model_validator(mode="after")
    def _momentum_is_sgds(self) -> TrainConfig:
        if self.momentum != 0 and self.optimizer != "sgd":
            raise ConfigError(
                "train.momentum", f"only SGD has a momentum, this config uses {self.optimizer}",
                "set optimizer: sgd, or leave momentum unset (Adam's are adam_betas)",
            )
        return self


@dataclass(frozen=True)
class RunSpec:
    """A resolved (task, model, training) config: what a trial trains."""

    task_name: str
    task: FrozenConfig
    model_name: str
    model: FrozenConfig
    train: TrainConfig

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": {"name": self.task_name, **self.task.model_dump(mode="json")},
            "model": {"name": self.model_name, **self.model.model_dump(mode="json")},
            "train": self.train.model_dump(mode="json"),
        }

    def make_task(self) -> Task:
        """The registered task, configured."""
        from trainables.registry import TASKS

        return TASKS.get(self.task_name)(self.task)

    def identity(self) -> dict[str, Any]:
        """What the ``trial_id`` hashes: :meth:`to_dict` less the fields added later that
        sit at their identity default (see :func:`trainables.configbase.added_field`)."""
        return {
            "task": {"name": self.task_name, **self.task.identity()},
            "model": {"name": self.model_name, **self.model.identity()},
            "train": self.train.identity(),
        }

    def trial_id(self, extra: dict[str, Any] | None = None) -> str:
        """Stable hash of the resolved config (plus ``extra``, e.g. seed derivation).

        Two configs with the same resolved values have the same id, whatever the defaults
        or fields of the fineline version that resolved them (the rule in configbase)."""
        payload = {**self.identity(), **(extra or {})}
        blob = json.dumps(payload, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RunSpec:
        """Validate a raw ``{task, model, train}`` dict; errors name the field and the fix."""
        from trainables.registry import MODELS, TASKS

        for block in ("task", "model"):
            if not isinstance(raw.get(block), dict) or "name" not in raw[block]:
                raise ConfigError(
                    f"{block}.name", f"missing {block} name",
                    f"add `{block}: {{name: ...}}`; valid: "
                    + ", ".join((TASKS if block == "task" else MODELS).names()),
                )
        task_raw = dict(raw["task"])
        model_raw = dict(raw["model"])
        task_cls = TASKS.get(task_raw.pop("name"))
        model_cls = MODELS.get(model_raw.pop("name"))
        if model_cls.data_kind != task_cls.data_kind:
            valid = [m.name for m in MODELS if m.data_kind == task_cls.data_kind]
            raise ConfigError(
                "model.name",
                f"model {model_cls.name!r} consumes {model_cls.data_kind!r} data but task "
                f"{task_cls.name!r} produces {task_cls.data_kind!r}",
                f"use a model for this task: {', '.join(valid)}",
            )
        task_cfg = validate(task_cls.Config, task_raw, "task")
        model_cfg = validate(model_cls.Config, model_raw, "model")
        train_cfg = validate(TrainConfig, dict(raw.get("train") or {}), "train")
        train_cfg = _resolve_reduction(train_cfg, model_cls)
        if train_cfg.data_order != "reshuffle":
            check_data_order(train_cfg, task_cls(task_cfg))
        spec = cls(task_cls.name, task_cfg, model_cls.name, model_cfg, train_cfg)
        spec = spec._resolve_selection(task_cls.primary_metric)
        spec.check_metrics()
        return spec

    def metrics(self) -> dict[str, Metric]:
        """Every metric a run of this spec scores, as declared (:mod:`trainables.metrics`):
        the model's (``loss`` first; its others are shares in [0, 1]), then the task's."""
        from trainables.registry import MODELS, TASKS

        model = MODELS.get(self.model_name).metric_names(self.model)
        own = {n: LOSS if n == "loss" else Metric(n) for n in model}
        return {**own, **TASKS.get(self.task_name).declared_metrics()}

    def metric_names(self) -> tuple[str, ...]:
        """The names of :meth:`metrics`, ``loss`` first."""
        return tuple(self.metrics())

    def _resolve_selection(self, primary: str) -> RunSpec:
        """``train.selection``'s unset metric and mode, resolved (see :class:`SelectionConfig`)."""
        sel = self.train.selection
        metrics = self.metrics()
        # mode last reads no metric: it stays accuracy, the default earlier trial_ids hashed
        metric = sel.metric or ("accuracy" if "accuracy" in metrics or sel.mode == "last" else primary)
        mode = sel.mode or (metrics[metric].mode if metric in metrics else "max")  # an unknown metric: refused next
        if (metric, mode) == (sel.metric, sel.mode):
            return self
        train = self.train.model_copy(update={"selection": sel.model_copy(update={"metric": metric, "mode": mode})})
        return dataclasses.replace(self, train=train)

    def check_metrics(self) -> None:
        """``train.selection.metric`` is one this spec scores, and ``mode`` keeps its best
        epoch, not its worst (ConfigError otherwise)."""
        sel = self.train.selection
        metrics = self.metrics()
        if sel.mode != "last" and sel.metric not in metrics:
            raise ConfigError(
                "train.selection.metric",
                f"{self.task_name} with {self.model_name} scores no metric {sel.metric!r}",
                f"use one of: {', '.join(metrics)}",
            )
        if sel.mode in ("max", "min") and sel.metric in metrics and sel.mode != metrics[str(sel.metric)].mode:
            m = metrics[str(sel.metric)]
            raise ConfigError(
                "train.selection.mode",
                f"{sel.mode} keeps the epoch where {sel.metric} is worst: {self.task_name} with {self.model_name} "
                f"declares that {m.better} {sel.metric} is better",
                f"use mode: {m.mode}, or leave mode unset (it follows the metric)",
            )

    def check_splits(self, roles: Mapping[str, str]) -> None:
        """The split names this spec uses exist with fitting roles (``roles``: split -> role,
        the task's). Selection never looks at a test split."""
        sel, train = self.train.selection, self.train
        valid = ", ".join(f"{n} ({r})" for n, r in roles.items())
        wanted = [("train.curve_splits", n) for n in train.curve_splits]
        if sel.mode != "last" or sel.split != "val":  # unused with mode last, but a name given is checked
            wanted.append(("train.selection.split", sel.split))
        rise = train.lr_halving.on_loss_rise if train.lr_halving is not None else None
        if rise is not None:
            wanted.append(("train.lr_halving.on_loss_rise", rise))
        for field_name, split in wanted:
            if split not in roles:
                raise ConfigError(
                    field_name, f"task {self.task_name!r} has no split {split!r}", f"use one of: {valid}"
                )
        if sel.mode != "last" and roles[sel.split] not in ("val", "val_ood"):
            choices = ", ".join(n for n, r in roles.items() if r in ("val", "val_ood"))
            raise ConfigError(
                "train.selection.split",
                f"split {sel.split!r} has role {roles[sel.split]!r}: selecting on it would leak it",
                f"select on a val or val_ood split: {choices or '(the task has none; use mode: last)'}",
            )
        if rise is not None and roles[rise] not in ("val", "val_ood"):
            choices = ", ".join(n for n, r in roles.items() if r in ("val", "val_ood"))
            raise ConfigError(
                "train.lr_halving.on_loss_rise", f"split {rise!r} has role {roles[rise]!r}: training on "
                "its loss would leak it", f"use a val or val_ood split: {choices or '(the task has none)'}",
            )


def check_data_order(train: TrainConfig, task: Task) -> None:
    """``data_order: fixed`` or ``with_replacement`` needs a fixed training split to order
    or draw from (ConfigError otherwise)."""
    if train.data_order != "reshuffle" and task.fresh_samples:
        what = "whose order could be kept" if train.data_order == "fixed" else "to draw batches from"
        raise ConfigError(
            "train.data_order",
            f"task {task.name!r} draws fresh training samples every step: there is no fixed "
            f"training split {what}",
            "set the task's fresh_samples: false (if it has that option), or leave data_order "
            "unset (reshuffle)",
        )


def check_batch_size(train: TrainConfig, task: Task, n_train: int) -> None:
    """A batch drawn from the training split's shuffles holds each example at most once:
    ``batch_size`` larger than the split would fill it from the next shuffle, repeating
    examples without a word (e.g. a full-batch grokking study whose ``task.train_fraction``
    was lowered but not its batch size). ``with_replacement`` draws, and fresh samples, are
    free of that (ConfigError otherwise)."""
    if task.fresh_samples or train.data_order == "with_replacement" or train.batch_size <= n_train:
        return
    raise ConfigError(
        "train.batch_size",
        f"{train.batch_size} is larger than the training split ({n_train} examples): a batch would "
        "hold some examples twice",
        f"set train.batch_size to at most {n_train} ({n_train} is full batch), or "
        "train.data_order: with_replacement",
    )


def _resolve_reduction(train: TrainConfig, model_cls: type[Model]) -> TrainConfig:
    """``loss_reduction`` checked against the model's ``reductions``; unset -> its default."""
    allowed = tuple(model_cls.reductions)
    if train.loss_reduction is None:
        return train.model_copy(update={"loss_reduction": allowed[0]})
    if train.loss_reduction not in allowed:
        raise ConfigError(
            "train.loss_reduction",
            f"model {model_cls.name!r} has no loss reduction {train.loss_reduction!r}",
            f"use one of: {', '.join(allowed)} (or leave it unset for {allowed[0]!r})",
        )
    return train


def validate(schema: type[FrozenConfig], raw: dict[str, Any], prefix: str) -> Any:
    """Validate ``raw`` against ``schema``; the first problem becomes a ConfigError."""
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        raise config_error(exc, prefix, schema) from None


_UNION_TAGS = {"int", "float", "str", "bool", "none", "list", "tuple", "dict"}


def _field_loc(loc: tuple[Any, ...] | list[Any]) -> tuple[Any, ...]:
    """A pydantic error location without the tags of union members (``constrained-int``,
    ``literal['auto']``): what is left names the field as a study file writes it."""
    return tuple(
        p for p in loc
        if not (isinstance(p, str) and (p in _UNION_TAGS or "[" in p or "-" in p))
    )


BOUNDS = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"),
          "less_than_equal": ("<=", "le"), "less_than": ("<", "lt")}
"""Pydantic's range errors: the comparison a fix asks for, and its ``ctx`` key."""


def _field(schema: type[FrozenConfig], loc: tuple[Any, ...]) -> Any:
    """The pydantic ``FieldInfo`` a location names, through nested config blocks (None when
    the location leaves the schema, e.g. a plugin's free-form mapping)."""
    info = None
    for part in loc:
        fields = getattr(schema, "model_fields", None)
        if not isinstance(part, str) or fields is None or part not in fields:
            return info if isinstance(part, int) else None
        info = fields[part]
        schema = info.annotation
    return info


def _fixed_tuple(info: Any) -> str | None:
    """For a fixed-length tuple field (``tuple[float, float]``), the fix that says how many
    values it takes, with its default as the example; None for any other field."""
    annotation = getattr(info, "annotation", None)
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is not tuple or not args or ... in args:
        return None
    example = info.default if isinstance(info.default, tuple) else ("a",) * len(args)
    return f"write {len(args)} values in a list, e.g. [{', '.join(str(v) for v in example)}]"


def _fix(err: Any, info: Any) -> str:
    """What to write instead, for one pydantic error of a field (``info``: its FieldInfo)."""
    kind, got, ctx = err["type"], err.get("input"), err.get("ctx", {})
    if kind in ("tuple_type", "too_long", "too_short", "missing") and (tuple_fix := _fixed_tuple(info)):
        return tuple_fix
    if kind == "finite_number":
        return "give a finite number (.inf and .nan are not allowed)"
    if kind == "bool_not_number":
        return "write a number or a name (true / false are not numbers)"
    if kind in ("bool_parsing", "bool_type"):
        return "write true or false"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return "write a block of `field: value` lines there (see configs/quickstart.yaml)"
    if kind in BOUNDS and BOUNDS[kind][1] in ctx:  # the bound, not the message again
        op, key = BOUNDS[kind]
        return f"use a value {op} {ctx[key]}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return "write a whole number there, e.g. 8"
    if kind in ("float_parsing", "float_type"):
        return "write a number there, e.g. 0.05 or 1e-3"
    if kind in ("tuple_type", "list_type", "set_type") and not isinstance(got, (list, tuple)):
        return f"write a list, e.g. [{got}]" if isinstance(got, (str, int, float)) else "write a list, e.g. [a, b]"
    if kind in ("too_long", "too_short") and "max_length" in ctx:
        return f"give at most {ctx['max_length']} items, not {ctx['actual_length']}"
    if kind in ("too_long", "too_short") and "min_length" in ctx:
        return f"give at least {ctx['min_length']} items, not {ctx['actual_length']}"
    if kind == "literal_error" and "expected" in ctx:
        return f"write {ctx['expected']}" if "," not in ctx["expected"] else f"use one of {ctx['expected']}"
    if "expected" in ctx:
        return f"use one of {ctx['expected']}"
    return err["msg"][0].lower() + err["msg"][1:]


def config_error(exc: ValidationError, prefix: str, schema: type[FrozenConfig]) -> ConfigError:
    errors = exc.errors()
    err = errors[0]
    where = _field_loc(err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        loc = ".".join(str(p) for p in (prefix, *where) if p != "")
        block = _field(schema, where[:-1]) if len(where) > 1 else None  # a nested block's own fields
        fields = getattr(block.annotation, "model_fields", None) if block is not None else schema.model_fields
        return ConfigError(loc, "unknown field", f"remove it or use one of: {', '.join(fields or ())}"
                           if fields else "remove it")
    info = _field(schema, where)
    if kind == "missing" and where and isinstance(where[-1], int) and _fixed_tuple(info):
        where = where[:-1]  # adam_betas.1 missing: the list is short
    loc = ".".join(str(p) for p in (prefix, *where) if p != "")
    if kind == "missing" and not _fixed_tuple(info):
        return ConfigError(loc, "required field missing", "add it to the config")
    if kind == "missing":
        return ConfigError(loc, "too few values", _fix(err, info))
    alternatives = [e for e in errors if _field_loc(e["loc"]) == _field_loc(err["loc"])]
    if len(alternatives) > 1 and tuple(err["loc"]) != tuple(_field_loc(err["loc"])):
        # a union (e.g. an integer or "auto"): say what each alternative wants
        fix = "; or ".join(dict.fromkeys(_fix(e, info) for e in alternatives))
    else:
        fix = _fix(err, info)
    return ConfigError(loc, f"invalid value {err.get('input')!r} ({err['msg']})", fix)
