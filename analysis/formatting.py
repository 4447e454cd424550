"""Render result tables as aligned text, CSV or JSON: the one formatter behind every
``study`` command that prints a table (``ls``, ``status``, ``sql``, ``analyze``, ``plugins``).

:func:`format_rows` renders row dicts (or dataclasses), :func:`format_frame` a DataFrame
through the same code: ``table`` (aligned text, numbers right-aligned, a ``(N rows)``
footer), ``csv`` (written by :mod:`csv`, so a cell holding a comma, quote or newline is
quoted; lists and mappings as JSON text) or ``json`` (a list of row objects).

Import-light: neither numpy nor pandas is imported here (``study status`` and ``study ls``
must answer fast); a value of theirs can only exist once they are loaded, so the checks
look them up in :data:`sys.modules`.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import sys
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from typing import TYPE_CHECKING, Any, Literal

from analysis.errors import AnalysisError

if TYPE_CHECKING:
    import pandas as pd

Format = Literal["table", "csv", "json"]
FORMATS: tuple[str, ...] = ("table", "csv", "json")


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise AnalysisError(f"unknown output format {fmt!r}; use one of: {', '.join(FORMATS)}")


def _is_null(v: Any) -> bool:
    """``None``, or pandas' NA / NaT (only possible once pandas is imported)."""
    if v is None:
        return True
    pd_ = sys.modules.get("pandas")
    return pd_ is not None and (v is pd_.NA or v is pd_.NaT)


def _numpy_value(v: Any) -> Any:
    """A numpy scalar or array as the Python value (``v`` itself for anything else)."""
    np_ = sys.modules.get("numpy")
    if np_ is not None and isinstance(v, np_.ndarray | np_.generic):
        return v.tolist()
    return v


def _cell(v: Any) -> str:
    """One value as table text: floats to 6 significant digits, NULL as empty."""
    v = _numpy_value(v)
    if _is_null(v):
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        return f"{v:.6g}"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_cell(x) for x in v) + "]"
    return str(v)


def jsonable(v: Any) -> Any:
    """A value made JSON-safe: NaN/inf -> null, numpy scalars -> Python, times -> ISO text."""
    v = _numpy_value(v)
    if _is_null(v):
        return None
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [jsonable(x) for x in v]
    if isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, datetime | date):  # pandas' Timestamp is a datetime
        return v.isoformat()
    return v


def _csv_cell(v: Any) -> Any:
    """One value as a CSV field: NULL/NaN empty, lists and mappings as JSON, times ISO."""
    v = jsonable(v)
    if v is None:
        return ""
    if isinstance(v, dict | list):
        return json.dumps(v, sort_keys=True, default=str)
    return v


def as_row(item: Any) -> dict[str, Any]:
    """One printed row as a dict: a mapping, a dataclass instance, or an object with ``as_dict()``."""
    if isinstance(item, Mapping):
        return dict(item)
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        return {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}
    if callable(getattr(item, "as_dict", None)):
        return dict(item.as_dict())
    raise TypeError(f"cannot print {type(item).__name__} as a table row")


def _is_number(v: Any) -> bool:
    v = _numpy_value(v)
    return isinstance(v, int | float) and not isinstance(v, bool)


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """``df`` as JSON-safe row dicts (column order kept)."""
    cols = [str(c) for c in df.columns]
    return [
        {c: jsonable(v) for c, v in zip(cols, row, strict=True)}
        for row in df.itertuples(index=False, name=None)
    ]


def text_table(df: pd.DataFrame, *, max_rows: int | None = None, title: str | None = None) -> str:
    """A plain aligned text table: numbers right-aligned, text left-aligned.

    Shows at most ``max_rows`` rows (all when ``None``) and says how many were left out.
    """
    import pandas as pd

    numeric = [
        pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])
        for c in df.columns
    ]
    shown = df if max_rows is None else df.head(max_rows)
    rows = list(shown.itertuples(index=False, name=None))
    return _text_lines([str(c) for c in df.columns], rows, numeric, len(df), max_rows, title)


def _text_lines(
    header: list[str],
    rows: Sequence[Sequence[Any]],
    numeric: Sequence[bool],
    total: int,
    max_rows: int | None,
    title: str | None,
) -> str:
    """The aligned text of :func:`text_table` and :func:`format_rows` (``rows`` already cut)."""
    body = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if num else c.ljust(w)
            for c, w, num in zip(cells, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    lines = [title] if title else []
    if header:
        lines += [line(header), "  ".join("-" * w for w in widths)]
        lines += [line(r) for r in body]
    if max_rows is not None and total > max_rows:
        lines.append(f"... {total - max_rows} more rows (use --format csv or json for all)")
    lines.append(f"({total} row{'s' if total != 1 else ''})")
    return "\n".join(lines)


def csv_text(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """``rows`` under ``header`` as CSV written by :mod:`csv` (fields quoted where needed)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([_csv_cell(v) for v in row] for row in rows)
    return buf.getvalue().rstrip("\n")


def format_rows(
    items: Sequence[Any],
    fmt: str = "table",
    *,
    columns: Sequence[str] | None = None,
    max_rows: int | None = None,
    title: str | None = None,
) -> str:
    """Rows (mappings, dataclasses or objects with ``as_dict()``) as ``table``, ``csv`` or ``json``.

    ``columns``: the columns and their order (default: the first row's keys, then any new
    key of a later row); a row without a column prints it empty (``null`` in JSON). Table
    columns whose values are all numbers are right-aligned. Raises :class:`AnalysisError`
    for an unknown ``fmt``.
    """
    check_format(fmt)
    rows = [as_row(i) for i in items]
    cols = list(columns) if columns is not None else list(dict.fromkeys(k for r in rows for k in r))
    if fmt == "json":
        return json.dumps([{c: jsonable(r.get(c)) for c in cols} for r in rows], indent=1)
    cells = [[r.get(c) for c in cols] for r in rows]
    if fmt == "csv":
        return csv_text(cols, cells)
    numeric = [
        any(not _is_null(row[i]) for row in cells)
        and all(_is_null(row[i]) or _is_number(row[i]) for row in cells)
        for i in range(len(cols))
    ]
    shown = cells if max_rows is None else cells[:max_rows]
    return _text_lines(cols, shown, numeric, len(cells), max_rows, title)


def format_frame(df: pd.DataFrame, fmt: str = "table", *, max_rows: int | None = None) -> str:
    """``df`` as ``table`` (aligned text, at most ``max_rows`` rows), ``csv`` or ``json`` (records)."""
    check_format(fmt)
    if fmt == "csv":
        return csv_text([str(c) for c in df.columns], list(df.itertuples(index=False, name=None)))
    if fmt == "json":
        return json.dumps(records(df), indent=1)
    return text_table(df, max_rows=max_rows)
