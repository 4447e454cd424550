"""``cluster.yaml`` passes Ray's own cluster-config validation, and makes its security
and storage decisions deliberately; the driver's token-auth decision (``ray_session``)."""

from __future__ import annotations

import copy
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "cluster.yaml"
DOCS = ROOT / "docs" / "cluster.md"
MOUNT = "/mnt/fineline"


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CLUSTER.read_text())
    return loaded


def validated(config: dict[str, Any]) -> dict[str, Any]:
    """What ``ray up`` does before touching the cloud: fill in the provider's defaults,
    then validate against Ray's JSON schema (``ray.autoscaler``'s ``ray-schema.json``)."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def start_commands(cfg: dict[str, Any]) -> list[str]:
    cmds = cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"]
    return [c for c in cmds if re.search(r"\bray start\b", c)]


def test_cluster_yaml_passes_rays_validator(raw: dict[str, Any]) -> None:
    cfg = validated(raw)
    assert cfg["provider"]["type"] == "aws"
    assert set(cfg["available_node_types"]) == {"head", "cpu_worker"}
    assert cfg["available_node_types"]["head"]["max_workers"] == 0  # filled in by Ray
    # the validator is really checking: a misspelt field is refused
    broken = copy.deepcopy(raw)
    broken["available_node_types"]["cpu_worker"]["resourcez"] = {"CPU": 8}
    with pytest.raises(Exception, match="resourcez"):
        validated(broken)


def test_every_ray_process_runs_with_token_auth(raw: dict[str, Any]) -> None:
    starts = start_commands(raw)
    assert len(starts) == 2  # head and worker
    for cmd in starts:
        assert "RAY_AUTH_MODE=token" in cmd, cmd
    text = CLUSTER.read_text()
    assert "RAY_AUTH_MODE=disabled" not in text
    assert any("export RAY_AUTH_MODE=token" in c for c in raw["setup_commands"]), (
        "login shells (ray exec)"
    )
    # one token, copied from the launching machine to every node
    assert raw["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"


def test_ports_and_dashboard_are_deliberate(raw: dict[str, Any]) -> None:
    head, worker = start_commands(raw)
    head_args = shlex.split(head.split(";")[-1])
    assert "--head" in head_args and "--dashboard-host=127.0.0.1" in head_args
    assert "--port=6379" in head_args and "--address=$RAY_HEAD_IP:6379" in worker
    for flag in ("--object-manager-port=8076", "--node-manager-port=8077", "--disable-usage-stats"):
        assert flag in head and flag in worker, flag
    # nothing opened to the internet: the launcher's own group (SSH from 0.0.0.0/0) is not
    # used; every node type names the user's group (SSH from their CIDR + intra-group)
    assert "security_group" not in raw["provider"]
    for node_type in raw["available_node_types"].values():
        assert node_type["node_config"]["SecurityGroupIds"] == ["sg-XXXXXXXX"]
    assert "0.0.0.0/0" not in CLUSTER.read_text()
    section = DOCS.read_text().split("## Security group")[1].split("\n## ")[0]
    assert "--cidr" in section and "0.0.0.0/0" not in section


def test_no_unpinned_downloads_into_a_shell(raw: dict[str, Any]) -> None:
    text = "\n".join(raw["setup_commands"])
    assert not re.search(r"(curl|wget)[^\n|]*\|\s*(ba)?sh", text), "no `curl | sh`"
    assert "uv==" in text and re.search(r"git checkout -q [0-9a-f]{40}", text)


def test_shared_results_storage_on_every_node(raw: dict[str, Any]) -> None:
    mount = [c for c in raw["setup_commands"] if "mount -t efs" in c]
    assert len(mount) == 1 and MOUNT in mount[0]
    assert "-o tls" in mount[0], "EFS is mounted with TLS (encryption in transit)"
    assert "test -w /mnt/fineline" in mount[0], "a node without a writable mount must fail setup"
    docs = DOCS.read_text()
    assert f"--out {MOUNT}/results" in docs and "fs-XXXXXXXX" in docs


def test_torch_cpu_then_pinned_ray_then_fineline(raw: dict[str, Any]) -> None:
    cmds = raw["setup_commands"]

    def index(needle: str) -> int:
        return next(i for i, c in enumerate(cmds) if needle in c)

    torch_cmd = cmds[index("torch==")]
    assert "torch==2.13.0" in torch_cmd and "https://download.pytorch.org/whl/cpu" in torch_cmd
    assert f"ray[default,tune]=={ray.__version__}" in cmds[index("ray[")], (
        "nodes need the launcher's Ray"
    )
    assert index("torch==") < index("ray[") < index("-e ~/fineline")
    assert raw["file_mounts"]["~/fineline"] == "."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_driver_without_the_clusters_token_fails_clearly(tmp_path: Path) -> None:
    """``ray_session`` chooses token mode itself (the environment sets no RAY_AUTH_MODE),
    so a driver with no token is told so at once, instead of retrying a connection that
    the cluster would refuse."""
    env = {k: v for k, v in os.environ.items() if k in ("PYTHONPATH", "LANG")}
    env |= {
        "HOME": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    out = tmp_path / "results"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "study.cli",
            "run",
            str(ROOT / "configs" / "tiny_cluster.yaml"),
            "--out",
            str(out),
            "--address",
            f"127.0.0.1:{free_port()}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert res.returncode == 2, res.stderr[-3000:]
    assert "--address: no Ray auth token" in res.stderr and "RAY_AUTH_TOKEN_PATH" in res.stderr
    assert "Fix:" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / ".ray" / "auth_token").exists(), "a driver must never invent a token"


def test_held_stderr_drops_what_one_error_says_and_prints_the_rest(tmp_path: Path) -> None:
    """Ray's C++ core writes its connection retries to file descriptor 2; they are dropped
    when fineline raises its own error, printed otherwise (success or any other failure)."""
    code = (
        "import os, sys\n"
        "from study.preflight import held_stderr\n"
        "from trainables.errors import ConfigError\n"
        "case = sys.argv[1]\n"
        "try:\n"
        "    with held_stderr():\n"
        "        os.write(2, b'gcs_client.cc: Failed to get cluster ID\\n')\n"
        "        if case == 'refused':\n"
        "            raise ConfigError('--address', 'refused', 'give the token')\n"
        "        if case == 'other':\n"
        "            raise RuntimeError('boom')\n"
        "except Exception as exc:\n"
        "    print(f'error: {exc}', file=sys.stderr)\n"
        "print('after', file=sys.stderr)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    seen = {}
    for case in ("refused", "ok", "other"):
        res = subprocess.run([sys.executable, "-c", code, case], capture_output=True, text=True,
                             env=env, timeout=60, check=True)  # fmt: skip
        seen[case] = res.stderr.splitlines()
    assert seen["refused"][0].startswith("error: --address: refused") and len(seen["refused"]) == 2
    assert seen["ok"] == ["gcs_client.cc: Failed to get cluster ID", "after"]
    assert seen["other"][:2] == ["gcs_client.cc: Failed to get cluster ID", "error: boom"]


def test_local_ray_agrees_on_auth_even_when_ray_was_imported_first(tmp_path: Path) -> None:
    """Ray caches its auth mode per process. A program that touched Ray before calling
    ``ray_session`` (a notebook, another library) must still agree with the local Ray it
    starts, instead of being refused by its own GCS."""
    script = (
        "import ray.tune\n"
        "from ray._raylet import get_authentication_mode\n"
        "print('mode before:', get_authentication_mode())\n"
        "from study.runner import ray_session\n"
        "with ray_session(None, 1) as resources:\n"
        "    print('cpus:', resources.get('CPU'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k in ("PYTHONPATH", "LANG")}
    env |= {"HOME": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "RAY_USAGE_STATS_ENABLED": "0"}  # fmt: skip
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, env=env, cwd=ROOT)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert "mode before: 0" in res.stdout, "Ray should have cached 'disabled' (0) first"
    assert "cpus: 1.0" in res.stdout
