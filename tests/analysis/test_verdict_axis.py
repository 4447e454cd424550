"""What the verdict speaks about (``analysis/verdict_axis.py``): split specs, pooled splits
worked out by hand, who chooses (the user over the task over the default), and the verdict
of a whole (synthetic) study about a pooled split, through the API and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from analysis.analyze import analyze
from analysis.demo import write_demo_study
from analysis.errors import AnalysisError
from analysis.variance import variance_share
from analysis.verdict_axis import VerdictAxis, VerdictSplit, axis_values, parse_split, resolve_axis
from study.cli import cli_main

SPLITS = ["train", "val", "short", "long", "very_long"]
ROLES = {"train": "train", "val": "val", "short": "test", "long": "test", "very_long": "test"}


def test_a_spec_is_a_split_or_a_named_mean_of_splits() -> None:
    assert parse_split(" long ") == VerdictSplit("long", ("long",))
    far = parse_split("far = long + very_long")
    assert far == VerdictSplit("far", ("long", "very_long")) and far.pooled
    assert not parse_split("long").pooled
    for bad in ("", "=long", "far=", "far=long+", "far=long+long"):
        with pytest.raises(ValueError):
            parse_split(bad)


def test_pooled_values_are_per_run_means_of_their_parts() -> None:
    rows = [  # (trial, seed, split, value); run (a, 2) lacks very_long
        ("a", 0, "long", 0.2), ("a", 0, "very_long", 0.6), ("a", 1, "long", 1.0),
        ("a", 1, "very_long", 0.0), ("a", 2, "long", 0.9), ("b", 0, "long", 0.4),
        ("b", 0, "very_long", 0.5), ("b", 0, "short", 0.7),
    ]  # fmt: skip
    e = pd.DataFrame(rows, columns=["trial_id", "seed", "split", "value"]).assign(
        metric="acc", role="test", status="ok", point=lambda d: d["trial_id"]
    )
    e = pd.concat([e, e.assign(metric="loss", value=9.0)], ignore_index=True)
    axis = VerdictAxis("acc", (parse_split("far=long+very_long"), parse_split("short")))
    got = axis_values(e, axis)
    assert list(got.columns) == list(e.columns)
    assert list(got["split"]) == ["far", "far", "far", "short"]  # the axis's order
    far = got[got["split"] == "far"].set_index(["trial_id", "seed"])["value"]
    assert far.to_dict() == {("a", 0): pytest.approx(0.4), ("a", 1): 0.5, ("b", 0): pytest.approx(0.45)}
    assert set(got["metric"]) == {"acc"} and set(got["role"]) == {"test"}


def test_the_user_overrides_the_task_which_overrides_the_default() -> None:
    base = {"primary": "acc", "splits": SPLITS, "roles": ROLES, "tests": ["short", "long"],
            "metrics": {"acc", "loss"}}  # fmt: skip
    axis, notes = resolve_axis(**base)
    assert (axis.metric, axis.names, axis.source, notes) == ("acc", ["short", "long"], "default", [])
    declared = {"declared_splits": ["far=long+very_long", "long"]}
    axis, notes = resolve_axis(**base, **declared)
    assert (axis.names, axis.source, notes) == (["far", "long"], "declared by the task", [])
    axis, _ = resolve_axis(**base, **declared, metric="loss")
    assert (axis.metric, axis.names, axis.source) == ("loss", ["far", "long"], "given")
    axis, _ = resolve_axis(**base, **declared, split_specs=["val"])
    assert (axis.metric, axis.names) == ("acc", ["val"])
    # a declaration the study cannot honour: the default, and a note that says why
    axis, notes = resolve_axis(**base, declared_metric="bleu", declared_splits=["far=long+very_long"])
    assert axis.names == ["short", "long"] and axis.source == "default"
    assert len(notes) == 1 and "verdict.metric: 'bleu'" in notes[0]
    # what the user gives is checked, and refused with the field and what the study has
    with pytest.raises(AnalysisError, match=r"--verdict-split: 'longest' is not a split.*very_long"):
        resolve_axis(**base, split_specs=["far=long+longest"])
    with pytest.raises(AnalysisError, match=r"--verdict-metric: 'bleu' is not a metric.*acc, loss"):
        resolve_axis(**base, metric="bleu")
    with pytest.raises(AnalysisError, match="'far' is named twice"):
        resolve_axis(**base, split_specs=["far=long+very_long", "far=short+long"])
    with pytest.raises(AnalysisError, match="has the name of a split"):
        resolve_axis(**base, split_specs=["long=long+very_long"])
    with pytest.raises(AnalysisError, match=r"--verdict-split: .* NAME=SPLIT"):
        resolve_axis(**base, split_specs=["=long"])


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    o = tmp_path_factory.mktemp("axis")
    points = [{"model.cell": "lstm"}, {"model.cell": "gru"}, {"model.cell": "relu"}]
    write_demo_study(o, "grid", n_seeds=10, points=points, seed=31)
    manifest = write_demo_study(o, "declared", n_seeds=10, points=points, seed=31)
    doc = json.loads(manifest.read_text())
    doc["analysis"]["verdict"] = {"splits": ["far=long+very_long", "very_long"]}
    manifest.write_text(json.dumps(doc))
    return o


def _band(out: Path, study: str) -> pd.DataFrame:
    """Per ok run: the mean accuracy over long and very_long, straight from the Parquet."""
    con = duckdb.connect()
    t = out / "tables"
    return con.execute(
        f"SELECT e.trial_id, e.seed, avg(e.value) AS value, count(*) AS n "
        f"FROM read_parquet('{t}/evals/**/*.parquet', hive_partitioning=true) e "
        f"JOIN read_parquet('{t}/runs/**/*.parquet', hive_partitioning=true) r USING (study, trial_id, seed) "
        f"WHERE e.study = '{study}' AND r.status = 'ok' AND e.metric = 'accuracy' "
        "AND e.split IN ('long', 'very_long') GROUP BY e.trial_id, e.seed"
    ).df()


def _points(out: Path) -> list[dict[str, str]]:
    t = out / "tables" / "trials"
    return duckdb.connect().execute(
        f"SELECT trial_id, point_json FROM read_parquet('{t}/**/*.parquet', hive_partitioning=true) "
        "WHERE study = 'declared'"
    ).df().to_dict("records")


def test_a_declared_pooled_split_is_the_verdicts_headline(out: Path) -> None:
    doc = json.loads(analyze(out, "declared", "json", n_boot=300))
    v = doc["verdict"]
    assert v["splits"] == ["far", "very_long"] and v["axis_from"] == "declared by the task"
    assert v["pooled_splits"] == {"far": ["long", "very_long"]}
    assert v["sentence"].startswith("The grid point (model.cell) explains") and "of far accuracy" in v["sentence"]
    band = _band(out, "declared")
    assert (band["n"] == 2).all() and len(band) == 30
    want = variance_share(band, "trial_id", model="fixed")
    (far,) = [s for s in v["shares"] if s["split"] == "far"]
    assert far["runs"] == 30 and far["between"] == pytest.approx(want.estimate)
    assert far["F"] == pytest.approx(want.f_stat)
    means = band.groupby("trial_id")["value"].mean()
    trial = {"cell=" + json.loads(r["point_json"])["model.cell"]: r["trial_id"] for r in _points(out)}
    far_cmp = [c for c in v["comparisons"] if c["split"] == "far"]
    assert len(far_cmp) == 3 and means.nunique() == 3
    for c in far_cmp:
        assert c["mean_better"] == pytest.approx(means[trial[c["better"]]])
        assert c["mean_worse"] == pytest.approx(means[trial[c["worse"]]])
        assert c["mean_worse"] < c["mean_better"]
    # the seed counts speak about the same values
    assert {r["split"] for r in doc["seed_counts"]["estimate"]} == {"far", "very_long"}
    for r in (r for r in doc["seed_counts"]["estimate"] if r["split"] == "far"):
        assert r["mean"] == pytest.approx(means[trial[r["point"]]])


def test_the_text_says_what_a_pooled_split_is(out: Path) -> None:
    text = analyze(out, "declared", n_boot=300)
    assert "(far: the per-run mean of accuracy over long, very_long)" in text
    plain = json.loads(analyze(out, "grid", "json", n_boot=300))["verdict"]
    assert plain["splits"] == ["short", "long", "very_long"] and plain["pooled_splits"] == {}


def test_the_cli_takes_an_axis_and_refuses_a_bad_one(out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["analyze", "grid", "--out", str(out), "--format", "json", "--n-boot", "200"]
    rc = cli_main([*args, "--verdict-metric", "loss", "--verdict-split", "far=long+very_long"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    v = json.loads(cap.out)["verdict"]
    assert (v["metric"], v["splits"], v["axis_from"], v["higher_is_better"]) == ("loss", ["far"], "given", False)
    rc = cli_main([*args, "--verdict-split", "far=long+longest"])
    cap = capsys.readouterr()
    assert rc == 2 and cap.out == ""
    assert cap.err.startswith("error: --verdict-split: 'longest' is not a split of this study")


def test_the_report_follows_the_axis(out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from analysis.report import build_report

    page = build_report(out, "grid", n_boot=200, quiet=True, verdict_splits=["far=long+very_long"]).html()
    assert "far: the per-run mean of accuracy over long, very_long" in page
    assert "of far accuracy" in page
    rc = cli_main(["report", "grid", "--out", str(out), "--verdict-metric", "bleu"])
    assert rc == 2 and "error: --verdict-metric: 'bleu' is not a metric" in capsys.readouterr().err
    assert not (out / "grid" / "report.html").exists()  # refused before anything is written


def test_the_declaration_parses_and_a_malformed_one_is_named() -> None:
    from analysis.manifest import parse_declarations

    d = parse_declarations({"verdict": {"metric": "oracle_exact", "splits": ["band=a+b", "a"]}})
    assert (d.verdict_metric, d.verdict_splits, d.unknown) == ("oracle_exact", ("band=a+b", "a"), ())
    for bad in ({"splits": "a"}, {"metric": 3}, {"split": ["a"]}, ["a"]):
        d = parse_declarations({"verdict": bad})
        assert d.unknown == ("verdict",) and d.verdict_splits == () and d.verdict_metric is None


def test_without_a_test_split_the_verdict_says_it_is_optimistic() -> None:
    """A task with no test split: the default verdict speaks about val_ood (else val), which
    tuning or selection looked at; its caveat says so under the sentence (before, the verdict
    gave val accuracy as if it were a test result). A test split, or any axis with one, has none."""
    roles = {"train": "train", "val": "val", "val_ood": "val_ood"}
    axis, _ = resolve_axis(primary="acc", splits=list(roles), roles=roles, tests=[], metrics={"acc"})
    assert axis.names == ["val_ood"]
    assert axis.pooled_text() == ["not a test result: val_ood is a val_ood split, which tuning may look "
                                  "at, so this is optimistic"]
    roles = {"train": "train", "val": "val"}
    axis, _ = resolve_axis(primary="acc", splits=list(roles), roles=roles, tests=[], metrics={"acc"})
    assert axis.names == ["val"] and axis.caveat == ("not a test result: val is a val split, which model "
                                                     "selection looks at, so this is optimistic")
    axis, _ = resolve_axis(primary="acc", splits=SPLITS, roles=ROLES, tests=["short"], metrics={"acc"},
                           split_specs=["mixed=val+long"])
    assert axis.caveat == "" and axis.pooled_text() == ["mixed: the per-run mean of acc over val, long"]
    axis, _ = resolve_axis(primary="acc", splits=SPLITS, roles=ROLES, tests=["short"], metrics={"acc"},
                           split_specs=["val"])
    assert axis.caveat.startswith("not a test result: val is a val split")
