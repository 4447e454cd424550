"""`.ci/gpu`, the checks run on a lent GPU machine: its refusals, here where they are cheap.

The stages themselves need the kit (`.ci/gpu-kit`, ~2 minutes and 50 MB) and a GPU; what
was run of them, and how, is in docs/performance.md ("Checks on a lent GPU").
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.slow  # 26 s; the GPU kit's stages are checked by name in the default run
def test_a_study_comes_back_as_one_tarball_that_analyzes_here(tmp_path: Path) -> None:
    """The `study` stage on this CPU (a tiny study; the installed packages stand in for the
    kit): its tables come back in `$OUT/results.tgz` (the tool that runs it sends back no
    folder nested as deep as the tables), without Ray's trial folders, and analyze here."""
    import yaml
    from tests_support import TINY_STUDY

    if not (ROOT / "fineline.egg-info" / "entry_points.txt").is_file():
        raise AssertionError("run 'pip install -e .' first: .ci/gpu needs fineline.egg-info")
    site = tmp_path / "site-unpacked"
    site.mkdir()
    (site / ".unpacked").touch()  # no kit: the packages installed here
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({**TINY_STUDY, "name": "gpu_tiny"}))
    out, work = tmp_path / "out", Path("/tmp/fineline-results")
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "OUT": str(out), "KIT_SITE": str(site), "STAGE_S": "240",
           "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "HOME": str(tmp_path)}
    shutil.rmtree(work / "gpu_tiny", ignore_errors=True)
    done = subprocess.run(["bash", str(ROOT / ".ci" / "gpu"), "study", str(config), "--num-cpus", "1"],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    names = subprocess.run(["tar", "-tzf", str(out / "results.tgz")], capture_output=True, text=True, check=True).stdout
    assert "tables/runs/study=gpu_tiny/" in names and "gpu_tiny/study.json" in names
    assert "/ray/" not in names and "gpu_tiny/weights/" in names
    back = tmp_path / "back"
    back.mkdir()
    subprocess.run(["tar", "-xzf", str(out / "results.tgz"), "-C", str(back)], check=True)
    shown = subprocess.run([sys.executable, "-m", "study.cli", "ls", "--out", str(back)], capture_output=True,
                           text=True, timeout=120, check=True, cwd=tmp_path)
    assert "gpu_tiny" in shown.stdout and " 3 " in shown.stdout, shown.stdout
    checked = subprocess.run([sys.executable, "-m", "study.cli", "check", "gpu_tiny", "--out", str(back)],
                             capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr  # nothing missing
    shutil.rmtree(work / "gpu_tiny", ignore_errors=True)
