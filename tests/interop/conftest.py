"""Fixtures for tests against real ptp4l and chronyd in network namespaces (root only)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.conftest import require
from tests.interop.ptpnet import Chrony, PtpNet

HERE = Path(__file__).resolve().parent
T = TypeVar("T")


def _require(*tools: str) -> None:
    require(*tools, root=True)


def free_udp_pair() -> int:
    """A UDP port p with p+1 also free on 127.0.0.1 (chronyd reference + offset server)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port >= 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s2:
            try:
                s2.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no free UDP port pair")


@pytest.fixture
def ptpnet(tmp_path: Path) -> Iterator[PtpNet]:
    _require("ptp4l", "ip")
    net = PtpNet(tmp_path)
    try:
        yield net
    finally:
        net.close()


@pytest.fixture
def chrony_factory(tmp_path: Path) -> Iterator[Any]:
    _require("chronyd")
    made: list[Chrony] = []

    def start(offset_s: float, netns: list[str] | None = None, port: int | None = None) -> Chrony:
        wd = tmp_path / f"chrony{len(made)}"
        wd.mkdir()
        wd.chmod(0o777)  # chronyd drops to its own user and writes its drift file here
        c = Chrony(wd, port or free_udp_pair(), offset_s, netns)
        made.append(c)
        return c

    yield start
    for c in made:
        c.close()


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("clock", timeout=5)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5)
        sock.connect(self.unix_path)
        self.sock = sock


class ClockServer:
    """tests/interop/clock_server.py in a namespace, reached over a Unix socket.

    Synchronous on purpose: the session's Playwright browser keeps an event loop marked as
    running in the main thread, so tests after it cannot start one there.
    """

    def __init__(self, prefix: list[str], workdir: Path, args: list[str],
                 holdover_s: float, ntp_poll_s: float) -> None:
        self.path = str(workdir / "clock.sock")
        self.log = workdir / "clock-server.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SFU_SIDECAR_")}
        env["PYTHONPATH"] = str(HERE.parent.parent)
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, str(HERE / "clock_server.py"), self.path,
             str(holdover_s), str(ntp_poll_s), *args],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT, env=env,
        )
        deadline = time.monotonic() + 15
        while not os.path.exists(self.path):
            if self.proc.poll() is not None:
                raise RuntimeError(f"clock server exited:\n{self.log.read_text()}")
            if time.monotonic() > deadline:
                raise TimeoutError("clock server did not start")
            time.sleep(0.05)

    def status(self) -> dict[str, Any]:
        conn = _UnixHTTPConnection(self.path)
        try:
            conn.request("GET", "/api/clock")
            resp = conn.getresponse()
            assert resp.status == 200
            data: dict[str, Any] = json.loads(resp.read())
            return data
        finally:
            conn.close()

    def post(self, path: str, body: str, content_type: str) -> tuple[int, str]:
        conn = _UnixHTTPConnection(self.path)
        try:
            conn.request("POST", path, body=body.encode(), headers={"Content-Type": content_type})
            resp = conn.getresponse()
            return resp.status, resp.read().decode()
        finally:
            conn.close()

    def close(self) -> None:
        PtpNet.stop(self.proc)


@pytest.fixture
def clock_server_factory(tmp_path: Path) -> Iterator[Any]:
    made: list[ClockServer] = []

    def start(prefix: list[str], args: list[str], holdover_s: float = 10.0,
              ntp_poll_s: float = 16.0) -> ClockServer:
        wd = tmp_path / f"server{len(made)}"
        wd.mkdir()
        server = ClockServer(prefix, wd, args, holdover_s, ntp_poll_s)
        made.append(server)
        return server

    yield start
    for server in made:
        server.close()


def run_in_thread(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run in a fresh thread (see ClockServer on why not in the main thread)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result(timeout=60)


class ThreadedApp:
    """The application with only the house clock, on 127.0.0.1, in a thread with its own loop
    (so a synchronous Playwright test can drive a browser against it)."""

    def __init__(self, args: list[str], ntp_poll_s: float = 1.0) -> None:
        import threading

        from tests.conftest import free_port

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.args = args
        self.ntp_poll_s = ntp_poll_s
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="clock-app", daemon=True)
        self._thread.start()
        if not self._ready.wait(15):
            raise TimeoutError("in-process clock app did not start")
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        from aiohttp import web

        from sfu_sidecar.app import Components, build_app
        from sfu_sidecar.clock.service import ClockService
        from sfu_sidecar.config import load_settings
        from sfu_sidecar.metrics import Metrics

        flags = dict(zip(self.args[::2], self.args[1::2], strict=True))
        settings = load_settings({k.lstrip("-").replace("-", "_"): v for k, v in flags.items()})
        metrics = Metrics()
        clock = ClockService(settings, metrics, ntp_poll_s=self.ntp_poll_s)
        app = build_app(settings, Components(metrics, clock=clock))
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()

    def status(self) -> dict[str, Any]:
        import urllib.request

        with urllib.request.urlopen(self.base + "/api/clock", timeout=5) as resp:
            data: dict[str, Any] = json.loads(resp.read())
            return data

    def wait(self, pred: Any, within_s: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + within_s
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            last = self.status()
            if pred(last):
                return last
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; last status {last}")

    def close(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@pytest.fixture
def ntp_house(chrony_factory: Any) -> Iterator[ThreadedApp]:
    """The clock app following a chronyd on loopback that serves host time + 250 ms."""
    chrony = chrony_factory(0.25)
    app = ThreadedApp(["--ntp-servers", f"127.0.0.1:{chrony.port}"])
    try:
        app.wait(lambda s: s["source"] == "ntp" and s["state"] == "locked"
                 and abs(s["offset_ns"] - 250_000_000) < 2_000_000, 20, "NTP lock at +250 ms")
        yield app
    finally:
        app.close()


@pytest.fixture
def ptplan(tmp_path: Path) -> Iterator[Any]:
    """Two ptp4l masters and the product on one bridged LAN (see PtpLan)."""
    from tests.interop.ptpnet import PtpLan

    _require("ptp4l", "ip")
    lan = PtpLan(tmp_path, masters=2)
    try:
        yield lan
    finally:
        lan.close()
