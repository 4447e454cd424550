"""What the report and ``analyze`` need to know about one study, loaded once.

:func:`open_study` joins the manifest (optional) with what the views hold: the split
order and roles, the primary metric, the test splits, grid-point labels, and the axes of
the seed scatter. Declarations naming splits or metrics the results do not have are
dropped with a note (the report lists the notes) rather than failing the whole report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pandas as pd

from analysis import queries as q
from analysis.db import connect, result_studies
from analysis.errors import unknown_study
from analysis.manifest import (
    Axis,
    Manifest,
    MetricSense,
    RegressionDecl,
    guessed_sense,
    load_manifest,
)
from analysis.schema import ROLE_ORDER


@dataclass
class StudyContext:
    """One study's results and declarations, ready for charts and summaries."""

    out: Path
    name: str
    con: duckdb.DuckDBPyConnection
    manifest: Manifest | None
    labels: dict[str, str]
    """trial_id -> grid-point label."""
    evals: pd.DataFrame
    """:func:`analysis.queries.eval_values` of the study (every metric)."""
    splits: list[str]
    """Every split with evals, in the task's order (manifest) or by role."""
    roles: dict[str, str]
    primary: str | None
    """The metric of distributions and correlations (``None`` without evals)."""
    test_splits: list[str]
    scatter: tuple[Axis, Axis] | None
    regressions: list[RegressionDecl]
    histograms: list[Axis]
    notes: list[str] = field(default_factory=list)
    code: list[tuple[str, int]] = field(default_factory=list)
    """Runs per code commit (``trials.git_sha``), most first (:func:`analysis.queries.code_runs`)."""
    _logged: set[tuple[str, str]] | None = None
    """(split, metric) pairs in ``metrics`` (loaded on first use)."""

    @property
    def kind(self) -> str:
        return self.manifest.kind if self.manifest else "seeds"

    @property
    def multi(self) -> bool:
        """True when the study has several grid points (colour by point)."""
        return self.evals["point"].nunique() > 1 if not self.evals.empty else False

    def sense(self, metric: str) -> MetricSense:
        """How ``metric`` reads (which way is better, its range): the task's declaration in
        the manifest, else guessed from the name (a study from before the declarations)."""
        return self.manifest.declarations.sense(metric) if self.manifest else guessed_sense(metric)

    def has(self, axis: Axis, table: str = "evals") -> bool:
        """Whether ``table`` (evals or metrics) has values of ``axis``'s split and metric."""
        if table == "evals":
            e = self.evals
            return bool(((e["split"] == axis.split) & (e["metric"] == axis.metric)).any())
        if self._logged is None:
            rows = self.con.execute(
                "SELECT DISTINCT split, metric FROM metrics WHERE study = ?", [self.name]
            ).fetchall()
            self._logged = {(r[0], r[1]) for r in rows}
        return (axis.split, axis.metric) in self._logged

    def run_seeds(self) -> pd.DataFrame:
        """The study's committed runs with every seed source (:func:`analysis.queries.run_seeds`)."""
        return q.run_seeds(self.con, self.name)

    def ok_only(self, runs: pd.DataFrame) -> pd.DataFrame:
        """The rows of ``runs`` (columns trial_id, seed, ...) whose run's status is ``ok``:
        what every number of ``study analyze`` is computed over."""
        seeds = self.run_seeds()
        ok = seeds.loc[seeds["status"].fillna("ok") == "ok", ["trial_id", "seed"]]
        keys = set(zip(ok["trial_id"], ok["seed"].astype(int), strict=True))
        keep = [(t, int(s)) in keys for t, s in zip(runs["trial_id"], runs["seed"], strict=True)]
        return runs[keep].reset_index(drop=True)

    def close(self) -> None:
        self.con.close()


def _primary(m: Manifest | None, metrics: list[str]) -> str | None:
    declared = m.declarations.primary_metric if m else None
    if declared and declared in metrics:
        return declared
    if "accuracy" in metrics:
        return "accuracy"
    sense = m.declarations.sense if m else guessed_sense
    good = [x for x in metrics if sense(x).higher_is_better] or metrics
    return good[0] if good else None


def open_study(out: Path, study: str) -> StudyContext:
    """Load ``study`` from ``out`` (raises AnalysisError naming known studies if unknown)."""
    out = Path(out)
    known = result_studies(out) if out.is_dir() else []
    if study not in known:
        raise unknown_study(study, str(out), known)
    con = connect(out, studies=[study], in_memory=("trials", "runs", "evals", "metrics"))
    try:
        m = load_manifest(out, study)
        labels = m.point_labels() if m else {}
        evals = q.eval_values(con, study, labels=labels)
    except BaseException:
        con.close()
        raise
    roles = dict(zip(evals["split"], evals["role"], strict=True))
    decl = m.declarations if m else None
    # the manifest's split order, else by role, declared test splits in their order
    order = [s for s, _ in (m.splits if m else ()) if s in roles]
    rank = {r: i for i, r in enumerate(ROLE_ORDER)}
    declared = {s: i for i, s in enumerate(decl.test_splits if decl else ())}
    rest = sorted(
        (s for s in roles if s not in order),
        key=lambda s: (rank.get(roles[s], 9), declared.get(s, len(declared)), s),
    )
    splits = order + rest
    primary = _primary(m, sorted(set(evals["metric"])))
    tests = [s for s in (decl.test_splits if decl else ()) if s in roles]
    tests = tests or [s for s in splits if roles[s] == "test"]
    ctx = StudyContext(
        out=out,
        name=study,
        con=con,
        manifest=m,
        labels=labels,
        evals=evals,
        splits=splits,
        roles=roles,
        primary=primary,
        test_splits=tests,
        scatter=None,
        regressions=[],
        histograms=[],
    )
    if decl and decl.unknown:
        ctx.notes.append(f"declarations not understood (ignored): {', '.join(decl.unknown)}")
    if decl and decl.scatter and all(ctx.has(a) for a in decl.scatter):
        ctx.scatter = decl.scatter
    else:
        if decl and decl.scatter:
            ctx.notes.append("declared scatter axes have no evals; using the first two test splits")
        usable = [s for s in tests if primary and ctx.has(Axis(s, primary))]
        if primary and len(usable) >= 2:
            ctx.scatter = (Axis(usable[0], primary), Axis(usable[1], primary))
    for r in decl.regressions if decl else ():
        table = "evals" if r.over == "runs" else "metrics"
        if ctx.has(r.x, table) and ctx.has(r.y, table):
            ctx.regressions.append(r)
        else:
            ctx.notes.append(
                f"regression of {r.y.split} {r.y.metric} on {r.x.split} {r.x.metric} "
                f"(over {r.over}) skipped: no such {table} rows"
            )
    for h in decl.histograms if decl else ():
        if ctx.has(h):
            ctx.histograms.append(h)
        else:
            ctx.notes.append(f"histogram of {h.split} {h.metric} skipped: no such evals")
    mixed = numerics_note(q.numerics_runs(con, study))
    if mixed:
        ctx.notes.append(mixed)
    ctx.code = q.code_runs(con, study)
    if len(ctx.code) > 1:
        listed = "; ".join(f"{n} at {sha[:12]}" for sha, n in ctx.code)
        ctx.notes.append(
            f"runs were trained from {len(ctx.code)} commits of the code (trials.git_sha): {listed}. A difference "
            "between runs of different commits may be the code's, not the seeds' (compare them with "
            "`study sql`, grouping by git_sha, or re-run the older ones under the newer code with a new --name)"
        )
    return ctx


def numerics_note(paths: list[tuple[str, int]]) -> str | None:
    """The note for a study whose runs were computed under more than one ``numerics``
    (``paths``: :func:`analysis.queries.numerics_runs`), else None."""
    if len(paths) < 2:
        return None
    listed = "; ".join(f"{n} runs on '{text}'" for text, n in paths)
    return (
        f"runs were computed under {len(paths)} different numerics (trials.numerics): {listed}. "
        "Seed statistics still hold, but a seed reproduces exactly only under its own numerics, "
        "and a seed re-run elsewhere (study resume, study check --repair) may end differently; "
        "to pin MKL's and torch's CPU code paths set MKL_CBWR=COMPATIBLE and "
        "ATEN_CPU_CAPABILITY=default (docs/performance.md)"
    )


def axis_label(a: Axis) -> str:
    """``val loss`` or ``-log(val loss)`` for a transformed axis."""
    base = f"{a.split} {a.metric}"
    names = {"neglog": "-log({})", "log": "log({})", "neg": "-({})"}
    return names.get(a.transform or "", "{}").format(base)
