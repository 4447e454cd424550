"""One output formatter for every command that prints a table (``ls``, ``status``, ``sql``,
``analyze``, ``plugins``): the same ``--format table|csv|json``, an unknown format refused
before any work, CSV written by the csv library, and ``status`` / ``ls`` answering without
importing torch or Ray.

The results folders here are written with the real writers (``trainables.results``,
``study.manifest.prepare``) instead of a Ray run, so the module takes seconds.
"""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from tests_support import TINY_STUDY

from analysis.formatting import format_frame, format_rows
from study import manifest
from study.cli import cli_main
from study.config import parse
from study.tuning_config import tune_block
from trainables.results import write_rows

POINT = {"model.cell": "gru", "train.lr": 0.01}


def run_rows(out: Path, name: str, trial_id: str, seeds: range) -> None:
    """Write committed ``runs`` rows (one file per seed, as a trial does)."""
    for s in seeds:
        write_rows(out, name, "runs", f"{trial_id}-{s}",
                   [{"study": name, "trial_id": trial_id, "unit_id": "u", "seed": s, "status": "ok"}])


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder with a grid study (2 configs; a point value holds a comma) and a
    tuning study of 3 candidates x 2 seeds whose ``seeds.count`` (4) is not what it ran."""
    out = tmp_path_factory.mktemp("fmt") / "results"
    grid = parse({**TINY_STUDY, "name": "grid", "seeds": {"count": 2},
                  "grid": {"train.lr": [0.01, 0.1], "task.long_lengths": [[5, 6]]}})
    manifest.prepare(out, "grid", grid, "seeds", {})
    for p in grid.points:
        run_rows(out, "grid", p.trial_id, range(2))
    tune = parse({**TINY_STUDY, "name": "tt", "seeds": {"count": 4},
                  "tune": {"trials": 3, "seeds_per_candidate": 2, "objective": {"metric": "loss"}}})
    block = tune_block(tune)
    manifest.prepare(out, "tt", tune, "tune", {}, {"tune_trials": 3, "tune": block.model_dump(mode="json")})
    import optuna

    search = optuna.create_study(study_name="tt", storage=manifest.storage_url(out, "tt"))
    for n, cand in enumerate(("c1", "c2", "c3")):
        run_rows(out, "tt", cand, range(2))
        search.add_trial(optuna.trial.create_trial(
            params={"train.lr": 0.1 * (n + 1)}, distributions={"train.lr": optuna.distributions.FloatDistribution(0.01, 1.0)},
            value=1.0 + n, user_attrs={"trial_id": cand, "seeds": [0, 1]},
        ))
    return out


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = cli_main(args)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


# ----------------------------------------------------------------------------- the formatter
def test_csv_quotes_what_a_comma_join_would_break() -> None:
    rows = [{"point": json.dumps(POINT), "note": 'say "hi", twice\nthen stop', "n": 3, "x": None},
            {"point": "{}", "note": "", "n": 4, "x": float("nan")}]
    text = format_rows(rows, "csv")
    back = list(csv.DictReader(io.StringIO(text)))
    assert [json.loads(r["point"]) for r in back] == [POINT, {}]
    assert back[0]["note"] == 'say "hi", twice\nthen stop'
    assert [r["n"] for r in back] == ["3", "4"] and [r["x"] for r in back] == ["", ""]


def test_rows_and_frames_print_alike() -> None:
    rows = [{"name": "a", "value": 0.5, "n": 2, "tags": ["x", "y"]},
            {"name": "b,c", "value": float("nan"), "n": 10, "tags": []}]
    df = pd.DataFrame(rows)
    for fmt in ("table", "csv", "json"):
        assert format_rows(rows, fmt) == format_frame(df, fmt), fmt
    table = format_rows(rows).splitlines()
    assert table[0].split() == ["name", "value", "n", "tags"] and table[-1] == "(2 rows)"
    assert table[2].endswith(" 2  [x, y]") and table[3].split()[:2] == ["b,c", "10"]  # numbers right-aligned
    assert json.loads(format_rows(rows, "json"))[1] == {"name": "b,c", "value": None, "n": 10, "tags": []}


def test_dataclass_rows_and_empty_listings() -> None:
    from analysis.db import StudyInfo

    info = StudyInfo("s", "seeds", "t", "m", 1, 3, 2, 2, 0, 0, 0, 1)
    assert json.loads(format_rows([info], "json"))[0]["planned"] == 3
    assert format_rows([], "table") == "(0 rows)" and json.loads(format_rows([], "json")) == []
    assert format_rows([], "csv", columns=["a", "b"]) == "a,b"
    with pytest.raises(Exception, match="table, csv, json"):
        format_rows([info], "xml")


# ----------------------------------------------------------------------------- the commands
def test_status_csv_keeps_a_grid_point_whole(out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, text, _ = cli(["status", "grid", "--out", str(out), "--format", "csv"], capsys)
    assert rc == 0
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 2
    points = [json.loads(r["point"]) for r in rows]
    assert points == [{"task.long_lengths": [5, 6], "train.lr": 0.01}, {"task.long_lengths": [5, 6], "train.lr": 0.1}]
    assert all((r["planned"], r["done"], r["pending"]) == ("2", "2", "0") for r in rows)
    rc, text, _ = cli(["status", "grid", "--out", str(out), "--format", "json"], capsys)
    assert [r["done"] for r in json.loads(text)] == [2, 2]
    # the table names a point the way `study analyze` does, not as JSON
    rc, text, _ = cli(["status", "grid", "--out", str(out)], capsys)
    body = text.splitlines()[2:4]
    assert rc == 0 and all(line.startswith("long_lengths=[5, 6], lr=0.") for line in body)
    assert ["lr=0.01 " in line for line in body] == [True, False] and "{" not in text


def test_ls_counts_runs_of_a_tuning_study_consistently(out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, text, _ = cli(["ls", "--out", str(out), "--format", "json"], capsys)
    assert rc == 0
    by = {r["name"]: r for r in json.loads(text)}
    # 3 candidates x 2 seeds each: 6 runs planned and done (not "planned 4" from seeds.count)
    assert (by["tt"]["configs"], by["tt"]["planned"], by["tt"]["done"]) == (3, 6, 6)
    assert (by["grid"]["configs"], by["grid"]["planned"], by["grid"]["done"]) == (2, 4, 4)
    rc, text, _ = cli(["ls", "--out", str(out)], capsys)
    head = text.splitlines()[0].split()
    assert head == ["name", "kind", "task", "model", "configs", "planned", "done", "ok", "not_learned", "diverged", "failed", "pending"]


def test_report_header_says_seeds_per_candidate(out: Path) -> None:
    from analysis.manifest import load_manifest
    from analysis.report_page import seeds_row

    assert seeds_row(load_manifest(out, "tt")) == ("seeds per candidate", "2")
    assert seeds_row(load_manifest(out, "grid")) == ("seeds per config", "2")


@pytest.mark.parametrize(
    "argv",
    [
        ["ls", "--out", "{out}/nope"],
        ["status", "nosuch", "--out", "{out}"],
        ["sql", "--out", "{out}", "SELEC broken"],
        ["analyze", "nosuch", "--out", "{out}"],
        ["plugins", "{out}/missing.yaml"],
    ],
    ids=["ls", "status", "sql", "analyze", "plugins"],
)
def test_unknown_format_is_refused_before_any_work(
    out: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """Each command would fail on its other arguments; the --format error comes first."""
    args = [a.replace("{out}", str(out)) for a in argv] + ["--format", "xml"]
    rc, text, err = cli(args, capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and text == ""
    assert lines == ["error: --format: unknown format 'xml'. Fix: use one of: table, csv, json"]


def test_report_errors_in_a_log_are_their_one_line(out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No progress bar where stderr is no terminal: its transient bar left a blank line."""
    rc, text, err = cli(["report", "nosuch", "--out", str(out)], capsys)
    assert rc != 0 and text == ""
    assert err.startswith("error: ") and err.count("\n") == 1, repr(err)


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_every_table_command_takes_the_same_formats(
    out: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    for args in (["ls", "--out", str(out)], ["status", "tt", "--out", str(out)],
                 ["sql", "--out", str(out), "SELECT study, count(*) AS n FROM runs GROUP BY study ORDER BY study"],
                 ["plugins"]):
        rc, text, err = cli([*args, "--format", fmt], capsys)
        assert rc == 0, (args, err)
        if fmt == "json":
            assert isinstance(json.loads(text), list) and json.loads(text)
        elif fmt == "csv":
            assert len(list(csv.DictReader(io.StringIO(text)))) >= 1
        else:
            assert any(ln.endswith(("rows)", "(1 row)")) for ln in text.splitlines())  # (status adds lines after)


@pytest.mark.parametrize(("args", "allowed"), [(["status", "grid"], ()), (["ls"], ()), (["status", "tt"], ("optuna",))],
                         ids=["status", "ls", "status-of-a-search"])
def test_status_and_ls_import_neither_torch_nor_ray(out: Path, args: list[str], allowed: tuple[str, ...]) -> None:
    """They answer in about a second; a tuning study's status reads Optuna's storage."""
    code = (
        "import json, sys\n"
        "from study.cli import cli_main\n"
        f"rc = cli_main({[*args, '--out', str(out)]!r})\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'ray', 'optuna'})\n"
        "print(json.dumps({'rc': rc, 'heavy': heavy}))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc == {"rc": 0, "heavy": sorted(allowed)}


def test_analyze_csv_is_its_summary_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from analysis.demo import write_demo_study

    out = tmp_path / "results"
    write_demo_study(out, "demo", n_seeds=5, seed=11)
    rc, text, err = cli(["analyze", "demo", "--out", str(out), "--format", "csv", "--n-boot", "200"], capsys)
    assert rc == 0, err
    rows = list(csv.DictReader(io.StringIO(text)))
    rc, js, _ = cli(["analyze", "demo", "--out", str(out), "--format", "json", "--n-boot", "200"], capsys)
    summary = json.loads(js)["summary"]
    assert len(rows) == len(summary) > 0 and list(rows[0]) == list(summary[0])
    for r, s in zip(rows, summary, strict=True):
        for k, v in s.items():
            if isinstance(v, float) and math.isfinite(v):
                assert float(r[k]) == pytest.approx(v)
            elif v is None:
                assert r[k] == ""
