"""Experiment trackers, opt-in: one tracker run per seed, written on the worker.

A study file's ``execution.loggers: [tensorboard, mlflow, wandb, aim]`` sends every seed's
per-epoch metrics (each split x metric its bundle reports, the rows of the ``metrics``
table) to those trackers. Ray Tune's own logger callbacks would log one run per Tune trial,
i.e. per *bundle* of seeds; fineline logs per member instead, through each tracker's
client, so a tracker shows one run per seed, grouped by config (``trial_id``), tagged with
its seed sources, task, model and study.

* **Opt-in and lazy**: no tracker is needed to install or test fineline. A name is checked
  on the driver before Ray starts (:func:`check_loggers`: an unknown name, or a tracker
  whose package is missing, is one :class:`~trainables.errors.ConfigError` naming
  ``execution.loggers`` and the ``pip install``); the client is imported on the worker
  only when the tracker opens.
* **Where**: under the study folder (``OUT/NAME/tensorboard/<trial_id>/seed-<i>``, the
  MLflow store ``OUT/NAME/mlflow.db``, ``OUT/NAME/wandb``, the Aim repo ``OUT/NAME/.aim``)
  unless the tracker's usual environment variable says otherwise (:attr:`Tracker.env`). The
  driver's values travel with each trial (:func:`driver_settings`), since environment
  variables set on the driver do not reach workers on other nodes.
* **Resume**: a seed that starts again (a retried trial restored from its checkpoint, or a
  re-planned seed after a crash) starts its tracker run afresh and logs its whole curve
  again: its TensorBoard folder is emptied, its old MLflow run deleted (found by its
  ``fineline.run_key`` tag), its old Aim run deleted (its hash is kept beside the results),
  its W&B run resumed under its deterministic id.
* **Commit**: :meth:`BundleTrackers.close` flushes and closes every run before the bundle
  commits its seeds to Parquet.

A tracker's failure never fails training (Parquet is the record): it is reported once on
the worker's stderr and that tracker stops for the bundle. Adding a tracker: subclass
:class:`Tracker`, set its class attributes, decorate it with :func:`register`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from trainables.errors import ConfigError

Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class Scalars:
    """One evaluation point of one seed: every ``split/metric`` value at an epoch (or step)."""

    epoch: int | None
    """Epochs done (None for step-based training)."""
    step: int
    """Optimizer steps done."""
    values: dict[str, float]
    """``split/metric`` -> value (``train/objective``, ``val/loss``, ``val_ood/accuracy``...)."""

    @property
    def x(self) -> int:
        """The tracker's step: the epoch, or the optimizer step for step-based training."""
        return self.epoch if self.epoch is not None else self.step


def scalars(rows: Sequence[Mapping[str, Any]]) -> list[Scalars]:
    """``metrics`` rows (one seed's, in order) grouped into one :class:`Scalars` per point."""
    points: dict[tuple[int | None, int], dict[str, float]] = {}
    for r in rows:
        points.setdefault((r["epoch"], r["step"]), {})[f"{r['split']}/{r['metric']}"] = float(r["value"])
    return [Scalars(epoch, step, values) for (epoch, step), values in points.items()]


@dataclass(frozen=True)
class SeedRun:
    """Who one tracker run is: one seed of one config of one study."""

    out: str
    """The results folder OUT (the study's folder is ``OUT/<study>``)."""
    study: str
    """The study's name."""
    trial_id: str
    """The config's id: the group of the seed's run."""
    task: str
    """The task's registered name."""
    model: str
    """The model's registered name."""
    seeds: dict[str, int]
    """``index`` and the seed sources ``init_seed``, ``order_seed``, ``dropout_seed``, ``data_seed``."""
    point: str = "{}"
    """The grid point (or a tuning candidate's params) as JSON."""
    config: dict[str, Any] | None = None
    """The flattened resolved config (``train_lr``, ``model_hidden_size``, ...)."""

    @property
    def index(self) -> int:
        return int(self.seeds["index"])

    @property
    def folder(self) -> Path:
        """The study's folder, where trackers write by default."""
        return Path(self.out) / self.study

    @property
    def name(self) -> str:
        return f"seed-{self.index}"

    @property
    def key(self) -> str:
        """Unique within a study: finds this seed's earlier run again (``fineline.run_key``)."""
        return f"{self.study}/{self.trial_id}/{self.name}"

    @property
    def uid(self) -> str:
        """A stable id of this seed's run in this results folder (16 hex digits)."""
        return hashlib.sha256(f"{Path(self.out).resolve()}|{self.key}".encode()).hexdigest()[:16]

    def tags(self) -> dict[str, str]:
        """What every tracker records about the run (as tags, params or config)."""
        return {
            "fineline.study": self.study, "fineline.trial_id": self.trial_id,
            "fineline.task": self.task, "fineline.model": self.model,
            "fineline.seed": str(self.index), "fineline.point": self.point,
            "fineline.run_key": self.key,
            **{f"fineline.{k}": str(v) for k, v in self.seeds.items() if k != "index"},
        }

    def params(self) -> dict[str, Any]:
        """The seed sources and the flattened config (hyperparameters)."""
        seeds = {k: v for k, v in self.seeds.items() if k != "index"}
        return {"seed": self.index, **seeds, **(self.config or {})}


class Tracker(ABC):
    """One seed's run in one experiment tracker (lives on the worker)."""

    name: ClassVar[str]
    """The name a study file gives in ``execution.loggers``."""
    module: ClassVar[str]
    """The module whose presence means the client is installed."""
    pip: ClassVar[str]
    """What to ``pip install`` to get it."""
    env: ClassVar[tuple[str, ...]] = ()
    """Environment variables that configure where (and how) it logs, read on the driver."""

    def __init__(self, run: SeedRun, settings: Mapping[str, str]) -> None:
        self.run = run
        self.settings = dict(settings)

    def setting(self, var: str) -> str | None:
        """``var`` as the driver had it, else as this worker has it (None: unset)."""
        return self.settings.get(var) or os.environ.get(var) or None

    @abstractmethod
    def open(self) -> None:
        """Start the seed's run afresh (an earlier run of the same seed is replaced)."""

    @abstractmethod
    def log(self, points: Sequence[Scalars]) -> None:
        """Log the seed's new evaluation points, in order."""

    @abstractmethod
    def close(self) -> None:
        """Flush and finish the run."""


TRACKERS: dict[str, type[Tracker]] = {}
"""Tracker name -> class (:func:`register`)."""


def register(cls: type[Tracker]) -> type[Tracker]:
    """Class decorator: add a :class:`Tracker` under its ``name``."""
    if cls.name in TRACKERS and TRACKERS[cls.name] is not cls:
        raise ValueError(f"tracker {cls.name!r} is registered twice")
    TRACKERS[cls.name] = cls
    return cls


def check_loggers(names: Sequence[str]) -> None:
    """Refuse (ConfigError on ``execution.loggers``) an unknown tracker, one named twice, or
    one whose client package is not installed here. Runs on the driver before Ray starts."""
    valid = ", ".join(sorted(TRACKERS))
    for name in names:
        if name not in TRACKERS:
            raise ConfigError("execution.loggers", f"unknown logger {name!r}", f"use any of: {valid}")
        cls = TRACKERS[name]
        if importlib.util.find_spec(cls.module) is None:
            raise ConfigError(
                "execution.loggers",
                f"logger {name!r} needs the Python package {cls.pip!r}, which is not installed",
                f"`pip install {cls.pip}` (on every node of a cluster), or remove {name} from "
                "execution.loggers",
            )
    if len(set(names)) != len(names):
        raise ConfigError("execution.loggers", "names a logger twice", "list each logger once")


def driver_settings(names: Sequence[str]) -> list[dict[str, Any]]:
    """What a trial needs to open ``names``: each name with the driver's values of its
    :attr:`Tracker.env` variables (the ``loggers`` entry of a unit payload)."""
    return [
        {"name": n, "env": {v: os.environ[v] for v in TRACKERS[n].env if os.environ.get(v)}}
        for n in names
    ]


class BundleTrackers:
    """The tracker runs of one bundle: per seed, per tracker, and how far each seed's
    ``metrics`` rows were logged. Runs open at the first :meth:`update`, afresh."""

    def __init__(self, loggers: Sequence[Mapping[str, Any]], runs: Sequence[SeedRun]) -> None:
        self.loggers = [(TRACKERS[str(lg["name"])], dict(lg.get("env", {}))) for lg in loggers]
        self.runs = list(runs)
        self.open: list[list[Tracker]] | None = None
        self.logged = [0] * len(self.runs)
        """Rows of each seed's ``metrics`` list already logged."""

    @classmethod
    def from_unit(cls, unit: Mapping[str, Any]) -> BundleTrackers | None:
        """The trackers a unit payload asks for (None: ``execution.loggers`` is empty)."""
        loggers = unit.get("loggers") or []
        if not loggers:
            return None
        spec = unit["spec"]
        runs = [
            SeedRun(
                out=str(unit["out"]), study=str(unit["study"]), trial_id=str(unit["trial_id"]),
                task=str(spec["task"]["name"]), model=str(spec["model"]["name"]), seeds=dict(s),
                point=str(unit.get("point_json", "{}")), config=dict(unit.get("flat", {})),
            )
            for s in unit["seeds"]
        ]
        return cls(loggers, runs)

    def update(self, metrics: Sequence[Rows]) -> None:
        """Log each seed's ``metrics`` rows not logged yet (``metrics[k]``: seed k's rows so
        far). Fewer rows than logged means the bundle was restored from an earlier
        checkpoint: its runs start afresh and get the whole curve again."""
        if self.open is None or any(len(m) < n for m, n in zip(metrics, self.logged, strict=True)):
            self._open()
        assert self.open is not None
        for k, rows in enumerate(metrics):
            new = scalars(rows[self.logged[k] :])
            if new:
                self.open[k] = [t for t in self.open[k] if _safely(t, "log", t.log, new)]
            self.logged[k] = len(rows)

    def close(self) -> None:
        """Flush and finish every open run (at commit, or when the trial stops)."""
        for trackers in self.open or []:
            for t in trackers:
                _safely(t, "close", t.close)
        self.open = None

    def _open(self) -> None:
        self.close()
        self.logged = [0] * len(self.runs)
        self.open = [
            [t for t in (cls(run, env) for cls, env in self.loggers) if _safely(t, "open", t.open)]
            for run in self.runs
        ]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created) for the block: one process at a time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _safely(tracker: Tracker, what: str, call: Any, *args: Any) -> bool:
    """``call(*args)``; a failure is reported on stderr (training goes on) and gives False."""
    try:
        call(*args)
        return True
    except Exception as exc:
        print(
            f"fineline: tracker {tracker.name} failed to {what} the run of {tracker.run.key} "
            f"({type(exc).__name__}: {exc}); it stops logging this bundle (Parquet has every row)",
            file=sys.stderr, flush=True,
        )
        return False


# ------------------------------------------------------------------------- the trackers
@register
class TensorBoard(Tracker):
    """``torch.utils.tensorboard.SummaryWriter``, one log folder per seed:
    ``OUT/NAME/tensorboard/<trial_id>/seed-<i>`` (open with ``tensorboard --logdir``)."""

    name = "tensorboard"
    module = "tensorboard"
    pip = "tensorboard"

    @property
    def logdir(self) -> Path:
        return self.run.folder / "tensorboard" / self.run.trial_id / self.run.name

    def open(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        shutil.rmtree(self.logdir, ignore_errors=True)  # a restarted seed starts its folder afresh
        self.writer = SummaryWriter(log_dir=str(self.logdir))
        table = "\n".join(f"| {k} | {v} |" for k, v in {**self.run.tags(), **self.run.params()}.items())
        self.writer.add_text("fineline", "| field | value |\n|---|---|\n" + table, 0)

    def log(self, points: Sequence[Scalars]) -> None:
        for p in points:
            for tag, value in p.values.items():
                self.writer.add_scalar(tag, value, p.x)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


@register
class MLflow(Tracker):
    """``mlflow.MlflowClient``: experiment = the study (``MLFLOW_EXPERIMENT_NAME``), one run
    per seed named ``<trial_id>/seed-<i>``, tagged ``fineline.trial_id`` (group by it in the
    UI). Store: ``MLFLOW_TRACKING_URI``, else the SQLite store ``OUT/NAME/mlflow.db`` (MLflow
    3 refuses new file stores such as ``mlruns/`` unless ``MLFLOW_ALLOW_FILE_STORE=true``);
    workers open it one at a time (a file lock), so none races another creating its tables."""

    name = "mlflow"
    module = "mlflow"
    pip = "mlflow"
    env = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_ALLOW_FILE_STORE")

    def open(self) -> None:
        uri = self.setting("MLFLOW_TRACKING_URI")
        if uri is not None:
            self._open(uri, None)
            return
        folder = self.run.folder.resolve()
        with _locked(folder / ".mlflow.lock"):
            self._open(f"sqlite:///{folder / 'mlflow.db'}", (folder / "mlartifacts").as_uri())

    def _open(self, uri: str, artifacts: str | None) -> None:
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        if self.setting("MLFLOW_ALLOW_FILE_STORE"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", str(self.setting("MLFLOW_ALLOW_FILE_STORE")))
        self.client = client = MlflowClient(tracking_uri=uri)
        experiment = self.setting("MLFLOW_EXPERIMENT_NAME") or self.run.study
        found = client.get_experiment_by_name(experiment)
        if found is None:
            try:
                exp_id = client.create_experiment(experiment, artifact_location=artifacts)
            except MlflowException:  # another worker created it just now
                found = client.get_experiment_by_name(experiment)
                assert found is not None
                exp_id = found.experiment_id
        else:
            exp_id = found.experiment_id
        for old in client.search_runs([exp_id], filter_string=f"tags.`fineline.run_key` = '{self.run.key}'"):
            client.delete_run(old.info.run_id)  # a restarted seed: its earlier run goes
        self.run_id = client.create_run(
            exp_id, tags=self.run.tags(), run_name=f"{self.run.trial_id}/{self.run.name}"
        ).info.run_id
        params = [Param(k, str(v)) for k, v in self.run.params().items()]
        for i in range(0, len(params), 100):
            client.log_batch(self.run_id, params=params[i : i + 100])

    def log(self, points: Sequence[Scalars]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, p.x) for p in points for k, v in p.values.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


@register
class WandB(Tracker):
    """``wandb.init`` per seed (several runs in one process: ``reinit="create_new"``, wandb
    >= 0.19.10): project = the study (``WANDB_PROJECT``), ``group`` = trial_id, ``name`` =
    seed-<i>, a deterministic ``id`` with ``resume="allow"`` so a restarted seed continues its
    run (points it already logged are skipped). Mode from ``WANDB_MODE`` (``offline`` writes
    under ``OUT/NAME/wandb``, or ``WANDB_DIR``; ``wandb sync`` uploads later)."""

    name = "wandb"
    module = "wandb"
    pip = "wandb"
    env = ("WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_DIR")

    def open(self) -> None:
        import wandb

        folder = Path(self.setting("WANDB_DIR") or self.run.folder)
        folder.mkdir(parents=True, exist_ok=True)
        r = self.run
        self.wb = wandb.init(
            project=self.setting("WANDB_PROJECT") or r.study, entity=self.setting("WANDB_ENTITY"),
            mode=self.setting("WANDB_MODE"), dir=str(folder), group=r.trial_id, job_type="seed",
            name=f"{r.trial_id[:8]}/{r.name}", id=f"fineline-{r.uid}", resume="allow",
            config=r.params(), tags=[r.study, r.task, r.model], reinit="create_new",
        )
        self.wb.summary.update(r.tags())
        self.first = int(self.wb.step) if self.wb.resumed else 0

    def log(self, points: Sequence[Scalars]) -> None:
        for p in points:
            if p.x >= self.first:  # a resumed run keeps what it had; its steps only grow
                when = {"opt_step": p.step} if p.epoch is None else {"epoch": p.epoch, "opt_step": p.step}
                self.wb.log({**p.values, **when}, step=p.x)

    def close(self) -> None:
        self.wb.finish()


@register
class Aim(Tracker):
    """``aim.Run`` per seed in the Aim repo ``OUT/NAME`` (``.aim`` inside; or
    ``FINELINE_AIM_REPO``, a path or ``aim://host:port``): experiment = the study, run name
    ``<trial_id>/seed-<i>``, metrics named by metric with context ``{"subset": split}``."""

    name = "aim"
    module = "aim"
    pip = "aim"
    env = ("FINELINE_AIM_REPO",)

    def open(self) -> None:
        from aim import Repo, Run

        path = self.setting("FINELINE_AIM_REPO") or str(self.run.folder)
        with _locked(self.run.folder / ".aim.lock"):  # one worker at a time creates the repo
            repo = Repo.from_path(path, init=not path.startswith("aim://") and not Repo.exists(path))
        # Aim makes its own run hashes; the seed's last one is kept beside the study's results
        known = self.run.folder / "aim-runs" / self.run.trial_id / self.run.name
        if known.is_file():  # a restarted seed: its earlier run goes
            repo.delete_run(known.read_text().strip())
        self.aim = Run(
            repo=repo, experiment=self.run.study, system_tracking_interval=None,
            log_system_params=False, capture_terminal_logs=False,
        )
        known.parent.mkdir(parents=True, exist_ok=True)
        known.write_text(self.aim.hash)
        self.aim.name = f"{self.run.trial_id}/{self.run.name}"
        self.aim["fineline_key"] = self.run.key
        self.aim["fineline"] = self.run.tags()
        self.aim["hparams"] = json.loads(json.dumps(self.run.params(), default=str))
        for tag in (self.run.study, self.run.task, self.run.model):
            self.aim.add_tag(tag)

    def log(self, points: Sequence[Scalars]) -> None:
        for p in points:
            for key, value in p.values.items():
                split, metric = key.split("/", 1)
                self.aim.track(value, name=metric, step=p.x, epoch=p.epoch, context={"subset": split})

    def close(self) -> None:
        self.aim.close()


__all__ = [
    "TRACKERS", "BundleTrackers", "Scalars", "SeedRun", "Tracker", "check_loggers",
    "driver_settings", "register", "scalars",
]
