"""What the verdict speaks about: one metric on a few splits, the first of them the headline.

By default the primary metric on the test splits (the task's ``test_splits``, else every
``test`` split, else ``val_ood``). A task may declare its own (``analysis.verdict`` in the
manifest: ``{"metric"?: str, "splits"?: [spec]}``) and ``study analyze`` / ``study report``
take ``--verdict-metric`` and ``--verdict-split``. A split spec is a split's name, or a
*pooled* split ``NAME=A+B+...``: per run, the mean of the metric over splits A, B, ...
(e.g. a length task's band of test lengths, ``len_15..len_20=len_15+len_16+...+len_20``),
so the verdict can speak about exactly the value that defines the task's outcome.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from analysis.errors import AnalysisError


@dataclass(frozen=True)
class VerdictSplit:
    """A split the verdict speaks about: ``name``, the mean of the metric over ``parts`` per
    run (one part: the split itself)."""

    name: str
    parts: tuple[str, ...]

    @property
    def pooled(self) -> bool:
        return self.parts != (self.name,)


@dataclass(frozen=True)
class VerdictAxis:
    """The verdict's metric and splits (headline first); ``source`` says who chose them."""

    metric: str | None
    splits: tuple[VerdictSplit, ...]
    source: str = "default"
    caveat: str = ""
    """Set where no split spoken about is a test split (selection or tuning saw them)."""

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.splits]

    def pooled_text(self) -> list[str]:
        """One line per pooled split saying what it is, then the caveat, if any."""
        return [f"{s.name}: the per-run mean of {self.metric} over {', '.join(s.parts)}"
                for s in self.splits if s.pooled] + ([self.caveat] if self.caveat else [])  # fmt: skip


def parse_split(spec: str) -> VerdictSplit:
    """``"len_20"`` -> the split itself; ``"band=len_15+len_20"`` -> the pooled split
    ``band``, the mean over len_15 and len_20. Raises ValueError for an empty name or part."""
    name, eq, rest = (x.strip() for x in str(spec).partition("="))
    if not eq:
        if not name:
            raise ValueError("an empty split name")
        return VerdictSplit(name, (name,))
    parts = tuple(p.strip() for p in rest.split("+"))
    if not name or not parts or not all(parts):
        raise ValueError(
            f"{spec!r} is not NAME=SPLIT+SPLIT+... (a pooled split needs a name and its splits)"
        )
    if len(set(parts)) != len(parts):
        raise ValueError(f"{spec!r} names a split twice")
    return VerdictSplit(name, parts)


def default_splits(splits: Sequence[str], roles: dict[str, str], tests: Sequence[str]) -> list[str]:
    """The test splits, else val_ood, else the splits that are not training ones."""
    for chosen in (list(tests), [s for s in splits if roles.get(s) == "val_ood"]):
        if chosen:
            return chosen
    return [s for s in splits if roles.get(s) != "train"] or list(splits)


def check_axis(
    axis: VerdictAxis,
    metrics: set[str],
    splits: Sequence[str],
    fields: tuple[str, str] = ("--verdict-metric", "--verdict-split"),
) -> None:
    """Raise :class:`AnalysisError` naming the field (``fields``: metric's, splits') and what
    the study has when ``axis`` names a metric or a split it lacks, or a pooled split whose
    name is already a split's."""
    if axis.metric is not None and axis.metric not in metrics:
        raise AnalysisError(
            f"{fields[0]}: {axis.metric!r} is not a metric of this study (its metrics: "
            f"{', '.join(sorted(metrics))}); pick one of those"
        )
    names = axis.names
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise AnalysisError(f"{fields[1]}: {twice[0]!r} is named twice; name each verdict split once")
    for s in axis.splits:
        missing = [p for p in s.parts if p not in splits]
        if missing:
            raise AnalysisError(
                f"{fields[1]}: {', '.join(map(repr, missing))} is not a split of this study "
                f"(its splits: {', '.join(splits)}); name splits from that list"
            )
        if s.pooled and s.name in splits:
            raise AnalysisError(
                f"{fields[1]}: the pooled split {s.name!r} has the name of a split of this "
                "study; give it another name (NAME=A+B+...)"
            )


def resolve_axis(
    *,
    primary: str | None,
    splits: Sequence[str],
    roles: dict[str, str],
    tests: Sequence[str],
    metrics: set[str],
    declared_metric: str | None = None,
    declared_splits: Sequence[str] = (),
    metric: str | None = None,
    split_specs: Sequence[str] | None = None,
) -> tuple[VerdictAxis, list[str]]:
    """The verdict's axis: what the user asked for (``metric``, ``split_specs``; errors are
    raised), else what the task declared (a declaration the study cannot honour falls back
    to the default, with a note), else the primary metric on :func:`default_splits`.
    Returns (axis, notes)."""
    notes: list[str] = []
    known = list(splits)
    default = VerdictAxis(
        primary, tuple(VerdictSplit(s, (s,)) for s in default_splits(splits, roles, tests))
    )
    chosen = default
    if declared_metric is not None or declared_splits:
        try:
            parsed = tuple(parse_split(s) for s in declared_splits) or default.splits
            axis = VerdictAxis(declared_metric or primary, parsed, "declared by the task")
            check_axis(axis, metrics, known, ("verdict.metric", "verdict.splits"))
            chosen = axis
        except (ValueError, AnalysisError) as exc:
            notes.append(f"the task's declared verdict is not usable here ({exc}); the verdict "
                         "speaks about the primary metric on the test splits instead")  # fmt: skip
    if metric is not None or split_specs:
        try:
            parsed = tuple(parse_split(s) for s in split_specs or ())
        except ValueError as exc:
            raise AnalysisError(f"--verdict-split: {exc}; e.g. 'test' or 'band=len_15+len_20'") from exc
        axis = VerdictAxis(metric or chosen.metric, parsed or chosen.splits, "given")
        check_axis(axis, metrics, known)
        chosen = axis
    return _with_caveat(chosen, roles), notes


LOOKED_AT = {"val": "model selection looks at", "val_ood": "tuning may look at"}
"""The roles a run's training or tuning sees, and how."""


def _with_caveat(axis: VerdictAxis, roles: dict[str, str]) -> VerdictAxis:
    """``axis`` with its caveat where none of its splits is a test split."""
    used = [(p, roles.get(p, "")) for s in axis.splits for p in s.parts]
    if not used or any(role == "test" for _, role in used):
        return axis
    seen = [f"{p} is a {role} split, which {LOOKED_AT[role]}" for p, role in used if role in LOOKED_AT]
    if not seen:
        return axis
    return dataclasses.replace(axis, caveat=f"not a test result: {'; '.join(seen)}, so this is optimistic")


def pooled_values(values: pd.DataFrame, parts: Sequence[str], keys: Sequence[str]) -> pd.DataFrame:
    """Per run (one row per distinct ``keys``), the mean ``value`` over the ``parts`` splits.

    ``values``: one row per (run, split) of one metric, columns ``keys``, split, value. A run
    needs a finite value on every part (else it is left out). Returns columns ``keys`` and
    value, one row per run in order of first appearance."""
    v = values[values["split"].isin(list(parts))].dropna(subset=["value"])
    per_run = v.groupby(list(keys), dropna=False, sort=False)
    out = per_run.agg(value=("value", "mean"), n=("split", "nunique"))
    return out[out["n"] == len(set(parts))].drop(columns="n").reset_index()


def axis_values(evals: pd.DataFrame, axis: VerdictAxis) -> pd.DataFrame:
    """The rows of ``evals`` (one per run, split and metric; any status) for ``axis.metric``
    on each of the axis's splits: a split's own rows, and per pooled split one row per run
    with a finite value on every part, ``value`` the mean of its parts
    (:func:`pooled_values`) and ``split``/``role`` the pooled name / the first part's role. Columns: those of ``evals``; rows in the axis's split order.
    """
    e = evals[evals["metric"] == axis.metric]
    parts = []
    for s in axis.splits:
        sub = e[e["split"].isin(s.parts)]
        if not s.pooled:
            parts.append(sub)
            continue
        pooled = pooled_values(sub, s.parts, [c for c in sub.columns if c not in ("split", "role", "value")])
        role = sub.loc[sub["split"] == s.parts[0], "role"]
        pooled = pooled.assign(split=s.name, role=role.iloc[0] if len(role) else None)
        parts.append(pooled[list(evals.columns)])
    if not parts:
        return evals.iloc[0:0]
    return pd.concat(parts, ignore_index=True)
