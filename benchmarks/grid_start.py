"""Driver time before a large grid's first trial: how Tune is handed the units' indices.

A seed study gives Tune one trial per unit (a grid point x a bundle of seeds), each trial
knowing only its ``unit_index``. Handing Tune ``tune.grid_search(range(n))`` made its
variant generator deep-copy the whole n-element grid for every trial it created: quadratic,
about 5 s of the driver for 5,000 units and 20 s for 10,000 (the grid cap) before any
trial could start. ``study.runner.unit_counter`` hands out the same indices through
``tune.sample_from`` with ``num_samples=n``: linear.

This script generates every trial's config both ways with Tune's own variant generator
(``ray.tune.search.variant_generator.generate_variants``, what ``BasicVariantGenerator``
calls; no Ray cluster is started), checks both give 0 .. n-1 in order, and prints the time
of each and their ratio, side by side in one run, for n = 500, 2,000, 5,000 and 10,000.

    python3 benchmarks/grid_start.py
"""

from __future__ import annotations

import argparse
import time

from ray import tune
from ray.tune.search.variant_generator import generate_variants

from study.runner import unit_counter


def grid_indices(n: int) -> list[int]:
    """Every trial's index as ``tune.grid_search(range(n))`` resolves them (the old way)."""
    spec = {"config": {"unit_index": tune.grid_search(list(range(n)))}}
    return [resolved["config"]["unit_index"] for _, resolved in generate_variants(spec)]


def counter_indices(n: int) -> list[int]:
    """Every trial's index as ``tune.sample_from(unit_counter())`` with ``num_samples=n``
    resolves them (one variant generated per sample, as BasicVariantGenerator does)."""
    spec = {"config": {"unit_index": tune.sample_from(unit_counter())}}
    return [resolved["config"]["unit_index"] for _ in range(n) for _, resolved in generate_variants(spec)]


def timed(fn: object, n: int) -> tuple[float, list[int]]:
    t0 = time.perf_counter()
    out = fn(n)  # type: ignore[operator]
    return time.perf_counter() - t0, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--units", type=int, nargs="+", default=[500, 2000, 5000, 10000], help="grid sizes")
    args = parser.parse_args()
    print(f"{'units':>6}  {'grid_search':>12}  {'sample_from':>12}  {'ratio':>6}")
    for n in args.units:
        old_s, old = timed(grid_indices, n)
        new_s, new = timed(counter_indices, n)
        if old != list(range(n)) or new != list(range(n)):
            raise SystemExit(f"indices differ from 0..{n - 1}")  # e.g. a counter copied per trial
        print(f"{n:>6}  {old_s:>11.2f}s  {new_s:>11.2f}s  {old_s / new_s:>5.0f}x")


if __name__ == "__main__":
    main()
