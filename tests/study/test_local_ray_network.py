"""A single-machine study's Ray listens on loopback only; its auth token file is private.

The listening sockets are read from ``/proc`` (``/proc/net/tcp*`` and each process's file
descriptors), for the processes this test started: the driver and its descendants (the GCS,
the raylet, the workers)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from study import preflight

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def _descendants(root: int) -> set[int]:
    seen, todo = {root}, [root]
    while todo:
        for kid in _children(todo.pop()):
            if kid not in seen:
                seen.add(kid)
                todo.append(kid)
    return seen


def _listening() -> dict[int, str]:
    """Socket inode -> listening address, over TCP (v4 and v6) of this machine."""
    found: dict[int, str] = {}
    for name, width in (("tcp", 8), ("tcp6", 32)):
        path = Path(f"/proc/net/{name}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            cols = line.split()
            local, state, inode = cols[1], cols[3], int(cols[9])
            if state != "0A":  # TCP_LISTEN
                continue
            hexip = local.split(":")[0]
            raw = bytes.fromhex(hexip)
            # /proc prints each 32-bit word in host (little-endian) order
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            ip = ipaddress.ip_address(words if width == 32 else raw[::-1])
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
                ip = ip.ipv4_mapped
            found[inode] = str(ip)
    return found


def _sockets_of(pids: set[int]) -> list[tuple[int, str, str]]:
    """(pid, process name, listening address) for every listening socket of ``pids``."""
    listening = _listening()
    out = []
    for pid in pids:
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = int(target[8:-1])
                if inode in listening:
                    out.append((pid, comm, listening[inode]))
    return out


PROBE = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from test_local_ray_network import _descendants, _sockets_of
from study import preflight
from study.runner import ray_session
with ray_session(None, 1):
    sockets = _sockets_of(_descendants(os.getpid()))
constants = sys.modules["ray._private.ray_constants"]
print(json.dumps({"sockets": sockets, "env_after": os.environ.get(preflight.LOOPBACK_ENV),
                  "constant_after": constants.ENABLE_RAY_CLUSTER}))
"""


def test_local_ray_listens_on_loopback_only(tmp_path: Path) -> None:
    """In a fresh process (Ray caches its auth token per process) whose home is empty: the
    local Ray's servers listen on loopback only, the switch is put back afterwards, and the
    token file Ray will use is created readable by its owner only. A ``ray start`` once run
    on the machine left its address behind (``ray_current_cluster``, here stale): the study's
    Ray is still its own (``ray.init()`` would connect there and refuse ``num_cpus``)."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "PYTHONPATH", "VIRTUAL_ENV")}
    ray_tmp = Path(tempfile.mkdtemp(prefix="flr-", dir="/tmp"))  # short: Ray's socket paths
    (ray_tmp / "ray").mkdir()
    (ray_tmp / "ray" / "ray_current_cluster").write_text("127.0.0.1:1")
    env |= {"HOME": str(tmp_path), "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": str(ray_tmp)}
    try:
        res = subprocess.run([sys.executable, "-c", PROBE, str(Path(__file__).parent)], capture_output=True,
                             text=True, env=env, timeout=300, cwd=tmp_path)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert res.returncode == 0, res.stderr[-3000:]
    probe = json.loads(res.stdout.strip().splitlines()[-1])
    sockets = probe["sockets"]
    names = {comm for _, comm, _ in sockets}
    assert {"gcs_server", "raylet"} <= names, sockets  # the check saw Ray's servers
    exposed = [s for s in sockets if not ipaddress.ip_address(s[2]).is_loopback]
    assert not exposed, f"listening beyond loopback: {exposed}"
    # the switch is put back: a later --address run in that process sees its real address
    assert probe["env_after"] is None and probe["constant_after"] is True
    token = tmp_path / ".ray" / "auth_token"
    assert token.exists() and stat.S_IMODE(token.stat().st_mode) == 0o600
    assert len(token.read_text()) == 64


def test_existing_token_file_made_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = tmp_path / "auth_token"
    token.write_text("ab" * 32)
    token.chmod(0o644)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    assert preflight.private_token() == token
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert token.read_text() == "ab" * 32  # the token itself is kept


def test_user_switch_keeps_ray_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(preflight.LOOPBACK_ENV, "1")
    with preflight.loopback_only():
        assert os.environ[preflight.LOOPBACK_ENV] == "1"


def test_drivers_starting_at_once_share_one_whole_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight drivers create the missing token file at once: one whole private token, no
    error, no temporary file left (the file is linked into place only once written)."""
    import threading

    token = tmp_path / ".ray" / "auth_token"
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    start, seen, errors = threading.Barrier(8), [], []

    def driver() -> None:
        start.wait()
        try:
            seen.append((preflight.private_token(), token.read_text()))
        except Exception as e:  # reported by the assert below
            errors.append(e)

    threads = [threading.Thread(target=driver) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert {p for p, _ in seen} == {token}
    assert len({text for _, text in seen}) == 1 and len(seen[0][1]) == 64  # every driver read it whole
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert [p.name for p in token.parent.iterdir()] == ["auth_token"]
