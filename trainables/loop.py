"""The bundled training loop: K seeds of one config trained as one computation.

:class:`BundleRun` owns one bundle: the model (K stacked replicas), the optimizer, each
member's data order and dropout stream, and each member's early-stopping state. One
call to :meth:`BundleRun.train_round` runs one *round*: an epoch (epoch-based training)
or ``eval_every_steps`` optimizer steps (step-based training), then evaluates the curve
splits and applies the selection rule per member. A member that stopped (or diverged)
is masked out of the loss; its selected parameters were saved when selected, and its
current parameters are never read again, so the others go on exactly as lone runs.
With the generic step (no fused step) stopped members are also dropped from the
computation at the end of a round (*compaction*: ``slots`` maps the model's rows to
members), so a bundle costs what its running members cost; :meth:`BundleRun.finalize`
rebuilds every member from its selected parameters.

Members may differ in the per-member hyperparameters of :mod:`trainables.optim` (learning
rate, weight decay, momentum, Adam's betas, clip norm, the model's dropout): ``member_specs``
gives each member's own resolved config, and member k then computes what a lone run of
``member_specs[k]`` computes (how tuning puts candidates x seeds in one bundle). Without it
every member has ``spec``'s values. The optimizer is always fineline's bundled one
(:func:`trainables.optim.make_optimizer`), bitwise torch.optim's while the members share
their values.

Nothing here knows about Ray: the Ray Tune trainable (``trainables.trainable``) drives a
BundleRun and checkpoints it with :meth:`state_dict`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from trainables.data import Arrays, SeqPairs, SeqTags, Split, SplitData, TaskData, TokenRows
from trainables.errors import ConfigError
from trainables.graphs import CapturedEval, CapturedLoss, loss_backward
from trainables.models.base import MemberNoise, Model
from trainables.models.counter_noise import CounterNoise
from trainables.optim import (
    BundledOptimizer,
    MemberHparams,
    bundle_hparams,
    clip_grad_norms_,
    make_optimizer,
)
from trainables.registry import MODELS
from trainables.runtime import to_device
from trainables.schedules import lr_factor
from trainables.seeding import SeedSet, numpy_rng, torch_generator
from trainables.spec import RunSpec, check_batch_size, check_data_order
from trainables.tasks.base import Task

Rows = list[dict[str, Any]]


@dataclass
class Member:
    """Bookkeeping for one seed of a bundle."""

    seeds: SeedSet
    status: str = "running"
    """running | stopped | diverged (a committed run's status is ok, diverged or not_learned:
    see :meth:`BundleRun.learned`)"""
    best_value: float | None = None
    best_epoch: int | None = None
    best_step: int | None = None
    best_params: dict[str, torch.Tensor] | None = None
    bad_rounds: int = 0
    rounds_run: int = 0
    metrics: Rows = field(default_factory=list)
    halving_from: int | None = None
    """Epochs done when ``lr_halving.on_loss_rise``'s loss first rose (its halving starts then)."""
    last_rise_loss: float | None = None
    """That loss after the previous epoch."""

    @property
    def active(self) -> bool:
        return self.status == "running"


@dataclass
class Evaluation:
    """Per-member results on one split: metric means, per-example scores and predictions."""

    means: list[dict[str, float]]
    """K dicts metric -> value (``loss`` included)."""
    per_example: list[dict[str, np.ndarray]]
    predictions: list[Sequence[Any]]


def build_model(
    spec: RunSpec, data: TaskData, seeds: Sequence[SeedSet], dropout: Sequence[float] | None = None
) -> Model:
    """The K-member model, each member initialised from its own ``init_seed``; ``dropout``:
    each member's own dropout probability (:meth:`Model.set_member_dropout`), if they differ
    from ``spec``'s."""
    model_cls = MODELS.get(spec.model_name)
    model = model_cls(spec.model, data.meta, len(seeds))
    if dropout is not None:
        model.set_member_dropout(dropout)
    for k, s in enumerate(seeds):
        model.init_member(k, torch_generator(s.init_seed))
    return model


def _lengths(data: SplitData) -> np.ndarray:
    if isinstance(data, SeqPairs):
        return np.fromiter((len(s) for s in data.src), dtype=np.int64, count=len(data))
    if isinstance(data, SeqTags):
        return np.fromiter((len(s) for s in data.x), dtype=np.int64, count=len(data))
    return np.zeros(len(data), dtype=np.int64)


def concat_arrays(parts: Sequence[Arrays]) -> Arrays:
    return Arrays(
        x=np.concatenate([p.x for p in parts]),
        y=np.concatenate([p.y for p in parts]),
        ids=np.concatenate([p.ids for p in parts]),
    )


class BundleRun:
    """Train K seeds of one :class:`RunSpec` as one vectorised computation.

    ``member_specs`` (one per seed): each member's own config, which may differ from
    ``spec`` only in the per-member hyperparameters (:data:`trainables.optim.PER_MEMBER`;
    ConfigError otherwise); None: every member trains ``spec``."""

    def __init__(
        self,
        spec: RunSpec,
        seeds: Sequence[SeedSet],
        task: Task,
        data: TaskData,
        device: torch.device | str = "cpu",
        member_specs: Sequence[RunSpec] | None = None,
        cuda_graphs: bool = False,
    ) -> None:
        data_seeds = {s.data_seed for s in seeds}
        if len(data_seeds) != 1:
            raise ValueError("a bundle's members must share one data_seed (one dataset)")
        if member_specs is not None and len(member_specs) != len(seeds):
            raise ValueError(f"{len(member_specs)} member specs for {len(seeds)} seeds")
        self.spec = spec
        self.member_specs = list(member_specs) if member_specs is not None else [spec] * len(seeds)
        """Each member's own config (what its results belong to)."""
        self.hparams = (
            bundle_hparams(spec, self.member_specs) if member_specs is not None else MemberHparams.of(self.member_specs)
        )
        """The per-member hyperparameters of the model's rows (compacted with them)."""
        rates = self.hparams.dropout
        if rates is not None and "dropout" in self.hparams.shared and rates[0] == getattr(spec.model, "dropout", None):
            rates = None  # the model's own dropout for every member
        self.member_dropout = rates
        """Each member's dropout probability where they are not all ``spec``'s (else None)."""
        self.train_cfg = spec.train
        self.task = task
        self.data = data
        self.device = torch.device(device)
        self.k = len(seeds)
        """Rows of the model now (members still computed); ``len(members)`` is the bundle."""
        self.slots = list(range(self.k))
        """``slots[row]``: the member whose parameters sit in model row ``row``."""
        self.members = [Member(s) for s in seeds]
        self.model = build_model(spec, data, seeds, rates).to(self.device)
        noise_kind = CounterNoise if cuda_graphs else MemberNoise
        self.noise = noise_kind([s.dropout_seed for s in seeds], self.device, rates)
        """Dropout streams: per-member generators, or with ``cuda_graphs`` (on every device,
        so CPU and GPU draw the same masks) the counter-based ones a graph can replay."""
        self.order_rngs = [numpy_rng(s.order_seed) for s in seeds]
        make_fused: Callable[[Any, Any], Any] | None = getattr(type(self.model), "make_fused_step", None)
        self.fused = make_fused(self.model, self.train_cfg) if make_fused is not None else None
        if self.fused is not None and member_specs is not None:
            take = getattr(self.fused, "use_member_hparams", None)
            if take is None or not take(self.hparams):
                self.fused = None  # a fused step without these values: the generic step
        self.rise_split = spec.train.lr_halving.on_loss_rise if spec.train.lr_halving is not None else None
        """``train.lr_halving.on_loss_rise``: members' learning rates may then differ."""
        if self.rise_split is not None:
            self.fused = None  # a fused step has one learning rate for every member
        self.optimizer = self._optimizer() if self.fused is None else None
        self.captured: CapturedLoss | None = None
        """The training loss as CUDA graphs (``execution.cuda_graphs`` on a GPU, generic step)."""
        if cuda_graphs and self.device.type == "cuda" and self.fused is None:
            assert spec.train.loss_reduction is not None
            self.captured = CapturedLoss(self.model, self.noise, spec.train.loss_reduction)
        self.cuda_graphs = cuda_graphs
        self.captured_eval: CapturedEval | None = self._captured_eval()
        """Evaluation batches as CUDA graphs (``execution.cuda_graphs`` on a GPU, for a model
        that :attr:`~trainables.models.base.Model.captures_evaluation`)."""
        self.train_split = data.train
        self.n_train = len(self.train_split)
        check_data_order(self.train_cfg, task)
        check_batch_size(self.train_cfg, task, self.n_train)
        self.fixed_orders: list[np.ndarray] | None = None
        """With ``train.data_order: fixed``, each member's one order of the training split:
        the first permutation of its order stream (what ``reshuffle`` starts with)."""
        if self.train_cfg.data_order == "fixed":
            self.fixed_orders = [numpy_rng(s.order_seed).permutation(self.n_train) for s in seeds]
        self.step_based = self.train_cfg.max_steps is not None or task.fresh_samples
        if self.step_based and self.rise_split is not None:
            raise ConfigError(
                "train.lr_halving.on_loss_rise", f"task {task.name!r} draws fresh samples every step: there "
                "are no epochs whose losses it could compare", "leave it unset",
            )
        self.epoch = 0
        self.step = 0
        self.rounds = 0
        self.streams: list[tuple[np.ndarray, int]] = [(np.empty(0, np.int64), 0)] * len(self.members)
        self.wall_s = 0.0
        """Seconds in :meth:`train_round` (training steps and the rounds' evaluations)."""
        self.eval_s = 0.0
        """Of :attr:`wall_s`, the seconds in the rounds' evaluations (curves, selection)."""
        self.final_eval_s = 0.0
        """Seconds in :meth:`finalize`'s evaluation of every split."""
        self.last_eval: dict[str, list[dict[str, float]]] = {}
        self._check_splits()

    # ----------------------------------------------------------------- setup
    def _check_splits(self) -> None:
        self.spec.check_splits({name: split.role for name, split in self.data.splits.items()})

    def _captured_eval(self) -> CapturedEval | None:
        """Graphs for this model's evaluation batches, where they can be captured."""
        if self.cuda_graphs and self.device.type == "cuda" and type(self.model).captures_evaluation:
            return CapturedEval(self.model)
        return None

    def _optimizer(self) -> BundledOptimizer:
        return make_optimizer(self.model.parameters(), self.train_cfg, self.hparams)

    @property
    def done(self) -> bool:
        if not any(m.active for m in self.members):
            return True
        if self.step_based:
            return self.train_cfg.max_steps is not None and self.step >= self.train_cfg.max_steps
        return self.epoch >= self.train_cfg.max_epochs

    def _active_mask(self) -> torch.Tensor:
        return to_device(torch.tensor([self.members[m].active for m in self.slots]), self.device)

    # ----------------------------------------------------------------- training
    def _next_rows(self, k: int, b: int) -> np.ndarray:
        """Member k's next ``b`` training rows from its own endless shuffled stream, or with
        ``train.data_order: with_replacement`` ``b`` uniform draws from its order stream (its
        state is checkpointed: a resumed run draws on where it stopped)."""
        if self.train_cfg.data_order == "with_replacement":
            return self.order_rngs[k].choice(self.n_train, size=b)
        perm, pos = self.streams[k]
        out: list[np.ndarray] = []
        need = b
        while need > 0:
            if pos >= len(perm):
                perm, pos = self._pass_order(k), 0
            take = perm[pos : pos + need]
            out.append(take)
            pos += len(take)
            need -= len(take)
        self.streams[k] = (perm, pos)
        return np.concatenate(out)

    def _pass_order(self, member: int) -> np.ndarray:
        """Member ``member``'s order of the training split for its next pass: a new
        permutation from its order stream, or its one order (``train.data_order: fixed``)."""
        if self.fixed_orders is not None:
            return self.fixed_orders[member]
        return self.order_rngs[member].permutation(self.n_train)

    def _train_batch(self) -> tuple[SplitData, list[np.ndarray]]:
        b = self.train_cfg.batch_size
        if self.task.fresh_samples:
            parts = [self.task.sample_train(self.data, self.order_rngs[m], b) for m in self.slots]
            assert all(isinstance(p, Arrays) for p in parts)
            data = concat_arrays(parts)  # type: ignore[arg-type]
            return data, [np.arange(k * b, (k + 1) * b) for k in range(self.k)]
        return self.train_split.data, [self._next_rows(m, b) for m in self.slots]

    def _set_lr(self) -> None:
        cfg = self.train_cfg
        sched = cfg.lr_halving
        if sched is None and cfg.lr_schedule == "constant" and cfg.warmup_steps == 0:
            return
        steps_per_epoch = max(1, math.ceil(self.n_train / self.train_cfg.batch_size))
        epoch_f = self.step / steps_per_epoch
        total = cfg.max_steps if cfg.max_steps is not None else cfg.max_epochs * steps_per_epoch
        factor = lr_factor(self.step, cfg.lr_schedule, cfg.warmup_steps, total)
        if self.rise_split is not None:  # each member's own halvings
            assert self.optimizer is not None and sched is not None
            starts = [min(sched.start_epoch, math.inf if (h := self.members[k].halving_from) is None else h)
                      for k in self.slots]
            self.optimizer.set_lr_factor(tuple(0.5 ** _halvings(epoch_f, start, sched.every_epochs) * factor
                                               for start in starts))
            return
        if sched is not None:
            factor *= 0.5 ** _halvings(epoch_f, sched.start_epoch, sched.every_epochs)
        if self.fused is not None:
            if hasattr(self.fused, "set_lr_factor"):
                self.fused.set_lr_factor(factor)
            else:
                self.fused.lr = self.train_cfg.lr * factor
        if self.optimizer is not None:
            self.optimizer.set_lr_factor(factor)

    def _clip(self) -> None:
        """Each member's gradients clipped by their own global norm and its own clip norm."""
        clip_grad_norms_([p.grad for p in self.model.parameters() if p.grad is not None], self.hparams)

    def _optimizer_step(self, data: SplitData, rows: list[np.ndarray]) -> torch.Tensor:
        layout = self.model.train_layout(data, rows)
        static = None if self.captured is None else self.model.graph_batch(data, layout, self.device)
        batch = static if static is not None else self.model.make_batch(data, layout, self.device)
        active = self._active_mask()
        self._set_lr()
        if self.fused is not None:
            return self.fused(batch, active)
        assert self.optimizer is not None
        if static is not None:  # loss and gradients replayed from a CUDA graph
            assert self.captured is not None
            losses = self.captured(static, active)
        else:
            self.optimizer.zero_grad(set_to_none=True)
            reduction = self.train_cfg.loss_reduction
            assert reduction is not None, "RunSpec.from_dict resolves it to the model's default"
            losses = loss_backward(self.model, batch, self.noise, reduction, active)
        self._clip()
        self.optimizer.step()
        return losses

    def train_round(self) -> dict[str, Any]:
        """One epoch (or ``eval_every_steps`` steps), then curves and selection."""
        t0 = time.perf_counter()
        cfg = self.train_cfg
        if self.step_based:
            n_steps = cfg.eval_every_steps
            if cfg.max_steps is not None:
                n_steps = min(n_steps, cfg.max_steps - self.step)
        else:
            n_steps = math.ceil(self.n_train / cfg.batch_size)
            if cfg.data_order != "with_replacement":  # draws with replacement have no passes
                self.streams = [
                    (self._pass_order(m), 0) if m in self.slots else self.streams[m]
                    for m in range(len(self.members))
                ]
        running = [m.active for m in self.members]
        loss_sum = torch.zeros(self.k, dtype=torch.float64, device=self.device)
        # on a GPU, reading a loss every step would make the host wait for the GPU each
        # step; there a member whose loss is not finite is marked at the round's end (its
        # NaN stays its own: members' gradients are independent, and it is evaluated at
        # its selected state)
        nonfinite = torch.zeros(self.k, dtype=torch.bool, device=self.device) if self.device.type == "cuda" else None
        n_examples = 0
        for _ in range(n_steps):
            data, rows = self._train_batch()
            losses = self._optimizer_step(data, rows)
            self.step += 1
            loss_sum += losses.double()
            n_examples += len(rows[0])
            if nonfinite is not None:
                nonfinite |= ~torch.isfinite(losses)
            else:
                self._mark_diverged(~torch.isfinite(losses))
        if nonfinite is not None:
            self._mark_diverged(nonfinite)
        self.rounds += 1
        if not self.step_based:
            self.epoch += 1
        epoch = None if self.step_based else self.epoch
        objective = (loss_sum / max(n_examples, 1)).tolist()  # waits for the device's steps
        t1 = time.perf_counter()
        for row, k in enumerate(self.slots):
            m = self.members[k]
            if running[k]:
                m.rounds_run += 1
                m.metrics.append(self._row(m, epoch, "train", "train", "objective", objective[row]))
        self._evaluate_round(running, epoch)
        self._compact()
        t2 = time.perf_counter()
        self.wall_s += t2 - t0
        self.eval_s += t2 - t1
        return {
            "epoch": self.epoch,
            "step": self.step,
            "active": sum(m.active for m in self.members),
            "objective": float(np.nanmean(objective)) if n_examples else float("nan"),
            "round_s": [t1 - t0, t2 - t1],  # training steps, evaluation (shown in progress lines)
        }

    def _mark_diverged(self, bad: torch.Tensor) -> None:
        """Mark the members of rows ``bad`` (K,) bool as diverged (a non-finite loss)."""
        if bool(bad.any()):
            for row in torch.nonzero(bad).flatten().tolist():
                if self.members[self.slots[row]].active:
                    self.members[self.slots[row]].status = "diverged"

    # ----------------------------------------------------------------- evaluation

    def _row(self, m: Member, epoch: int | None, split: str, role: str, metric: str, value: float) -> dict[str, Any]:
        return {
            "seed": m.seeds.index, "epoch": epoch, "step": self.step,
            "split": split, "role": role, "metric": metric, "value": float(value),
        }

    @torch.no_grad()
    def evaluate(self, split: Split, predictions: bool = False) -> Evaluation:
        """Evaluate every member on ``split`` (chunks sorted by length)."""
        n = len(split)
        order = np.argsort(_lengths(split.data), kind="stable")
        model_values: dict[str, np.ndarray] = {}  # name -> (K, n): loss, model extras
        parts: list[list[tuple[np.ndarray, Sequence[Any]]]] = [[] for _ in range(self.k)]
        bs = self.train_cfg.eval_batch_size
        cap = self.model.eval_rows
        if cap is not None and self.device.type == "cpu":
            bs = max(1, min(bs, cap // self.k))
        # longest chunk first: each later chunk's buffers then fit in memory freed by an
        # earlier one (shortest first, every chunk outgrew the freed blocks and the heap grew
        # by ~8 GB over symbol rewriting's 100k training examples at K=8)
        for start in reversed(range(0, n, bs)):
            rows = order[start : start + bs]
            static = None if self.captured_eval is None else self.model.graph_batch(split.data, [rows] * self.k, self.device)
            if static is not None:  # the device part replayed from a CUDA graph
                assert self.captured_eval is not None
                batch_values, batch_preds = self.model.eval_from_tensors(self.captured_eval(static), static)
            else:
                batch = self.model.make_batch(split.data, [rows] * self.k, self.device)
                batch_values, batch_preds = self.model.evaluate_batch(batch)
            for name, per_row in batch_values.items():
                model_values.setdefault(name, np.zeros((self.k, n)))[:, rows] = per_row.double().cpu().numpy()
            for k, member_preds in enumerate(batch_preds):
                parts[k].append((rows, member_preds))
        preds = [_in_split_order(n, p) for p in parts]
        model_values.setdefault("loss", np.zeros((self.k, 0)))
        means: list[dict[str, float]] = []
        per_example: list[dict[str, np.ndarray]] = []
        for k in range(self.k):
            scores = self.task.score(split, preds[k])
            values = {name: v[k] for name, v in model_values.items() if name != "loss"} | scores
            per_example.append(values)
            mk = {"loss": float(model_values["loss"][k].mean()) if n else float("nan")}
            mk.update({name: float(np.mean(v)) if n else float("nan") for name, v in values.items()})
            means.append(mk)
        return Evaluation(means, per_example, preds if predictions else [])

    def _evaluate_round(self, running: list[bool], epoch: int | None) -> None:
        cfg = self.train_cfg
        sel = cfg.selection
        names = list(dict.fromkeys([*cfg.curve_splits, *([sel.split] if sel.mode != "last" else []),
                                    *([self.rise_split] if self.rise_split is not None else [])]))
        if epoch is not None and epoch in cfg.snapshot_epochs:
            names = list(self.data.splits)
        results = {name: self.evaluate(self.data.splits[name]) for name in names}
        rows = [(row, k) for row, k in enumerate(self.slots) if running[k]]
        self.last_eval = {name: [ev.means[row] for row, _ in rows] for name, ev in results.items()}
        for name, ev in results.items():
            role = self.data.splits[name].role
            for row, k in rows:
                m = self.members[k]
                m.metrics.extend(self._row(m, epoch, name, role, met, v) for met, v in ev.means[row].items())
        for row, k in rows:
            m = self.members[k]
            if self.rise_split is not None:  # OpenNMT-py's trigger: this epoch's loss above the last one's
                loss = results[self.rise_split].means[row]["loss"]
                if m.halving_from is None and m.last_rise_loss is not None and loss > m.last_rise_loss:
                    m.halving_from = self.epoch
                m.last_rise_loss = loss
            if m.status == "diverged":
                continue
            value = math.nan if sel.mode == "last" else results[sel.split].means[row][str(sel.metric)]  # resolved
            self._select(row, m, value, epoch)

    def _select(self, row: int, m: Member, value: float, epoch: int | None) -> None:
        sel = self.train_cfg.selection
        better = (
            sel.mode == "last"
            or m.best_value is None
            or (sel.mode == "max" and value > m.best_value)
            or (sel.mode == "min" and value < m.best_value)
        )
        if better:
            m.best_value, m.best_epoch, m.best_step = value, epoch, self.step
            m.best_params = self.model.member_state(row)
            m.bad_rounds = 0
        else:
            m.bad_rounds += 1
        if not sel.early_stop or sel.mode == "last" or m.best_value is None:
            return
        if self.learned(m) and m.bad_rounds >= sel.patience and m.rounds_run >= sel.min_epochs:
            m.status = "stopped"

    def run_status(self, m: Member) -> str:
        """The status member ``m`` commits with: ``diverged``, ``ok`` or ``not_learned``."""
        if m.status == "diverged":
            return "diverged"
        return "ok" if self.learned(m) else "not_learned"

    def learned(self, m: Member) -> bool:
        """Whether member ``m`` has *learned*: with early stopping armed at a level
        (``selection.arm_above``), its best selection value has passed that level at some
        evaluation. Only a learned run can stop early, and a run that ends at its budget
        without learning is committed with the status ``not_learned`` (kept apart in
        analysis: its selected epoch is the best of a run that never took off). Without
        early stopping or an arming level every run counts as learned."""
        sel = self.train_cfg.selection
        if not sel.early_stop or sel.mode == "last" or sel.arm_above is None:
            return True
        if m.best_value is None or math.isnan(m.best_value):
            return False
        return m.best_value > sel.arm_above if sel.mode == "max" else m.best_value < sel.arm_above

    # ----------------------------------------------------------------- compaction
    def _compact(self) -> None:
        """Drop stopped or diverged members from the model, optimizer and noise streams.

        Only with the generic step (a fused step keeps its own per-member state) and only
        while someone still runs; the kept rows compute exactly what they did before.
        """
        keep = [row for row, k in enumerate(self.slots) if self.members[k].active]
        if self.fused is not None or not keep or len(keep) == len(self.slots):
            return
        self._keep_rows(keep)

    def _keep_rows(self, keep: list[int]) -> None:
        index = torch.tensor(keep, device=self.device)
        with torch.no_grad():
            for p in self.model.parameters():
                p.grad = None
                p.data = p.data.index_select(0, index).contiguous()
        if self.optimizer is not None:
            self.optimizer.keep_rows(keep)
        self.noise.keep(keep)
        for graphs in (self.captured, self.captured_eval):
            if graphs is not None:
                graphs.clear()  # the parameters have new storage
        self.hparams = self.hparams.keep(keep)
        self.slots = [self.slots[row] for row in keep]
        self.k = self.model.k = len(keep)

    def _restore_all_members(self) -> None:
        """Undo compaction: a fresh K-member model (rows = members), for final evaluation."""
        if len(self.slots) == len(self.members):
            return
        members = [m.seeds for m in self.members]
        self.model = build_model(self.spec, self.data, members, self.member_dropout).to(self.device)
        self.captured = None  # graphs of the old model; training is over
        self.captured_eval = self._captured_eval()
        self.slots = list(range(len(self.members)))
        self.hparams = MemberHparams.of(self.member_specs)
        self.k = len(self.members)

    # ----------------------------------------------------------------- results
    def finalize(self) -> list[dict[str, Rows]]:
        """Evaluate every member at its selected epoch on every split.

        Returns one dict per member with ``metrics``, ``evals`` and ``predictions`` rows
        (without study/trial columns) and a ``run`` summary.
        """
        t0 = time.perf_counter()
        self._restore_all_members()
        for k, m in enumerate(self.members):
            if m.best_params is not None:
                self.model.load_member_state(k, m.best_params)
        out: list[dict[str, Rows]] = [
            {"metrics": m.metrics, "evals": [], "predictions": []} for m in self.members
        ]
        selected = [k for k, m in enumerate(self.members) if m.best_params is not None]
        for name, split in self.data.splits.items():
            for k, rows in self.split_rows(name, split, selected).items():
                out[k]["evals"].extend(rows["evals"])
                out[k]["predictions"].extend(rows["predictions"])
        for k, m in enumerate(self.members):
            status = self.run_status(m)
            out[k]["run"] = [{
                "status": status, "selected_epoch": m.best_epoch, "selected_step": m.best_step,
                "epochs_run": m.rounds_run,
            }]
        self.final_eval_s = time.perf_counter() - t0
        return out

    def split_rows(self, name: str, split: Split, members: Sequence[int]) -> dict[int, dict[str, Rows]]:
        """The ``evals`` rows (and, for a test split with ``train.predictions``, the
        ``predictions`` rows) of ``members`` on ``split`` with the model's parameters as they
        are now (one evaluation of the whole bundle; the model's rows must be the members,
        as in a fresh bundle or after :meth:`_restore_all_members`). What :meth:`finalize`
        commits per split, and what ``study eval`` commits for kept weights."""
        assert len(self.slots) == len(self.members), "a compacted bundle: restore it first"
        want_preds = self.train_cfg.predictions and split.role == "test"
        # an example is correct where a share (accuracy, exact match) is above 0.5; an error or
        # a count has no "correct" (null), and analyses of correctness skip it
        share = self.task.declared_metrics()[self.task.primary_metric].share
        ev = self.evaluate(split, predictions=want_preds)
        out: dict[int, dict[str, Rows]] = {}
        for k in members:
            m = self.members[k]
            rows: dict[str, Rows] = {"evals": [], "predictions": []}
            rows["evals"].extend(
                {"seed": m.seeds.index, "split": name, "role": split.role, "metric": met, "value": v}
                for met, v in ev.means[k].items()
            )
            if want_preds:
                correct = ev.per_example[k][self.task.primary_metric] > 0.5 if share else None
                for i in range(len(split)):
                    inp, tgt = self.task.render_example(self.data, split, i)
                    rows["predictions"].append({
                        "seed": m.seeds.index, "split": name,
                        "example_id": int(split.data.ids[i]), "input": inp, "target": tgt,
                        "prediction": self.task.render(split, ev.predictions[k][i], i),
                        "correct": None if correct is None else bool(correct[i]),
                    })
            out[k] = rows
        return out

    # ----------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "fused": self.fused.state_dict() if self.fused is not None else None,
            "noise": self.noise.state(),
            "order": [r.bit_generator.state for r in self.order_rngs],
            "streams": self.streams,
            "counters": (self.epoch, self.step, self.rounds, self.wall_s),
            "eval_s": self.eval_s,
            "members": [m.__dict__.copy() for m in self.members],
            "slots": list(self.slots),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        slots = state.get("slots", self.slots)
        if slots != self.slots:  # the checkpoint was compacted: compact the same way first
            self._keep_rows([self.slots.index(k) for k in slots])
        self.model.load_state_dict(state["model"])
        if self.optimizer is not None and state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.fused is not None and state["fused"] is not None:
            self.fused.load_state_dict(state["fused"])
        self.noise.set_state(state["noise"])
        for r, s in zip(self.order_rngs, state["order"], strict=True):
            r.bit_generator.state = s
        self.streams = state["streams"]
        self.epoch, self.step, self.rounds, self.wall_s = state["counters"]
        self.eval_s = state.get("eval_s", 0.0)  # absent from checkpoints before it
        for m, d in zip(self.members, state["members"], strict=True):
            m.__dict__.update(d)


def _halvings(epoch_f: float, start: float, every: float) -> int:
    """Halvings after ``epoch_f`` epochs of a schedule whose first applies once ``start``
    epochs are done, then one every ``every`` epochs."""
    return 0 if epoch_f < start else int((epoch_f - start) // every) + 1


def _in_split_order(n: int, parts: Sequence[tuple[np.ndarray, Sequence[Any]]]) -> Sequence[Any]:
    """One member's predictions of a split's chunks ``(rows, predictions)`` in split order."""
    if parts and all(isinstance(p, TokenRows) for _, p in parts):
        return TokenRows.assemble(n, parts)  # type: ignore[arg-type]
    out: list[Any] = [None] * n
    for rows, chunk in parts:
        for j, r in enumerate(rows):
            out[r] = chunk[j]
    return out
