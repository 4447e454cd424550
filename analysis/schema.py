"""The columns every results table is guaranteed to have, as analysis reads them.

The training side writes these tables (``OUT/tables/<table>/study=<NAME>/*.parquet``);
this is analysis' own copy of their documented columns, so it stays independent of
``trainables``. Files may carry more columns (e.g. flattened config columns such as
``train_lr`` in ``trials``, ``param_<name>`` and ``objective`` in tuning studies): the
views add them by name. A documented column missing from every file still exists in
the view, as NULLs, so queries and empty results folders behave the same.
"""

from __future__ import annotations

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")

TABLES: tuple[str, ...] = ("trials", "runs", "metrics", "evals", "predictions", "evaluations")
"""The six tables, in the order the views are created (``evaluations``: later evaluations of
kept weights, ``study eval``)."""

VIEWS: tuple[str, ...] = (*TABLES, "configs")
"""Every view a connection has: one per table, then ``configs`` (one row per config,
``trial_id``, derived from ``trials`` and ``runs``; no files of its own)."""

SEED_SOURCES: tuple[str, ...] = ("init_seed", "order_seed", "dropout_seed", "data_seed")
"""The ``runs`` columns naming each seed source."""

ROLE_ORDER: tuple[str, ...] = ("train", "val", "val_ood", "test")
"""Split roles in display order."""

SCHEMAS: dict[str, pa.Schema] = {
    "trials": pa.schema(
        [
            ("study", pa.string()),
            ("trial_id", pa.string()),
            ("unit_id", pa.string()),
            ("seeds", pa.list_(pa.int64())),  # the unit's committed seeds (files: see FILE_ONLY)
            ("task", pa.string()),
            ("model", pa.string()),
            ("config_hash", pa.string()),
            ("config_json", pa.string()),
            ("point_json", pa.string()),
            ("status", pa.string()),
            ("started_at", TS),
            ("ended_at", TS),
            ("node", pa.string()),
            ("hostname", pa.string()),
            ("git_sha", pa.string()),
            ("versions_json", pa.string()),
            ("bundle_size", pa.int64()),
            ("device", pa.string()),
            ("bundling", pa.string()),  # hand (a hand-bundled family), vmap, or loop (plain modules)
            ("kernels", pa.string()),  # c (compiled CPU kernels, trainables/models/ckernels.py) or torch
            ("kernel_flags", pa.string()),  # the kernels' compiler flags ("" for torch ops)
            ("dropout_masks", pa.string()),  # generator (a torch.Generator per member) or counter (execution.cuda_graphs)
            ("numerics", pa.string()),  # what decides float rounding besides the seeds: CPU, torch's code path, MKL_CBWR, threads (or GPU)
            ("train_s", pa.float64()),  # the unit's seconds in training steps (kept across a resume from its checkpoint)
            ("eval_s", pa.float64()),  # its seconds in evaluations during training (curves, selection)
            ("final_eval_s", pa.float64()),  # its seconds in the final evaluation of every split
        ]
    ),
    "runs": pa.schema(
        [
            ("study", pa.string()),
            ("trial_id", pa.string()),
            ("unit_id", pa.string()),
            ("seed", pa.int64()),
            ("init_seed", pa.int64()),
            ("order_seed", pa.int64()),
            ("dropout_seed", pa.int64()),
            ("data_seed", pa.int64()),
            ("selected_epoch", pa.int64()),
            ("selected_step", pa.int64()),
            ("status", pa.string()),
            ("node", pa.string()),
            ("wall_s", pa.float64()),
            ("committed_at", TS),
            ("weights", pa.string()),  # kept weights, a path relative to OUT (NULL: none kept)
            ("files", pa.string()),  # JSON: the files its commit wrote (table, path, rows, bytes, sha256)
            ("error", pa.string()),  # status failed (recorded by `study resume --skip-failed`): why; else NULL
        ]
    ),
    "metrics": pa.schema(
        [
            ("study", pa.string()),
            ("trial_id", pa.string()),
            ("seed", pa.int64()),
            ("epoch", pa.int64()),
            ("step", pa.int64()),
            ("split", pa.string()),
            ("role", pa.string()),
            ("metric", pa.string()),
            ("value", pa.float64()),
        ]
    ),
    "evals": pa.schema(
        [
            ("study", pa.string()),
            ("trial_id", pa.string()),
            ("seed", pa.int64()),
            ("split", pa.string()),
            ("role", pa.string()),
            ("metric", pa.string()),
            ("value", pa.float64()),
            ("eval_id", pa.string()),  # NULL: from training; else the evaluations row it belongs to
        ]
    ),
    "predictions": pa.schema(
        [
            ("study", pa.string()),
            ("trial_id", pa.string()),
            ("seed", pa.int64()),
            ("split", pa.string()),
            ("example_id", pa.int64()),
            ("input", pa.string()),
            ("target", pa.string()),
            ("prediction", pa.string()),
            ("correct", pa.bool_()),
            ("eval_id", pa.string()),
        ]
    ),
    "evaluations": pa.schema(
        [
            ("study", pa.string()),
            ("trial_id", pa.string()),
            ("seed", pa.int64()),
            ("split", pa.string()),
            ("role", pa.string()),
            ("eval_id", pa.string()),
            ("data_hash", pa.string()),  # hash of the split's data it evaluated
            ("n_examples", pa.int64()),
            ("weights", pa.string()),
            ("evaluated_at", TS),
            ("files", pa.string()),  # JSON: the evaluation's files, as in runs
        ]
    ),
}
"""Documented columns per table (the view's leading columns, in this order)."""

FILE_ONLY: dict[str, pa.Schema] = {"trials": pa.schema([("seed", pa.int64())])}
"""Columns of the files that their view replaces: a ``trials`` file holds the unit's row as
one seed's commit wrote it (``seed``); the view has one row per unit (``seeds``)."""


ROW_TABLES = ("metrics", "evals", "predictions")
"""The tables every commit (a seed's, or an evaluation's: evals and predictions) writes one
file of, named by the commit's stem: its runs (or evaluations) file's."""


def stem_key(stem: str) -> tuple[str, int] | None:
    """(trial_id, seed) of a commit's file stem ``<trial_id>-<seed>`` (an ``eval-<split>-``
    prefix allowed); None for any other name (``X-0 (1)``, a copy)."""
    head, _, seed = stem.rpartition("-")
    trial_id = head.rpartition("-")[2] if stem.startswith("eval-") else head
    if not trial_id or not seed.isdigit():
        return None
    return trial_id, int(seed)
