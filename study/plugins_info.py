"""What ``study plugins`` lists: every registered task and model, its origin and fields."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from pydantic.fields import FieldInfo

from trainables.registry import MODELS, TASKS, Entry


@dataclass(frozen=True)
class Registered:
    """One row of ``study plugins``."""

    kind: str
    """``task`` or ``model``."""
    name: str
    data_kind: str
    source: str
    """``module.Class (how its plugin was loaded)``."""
    fields: str
    """``field=default`` for each config field (with ``--fields``, each with its doc)."""


def registered(with_docs: bool = False) -> list[Registered]:
    """Tasks, then models, by name."""
    rows: list[Registered] = []
    for kind, registry in (("task", TASKS), ("model", MODELS)):
        entries: list[Entry[type]] = registry.entries()  # type: ignore[assignment]
        for e in entries:
            cls = e.cls
            parts = [_field(n, f, with_docs) for n, f in cls.Config.model_fields.items()]  # type: ignore[attr-defined]
            sep = "\n  " if with_docs else ", "
            extra = ""
            if kind == "task":
                metrics = cls.declared_metrics().values()  # type: ignore[attr-defined]
                extra = "; metrics: " + ", ".join(m.name if m.share else f"{m.name} ({m.better} better)" for m in metrics)
            else:
                extra = f"; loss_reduction: {', '.join(cls.reductions)}"  # type: ignore[attr-defined]
            rows.append(Registered(
                kind, cls.name, cls.data_kind, e.source,  # type: ignore[attr-defined]
                ("  " if with_docs else "") + sep.join(parts) + extra,
            ))
    return rows


def _field(name: str, info: FieldInfo, with_docs: bool) -> str:
    text = f"{name}={info.default!r}" if not info.is_required() else f"{name} (required)"
    if with_docs and info.description:
        text += ": " + " ".join(info.description.split())
    return text


def fields_text(rows: list[Registered], width: int = 100) -> str:
    """``study plugins --fields`` for a terminal: a block per task or model (its line, then
    each field wrapped to ``width``), where a table's one cell per field list would be
    thousands of columns wide."""
    blocks = []
    for r in rows:
        lines = [f"{r.kind} {r.name} ({r.data_kind}): {r.source}"]
        tail = "; metrics: " if r.kind == "task" else "; loss_reduction: "
        fields, _, names = r.fields.rpartition(tail)
        for item in (x.strip() for x in [*fields.splitlines(), tail[2:] + names]):
            if item:
                lines += textwrap.wrap(item, width, initial_indent="  ", subsequent_indent="      ")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
