"""What ``study --help`` tells a user who has not read the docs."""

from __future__ import annotations

import typer

from analysis.schema import VIEWS
from study.cli import app


def test_study_sql_help_names_every_view_a_query_can_read() -> None:
    # it named trials, runs, metrics, evals and predictions only, so a user reading the help
    # never learned of configs (where the README joins config columns from) or evaluations
    sql = typer.main.get_command(app).commands["sql"]  # type: ignore[attr-defined]
    query = next(p for p in sql.params if p.name == "query")
    help_text = query.help or ""
    missing = [v for v in VIEWS if v not in help_text]
    assert not missing, f"study sql --help does not name the views {missing}: {help_text!r}"
