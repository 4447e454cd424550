"""The ``study`` command line: run, resume, ls, status, sql, analyze, report, tune."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from trainables.errors import FinelineError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="fineline: hyperparameter and random-seed studies of neural networks on Ray.",
    pretty_exceptions_enable=False,
)

OutOpt = Annotated[Path, typer.Option("--out", help="Results folder (Parquet tables, study folders).")]
NameOpt = Annotated[str | None, typer.Option("--name", help="Study name (default: the config's `name`).")]
AddressOpt = Annotated[
    str | None, typer.Option("--address", help="Existing Ray cluster address (default: start a local Ray).")
]
CpusOpt = Annotated[int | None, typer.Option("--num-cpus", min=1, help="CPUs for a local Ray (default: all).")]
FormatOpt = Annotated[str, typer.Option("--format", help="table, csv or json.")]


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _study_name(name: str | None, cfg_name: str | None, field: str = "--name") -> str:
    from study.config import check_name

    chosen = name or cfg_name
    if not chosen:
        _fail("--name: the config has no `name` and none was given. Fix: pass --name NAME")
    return check_name(str(chosen), field)


@app.command()
def run(
    config: Annotated[Path | None, typer.Argument(help="Study YAML (omit with --from-best).")] = None,
    seeds: Annotated[int | None, typer.Option("--seeds", min=1, help="Seed count (overrides seeds.count).")] = None,
    name: NameOpt = None,
    out: OutOpt = Path("results"),
    address: AddressOpt = None,
    num_cpus: CpusOpt = None,
    from_best: Annotated[
        str | None, typer.Option("--from-best", help="Seed study of the best candidate of a tuning study.")
    ] = None,
) -> None:
    """Run (or resume) a seed study: every grid point x its seeds, one Ray Tune trial per bundle."""
    from study.config import load
    from study.runner import run_study

    if from_best is not None:
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
        cfg = load(config, seeds)
        study_name, extra = _study_name(name, cfg.name), None
    counts = run_study(cfg, study_name, out, address, num_cpus, extra_manifest=extra)
    typer.echo(
        f"study {study_name}: {counts['done']}/{counts['planned']} runs committed "
        f"({counts['ran']} run now) -> {out}/tables. Query: study sql --out {out} \"SELECT ...\""
    )


@app.command()
def resume(
    name: Annotated[str, typer.Argument(help="Study to finish.")],
    out: OutOpt = Path("results"),
    address: AddressOpt = None,
    num_cpus: CpusOpt = None,
) -> None:
    """Finish an interrupted study from its manifest (committed seeds are kept)."""
    from study import manifest
    from study.config import parse
    from study.runner import run_study

    m = manifest.read(out, name)
    if m is None:
        _fail(f"NAME: no study {name!r} in {out}. Fix: check `study ls --out {out}`")
    assert m is not None
    if m.get("kind") == "tune":
        from study.tuning import run_tuning

        run_tuning(parse(m["config"], None, m.get("plugin_dir")), name, out, int(m["tune_trials"]), address, num_cpus)
        return
    cfg = parse(m["config"], int(m["seeds"]), m.get("plugin_dir"))
    counts = run_study(cfg, name, out, address, num_cpus, extra_manifest={k: m[k] for k in ("tuned_from",) if k in m})
    typer.echo(f"study {name}: {counts['done']}/{counts['planned']} runs committed")


@app.command()
def tune(
    config: Annotated[Path, typer.Argument(help="Study YAML with a `tune:` block.")],
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

    Re-running with the same --name resumes (finished candidates are kept). See docs/tuning.md.
    """
    from analysis.db import run_sql
    from study.config import load
    from study.tuning import ranking_sql, run_tuning, storage_url, tune_block

    cfg = load(config)
    study_name = _study_name(name, cfg.name)
    counts = run_tuning(cfg, study_name, out, trials, address, num_cpus)
    block = tune_block(cfg)
    query = ranking_sql(study_name, str(block.direction), list(block.space or {}))
    typer.echo(
        f"tuning study {study_name}: {counts['finished']}/{counts['requested']} candidates finished "
        f"({counts['ran']} run now). Optuna storage: {storage_url(out, study_name)}\n"
        f"Top candidates (study sql --out {out} \"{query}\"):\n{run_sql(out, query)}\n"
        f"Seed study of the best: study run --from-best {study_name} --out {out}"
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
    from study.plugins_info import registered

    if config is not None:
        from study.config import load

        load(config)
    typer.echo(_format(registered(with_docs=fields), fmt))


@app.command("ls")
def ls(out: OutOpt = Path("results"), fmt: FormatOpt = "table") -> None:
    """List studies with their status and counts."""
    from analysis.db import list_studies

    typer.echo(_format(list_studies(out), fmt))


@app.command()
def status(name: Annotated[str, typer.Argument()], out: OutOpt = Path("results"), fmt: FormatOpt = "table") -> None:
    """Planned, done, diverged, failed and pending seeds per grid point."""
    from study.status import study_status

    typer.echo(_format(study_status(out, name), fmt))


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="SQL over the views trials, runs, metrics, evals, predictions.")],
    out: OutOpt = Path("results"),
    fmt: FormatOpt = "table",
) -> None:
    """Query every study's results in a read-only DuckDB connection."""
    from analysis.db import run_sql

    typer.echo(run_sql(out, query, fmt))  # type: ignore[arg-type]


@app.command()
def analyze(name: Annotated[str, typer.Argument()], out: OutOpt = Path("results"), fmt: FormatOpt = "table") -> None:
    """Seed statistics: summary, correlations between test splits, configured regressions."""
    from analysis.report import analyze as do_analyze

    typer.echo(do_analyze(out, name, fmt))  # type: ignore[arg-type]


@app.command()
def report(
    name: Annotated[str, typer.Argument()],
    out: OutOpt = Path("results"),
    to: Annotated[Path | None, typer.Option("--to", help="HTML file, .png/.svg file, or a folder.")] = None,
) -> None:
    """Write a self-contained HTML report of Altair charts (or PNG/SVG exports)."""
    from analysis.report import write_report

    path = write_report(out, name, to)
    typer.echo(f"report written: {path}")


def _format(items: list[Any], fmt: str) -> str:
    import dataclasses
    import json

    rows = [
        dataclasses.asdict(r) if dataclasses.is_dataclass(r) and not isinstance(r, type) else dict(r)
        for r in items
    ]

    if fmt == "json":
        return json.dumps(rows, indent=2, default=str)
    if not rows:
        return "(none)"
    cols = list(rows[0])
    if fmt == "csv":
        return "\n".join([",".join(cols)] + [",".join(str(r.get(c, "")) for c in cols) for r in rows])
    widths = [max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(str(r.get(c, "")).ljust(w) for c, w in zip(cols, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def main() -> None:
    """Console entry point: user errors print one clear line and exit 2."""
    try:
        app()
    except FinelineError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except Exception as exc:
        if type(exc).__name__ == "AnalysisError":
            typer.echo(f"error: {exc}", err=True)
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
