"""Smoke runs of the side-by-side benchmarks at tiny sizes: they run end to end through the
real study path and print their ratio last. Their timings are printed, never asserted."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests_support import TINY_STUDY

ROOT = Path(__file__).resolve().parents[1]
RATIO = re.compile(r"speedup = .*?([0-9]+\.[0-9]+)x$")


def _run(*args: str, tmp: Path | None = None) -> list[str]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT)}
    if tmp is not None:  # the script's temp dir (not for Ray: its socket paths must stay short)
        env["TMPDIR"] = str(tmp)
    res = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env
    )
    assert res.returncode == 0, res.stderr[-4000:]
    return [line for line in res.stdout.splitlines() if line.strip()]


@pytest.mark.slow  # ~20 s: a benchmark; the direct-mode smoke test stays in the default run
def test_seed_study_benchmark_prints_both_runs_and_the_speedup_last() -> None:
    lines = _run("benchmarks/seed_study.py", "--tiny", "--seeds", "2", "--cpus", "2")
    assert lines[-3].startswith("(a) baseline") and lines[-2].startswith("(b) fastest")
    match = RATIO.search(lines[-1])
    assert match and float(match.group(1)) > 0


def test_seed_study_direct_mode_trains_one_bundle_without_ray(tmp_path: Path) -> None:
    lines = _run("benchmarks/seed_study.py", "--tiny", "--seeds", "3", "--direct", "cpu", "--epochs", "2",
                 tmp=tmp_path)
    assert not list(tmp_path.glob("fineline-bench-*"))  # no results folder left behind
    assert "one bundle of 3 seeds on cpu" in lines[-1]
    summary = [line.split() for line in lines if line.split()[:1] in (["standard"], ["long"])]
    assert len(summary) == 2 and all(row[1] == "3" for row in summary)  # seeds column


@pytest.mark.slow  # ~20 s: a benchmark
def test_dyck_benchmark_prints_the_speedup_last() -> None:
    lines = _run("benchmarks/dyck_study.py", "--seeds", "2", "--train", "20", "--epochs", "1", "--cpus", "2")
    match = RATIO.search(lines[-1])
    assert match and float(match.group(1)) > 0


@pytest.mark.slow  # ~40 s: a benchmark
def test_tune_benchmark_prints_both_ratios_the_dyck_one_last() -> None:
    lines = _run("benchmarks/tune_study.py", "--tiny", "--cpus", "2")
    assert lines[-2].startswith("symbol_rewriting: speedup") and lines[-1].startswith("dyck1: speedup")
    assert all((m := RATIO.search(line)) and float(m.group(1)) > 0 for line in lines[-2:])


def test_transformer_benchmark_takes_a_study_config() -> None:
    lines = _run("benchmarks/transformer_bundle.py", "--config", "configs/zhou2023_length_cpu.yaml",
                 "--set", "grid.task.kind=[sort]", "--set", "task.train_size=64", "--k", "2", "--steps", "2",
                 "--repeats", "1")  # fmt: skip
    assert "task length_gen, batch=64 steps=2" in lines[0] and "grid.task.kind=[sort]" in lines[0]
    assert [line.split()[0] for line in lines[1:4]] == ["(a)", "(b)", "(c)"]
    match = RATIO.search(lines[-1])
    assert match and float(match.group(1)) > 0


def test_gpu_bundle_benchmark_runs_its_three_ways_on_the_cpu() -> None:
    """On a CPU no graph is captured ((c) is (b)'s counter masks, eagerly): the script still
    runs every variant, (b) and (c) end bit-identical, and it prints the ratio last."""
    lines = _run("benchmarks/gpu_bundle.py", "--device", "cpu", "--k", "2", "--steps", "3", "--warm", "2",
                 "--eval", "40", "--train-size", "400")
    assert [line[:3] for line in lines[:3]] == ["(a)", "(b)", "(c)"]
    assert lines[3].endswith("largest parameter difference 0")
    assert lines[-1].startswith("training steps (a)/(c) = ") and "K=2, cpu" in lines[-1]


@pytest.mark.slow  # ~20 s: four training processes
def test_numerics_benchmark_prints_each_setting_and_what_changed_its_bits(tmp_path: Path) -> None:
    """Each setting reaches its process (its numerics say so), the unpinned default agrees
    with itself, and the portable kernels change no bit of the row above (the C kernels'
    arithmetic is the same at every vector width, fmath.h)."""
    raw = {**TINY_STUDY, "model": {**TINY_STUDY["model"], "emb_size": 12, "hidden_size": 20}}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(raw))
    lines = _run("-m", "benchmarks.numerics", "--config", str(tmp_path / "tiny.yaml"), "--rounds", "1")
    rows = {line.split("  ")[0]: line for line in lines[-4:]}
    assert list(rows) == ["default", "MKL_CBWR=COMPATIBLE", "+ ATEN_CPU_CAPABILITY=default",
                          "+ FINELINE_PORTABLE_KERNELS=1"]  # fmt: skip
    assert rows["default"].split()[-3:] == ["yes", "yes", "1.00x"]
    assert "torch DEFAULT" in rows["+ ATEN_CPU_CAPABILITY=default"]
    assert rows["+ FINELINE_PORTABLE_KERNELS=1"].split()[-2] == "yes"  # = the row above
    assert float(rows["+ FINELINE_PORTABLE_KERNELS=1"].split()[-1].rstrip("x")) > 0


def test_grid_start_benchmark_checks_both_ways_give_every_unit_index_once_in_order() -> None:
    """``study.runner.unit_counter`` under Tune's variant generator (which deep-copies the
    spec per trial) gives 0..n-1 in order, as ``grid_search`` did; the script exits 1 if not."""
    lines = _run("benchmarks/grid_start.py", "--units", "40", "300")
    assert lines[0].split() == ["units", "grid_search", "sample_from", "ratio"]
    assert [line.split()[0] for line in lines[1:]] == ["40", "300"]



def test_transformer_generation_benchmark_checks_the_tokens_and_prints_the_ratio_last() -> None:
    lines = _run("benchmarks/transformer_generation.py", "--k", "2", "--steps", "5", "--repeats", "1",
                 "--test-size", "4")
    assert lines[-3].startswith("(a) uncached") and lines[-2].startswith("(b) cached")
    assert re.fullmatch(r"tokens: the same in (\d+) of \1 generations", lines[-4]), lines[-4]
    match = re.search(r"generation \(a\)/\(b\) = ([0-9.]+)x$", lines[-1])
    assert match and float(match.group(1)) > 0
