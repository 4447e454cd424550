"""The contract every (task, model) pair must satisfy, shipped for plugin authors.

fineline's own test suite runs it over the built-ins; a plugin's repository runs the same
checks on its own task and model with one line in any pytest module::

    from trainables.testing import contract_suite

    TestContract = contract_suite(tasks=["parity"], models=["parity_mlp"])

(in the spirit of ``optuna.testing.pytest_samplers``). A pair is every registered task
and model of the same data kind that the filters keep. Each task is trained on its
``tiny`` config (``Task.tiny``, ``Task.tiny_train``), each model with ``Model.tiny``.
The checks:

* registration: declared metrics (``Task.metrics``, ``Model.metric_names``) are what the
  task and model produce, every declared loss reduction trains;
* it trains end to end and scores every split; accuracies in [0, 1], finite metrics;
* the same seeds give bit-identical results (CPU), another seed a different run;
* ``evaluate_batch`` equals ``example_metrics`` and ``predict`` apart;
* bundle equivalence, dropout included: member k of a K=3 bundle equals the lone run with
  the same seeds (parameters after 200 optimizer steps to 1e-5 relative on a CPU; on CUDA,
  where a bundle rounds differently from a lone run, after 20 steps to 1% of how far the
  run moved: see :data:`AGREEMENT`; a tiny end-to-end run: the same selected epoch and
  metrics to 1e-4);
* a seed's result does not depend on its bundle's size or company;
* a stopped member leaves the computation (compaction) and the others go on as lone
  runs; a checkpoint taken after compaction resumes bit-identically;
* per-member hyperparameters: members whose configs differ in learning rate, weight decay,
  Adam's betas or SGD's momentum, clip norm and (where the model config has one)
  ``dropout`` each train as the lone run of their own config (Adam and SGD), through
  compaction and a checkpoint.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from trainables.errors import ConfigError
from trainables.loop import BundleRun
from trainables.metrics import check_values
from trainables.models.base import Model
from trainables.optim import with_hparams
from trainables.registry import MODELS, TASKS
from trainables.seeding import derive_seedset
from trainables.spec import RunSpec
from trainables.tasks.base import Task

Pair = tuple[type[Task], type[Model]]


def pairs(tasks: Sequence[str] | None = None, models: Sequence[str] | None = None) -> list[Pair]:
    """Registered (task, model) classes of one data kind, kept by the name filters."""
    for name in tasks or ():
        TASKS.get(name)  # an unknown name is an error naming the choices, not 0 tests
    for name in models or ():
        MODELS.get(name)
    return [
        (t, m)
        for t in TASKS
        for m in MODELS
        if m.data_kind == t.data_kind
        and (tasks is None or t.name in tasks)
        and (models is None or m.name in models)
    ]


def tiny_spec(task_cls: type[Task], model_cls: type[Model], data_root: Path | None, **train: Any) -> RunSpec:
    """The pair's tiny config (``train`` overrides the task's ``tiny_train``). A ``data_dir``
    in ``Task.tiny`` names a folder under ``data_root``; the test skips without it."""
    task = dict(task_cls.tiny)
    if "data_dir" in task:
        folder = (data_root or Path("/nonexistent")) / task["data_dir"]
        if not folder.is_dir():
            pytest.skip(f"{task_cls.name} needs reference data at {folder}")
        task["data_dir"] = str(folder)
    raw = {
        "task": {"name": task_cls.name, **task},
        "model": {"name": model_cls.name, **model_cls.tiny},
        "train": {"max_epochs": 2, **task_cls.tiny_train, **train},
    }
    return RunSpec.from_dict(raw)


def new_run(
    spec: RunSpec, indices: Sequence[int], device: str = "cpu",
    member_specs: Sequence[RunSpec] | None = None, cuda_graphs: bool = False,
) -> BundleRun:
    """A bundle of the seeds ``indices`` (root 11), members trained with ``member_specs``
    (default: all ``spec``) and ``execution.cuda_graphs``; skips a pair the model cannot size."""
    seeds = [derive_seedset(11, i) for i in indices]
    task = spec.make_task()
    try:
        return BundleRun(spec, seeds, task, task.build(seeds[0].data_seed), device, member_specs, cuda_graphs)
    except ConfigError as exc:
        if exc.field != "model.name":
            raise
        pytest.skip(f"{spec.model_name} cannot take {spec.task_name}'s inputs: {exc}")


def train(
    spec: RunSpec, indices: Sequence[int], device: str = "cpu",
    member_specs: Sequence[RunSpec] | None = None, cuda_graphs: bool = False,
) -> BundleRun:
    run = new_run(spec, indices, device, member_specs, cuda_graphs)
    while not run.done:
        run.train_round()
    return run


def evals(run: BundleRun, k: int) -> dict[tuple[str, str], float]:
    """Member ``k``'s (split, metric) -> value at its selected epoch."""
    rows = run.finalize()[k]
    return {(r["split"], r["metric"]): r["value"] for r in rows["evals"]}


@dataclass(frozen=True)
class Agreement:
    """How closely a bundle member must follow its lone run on one kind of device.

    On a CPU fineline's bundles compute each member's arithmetic in the lone run's order, so
    a member equals its lone run to rounding after hundreds of steps. On CUDA, cuBLAS and
    cuDNN pick their kernels (and so their summation orders) by the batch count: a bundle of
    three and a lone run round differently at every step, and the tiny configs amplify such
    differences: one float32 ulp of noise per step grows, over 200 steps, to 18-68% of a
    tensor's largest value on mnist_pairs-convnet, scan-transformer and modular-transformer
    (measured on a CPU by adding the noise, 2026-11-27); on an H200, 26 of the 378 CUDA
    checks failed the CPU's rule, on those pairs. So on CUDA the checks take fewer steps
    and compare the difference with how far the run moved from its initial values: with
    eight ulps of noise per step the worst pair stayed within 0.4% of the movement after 20
    steps, and 0.13% after 6, while a member one step short, with another learning rate or
    with another seed is off by 5% or more (``tests/test_contract_agreement.py``).

    A ReLU's kink is the exception: a unit whose input sits at 0 is on in one run and off in
    the other, and the weights it touches take a different step. On an H200 (2026-11-28) one
    of 512 values of scan-transformer's ``blocks.1.mlp.fc.weight`` was 2.35% of the movement
    off after 3 Adam steps, and eight ulps of noise on the CPU moved that same value by the
    same 2.35% (64 ulps too: the kink, not the noise's size). So a few values of a tensor
    (:attr:`stray_share`) may be off by up to :attr:`stray_of_movement`; a broken member moves
    most of its values.
    """

    steps: int
    """Optimizer steps of the long check (a member against its lone run)."""
    seed_steps: int
    """Optimizer steps of the check that a seed does not depend on its bundle."""
    of_movement: float | None
    """None: every value to 1e-5 of its tensor's largest value. A share: besides that, a
    difference up to this share of the largest move of the tensor from its initial values."""
    stray_share: float = 0.0
    """The share of a tensor's values (at least one, where above 0) that may differ by more
    than :attr:`of_movement`, up to :attr:`stray_of_movement` (an activation's kink)."""
    stray_of_movement: float = 0.0
    """How far those few values may be off, as a share of the tensor's largest move."""


AGREEMENT: dict[str, Agreement] = {
    "cpu": Agreement(steps=200, seed_steps=60, of_movement=None),
    "cuda": Agreement(steps=20, seed_steps=20, of_movement=0.01, stray_share=0.01, stray_of_movement=0.1),
}
"""The agreement each device's contract suite holds bundles to (see :class:`Agreement`)."""


def assert_states_close(
    mine: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor], what: object,
    start: Mapping[str, torch.Tensor] | None = None, rule: Agreement | None = None,
) -> None:
    """Two member states equal to 1e-5 of each tensor's largest value (the bundle tolerance);
    with ``start`` (``ref``'s initial values) and a ``rule`` with ``of_movement``, also to
    that share of how far ``ref`` moved from ``start``, a few values to its
    ``stray_of_movement`` (see :class:`Agreement`)."""
    assert mine.keys() == ref.keys(), what
    for name, value in mine.items():
        scale = ref[name].abs().max().clamp(min=1e-3)
        allowed = stray = 1e-5 * float(scale)
        strays = 0
        if start is not None and rule is not None and rule.of_movement is not None:
            moved = float((ref[name] - start[name]).abs().max())
            allowed = max(allowed, rule.of_movement * moved)
            stray = max(allowed, rule.stray_of_movement * moved)
            strays = max(1, int(rule.stray_share * value.numel())) if rule.stray_share > 0 else 0
        off = ~torch.isclose(value, ref[name], rtol=1e-5, atol=allowed)
        far = ~torch.isclose(value, ref[name], rtol=1e-5, atol=stray)
        n_off = int(off.sum())
        assert n_off <= strays and not bool(far.any()), (
            what, name, f"{n_off} of {value.numel()} values differ, by up to "
            f"{float((value - ref[name]).abs().max()):.3g} (largest value {float(scale):.3g}, "
            f"allowed {allowed:.3g}" + (f"; {strays} may differ up to {stray:.3g}" if strays else "") + ")",
        )


def member_params(run: BundleRun, k: int) -> dict[str, torch.Tensor]:
    """Member ``k``'s parameters now, or, once compacted out, those it was selected with."""
    if k in run.slots:
        return run.model.member_state(run.slots.index(k))
    saved = run.members[k].best_params
    assert saved is not None, f"member {k} left the bundle unselected"
    return saved


def hparam_members(spec: RunSpec, optimizer: str, adam_eps: float | None = None) -> tuple[RunSpec, list[RunSpec]]:
    """A bundle config with ``optimizer`` (``adam``: the tiny config's learning rate and
    clip, and ``adam_eps`` where given; ``sgd``: lr 0.05, clip 1) and three members'
    configs: the bundle's own, then two that differ in every per-member hyperparameter
    (three dropout rates > 0 where the model config has ``dropout``; no clip for one Adam
    member)."""
    others: list[dict[str, Any]]
    if optimizer == "sgd":
        base = with_hparams(with_train(spec, optimizer="sgd"), {"lr": 0.05, "clip_norm": 1.0})
        others = [
            {"lr": 0.02, "momentum": 0.9, "weight_decay": 0.01, "clip_norm": 0.5},
            {"lr": 0.1, "momentum": 0.5, "clip_norm": 2.0},
        ]
    else:
        base = with_train(spec, optimizer="adam", **({} if adam_eps is None else {"adam_eps": adam_eps}))
        lr = base.train.lr
        others = [
            {"lr": lr / 2, "weight_decay": 0.01, "betas": (0.8, 0.99), "clip_norm": 1.0},
            {"lr": lr * 2, "betas": (0.95, 0.9999), "clip_norm": None},
        ]
    if "dropout" in type(base.model).model_fields:  # rates > 0: a model may drop its Dropout
        p = float(getattr(base.model, "dropout", 0.0)) or 0.2  # layers at 0 (mlp_plain does)
        base = with_hparams(base, {"dropout": p})
        others[0]["dropout"], others[1]["dropout"] = p / 2, (0.4 if p == 0.3 else 0.3)
    return base, [base, *(with_hparams(base, o) for o in others)]


def with_train(spec: RunSpec, **train: Any) -> RunSpec:
    """``spec`` with train fields set."""
    raw = spec.to_dict()
    raw["train"].update(train)
    return RunSpec.from_dict(raw)


def assert_evals_close(a: dict[Any, float], b: dict[Any, float], what: object) -> None:
    assert a.keys() == b.keys(), what
    for key in a:
        assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-4), (what, key)


def contract_suite(
    tasks: Sequence[str] | None = None,
    models: Sequence[str] | None = None,
    data_root: Path | str | None = None,
    device: str = "cpu",
    pair_marks: Mapping[str, pytest.MarkDecorator] | None = None,
    cuda_graphs: bool = False,
    agreement: Agreement | None = None,
) -> type:
    """A pytest test class running the contract over the kept pairs (see the module doc).

    ``tasks`` / ``models``: registered names to keep (None: all). ``data_root``: where the
    folders named by ``Task.tiny["data_dir"]`` live. ``device``: ``cpu`` or ``cuda`` (the
    CUDA variant skips without a GPU and runs the bundle checks in true float32).
    ``cuda_graphs``: train with ``execution.cuda_graphs`` (counter-based dropout masks on
    every device, and on CUDA the captured training step where the model has one).
    ``pair_marks``: a pytest mark for some pairs, keyed by their id ``"task-model"``, e.g.
    ``{"scan-transformer": pytest.mark.slow}`` to keep a costly cross pair out of a default run.
    ``agreement``: how closely a bundle member must follow its lone run (default: the
    device's :data:`AGREEMENT`), e.g. ``AGREEMENT["cuda"]`` to check the GPU's rule here.
    """
    kept = pairs(tasks, models)
    if not kept:
        raise ConfigError(
            "contract_suite", f"no (task, model) pair of one data kind among tasks={tasks} models={models}",
            "name a task and a model that share a data_kind",
        )
    ids = [f"{t.name}-{m.name}" for t, m in kept]
    marks = dict(pair_marks or {})
    unknown = sorted(set(marks) - set(ids))
    if unknown:
        raise ConfigError(
            "contract_suite", f"pair_marks names pairs the suite does not run: {', '.join(unknown)}",
            f"key each mark by a kept pair's id, one of: {', '.join(ids)}",
        )
    cases = [
        pytest.param(t, m, id=i, marks=[marks[i]] if i in marks else [])
        for (t, m), i in zip(kept, ids, strict=True)
    ]
    root = Path(data_root) if data_root is not None else None
    agree = agreement or AGREEMENT[torch.device(device).type]
    param = pytest.mark.parametrize(("task_cls", "model_cls"), cases)

    class ContractSuite:
        @pytest.fixture(autouse=True)
        def _one_thread(self) -> Iterator[None]:
            before = torch.get_num_threads()
            torch.set_num_threads(1)
            if device == "cuda":
                if not torch.cuda.is_available():
                    pytest.skip("no CUDA device here")
                tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
                torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
            yield
            torch.set_num_threads(before)
            if device == "cuda":
                torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32

        def spec(self, task_cls: type[Task], model_cls: type[Model], **train_cfg: Any) -> RunSpec:
            return tiny_spec(task_cls, model_cls, root, **train_cfg)

        @param
        def test_task_data_is_well_formed(self, task_cls: type[Task], model_cls: type[Model]) -> None:
            """Lengths, finite values, labels (the checks a study makes before Ray starts);
            a failure names the split and what is wrong (e.g. NaN inputs), where the other
            tests would fail on its consequences."""
            from trainables.rehearsal import check_task_data

            spec = self.spec(task_cls, model_cls)
            check_task_data(spec, spec.make_task().build(derive_seedset(11, 0).data_seed))

        @param
        def test_declared_metrics_and_reductions_are_what_runs_give(
            self, task_cls: type[Task], model_cls: type[Model]
        ) -> None:
            spec = self.spec(task_cls, model_cls, max_epochs=1)
            run = train(spec, [0], device, cuda_graphs=cuda_graphs)
            ev = evals(run, 0)
            got = {m for (_, m) in ev}
            assert got <= set(spec.metric_names()), f"undeclared metrics: {got - set(spec.metric_names())}"
            assert task_cls.primary_metric in task_cls.declared_metrics()
            for (where, metric), value in ev.items():  # a mean keeps to the declared range
                problem = check_values(spec.metrics(), metric, np.array([value]), f"split {where!r}")
                assert problem is None, problem
            split = next(iter(run.data.splits.values()))
            batch = run.model.make_batch(split.data, [np.arange(min(len(split), 8))], run.device)
            with torch.no_grad():
                names = tuple(run.model.example_metrics(batch))
            assert names == model_cls.metric_names(spec.model), "Model.metric_names must list example_metrics' keys"
            for reduction in model_cls.reductions:  # each declared reduction takes a step
                r = new_run(self.spec(task_cls, model_cls, loss_reduction=reduction, max_steps=1), [0], device, cuda_graphs=cuda_graphs)
                assert r.train_round()["step"] == 1, reduction

        @param
        def test_pair_trains_scores_and_is_deterministic(self, task_cls: type[Task], model_cls: type[Model]) -> None:
            spec = self.spec(task_cls, model_cls)
            a, b = train(spec, [0], device, cuda_graphs=cuda_graphs), train(spec, [0], device, cuda_graphs=cuda_graphs)
            ev_a, ev_b = evals(a, 0), evals(b, 0)
            if device == "cpu":
                assert ev_a == ev_b, "same seeds must give bit-identical metrics on CPU"
            roles = {s.role for s in a.data.splits.values()}
            assert "train" in roles and "test" in roles
            assert {split for split, _ in ev_a} == set(a.data.splits)
            for (split, metric), value in ev_a.items():
                if metric in ("accuracy", "exact", "correct"):
                    assert 0.0 <= value <= 1.0, (split, metric, value)
                assert np.isfinite(value) or metric == "loss", (split, metric, value)
            assert a.members[0].best_epoch is not None or a.step_based
            assert evals(train(spec, [1], device, cuda_graphs=cuda_graphs), 0) != ev_a, "a different seed should give a different run"

        @param
        def test_evaluate_batch_equals_metrics_and_predictions(
            self, task_cls: type[Task], model_cls: type[Model]
        ) -> None:
            """``Model.evaluate_batch`` may share work; it must return what the two give apart."""
            run = train(self.spec(task_cls, model_cls, max_epochs=1), [0, 1], device, cuda_graphs=cuda_graphs)
            split = next(s for s in run.data.splits.values() if s.role == "test")
            rows = np.arange(min(len(split), 40))
            batch = run.model.make_batch(split.data, [rows] * run.k, run.device)
            with torch.no_grad():
                values, preds = run.model.evaluate_batch(batch)
                apart = run.model.example_metrics(batch)
                preds_apart = run.model.predict(batch)
            assert values.keys() == apart.keys() and "loss" in values
            for name, v in values.items():
                assert torch.allclose(v, apart[name], rtol=1e-6, atol=1e-6), name
            assert len(preds) == run.k == len(preds_apart)
            for mine, theirs in zip(preds, preds_apart, strict=True):
                assert len(mine) == len(rows) == len(theirs)
                assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(mine, theirs, strict=True))

        def close_to_lone(self, mine: dict[str, torch.Tensor], lone: BundleRun, spec: RunSpec, k: int, what: str) -> None:
            """``mine`` equals ``lone``, the lone run of seed ``k`` trained with ``spec``, as
            the device's :data:`AGREEMENT` asks (on CUDA: against its move from its start)."""
            start = member_params(new_run(spec, [k], device, cuda_graphs=cuda_graphs), 0) if agree.of_movement else None
            assert_states_close(mine, member_params(lone, 0), what, start, agree)

        @param
        def test_bundle_member_equals_lone_run(self, task_cls: type[Task], model_cls: type[Model]) -> None:
            """Each member of a bundle of three equals its lone run after ``AGREEMENT``'s
            steps (200 on a CPU, 20 on CUDA)."""
            spec = self.spec(task_cls, model_cls, max_steps=agree.steps, eval_every_steps=agree.steps,
                             selection={"mode": "last", "early_stop": False})
            bundle = train(spec, [0, 1, 2], device, cuda_graphs=cuda_graphs)
            for k in range(3):
                lone = train(spec, [k], device, cuda_graphs=cuda_graphs)
                self.close_to_lone(member_params(bundle, k), lone, spec, k, f"member {k}")

        @param
        def test_bundle_end_to_end_matches_lone_runs(self, task_cls: type[Task], model_cls: type[Model]) -> None:
            spec = self.spec(task_cls, model_cls)
            bundle = train(spec, [0, 1, 2], device, cuda_graphs=cuda_graphs)
            for k in range(3):
                lone = train(spec, [k], device, cuda_graphs=cuda_graphs)
                assert bundle.members[k].best_epoch == lone.members[0].best_epoch
                assert_evals_close(evals(bundle, k), evals(lone, 0), k)

        @param
        def test_a_seed_does_not_depend_on_its_bundle(self, task_cls: type[Task], model_cls: type[Model]) -> None:
            """Seed 2 alone, as the last of three, and first beside seed 5: the same run."""
            steps = agree.seed_steps
            spec = self.spec(task_cls, model_cls, max_steps=steps, eval_every_steps=steps // 2,
                             selection={"mode": "last", "early_stop": False})
            ref = train(spec, [2], device, cuda_graphs=cuda_graphs)
            for run, k in ((train(spec, [0, 1, 2], device, cuda_graphs=cuda_graphs), 2),
                           (train(spec, [2, 5], device, cuda_graphs=cuda_graphs), 0)):
                self.close_to_lone(member_params(run, k), ref, spec, 2, f"seed 2 in a bundle of {run.k}")
                assert_evals_close(evals(run, k), evals(ref, 0), f"seed 2 in a bundle of {run.k}")

        @param
        def test_a_stopped_member_leaves_the_computation_and_the_others_go_on_as_lone_runs(
            self, task_cls: type[Task], model_cls: type[Model]
        ) -> None:
            """Member 1 stops after the first round: with the generic step it is compacted out
            (rows 0 and 2 remain); members 0 and 2 still equal their lone runs, member 1 a lone
            run of one round, and a checkpoint taken after compaction resumes bit-identically."""
            sel = {"mode": "last", "early_stop": False}
            spec = self.spec(task_cls, model_cls, selection=sel)
            step_based = spec.train.max_steps is not None or task_cls.fresh_samples
            one_round = {"max_steps": spec.train.eval_every_steps} if step_based else {"max_epochs": 1}
            bundle = new_run(spec, [0, 1, 2], device, cuda_graphs=cuda_graphs)
            bundle.train_round()
            bundle.members[1].status = "stopped"
            bundle._compact()
            compacts = bundle.fused is None
            assert bundle.slots == ([0, 2] if compacts else [0, 1, 2]) and bundle.model.k == len(bundle.slots)
            bundle.train_round()
            resumed = new_run(spec, [0, 1, 2], device, cuda_graphs=cuda_graphs)
            resumed.load_state_dict(copy.deepcopy(bundle.state_dict()))
            assert resumed.slots == bundle.slots
            for run in (bundle, resumed):
                while not run.done:
                    run.train_round()
            assert evals(resumed, 0) == evals(bundle, 0) and evals(resumed, 2) == evals(bundle, 2)
            assert bundle.members[1].best_epoch == (None if step_based else 1)
            for k, extra in ((0, {}), (1, one_round), (2, {})):
                lone = train(self.spec(task_cls, model_cls, selection=sel, **extra), [k], device, cuda_graphs=cuda_graphs)
                assert bundle.members[k].best_step == lone.members[0].best_step
                assert_evals_close(evals(bundle, k), evals(lone, 0), k)

        @param
        @pytest.mark.parametrize("optimizer", ["adam", "sgd"])
        def test_members_with_their_own_hyperparameters_train_as_lone_runs(
            self, task_cls: type[Task], model_cls: type[Model], optimizer: str
        ) -> None:
            """Three members, each with its own learning rate, weight decay, betas or momentum,
            clip norm (and dropout): each equals the lone run of its own config after 6 steps
            (parameters, then the metrics of every split), also after member 1 stopped at
            step 3 (compacted out) and a checkpoint resumed."""
            sel = {"mode": "last", "early_stop": False}
            spec = self.spec(task_cls, model_cls, max_steps=6, eval_every_steps=3, selection=sel)
            # On CUDA a bundle and a lone run round differently (cuBLAS picks its kernels by
            # the batch count): a gradient that cancels to rounding noise there, ~1e-8, is a
            # full-size step of either sign for Adam with eps 1e-8. A larger eps keeps those
            # at noise size; every real gradient still takes an Adam step of its member's own.
            base, members = hparam_members(spec, optimizer, adam_eps=1e-5 if device == "cuda" else None)
            bundle = new_run(base, [0, 1, 2], device, members, cuda_graphs=cuda_graphs)
            bundle.train_round()
            bundle.members[1].status = "stopped"
            bundle._compact()
            resumed = new_run(base, [0, 1, 2], device, members, cuda_graphs=cuda_graphs)
            resumed.load_state_dict(copy.deepcopy(bundle.state_dict()))
            for run in (bundle, resumed):
                while not run.done:
                    run.train_round()
            mine = [member_params(bundle, k) for k in range(3)]
            for k in range(3):
                again = member_params(resumed, k)
                assert all(torch.equal(v, again[n]) for n, v in mine[k].items()), f"member {k} resumed"
            plain = member_params(train(base, [2], device, cuda_graphs=cuda_graphs), 0)  # member 2 with the bundle's values
            assert any(
                not torch.allclose(v, plain[n], rtol=1e-4, atol=1e-4) for n, v in mine[2].items()
            ), "member 2's own hyperparameters changed nothing: the checks below would prove nothing"
            for k in range(3):
                own = with_train(members[k], max_steps=3 if k == 1 else 6)
                lone = train(own, [k], device, cuda_graphs=cuda_graphs)
                self.close_to_lone(mine[k], lone, own, k, f"member {k} vs its lone run")
                assert_evals_close(evals(bundle, k), evals(lone, 0), f"member {k} vs its lone run")

    ContractSuite.__name__ = ContractSuite.__qualname__ = "ContractSuite"
    return ContractSuite
