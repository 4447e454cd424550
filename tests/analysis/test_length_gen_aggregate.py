"""The length_generalization aggregate (Zhou et al. 2023): band values, the fraction of
seeds that length-generalize with its Wilson interval, on tables worked out by hand; the
declaration's parsing; and the whole kind on a synthetic study (charts included)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from analysis.aggregates import KINDS, StudyAggregates, aggregates_text, parse_aggregates
from analysis.errors import AnalysisError
from analysis.length_gen import (
    LengthGeneralization,
    band_values,
    by_length,
    generalization_sources,
    generalization_table,
    share_rows,
)

BAND = ["len_3", "len_4"]


def _values(point: str, per_run: dict[int, dict[str, float]], trial: str = "t") -> pd.DataFrame:
    return pd.DataFrame([{"point": point, "trial_id": trial, "seed": s, "split": sp, "value": v}
                         for s, vals in per_run.items() for sp, v in vals.items()])  # fmt: skip


def test_band_values_average_the_band_and_leave_out_incomplete_runs() -> None:
    v = _values("A", {0: {"len_2": 0.0, "len_3": 1.0, "len_4": 0.8}, 1: {"len_3": 0.5, "len_4": 0.7},
                      2: {"len_3": 1.0}, 3: {"len_3": math.nan, "len_4": 1.0}})  # fmt: skip
    out = band_values(v, BAND)
    # seed 0: (1.0 + 0.8) / 2 (len_2 is outside the band); seed 1: 0.6; seeds 2, 3 lack len_4 / len_3
    assert out[["seed", "value"]].values.tolist() == [[0, 0.9], [1, pytest.approx(0.6)]]


def test_generalization_table_counts_runs_at_the_level_with_wilson_intervals() -> None:
    runs = pd.DataFrame({"point": ["A"] * 4 + ["B"] * 2, "trial_id": ["a"] * 4 + ["b"] * 2,
                         "seed": [3, 0, 1, 2, 0, 1], "value": [0.9, 0.95, 0.2, 0.89999, 0.0, 0.1]})  # fmt: skip
    a, b = generalization_table(runs, 0.9).to_dict("records")
    assert (a["point"], a["runs"], a["generalize"], a["fraction"], a["seeds"]) == ("A", 4, 2, 0.5, "0 3")
    # Wilson 95% for 2 of 4: (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)
    z, n, p = 1.959963984540054, 4, 0.5
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert (a["low"], a["high"]) == (pytest.approx(centre - half), pytest.approx(centre + half))
    assert (a["mean"], a["min"], a["max"]) == (pytest.approx((0.9 + 0.95 + 0.2 + 0.89999) / 4), 0.2, 0.95)
    assert (b["generalize"], b["fraction"], b["seeds"], b["low"]) == (0, 0.0, "", 0.0)
    # the bootstrap of seeds only: B's runs are all far below the level -> [0, 0]; A's share
    # of 4 resampled runs spans from 0 or 1/4 to 3/4 or 1
    assert (b["boot_low"], b["boot_high"]) == (0.0, 0.0)
    assert a["boot_low"] <= 0.25 and a["boot_high"] >= 0.75


def test_generalization_table_redraws_runs_near_the_level_from_their_examples() -> None:
    runs = pd.DataFrame({"point": ["A"] * 10, "trial_id": ["a"] * 10, "seed": range(10), "value": [0.9] * 10})
    seeds_only, redrawn = generalization_table(runs, 0.9), generalization_table(runs, 0.9, examples=300)
    assert (seeds_only["boot_low"][0], seeds_only["boot_high"][0]) == (1.0, 1.0)
    assert redrawn["fraction"][0] == 1.0 and redrawn["boot_low"][0] < 0.5 < redrawn["boot_high"][0]


def test_by_length_keeps_the_length_splits_in_length_order() -> None:
    v = _values("A", {0: {"len_10": 0.1, "len_9": 0.2, "val": 1.0}}).assign(metric="exact")
    out = by_length(v, {"len_9": 9, "len_10": 10})
    assert out[["split", "length"]].values.tolist() == [["len_9", 9], ["len_10", 10]]


DECL = {"kind": "length_generalization", "metric": "exact", "oracle_metric": "oracle_exact",
        "lengths": {"len_4": 4, "len_2": 2, "len_3": 3}, "band": BAND, "level": 0.75, "train_max": 2,
        "band_examples": 60}  # fmt: skip


def test_the_declaration_parses_and_round_trips() -> None:
    assert KINDS["length_generalization"] is LengthGeneralization
    (d,) = parse_aggregates([DECL])
    assert isinstance(d, LengthGeneralization)
    assert d.lengths == (("len_2", 2), ("len_3", 3), ("len_4", 4)) and d.band == tuple(BAND)
    assert (d.level, d.oracle_metric, d.train_max, d.band_examples) == (0.75, "oracle_exact", 2, 60)
    assert parse_aggregates([d.declaration()]) == [d]


@pytest.mark.parametrize(
    ("change", "where"),
    [({"metric": 3}, "metric"), ({"lengths": {"len_3": "3"}}, "lengths"), ({"band": ["len_9"]}, "band"),
     ({"level": 1.5}, "level"), ({"oracle_metric": 1}, "oracle_metric"), ({"train_max": 2.5}, "train_max"),
     ({"band_examples": 0}, "band_examples")],
)  # fmt: skip
def test_malformed_declarations_name_the_key(change: dict[str, Any], where: str) -> None:
    with pytest.raises(AnalysisError, match=rf"aggregates\[0\]\.{where}: .*Fix the task's analysis"):
        parse_aggregates([{**DECL, **change}])


class _Ctx:
    """What the kind reads of a study: its evals, notes and ``has``."""

    def __init__(self, evals: pd.DataFrame, seeds: pd.DataFrame | None = None) -> None:
        self.evals, self.notes, self.seeds = evals, [], seeds

    def run_seeds(self) -> pd.DataFrame:
        e = self.evals.drop_duplicates(["trial_id", "seed"])[["trial_id", "seed"]]
        return self.seeds if self.seeds is not None else e.assign(init_seed=e["seed"], order_seed=e["seed"],
                                                                   dropout_seed=0, data_seed=0)  # fmt: skip

    def has(self, axis: Any, table: str = "evals") -> bool:
        e = self.evals
        return bool(((e["split"] == axis.split) & (e["metric"] == axis.metric)).any())


def _evals(oracle: bool) -> pd.DataFrame:
    """Point P: seeds 0-2; exact on len_3/len_4: (1, 1), (0.5, 1), (0, 0); oracle: all 1 but
    seed 2 (0.5, 0.5); seed 3 diverged (never counts). Point Q: one seed, exact 1."""
    rows = []
    runs = {("P", 0): (1, 1), ("P", 1): (0.5, 1), ("P", 2): (0, 0), ("P", 3): (1, 1), ("Q", 0): (1, 1)}
    for (point, seed), (v3, v4) in runs.items():
        status = "diverged" if seed == 3 else "ok"
        base = {"point": point, "trial_id": point.lower(), "seed": seed, "status": status, "role": "test"}
        for split, v in (("len_2", 1.0), ("len_3", v3), ("len_4", v4)):
            rows.append({**base, "split": split, "metric": "exact", "value": float(v)})
            if oracle:
                rows.append({**base, "split": split, "metric": "oracle_exact",
                             "value": 0.5 if (point, seed) == ("P", 2) else 1.0})  # fmt: skip
    return pd.DataFrame(rows)


def test_the_kind_computes_free_running_and_oracle_fractions_and_draws_them(tmp_path: Path) -> None:
    from analysis import charts

    (d,) = parse_aggregates([DECL])
    ctx = _Ctx(_evals(oracle=True))
    res = d.compute(ctx, pd.DataFrame())  # type: ignore[arg-type]
    p, q = res.table.to_dict("records")
    # P: band means 1.0, 0.75, 0.0 at level 0.75 -> seeds 0 and 1; oracle: 1, 1, 0.5 -> seeds 0 and 1
    assert (p["point"], p["runs"], p["generalize"], p["seeds"], p["band"]) == ("P", 3, 2, "0 1", "len_3..len_4")
    assert (p["oracle_generalize"], p["oracle_seeds"], p["oracle_mean"]) == (2, "0 1", pytest.approx(2.5 / 3))
    assert (q["runs"], q["fraction"], q["oracle_fraction"]) == (1, 1.0, 1.0)
    assert set(res.detail["metric"]) == {"exact", "oracle_exact"} and set(res.detail["seed"]) == {0, 1, 2}
    panels = d.panels(res, charts.ChartData(), pd.DataFrame(), multi=True)
    assert [name for name, _, _ in panels] == ["length-generalization-share", "length-generalization-exact",
                                               "length-generalization-oracle_exact"]  # fmt: skip
    for _, chart, _ in panels:
        assert chart.to_dict()["layer"]  # a valid Vega-Lite spec with its layers
    rows = share_rows(res.table).set_index(["point", "decoding"])
    assert rows.loc[("P", "free-running"), ["runs", "generalize"]].tolist() == [3, 2]
    assert rows.loc[("P", "oracle length"), "fraction"] == pytest.approx(2 / 3)
    assert rows.loc[("P", "oracle length"), "low"] == pytest.approx(p["oracle_low"])
    assert len(rows) == 4  # 2 points x 2 decodings
    ctx = _Ctx(_evals(oracle=False))
    res = d.compute(ctx, pd.DataFrame())  # type: ignore[arg-type]
    assert "oracle_fraction" not in res.table and any("no oracle_exact" in n for n in ctx.notes)
    assert res.more == ()  # init and order varied together: no seed sources to split


def _source_runs(trial: str, source: str, seeds: range) -> pd.DataFrame:
    """Runs of config ``trial`` varying one seed source (the others fixed)."""
    fixed = {"init_seed": 7, "order_seed": 8, "dropout_seed": 0, "data_seed": 0}
    return pd.DataFrame([{"trial_id": trial, "seed": s, **fixed, source: 100 + s} for s in seeds])


def test_generalization_sources_split_the_band_value_and_the_indicator_by_hand() -> None:
    # config i varies the init seed: band values 1.0, 0.8, 1.0, 0.8 (two of four reach 0.9);
    # config o varies the order seed: 0.95, 0.95, 0.93, 0.93 (all reach it)
    band = pd.DataFrame({"point": ["I"] * 4 + ["O"] * 4, "trial_id": ["i"] * 4 + ["o"] * 4,
                         "seed": [0, 1, 2, 3] * 2, "value": [1.0, 0.8, 1.0, 0.8, 0.95, 0.95, 0.93, 0.93]})  # fmt: skip
    runs = pd.concat([_source_runs("i", "init_seed", range(4)), _source_runs("o", "order_seed", range(4))])
    src = generalization_sources({"oracle_exact": band}, 0.9, runs, n_boot=400).set_index(["of", "source"])
    v_init, v_order = np.var([1.0, 0.8, 1.0, 0.8], ddof=1), np.var([0.95, 0.95, 0.93, 0.93], ddof=1)
    assert src.loc[("oracle_exact", "init"), "share"] == pytest.approx(v_init / (v_init + v_order))
    assert src.loc[("oracle_exact", "order"), "var"] == pytest.approx(v_order)
    # whether it generalizes: 1, 0, 1, 0 under init (variance 1/3), always 1 under order (0)
    assert src.loc[("oracle_exact >= 0.9", "init"), ["var", "share"]].tolist() == [pytest.approx(1 / 3), 1.0]
    assert (src["low"] <= src["share"] + 1e-12).all() and (src["share"] <= src["high"] + 1e-12).all()
    # one source varied alone: nothing to split
    assert generalization_sources({"exact": band[band["trial_id"] == "i"]}, 0.9, runs).empty


def test_the_kind_prints_seed_sources_where_configs_varied_one_each() -> None:
    (d,) = parse_aggregates([DECL])
    seeds = pd.concat([_source_runs("p", "init_seed", range(4)), _source_runs("q", "order_seed", range(1))])
    evals = _evals(oracle=True)
    # Q gets three more order seeds, band exact 1.0, 1.0, 0.0 (seed 3 diverged in P only)
    more = evals[(evals["point"] == "Q")].copy()
    extra = [more.assign(seed=s, value=more["value"] * v) for s, v in ((1, 1.0), (2, 1.0), (3, 0.0))]
    ctx = _Ctx(pd.concat([evals, *extra], ignore_index=True),
               pd.concat([seeds, _source_runs("q", "order_seed", range(1, 4))]))  # fmt: skip
    res = d.compute(ctx, pd.DataFrame())  # type: ignore[arg-type]
    ((title, table),) = res.more
    assert "Seed sources" in title and set(table["source"]) == {"init", "order"}
    # P (init, seeds 0-2 ok): band exact 1, 0.75, 0 -> var 0.2917; Q (order): 1, 1, 1, 0 -> 0.25
    t = table.set_index(["of", "source"])
    assert t.loc[("exact", "init"), "var"] == pytest.approx(np.var([1, 0.75, 0], ddof=1))
    assert t.loc[("exact", "order"), "var"] == pytest.approx(0.25)
    assert res.as_json()["more"][0]["title"] == title
    # the text output gives each share with its interval as one percent cell
    text = "\n".join(aggregates_text(StudyAggregates([res], pd.DataFrame()), lambda t: t.to_string()))
    share = t.loc[("exact", "init")]
    assert f"{100 * share['share']:.0f}% [{100 * share['low']:.0f}, {100 * share['high']:.0f}]" in text
