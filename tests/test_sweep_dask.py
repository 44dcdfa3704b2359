"""`zsim sweep --engine dask --address`: malformed addresses, a service that is not Dask, and a cluster
without a live worker are each one message and exit 2, never an internal error or a wait forever
(issue 28)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import pytest
import yaml

from tests.conftest import SMALL
from zsim.cli import main
from zsim.errors import ZsimError
from zsim.sweep.engines import check_address

BAD = ["tcp://", "tcp://:", "tcp://[::1", "://x", "tcp://host:port", "inproc://", "ucx://x:1", "x y",
       "tcp://localhost:-1", "tls://localhost:1", "tcp://localhost:0", "tcp://host:99999", "tcp://h\x1b[31m:1"]


@pytest.mark.parametrize("address", BAD)
def test_malformed_addresses_are_refused_before_planning(address, tmp_path, capsys):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": "missing.yaml", "axes": {"zero.stage": [1, 2]}}))
    assert main(["sweep", str(sweep), "--engine", "dask", "--address", address]) == 2
    err = capsys.readouterr().err
    assert "expected a Dask scheduler as tcp://HOST:PORT" in err and "\x1b" not in err


def test_good_addresses_are_normalised():
    assert check_address("10.0.0.5:8786") == "tcp://10.0.0.5:8786"
    assert check_address("tcp://[::1]:8786") == "tcp://[::1]:8786"
    assert check_address("tcp://node-3.cluster:08786") == "tcp://node-3.cluster:8786"
    with pytest.raises(ZsimError):
        check_address("tcp://node-3.cluster")


def _server(reply: bytes | None) -> tuple[socket.socket, int]:
    """A TCP service on a free port that accepts, then answers `reply` (None: never answers)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    held = []

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            if reply is not None:
                conn.recv(65536)
                conn.sendall(reply)

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


@pytest.mark.parametrize("reply", [None, b"HTTP/1.0 400 Bad Request\r\n\r\n" + b"\xff" * 64],
                         ids=["silent", "http"])
def test_a_service_that_is_not_dask_is_named(reply):
    pytest.importorskip("distributed")
    from zsim.sweep.engines import scheduler_identity

    server, port = _server(reply)
    started = time.monotonic()
    try:
        with pytest.raises(ZsimError, match=f"tcp://127.0.0.1:{port}: (cannot reach a Dask scheduler|"
                                            "what answers there is not)"):
            scheduler_identity(f"tcp://127.0.0.1:{port}", timeout=2)
    finally:
        server.close()
    assert time.monotonic() - started < 10


@pytest.mark.slow
def test_no_live_worker_stops_the_sweep(tmp_path):
    pytest.importorskip("distributed")
    from zsim.sweep.engines import _wait_for_workers

    info = tmp_path / "scheduler.json"
    scheduler = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--port", "0",
                                  "--no-dashboard", "--scheduler-file", str(info)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not info.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        address = json.loads(info.read_text())["address"]
        started = time.monotonic()
        with pytest.raises(ZsimError, match="the Dask scheduler has no workers \\(waited 2 s\\)"):
            _wait_for_workers(address, 2)
        assert time.monotonic() - started < 10
    finally:
        scheduler.kill()
        scheduler.wait()
