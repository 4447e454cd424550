"""analysis.queries against the same numbers computed with pandas from the raw Parquet files."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from analysis import queries as q
from analysis.db import connect
from analysis.demo import write_demo_study
from analysis.errors import AnalysisError
from analysis.manifest import Axis, load_manifest, point_label


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    o = tmp_path_factory.mktemp("results")
    write_demo_study(o, "solo", n_seeds=5, seed=1)
    write_demo_study(
        o, "grid", n_seeds=4, points=[{"model.cell": "lstm"}, {"model.cell": "gru"}], seed=2
    )
    write_demo_study(
        o,
        "tune",
        n_seeds=1,
        points=[{"train.lr": 0.1}, {"train.lr": 0.2}, {"train.lr": 0.3}],
        kind="tune",
        seed=3,
    )
    return o


@pytest.fixture()
def con(out: Path) -> duckdb.DuckDBPyConnection:
    return connect(out)


def _raw(out: Path, table: str, study: str) -> pd.DataFrame:
    """Read a table straight from the files, bypassing DuckDB."""
    return pq.read_table(out / "tables" / table / f"study={study}").to_pandas()


def test_split_summary_matches_pandas(out: Path, con: duckdb.DuckDBPyConnection) -> None:
    s = q.split_summary(con, "grid", metric="accuracy")
    raw = _raw(out, "evals", "grid")
    raw = raw[raw["metric"] == "accuracy"]
    ref = raw.groupby(["trial_id", "split"])["value"].agg(
        ["count", "mean", "std", "min", "max", "median"]
    )
    assert len(s) == len(ref) == 2 * 6
    for row in s.itertuples():
        r = ref.loc[(row.trial_id, row.split)]
        assert row.n == r["count"] == 4
        assert (row.mean, row.std, row.min, row.max, row.median) == pytest.approx(
            (r["mean"], r["std"], r["min"], r["max"], r["median"])
        )
    assert set(s["point"]) == {"cell=lstm", "cell=gru"}
    # ordered by role: train first, test splits last
    first = s[s["trial_id"] == s["trial_id"].iloc[0]]
    assert first["role"].iloc[0] == "train" and first["role"].iloc[-1] == "test"


def test_split_summary_over_all_studies(con: duckdb.DuckDBPyConnection) -> None:
    s = q.split_summary(con)
    assert set(s["study"]) == {"solo", "grid", "tune"}
    assert set(s["metric"]) == {"accuracy", "loss", "fpf"}


def test_best_and_worst_seeds(out: Path, con: duckdb.DuckDBPyConnection) -> None:
    t = q.best_worst_seeds(con, "solo", metric="accuracy", k=2)
    raw = _raw(out, "evals", "solo")
    long = raw[(raw["metric"] == "accuracy") & (raw["split"] == "long")]
    ordered = long.sort_values("value")["seed"].tolist()
    got = t[t["split"] == "long"]
    assert got[got["rank_kind"] == "best"]["seed"].tolist() == ordered[::-1][:2]
    assert got[got["rank_kind"] == "worst"]["seed"].tolist() == ordered[:2]
    # a loss is better when lower
    lt = q.best_worst_seeds(con, "solo", metric="loss")
    raw_loss = raw[(raw["metric"] == "loss") & (raw["split"] == "long")]
    best = lt[(lt["split"] == "long") & (lt["rank_kind"] == "best")]["seed"].item()
    assert best == raw_loss.loc[raw_loss["value"].idxmin(), "seed"]
    with pytest.raises(AnalysisError):
        q.best_worst_seeds(con, "solo", k=0)


def test_seed_table_is_wide_by_split(out: Path, con: duckdb.DuckDBPyConnection) -> None:
    w = q.seed_table(con, "grid", metric="accuracy")
    assert list(w.columns[:3]) == ["trial_id", "point", "seed"]
    # by role, then name
    assert list(w.columns[3:]) == ["train", "val", "val_ood", "long", "short", "very_long"]
    assert len(w) == 8
    raw = _raw(out, "evals", "grid")
    pick = raw[(raw["metric"] == "accuracy") & (raw["split"] == "long")].set_index(
        ["trial_id", "seed"]
    )
    for row in w.itertuples():
        assert row.long == pick.loc[(row.trial_id, row.seed), "value"]


def test_learning_curves_mean_and_band(out: Path, con: duckdb.DuckDBPyConnection) -> None:
    c = q.learning_curves(con, "solo", "accuracy")
    raw = _raw(out, "metrics", "solo")
    raw = raw[raw["metric"] == "accuracy"]
    ref = raw.groupby(["split", "step"])["value"].agg(["mean", "min", "max", "count"])
    assert len(c) == len(ref)
    for row in c.itertuples():
        r = ref.loc[(row.split, row.step)]
        assert (row.mean, row.min, row.max) == pytest.approx((r["mean"], r["min"], r["max"]))
        assert row.n == 5
    per_seed = q.curve_values(con, "solo", "accuracy")
    assert len(per_seed) == len(raw)


def test_pairs_for_regressions(out: Path, con: duckdb.DuckDBPyConnection) -> None:
    x, y = Axis("val", "loss"), Axis("very_long", "fpf")
    runs = q.run_pairs(con, "solo", x, y)
    assert len(runs) == 5 and runs["seed"].tolist() == [0, 1, 2, 3, 4]
    raw = _raw(out, "evals", "solo")
    fpf = raw[(raw["split"] == "very_long") & (raw["metric"] == "fpf")].set_index("seed")["value"]
    assert np.allclose(runs["y"], fpf.loc[runs["seed"]].to_numpy())
    ck = q.checkpoint_pairs(con, "solo", x, y)
    assert len(ck) == 5 * 6  # seeds x logged epochs
    assert ck.groupby("seed")["step"].nunique().eq(6).all()


def test_tuning_trials_have_params_and_objective(con: duckdb.DuckDBPyConnection) -> None:
    t = q.tuning_trials(con, "tune")
    assert t["trial_number"].tolist() == [0, 1, 2]
    assert {"param_lr", "param_dropout", "objective"} <= set(t.columns)
    assert t["objective"].notna().all()
    plain = q.tuning_trials(con, "solo")
    assert plain["objective"].isna().all()


def test_prediction_counts(out: Path, con: duckdb.DuckDBPyConnection) -> None:
    c = q.prediction_counts(con, "solo", splits=["short"])
    raw = _raw(out, "predictions", "solo")
    raw = raw[raw["split"] == "short"]
    ref = raw.groupby("seed")["correct"].agg(["size", "sum"])
    assert c["n"].tolist() == ref["size"].tolist()
    assert c["correct"].tolist() == ref["sum"].tolist()


def test_roles_metrics_and_unknown_study(out: Path, con: duckdb.DuckDBPyConnection) -> None:
    roles = q.split_roles(con, "solo")
    assert list(roles) == ["train", "val", "val_ood", "long", "short", "very_long"]
    assert roles["short"] == "test"
    assert q.metrics_of(con, "solo") == ["accuracy", "fpf", "loss"]
    assert q.studies(con) == ["grid", "solo", "tune"]
    with pytest.raises(AnalysisError, match="known: grid, solo, tune"):
        q.require_study(con, "nope")
    with pytest.raises(AnalysisError, match=r"; did you mean 'solo'\?.*Fix: check the name"):
        q.require_study(con, "sollo")
    assert q.higher_is_better("accuracy") and not q.higher_is_better("val_loss")


def test_manifest_points_and_labels(out: Path) -> None:
    m = load_manifest(out, "grid")
    assert m is not None and m.planned == 8 and m.kind == "seeds"
    assert sorted(m.point_labels().values()) == ["cell=gru", "cell=lstm"]
    assert m.declarations.scatter is not None
    assert [r.over for r in m.declarations.regressions] == ["runs", "checkpoints"]
    assert point_label("{}") == "default"
    assert point_label({"train.lr": 0.30000000000000004, "model.cell": "gru"}) == "cell=gru, lr=0.3"


def test_runs_per_numerics_and_the_note_of_a_mixed_study(tmp_path: Path) -> None:
    """A study whose three points ran under two numerics: 2 + 2 runs on A, 2 on B (worked out
    by hand); the analysis notes it, and says nothing for a study under one numerics."""
    from analysis.context import numerics_note, open_study

    write_demo_study(tmp_path, "mixed", n_seeds=2, points=[{"train.lr": x} for x in (0.1, 0.2, 0.3)],
                     numerics=("A", "B"))  # fmt: skip
    write_demo_study(tmp_path, "same", n_seeds=3)
    con = connect(tmp_path)
    try:
        assert q.numerics_runs(con, "mixed") == [("A", 4), ("B", 2)]
        assert len(q.numerics_runs(con, "same")) == 1
    finally:
        con.close()
    note = numerics_note([("A", 4), ("B", 2)])
    assert note is not None and "2 different numerics" in note and "4 runs on 'A'; 2 runs on 'B'" in note
    assert numerics_note([("A", 4)]) is None and numerics_note([]) is None
    mixed, same = open_study(tmp_path, "mixed"), open_study(tmp_path, "same")
    try:
        assert note in mixed.notes and not any("numerics" in n for n in same.notes)
    finally:
        mixed.close()
        same.close()


def test_runs_per_commit_and_the_note_and_header_of_a_study_trained_at_two(tmp_path: Path) -> None:
    """Three points, the first and third at commit a1 (2 + 2 runs), the second at b2 (2 runs):
    the analysis notes it and the report's header lists both (before: the manifest's latest
    commit alone, as if every run had it); one commit: no note, the header as before."""
    from analysis.context import open_study
    from analysis.report_page import _header_rows

    write_demo_study(tmp_path, "mixed", n_seeds=2, points=[{"train.lr": x} for x in (0.1, 0.2, 0.3)],
                     commits=("a1" * 20, "b2" * 20))  # fmt: skip
    write_demo_study(tmp_path, "same", n_seeds=3)
    mixed, same = open_study(tmp_path, "mixed"), open_study(tmp_path, "same")
    try:
        assert mixed.code == [("a1" * 20, 4), ("b2" * 20, 2)]
        assert any(n.startswith("runs were trained from 2 commits of the code (trials.git_sha): "
                                "4 at a1a1a1a1a1a1; 2 at b2b2b2b2b2b2.") for n in mixed.notes), mixed.notes
        assert dict(_header_rows(mixed))["git sha"] == "a1a1a1a1a1a1 (4 runs); b2b2b2b2b2b2 (2 runs)"
        assert not any("commits of the code" in n for n in same.notes) and len(same.code) == 1
    finally:
        mixed.close()
        same.close()
