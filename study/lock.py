"""One driver per study: an OS advisory lock on ``OUT/NAME/driver.lock``.

Every command that writes a study's results (``run``, ``resume``, ``tune``, ``eval``) holds
the lock for as long as it runs. It is an ``flock`` on an open file, so the kernel releases
it when the process ends however it ends (SIGKILL, a crash, a lost SSH session): there is
never a stale lock to delete by hand. The file holds the holder's pid, host and command, so
a refused second driver can say who holds the study.

``flock`` is local to one machine on most network file systems (NFS clients emulate it with
byte-range locks, which do reach the server; a file system without any locking support
raises ``ENOLCK``, reported as such). Two machines writing one study through a shared folder
are therefore refused as well, where the file system carries the lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainables.errors import FinelineError, StudyStateError

LOCK_FILE = "driver.lock"
"""The lock's file name inside the study folder."""


class StudyLocked(StudyStateError):
    """Another driver holds the study (exit code 2: nothing ran, nothing was written)."""


def _details(fd: int) -> dict[str, Any] | None:
    """The holder's details the lock file holds (pid, host, started, command), or None."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
        return {"pid": int(info["pid"]), "host": str(info["host"]), "started": float(info["started"]),
                "command": str(info["command"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _holder(fd: int) -> str:
    """The running holder as ``pid P on HOST (since T: COMMAND)``, from the lock file."""
    return _described(_details(fd))


def _described(info: dict[str, Any] | None) -> str:
    """Holder details as ``pid P on HOST (since T: COMMAND)``."""
    if not info:
        return "another process (its details are not written yet)"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["started"])))
    return f"pid {info['pid']} on {info['host']} (since {since}: {info['command']})"


@contextlib.contextmanager
def study_lock(out: Path, name: str) -> Iterator[Path]:
    """Hold ``OUT/NAME/driver.lock`` exclusively for the ``with`` block; yields its path.

    Raises :class:`StudyLocked` naming the holder's pid and host when another process holds
    it. Re-entrant use in one process is not supported (a second ``study_lock`` of the same
    study from the same process is refused like another driver). A block refused with exit
    code 2 (a changed config, a split that is not there) leaves an existing lock file's
    modification time as it was, and one that created the study folder (and OUT) removes them
    again, lock file included, when nothing else was written there: a refused command changes
    nothing in OUT."""
    folder = Path(out) / name
    created = [d for d in (folder, *folder.parents) if not d.exists()]  # innermost first
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    before = path.stat() if path.exists() else None
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno == errno.ENOLCK:
                raise StudyStateError(
                    f"{path}: the file system does not support locks, so a second driver could "
                    "not be refused. Fix: put --out on a local disk (or a file system with locks)"
                ) from None
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise StudyLocked(
                f"study {name} in {out} is being written by {_holder(fd)}. Fix: wait for it to "
                f"finish (watch it with `study status {name} --out {out}`), or stop that process; "
                "its lock goes with it, committed runs are kept"
            ) from None
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.time(),
            "command": " ".join(["study", *sys.argv[1:]])[:300],
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        refused = False
        try:
            yield path
        except FinelineError as exc:
            refused = getattr(exc, "exit_code", 2) == 2
            raise
        finally:
            os.ftruncate(fd, 0)
            if refused and before is not None:
                os.utime(fd, ns=(before.st_atime_ns, before.st_mtime_ns))
            if refused and before is None:
                _forget(path, created)
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def _forget(lock: Path, created: list[Path]) -> None:
    """Remove the lock file a refused command created, then the folders it created (innermost
    first), each only while empty: the study's files, or another driver's, are never touched."""
    lock.unlink(missing_ok=True)
    for d in created:
        try:
            d.rmdir()
        except OSError:  # not empty (or gone): what is in it is not ours to remove
            return


def _probe(out: Path, name: str) -> tuple[bool, dict[str, Any] | None] | None:
    """(held, holder details) of study ``name``'s lock, taking it for an instant when it is
    free (never waiting, never creating the file); details None when the file is empty (the
    last holder ended normally), ``{}`` when they cannot be read. None when there is no lock
    file."""
    path = Path(out) / name / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True, _details(fd) or {}
        return False, ((_details(fd) or {}) if os.pread(fd, 1, 0) else None)
    finally:
        os.close(fd)


def writer(out: Path, name: str) -> str | None:
    """Who holds study ``name``'s lock now (``pid P on HOST (since T: COMMAND)``), or None."""
    probe = _probe(out, name)
    return _described(probe[1]) if probe is not None and probe[0] else None


def killed_holder(out: Path, name: str) -> str | None:
    """The last holder of study ``name``'s lock if it died without releasing it cleanly
    (SIGKILL, the kernel's out-of-memory killer, a lost machine: its details are still in
    the file, which every other ending clears), as ``pid P on HOST (since T: COMMAND)``;
    None while a driver holds the lock, or when the last one ended normally."""
    probe = _probe(out, name)
    return _described(probe[1]) if probe is not None and not probe[0] and probe[1] is not None else None


def holder_info(out: Path, name: str) -> dict[str, Any] | None:
    """The details (pid, host, started, command) of the driver holding study ``name``'s lock
    now, or None when none holds it (or it has not written them yet)."""
    probe = _probe(out, name)
    return (probe[1] or None) if probe is not None and probe[0] else None
