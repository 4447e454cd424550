"""Render result tables as aligned text, CSV or JSON (what ``study sql``/``analyze`` print)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import date, datetime
from typing import Any, Literal

import numpy as np
import pandas as pd

from analysis.errors import AnalysisError

Format = Literal["table", "csv", "json"]
FORMATS: tuple[str, ...] = ("table", "csv", "json")


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise AnalysisError(f"unknown output format {fmt!r}; use one of: {', '.join(FORMATS)}")


def _cell(v: Any) -> str:
    """One value as table text: floats to 6 significant digits, NULL as empty."""
    if v is None or v is pd.NA or v is pd.NaT:
        return ""
    if isinstance(v, float | np.floating):
        if math.isnan(v):
            return ""
        return f"{v:.6g}"
    if isinstance(v, np.ndarray):
        return "[" + ", ".join(_cell(x) for x in v.tolist()) + "]"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_cell(x) for x in v) + "]"
    return str(v)


def jsonable(v: Any) -> Any:
    """A value made JSON-safe: NaN/inf -> null, numpy scalars -> Python, times -> ISO text."""
    if v is None or v is pd.NaT or v is pd.NA:
        return None
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        return [jsonable(x) for x in v.tolist()]
    if isinstance(v, np.bool_ | bool):
        return bool(v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, float | np.floating):
        f = float(v)
        return f if math.isfinite(f) else None
    if isinstance(v, datetime | date | pd.Timestamp):
        return v.isoformat()
    return v


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
    shown = df if max_rows is None else df.head(max_rows)
    header = [str(c) for c in df.columns]
    body = [[_cell(v) for v in row] for row in shown.itertuples(index=False, name=None)]
    numeric = [
        pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])
        for c in df.columns
    ]
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if num else c.ljust(w)
            for c, w, num in zip(cells, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    lines = [title] if title else []
    lines += [line(header), "  ".join("-" * w for w in widths)]
    lines += [line(r) for r in body]
    if max_rows is not None and len(df) > max_rows:
        lines.append(f"... {len(df) - max_rows} more rows (use --format csv or json for all)")
    lines.append(f"({len(df)} row{'s' if len(df) != 1 else ''})")
    return "\n".join(lines)


def format_frame(df: pd.DataFrame, fmt: str = "table", *, max_rows: int | None = None) -> str:
    """``df`` as ``table`` (aligned text, at most ``max_rows`` rows), ``csv`` or ``json`` (records)."""
    check_format(fmt)
    if fmt == "csv":
        return str(df.to_csv(index=False)).rstrip("\n")
    if fmt == "json":
        return json.dumps(records(df), indent=1)
    return text_table(df, max_rows=max_rows)
