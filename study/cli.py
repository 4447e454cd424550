"""The ``study`` command line: run, resume, stop, ls, status, sql, analyze, report, tune, eval, check.

Words, as the output and the help use them: a **config** is one resolved configuration
(task, model, training), named by its ``trial_id`` (a hash; the Parquet column keeps that
name); a **run** is one config trained with one seed (one row of ``runs``); a **bundle**
is the seeds of one config trained together as one Ray Tune trial; a **candidate** is one
config an Optuna search proposed (an Optuna trial).
"""

from __future__ import annotations

import errno
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from trainables.errors import ConfigError, FinelineError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="fineline: hyperparameter and random-seed studies of neural networks on Ray.\n\n"
    "Words: a config is one resolved configuration, named by its trial_id (a hash); a run is "
    "one config trained with one seed; a bundle is the seeds of one config trained together as "
    "one Ray Tune trial; a candidate is one config an Optuna search proposed (an Optuna trial).",
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)

OutOpt = Annotated[Path, typer.Option("--out", help="Results folder (Parquet tables, study folders).")]
VerdictMetricOpt = Annotated[
    str | None,
    typer.Option("--verdict-metric", help="The metric the verdict speaks about (default: the task's "
                 "declared verdict, else its primary metric)."),
]
VerdictSplitOpt = Annotated[
    list[str] | None,
    typer.Option("--verdict-split", help="A split the verdict speaks about, the first one its headline "
                 "(repeatable): a split's name, or NAME=A+B+... for the per-run mean over splits A, B, ... "
                 "(e.g. 'band=len_15+len_16'). Default: the task's declared verdict, else the test splits."),
]
NameOpt = Annotated[str | None, typer.Option("--name", help="Study name (default: the config's `name`).")]
AddressOpt = Annotated[
    str | None,
    typer.Option("--address", envvar="RAY_ADDRESS",
                 help="Existing Ray cluster address, e.g. HEAD_IP:6379 or auto (default: RAY_ADDRESS, as "
                      "`ray job submit` sets it; else a local Ray of this study's own)."),
]
CpusOpt = Annotated[int | None, typer.Option("--num-cpus", min=1, help="CPUs for a local Ray (default: all).")]
FormatOpt = Annotated[str, typer.Option("--format", help="table, csv or json (checked before anything runs).")]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="Overrides of the study file, Hydra style: dotted.field=value, e.g. train.lr=0.05 "
        "seeds.count=10 model.hidden_size=64 (values are YAML: 10, 0.05, 1e-3, true, null, \\[a,b]); "
        "validated like the file and recorded in the study's manifest.",
        show_default=False,
    ),
]


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _config_file(config: Path) -> Path:
    """The CONFIG argument, refused when it is an override given without a study file first."""
    if "=" in config.name and not config.exists():
        _fail(f"CONFIG: {str(config)!r} is an override, not a study file. Fix: give the study file "
              f"first, then the overrides: `study run configs/quickstart.yaml {config}`")
    return config


def _study_name(name: str | None, cfg_name: str | None, field: str = "--name") -> str:
    from study.config import check_name

    chosen = cfg_name if name is None else name
    if name is not None and not name.strip():
        _fail("--name: is empty. Fix: pass a name, e.g. --name my_study (or leave --name out to use the config's)")
    if not chosen:
        _fail("--name: the config has no `name` and none was given. Fix: pass --name NAME")
    return check_name(str(chosen), field)


@app.command()
def run(
    config: Annotated[Path | None, typer.Argument(help="Study YAML (omit with --from-best).")] = None,
    overrides: OverridesArg = None,
    seeds: Annotated[
        int | None, typer.Option("--seeds", min=1, help="Seed count of every config (like seeds.count=N).")
    ] = None,
    name: NameOpt = None,
    out: OutOpt = Path("results"),
    address: AddressOpt = None,
    num_cpus: CpusOpt = None,
    from_best: Annotated[
        str | None, typer.Option("--from-best", help="Seed study of the best candidate of a tuning study.")
    ] = None,
) -> None:
    """Run (or resume) a seed study: every config (grid point) x its seeds.

    Each bundle (the seeds of one config trained together) is one Ray Tune trial; each run
    (config x seed) lands in Parquet."""
    from study.config import load, partly_shadowed
    from study.runner import run_study

    if from_best is not None:
        given = [str(config)] if config is not None else []
        given += overrides or []
        if any("=" in g for g in given):
            _fail(f"{next(g for g in given if '=' in g)}: overrides need a CONFIG; --from-best takes its "
                  "config from the tuning study. Fix: drop the overrides (--seeds and --name still apply)")
        if config is not None:
            _fail("CONFIG: give either a CONFIG or --from-best, not both. Fix: drop one")
        from study.tuning import best_config

        cfg, study_name, extra = best_config(out, from_best, seeds, name)
        src = extra["tuned_from"]
        typer.echo(
            f"seed study {study_name} of candidate {src['trial_id']} of tuning study {from_best} "
            f"(objective {src['objective']:.4g}, params {src['params']})",
            err=True,
        )
    else:
        if config is None:
            _fail("CONFIG: missing. Fix: `study run configs/quickstart.yaml` or `study run --from-best TUNE_STUDY`")
        assert config is not None
        cfg = load(_config_file(config), seeds, overrides or ())
        tuning = next((o for o in overrides or () if o.strip().removeprefix("+").startswith("tune.")), None)
        if tuning is not None:  # it made a tune: block `study run` never reads (unchecked, and "the file has one")
            _fail(f"{tuning.partition('=')[0].strip()}: only `study tune` reads the tune: block, so on `study run` "
                  "this override would change nothing. Fix: leave it out, or run `study tune` with it")
        study_name, extra = _study_name(name, cfg.name), None
        for note in partly_shadowed(cfg):
            typer.echo(note, err=True)
        if cfg.tune is not None:
            typer.echo(f"note: {config} has a tune: block, which `study tune` searches with; `study run` "
                       "trains the file's own config(s) x seeds without it", err=True)
    counts = run_study(cfg, study_name, out, address, num_cpus, extra_manifest=extra)
    typer.echo(_finished(study_name, out, counts))


def _finished(name: str, out: Path, counts: dict[str, int]) -> str:
    """The last line of a finished `study run` / `study resume`: counts and what to run next."""
    failed = counts.get("recorded_failed", 0)
    recorded = f", {failed} of them recorded as failed" if failed else ""
    return (
        f"study {name}: {counts['done']}/{counts['planned']} runs committed{recorded} "
        f"({counts['ran']} run now) -> {out}/tables. Next: study analyze {name} --out {out}; "
        f"study report {name} --out {out}; study status {name} --out {out}"
    )


@app.command()
def resume(
    name: Annotated[str, typer.Argument(help="Study to finish.")],
    out: OutOpt = Path("results"),
    address: AddressOpt = None,
    num_cpus: CpusOpt = None,
    seeds: Annotated[
        int | None,
        typer.Option("--seeds", min=1, help="Grow a seed study: at least this many seeds per config "
                     "(committed runs are kept; the recorded overrides need not be typed again)."),
    ] = None,
    skip_failed: Annotated[
        bool, typer.Option("--skip-failed", help="Record the seeds the last run left failed as failed runs "
                           "(runs.status 'failed', runs.error why) instead of running them again.")
    ] = False,
    retry_failed: Annotated[
        bool, typer.Option("--retry-failed", help="Run the seeds recorded as failed (--skip-failed) again.")
    ] = False,
) -> None:
    """Finish an interrupted study from its manifest (committed runs are kept).

    It reruns the config recorded there (the study file with its command-line overrides
    applied) with its seed counts; --seeds N grows every config to at least N seeds. A seed
    that fails every time can be recorded as a failed run with --skip-failed (analyses count
    it apart, like a diverged run), and run again later with --retry-failed."""
    import dataclasses

    from study import manifest
    from study.runner import recorded_study, run_study

    m = manifest.read(out, name)
    if m is None:
        from study.check import no_manifest

        problem, fix = no_manifest(out, name)
        _fail(f"NAME: {problem}. Fix: {fix}")
    assert m is not None
    try:
        int(m["seeds"])
        trials = int(m.get("tune_trials", 0))
    except (TypeError, ValueError):
        raise ConfigError("NAME", f"the manifest {out}/{name}/study.json is damaged (seeds / tune_trials)",
                          "restore it, or re-create it with `study run CONFIG --name NAME`") from None
    recorded = tuple(str(o) for o in m.get("overrides") or ())  # already applied to m["config"]
    if skip_failed and retry_failed:
        _fail("--skip-failed and --retry-failed: give one of them. Fix: drop one")
    if m.get("kind") == "tune":
        from study.tuning import run_tuning

        if skip_failed or retry_failed:
            raise ConfigError("--skip-failed" if skip_failed else "--retry-failed",
                              f"{name} is a tuning study: a failed candidate stays a FAIL trial of its Optuna "
                              "search, and a resume asks Optuna for new candidates in its place",
                              "resume it without the flag (to train a failed candidate's config again, run it "
                              "as a seed study, or enqueue it in a new search: tune.enqueue)")
        if seeds is not None:
            raise ConfigError("--seeds", f"{name} is a tuning study: its seeds per candidate are part of "
                              "its search", f"run a seed study of its best candidate: `study run --from-best "
                              f"{name} --seeds {seeds} --out {out}`")

        raw = manifest.recorded_config(m)
        cfg = dataclasses.replace(manifest.parse_recorded(m, raw, None), overrides=recorded)
        counts = run_tuning(cfg, name, out, trials, address, num_cpus)
        typer.echo(_tuning_summary(cfg, name, out, counts, address))
        return
    cfg, extra = recorded_study(out, name, m)
    if seeds is not None:
        from study.config import with_point_counts

        cfg = with_point_counts(cfg, {p.trial_id: max(p.seeds.count, seeds) for p in cfg.points})
    failed: Literal["skip", "retry"] | None = "skip" if skip_failed else "retry" if retry_failed else None
    counts = run_study(cfg, name, out, address, num_cpus, extra_manifest=extra, failed_seeds=failed)
    typer.echo(_finished(name, out, counts))


@app.command()
def tune(
    config: Annotated[Path, typer.Argument(help="Study YAML with a `tune:` block.")],
    overrides: OverridesArg = None,
    trials: Annotated[
        int | None,
        typer.Option("--trials", min=1, help="Candidates to finish (overrides tune.trials)."),
    ] = None,
    name: NameOpt = None,
    out: OutOpt = Path("results"),
    address: AddressOpt = None,
    num_cpus: CpusOpt = None,
) -> None:
    """Search hyperparameters with Optuna against a val / val_ood split (never a test split).

    Each candidate (an Optuna trial) is one config, trained with tune.seeds_per_candidate seeds.

    Re-running with the same --name resumes (finished candidates are kept). See docs/tuning.md.
    """
    from study.config import load
    from study.tuning import run_tuning

    cfg = load(_config_file(config), None, overrides or ())
    study_name = _study_name(name, cfg.name)
    counts = run_tuning(cfg, study_name, out, trials, address, num_cpus)
    typer.echo(_tuning_summary(cfg, study_name, out, counts, address))


def _tuning_summary(cfg: Any, name: str, out: Path, counts: dict[str, int], address: str | None) -> str:
    """What `study tune` and `study resume` print after a search: counts, the top
    candidates (with the query that ranks them) and the command of the seed study."""
    from analysis.db import run_sql
    from study.tuning import ranking_sql, storage_url, tune_block

    block = tune_block(cfg)
    query = ranking_sql(name, str(block.direction), list(block.space or {}))
    at = f" --address {address}" if address else ""
    return (
        f"tuning study {name}: {counts['finished']}/{counts['requested']} candidates finished "
        f"({counts['ran']} run now). Optuna storage: {storage_url(out, name)}\n"
        f"Top candidates (study sql --out {out} \"{query}\"):\n{run_sql(out, query)}\n"
        f"Seed study of the best: study run --from-best {name} --out {out}{at}"
    )


@app.command()
def plugins(
    config: Annotated[
        Path | None, typer.Argument(help="A study file whose `plugins:` to load too.")
    ] = None,
    fields: Annotated[bool, typer.Option("--fields", help="Each config field with its doc.")] = False,
    fmt: FormatOpt = "table",
) -> None:
    """Registered tasks and models: where each came from (entry point or study file) and its
    config fields. With CONFIG, the study file's `plugins:` are loaded first."""
    from analysis.formatting import format_rows
    from study.plugins_info import fields_text, registered

    if config is not None:
        from study.config import load

        load(config)
    rows = registered(with_docs=fields)
    typer.echo(fields_text(rows) if fields and fmt == "table" else format_rows(rows, fmt))


@app.command("ls")
def ls(out: OutOpt = Path("results"), fmt: FormatOpt = "table") -> None:
    """List studies with their counts.

    configs: grid points (a tuning study: candidates) planned; planned and done count runs
    (one config x one seed); ok, diverged and not_learned split the done runs; failed counts
    runs recorded as failed and the seeds the last run's failed trials left uncommitted, as
    `study status` does, and pending the rest of the planned runs."""
    from analysis.db import format_studies, list_studies
    from study.status import with_uncommitted_failures

    typer.echo(format_studies(with_uncommitted_failures(out, list_studies(out)), fmt))


@app.command()
def status(name: Annotated[str, typer.Argument()], out: OutOpt = Path("results"), fmt: FormatOpt = "table") -> None:
    """Seeds planned, done, diverged, failed and pending per config.

    One row per config (grid point; trial_id is its hash): seeds planned, done (committed),
    ok, diverged, not_learned, failed (left uncommitted by the last run's failed trials, or
    recorded as failed runs by `study resume --skip-failed`) and pending. A table ends with why the last run's seeds failed, or why it stopped early. A
    tuning study: one row per candidate, with its Optuna state and objective, then how far
    the search is and its best candidate so far."""
    from analysis.formatting import format_rows
    from analysis.manifest import point_label
    from study.status import (
        committed_runs,
        driver_lines,
        last_run_lines,
        recorded_failed_lines,
        study_manifest,
        study_status,
        tuning_lines,
        tuning_status,
    )

    m = study_manifest(out, name)
    runs = committed_runs(out, name)  # read once: the table and the failure lines both need it
    tuning = m.get("kind") == "tune"
    rows = (tuning_status if tuning else study_status)(out, name, m, runs)
    labels = [point_label(r["point"]) for r in rows]  # the label `study analyze` prints
    if fmt == "table":  # csv and json keep the point as JSON
        rows = [{**r, "point": label} for r, label in zip(rows, labels, strict=True)]
    typer.echo(format_rows(rows, fmt))
    if tuning:
        lines = tuning_lines(out, name, rows, m, {r["candidate"]: lb for r, lb in zip(rows, labels, strict=True)})
    else:
        by_id = {r["trial_id"]: lb for r, lb in zip(rows, labels, strict=True)}
        lines = last_run_lines(out, name, by_id, runs) + recorded_failed_lines(out, name, by_id, runs)
    lines = driver_lines(out, name, more=bool(lines)) + lines
    for line in lines:  # csv and json keep stdout to the rows: the lines go to stderr there
        typer.echo(line, err=fmt != "table")


@app.command()
def stop(
    name: Annotated[str, typer.Argument(help="Study whose running driver to stop.")],
    out: OutOpt = Path("results"),
    now: Annotated[
        bool, typer.Option("--now", help="Stop the running bundles too (SIGINT to the driver, as Ctrl-C in "
                           "its terminal; the driver must run on this machine).")
    ] = False,
) -> None:
    """Stop a running study from another terminal: its driver finishes the bundles running
    now and starts no new one, then exits 3 with its counts and the resume command (0 when
    none was left to start: the study is complete).

    Committed runs are kept either way; `study resume NAME` finishes the study later. With
    --now the running bundles stop too (exit 130), as Ctrl-C would."""
    from study.steer import request_stop

    typer.echo(request_stop(out, name, now))


@app.command()
def sql(
    query: Annotated[str, typer.Argument(
        help="SQL over the views trials, runs, metrics, evals, predictions, evaluations (study eval's "
        "later evaluations) and configs (one row per config: JOIN configs USING (study, trial_id)).",
    )],
    out: OutOpt = Path("results"),
    fmt: FormatOpt = "table",
) -> None:
    """Query every study's results in a read-only DuckDB connection."""
    from analysis.db import run_sql

    typer.echo(run_sql(out, query, fmt))  # type: ignore[arg-type]


@app.command()
def analyze(
    name: Annotated[str, typer.Argument()],
    out: OutOpt = Path("results"),
    fmt: Annotated[
        str,
        typer.Option("--format", help="table, json (every section; schema: docs/analysis.md) or csv "
                     "(the summary table: one row per config, split and metric)."),
    ] = "table",
    n_boot: Annotated[int, typer.Option("--n-boot", min=100, help="Bootstrap resamples per interval.")] = 2000,
    event: Annotated[
        list[str] | None,
        typer.Option("--event", help="Time to an event read from the learning curves, "
                     "'[NAME:] SPLIT METRIC OP THRESHOLD [after SPLIT METRIC OP THRESHOLD]' (e.g. "
                     "'val accuracy >= 0.5', 'groks: test accuracy >= 0.95 after train accuracy >= 0.99'; "
                     "repeatable; replaces the task's declared events)."),
    ] = None,
    half_width: Annotated[
        float | None,
        typer.Option("--half-width", min=0, help="Seeds needed to estimate a mean to +- this "
                     "(default 0.02 for a [0, 1] metric, else 2% of the mean)."),
    ] = None,
    difference: Annotated[
        float | None,
        typer.Option("--difference", min=0, help="Seeds per config to detect this difference "
                     "with 80% power (default 0.05 for a [0, 1] metric, else 5% of the mean)."),
    ] = None,
    verdict_metric: VerdictMetricOpt = None,
    verdict_split: VerdictSplitOpt = None,
) -> None:
    """The verdict (does the config or the seed decide?), then seed statistics: summary with
    bootstrap intervals, correlations between test splits, configured regressions, time to
    events, seeds needed and the seeds x examples Multi-Bootstrap."""
    from functools import partial

    from analysis.db import naming_damage
    from analysis.report import analyze as do_analyze

    do_analyze = partial(do_analyze, events=event, half_width=half_width, difference=difference,
                         verdict_metric=verdict_metric, verdict_splits=verdict_split)  # fmt: skip

    if fmt == "csv":
        import json

        from analysis.formatting import format_rows

        with naming_damage(out):
            doc = json.loads(do_analyze(out, name, "json", n_boot=n_boot))
        typer.echo(format_rows(doc["summary"], "csv"))
        return
    with naming_damage(out):
        typer.echo(do_analyze(out, name, fmt, n_boot=n_boot))


@app.command()
def report(
    name: Annotated[str, typer.Argument()],
    out: OutOpt = Path("results"),
    to: Annotated[str | None, typer.Option("--to", help="HTML file, .png/.svg/.pdf file, or a folder "
                                           "(a path without suffix, an existing folder, or one ending in /).")] = None,
    band: Annotated[str, typer.Option("--band", help="ci (95% bootstrap band of the mean) or minmax.")] = "ci",
    verdict_metric: VerdictMetricOpt = None,
    verdict_split: VerdictSplitOpt = None,
) -> None:
    """Write a self-contained HTML report (verdict, then Altair charts), or PNG/SVG/PDF exports."""
    from analysis.bands import BANDS
    from analysis.db import naming_damage
    from analysis.report import write_report

    if band not in BANDS:  # before any results are read
        raise ConfigError("--band", f"unknown band {band!r}", "use ci (95% bootstrap band of the mean) or minmax")
    folder = False
    if to is not None:
        if not to.strip():  # Path("") is ".": the charts went into the current folder
            raise ConfigError("--to", "is empty", "give a file (e.g. --to report.html or --to report.png) "
                              "or a folder (e.g. --to charts/)")
        blocker = next((p for p in Path(to).parents if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            raise ConfigError("--to", f"{to} cannot be written: {blocker} is a file, not a folder",
                              "give a path under a folder (e.g. --to report.html or --to charts/)")
        folder = to.endswith(("/", os.sep))  # Path() drops the slash: report.png/ wrote a file
        if folder and Path(to).exists() and not Path(to).is_dir():
            raise ConfigError("--to", f"{to} names a folder, but {to.rstrip('/' + os.sep)} is a file",
                              "drop the trailing / to overwrite the file, or name another folder")

    with naming_damage(out):
        path = write_report(out, name, None if to is None else Path(to), folder=folder, band=band,
                            verdict_metric=verdict_metric, verdict_splits=verdict_split)
    typer.echo(f"report written: {path}")


@app.command("eval")
def evaluate(
    name: Annotated[str, typer.Argument(help="Seed study whose kept weights to evaluate.")],
    split: Annotated[
        list[str] | None,
        typer.Option("--split", help="Test split to (re-)evaluate even if unchanged (repeatable; "
                     "default: every test split added or changed since training)."),
    ] = None,
    out: OutOpt = Path("results"),
) -> None:
    """Evaluate a study's kept weights (execution.keep_weights) on test splits added or changed
    since training, without retraining: new evals / predictions rows under each split's name,
    each evaluation committed on its own; re-running writes nothing new. CPU, no Ray."""
    from collections import Counter

    from study.evaluate import evaluate_study

    done = evaluate_study(out, name, split or ())
    if not done.committed:
        typer.echo(f"study {name}: every test split of its {done.kept} kept runs is up to date (nothing written)")
        return
    per = Counter((s, why) for s, _, _, why in done.committed)
    what = "; ".join(f"{s}: {n} {why}" for (s, why), n in sorted(per.items()))
    skipped = f"; {done.without_weights} runs without kept weights skipped" if done.without_weights else ""
    typer.echo(
        f"study {name}: {len(done.committed)} evaluation{'s' * (len(done.committed) != 1)} committed "
        f"({what}), {done.up_to_date} up to date"
        f"{skipped}. Rows: study sql --out {out} \"SELECT e.split, e.seed, v.metric, v.value FROM evaluations e "
        f"JOIN evals v USING (study, trial_id, seed, split) WHERE e.study = '{name}'\""
    )


@app.command()
def check(
    name: Annotated[str | None, typer.Argument(help="Study to check (default: every study in --out).")] = None,
    repair: Annotated[
        bool, typer.Option("--repair", help="Move the damaged files to OUT/NAME/quarantine/ and run "
                           "exactly those runs and evaluations again (holds the study's lock).")
    ] = False,
    out: OutOpt = Path("results"),
    address: AddressOpt = None,
    num_cpus: CpusOpt = None,
    fmt: FormatOpt = "table",
) -> None:
    """Verify every committed run and evaluation against what its commit recorded (files,
    row counts, sha256); print each damaged file; exit 1 when any is damaged.

    --repair re-runs the damaged runs (from the manifest, like `study resume`) and
    evaluations, then checks again. Damaged files never block queries: the views leave them
    out with a warning."""
    from analysis.formatting import format_rows
    from study.check import COLUMNS, check_study, repair_study, studies

    if not out.is_dir():
        _fail(f"--out: results folder {out} does not exist. Fix: pass the folder a study wrote")
    names = [name] if name is not None else studies(out)
    if name is not None and name not in studies(out):
        _fail(f"NAME: no study {name!r} in {out}. Fix: check `study ls --out {out}`")
    rows, lines, damaged, repairable = [], [], False, False
    for study_name in names:
        if not repair:
            found = check_study(out, study_name)
            rows += [d.as_dict() for d in found.damage]
            lines.append(found.summary())
            damaged |= bool(found.damage)
            repairable |= found.repairable
            continue
        shown: list[bool] = []

        def moved_now(before: Any, moved: Any, shown: list[bool] = shown) -> None:
            """The damage and the move, printed before anything runs again (a log of a
            repair that is interrupted still says what was moved where)."""
            if fmt != "table":
                return
            if before.damage:
                typer.echo(format_rows([d.as_dict() for d in before.damage], fmt, columns=list(COLUMNS)))
            typer.echo(before.summary())
            if moved.folder is not None:
                typer.echo(f"repair: {len(moved.files)} files moved to {moved.folder}; running them again")
            sys.stdout.flush()
            shown.append(True)

        done = repair_study(out, study_name, address, num_cpus, on_moved=moved_now)
        if not shown:
            rows += [d.as_dict() for d in done.before.damage]
            lines.append(done.before.summary())
        if done.moved.folder is not None:
            lines.append(
                f"repair: {len(done.moved.files)} files moved to {done.moved.folder}; {done.ran} "
                f"run{'s' * (done.ran != 1)} trained again, {done.evaluated} evaluation"
                f"{'s' * (done.evaluated != 1)} run again"
                + (f"; not re-run (split gone from the task): {', '.join(done.not_evaluated)}"
                   if done.not_evaluated else "")
            )
        assert done.after is not None
        if done.before.damage:  # nothing was damaged: nothing was repaired, no "after repair"
            lines.append(f"after repair: {done.after.summary()}")
        damaged |= bool(done.after.damage)
    if fmt == "table":
        if rows:
            typer.echo(format_rows(rows, fmt, columns=list(COLUMNS)))
        typer.echo("\n".join(lines))
        if repairable and not repair:
            which = f" {name}" if name is not None else ""
            typer.echo(f"Fix: study check{which} --repair --out {out} (moves the damaged files to "
                       "OUT/NAME/quarantine/, then runs those runs and evaluations again)")
    else:
        typer.echo(format_rows(rows, fmt, columns=list(COLUMNS)))
        typer.echo("\n".join(lines), err=True)
    if damaged:
        raise typer.Exit(1)


MAX_ERROR = 800
"""Longest error line the CLI prints (characters); longer messages are cut."""

WRITES = ("run", "resume", "tune", "eval")
"""Commands that write under --out (the others only read it)."""
NAMED = ("resume", "stop", "status", "analyze", "report", "eval", "check")
"""Commands whose NAME argument is a study name (one folder under --out)."""


def error_line(message: str) -> str:
    """One ``error: ...`` line: whitespace runs (newlines included) collapsed, capped at MAX_ERROR."""
    text = re.sub(r"\s+", " ", str(message)).strip()
    if len(text) > MAX_ERROR:
        text = text[: MAX_ERROR - 40].rstrip() + f" ... ({len(text)} characters, cut)"
    return f"error: {text}"


def _name_param(ctx: Any, param: Any, value: Any) -> Any:
    """A study NAME argument: one folder name under --out (no '/', '..' or control character)."""
    from study.manifest import check_name  # not study.config: `study status` stays torch-free

    return value if value is None else check_name(value, "NAME")


def _format_param(ctx: Any, param: Any, value: str | None) -> str | None:
    """``--format``: one of table, csv, json, refused as it is parsed (before any work)."""
    from analysis.formatting import FORMATS

    if value is not None and value not in FORMATS:
        raise ConfigError("--format", f"unknown format {value!r}", f"use one of: {', '.join(FORMATS)}")
    return value


def _out_param(ctx: Any, param: Any, value: Path | None) -> Path | None:
    """``--out``: a folder (or a path where one can be made); for writing commands also writable."""
    if value is None:
        return value
    writes = ctx.command.name in WRITES
    path = Path(value)
    if "\0" in str(path) or any(ord(c) < 32 for c in str(path)):
        raise ConfigError("--out", f"{str(path)!r} holds a control character", "give a plain folder path")
    if path.exists() and not path.is_dir():
        kind = "a file" if path.is_file() else "not a folder (a device, socket or pipe)"
        raise ConfigError("--out", f"{path} is {kind}", "give a folder (it is created if missing), e.g. --out results")
    if writes:
        existing = path
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise ConfigError("--out", f"{path} cannot be created: {existing} is not a folder",
                              "give a folder path under a folder you can write")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise ConfigError("--out", f"{existing} is not writable", "give an --out folder you can write")
    return value


def _refuse_empty_out(process_value: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``--out``'s value processing, refusing an empty value before it becomes ``Path('.')``
    (the current folder, which a study would then write into)."""
    def process(ctx: Any, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            raise ConfigError("--out", "is empty", "give the results folder, e.g. --out results")
        return process_value(ctx, value)
    return process


def _command() -> Any:
    """The click command behind ``app``, with NAME and --out checked as they are parsed."""
    command = typer.main.get_command(app)
    for name, sub in command.commands.items():  # type: ignore[attr-defined]
        for param in sub.params:
            if param.name == "out":
                param.callback = _out_param
                param.process_value = _refuse_empty_out(param.process_value)  # type: ignore[method-assign]
            elif param.name == "fmt":
                param.callback = _format_param
            elif param.name == "name" and name in NAMED:
                param.callback = _name_param
    return command


UNWRITABLE_FIX = {
    "report": "write the report elsewhere with --to FILE.html (or --to DIR/ for PNGs)",
    "check": "make the results folder writable (remount it read-write, or fix its permissions), or repair "
             "a writable copy of it (--out COPY)",
}
"""The fix for a folder that cannot be written, by command: a study's own folder cannot be
moved with --out by a command that reads the study from there."""
UNWRITABLE_FIX["resume"] = UNWRITABLE_FIX["eval"] = UNWRITABLE_FIX["check"]


def _os_error(exc: OSError, command: str = "") -> str:
    where = f": {exc.filename}" if exc.filename else ""
    what = exc.strerror or str(exc) or type(exc).__name__
    unwritable = UNWRITABLE_FIX.get(command)
    fixes = {
        errno.ENOSPC: "free disk space there and re-run the same command (committed runs are kept)",
        errno.EDQUOT: "free disk space there and re-run the same command (committed runs are kept)",
        errno.EACCES: unwritable or "give a path you can write (--out) or fix its permissions",
        errno.EPERM: unwritable or "give a path you can write (--out) or fix its permissions",
        errno.EROFS: unwritable or "give an --out on a writable file system",
        errno.ENOTDIR: "give a folder path, not a file",
        errno.EISDIR: "give a file path, not a folder",
        errno.ENOENT: "check the path",
    }
    return f"{what}{where}. Fix: {fixes.get(exc.errno or 0, 'check the path and the disk')}"


def cli_main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI on ``argv`` (default: ``sys.argv[1:]``) and return its exit code.

    Exit codes: 0 done; 1 a study ran but is incomplete (failed runs) or an OS error (e.g. a
    full disk); 2 the input was refused (nothing ran, OUT untouched); 3 stopped by `study
    stop` (its line starts ``stopped:``); 130 / 143 stopped by
    SIGINT / SIGTERM / SIGHUP (committed runs kept). Every error is one ``error: ...`` line on stderr
    naming the field and the fix, never a traceback (except for a bug in fineline)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = _command().main(args=args, prog_name="study", standalone_mode=False)
    except FinelineError as exc:
        code = int(getattr(exc, "exit_code", 2))
        line = error_line(str(exc))
        from study.steer import DRAINED_EXIT

        # a stop the user asked for (`study stop`) is no error
        typer.echo(line.replace("error: ", "stopped: ", 1) if code == DRAINED_EXIT else line, err=True)
        return code
    except typer.Abort:
        typer.echo(error_line("interrupted; committed runs are kept. Fix: re-run the same command"), err=True)
        return 130
    except KeyboardInterrupt:
        typer.echo(error_line("interrupted; committed runs are kept. Fix: re-run the same command"), err=True)
        return 130
    except typer.TyperException as exc:  # click's usage errors (bad option, missing argument)
        if type(exc).__name__ == "NoArgsIsHelpError":
            return 2  # the help is already printed
        command = getattr(getattr(exc, "ctx", None), "command_path", "study")
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        typer.echo(error_line(f"{message.rstrip('.')}. Fix: see `{command} --help`"), err=True)
        return int(getattr(exc, "exit_code", 2))
    except OSError as exc:
        typer.echo(error_line(_os_error(exc, args[0] if args else "")), err=True)
        return 1
    except Exception as exc:
        if type(exc).__name__ == "AnalysisError":
            typer.echo(error_line(str(exc)), err=True)
            return 2
        raise
    return result if isinstance(result, int) else 0


if __name__ == "__main__":  # ``python -m study.cli``; the console script is study.__main__
    sys.exit(cli_main())
