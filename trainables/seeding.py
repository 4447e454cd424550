"""Seeding, in exactly one place.

A study has a root seed. Seed index ``i`` (0..N-1) derives one seed per *source*:

* ``init``    -> parameter initialisation
* ``order``   -> data order / batching
* ``dropout`` -> dropout masks (and any other training-time noise)
* ``data``    -> dataset generation

Derivation uses ``numpy.random.SeedSequence(root, spawn_key=(source, index))`` so it
is stable across machines, Python versions and bundling. A source not listed in
``vary`` is held fixed at its index-0 value (or at an explicitly pinned value), which
is how variance is attributed to one source. Growing a study from N to 2N seeds
reuses the first N because derivation depends only on (root, source, index).

Every random draw in fineline flows from a :class:`SeedSet` through the generator
factories below; nothing touches global RNG state.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal, get_args

import numpy as np
import torch

Source = Literal["init", "order", "dropout", "data"]
SOURCES: tuple[Source, ...] = get_args(Source)
_SOURCE_KEY = {"init": 1, "order": 2, "dropout": 3, "data": 4}


@dataclass(frozen=True)
class SeedSet:
    """All seeds one run (one seed index of a study) uses."""

    index: int
    """Seed index within the study (the ``seed`` column of every table)."""
    init_seed: int
    """Parameter initialisation."""
    order_seed: int
    """Data order and batching."""
    dropout_seed: int
    """Dropout masks."""
    data_seed: int
    """Dataset generation."""

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def derive_seed(root: int, source: Source, index: int) -> int:
    """The seed of ``source`` for seed index ``index`` under root seed ``root`` (63-bit)."""
    ss = np.random.SeedSequence(entropy=root, spawn_key=(_SOURCE_KEY[source], index))
    hi, lo = ss.generate_state(2, dtype=np.uint32)
    return int(((int(hi) << 32) | int(lo)) & 0x7FFF_FFFF_FFFF_FFFF)


def derive_seedset(
    root: int,
    index: int,
    vary: tuple[Source, ...] | list[Source] = ("init", "order", "dropout"),
    pinned: dict[str, int] | None = None,
) -> SeedSet:
    """Seeds for seed index ``index``.

    Sources in ``vary`` follow the index; the others use index 0, unless ``pinned``
    gives them an explicit value (pinning wins over varying).
    """
    pinned = pinned or {}
    values: dict[str, int] = {}
    for source in SOURCES:
        if source in pinned:
            values[source] = int(pinned[source])
        else:
            values[source] = derive_seed(root, source, index if source in vary else 0)
    return SeedSet(
        index=index,
        init_seed=values["init"],
        order_seed=values["order"],
        dropout_seed=values["dropout"],
        data_seed=values["data"],
    )


def torch_generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch generator seeded with ``seed`` on ``device``."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def numpy_rng(seed: int) -> np.random.Generator:
    """A numpy generator seeded with ``seed`` (PCG64)."""
    return np.random.default_rng(seed)
