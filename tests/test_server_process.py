"""The real console script as a subprocess: start-up, endpoints, and SIGTERM."""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request

import pytest

from tests.conftest import ServerProcess

pytestmark = pytest.mark.system  # runs the service or its CLI as a subprocess


def get(url: str) -> tuple[int, bytes, dict[str, str]]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def test_console_script_serves_and_exits_cleanly_on_sigterm(tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = ServerProcess(["--data-dir", str(tmp_path / "d"), "--log-format", "json"])
    try:
        assert server.wait_ready(timeout=10) < 5
        status, body, _ = get(server.base + "/healthz")
        assert status == 200 and json.loads(body)["status"] == "ok"
        status, body, headers = get(server.base + "/metrics")
        assert status == 200 and b"process_resident_memory_bytes" in body
        assert headers["Content-Type"].startswith("text/plain")
        status, body, _ = get(server.base + "/")
        assert status == 200 and b"<html" in body.lower()
        status, body, _ = get(server.base + "/missing")
        assert status == 404 and "error" in json.loads(body)

        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=5) == 0
        assert time.monotonic() - started < 5
        out = server.output()
        # One JSON log line per request, with status and duration.
        requests = [json.loads(line) for line in out.splitlines() if '"sfu_sidecar.http"' in line]
        assert {r["status"] for r in requests} >= {200, 404}
        assert all("duration_ms" in r for r in requests)
    finally:
        server.stop()


def test_sigint_also_exits_zero(tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = ServerProcess(["--data-dir", str(tmp_path / "d")])
    try:
        server.wait_ready()
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(timeout=5) == 0
    finally:
        server.stop()


def test_bad_setting_exits_2_before_listening() -> None:
    server = ServerProcess(["--log-level", "loud"])
    assert server.proc.wait(timeout=10) == 2
    assert "--log-level loud: must be one of debug, info, warning, error" in server.output()


def test_a_malformed_request_is_one_info_line_not_a_traceback(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A header with a control byte is refused by aiohttp's parser with 400; the service logs
    it as one INFO line, so strangers cannot fill the log with ERROR tracebacks."""
    import socket

    server = ServerProcess(["--data-dir", str(tmp_path / "d"), "--log-format", "json"])
    try:
        server.wait_ready()
        host, port = server.base.removeprefix("http://").split(":")
        for _ in range(3):
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Bad: a\x00b\r\n\r\n")
                assert sock.recv(4096).split(b" ", 2)[1] == b"400"
        status, _, _ = get(server.base + "/healthz")
        assert status == 200  # and the service goes on serving
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=5) == 0
        out = server.output()
        assert "Traceback" not in out
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        refused = [r for r in lines if "refused as malformed" in r["msg"]]
        assert len(refused) == 3 and {r["level"] for r in refused} == {"info"}, refused
        assert not [r for r in lines if r["level"] in ("error", "critical")]
    finally:
        server.stop()
