"""The analysis package stays light: no torch, Ray, trainables or study, and a lazy top level."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.errors import AnalysisError
from analysis.manifest import parse_declarations, parse_manifest

FORBIDDEN = ("torch", "ray", "trainables", "study")


PROBE = """
import json, sys
top = lambda: sorted({m.split(".")[0] for m in sys.modules})
import analysis
light = top()
import analysis.analyze, analysis.charts, analysis.db, analysis.demo
import analysis.queries, analysis.report, analysis.stats
print(json.dumps([light, top()]))
"""


def test_imports_stay_light_and_never_reach_torch_ray_or_the_training_side() -> None:
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, cwd=root
    )
    light, full = (set(x) for x in json.loads(result.stdout.strip().splitlines()[-1]))
    assert not light & {"duckdb", "pandas", "altair", "scipy", "pyarrow", *FORBIDDEN}
    assert {"duckdb", "altair", "scipy"} <= full  # the probe did import everything
    assert not full & set(FORBIDDEN), full & set(FORBIDDEN)


def test_lazy_attributes() -> None:
    import analysis

    assert callable(analysis.run_sql) and callable(analysis.write_report)
    with pytest.raises(AttributeError):
        _ = analysis.nothing_here


def test_declarations_in_list_form_and_unknown_keys() -> None:
    d = parse_declarations(
        {
            "charts": [
                {"type": "histogram", "split": "very_long", "metric": "fpf"},
                {"type": "regression", "x": {"split": "val", "metric": "loss"},
                 "y": ["very_long", "fpf"], "over": "checkpoints"},
                {"type": "curve"},
                {"type": "heatmap"},
            ],
            "test_splits": ["short", "long"],
            "decision_boundary": {"grid": [-1, 1, 41], "id": "i2 * n + i1"},
            "primary_metric": "fpf",
        }
    )  # fmt: skip
    assert [(h.split, h.metric) for h in d.histograms] == [("very_long", "fpf")]
    (r,) = d.regressions
    assert (r.x.split, r.y.split, r.over) == ("val", "very_long", "checkpoints")
    assert d.test_splits == ("short", "long") and d.primary_metric == "fpf"
    assert set(d.unknown) == {
        "charts[3] (heatmap)",
        "decision_boundary.id (i2 * n + i1: only 'i1 * n + i2' is understood)",
    }
    assert d.decision_boundary is None
    with pytest.raises(AnalysisError, match="is not 'runs' or 'checkpoints'"):
        parse_declarations({"regressions": [{"x": ["a", "b"], "y": ["c", "d"], "over": "epochs"}]})


def test_manifest_tolerates_missing_keys() -> None:
    m = parse_manifest({"name": "x"})
    assert (m.kind, m.task, m.planned, m.splits, m.declarations.scatter) == (
        "seeds",
        None,
        None,
        (),
        None,
    )
    m = parse_manifest(
        {
            "name": "x",
            "seeds": 10,
            "points": [{"trial_id": "a", "point": {}}, {"trial_id": "b", "seeds": 3}],
        }
    )
    assert m.planned == 13
