"""`.ci/gpu`, the checks run on a lent GPU machine: its refusals, here where they are cheap.

The stages themselves need the kit (`.ci/gpu-kit`, ~2 minutes and 50 MB) and a GPU; what
was run of them, and how, is in docs/performance.md ("Checks on a lent GPU").
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_gpu(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(repo / ".ci" / "gpu"), *args], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "OUT": str(repo / "out"), "KIT_SITE": str(repo / "site-unpacked")}, check=False)


def test_without_the_kit_it_says_how_to_build_it(tmp_path: Path) -> None:
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "gpu", tmp_path / ".ci" / "gpu")
    done = run_gpu(tmp_path, "check")
    assert done.returncode == 2
    assert "run 'bash .ci/gpu-kit' here and carry .whl" in done.stderr


def test_an_unknown_stage_is_refused_naming_the_stages(tmp_path: Path) -> None:
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "gpu", tmp_path / ".ci" / "gpu")
    site = tmp_path / "site"
    (site / "empty").mkdir(parents=True)
    (tmp_path / ".whl").mkdir()
    subprocess.run(["tar", "-cJf", str(tmp_path / ".whl" / "site.tar.xz"), "-C", str(site), "."], check=True)
    (tmp_path / "fineline.egg-info").mkdir()
    (tmp_path / "fineline.egg-info" / "entry_points.txt").write_text("")
    done = run_gpu(tmp_path, "contrakt")
    assert done.returncode == 2
    assert "unknown stage 'contrakt'" in done.stderr and "contract-graphs" in done.stderr
