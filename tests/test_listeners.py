"""HTTPS served by the service itself: alone or beside plain HTTP, HSTS, plain HTTP sent to the
HTTPS port, and a certificate rotated under open connections."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from sfu_sidecar import listeners
from sfu_sidecar.app import SERVICES_KEY, build_app
from sfu_sidecar.config import Settings, load_settings
from tests.conftest import IN_PROCESS, free_port
from tests.relay.peers import wait_for
from tests.support.certs import TestCA
from tests.test_tls import bump

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ca() -> TestCA:
    return TestCA()


def client_context(ca: TestCA) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=ca.pem.decode())
    return context


@asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[listeners.Listeners]:
    app = build_app(settings)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    listening = None
    try:
        listening = await listeners.start(
            runner, settings, registry=app[SERVICES_KEY].components.metrics.registry)
        yield listening
    finally:
        if listening is not None:
            await listening.close()
        await runner.cleanup()


def tls_settings(tmp_path: Path, ca: TestCA, **extra: str) -> Settings:
    cert, key = ca.issue("127.0.0.1", "localhost").write(tmp_path)
    return load_settings({**IN_PROCESS, "host": "127.0.0.1", "port": str(free_port()),
                          "data_dir": str(tmp_path / "data"), "tls_cert": str(cert),
                          "tls_key": str(key), **extra})


async def served_fingerprint(port: int, ca: TestCA) -> str:
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context(ca))
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
    return hashlib.sha256(der).hexdigest()


async def test_https_alone_on_port_answers_and_plain_http_there_is_closed_cleanly(
        tmp_path: Path, ca: TestCA, caplog: pytest.LogCaptureFixture) -> None:
    settings = tls_settings(tmp_path, ca)
    async with serving(settings) as listening, aiohttp.ClientSession() as http:
        assert listening.urls == [f"https://127.0.0.1:{settings.port}"]
        base = listening.urls[0]
        async with http.get(base + "/healthz", ssl=client_context(ca)) as resp:
            assert resp.status == 200
            assert "Strict-Transport-Security" not in resp.headers  # off by default
        with caplog.at_level(logging.DEBUG):
            # A browser or script that forgot the s: the handshake fails, the connection is
            # closed, nothing is logged above debug, and the port goes on serving.
            reader, writer = await asyncio.open_connection("127.0.0.1", settings.port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            assert not answer.startswith(b"HTTP/1.1 200"), answer
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
        async with http.get(base + "/healthz", ssl=client_context(ca)) as resp:
            assert resp.status == 200


async def test_https_port_beside_plain_http_with_hsts_over_https_only(
        tmp_path: Path, ca: TestCA) -> None:
    https_port = free_port()
    settings = tls_settings(tmp_path, ca, https_port=str(https_port), hsts_max_age_s="600")
    async with serving(settings) as listening, aiohttp.ClientSession() as http:
        assert listening.urls == [f"http://127.0.0.1:{settings.port}",
                                  f"https://127.0.0.1:{https_port}"]
        async with http.get(f"http://127.0.0.1:{settings.port}/healthz") as resp:
            assert resp.status == 200
            # RFC 6797 7.2: never over plain HTTP.
            assert "Strict-Transport-Security" not in resp.headers
        async with http.get(f"https://127.0.0.1:{https_port}/", ssl=client_context(ca)) as resp:
            assert resp.status == 200
            assert resp.headers["Strict-Transport-Security"] == "max-age=600"
        async with http.get(f"https://127.0.0.1:{https_port}/metrics",
                            ssl=client_context(ca)) as resp:
            text = await resp.text()
        assert "sfu_sidecar_tls_certificate_expiry_timestamp_seconds" in text


async def test_a_rotated_certificate_reaches_new_connections_and_open_ones_stay(
        tmp_path: Path, ca: TestCA) -> None:
    settings = tls_settings(tmp_path, ca)
    assert settings.tls_cert is not None and settings.tls_key is not None
    rotated = ca.issue("127.0.0.1")
    async with serving(settings) as listening, aiohttp.ClientSession() as http:
        base = listening.urls[0]
        assert listening.reloader is not None
        before = await served_fingerprint(settings.port, ca)
        async with http.ws_connect(base + "/api/clock/ws", ssl=client_context(ca)) as ws:
            await ws.send_str(json.dumps({"type": "clock_req", "t1": 1}))
            assert json.loads((await ws.receive(timeout=5)).data)["type"] == "clock_resp"

            bump(settings.tls_cert, rotated.cert_pem)
            bump(settings.tls_key, rotated.key_pem)
            # The watch looks every 2 s; wait for it rather than calling it.
            reloader = listening.reloader
            await wait_for(lambda: reloader.reloads > 0, 10, "the rotated certificate")
            assert reloader.reloads == 1
            after = await served_fingerprint(settings.port, ca)
            assert before != after == rotated.sha256

            # The WebSocket opened with the old certificate carries on.
            await ws.send_str(json.dumps({"type": "clock_req", "t1": 2}))
            reply = json.loads((await ws.receive(timeout=5)).data)
            assert reply["type"] == "clock_resp" and reply["t1"] == 2
