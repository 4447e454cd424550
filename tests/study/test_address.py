"""``--address`` naming something that is not a Ray cluster: refused within seconds, before
anything is written, where Ray itself retries for ever."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.study.test_bad_inputs import TINY, check_refused, run_cli, write


class Quiet(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # the server's log is not the CLI's stderr
        pass


def run_at(address: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, float]:
    """``study run`` of the tiny study with ``--address address`` into ``tmp_path/results``:
    (exit code, stderr, seconds taken)."""
    t0 = time.monotonic()
    rc, err = run_cli(["run", str(write(tmp_path, TINY)), "--out", str(tmp_path / "results"),
                       "--address", address], capsys)  # fmt: skip
    return rc, err, time.monotonic() - t0


def test_an_address_whose_port_answers_but_not_as_ray_is_refused_in_seconds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: an HTTP server on the port passed the TCP check, then ``ray.init`` printed
    "Failed to connect to GCS" for ever (still running after 300 s) and left the manifest
    and lock in OUT. Now the gRPC handshake Ray's GCS would complete is tried first."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out, address = tmp_path / "results", f"127.0.0.1:{server.server_address[1]}"
        rc, err, took = run_at(address, tmp_path, capsys)
    finally:
        server.shutdown()
        server.server_close()
    line = check_refused(rc, err, f"error: --address: something accepts connections at {address} but "
                         "does not answer as a Ray cluster", out, None)
    assert rc == 2, line
    assert "Fix: check the port" in line
    assert took < 60, took
    assert not out.exists()


def test_an_address_that_speaks_grpc_but_is_no_gcs_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Probe D: the head's Ray Client port (10001) or a raylet's port passed the gRPC probe;
    Ray then tried for 20 s or more (a bare gRPC server: minutes) before "no Ray cluster
    answers ... Fix: start it", while the cluster ran. Now a GCS method is asked for by name
    (a Ray Client server answers UNIMPLEMENTED, as this bare gRPC server does)."""
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))  # no services: not a GCS
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        out, address = tmp_path / "results", f"127.0.0.1:{port}"
        rc, err, took = run_at(address, tmp_path, capsys)
    finally:
        server.stop(0)
    line = check_refused(rc, err, f"error: --address: {address} speaks gRPC but is not a Ray head node's GCS",
                         out, None)
    assert rc == 2 and "give the head node's GCS port (6379" in line and "ray://HOST:10001" in line, line
    assert took < 30, took
    assert not out.exists()


def test_the_head_watch_calls_once_the_gcs_port_stops_answering() -> None:
    """Probe D: a cluster whose head died left the driver spinning a core for 60 s, then dying
    with Ray's C++ line and no counts. The watch sees the GCS port refuse for
    ``lost_after_s`` and calls ``on_lost`` once; while the port answers it never does."""
    import socket

    from study.preflight import HeadWatch

    listener = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    calls: list[str] = []
    with HeadWatch(address, calls.append, every_s=0.05, lost_after_s=0.3) as watch:
        time.sleep(0.5)
        assert calls == []  # it answers
        listener.close()
        watch.thread.join(timeout=5)
    assert len(calls) == 1 and calls[0].startswith(f"the cluster's head node (GCS at {address}) has not answered for"), calls
    with HeadWatch("ray://h:10001x", calls.append) as idle:  # not HOST:PORT: nothing to watch
        assert not idle.thread.is_alive()
