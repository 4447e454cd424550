"""Length generalization (Zhou et al. 2023) as a declared aggregate.

Kind ``length_generalization`` for :data:`analysis.aggregates.KINDS` (declared by the
``length_gen`` task's ``analysis()``)::

    {"kind": "length_generalization", "metric": "exact", "oracle_metric"?: "oracle_exact",
     "lengths": {"len_1": 1, ...}, "band": ["len_15", ..., "len_20"], "level"?: 0.9,
     "train_max"?: 10, "band_examples"?: 300}

A run **length-generalizes** when its ``metric`` over the ``band`` splits (the mean of their
values: the test splits have equal sizes, so the pooled exact match) is at least ``level``.
Per grid point: the runs, the mean band value, how many runs generalize and their fraction
with a Wilson 95% interval and a bootstrap 95% interval (seeds resampled, and each seed's
band value redrawn from its ``band_examples`` test examples: :func:`analysis.intervals.share_interval`),
and which seeds do (:func:`generalization_table`); the same for
``oracle_metric`` (greedy generation of exactly the answer's length) where the study has it.
Where configs varied seed sources one at a time (``seeds.vary: [[init], [order]]``), a second
table gives each source's share of the seed variance of the band value and of whether a run
generalizes (:func:`generalization_sources`).
The charts draw the share that generalizes per grid point with both intervals, and
``metric`` (and the oracle's) by test length, one line per run and the mean per grid
point, with the level and the longest training length ``train_max`` marked.

The statistics are pure functions on DataFrames whose docstrings give the table shapes.
Only runs with status ``ok`` enter, as everywhere in the analysis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pandas as pd

from analysis import intervals as iv
from analysis import verdict as vd
from analysis.aggregates import Aggregate, AggregateResult, Panels, _fail, _ok, register
from analysis.context import StudyContext
from analysis.manifest import Axis
from analysis.verdict_axis import pooled_values

# ---------------------------------------------------------------------------- pure functions


def band_values(values: pd.DataFrame, band: list[str] | tuple[str, ...]) -> pd.DataFrame:
    """Each run's mean value over the ``band`` splits.

    ``values``: one row per (run, split) of one metric, columns point, trial_id, seed, split,
    value. A run needs a finite value on every band split (else it is left out). Returns one
    row per run in order of first appearance, columns point, trial_id, seed, value.
    """
    out = pooled_values(values, band, ["point", "trial_id", "seed"])
    return out.astype({"seed": int, "value": float})


GENERALIZATION_COLUMNS = ("point", "runs", "mean", "min", "max", "generalize", "fraction", "low",
                          "high", "boot_low", "boot_high", "seeds")  # fmt: skip


def generalization_table(runs: pd.DataFrame, level: float, examples: int | None = None) -> pd.DataFrame:
    """Per grid point, the runs whose band value reaches ``level``.

    ``runs``: one row per run, columns point, trial_id, seed, value (:func:`band_values`).
    Returns :data:`GENERALIZATION_COLUMNS`, one row per point in order of first appearance:
    runs, mean/min/max of the band value, generalize (runs with value >= level), fraction
    with its Wilson 95% interval (low, high) and its bootstrap 95% interval (boot_low,
    boot_high: :func:`analysis.intervals.share_interval` with ``examples`` test examples
    per run's band value, None: seeds resampled only) and seeds (the generalizing seed
    indices, ascending, space-separated).
    """
    rows = []
    for point, sub in runs.groupby("point", sort=False):
        good = sub["value"] >= level - iv.LEVEL_TOLERANCE
        ci = iv.proportion_interval(int(good.sum()), len(sub))
        boot = iv.share_interval(sub["value"].to_numpy(), level, examples)
        seeds = " ".join(str(s) for s in sorted(sub.loc[good, "seed"].astype(int)))
        rows.append((point, len(sub), float(sub["value"].mean()), float(sub["value"].min()),
                     float(sub["value"].max()), int(good.sum()), ci.estimate, ci.low, ci.high,
                     boot.low, boot.high, seeds))  # fmt: skip
    return pd.DataFrame(rows, columns=list(GENERALIZATION_COLUMNS))


def generalization_sources(
    bands: dict[str, pd.DataFrame], level: float, runs: pd.DataFrame, *, n_boot: int = 2000, seed: int = 0
) -> pd.DataFrame:
    """Each seed source's share of the seed variance of the band value and of whether a run
    length-generalizes, where configs varied one seed source each.

    ``bands``: per metric (decoding), its :func:`band_values` rows; ``runs``: one row per
    run with trial_id, seed and the seed-source columns (:func:`analysis.queries.run_seeds`).
    Per metric two outcomes: ``<metric>`` (the band value) and ``<metric> >= <level>`` (0/1);
    the rows and columns of :func:`analysis.verdict.outcome_sources` (empty when fewer than
    two sources were varied alone, outcomes without seed variance left out).
    """
    outcomes: pd.DataFrame | None = None
    names: list[str] = []
    for metric, b in bands.items():
        reached = f"{metric} >= {level:g}"
        o = b[["trial_id", "seed"]].assign(**{metric: b["value"],
                                              reached: (b["value"] >= level - iv.LEVEL_TOLERANCE).astype(float)})  # fmt: skip
        outcomes = o if outcomes is None else outcomes.merge(o, on=["trial_id", "seed"], how="outer")
        names += [metric, reached]
    if outcomes is None:
        return pd.DataFrame()
    return vd.outcome_sources(outcomes, names, runs, n_boot=n_boot, seed=seed)


def by_length(values: pd.DataFrame, lengths: dict[str, int]) -> pd.DataFrame:
    """``values`` (columns point, trial_id, seed, split, metric, value) restricted to the
    length splits, with their ``length``; sorted by point, run and length."""
    v = values[values["split"].isin(list(lengths))].copy()
    v["length"] = v["split"].map(lengths).astype(int)
    return v.sort_values(["point", "trial_id", "seed", "metric", "length"], kind="stable").reset_index(drop=True)


# ---------------------------------------------------------------------------- the kind


@register
@dataclass(frozen=True)
class LengthGeneralization(Aggregate):
    """The fraction of seeds that length-generalize, free-running and with the oracle length."""

    kind: ClassVar[str] = "length_generalization"
    metric: str
    """The free-running per-split metric (exact match)."""
    lengths: tuple[tuple[str, int], ...]
    """Every per-length test split and its length, in length order."""
    band: tuple[str, ...]
    """The splits whose mean value decides whether a run length-generalizes."""
    level: float = 0.9
    """A run length-generalizes when its band value is at least this."""
    oracle_metric: str | None = None
    """The same with the answer's length given (None: not declared)."""
    train_max: int | None = None
    """The longest training length (marked on the charts)."""
    band_examples: int | None = None
    """Test examples behind a run's band value (the bootstrap redraws it from them; None:
    the bootstrap resamples seeds only)."""

    @classmethod
    def parse(cls, raw: dict[str, Any], where: str) -> LengthGeneralization:
        lengths, band = raw.get("lengths"), raw.get("band")
        if not isinstance(raw.get("metric"), str):
            raise _fail(f"{where}.metric", f"expected a metric name, got {raw.get('metric')!r}")
        if not isinstance(lengths, dict) or not lengths or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in lengths.items()
        ):
            raise _fail(f"{where}.lengths", f"expected {{split: length}}, got {lengths!r}")
        if not isinstance(band, list | tuple) or not band or not set(band) <= set(lengths):
            raise _fail(f"{where}.band", f"expected a non-empty list of splits named in lengths, got {band!r}")
        level = raw.get("level", 0.9)
        if isinstance(level, bool) or not isinstance(level, int | float) or not 0 < level <= 1:
            raise _fail(f"{where}.level", f"{level!r} is not a number in (0, 1]")
        oracle, top, examples = raw.get("oracle_metric"), raw.get("train_max"), raw.get("band_examples")
        if oracle is not None and not isinstance(oracle, str):
            raise _fail(f"{where}.oracle_metric", f"expected a metric name, got {oracle!r}")
        if top is not None and (isinstance(top, bool) or not isinstance(top, int)):
            raise _fail(f"{where}.train_max", f"expected an integer, got {top!r}")
        if examples is not None and (isinstance(examples, bool) or not isinstance(examples, int) or examples < 1):
            raise _fail(f"{where}.band_examples", f"expected a positive integer, got {examples!r}")
        ordered = tuple(sorted(lengths.items(), key=lambda kv: kv[1]))
        return cls(raw["metric"], ordered, tuple(band), float(level), oracle, top, examples)

    def needs(self) -> list[tuple[Axis, str]]:
        return [(Axis(s, self.metric), "evals") for s in self.band]

    def declaration(self) -> dict[str, Any]:
        return {"kind": self.kind, "metric": self.metric, "oracle_metric": self.oracle_metric,
                "lengths": dict(self.lengths), "band": list(self.band), "level": self.level,
                "train_max": self.train_max, "band_examples": self.band_examples}  # fmt: skip

    def decodings(self, ctx: StudyContext) -> list[tuple[str, str]]:
        """(prefix, metric) per decoding the study holds: free-running, then the oracle's."""
        out = [("", self.metric)]
        if self.oracle_metric:
            if all(ctx.has(Axis(s, self.oracle_metric)) for s in self.band):
                out.append(("oracle_", self.oracle_metric))
            else:
                ctx.notes.append(f"length_generalization: no {self.oracle_metric} on the band splits "
                                 "(the model gives no oracle-length decoding); free-running only")  # fmt: skip
        return out

    def compute(self, ctx: StudyContext, baselines: pd.DataFrame) -> AggregateResult:
        ok = _ok(ctx)
        table: pd.DataFrame | None = None
        decodings = self.decodings(ctx)
        bands = {metric: band_values(ok[ok["metric"] == metric], self.band) for _, metric in decodings}
        for prefix, metric in decodings:
            t = generalization_table(bands[metric], self.level, self.band_examples)
            t = t.rename(columns={c: prefix + c for c in t.columns if c not in ("point", "runs")})
            table = t if table is None else table.merge(t, on=["point", "runs"], how="outer", sort=False)
        assert table is not None
        table.insert(2, "level", self.level)
        table.insert(3, "band", f"{self.band[0]}..{self.band[-1]}")
        table["warn"] = [iv.seed_warning(int(n)) for n in table["runs"]]
        metrics = [m for _, m in decodings]
        detail = by_length(ok[ok["metric"].isin(metrics)], dict(self.lengths))
        detail = detail[["point", "trial_id", "seed", "split", "length", "metric", "value"]]
        oracle = f" and {self.oracle_metric} (oracle length, columns oracle_*)" if len(metrics) > 1 else ""
        title = (f"Runs that length-generalize: mean {self.metric}{oracle} over {self.band[0]}..{self.band[-1]} "
                 f">= {self.level:g}, per grid point; low/high: Wilson 95%; boot_low/boot_high: bootstrap 95% "
                 f"(seeds and each seed's test examples resampled); seeds: which")  # fmt: skip
        sources = generalization_sources(bands, self.level, ctx.run_seeds())
        more = () if sources.empty else ((
            f"Seed sources of length generalization, where configs varied one at a time: each source's share "
            f"of the seed variance of the band value (mean over {self.band[0]}..{self.band[-1]}) and of whether "
            f"a run reaches {self.level:g} (0/1); 95% percentile bootstrap, runs resampled within each config",
            sources),)  # fmt: skip
        return AggregateResult(self, title, table.reset_index(drop=True), detail, more)

    def panels(
        self, result: AggregateResult, store: Any, baselines: pd.DataFrame, *, multi: bool
    ) -> Panels:
        out: Panels = [("length-generalization-share", share_chart(store, share_rows(result.table)), True)]
        for metric in dict.fromkeys(result.detail["metric"]):
            sub = result.detail[result.detail["metric"] == metric]
            what = "oracle length" if metric == self.oracle_metric else "free-running"
            chart = by_length_chart(store, sub, metric, what, self.level, self.train_max, multi=multi)
            out.append((f"length-generalization-{metric}", chart, True))
        return out


SHARE_ROWS = ("point", "decoding", "runs", "generalize", "fraction", "low", "high", "boot_low", "boot_high")


def share_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The aggregate's table (:data:`GENERALIZATION_COLUMNS`, oracle columns ``oracle_*``)
    as one row per (point, decoding), decoding ``free-running`` or ``oracle length``:
    :data:`SHARE_ROWS`."""
    parts = []
    for prefix, decoding in (("", "free-running"), ("oracle_", "oracle length")):
        if prefix + "fraction" not in table:
            continue
        cols = ["generalize", "fraction", "low", "high", "boot_low", "boot_high"]
        part = table[["point", "runs", *[prefix + c for c in cols]]].rename(columns={prefix + c: c for c in cols})
        parts.append(part.assign(decoding=decoding))
    return pd.concat(parts, ignore_index=True)[list(SHARE_ROWS)]


def share_chart(store: Any, rows: pd.DataFrame) -> Any:
    """The share of runs that length-generalize per grid point and decoding (:func:`share_rows`):
    a dot, its Wilson 95% interval (thick) and its bootstrap 95% interval (thin)."""
    import altair as alt

    base = alt.Chart(store.add(rows)).encode(
        y=alt.Y("point:N", title=None), yOffset=alt.YOffset("decoding:N"),
        color=alt.Color("decoding:N", title="decoding"),
    )  # fmt: skip
    x = alt.X("fraction:Q", title="share of runs that length-generalize", scale=alt.Scale(domain=[0, 1]))
    tips = [alt.Tooltip(c) for c in ("point:N", "decoding:N", "runs:Q", "generalize:Q")] + [
        alt.Tooltip(f"{c}:Q", format=".2f") for c in ("fraction", "low", "high", "boot_low", "boot_high")]  # fmt: skip
    wilson = base.mark_rule(strokeWidth=4, opacity=0.35).encode(x=alt.X("low:Q"), x2="high:Q")
    boot = base.mark_rule(strokeWidth=1).encode(x=alt.X("boot_low:Q"), x2="boot_high:Q")
    dot = base.mark_point(filled=True, size=60).encode(x=x, tooltip=tips)
    head = alt.TitleParams("Runs that length-generalize",
                           subtitle=["dot: share of runs; thick: Wilson 95%; thin: bootstrap 95% (seeds and "
                                     "each seed's test examples resampled)"])  # fmt: skip
    return alt.layer(wilson, boot, dot).properties(width=520, title=head)


def by_length_chart(
    store: Any, values: pd.DataFrame, metric: str, what: str, level: float, train_max: int | None,
    *, multi: bool,
) -> Any:
    """``metric`` by test length: a thin line per run, the mean per grid point, a rule at
    ``level`` and one at ``train_max``. ``values``: columns point, trial_id, seed, length, value."""
    import altair as alt

    from analysis import charts

    sel = charts.seed_selection()
    color = alt.Color("point:N", title="grid point") if multi else alt.value("#4c78a8")
    base = alt.Chart(store.add(values[["point", "trial_id", "seed", "length", "value"]]))
    x = alt.X("length:Q", title="test length", scale=alt.Scale(zero=False))
    runs = base.mark_line(strokeWidth=1).encode(
        x=x, y=alt.Y("value:Q", title=f"{metric} ({what})", scale=alt.Scale(domain=[0, 1])),
        detail=["trial_id:N", "seed:O"], color=color,
        opacity=alt.when(sel).then(alt.value(0.45)).otherwise(alt.value(0.08)),
        tooltip=charts.run_tooltip("length:Q", alt.Tooltip("value:Q", format=".3f")),
    ).add_params(sel)  # fmt: skip
    mean = base.mark_line(strokeWidth=3).encode(x=x, y="mean(value):Q", color=color)
    rules = [alt.Chart(store.add(pd.DataFrame({"y": [level]}))).mark_rule(strokeDash=[4, 4]).encode(y="y:Q")]
    if train_max is not None:
        rules.append(alt.Chart(store.add(pd.DataFrame({"x": [train_max]}))).mark_rule(color="gray").encode(x="x:Q"))
    head = alt.TitleParams(f"{metric} by test length ({what})",
                           subtitle=[f"one line per run, thick: mean per grid point; dashed: level {level:g}"
                                     + ("; gray: longest training length" if train_max is not None else "")])  # fmt: skip
    return alt.layer(runs, mean, *rules).properties(width=520, height=260, title=head)
