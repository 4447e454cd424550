"""The two sides of the Parquet boundary agree on the table schemas.

``analysis`` keeps its own copy of the documented columns (it never imports
``trainables``); this test is the one place that reads both, so the copies cannot drift.
"""

from __future__ import annotations

import pytest

from analysis import schema as read_side
from trainables import results as write_side


@pytest.mark.parametrize("table", sorted(write_side.SCHEMAS))
def test_every_column_analysis_expects_is_written_with_its_type(table: str) -> None:
    written = write_side.SCHEMAS[table]
    expected = read_side.SCHEMAS[table]
    for field in expected:
        assert field.name in written.names, f"{table}.{field.name} is read but never written"
        assert written.field(field.name).type == field.type, f"{table}.{field.name} type differs"


def test_both_sides_know_the_same_tables() -> None:
    assert set(read_side.TABLES) == set(write_side.TABLES)
