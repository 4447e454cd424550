"""Analysis of fineline results: DuckDB views, named queries, statistics and the report.

Reads only Parquet tables and study manifests under a results folder; never imports
``trainables``, ``study``, Ray or torch. Import-light: the public entry points below are
loaded on first use.

* :func:`analysis.db.connect`, :func:`analysis.db.run_sql`, :func:`analysis.db.list_studies`
* :func:`analysis.analyze.analyze` and :func:`analysis.report.write_report`
* :mod:`analysis.queries` (named SQL) and :mod:`analysis.stats` (pure statistics)
"""

from __future__ import annotations

from typing import Any

__all__ = ["AnalysisError", "analyze", "connect", "list_studies", "run_sql", "write_report"]

_LAZY = {
    "AnalysisError": "analysis.errors",
    "connect": "analysis.db",
    "run_sql": "analysis.db",
    "list_studies": "analysis.db",
    "analyze": "analysis.analyze",
    "write_report": "analysis.report",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")
