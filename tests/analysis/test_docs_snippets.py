"""The code that docs/analysis.md gives for reading results outside fineline runs, and
keeps only committed rows (as the DuckDB views do)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from analysis.db import connect
from analysis.demo import write_demo_study

DOC = Path(__file__).resolve().parents[2] / "docs" / "analysis.md"


def python_block_after(marker: str) -> str:
    text = DOC.read_text()
    start = text.index(marker)
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert match, f"no python block after {marker!r}"
    return match.group(1)


def test_the_pandas_snippet_reads_the_committed_rows(tmp_path: Path) -> None:
    out = tmp_path / "results"
    write_demo_study(out, "a", n_seeds=3, seed=1)
    write_demo_study(out, "b", n_seeds=2, seed=2)
    (out / "tables" / "runs" / "study=a" / "a-t00-1.parquet").unlink()  # seed 1 of 'a': not committed
    code = python_block_after("**pandas**").replace('"results/', f'"{out}/')
    scope: dict[str, object] = {}
    exec(code, scope)
    committed = scope["committed"]
    assert isinstance(committed, pd.DataFrame)
    expected = connect(out).sql("SELECT study, count(*) FROM evals GROUP BY study ORDER BY study").fetchall()
    got = committed.groupby("study", observed=True).size()
    assert [(s, int(n)) for s, n in got.items()] == expected
    assert 1 not in set(committed.loc[committed["study"] == "a", "seed"])
    assert len(committed) < len(scope["evals"])  # the uncommitted seed's rows were there to drop


def test_the_documented_json_of_analyze_has_its_keys(tmp_path: Path) -> None:
    """docs/analysis.md's ``study analyze --format json`` schema: its top-level keys and the
    ``study`` object's, against a real document."""
    import json

    from analysis.analyze import analyze

    text = DOC.read_text()
    block = text[text.index("## `study analyze NAME --format json`"):]
    block = block[block.index("```text"):block.index("```", block.index("```text") + 3)]
    top = re.findall(r'^  "(\w+)":', block, re.M)
    study_keys = re.search(r'^  "study": \{([^}]*)\}', block, re.M)
    assert study_keys, "no study object in the documented schema"
    out = tmp_path / "results"
    write_demo_study(out, "a", n_seeds=4, seed=1)
    doc = json.loads(analyze(out, "a", "json", n_boot=50))
    assert top == list(doc), "top-level keys (in order)"
    assert [k.strip() for k in study_keys.group(1).split(",")] == list(doc["study"])
