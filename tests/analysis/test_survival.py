"""analysis.survival on tiny tables worked out by hand (censored and uncensored)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from analysis import survival as sv
from analysis.errors import AnalysisError
from analysis.seed_questions import event_sources


def test_parse_event_forms_and_errors() -> None:
    e = sv.parse_event("val accuracy >= 0.5")
    assert (e.split, e.metric, e.op, e.threshold, e.name) == ("val", "accuracy", ">=", 0.5, "")
    e = sv.parse_event(" learns: val_ood accuracy>0.25 ")
    assert (e.name, e.split, e.metric, e.op, e.threshold) == (
        "learns",
        "val_ood",
        "accuracy",
        ">",
        0.25,
    )
    assert e.label == "learns: val_ood accuracy > 0.25"
    assert sv.parse_event("train loss < 1e-2").threshold == 0.01
    for bad in ("val accuracy = 0.5", "val accuracy >= x", "accuracy >= 0.5", "", "val acc >= inf"):
        with pytest.raises(AnalysisError, match="--event") as err:
            sv.parse_event(bad)
        assert "SPLIT METRIC OP THRESHOLD" in str(err.value)
    d = sv.event_from_declaration({"name": "groks", "split": "test", "metric": "accuracy",
                                   "op": ">=", "threshold": 0.9}, "events[0]")  # fmt: skip
    assert d.label == "groks: test accuracy >= 0.9"
    with pytest.raises(AnalysisError, match=r"events\[1\].*analysis\(\) declaration"):
        sv.event_from_declaration({"split": "val", "metric": "accuracy", "op": "=="}, "events[1]")


def test_reached_never_counts_nan() -> None:
    e = sv.Event("val", "loss", "<=", 1.0)
    assert e.reached([0.5, 1.0, 2.0, np.nan]).tolist() == [True, True, False, False]


def _greenwood_loglog(s: float, terms: list[tuple[int, int]], z: float) -> tuple[float, float]:
    """The log-log band at S = s from the (n at risk, d events) of every event time so far."""
    v = sum(d / (n * (n - d)) for n, d in terms) / math.log(s) ** 2
    return s ** math.exp(z * math.sqrt(v)), s ** math.exp(-z * math.sqrt(v))


def test_kaplan_meier_by_hand() -> None:
    # events at 2, 3, 3, 5; censored at 4 and 6 (6 runs)
    km = sv.kaplan_meier([2, 3, 3, 5, 4, 6], [1, 1, 1, 1, 0, 0])
    assert km["time"].tolist() == [2, 3, 4, 5, 6]
    assert km["at_risk"].tolist() == [6, 5, 3, 2, 1]
    assert km["events"].tolist() == [1, 2, 0, 1, 0]
    assert km["censored"].tolist() == [0, 0, 1, 0, 1]
    # S(2) = 5/6; S(3) = 5/6 * 3/5 = 1/2; S(4) = 1/2; S(5) = 1/2 * 1/2 = 1/4; S(6) = 1/4
    assert km["survival"].tolist() == pytest.approx([5 / 6, 1 / 2, 1 / 2, 1 / 4, 1 / 4])
    z = sps.norm.ppf(0.975)
    lo2, hi2 = _greenwood_loglog(5 / 6, [(6, 1)], z)
    lo5, hi5 = _greenwood_loglog(1 / 4, [(6, 1), (5, 2), (2, 1)], z)
    assert (km["low"][0], km["high"][0]) == pytest.approx((lo2, hi2), rel=1e-9)
    assert (km["low"][3], km["high"][3]) == pytest.approx((lo5, hi5), rel=1e-9)
    # median: first S <= 0.5 -> 3; the lower band is under 0.5 from 2 on (0.27); the upper
    # band never gets there (0.97, 0.80, 0.80, 0.65, 0.65): no upper limit
    assert km["low"][0] < 0.5 and (km["high"] > 0.5).all()
    assert sv.median_time(km) == (3.0, 2.0, None)
    assert sv.reached_by(km, 1) == (0.0, 0.0, 0.0)
    r, lo, hi = sv.reached_by(km, 5.5)
    assert r == pytest.approx(0.75) and (lo, hi) == pytest.approx((1 - hi5, 1 - lo5))


def test_kaplan_meier_without_censoring_is_one_minus_the_ecdf() -> None:
    t = [1, 2, 2, 4]
    km = sv.kaplan_meier(t, [True] * 4)
    assert km["survival"].tolist() == pytest.approx([3 / 4, 1 / 4, 0.0])
    assert sv.median_time(km)[0] == 2.0
    # at S = 0 the log-log band is undefined: 0 below; above, the exact upper bound of 0
    # survivors of 4 runs (uncensored: 1 at risk / S(t-) = 1/4): 1 - 0.025 ** (1/4) = 0.6024
    assert km["low"].iloc[-1] == 0.0
    assert km["high"].iloc[-1] == pytest.approx(1 - 0.025**0.25)
    # all 12 runs reached by 3: as 12 of 12 successes, at least 73.5% (Clopper-Pearson)
    km = sv.kaplan_meier([2, 2, *[3] * 10], [True] * 12)
    assert 1 - km["high"].iloc[-1] == pytest.approx(
        sps.binomtest(12, 12).proportion_ci(method="exact").low
    )
    assert sv.median_time(km) == (3.0, 2.0, 3.0)


def test_all_censored_has_no_median_and_reaches_nothing_within_an_exact_bound() -> None:
    km = sv.kaplan_meier([3, 5], [False, False])
    assert km["survival"].tolist() == [1.0, 1.0] and km["high"].tolist() == [1.0, 1.0]
    # no event among 2 runs followed to 3, among 1 followed to 5: S >= 0.025 ** (1 / n)
    assert km["low"].tolist() == pytest.approx([0.025**0.5, 0.025])
    assert sv.median_time(km)[0] is None and sv.median_time(km)[2] is None
    # 2 runs: the lower curve is <= 0.5 from the start (0.025 ** (1 / 2) = 0.16), so no time
    # bounds the median from below (it read 3, the first logged time: "at least 3")
    assert sv.median_time(km)[1] == 0.0
    # 6 runs censored at 6: 0.025 ** (1 / 6) = 0.54 > 0.5, no lower bound within the table
    assert sv.median_time(sv.kaplan_meier([6] * 6, [False] * 6)) == (None, None, None)
    # 4 runs censored at 6: 0.025 ** (1 / 4) = 0.40, the median could be at any time
    assert sv.median_time(sv.kaplan_meier([6] * 4, [False] * 4)) == (None, 0.0, None)
    # 20 runs censored at the budget without the event (L^MS-7 at width 100): 0 of 20
    # reached it, at most 16.8% would (Clopper-Pearson), not [0, 0]
    r, lo, hi = sv.reached_by(sv.kaplan_meier([40000] * 20, [False] * 20), 40000)
    exact = sps.binomtest(0, 20).proportion_ci(method="exact")
    assert (r, lo) == (0.0, 0.0) and hi == pytest.approx(exact.high)
    # before the first event of a curve with events the same bound holds
    km = sv.kaplan_meier([1, 4, 4, 4], [False, True, True, True])
    assert km["low"].iloc[0] == pytest.approx(0.025**0.25) and km["high"].iloc[0] == 1.0


def test_cumulative_incidence_by_hand() -> None:
    # (time, code): (1, event) (2, diverged) (3, event) (3, censored) (4, event)
    cif = sv.cumulative_incidence([1, 2, 3, 3, 4], [1, 2, 1, 0, 1])
    # t=1: n=5, F1 = 1/5, S = 4/5; t=2: n=4, F2 = 4/5 * 1/4 = 1/5, S = 3/5
    # t=3: n=3, F1 = 1/5 + 3/5 * 1/3 = 2/5, S = 2/5; t=4: n=1, F1 = 2/5 + 2/5 = 4/5
    assert cif["at_risk"].tolist() == [5, 4, 3, 1]
    assert cif["cif_event"].tolist() == pytest.approx([0.2, 0.2, 0.4, 0.8])
    assert cif["cif_competing"].tolist() == pytest.approx([0.0, 0.2, 0.2, 0.2])
    # without a competing outcome it is 1 - KM
    km = sv.kaplan_meier([2, 3, 3, 5, 4, 6], [1, 1, 1, 1, 0, 0])
    plain = sv.cumulative_incidence([2, 3, 3, 5, 4, 6], [1, 1, 1, 1, 0, 0])
    assert plain["cif_event"].tolist() == pytest.approx((1 - km["survival"]).tolist())


def _runs() -> tuple[pd.DataFrame, pd.DataFrame]:
    curve = {  # seed -> values at epochs 1, 2, ...
        0: [0.0, 0.3, 0.6, 0.9],  # event at 3
        1: [0.0, 0.0, 0.0, 0.0],  # never, ran to its budget 4: censored (budget)
        2: [0.0, 0.2],  # never, stopped at 2 with early stopping: informative censoring
        3: [0.1, np.nan],  # diverged at 2 before the event: competing
        4: [0.7],  # diverged later, but reached the event first: an event at 1
        6: [0.1, 0.2],  # unknown budget (the trial's longest run: 4), no early stop: stopped
    }
    curves = pd.DataFrame(
        [("t", s, e + 1, v) for s, vals in curve.items() for e, v in enumerate(vals)],
        columns=["trial_id", "seed", "time", "value"],
    )
    runs = pd.DataFrame({
        "point": "a", "trial_id": "t", "seed": [0, 1, 2, 3, 4, 5, 6],
        "status": ["ok", "not_learned", "ok", "diverged", "diverged", "ok", None],
        "budget": [4, 4, 4, 4, 4, 4, np.nan],
        "early_stop": [True, True, True, True, True, True, False],
    })  # fmt: skip
    return curves, runs


def test_run_outcomes_by_kind() -> None:
    curves, runs = _runs()
    out = sv.run_outcomes(curves, runs, sv.parse_event("val accuracy >= 0.5"))
    got = {r.seed: (r.outcome, r.time) for r in out.itertuples()}
    assert got == {
        0: ("event", 3),
        1: ("budget", 4),
        2: ("early_stop", 2),
        3: ("diverged", 2),
        4: ("event", 1),
        6: ("stopped", 2),
    }  # fmt: skip  (seed 5: no curve, left out)
    assert out.set_index("seed").loc[6, "budget"] == 4


def test_event_summary_by_hand() -> None:
    curves, runs = _runs()
    out = sv.run_outcomes(curves, runs, sv.parse_event("val accuracy >= 0.5"))
    summary, km = sv.event_summary(out)
    s = summary.iloc[0]
    assert (s["runs"], s["events"], s["censored_budget"], s["censored_early_stop"],
            s["censored_other"], s["diverged"]) == (6, 2, 1, 1, 1, 1)  # fmt: skip
    # KM without the diverged run: 1 (event), 2 (censored x2), 3 (event), 4 (censored)
    # S(1) = 4/5, S(3) = 4/5 * 1/2 = 2/5: median 3, reached by the budget 4: 3/5
    assert km["survival"].tolist() == pytest.approx([0.8, 0.8, 0.4, 0.4])
    assert s["median"] == 3 and s["reached"] == pytest.approx(0.6)
    # Aalen-Johansen over all six: F1(1) = 1/6, S = 5/6; t=2: n=5, one divergence, S = 2/3;
    # t=3: n=2, F1 = 1/6 + 2/3 * 1/2 = 1/2
    assert s["reached_all"] == pytest.approx(0.5)
    assert km["reached_all"].tolist() == pytest.approx([1 / 6, 1 / 6, 0.5, 0.5])
    assert s["warn"] == "n<10"


def test_restricted_times_and_their_seed_sources_by_hand() -> None:
    # config i varies the init seed on one data split; config d the data seed with one init
    outcomes = pd.DataFrame(
        [("i", "i", s, "ok", t, 3000.0, 3000.0, "event") for s, t in enumerate([100.0, 200.0, 300.0, 400.0])]
        + [("d", "d", s, "ok", 100.0, 3000.0, 3000.0, "event") for s in range(3)]
        + [("d", "d", 3, "ok", 3000.0, 3000.0, 3000.0, "budget"), ("d", "d", 4, "diverged", 50.0, 50.0, 3000.0, "diverged")],
        columns=list(sv.OUTCOME_COLUMNS),
    )  # fmt: skip
    r = sv.restricted_times(outcomes)
    assert len(r) == 8  # the diverged run is a competing outcome, left out
    assert r.loc[r["trial_id"] == "d", ["time", "reached"]].values.tolist() == [[100, 1], [100, 1], [100, 1], [3000, 0]]
    runs = pd.DataFrame({"trial_id": ["i"] * 4 + ["d"] * 5, "seed": [0, 1, 2, 3, 0, 1, 2, 3, 4],
                         "init_seed": [10, 11, 12, 13, 9, 9, 9, 9, 9], "order_seed": 1, "dropout_seed": 2,
                         "data_seed": [5, 5, 5, 5, 20, 21, 22, 23, 24]})  # fmt: skip
    src = event_sources(outcomes, runs, n_boot=500).set_index(["of", "source"])
    # time: var_init = var(100..400) = 16,666.7; var_data = var(100, 100, 100, 3000) = 2,102,500
    v_init, v_data = np.var([100, 200, 300, 400], ddof=1), np.var([100, 100, 100, 3000], ddof=1)
    assert src.loc[("time", "init"), "var"] == pytest.approx(v_init)
    assert src.loc[("time", "init"), "share"] == pytest.approx(v_init / (v_init + v_data))
    # whether: every init seed reached it (variance 0), one of four split seeds did not (0.25)
    assert (src.loc[("reached", "init"), "share"], src.loc[("reached", "data"), "share"]) == (0.0, 1.0)
    assert (src["low"] <= src["share"] + 1e-12).all() and (src["share"] <= src["high"] + 1e-12).all()
    # no seed variance (every run reached it at step 100): nothing to split
    same = outcomes.assign(time=100.0, outcome="event")
    assert event_sources(same[same["outcome"] != "diverged"], runs).empty
    # one source varied alone: nothing to split
    assert event_sources(outcomes[outcomes["trial_id"] == "i"], runs).empty


def test_the_documented_after_form_is_grokkings_declared_event() -> None:
    # docs/analysis.md gives the form with its precondition; it must read as the task declares it
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "analysis.md").read_text()
    text = re.search(r'--event "(groks: [^"]*)"', " ".join(doc.split()))
    assert text, "docs/analysis.md gives no --event example with 'after'"
    from trainables.tasks.modular import ModularArithmetic, ModularConfig

    declared = ModularArithmetic(ModularConfig()).analysis()["events"][1]
    assert sv.parse_event(text.group(1)) == sv.event_from_declaration(declared, "events[1]")
