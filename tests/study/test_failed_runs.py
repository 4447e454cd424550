"""A seed that fails every time, through the real CLI: ``study resume --skip-failed`` records
it as a failed run (status ``failed``, ``runs.error`` why), so the study completes and every
view counts it apart; ``--retry-failed`` runs it again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.study.test_plugins_cli import BASE, PLUGIN, study, with_

FAILING = """

from trainables.seeding import derive_seed


@TASKS.register
class FailsAtOneSeed(Blobs):
    name = 'fails_at_one_seed'

    def build(self, data_seed):
        if data_seed == derive_seed(5, 'data', 1):  # seed index 1 of root 5 (never the rehearsal's)
            raise RuntimeError('no data for this seed')
        return super().build(data_seed)
"""


@pytest.mark.slow  # ~50 s: three studies through the CLI
def test_a_seed_that_keeps_failing_is_recorded_then_run_again(tmp_path: Path) -> None:
    home, cwd = tmp_path / "study", tmp_path / "elsewhere"
    home.mkdir()
    cwd.mkdir()
    (home / PLUGIN.name).write_text(PLUGIN.read_text() + FAILING)
    cfg = with_(BASE, name="flaky", task={"name": "fails_at_one_seed", "n": 64},
                seeds={"count": 3, "root": 5, "vary": ["init", "order", "dropout", "data"]},
                execution={"bundle_size": 1, "max_failures": 0})
    (home / "study.yaml").write_text(yaml.safe_dump(cfg))
    out = cwd / "results"
    base = ("--out", str(out))
    first = study(cwd, "run", str(home / "study.yaml"), *base, "--num-cpus", "1")
    assert first.returncode == 1, first.stderr
    assert "2/3 runs committed, 1 failed, 0 pending" in first.stderr, first.stderr
    assert "study resume flaky --out" in first.stderr and "--skip-failed" in first.stderr  # both ways on
    said = study(cwd, "status", "flaky", *base).stdout
    assert "1 seed(s) failed (default: seed 1): " in said and "--skip-failed` records them" in said, said

    skipped = study(cwd, "resume", "flaky", *base, "--num-cpus", "1", "--skip-failed")
    assert skipped.returncode == 0, skipped.stderr
    assert "1 seed(s) the last run left failed recorded as failed runs, not run again (default: seed 1)" \
        in skipped.stderr, skipped.stderr
    assert "all 3 runs already committed" in skipped.stderr and "Ray started" not in skipped.stderr
    assert "3/3 runs committed, 1 of them recorded as failed" in skipped.stdout, skipped.stdout

    status = study(cwd, "status", "flaky", *base, "--format", "json")
    (row,) = json.loads(status.stdout)
    assert (row["done"], row["ok"], row["failed"], row["pending"]) == (3, 2, 1, 0), row
    assert "1 seed(s) recorded as failed runs, not run again (default: seed 1;" in status.stderr, status.stderr
    assert "study resume flaky --out " in status.stderr and "--retry-failed" in status.stderr

    runs = study(cwd, "sql", "SELECT seed, status, error, files FROM runs ORDER BY seed", *base, "--format", "json")
    assert "missing" not in runs.stderr and "warning" not in runs.stderr, runs.stderr  # the commit names its files
    got = json.loads(runs.stdout)
    assert [(r["seed"], r["status"]) for r in got] == [(0, "ok"), (1, "failed"), (2, "ok")], got
    assert "RuntimeError: no data for this seed" in got[1]["error"]
    assert [(f["table"], f["rows"]) for f in json.loads(got[1]["files"])] == [("metrics", 0), ("evals", 0), ("predictions", 0)]
    assert got[0]["error"] is None
    configs = study(cwd, "sql", "SELECT runs, ok, failed, status FROM configs", *base, "--format", "json")
    assert json.loads(configs.stdout) == [{"runs": 3, "ok": 2, "failed": 1, "status": "partial"}]
    analyzed = study(cwd, "analyze", "flaky", *base, "--format", "json")
    assert analyzed.returncode == 0, analyzed.stderr
    (excluded,) = json.loads(analyzed.stdout)["verdict"]["excluded"]
    assert (excluded["runs"], excluded["ok"], excluded["failed"], excluded["other"]) == (3, 2, 1, 0), excluded
    listed = study(cwd, "ls", *base, "--format", "json")
    assert json.loads(listed.stdout)[0]["failed"] == 1
    checked = study(cwd, "check", "flaky", *base)
    assert checked.returncode == 0, checked.stdout + checked.stderr  # its empty files are verified
    report = study(cwd, "report", "flaky", *base)
    assert report.returncode == 0 and "warning" not in report.stderr, report.stderr

    retried = study(cwd, "resume", "flaky", *base, "--num-cpus", "1", "--retry-failed")
    assert retried.returncode == 1, retried.stderr  # it fails again, and is left uncommitted
    assert "1 seed(s) recorded as failed run again (default: seed 1)" in retried.stderr, retried.stderr
    assert "2/3 runs committed, 1 failed, 0 pending" in retried.stderr, retried.stderr
    again = study(cwd, "sql", "SELECT count(*) AS n FROM runs WHERE status = 'failed'", *base, "--format", "json")
    assert json.loads(again.stdout) == [{"n": 0}]
    leftovers = sorted(p.name for p in (out / "tables").rglob("*-1.parquet"))
    assert leftovers == [], leftovers  # the record's empty files went with it
