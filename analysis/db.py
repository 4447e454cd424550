"""Read-only DuckDB views over a results folder, ``study sql`` and ``study ls``.

:func:`connect` opens the six tables of every study under ``OUT/tables`` as views
``trials``, ``runs``, ``metrics``, ``evals``, ``predictions`` and ``evaluations``, plus the
view ``configs`` derived from them:

* files are ``OUT/tables/<table>/study=<NAME>/*.parquet`` (names starting with ``.`` or
  ``_`` - temporary files of an atomic write - are skipped); a file without a ``study``
  column takes it from its ``study=<NAME>`` folder; columns are united by name
  (a column missing from a file reads as NULL; differing numeric types widen; otherwise
  text), and every documented column (:mod:`analysis.schema`) exists even when no file
  has it, so an empty results folder gives empty, typed views;
* ``runs`` is the commit marker: ``metrics``, ``evals`` and ``predictions`` show a row
  only if its ``(study, trial_id, seed)`` has a runs row; leftovers of uncommitted work
  are invisible. Should ``runs`` hold two rows for one ``(study, trial_id, seed)``, the
  view keeps the latest ``committed_at``;
* ``trials`` has one row per executed unit (bundle), derived from committed seeds only:
  each seed's commit writes the unit's row with its ``seed``, and the view keeps the units
  that have committed seeds (``seeds``: those whose latest runs row names this unit;
  ``status``: ``partial`` when one of them diverged, else ``ok``), plus tuning candidates
  ASHA pruned (their own one-row commit, status ``pruned``, ``seeds`` empty) unless their
  unit committed seeds later. Files of the older layout (one per unit, a ``seeds`` list)
  count the same way, so after a crash mid-bundle and a re-run every committed seed is in
  exactly one ``trials`` row. ``configs`` has one row per ``(study, trial_id)``: the
  config's columns and the committed runs by status (:data:`CONFIGS_SQL`), no ``DISTINCT``
  needed;
* a file that cannot be read (damaged after its commit; ``study check`` finds and repairs
  it) is left out of the views with one warning on stderr naming it, so the other studies
  and seeds stay queryable; a left-out runs row means an uncommitted seed;
* an ``evaluations`` row is the commit marker of a later evaluation of kept weights on one
  split (``study eval``): its ``evals`` and ``predictions`` rows (``eval_id`` set) show only
  once it exists, and then replace that (trial, seed)'s training-time rows of the split.

How the connection refuses writes: the files are scanned through Arrow datasets
registered with DuckDB, the views live in a throw-away database file that is reopened
read-only (``CREATE TABLE``, ``CREATE VIEW``, ``INSERT``... raise), and DuckDB's own file
access is switched off and the configuration locked (``COPY ... TO``, ``read_csv``,
``ATTACH``, ``INSTALL`` raise, also for paths inside OUT). Only DuckDB's in-memory
``TEMP`` objects remain possible on a connection from :func:`connect`; they never touch
disk. :func:`run_sql` on top accepts only ``SELECT``-like statements.
"""

from __future__ import annotations

import contextlib
import glob
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from analysis.errors import AnalysisError
from analysis.formatting import check_format, format_frame, format_rows
from analysis.manifest import load_manifest, study_names
from analysis.schema import FILE_ONLY, ROW_TABLES, SCHEMAS, TABLES, VIEWS, stem_key

READ_STATEMENTS = ("SELECT", "EXPLAIN")
"""Statement types ``run_sql`` runs (``SELECT`` covers ``FROM``, ``WITH``, ``SHOW``,
``DESCRIBE`` and ``SUMMARIZE``)."""

RUNS_SQL = (
    "SELECT * FROM _runs_raw QUALIFY row_number() OVER ("
    "PARTITION BY study, trial_id, seed "
    "ORDER BY committed_at DESC NULLS LAST, unit_id DESC NULLS LAST) = 1"
)


def trials_sql(source: str, runs: str) -> str:
    """One row per executed unit of the ``trials`` rows scanned as ``source``, counting only
    seeds committed by that unit (``runs``: the latest runs row per seed), plus the pruned
    candidates whose unit committed nothing (see the module doc)."""
    committed_by = "s.study = r.study AND s.trial_id = r.trial_id AND s._seed = r.seed AND s.unit_id = r.unit_id"
    return (
        "WITH seeded AS (SELECT t.*, unnest(CASE WHEN t.seed IS NOT NULL THEN [t.seed] "
        f"ELSE coalesce(t.seeds, []) END) AS _seed FROM {source} AS t "
        "WHERE t.status IS DISTINCT FROM 'pruned'), "
        f"kept AS (SELECT s.*, r.status AS _run_status FROM seeded AS s JOIN {runs} AS r ON {committed_by} "
        "QUALIFY row_number() OVER (PARTITION BY s.study, s.trial_id, s.unit_id, s._seed "
        "ORDER BY s.ended_at DESC NULLS LAST) = 1), "
        "units AS (SELECT *, list_sort(list(_seed) OVER u) AS _seeds, list(_run_status) OVER u AS _statuses "
        "FROM kept WINDOW u AS (PARTITION BY study, trial_id, unit_id) "
        "QUALIFY row_number() OVER (PARTITION BY study, trial_id, unit_id "
        "ORDER BY ended_at DESC NULLS LAST, _seed) = 1) "
        "SELECT * EXCLUDE (seed, _seed, _run_status, _seeds, _statuses) REPLACE (_seeds AS seeds, "
        "CASE WHEN list_contains(_statuses, 'diverged') THEN 'partial' ELSE 'ok' END AS status) FROM units "
        "UNION ALL BY NAME "
        f"SELECT p.* EXCLUDE (seed) REPLACE ([]::BIGINT[] AS seeds) FROM {source} AS p "
        f"WHERE p.status = 'pruned' AND NOT EXISTS (SELECT 1 FROM {runs} AS r "
        "WHERE r.study = p.study AND r.trial_id = p.trial_id AND r.unit_id = p.unit_id)"
    )


UNIT_COLUMNS = (
    "unit_id", "seeds", "seed", "status", "started_at", "ended_at", "node", "hostname",
    "git_sha", "versions_json", "bundle_size", "device", "bundling", "kernels", "kernel_flags",
    "dropout_masks", "numerics", "train_s", "eval_s", "final_eval_s",
)
"""``trials`` columns that describe one execution (unit), not the config: ``configs`` drops them."""


def configs_sql(trials: str, runs: str) -> str:
    """One row per ``(study, trial_id)``: the config's columns from its latest unit in
    ``trials`` (task, model, config_hash, config_json, point_json, flattened config columns,
    a candidate's params and objective), ``bundles`` (units with committed seeds), ``runs``
    (committed seeds), their count by status (``ok``, ``diverged``, ``not_learned``,
    ``failed``: recorded by ``study resume --skip-failed``) and ``status``: ``pruned`` (a
    candidate ASHA stopped, nothing committed), ``partial`` (a run diverged or failed) or ``ok``. A config whose every trials row is unreadable still has its
    row, with its counts (config columns NULL)."""
    drop = ", ".join(c for c in UNIT_COLUMNS if c in SCHEMAS["trials"].names)
    return (
        f"WITH latest AS (SELECT * FROM {trials} QUALIFY row_number() OVER (PARTITION BY study, trial_id "
        "ORDER BY status = 'pruned', ended_at DESC NULLS LAST, unit_id) = 1), "
        f"units AS (SELECT study, trial_id, count(*) FILTER (WHERE status <> 'pruned') AS bundles "
        f"FROM {trials} GROUP BY ALL), "
        "counts AS (SELECT study, trial_id, count(*) AS runs, count(*) FILTER (WHERE status = 'ok') AS ok, "
        "count(*) FILTER (WHERE status = 'diverged') AS diverged, "
        "count(*) FILTER (WHERE status = 'failed') AS failed, "
        f"count(*) FILTER (WHERE status = 'not_learned') AS not_learned FROM {runs} GROUP BY ALL) "
        "SELECT coalesce(l.study, c.study) AS study, coalesce(l.trial_id, c.trial_id) AS trial_id, "
        f"l.* EXCLUDE (study, trial_id, {drop}), coalesce(u.bundles, 0) AS bundles, "
        "coalesce(c.runs, 0) AS runs, coalesce(c.ok, 0) AS ok, coalesce(c.diverged, 0) AS diverged, "
        "coalesce(c.not_learned, 0) AS not_learned, coalesce(c.failed, 0) AS failed, "
        "CASE WHEN coalesce(c.runs, 0) = 0 AND l.status = 'pruned' THEN 'pruned' "
        "WHEN coalesce(c.diverged, 0) + coalesce(c.failed, 0) > 0 THEN 'partial' ELSE 'ok' END AS status "
        "FROM latest AS l FULL OUTER JOIN counts AS c ON l.study = c.study AND l.trial_id = c.trial_id "
        "LEFT JOIN units AS u ON u.study = coalesce(l.study, c.study) AND u.trial_id = coalesce(l.trial_id, c.trial_id)"
    )


VIEW_SQL = {
    "trials": trials_sql("_trials_raw", f"({RUNS_SQL})"),
    "runs": RUNS_SQL,
}
VIEW_SQL["metrics"] = (
    "SELECT t.* FROM _metrics_raw AS t SEMI JOIN _runs_raw AS r "
    "ON t.study = r.study AND t.trial_id = r.trial_id AND t.seed = r.seed"
)


def evaluated_rows_sql(source: str, runs: str, evaluations: str) -> str:
    """The committed rows of ``evals`` or ``predictions`` (scanned as ``source``): a training
    row when its (study, trial_id, seed) has a runs row and no committed evaluation replaced
    its split; an evaluation's row (``eval_id`` set) once its ``evaluations`` row exists."""
    committed = f"SEMI JOIN {runs} AS r ON t.study = r.study AND t.trial_id = r.trial_id AND t.seed = r.seed"
    same = "e.study = t.study AND e.trial_id = t.trial_id AND e.seed = t.seed AND e.split = t.split"
    return (
        f"SELECT t.* FROM {source} AS t {committed} ANTI JOIN {evaluations} AS e ON {same} "
        f"WHERE t.eval_id IS NULL UNION ALL "
        f"SELECT t.* FROM {source} AS t {committed} SEMI JOIN {evaluations} AS e "
        f"ON {same} AND e.eval_id = t.eval_id"
    )


for _t in ("evals", "predictions"):
    VIEW_SQL[_t] = evaluated_rows_sql(f"_{_t}_raw", "_runs_raw", "_evaluations_raw")
VIEW_SQL["evaluations"] = (
    "SELECT t.* FROM _evaluations_raw AS t SEMI JOIN _runs_raw AS r "
    "ON t.study = r.study AND t.trial_id = r.trial_id AND t.seed = r.seed "
    "QUALIFY row_number() OVER (PARTITION BY study, trial_id, seed, split "
    "ORDER BY evaluated_at DESC NULLS LAST) = 1"
)
VIEW_SQL["configs"] = configs_sql("trials", "runs")  # created after the views it reads


def result_studies(out: Path) -> list[str]:
    """Names of the studies with a ``runs`` or ``trials`` partition folder (sorted)."""
    names = set()
    for table in ("runs", "trials"):
        root = Path(out) / "tables" / table
        if root.is_dir():
            names |= {p.name.removeprefix("study=") for p in root.glob("study=*") if p.is_dir()}
    return sorted(names)


def table_files(out: Path, table: str, studies: Sequence[str] | None = None) -> list[Path]:
    """The Parquet files of ``table`` under ``out`` (sorted; temporary files skipped),
    only those of ``studies`` when given."""
    root = Path(out) / "tables" / table
    if not root.is_dir():
        return []
    files = []
    folders = ["study=*"] if studies is None else [f"study={glob.escape(s)}" for s in studies]
    for p in (p for folder in folders for p in root.glob(f"{folder}/**/*.parquet")):
        rel = p.relative_to(root).parts
        if any(part.startswith((".", "_")) for part in rel) or not p.is_file():
            continue
        files.append(p)
    return sorted(files)


def _unify(schemas: list[pa.Schema]) -> pa.Schema:
    """One schema for all files: fields by name in first-seen order, types widened.

    Arrow's permissive promotion widens numbers (int64 + double -> double) and fills
    all-NULL columns; a column whose types cannot be merged (e.g. int64 and string in two
    studies' config columns) becomes a string column.
    """
    try:
        return pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        pass
    types: dict[str, list[pa.DataType]] = {}
    for s in schemas:
        for f in s:
            types.setdefault(f.name, []).append(f.type)
    fields = []
    for name, ts in types.items():
        try:
            merged = pa.unify_schemas(
                [pa.schema([(name, t)]) for t in ts], promote_options="permissive"
            ).field(name)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            merged = pa.field(name, pa.string())
        fields.append(merged)
    return pa.schema(fields)


def _no_null_types(schema: pa.Schema) -> pa.Schema:
    """Columns NULL in every file become text columns (DuckDB would type them "NULL")."""
    return pa.schema([f.with_type(pa.string()) if pa.types.is_null(f.type) else f for f in schema])


def _study_of(out: Path, table: str, path: Path) -> str:
    return path.relative_to(Path(out) / "tables" / table).parts[0].removeprefix("study=")


def commit_stems(out: Path, studies: Sequence[str] | None) -> dict[str, set[str]]:
    """Per study, the stems of its commit markers (runs and evaluations files: a directory
    listing, nothing read): the names its metrics, evals and predictions files must have."""
    stems: dict[str, set[str]] = {}
    for table in ("runs", "evaluations"):
        for f in table_files(out, table, studies):
            stems.setdefault(_study_of(out, table, f), set()).add(f.stem)
    return stems


def _commit_named(out: Path, table: str, files: list[Path], stems: dict[str, set[str]]) -> list[Path]:
    """``files`` of a row table (:data:`ROW_TABLES`) that a commit names; the others are left
    out: uncommitted work silently (the views would hide its rows anyway), a file with
    another name (``X-0 (1).parquet``, a copy that would count a seed twice) with a warning.
    A committed seed's missing file is warned about too: its rows are gone from the views."""
    kept, have = [], set()
    for f in files:
        study = _study_of(out, table, f)
        if f.stem in stems.get(study, ()):
            kept.append(f)
            have.add((study, f.stem))
        elif stem_key(f.stem) is None:
            _warn(f, f"warning: {f} is no commit's file (a copy?); the views leave it out. "
                          f"Fix: study check {study} --repair --out {out} moves it to quarantine/")
    for study, names in sorted(stems.items()):
        for stem in sorted(names):
            key = stem_key(stem)
            wanted = table != "metrics" or not stem.startswith("eval-")  # evaluations write evals, predictions
            if key is not None and wanted and (study, stem) not in have:
                missing = Path(out) / "tables" / table / f"study={study}" / f"{stem}.parquet"
                _warn(missing, f"warning: {missing} is missing (committed: trial {key[0]} seed {key[1]}); "
                                    f"the views show none of its {table} rows. Fix: study check {study} --repair "
                                    f"--out {out} runs it again")
    return kept


def _source(
    out: Path, table: str, studies: Sequence[str] | None, skip: frozenset[str] = frozenset(),
    stems: dict[str, set[str]] | None = None,
) -> ds.Dataset | pa.Table:
    """An Arrow dataset over ``table``'s files but ``skip`` (an empty typed table when it has
    none); for a row table, only the files a commit names (``stems``: :func:`commit_stems`)."""
    schemas = [SCHEMAS[table], *([FILE_ONLY[table]] if table in FILE_ONLY else [])]
    files = []
    listed = table_files(out, table, studies)
    if table in ROW_TABLES:
        listed = _commit_named(out, table, listed, commit_stems(out, studies) if stems is None else stems)
    for f in listed:
        if str(f) in skip:
            continue
        try:
            schemas.append(pq.read_schema(f).remove_metadata())
            files.append(f)
        except (OSError, pa.ArrowException) as e:
            _warn_damaged(out, f, e)
    if not files:
        return _unify(schemas).empty_table()
    schema = _no_null_types(_unify(schemas))
    # The ``study=<NAME>`` folder names the study: files that leave out the ``study``
    # column (so pandas and polars read the hive folder without a clash) get it from there.
    part = ds.partitioning(pa.schema([("study", pa.string())]), flavor="hive")
    root = str(Path(out) / "tables" / table)
    return ds.dataset(
        [str(f) for f in files],
        schema=schema,
        format="parquet",
        partitioning=part,
        partition_base_dir=root,
    )


def _in_memory(out: Path, table: str, studies: Sequence[str] | None, src: ds.Dataset) -> pa.Table:
    """``src`` read into memory; a file damaged inside (its footer reads, its pages do not)
    is left out with the same warning as an unreadable one, so the rest still loads."""
    try:
        return src.to_table()
    except (OSError, pa.ArrowException):
        pass
    bad = set()
    for f in src.files:
        try:
            pq.read_table(f)
        except (OSError, pa.ArrowException) as e:
            _warn_damaged(out, Path(f), e)
            bad.add(str(f))
    rest = _source(out, table, studies, frozenset(bad))
    return rest.to_table() if isinstance(rest, ds.Dataset) else rest


_WARNED: set[Path] = set()
"""Damaged files already named on stderr by this process (each is named once)."""


def _warn(path: Path, line: str) -> None:
    """One stderr line about a file the views leave out (each file named once per process)."""
    if path in _WARNED:
        return
    _WARNED.add(path)
    print(line, file=sys.stderr)


def _warn_damaged(out: Path, path: Path, error: Exception) -> None:
    """One stderr line naming a file the views leave out because it cannot be read."""
    study = path.parent.name.removeprefix("study=")
    why = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
    _warn(path, f"warning: {path} cannot be read ({why}); the views leave it out. "
                     f"Fix: study check {study} --repair --out {out}")


def connect(
    out: Path,
    *,
    read_only: bool = True,
    studies: Sequence[str] | None = None,
    in_memory: Sequence[str] = (),
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the views over every study in ``out`` (see module docs).

    ``studies`` limits the views to those studies' files (faster when a results folder
    holds many studies); the tables named in ``in_memory`` are read into memory once
    instead of being scanned from their files by every query (faster for many queries
    over one study). ``read_only=False`` gives a plain in-memory connection with the
    same views, in which scratch tables may be created (it still never writes into
    ``out`` by itself). Raises :class:`AnalysisError` when ``out`` is not a folder.
    """
    out = Path(out)
    if not out.is_dir():
        raise AnalysisError(
            f"results folder {out} does not exist; pass the folder a study wrote "
            "(default ./results) or run a study first"
        )
    stems = commit_stems(out, studies)
    sources = {t: _source(out, t, studies, stems=stems) for t in TABLES}
    for t in in_memory:
        src = sources[t]
        if isinstance(src, ds.Dataset):
            sources[t] = _in_memory(out, t, studies, src)
    if not read_only:
        con = duckdb.connect(":memory:")
        _register(con, sources)
        for t in VIEWS:
            con.execute(f"CREATE VIEW {t} AS {VIEW_SQL[t]}")
        return con
    tmp = Path(tempfile.mkdtemp(prefix="fineline-sql-"))
    try:
        path = str(tmp / "views.duckdb")
        build = duckdb.connect(path)
        try:
            _register(build, sources)
            for t in VIEWS:
                build.execute(f"CREATE VIEW {t} AS {VIEW_SQL[t]}")
        finally:
            build.close()
        con = duckdb.connect(path, read_only=True)
        _register(con, sources)
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    finally:
        # The open connection keeps its file handle; nothing is left behind on disk.
        shutil.rmtree(tmp, ignore_errors=True)
    return con


def _register(con: duckdb.DuckDBPyConnection, sources: dict[str, Any]) -> None:
    for t, src in sources.items():
        con.register(f"_{t}_raw", src)


def _check_read_only(query: str) -> str:
    """The single read statement in ``query``, or an :class:`AnalysisError` saying why not."""
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as e:
        raise AnalysisError(f"SQL error: {e}") from e
    if not statements:
        raise AnalysisError("no SQL statement given; pass a query such as 'SELECT * FROM runs'")
    if len(statements) > 1:
        raise AnalysisError(
            f"got {len(statements)} statements; study sql runs one at a time - "
            "split them into separate calls"
        )
    kind = statements[0].type.name
    if kind not in READ_STATEMENTS:
        raise AnalysisError(
            f"study sql is read-only: {kind} statements are refused. Query the views "
            f"({', '.join(VIEWS)}) with SELECT; to keep a result, use --format csv or json "
            "and redirect it to a file"
        )
    return query


def damaged_inside(error: BaseException, out: Path) -> AnalysisError | None:
    """The error to show when a query failed on a results file whose footer reads (so the
    views kept it) but whose pages are damaged, naming the table and the fix; None for any
    other error."""
    damaged = re.search(r"stream registered as '_(\w+)_raw' failed", str(error))
    if not isinstance(error, duckdb.Error) or damaged is None:
        return None
    table = damaged.group(1)
    return AnalysisError(
        f"{'an' if table[0] in 'aeiou' else 'a'} {table} file cannot be read "
        f"({str(error).splitlines()[0][:300]}): it is damaged inside (its footer reads, so the "
        f"views did not leave it out). Fix: `study check --out {out}` names it; "
        f"`study check NAME --repair --out {out}` re-runs its seed"
    )


@contextlib.contextmanager
def naming_damage(out: Path) -> Iterator[None]:
    """Turn a query's failure on a file damaged inside into :func:`damaged_inside`'s error
    (``study analyze``, ``study report``: they run many queries)."""
    try:
        yield
    except duckdb.Error as e:
        if (damaged := damaged_inside(e, out)) is not None:
            raise damaged from e
        raise


def run_sql(out: Path, query: str, fmt: str = "table", *, max_rows: int | None = 200) -> str:
    """Run one read-only SQL statement over the views of ``out`` and format the result.

    ``fmt``: ``table`` (aligned text, at most ``max_rows`` rows, ``None`` for all),
    ``csv`` or ``json`` (a list of row objects; always every row). Raises
    :class:`AnalysisError` on a write attempt (``"study sql is read-only: ..."``) and on
    any SQL error, with DuckDB's message.
    """
    check_format(fmt)
    _check_read_only(query)
    con = connect(out)
    try:
        df = con.execute(query).df()
    except duckdb.PermissionException as e:
        raise AnalysisError(
            f"study sql is read-only and reads only the views ({', '.join(VIEWS)}): {e}"
        ) from e
    except duckdb.Error as e:
        if (damaged := damaged_inside(e, out)) is not None:
            raise damaged from e
        raise AnalysisError(
            f"SQL error: {e}. The views are {', '.join(VIEWS)}; "
            "try 'DESCRIBE runs' to see their columns"
        ) from e
    finally:
        con.close()
    return format_frame(df, fmt, max_rows=max_rows)


@dataclass(frozen=True)
class StudyInfo:
    """One row of ``study ls``. ``planned`` and ``done`` both count *runs*: one config
    (trial_id) trained with one seed, i.e. one row of the ``runs`` table."""

    name: str
    kind: str | None
    """``seeds`` or ``tune`` (from the manifest; ``None`` without one)."""
    task: str | None
    model: str | None
    configs: int | None
    """Configs planned: a seed study's grid points, a tuning study's candidates (Optuna
    trials, ``tune.trials``); ``None`` without a manifest."""
    planned: int | None
    """Runs planned: per config its seed count, summed (a tuning study: candidates x
    ``tune.seeds_per_candidate``); ``None`` without a manifest."""
    done: int
    """Committed runs (any status: a committed run is finished)."""
    ok: int
    not_learned: int
    """Committed runs that never learned (e.g. Weber et al.'s stopping rule): counted apart."""
    diverged: int
    failed: int
    """Committed runs recorded as failed (``study resume --skip-failed``); ``study ls`` adds
    the seeds the last run's failed trials left uncommitted (``study.status``)."""
    pending: int | None
    """Runs planned and not yet committed (``study ls``: not counting failed ones): a seed
    study's; ``None`` without a manifest and for a tuning study (a pruned candidate's seeds
    are never committed)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def statuses(self) -> str:
        """The committed runs by status, e.g. ``59 ok, 1 not_learned, 0 diverged``; runs of
        any other status are counted as ``other``."""
        other = self.done - self.ok - self.not_learned - self.diverged - self.failed
        text = f"{self.ok} ok, {self.not_learned} not_learned, {self.diverged} diverged"
        return text + (f", {self.failed} failed" if self.failed else "") + (f", {other} other" if other else "")


def _manifest_or_warn(out: Path, name: str) -> Any:
    """``name``'s manifest, or None with a warning when it is damaged: one damaged manifest
    must not hide every other study from ``study ls``."""
    try:
        return load_manifest(out, name)
    except AnalysisError as exc:
        print(f"warning: {exc}; study {name} is listed without it", file=sys.stderr)
        return None


def list_studies(out: Path, *, only: Sequence[str] | None = None) -> list[StudyInfo]:
    """Every study under ``out`` (with a manifest or with results), sorted by name;
    ``only`` restricts the listing to those names."""
    con = connect(out, studies=only)
    try:
        rows = con.execute(
            "SELECT study, count(*) AS done, "
            "count(*) FILTER (WHERE status = 'ok') AS ok, "
            "count(*) FILTER (WHERE status = 'not_learned') AS not_learned, "
            "count(*) FILTER (WHERE status = 'diverged') AS diverged, "
            "count(*) FILTER (WHERE status = 'failed') AS failed "
            "FROM runs GROUP BY study"
        ).fetchall()
    finally:
        con.close()
    counts = {r[0]: r[1:] for r in rows}
    names = set(study_names(out)) | set(counts) | set(result_studies(out))
    if only is not None:
        names &= set(only)
    manifests = {name: _manifest_or_warn(out, name) for name in names}
    # Task and model from the trials rows only where no manifest says them: scanning the
    # (wide) trials files of every study was most of `study ls` on a large folder.
    need = sorted(n for n, m in manifests.items() if not (m and m.task and m.model))
    from_trials: dict[str, tuple[Any, Any]] = {}
    if need:
        con = connect(out, studies=need)
        try:
            from_trials = {r[0]: (r[1], r[2]) for r in con.execute(
                "SELECT study, any_value(task), any_value(model) FROM trials GROUP BY study"
            ).fetchall()}  # fmt: skip
        finally:
            con.close()
    infos = []
    for name in sorted(names):
        m = manifests[name]
        done, ok, not_learned, diverged, failed = counts.get(name, (0, 0, 0, 0, 0))
        task, model = from_trials.get(name, (None, None))
        configs, planned = _planned(m)
        infos.append(
            StudyInfo(
                name=name,
                kind=m.kind if m else None,
                task=(m.task if m and m.task else task),
                model=(m.model if m and m.model else model),
                configs=configs,
                planned=planned,
                done=int(done),
                ok=int(ok),
                not_learned=int(not_learned),
                diverged=int(diverged),
                failed=int(failed),
                pending=None if planned is None or (m and m.kind == "tune") else max(planned - int(done), 0),
            )
        )
    return infos


def _planned(m: Any) -> tuple[int | None, int | None]:
    """(configs, runs) a study's manifest plans: a tuning study's candidates and
    candidates x seeds per candidate (its ``points`` hold only the base config), else the
    points and their seed counts summed; (None, None) without a manifest."""
    if m is None:
        return None, None
    tune = m.raw.get("tune")
    if m.kind == "tune" and isinstance(tune, dict):
        try:
            candidates = int(m.raw["tune_trials"])
            return candidates, candidates * int(tune["seeds_per_candidate"])
        except (KeyError, TypeError, ValueError):
            pass  # an older or hand-made manifest: fall back to its points
    return (len(m.points) if m.points else None), m.planned


def format_studies(infos: list[StudyInfo], fmt: str = "table") -> str:
    """``list_studies`` output as text table, CSV or JSON; a table with a tuning study says
    why its ``pending`` is blank."""
    text = format_rows(infos, fmt, columns=list(StudyInfo.__dataclass_fields__))
    if fmt == "table" and any(i.pending for i in infos):
        text += ("\n(pending: planned runs not committed yet and not failed; "
                 "`study status NAME` shows them per config)")
    if fmt == "table" and any(i.kind == "tune" for i in infos):
        text += ("\n(pending is blank for a tuning study: a pruned candidate commits no runs; "
                 "`study status NAME` counts its candidates by state)")
    return text


def outside_views_sql(out: Path | str) -> str:
    """DuckDB SQL that opens ``out``'s tables as views showing committed rows only, for a
    reader outside fineline (``duckdb -init views.sql`` or pasted into the DuckDB CLI).

    The same rule as :func:`connect`: ``metrics``, ``evals`` and ``predictions`` rows count
    only when their ``(study, trial_id, seed)`` has a ``runs`` row (the commit marker);
    ``trials`` has one row per unit with committed seeds, ``configs`` one per config;
    ``runs`` keeps the latest commit per run; where ``study eval`` has written evaluations,
    their rows count once their ``evaluations`` row exists (write the views again after it).
    Unlike :func:`connect`, these views do not leave out a damaged file: a query that reads
    one fails (``study check`` names and repairs it). Temporary files of an atomic write end in
    ``.tmp`` and are not matched by ``*.parquet``. The study comes from the ``study=``
    folder (``hive_partitioning``), so files with or without a ``study`` column both read.
    """
    root = str(Path(out) / "tables").replace("'", "''")

    def scan(t: str) -> str:
        return (
            f"read_parquet('{root}/{t}/study=*/*.parquet', hive_partitioning = true, "
            "union_by_name = true)"
        )

    # every documented trials column exists (the views name them), also when no file has it
    types = {"int64": "BIGINT", "list<item: int64>": "BIGINT[]", "timestamp[us, tz=UTC]": "TIMESTAMPTZ"}
    typed = [*SCHEMAS["trials"], *FILE_ONLY["trials"]]
    nulls = ", ".join(f"NULL::{types.get(str(f.type), 'VARCHAR')} AS {f.name}" for f in typed)
    trials_scan = f"(SELECT {nulls} WHERE false) UNION ALL BY NAME SELECT * FROM {scan('trials')}"
    lines = [
        f"CREATE OR REPLACE VIEW runs AS SELECT * FROM {scan('runs')} QUALIFY row_number() "
        "OVER (PARTITION BY study, trial_id, seed ORDER BY committed_at DESC NULLS LAST) = 1;",
        f"CREATE OR REPLACE VIEW trials AS {trials_sql(f'({trials_scan})', 'runs')};",
    ]
    evaluated = bool(table_files(Path(out), "evaluations"))
    for t in ("metrics", "evals", "predictions") if not evaluated else ("metrics",):
        lines.append(
            f"CREATE OR REPLACE VIEW {t} AS SELECT t.* FROM {scan(t)} AS t SEMI JOIN runs AS r "
            "ON t.study = r.study AND t.trial_id = r.trial_id AND t.seed = r.seed;"
        )
    if evaluated:  # `study eval` ran: its rows replace training-time rows once committed
        lines.append(f"CREATE OR REPLACE VIEW evaluations AS SELECT * FROM {scan('evaluations')};")
        for t in ("evals", "predictions"):
            lines.append(f"CREATE OR REPLACE VIEW {t} AS {evaluated_rows_sql(scan(t), 'runs', 'evaluations')};")
    lines.append(f"CREATE OR REPLACE VIEW configs AS {configs_sql('trials', 'runs')};")
    return "\n".join(lines) + "\n"
