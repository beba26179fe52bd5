"""The segment routes without media: JSON 404s with reasons, the view token, lazy start on the
first request and the idle stop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from sfu_sidecar.app import SERVICES_KEY, Components, build_app
from sfu_sidecar.config import load_settings
from sfu_sidecar.relay.sdp import CodecInfo
from tests.conftest import IN_PROCESS

Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def app_client(tmp_path: Path) -> AsyncIterator[tuple[Client, Components]]:
    settings = load_settings({"data_dir": str(tmp_path), "view_token": "v",
                              "segment_idle_s": "5", **IN_PROCESS})
    app = build_app(settings)
    components = app[SERVICES_KEY].components
    async with TestClient(TestServer(app)) as client:
        yield client, components


AUTH = {"Authorization": "Bearer v"}


async def test_unknown_stream_and_bad_names_are_json_404(
    app_client: tuple[Client, Components]
) -> None:
    client, components = app_client
    for path in ("/streams/nope/media/index.json", "/streams/nope/media/init.webm",
                 "/streams/nope/media/3.webm", "/streams/nope/media/x.webm",
                 "/streams/nope/media/1.mkv", "/streams/nope/media/99999999999999999.webm"):
        resp = await client.get(path, headers=AUTH)
        assert resp.status == 404, path
        assert "error" in await resp.json()
    assert components.segments is not None and not components.segments.live


async def test_view_token_required(app_client: tuple[Client, Components]) -> None:
    client, _ = app_client
    resp = await client.get("/streams/s/media/index.json")
    assert resp.status == 401
    assert "error" in await resp.json()


async def test_lazy_start_and_idle_stop(app_client: tuple[Client, Components]) -> None:
    client, components = app_client
    segments, relay = components.segments, components.relay
    assert segments is not None and relay is not None
    relay.streams.get_or_create("s")  # a stream the relay knows, with no media yet
    assert "s" not in segments.live
    resp = await client.get("/streams/s/media/index.json", headers=AUTH)
    assert resp.status == 200 and resp.headers["Cache-Control"] == "no-cache"
    body = await resp.json()
    assert body["segments"] == [] and body["init"] is None and body["container"] == "webm"
    assert "s" in segments.live
    for path, reason in (("init.webm", "no init segment yet"), ("0.webm", "no segment 0"),
                         ("init.mp4", "segmented as webm"), ("0.m4s", "segmented as webm")):
        resp = await client.get(f"/streams/s/media/{path}", headers=AUTH)
        assert resp.status == 404, path
        assert reason in (await resp.json())["error"], path
    segments.sweep()
    assert "s" in segments.live  # read just now
    segments.live["s"].last_read_ns -= 6_000_000_000
    segments.sweep()
    assert "s" not in segments.live


async def test_an_h264_stream_is_indexed_as_mp4_from_the_first_request(
    app_client: tuple[Client, Components]
) -> None:
    client, components = app_client
    assert components.relay is not None
    components.relay.streams.get_or_create("avc").forwarder(
        "video", CodecInfo(102, "h264", 90000, None, {}))
    body = await (await client.get("/streams/avc/media/index.json", headers=AUTH)).json()
    assert body["container"] == "mp4"
    resp = await client.get("/streams/avc/media/init.webm", headers=AUTH)
    assert resp.status == 404 and "init.mp4" in (await resp.json())["error"]
