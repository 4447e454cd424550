"""A plugin pair's dress rehearsal on the driver, before Ray starts.

A plugin's task and model run for the first time inside Ray workers, where a mistake
(a forward of the wrong shape, labels out of range, a ``score()`` that raises, a random
draw that ignores the seed) fails every trial with a worker traceback, retried, or worse,
runs and stores results that are wrong. :func:`rehearse` runs each pair once on a few
examples first, the same code path a trial takes, so such a mistake is one error naming
the pair, the stage, the exception and the plugin's own line:

1. the task's data (built and checked once per plugin task config by the caller:
   :func:`check_task_data`, lengths, finite values, whole-number labels inside ``0 ..
   n_classes - 1`` where a classification task's ``meta`` declares ``n_classes``);
2. a bundle of two seeds on the first :data:`ROWS` examples of every split: one optimizer
   step, one evaluation round, then every split scored (:meth:`BundleRun.finalize`);
3. every metric it produced declared (``Task.metrics``, ``Model.metric_names``);
4. a plain ``nn.Module``'s buffers unchanged by training (running statistics would be one
   state shared by the bundle);
5. the same again from the same seeds gives bit-identical losses, parameters and metrics
   (nothing draws from Python's, NumPy's or torch's global generators).

fineline's own pairs are not rehearsed: the contract suite (:mod:`trainables.testing`)
runs them in fineline's CI. A plugin's contract suite checks much more (bundle
equivalence over 200 steps, compaction, checkpoints); the rehearsal is its smallest part,
run at every study start because nobody can tell whether the plugin ran its suite.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors  # the factories torch.device(...) redirects

from trainables.data import Arrays, Split, TaskData, head
from trainables.errors import ConfigError, FinelineError
from trainables.loop import BundleRun
from trainables.metrics import check_values
from trainables.plugins import plugin_frame
from trainables.registry import MODELS, TASKS
from trainables.seeding import derive_seedset
from trainables.spec import RunSpec
from trainables.tasks.base import Task

ROWS = 8
"""Examples of each split the rehearsal uses (the training batch is at most this)."""

def is_builtin(cls: type) -> bool:
    """True for fineline's own tasks and models (their module lives in ``trainables``)."""
    return cls.__module__.split(".")[0] == "trainables"


def needs_rehearsal(spec: RunSpec) -> bool:
    """A pair is rehearsed where its task or its model is a plugin's."""
    return not (is_builtin(TASKS.get(spec.task_name)) and is_builtin(MODELS.get(spec.model_name)))


def _user_frame(exc: BaseException, spec: RunSpec) -> traceback.FrameSummary | None:
    """The innermost frame of ``exc`` in the pair's plugin code (:func:`plugin_frame`)."""
    classes = (TASKS.get(spec.task_name), MODELS.get(spec.model_name))
    return plugin_frame(exc, [c.__module__.split(".")[0] for c in classes if not is_builtin(c)])


@contextlib.contextmanager
def blame(spec: RunSpec, stage: str, field: str = "model") -> Iterator[None]:
    """Turn an exception raised in plugin code during ``stage`` into one ConfigError naming
    the pair, the stage, the exception and the plugin's line (fineline's own errors pass
    through unchanged). ``field`` is the block blamed unless the failing line is in the
    task's or the model's module. For a pair of fineline's own, an exception is a bug in
    fineline and keeps its traceback."""
    if not needs_rehearsal(spec):
        yield
        return
    try:
        yield
    except FinelineError:
        raise
    except (KeyboardInterrupt, SystemExit):
        raise
    except (MemoryError, RuntimeError) as exc:
        if isinstance(exc, MemoryError) or "allocate" in str(exc) or "Storage size" in str(exc):
            raise ConfigError(
                "model", f"model {spec.model_name!r} cannot be built for two seeds on this machine: "
                f"{_first_line(exc)}", "lower its sizes (the model block's widths / layers)",
            ) from None
        raise _refusal(spec, stage, field, exc) from None
    except Exception as exc:
        raise _refusal(spec, stage, field, exc) from None


def _refusal(spec: RunSpec, stage: str, field: str, exc: BaseException) -> ConfigError:
    frame = _user_frame(exc, spec)
    where = ""
    if frame is not None:
        where = f" (at {frame.filename}:{frame.lineno}, in {frame.name})"
        for block, cls in (("task", TASKS.get(spec.task_name)), ("model", MODELS.get(spec.model_name))):
            if _defines(cls, frame):
                field = block
    fix = (
        "check the file or folder it names (the task's fields: `study plugins STUDY.yaml --fields`)"
        if isinstance(exc, OSError) else
        "fix the code at that line; the plugin's contract suite runs the pair in full "
        f"(`contract_suite(tasks=[{spec.task_name!r}], models=[{spec.model_name!r}])`, docs/plugins.md)"
    )
    return ConfigError(
        field,
        f"task {spec.task_name!r} with model {spec.model_name!r}: {stage} fails with "
        f"{type(exc).__name__}: {_first_line(exc)}{where}",
        fix,
    )


def _defines(cls: type, frame: traceback.FrameSummary) -> bool:
    """True if ``frame``'s line lies in the source of ``cls``."""
    try:
        lines, start = inspect.getsourcelines(cls)
        file = inspect.getsourcefile(cls)
    except (OSError, TypeError):
        return False
    return file is not None and Path(file).resolve() == Path(frame.filename).resolve() and (
        start <= (frame.lineno or 0) < start + len(lines)
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:240]


class MetaShapes(TorchFunctionMode):
    """Build on torch's ``meta`` device (shapes only, nothing allocated): tensor factories
    without a device make meta tensors, and in-place initialisers (``normal_``,
    ``uniform_``, ...) on meta tensors are skipped. ``with torch.device("meta")`` computes
    the same shapes, but torch's meta ``normal_`` imports ``torch._dynamo`` first, about a
    second at every study start."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func in _device_constructors() and kwargs.get("device") is None:
            kwargs["device"] = "meta"
        target = args[0] if args else next(iter(kwargs.values()), None)  # torch.nn.init passes tensor=
        if getattr(func, "__name__", "") in _INITIALISERS and isinstance(target, torch.Tensor) and target.is_meta:
            return target  # values only: the shape stays
        return func(*args, **kwargs)


_INITIALISERS = frozenset({
    "normal_", "uniform_", "trunc_normal_", "bernoulli_", "exponential_", "geometric_", "log_normal_",
    "cauchy_", "random_", "fill_", "zero_", "copy_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
    "orthogonal_", "sparse_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_",
})
"""In-place ops (tensor methods and ``torch.nn.init`` functions) that set values only."""


def seed_bytes(spec: RunSpec, meta: dict[str, Any]) -> tuple[int, int]:
    """``(parameters, bytes)`` one seed of ``spec`` holds in training, counted on torch's
    ``meta`` device (nothing allocated, so a model far too large for the machine is measured,
    not built): its parameters and buffers, their gradients, the optimizer's state (Adam:
    two moments; SGD with momentum: one) and the selected state a run keeps. Activations come
    on top. The model's own refusals (a size its task cannot take) are raised as they are."""
    model_cls = MODELS.get(spec.model_name)
    with MetaShapes():
        model = model_cls(spec.model, meta, 1)
    params = sum(p.numel() for p in model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    states = {"adam": 2, "adamw": 2}.get(spec.train.optimizer, 1 if spec.train.momentum else 0)
    return params, param_bytes * (3 + states) + buffer_bytes * 2


def check_task_data(spec: RunSpec, data: TaskData) -> None:
    """A plugin task's data is well formed, each mistake one error naming the split: inputs,
    labels and ids of one length (a ``classify`` split, ``Arrays``); every float value finite
    (a NaN or inf would train as NaN and stop no run: one NaN also made two builds of the same
    data differ, blamed on seeding); ``classify`` labels whole numbers (a float label of 0.5
    was cast to class 0 without a word) inside ``0 .. meta['n_classes'] - 1``; ``regress``
    targets numbers."""
    for name, split in data.splits.items():
        d = split.data
        if isinstance(d, Arrays):
            lengths = {"inputs x": len(d.x), "labels y": len(d.y), "ids": len(d.ids)}
            if len(set(lengths.values())) > 1:
                raise ConfigError(
                    "task", f"task {spec.task_name!r}: split {name!r} has "
                    + ", ".join(f"{n} {what}" for what, n in lengths.items()),
                    "give every example one input, one label and one id (Arrays(x, y, ids) of one length)",
                )
            _check_finite(spec, name, "inputs x", d.x)
            _check_finite(spec, name, "labels y", d.y)
        else:  # sequences: one array per example
            for f in ("src", "tgt", "x", "y"):
                seqs = getattr(d, f, None)
                if seqs and np.asarray(seqs[0]).dtype.kind in "fc":
                    finite = np.array([np.isfinite(a).all() for a in seqs])
                    if not finite.all():
                        _not_finite(spec, name, f, np.flatnonzero(~finite), len(seqs))
        classify = _data_kind(spec) == "classify"
        if classify and isinstance(d, Arrays) and d.y.dtype.kind == "f" and len(d.y) and not np.array_equal(d.y, np.round(d.y)):
            frac = np.unique(d.y[d.y != np.round(d.y)])
            raise ConfigError(
                "task", f"task {spec.task_name!r}: split {name!r} has labels y that are not whole numbers "
                f"({frac[:5].tolist()}): a classify task's labels are class indices",
                "build y as int64 class indices 0..n_classes-1, or make it a regression task "
                "(data_kind = \"regress\", real targets; model mlp_regressor or a PlainRegressor of your own)",
            )
        if isinstance(d, Arrays) and not classify and d.y.dtype.kind not in "fiu":
            raise ConfigError("task", f"task {spec.task_name!r}: split {name!r} has targets y of dtype {d.y.dtype}",
                              "give a regress task real-valued targets (N,) or (N, d), float32")
    check_labels(spec, data)


def _data_kind(spec: RunSpec) -> str:
    return str(TASKS.get(spec.task_name).data_kind)


def _check_finite(spec: RunSpec, split: str, what: str, values: np.ndarray) -> None:
    """Every value of a float array (one row per example) finite, else :func:`_not_finite`."""
    arr = np.asarray(values)
    if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
        _not_finite(spec, split, what, np.flatnonzero(~np.isfinite(arr.reshape(len(arr), -1)).all(axis=1)), len(arr))


def _not_finite(spec: RunSpec, split: str, what: str, rows: np.ndarray, n: int) -> None:
    """One error naming the split, what holds a NaN or inf, and the first examples that do."""
    more = ", ..." if rows.size > 5 else ""
    raise ConfigError(
        "task", f"task {spec.task_name!r}: split {split!r} has NaN or infinite {what} (examples "
        f"{rows[:5].tolist()}{more} of {n})",
        "fix the task's build() so every value is finite (give a missing value a number, or leave "
        "the example out)",
    )


def check_labels(spec: RunSpec, data: TaskData) -> None:
    """A classification task's labels lie in ``0 .. meta['n_classes'] - 1``."""
    n = data.meta.get("n_classes")
    if n is None:
        return
    for name, split in data.splits.items():
        if not isinstance(split.data, Arrays) or not len(split.data):
            continue
        y = np.asarray(split.data.y)
        bad = np.unique(y[(y < 0) | (y >= int(n))])
        if bad.size:
            raise ConfigError(
                "task", f"task {spec.task_name!r}: split {name!r} has labels {bad[:5].tolist()} outside "
                f"0..{int(n) - 1} (its meta n_classes is {n})",
                "labels are class indices 0..n_classes-1: fix the task's build, or its meta['n_classes']",
            )


def check_data_seeded(spec: RunSpec, task: Task, data: TaskData) -> None:
    """A plugin task's ``build(0)`` gives the same data again (``data`` is the first build,
    checked by :func:`check_task_data`): a task that draws from an unseeded generator would
    give every trial other data."""
    with blame(spec, "building the task's data again (data seed 0)", "task"):
        again = task.build(0)
    for name, split in data.splits.items():
        other = again.splits.get(name)
        if other is None or not _same_data(split.data, other.data):
            raise ConfigError(
                "task",
                f"task {spec.task_name!r}: two builds with data seed 0 give different data (split {name!r}): "
                "it draws from a generator that is not seeded by its data_seed",
                "draw every random number of build() from np.random.default_rng(data_seed) (or a "
                "generator seeded from it)",
            )


def _same_data(a: Any, b: Any) -> bool:
    if type(a) is not type(b) or len(a) != len(b):
        return False
    fields = ("x", "y", "ids") if isinstance(a, Arrays) else tuple(
        f for f in ("src", "tgt", "x", "y", "ids") if hasattr(a, f)
    )
    for f in fields:
        u, v = getattr(a, f), getattr(b, f)
        if isinstance(u, np.ndarray):
            if not np.array_equal(u, v):
                return False
        elif not all(np.array_equal(p, q) for p, q in zip(u, v, strict=True)):
            return False
    return True


def rehearse(spec: RunSpec, task: Task, data: TaskData) -> None:
    """Run ``spec`` (a plugin pair) on the first :data:`ROWS` examples of ``data`` (the task's
    data for data seed 0, already checked by :func:`check_task_data` where the task is a
    plugin's), twice; see the module doc. Raises one ConfigError on a mistake."""
    small = TaskData(
        splits={n: Split(n, s.role, head(s.data, ROWS)) for n, s in data.splits.items()}, meta=data.meta
    )
    raw = spec.to_dict()
    n_train = len(small.train)
    raw["train"].update(max_steps=1, eval_every_steps=1, max_epochs=1, snapshot_epochs=[], lr_halving=None,
                        batch_size=max(1, min(spec.train.batch_size, n_train)),
                        eval_batch_size=ROWS)
    short = RunSpec.from_dict(raw)
    first = _run(short, task, small)
    second = _run(short, task, small)
    _check_metrics(spec, first["rows"])
    for what in ("losses", "params", "rows"):
        if not _same(first[what], second[what]):
            raise ConfigError(
                "model",
                f"task {spec.task_name!r} with model {spec.model_name!r}: two runs from the same seeds "
                f"give different {_WHAT[what]}: something draws random numbers from a generator that is "
                "not the seed's (Python's `random`, NumPy's `np.random`, torch's global generator)",
                "draw dropout with trainables.models.plain.Dropout(p) and other noise from the "
                "member's streams (docs/plugins.md, 'Randomness' in section 4); a task draws only from its data_seed",
            )


_WHAT = {"losses": "training losses", "params": "parameters after one step", "rows": "metrics"}


def _run(spec: RunSpec, task: Task, data: TaskData) -> dict[str, Any]:
    seeds = [derive_seedset(0, 0), derive_seedset(0, 1)]
    with blame(spec, "building the model for two seeds"):
        run = BundleRun(spec, seeds, task, data)
    buffers = {n: b.detach().clone() for n, b in run.model.named_buffers()}
    losses: list[float] = []
    with blame(spec, "the first training step (and its evaluation round)"):
        run.train_round()
        losses = [r["value"] for m in run.members for r in m.metrics if r["metric"] == "objective"]
    _check_buffers(spec, run, buffers)
    params = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    with blame(spec, "evaluating and scoring every split"):
        rows = run.finalize()
    evals = sorted((r["seed"], r["split"], r["metric"], r["value"]) for member in rows for r in member["evals"])
    return {"losses": losses, "params": params, "rows": evals}


def _check_buffers(spec: RunSpec, run: BundleRun, before: dict[str, torch.Tensor]) -> None:
    from trainables.models.plain import PlainModel

    if not isinstance(run.model, PlainModel):
        return  # a hand-bundled model keeps each member's state in its own rows
    for name, buf in run.model.named_buffers():
        if name in before and not torch.equal(before[name], buf.detach()):
            raise ConfigError(
                "model",
                f"model {spec.model_name!r}: buffer {name.removeprefix('net.')!r} changes in a training step "
                "(running statistics, as BatchNorm keeps): a plain module's buffers are not trained per "
                "seed, so a seed's result would depend on its bundle",
                "use a normalisation without running statistics (nn.LayerNorm, nn.GroupNorm), or keep "
                "the state as an output rather than a buffer",
            )


def _check_metrics(spec: RunSpec, rows: list[tuple[Any, ...]]) -> None:
    """Every metric the rehearsal's evaluation gave (``rows``: ``(_, split, metric, value)``) is
    declared, and its values keep to the declared range (``mse`` left as a bare name, a share,
    would make the analysis call the larger error better)."""
    declared = spec.metrics()
    extra = sorted({metric for _, _, metric, _ in rows} - set(declared))
    if extra:
        raise ConfigError(
            "task",
            f"task {spec.task_name!r} with model {spec.model_name!r} produces metrics {extra} that are "
            f"not declared (declared: {sorted(declared)})",
            "add them to the task's `metrics` (or the model's metric_names), or stop returning them from score()",
        )
    for _, split, metric, value in rows:
        problem = check_values(declared, metric, np.array([value]), f"task {spec.task_name!r} on split {split!r}")
        if problem is not None:
            bad, _, fix = problem.partition(". Fix: ")
            raise ConfigError("task", bad, fix)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))


def _equal(x: Any, y: Any) -> bool:
    if isinstance(x, tuple):
        return all(_equal(p, q) for p, q in zip(x, y, strict=True))
    if isinstance(x, float) and math.isnan(x):
        return isinstance(y, float) and math.isnan(y)
    return bool(x == y)
