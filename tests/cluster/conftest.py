"""The cluster tests' shared pieces: ``raycluster`` importable, and a two-raylet cluster
(a head and one worker node, 1 CPU each) per test module."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from raycluster import Cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        c.ensure_workers(1)
        yield c
    finally:
        left = c.stop()
        assert not left, f"test cluster processes survived: {[(p.pid, p.cmd[:80]) for p in left]}"
        shutil.rmtree(c.root, ignore_errors=True)
