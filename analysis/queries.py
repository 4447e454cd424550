"""Named SQL queries over a :func:`analysis.db.connect` connection.

Each function runs one documented query and returns a pandas DataFrame whose columns are
stated in its docstring. ``study`` filters to one study (``None``: every study). Results
are seed-level (one row per run) or summaries across seeds; a *point* is a grid point of
a study, named by ``point_json`` from ``trials`` (``"{}"`` for a study without a grid).
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import pandas as pd

from analysis.errors import AnalysisError, unknown_study
from analysis.manifest import Axis, guessed_sense, point_label
from analysis.schema import ROLE_ORDER

_POINTS = (
    "points AS (SELECT study, trial_id, any_value(point_json ORDER BY started_at) AS point_json "
    "FROM trials GROUP BY study, trial_id)"
)


def _role_rank(col: str = "role") -> str:
    """SQL ranking a role column in :data:`ROLE_ORDER` (unknown roles last)."""
    whens = " ".join(f"WHEN '{r}' THEN {i}" for i, r in enumerate(ROLE_ORDER))
    return f"CASE {col} {whens} ELSE 9 END"


_ROLE_RANK = _role_rank()


def higher_is_better(metric: str) -> bool:
    """The guess for a metric no declaration names: False for loss-like names (see
    :data:`analysis.manifest.LOWER_IS_BETTER`), else True. A study's own reading is
    ``StudyContext.sense(metric)``, the task's declaration."""
    return guessed_sense(metric).higher_is_better


def _where(study: str | None, metric: str | None = None, alias: str = "e") -> tuple[str, list[str]]:
    clauses: list[str] = []
    params: list[str] = []
    if study is not None:
        clauses.append(f"{alias}.study = ?")
        params.append(study)
    if metric is not None:
        clauses.append(f"{alias}.metric = ?")
        params.append(metric)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def _labels(df: pd.DataFrame, labels: dict[str, str] | None = None) -> pd.DataFrame:
    """Add a readable ``point`` column from ``point_json`` (``labels`` wins: trial_id -> label)."""
    labels = labels or {}
    df["point"] = [
        labels.get(t) or (point_label(p) if isinstance(p, str) else "default")
        for t, p in zip(df["trial_id"], df["point_json"], strict=True)
    ]
    return df


def studies(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Names of the studies with committed runs or trials (sorted)."""
    rows = con.execute(
        "SELECT study FROM runs UNION SELECT study FROM trials ORDER BY study"
    ).fetchall()
    return [r[0] for r in rows]


def require_study(con: duckdb.DuckDBPyConnection, study: str) -> None:
    """Raise :class:`AnalysisError` naming the known studies when ``study`` has no rows."""
    known = studies(con)
    if study not in known:
        raise unknown_study(study, "this folder", known)


def split_roles(con: duckdb.DuckDBPyConnection, study: str) -> dict[str, str]:
    """split -> role of ``study``'s evals, ordered by role (train, val, val_ood, test) then name."""
    rows = con.execute(
        f"SELECT split, any_value(role) AS role FROM evals WHERE study = ? GROUP BY split "
        f"ORDER BY min({_ROLE_RANK}), split",
        [study],
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def metrics_of(con: duckdb.DuckDBPyConnection, study: str, table: str = "evals") -> list[str]:
    """Distinct metric names in ``table`` (evals or metrics) for ``study``, sorted."""
    if table not in ("evals", "metrics"):
        raise AnalysisError(f"metrics_of: table {table!r} is not 'evals' or 'metrics'")
    rows = con.execute(
        f"SELECT DISTINCT metric FROM {table} WHERE study = ? ORDER BY metric", [study]
    ).fetchall()
    return [r[0] for r in rows]


def eval_values(
    con: duckdb.DuckDBPyConnection,
    study: str | None = None,
    *,
    metric: str | None = None,
    labels: dict[str, str] | None = None,
) -> pd.DataFrame:
    """Final values, one row per (study, trial, seed, split, metric).

    Columns: study, trial_id, point_json, point, seed, status, split, role, metric, value.
    """
    where, params = _where(study, metric)
    df = con.execute(
        f"WITH {_POINTS} SELECT e.study, e.trial_id, p.point_json, e.seed, r.status, "
        "e.split, e.role, e.metric, e.value FROM evals e "
        "JOIN runs r USING (study, trial_id, seed) "
        f"LEFT JOIN points p USING (study, trial_id){where} "
        f"ORDER BY e.study, e.trial_id, {_ROLE_RANK}, e.split, e.metric, e.seed",
        params,
    ).df()
    return _labels(df, labels)


def split_summary(
    con: duckdb.DuckDBPyConnection,
    study: str | None = None,
    *,
    metric: str | None = None,
    labels: dict[str, str] | None = None,
) -> pd.DataFrame:
    """Per (study, trial, split, metric): the distribution of final values across seeds.

    Columns: study, trial_id, point_json, point, split, role, metric, n, mean, std
    (sample, ddof 1; NULL for n = 1), min, max, median.
    """
    where, params = _where(study, metric)
    df = con.execute(
        f"WITH {_POINTS} SELECT e.study, e.trial_id, any_value(p.point_json) AS point_json, "
        "e.split, any_value(e.role) AS role, e.metric, count(e.value) AS n, "
        "avg(e.value) AS mean, stddev_samp(e.value) AS std, min(e.value) AS min, "
        "max(e.value) AS max, median(e.value) AS median FROM evals e "
        f"LEFT JOIN points p USING (study, trial_id){where} "
        "GROUP BY e.study, e.trial_id, e.split, e.metric "
        f"ORDER BY e.study, e.trial_id, min({_ROLE_RANK}), e.split, e.metric",
        params,
    ).df()
    df = _labels(df, labels)
    cols = ["study", "trial_id", "point_json", "point", "split", "role", "metric", "n"]
    return df[[*cols, "mean", "std", "min", "max", "median"]]


def best_worst_seeds(
    con: duckdb.DuckDBPyConnection,
    study: str,
    *,
    metric: str = "accuracy",
    k: int = 1,
    higher_better: bool | None = None,
) -> pd.DataFrame:
    """The ``k`` best and ``k`` worst seeds per (trial, split) on ``metric``.

    ``higher_better`` defaults to :func:`higher_is_better` of the metric. Ties are broken
    by the smaller seed index. Columns: study, trial_id, split, role, metric, rank_kind
    (``best`` | ``worst``), rank (1 = most extreme), seed, value.
    """
    if k < 1:
        raise AnalysisError(f"best_worst_seeds: k must be >= 1, got {k}")
    hib = higher_is_better(metric) if higher_better is None else higher_better
    best, worst = ("DESC", "ASC") if hib else ("ASC", "DESC")
    part = "PARTITION BY study, trial_id, split"
    return con.execute(
        "WITH ranked AS (SELECT study, trial_id, split, role, metric, seed, value, "
        f"row_number() OVER ({part} ORDER BY value {best}, seed) AS best_rank, "
        f"row_number() OVER ({part} ORDER BY value {worst}, seed) AS worst_rank "
        "FROM evals WHERE study = ? AND metric = ? AND value IS NOT NULL) "
        "SELECT study, trial_id, split, role, metric, 'best' AS rank_kind, best_rank AS rank, "
        "seed, value FROM ranked WHERE best_rank <= ? UNION ALL "
        "SELECT study, trial_id, split, role, metric, 'worst', worst_rank, seed, value "
        "FROM ranked WHERE worst_rank <= ? "
        f"ORDER BY trial_id, {_ROLE_RANK}, split, rank_kind, rank",
        [study, metric, k, k],
    ).df()


def seed_table(
    con: duckdb.DuckDBPyConnection,
    study: str,
    *,
    metric: str = "accuracy",
    labels: dict[str, str] | None = None,
) -> pd.DataFrame:
    """Seed-by-split wide table of ``metric``: one row per (trial, seed), one column per split.

    Columns: trial_id, point, seed, then one column per split (ordered by role, then name;
    NULL where a run has no value for that split).
    """
    long = eval_values(con, study, metric=metric, labels=labels)
    order = list(dict.fromkeys(long["split"]))
    if long.empty:
        return pd.DataFrame(columns=["trial_id", "point", "seed"])
    wide = long.pivot_table(
        index=["trial_id", "point", "seed"], columns="split", values="value", aggfunc="first"
    )
    wide = wide.reindex(columns=order).reset_index()
    wide.columns.name = None
    return wide.sort_values(["trial_id", "seed"], kind="stable").reset_index(drop=True)


def learning_curves(
    con: duckdb.DuckDBPyConnection,
    study: str,
    metric: str,
    *,
    labels: dict[str, str] | None = None,
) -> pd.DataFrame:
    """Mean and min-max band of ``metric`` over seeds at each logged step.

    Columns: trial_id, point_json, point, split, role, step, epoch, n (seeds logged at that
    step), mean, min, max. Ordered by trial, split, step.
    """
    df = con.execute(
        f"WITH {_POINTS} SELECT m.trial_id, any_value(p.point_json) AS point_json, m.split, "
        "any_value(m.role) AS role, m.step, max(m.epoch) AS epoch, count(m.value) AS n, "
        "avg(m.value) AS mean, min(m.value) AS min, max(m.value) AS max FROM metrics m "
        "LEFT JOIN points p USING (study, trial_id) WHERE m.study = ? AND m.metric = ? "
        f"GROUP BY m.trial_id, m.split, m.step ORDER BY m.trial_id, min({_role_rank('m.role')}), m.split, m.step",
        [study, metric],
    ).df()
    return _labels(df, labels)


def curve_values(
    con: duckdb.DuckDBPyConnection,
    study: str,
    metric: str,
    *,
    labels: dict[str, str] | None = None,
) -> pd.DataFrame:
    """Per-seed learning curves of ``metric``.

    Columns: trial_id, point_json, point, seed, split, role, step, epoch, value.
    """
    df = con.execute(
        f"WITH {_POINTS} SELECT m.trial_id, p.point_json, m.seed, m.split, m.role, m.step, "
        "m.epoch, m.value FROM metrics m LEFT JOIN points p USING (study, trial_id) "
        "WHERE m.study = ? AND m.metric = ? ORDER BY m.trial_id, m.split, m.seed, m.step",
        [study, metric],
    ).df()
    return _labels(df, labels)


def run_pairs(
    con: duckdb.DuckDBPyConnection,
    study: str,
    x: Axis,
    y: Axis,
    *,
    labels: dict[str, str] | None = None,
) -> pd.DataFrame:
    """Final ``x`` and ``y`` values of each run (transforms are NOT applied here).

    Columns: trial_id, point_json, point, seed, x, y. Runs missing either value are left out.
    """
    df = con.execute(
        f"WITH {_POINTS} SELECT a.trial_id, p.point_json, a.seed, a.value AS x, b.value AS y "
        "FROM evals a JOIN evals b USING (study, trial_id, seed) "
        "LEFT JOIN points p USING (study, trial_id) "
        "WHERE a.study = ? AND a.split = ? AND a.metric = ? AND b.split = ? AND b.metric = ? "
        "ORDER BY a.trial_id, a.seed",
        [study, x.split, x.metric, y.split, y.metric],
    ).df()
    return _labels(df, labels)


def checkpoint_pairs(
    con: duckdb.DuckDBPyConnection,
    study: str,
    x: Axis,
    y: Axis,
    *,
    labels: dict[str, str] | None = None,
) -> pd.DataFrame:
    """``x`` and ``y`` logged at the same (trial, seed, step) in ``metrics``.

    Columns: trial_id, point_json, point, seed, step, epoch, x, y.
    """
    df = con.execute(
        f"WITH {_POINTS} SELECT a.trial_id, p.point_json, a.seed, a.step, a.epoch, "
        "a.value AS x, b.value AS y FROM metrics a JOIN metrics b USING (study, trial_id, seed, step) "
        "LEFT JOIN points p USING (study, trial_id) "
        "WHERE a.study = ? AND a.split = ? AND a.metric = ? AND b.split = ? AND b.metric = ? "
        "ORDER BY a.trial_id, a.seed, a.step",
        [study, x.split, x.metric, y.split, y.metric],
    ).df()
    return _labels(df, labels)


def run_seeds(con: duckdb.DuckDBPyConnection, study: str) -> pd.DataFrame:
    """Committed runs of ``study`` with every seed source.

    Columns: trial_id, seed, status, init_seed, order_seed, dropout_seed, data_seed,
    selected_epoch, wall_s.
    """
    return con.execute(
        "SELECT trial_id, seed, status, init_seed, order_seed, dropout_seed, data_seed, "
        "selected_epoch, wall_s FROM runs WHERE study = ? ORDER BY trial_id, seed",
        [study],
    ).df()


def numerics_runs(con: duckdb.DuckDBPyConnection, study: str) -> list[tuple[str, int]]:
    """How many committed runs of ``study`` were computed under each ``trials.numerics``
    (the CPU, torch's code path, MKL_CBWR and threads, or the GPU: what decides float
    rounding besides the seeds), most runs first; units from before the column was
    recorded are left out. Rows: (numerics, runs)."""
    return _runs_per(con, study, "numerics")


def _runs_per(con: duckdb.DuckDBPyConnection, study: str, column: str) -> list[tuple[str, int]]:
    """(value, committed runs) per non-empty value of ``trials.<column>``, most runs first."""
    return [
        (str(r[0]), int(r[1]))
        for r in con.execute(
            f"SELECT {column}, sum(len(seeds)) AS runs FROM trials WHERE study = ? AND coalesce({column}, '') <> '' "
            f"GROUP BY {column} ORDER BY runs DESC, {column}",
            [study],
        ).fetchall()
    ]


def tuning_trials(con: duckdb.DuckDBPyConnection, study: str) -> pd.DataFrame:
    """Trials of a tuning study in start order, with ``objective`` and ``param_*`` columns.

    Columns: trial_number (0-based, by started_at), trial_id, unit_id, seeds (text),
    status, objective and objective_std (NULL where the trials table has none), then every
    ``param_*``.
    """
    cols = [r[0] for r in con.execute("DESCRIBE trials").fetchall()]
    params = [c for c in cols if c.startswith("param_")]
    objective = "objective" if "objective" in cols else "NULL::DOUBLE AS objective"
    spread = "objective_std" if "objective_std" in cols else "NULL::DOUBLE AS objective_std"
    extra = "".join(f', "{c}"' for c in params)
    return con.execute(
        "SELECT (row_number() OVER (ORDER BY started_at NULLS LAST, trial_id) - 1) AS trial_number, "
        f"trial_id, unit_id, CAST(seeds AS VARCHAR) AS seeds, status, {objective}, {spread}{extra} "
        "FROM trials WHERE study = ? ORDER BY trial_number",
        [study],
    ).df()


def prediction_counts(
    con: duckdb.DuckDBPyConnection, study: str, *, splits: Sequence[str] | None = None
) -> pd.DataFrame:
    """Per run and split: number of predicted examples and how many were correct.

    Columns: trial_id, seed, split, n, correct. (Enough for an exact bootstrap over
    examples of the accuracy: see :func:`analysis.stats.accuracy_bootstrap`.) Rows whose
    ``correct`` is null (a task whose primary metric is no share, e.g. an error) are left out.
    """
    where, params = "WHERE study = ? AND correct IS NOT NULL", [study]
    if splits:
        where += f" AND split IN ({', '.join('?' for _ in splits)})"
        params += list(splits)
    return con.execute(
        "SELECT trial_id, seed, split, count(*) AS n, count(*) FILTER (WHERE correct) AS correct "
        f"FROM predictions {where} GROUP BY trial_id, seed, split ORDER BY trial_id, split, seed",
        params,
    ).df()


def split_predictions(
    con: duckdb.DuckDBPyConnection,
    study: str,
    split: str,
    *,
    labels: dict[str, str] | None = None,
) -> pd.DataFrame:
    """Every committed prediction of ``study`` on ``split``, one row per (trial, seed, example).

    Columns: trial_id, point_json, point, seed, example_id, prediction (text, as the task
    rendered it). Ordered by trial, seed, example_id.
    """
    df = con.execute(
        f"WITH {_POINTS} SELECT e.trial_id, p.point_json, e.seed, e.example_id, e.prediction "
        "FROM predictions e LEFT JOIN points p USING (study, trial_id) "
        "WHERE e.study = ? AND e.split = ? ORDER BY e.trial_id, e.seed, e.example_id",
        [study, split],
    ).df()
    return _labels(df, labels)


def code_runs(con: duckdb.DuckDBPyConnection, study: str) -> list[tuple[str, int]]:
    """How many committed runs of ``study`` were trained at each ``trials.git_sha`` (the code's
    commit; empty where it was not a git checkout: left out), most runs first. Rows: (git_sha, runs)."""
    return _runs_per(con, study, "git_sha")
