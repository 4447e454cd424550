"""``study check`` and ``--repair`` through the real CLI, on a real tiny study (10 seeds in
bundles of 2, kept weights, an evaluation of every seed): a truncated evals, predictions,
trials and runs file and a truncated kept-weights file (one seed each) and a truncated
evaluation are each found; another study in the same results folder stays queryable
meanwhile; the repair re-trains exactly the damaged seeds, which reproduce their numbers,
and re-runs exactly the damaged evaluation; and after a crash mid-bundle and a re-run,
``trials`` counts every committed seed once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests_support import TINY_STUDY

from analysis.db import connect
from analysis.demo import write_demo_study
from study.lock import study_lock

NAME = "dmg"
SEEDS = 10
CONFIG: dict[str, Any] = {**TINY_STUDY, "name": NAME, "seeds": {"count": SEEDS, "root": 5},
                          "execution": {"bundle_size": 2}}
DAMAGED = {0: "evals", 2: "predictions", 4: "trials", 6: "runs", 8: "weights"}
"""Seed -> the file of its commit that is truncated (bundles are [0, 1], [2, 3], ...)."""
EVAL_DAMAGED = 1
"""The seed whose evaluation (not its training) has a truncated evals file."""


def study(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k in ("HOME", "PYTHONPATH", "VIRTUAL_ENV", "LANG")}
    env |= {"RAY_USAGE_STATS_ENABLED": "0", "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    res = subprocess.run([sys.executable, "-m", "study.cli", *args], capture_output=True, text=True,
                         timeout=600, env=env)
    if check and res.returncode != 0:
        raise AssertionError(f"study {' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


def query(out: Path, sql: str) -> list[tuple[Any, ...]]:
    con = connect(out)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def snapshot(out: Path) -> dict[str, Any]:
    """What the views show of the study: evals values, runs and evaluations per seed."""
    return {
        "evals": {(s, sp, m): v for s, sp, m, v in query(
            out, f"SELECT seed, split, metric, value FROM evals WHERE study = '{NAME}'")},
        "runs": {s: (at, unit) for s, at, unit in query(
            out, f"SELECT seed, committed_at, unit_id FROM runs WHERE study = '{NAME}'")},
        "evaluations": dict(query(out, f"SELECT seed, evaluated_at FROM evaluations WHERE study = '{NAME}'")),
        "trials": query(out, f"SELECT unit_id, seeds FROM trials WHERE study = '{NAME}' ORDER BY seeds"),
        "configs": query(out, f"SELECT trial_id, bundles, runs, ok FROM configs WHERE study = '{NAME}'"),
    }


def truncate(path: Path) -> None:
    assert path.is_file(), path
    os.truncate(path, path.stat().st_size // 2)


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("check")
    cfg, out = root / "dmg.yaml", root / "results"
    cfg.write_text(yaml.safe_dump(CONFIG))
    base = ("--out", str(out))
    study("run", str(cfg), *base, "--num-cpus", "2")
    study("eval", NAME, *base, "--split", "standard")
    write_demo_study(out, "other", n_seeds=3)  # another study in the same folder (older layout)
    s: dict[str, Any] = {"out": out, "before": snapshot(out)}
    (tid,) = {t for (t,) in query(out, f"SELECT DISTINCT trial_id FROM runs WHERE study = '{NAME}'")}
    s["tid"] = tid
    for seed, table in DAMAGED.items():
        truncate(out / NAME / "weights" / tid / f"seed-{seed}.pt" if table == "weights"
                 else out / "tables" / table / f"study={NAME}" / f"{tid}-{seed}.parquet")
    truncate(out / "tables" / "evals" / f"study={NAME}" / f"eval-standard-{tid}-{EVAL_DAMAGED}.parquet")
    s["check"] = study("check", NAME, *base, check=False)
    s["check_json"] = study("check", NAME, *base, "--format", "json", check=False)
    s["check_all"] = study("check", *base, check=False)
    s["other"] = study("sql", *base, "--format", "json",
                       "SELECT count(*) AS runs, (SELECT count(*) FROM evals WHERE study = 'other') AS evals "
                       "FROM runs WHERE study = 'other'")
    s["visible"] = study("sql", *base, "--format", "json",
                         f"SELECT seed FROM runs WHERE study = '{NAME}' ORDER BY seed")
    s["ls"] = study("ls", *base, "--format", "json")
    with study_lock(out, NAME):
        s["locked"] = study("check", NAME, "--repair", *base, check=False)
    s["quarantine_while_locked"] = (out / NAME / "quarantine").exists()
    s["repair"] = study("check", NAME, "--repair", *base, "--num-cpus", "2", check=False)
    s["after"] = snapshot(out)
    s["check_after"] = study("check", NAME, *base, check=False)
    # a crash mid-bundle: of the re-run bundle [0, 2], seed 0 committed and seed 2 did not
    # (its leftovers stay); and seed 5's evals file damaged since: `study resume` runs both
    (seed0_unit, seed2_unit) = (s["after"]["runs"][0][1], s["after"]["runs"][2][1])
    assert seed0_unit == seed2_unit, "the repair bundled seeds 0 and 2"
    (out / "tables" / "runs" / f"study={NAME}" / f"{tid}-2.parquet").unlink()
    truncate(out / "tables" / "evals" / f"study={NAME}" / f"{tid}-5.parquet")
    s["resume"] = study("resume", NAME, *base, "--num-cpus", "2", check=False)
    s["resumed"] = snapshot(out)
    return s


def test_check_names_each_damaged_file_and_exits_1(story: dict[str, Any]) -> None:
    res, tid = story["check"], story["tid"]
    assert res.returncode == 1, res.stderr
    rows = json.loads(story["check_json"].stdout)
    assert story["check_json"].returncode == 1
    got = {(r["seed"], r["table"]) for r in rows}
    assert got == {*DAMAGED.items(), (EVAL_DAMAGED, "evals")}
    by = {(r["seed"], r["table"]): r for r in rows}
    assert by[(EVAL_DAMAGED, "evals")]["file"] == f"tables/evals/study={NAME}/eval-standard-{tid}-1.parquet"
    assert by[(8, "weights")]["file"] == f"{NAME}/weights/{tid}/seed-8.pt"
    assert "not committed" in by[(6, "runs")]["problem"]
    assert all(r["study"] == NAME and r["trial_id"] == tid for r in rows)
    assert f"study {NAME}: 9 runs and 9 evaluations checked: 6 damaged files (5 runs, 1 evaluation)" in res.stdout
    assert f"Fix: study check {NAME} --repair --out" in res.stdout


def test_check_of_every_study_verifies_older_studies_by_reading_them(story: dict[str, Any]) -> None:
    res = story["check_all"]
    assert res.returncode == 1
    assert "study other: 3 runs and 0 evaluations checked, 3 unverified (committed before checksums): no damage" in res.stdout
    assert f"study {NAME}: 9 runs" in res.stdout


def test_damage_blocks_no_query_of_other_studies_or_seeds(story: dict[str, Any]) -> None:
    other = story["other"]
    (got,) = json.loads(other.stdout)
    assert got["runs"] == 3 and got["evals"] > 0
    tid = story["tid"]
    assert f"{tid}-6.parquet cannot be read" in other.stderr and "--repair" in other.stderr
    seeds = [r["seed"] for r in json.loads(story["visible"].stdout)]
    assert seeds == [s for s in range(SEEDS) if s != 6], "a damaged runs file = an uncommitted seed"
    listed = {r["name"]: r["done"] for r in json.loads(story["ls"].stdout)}
    assert listed == {"other": 3, NAME: SEEDS - 1}


def test_repair_is_refused_while_another_driver_holds_the_study(story: dict[str, Any]) -> None:
    res = story["locked"]
    assert res.returncode == 2 and f"is being written by pid {os.getpid()}" in res.stderr
    assert "Traceback" not in res.stderr
    assert not story["quarantine_while_locked"], "nothing may move before the lock is held"


def test_repair_retrains_exactly_the_damaged_seeds_then_checks_clean(story: dict[str, Any]) -> None:
    res = story["repair"]
    assert res.returncode == 0, res.stdout + res.stderr
    assert "5 runs trained again, 1 evaluation run again" in res.stdout
    assert f"after repair: study {NAME}: 10 runs and 5 evaluations checked: no damage" in res.stdout
    # the damage and the move are printed (and flushed) before anything runs again, so an
    # interrupted repair's log has them; the counts of what ran come at the end
    moved = res.stdout.index("; running them again")
    assert res.stdout.index("evals") < moved < res.stdout.index("5 runs trained again")
    before, after = story["before"]["runs"], story["after"]["runs"]
    assert sorted(after) == list(range(SEEDS))
    same = {s for s in range(SEEDS) if after[s] == before[s]}
    assert same == set(range(SEEDS)) - set(DAMAGED), "only the damaged seeds were trained again"
    assert story["check_after"].returncode == 0 and "no damage" in story["check_after"].stdout


def test_repaired_seeds_reproduce_their_numbers(story: dict[str, Any]) -> None:
    before, after = story["before"]["evals"], story["after"]["evals"]
    assert set(after) == set(before)
    for key, value in before.items():  # deterministic seeds; another bundle may round differently
        assert after[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key


def test_a_retrained_seed_drops_its_old_evaluation_and_a_damaged_one_runs_again(story: dict[str, Any]) -> None:
    before, after = story["before"]["evaluations"], story["after"]["evaluations"]
    assert sorted(before) == list(range(SEEDS))
    assert sorted(after) == [s for s in range(SEEDS) if s not in DAMAGED]
    assert after[EVAL_DAMAGED] > before[EVAL_DAMAGED]
    assert all(after[s] == before[s] for s in after if s != EVAL_DAMAGED)
    out, tid = story["out"], story["tid"]
    folder = sorted((out / NAME / "quarantine").iterdir())[0]  # the repair's (the resume's is later)
    moved = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert f"tables/evals/study={NAME}/eval-standard-{tid}-1.parquet" in moved
    assert f"tables/evaluations/study={NAME}/eval-standard-{tid}-0.parquet" in moved  # went with seed 0
    assert f"{NAME}/weights/{tid}/seed-8.pt" in moved
    truncated = folder / "tables" / "trials" / f"study={NAME}" / f"{tid}-4.parquet"
    assert truncated.is_file(), "the damaged file is kept, not deleted"


def test_trials_match_runs_after_a_crash_mid_bundle_and_a_rerun(story: dict[str, Any]) -> None:
    res = story["resume"]
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 damaged run(s) moved to" in res.stderr
    resumed, after = story["resumed"], story["after"]
    assert sorted(resumed["runs"]) == list(range(SEEDS))
    changed = {s for s in range(SEEDS) if resumed["runs"][s] != after["runs"][s]}
    assert changed == {2, 5}
    seeds = [s for _, unit_seeds in resumed["trials"] for s in unit_seeds]
    assert sorted(seeds) == list(range(SEEDS)), "every committed seed in exactly one trials row"
    units = dict(resumed["trials"])
    assert units[after["runs"][0][1]] == [0], "the crashed bundle counts only the seed it committed"
    assert units[resumed["runs"][2][1]] == [2, 5]
    assert all(s in units[unit] for s, (_, unit) in resumed["runs"].items()), "each seed in its own unit's row"
    (config,) = resumed["configs"]
    assert config[0] == story["tid"] and config[1] == len(units) and config[2:] == (SEEDS, SEEDS)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["check", "nosuch"], "NAME: no study 'nosuch'"),
        (["check", "../up"], "NAME"),
        (["check", "--format", "xml"], "--format: unknown format 'xml'"),
        (["check", "--repair", "nosuch"], "NAME: no study 'nosuch'"),
    ],
    ids=["unknown-study", "bad-name", "bad-format", "repair-unknown-study"],
)
def test_bad_check_arguments_are_refused_in_one_line(tmp_path: Path, capsys: Any, args: list[str], needle: str) -> None:
    from study.cli import cli_main

    out = tmp_path / "results"
    write_demo_study(out, "other", n_seeds=1)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    capsys.readouterr()
    assert cli_main([*args, "--out", str(out)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert cli_main(["check", "--out", str(tmp_path / "missing")]) == 2


@pytest.mark.parametrize("content", [b'{"config": {"name": "x"', b"\xff\xfe{}", b"[1, 2]"],
                         ids=["truncated", "not-utf8", "not-an-object"])
def test_a_damaged_manifest_is_damage(tmp_path: Path, capsys: Any, content: bytes) -> None:
    """``study resume``, ``eval`` and ``status`` refuse a manifest that does not read, so
    ``study check`` must not call that study undamaged (it did: exit 0, "no damage"); its fix
    is restoring the manifest, which --repair (it re-runs from the manifest) cannot do."""
    from study.cli import cli_main

    out = tmp_path / "results"
    write_demo_study(out, "demo", n_seeds=2)
    write_demo_study(out, "other", n_seeds=1)
    manifest = out / "demo" / "study.json"
    assert manifest.is_file()
    manifest.write_bytes(content)
    capsys.readouterr()
    assert cli_main(["check", "--out", str(out)]) == 1
    text = capsys.readouterr().out
    assert "manifest" in text and "demo/study.json" in text and "does not read as a manifest" in text, text
    assert f"Fix: restore {manifest} from a backup" in text, text
    assert "--repair" not in text, text  # a repair cannot re-create a manifest
    assert "study other: 1 run and 0 evaluations checked" in text and text.rstrip().endswith("no damage"), text
    assert cli_main(["check", "other", "--out", str(out)]) == 0
    capsys.readouterr()
    assert cli_main(["check", "demo", "--repair", "--out", str(out)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "is damaged" in err[0] and "Fix: restore" in err[0], err
    assert manifest.read_bytes() == content  # nothing moved or rewritten


def test_a_missing_manifest_is_damage(tmp_path: Path, capsys: Any) -> None:
    """A study whose runs are there but whose study.json is gone was "no damage" (exit 0),
    while ``study status`` said there is no such study: it is damage, fixed by restoring or
    re-creating the manifest (which --repair, re-running from it, cannot do)."""
    from study.cli import cli_main

    out = tmp_path / "results"
    write_demo_study(out, "demo", n_seeds=2)
    write_demo_study(out, "other", n_seeds=1)
    manifest = out / "demo" / "study.json"
    manifest.unlink()
    res = study("check", "demo", "--out", str(out), check=False)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "demo/study.json" in res.stdout and "missing" in res.stdout and "no damage" not in res.stdout, res.stdout
    assert (f"study demo: 2 runs and 0 evaluations checked, 2 unverified (committed before checksums): "
            f"1 damaged file (the manifest). Fix: restore {manifest} from a backup, or re-create it with "
            f"`study run CONFIG --name demo --out {out}`") in res.stdout, res.stdout
    assert "--repair" not in res.stdout, res.stdout
    rows = json.loads(study("check", "demo", "--out", str(out), "--format", "json", check=False).stdout)
    assert rows == [{"study": "demo", "trial_id": None, "seed": None, "table": "manifest",
                     "file": "demo/study.json", "problem": "missing"}]
    capsys.readouterr()
    assert cli_main(["check", "--out", str(out)]) == 1  # every study: demo damaged, other not
    text = capsys.readouterr().out
    assert "study other: 1 run and 0 evaluations checked" in text and text.rstrip().endswith("no damage"), text
    assert cli_main(["check", "demo", "--repair", "--out", str(out)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "has no manifest" in err[0] and f"Fix: restore {manifest}" in err[0], err
    assert not manifest.exists() and not (out / "demo" / "quarantine").exists()  # nothing moved or written
    # status, resume and eval give the same fix (they said "no study 'demo'", which `study ls` lists)
    for args in (["status", "demo"], ["resume", "demo"], ["eval", "demo"]):
        assert cli_main([*args, "--out", str(out)]) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1 and f"study 'demo' in {out} has results but no manifest" in err[0], (args, err)
        assert f"Fix: restore {manifest} from a backup, or re-create it" in err[0], (args, err)
    assert cli_main(["status", "nosuch", "--out", str(out)]) == 2
    assert "no study 'nosuch'" in capsys.readouterr().err


def test_a_file_damaged_inside_is_left_out_of_analyze_and_report_and_named_by_sql(tmp_path: Path) -> None:
    """An evals file whose footer reads but whose pages are garbage: `study analyze` and
    `study report` (which read evals into memory) leave it out with the views' warning
    naming it and go on (before: a DuckDB / Arrow traceback or "Fix: check the path and the
    disk"); `study sql` reading it stops with one error line naming the table and `study
    check`; `study check` names the file."""
    out = tmp_path / "results"
    write_demo_study(out, "demo", n_seeds=3)
    path = sorted((out / "tables" / "evals" / "study=demo").glob("*.parquet"))[0]
    raw = bytearray(path.read_bytes())
    pages_end = len(raw) - 8 - int.from_bytes(raw[-8:-4], "little")  # where the footer starts
    raw[4:pages_end] = b"Z" * (pages_end - 4)
    path.write_bytes(bytes(raw))
    for args in (["analyze", "demo"], ["report", "demo", "--to", str(tmp_path / "r.html")]):
        res = study(*args, "--out", str(out), check=False)
        assert res.returncode == 0, (args, res.stdout, res.stderr)
        assert f"warning: {path} cannot be read" in res.stderr and "study check demo --repair" in res.stderr
    assert "3 runs done of 3 planned" in study("analyze", "demo", "--out", str(out)).stdout
    res = study("sql", "SELECT * FROM evals", "--out", str(out), check=False)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith("error: an evals file cannot be read"), res.stderr
    assert f"study check --out {out}" in res.stderr, res.stderr
    res = study("check", "--out", str(out), check=False)
    assert res.returncode == 1 and path.name in res.stdout, res.stdout + res.stderr


def test_check_names_planned_runs_that_are_not_committed(tmp_path: Path) -> None:
    """A seed quarantined by a repair that was then killed (or never run) has no runs row: the
    check found "no damage" and said nothing of it, so an interrupted repair looked finished.
    It now counts the manifest's planned runs that are not committed and names the resume."""
    out = tmp_path / "results"
    write_demo_study(out, "demo", n_seeds=3)
    runs = sorted((out / "tables" / "runs" / "study=demo").glob("*.parquet"))
    assert len(runs) == 3
    runs[0].unlink()  # as a quarantine leaves it
    res = study("check", "demo", "--out", str(out))
    assert (f"study demo: 2 runs and 0 evaluations checked, 2 unverified (committed before checksums): "
            f"no damage; 1 planned run not committed (`study resume demo --out {out}` runs it)") in res.stdout, res.stdout
    # while a driver writes the study, its runs are under way: no resume (the lock refuses it)
    from study.lock import study_lock

    with study_lock(out, "demo"):
        res = study("check", "demo", "--out", str(out))
    assert f"1 planned run not committed (being written by pid {os.getpid()} on " in res.stdout, res.stdout


def test_a_stray_copy_and_a_missing_file_are_named_and_never_count_a_seed_twice(tmp_path: Path, capsys: Any) -> None:
    """Probe G: a copy of a committed evals file (`X-0 (1).parquet`, as a file manager or a
    sync client makes) counted seed 0 twice in `evals` and in `study analyze` (n = 4 for a
    3-seed study), and `study check` said "no damage"; a deleted committed file left its seed
    out with no word. Now the views read only the files a commit names, each left-out file
    is named on stderr once, and `study check` names the copy (exit 1) for --repair to move."""
    from study.cli import cli_main

    out = tmp_path / "results"
    write_demo_study(out, "demo", n_seeds=3)
    before = query(out, "SELECT count(*) FROM evals")[0][0]
    folder = out / "tables" / "evals" / "study=demo"
    first = sorted(folder.glob("*.parquet"))[0]
    copy = folder / f"{first.stem} (1).parquet"
    copy.write_bytes(first.read_bytes())
    (folder / "metrics_in_evals.parquet").write_bytes(
        next((out / "tables" / "metrics" / "study=demo").glob("*.parquet")).read_bytes())
    capsys.readouterr()
    assert query(out, "SELECT count(*) FROM evals")[0][0] == before
    err = capsys.readouterr().err
    assert f"warning: {copy} is no commit's file (a copy?); the views leave it out" in err, err
    assert "metrics_in_evals.parquet is no commit's file" in err
    assert cli_main(["check", "demo", "--out", str(out)]) == 1
    text = capsys.readouterr().out
    assert copy.name in text and "no commit names this file (a copy?)" in text, text
    from study.check import check_study, quarantine

    moved = quarantine(out, "demo", check_study(out, "demo"))  # what --repair moves first
    assert not copy.exists() and copy.relative_to(out).as_posix() in moved.files and not moved.runs
    assert cli_main(["check", "demo", "--out", str(out)]) == 0
    capsys.readouterr()
    gone = sorted((out / "tables" / "predictions" / "study=demo").glob("*.parquet"))[1]
    gone.unlink()
    n_pred = query(out, "SELECT count(DISTINCT seed) FROM predictions")[0][0]
    err = capsys.readouterr().err
    assert n_pred == 2 and f"warning: {gone} is missing (committed: trial" in err, err
    assert "the views show none of its predictions rows. Fix: study check demo --repair" in err
