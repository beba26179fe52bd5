"""The HTTP edge applies one CORS policy to every route of the whole app, in process."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiortc import RTCPeerConnection

from sfu_sidecar.app import Components, build_app
from sfu_sidecar.config import load_settings
from sfu_sidecar.metrics import Metrics
from tests.relay.peers import LOOPBACK, PatternVideo, ToneAudio, client_pc

Client = TestClient[web.Request, web.Application]
MakeClient = Callable[..., Awaitable[Client]]

APP = "http://app.example:3000"
OTHER = "https://other.example"
SESSION = "0" * 32
EXPOSED = "Location, Link, ETag, Accept-Patch, Retry-After, X-Stream-Epoch-Ns"
CAPTIONS = {
    "timebase": "stream_s",
    "lang": "en",
    "cues": [{"id": "c1", "start": 0, "end": 1, "text": "hi"}],
}
ACAO = "Access-Control-Allow-Origin"

# Every route family: (method a page uses, path). Writes carry a token or change state.
WRITES = [
    ("POST", "/whip/live"),
    ("PATCH", f"/whip/live/{SESSION}"),
    ("DELETE", f"/whip/live/{SESSION}"),
    ("OPTIONS", "/whip/live"),
    ("POST", "/whep/live"),
    ("PATCH", f"/whep/live/{SESSION}"),
    ("DELETE", f"/whep/live/{SESSION}"),
    ("POST", "/api/streams/live/captions"),
    ("DELETE", "/api/streams/live/captions/en/c1"),
]
READS = [
    "/healthz",
    "/metrics",
    "/api/streams",
    "/api/streams/live",  # 404 until published: the error is readable too
    "/api/clock",
    "/api/sync",
    "/api/streams/live/captions?since=0",
    "/captions/live/en.vtt?start=0&end=10",
    "/captions/live/en/chunk-0.vtt",
    "/captions/live/en/chunk-999999.vtt",  # in the future: 404 + Retry-After
    "/captions/live/en/live.m3u8",
]


@pytest.fixture
async def make_client(tmp_path: Path) -> AsyncIterator[MakeClient]:
    clients: list[Client] = []

    async def make(**flags: str) -> Client:
        settings = load_settings(
            {"data_dir": str(tmp_path / f"data{len(clients)}"), "ice_addresses": "127.0.0.1",
             **flags}
        )
        client: Client = TestClient(TestServer(build_app(settings), host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


def preflight(
    origin: str, method: str, headers: str = "authorization,content-type"
) -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": headers,
    }


async def streams(client: Client) -> list[dict[str, Any]]:
    resp = await client.get("/api/streams")
    body: dict[str, list[dict[str, Any]]] = await resp.json()
    return body["streams"]


async def offer(kind: str) -> tuple[RTCPeerConnection, str]:
    """A real aiortc offer: a publisher (whip) or a viewer (whep)."""
    from sfu_sidecar.relay import aiortc_adapter

    pc = client_pc()
    if kind == "whip":
        pc.addTransceiver(ToneAudio(), direction="sendonly")
        pc.addTransceiver(PatternVideo(), direction="sendonly")
    else:
        pc.addTransceiver("audio", direction="recvonly")
        pc.addTransceiver("video", direction="recvonly")
    aiortc_adapter.install_ice(pc, LOOPBACK, None)
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


# --- default settings: reads open to all, writes to no other origin ----------------------------


@pytest.mark.parametrize("path", READS)
async def test_default_reads_answer_every_origin_with_a_star(
    make_client: MakeClient, path: str
) -> None:
    client = await make_client()
    for origin in (APP, OTHER):
        resp = await client.get(path, headers={"Origin": origin})
        assert resp.status in (200, 404), (path, resp.status)
        assert resp.headers[ACAO] == "*"
        assert resp.headers["Access-Control-Expose-Headers"] == EXPOSED
        assert "Origin" not in resp.headers.get("Vary", "")
        assert "Access-Control-Allow-Credentials" not in resp.headers
    # Without Origin too, so a shared cache never stores a copy a page could not read.
    assert (await client.get(path)).headers[ACAO] == "*"
    head = await client.head(path, headers={"Origin": OTHER})
    assert head.headers[ACAO] == "*"


async def test_caption_files_expose_the_stream_epoch_and_retry_after(
    make_client: MakeClient,
) -> None:
    client = await make_client()
    assert (await client.post("/api/streams/live/captions", json=CAPTIONS)).status == 200
    resp = await client.get("/captions/live/en/chunk-0.vtt", headers={"Origin": OTHER})
    assert resp.status == 200
    assert "X-Stream-Epoch-Ns" in resp.headers
    assert "X-Stream-Epoch-Ns" in resp.headers["Access-Control-Expose-Headers"].split(", ")
    future = await client.get("/captions/live/en/chunk-999999.vtt", headers={"Origin": OTHER})
    assert future.status == 404 and "Retry-After" in future.headers
    assert "Retry-After" in future.headers["Access-Control-Expose-Headers"].split(", ")
    # One place sets them: no duplicated header from the caption routes themselves.
    assert len(resp.headers.getall(ACAO)) == 1


@pytest.mark.parametrize(("method", "path"), WRITES)
async def test_default_refuses_write_preflights_from_any_origin(
    make_client: MakeClient, method: str, path: str
) -> None:
    client = await make_client()
    resp = await client.options(path, headers=preflight(APP, method))
    assert resp.status == 403
    assert ACAO not in resp.headers
    body = await resp.json()
    assert body["error"] == (
        f"origin {APP} may not {method} {path}: it is not in the cors_origins setting"
    )
    assert await streams(client) == []


@pytest.mark.parametrize("path", ["/healthz", "/api/streams", "/captions/live/en/chunk-0.vtt"])
async def test_default_passes_read_preflights(make_client: MakeClient, path: str) -> None:
    client = await make_client()
    resp = await client.options(path, headers=preflight(OTHER, "GET", "authorization"))
    assert resp.status == 204
    assert resp.headers[ACAO] == "*"
    assert resp.headers["Access-Control-Allow-Methods"] == "GET, HEAD, OPTIONS"
    assert resp.headers["Access-Control-Allow-Headers"] == "Authorization, Content-Type, If-Match"


async def test_default_actual_writes_get_no_allow_origin(make_client: MakeClient) -> None:
    client = await make_client()
    # A "simple" cross-origin POST needs no preflight; it still creates nothing (wrong type).
    resp = await client.post(
        "/whip/live", data="v=0", headers={"Origin": APP, "Content-Type": "text/plain"}
    )
    assert resp.status == 415
    assert ACAO not in resp.headers
    resp = await client.post(
        "/api/streams/live/captions", data="x",
        headers={"Origin": APP, "Content-Type": "text/plain"},
    )
    assert resp.status == 415 and ACAO not in resp.headers
    assert await streams(client) == []
    # The service's own page (same origin, Origin sent on every POST) works as before.
    resp = await client.post("/api/streams/live/captions", json=CAPTIONS)
    assert resp.status == 200


async def test_plain_whip_options_keeps_its_link_headers(make_client: MakeClient) -> None:
    client = await make_client(ice_servers="stun:stun.example.org:3478")
    for kind in ("whip", "whep"):
        resp = await client.options(f"/{kind}/live")
        assert resp.status == 204
        assert resp.headers.getall("Link") == ['<stun:stun.example.org:3478>; rel="ice-server"']
        assert resp.headers["Accept-Post"] == "application/sdp"
        assert ACAO not in resp.headers
    # A refused origin's plain OPTIONS is the route's answer, which its page cannot read.
    resp = await client.options("/whip/live", headers={"Origin": OTHER})
    assert resp.status == 204 and ACAO not in resp.headers


async def test_default_refuses_cross_origin_caption_websocket(make_client: MakeClient) -> None:
    client = await make_client()
    with pytest.raises(aiohttp.WSServerHandshakeError) as info:
        await client.ws_connect("/api/streams/live/captions/ws", origin=APP)
    assert info.value.status == 403
    host = f"{client.host}:{client.port}"
    # Same origin, and no Origin (a producer process): open.
    for origin in (f"http://{host}", None):
        ws = await client.ws_connect("/api/streams/live/captions/ws", origin=origin)
        await ws.send_json({"op": "cues", **CAPTIONS})
        assert (await ws.receive_json())["ok"] is True
        await ws.close()
    # The clock join tells only the time: any page may join.
    ws = await client.ws_connect("/api/clock/ws", origin=OTHER)
    await ws.close()


# --- cors_origins = * ----------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), WRITES)
async def test_star_passes_write_preflights_from_any_origin(
    make_client: MakeClient, method: str, path: str
) -> None:
    client = await make_client(cors_origins="*")
    resp = await client.options(path, headers=preflight(OTHER, method))
    assert resp.status == 204
    assert resp.headers[ACAO] == "*"
    assert method in resp.headers["Access-Control-Allow-Methods"].split(", ")
    assert resp.headers["Access-Control-Allow-Headers"] == "Authorization, Content-Type, If-Match"
    assert resp.headers["Access-Control-Max-Age"] == "600"
    assert "Vary" not in resp.headers
    assert "Access-Control-Allow-Credentials" not in resp.headers
    assert await streams(client) == []  # answered at the edge: the route never ran


async def test_star_publish_and_caption_ingest_from_any_origin(make_client: MakeClient) -> None:
    client = await make_client(cors_origins="*")
    pc, sdp = await offer("whip")
    try:
        resp = await client.post(
            "/whip/live", data=sdp, headers={"Origin": OTHER, "Content-Type": "application/sdp"}
        )
        assert resp.status == 201
        assert resp.headers[ACAO] == "*"
        assert "Location" in resp.headers["Access-Control-Expose-Headers"].split(", ")
        resp = await client.delete(resp.headers["Location"], headers={"Origin": OTHER})
        assert resp.status == 200 and resp.headers[ACAO] == "*"
    finally:
        await pc.close()
    resp = await client.post("/api/streams/live/captions", json=CAPTIONS, headers={"Origin": OTHER})
    assert resp.status == 200 and resp.headers[ACAO] == "*"
    ws = await client.ws_connect("/api/streams/live/captions/ws", origin=OTHER)
    await ws.close()


# --- cors_origins = a list -----------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), WRITES)
async def test_list_passes_listed_and_refuses_other_origins(
    make_client: MakeClient, method: str, path: str
) -> None:
    client = await make_client(cors_origins=f"{APP},https://second.example")
    resp = await client.options(path, headers=preflight(APP, method))
    assert resp.status == 204
    assert resp.headers[ACAO] == APP
    assert resp.headers["Vary"] == "Origin"
    expected = (
        "POST, PATCH, DELETE, OPTIONS" if path.startswith("/wh") else "GET, POST, DELETE, OPTIONS"
    )
    assert resp.headers["Access-Control-Allow-Methods"] == expected
    refused = await client.options(path, headers=preflight(OTHER, method))
    assert refused.status == 403 and ACAO not in refused.headers
    assert "not in the cors_origins setting" in (await refused.json())["error"]
    assert await streams(client) == []


@pytest.mark.parametrize("path", READS)
async def test_list_keeps_reads_open_to_every_origin(make_client: MakeClient, path: str) -> None:
    client = await make_client(cors_origins=APP)
    resp = await client.get(path, headers={"Origin": OTHER})
    assert resp.headers[ACAO] == "*"
    assert "Origin" not in resp.headers.get("Vary", "")


@pytest.mark.parametrize("kind", ["whip", "whep"])
async def test_list_session_lifecycle_from_a_listed_origin(
    make_client: MakeClient, kind: str
) -> None:
    token = "pub-token" if kind == "whip" else "view-token"
    client = await make_client(
        cors_origins=APP, publish_token="pub-token", view_token="view-token",
        ice_servers="stun:stun.example.org:3478",
    )
    auth = {"Origin": APP, "Authorization": f"Bearer {token}"}
    # Errors are readable by the page too: it learns why it was refused.
    resp = await client.post(f"/{kind}/live", data="v=0", headers={
        "Origin": APP, "Content-Type": "application/sdp"})
    assert resp.status == 401 and resp.headers[ACAO] == APP
    pc, sdp = await offer(kind)
    try:
        resp = await client.post(
            f"/{kind}/live", data=sdp, headers={**auth, "Content-Type": "application/sdp"}
        )
        assert resp.status == 201, await resp.text()
        assert resp.headers[ACAO] == APP
        assert resp.headers["Vary"] == "Origin"
        assert resp.headers["Access-Control-Expose-Headers"] == EXPOSED
        assert "Access-Control-Allow-Credentials" not in resp.headers
        for name in ("Location", "ETag", "Link"):
            assert name in resp.headers
        location = resp.headers["Location"]
        resp = await client.patch(location, data="a=end-of-candidates\r\n", headers={
            **auth, "Content-Type": "application/trickle-ice-sdpfrag",
            "If-Match": resp.headers["ETag"]})
        assert resp.status == 204 and resp.headers[ACAO] == APP
        # An actual OPTIONS (after its own preflight) gets the Link headers, readable.
        resp = await client.options(f"/{kind}/live", headers=auth)
        assert resp.status == 204 and resp.headers[ACAO] == APP
        assert resp.headers.getall("Link") == ['<stun:stun.example.org:3478>; rel="ice-server"']
        resp = await client.delete(location, headers=auth)
        assert resp.status == 200 and resp.headers[ACAO] == APP
    finally:
        await pc.close()
    assert await streams(client) == []


async def test_list_caption_ingest_and_retraction(make_client: MakeClient) -> None:
    client = await make_client(cors_origins=APP, publish_token="pub-token")
    auth = {"Origin": APP, "Authorization": "Bearer pub-token"}
    resp = await client.post("/api/streams/live/captions", json=CAPTIONS, headers=auth)
    assert resp.status == 200 and resp.headers[ACAO] == APP and resp.headers["Vary"] == "Origin"
    resp = await client.delete("/api/streams/live/captions/en/c1", headers=auth)
    assert resp.status == 200 and resp.headers[ACAO] == APP
    assert (await resp.json())["retracted"] is True
    other = await client.post(
        "/api/streams/live/captions", json=CAPTIONS, headers={**auth, "Origin": OTHER}
    )
    assert ACAO not in other.headers
    with pytest.raises(aiohttp.WSServerHandshakeError) as info:
        await client.ws_connect("/api/streams/live/captions/ws", origin=OTHER, headers=auth)
    assert info.value.status == 403
    ws = await client.ws_connect("/api/streams/live/captions/ws", origin=APP, headers=auth)
    await ws.close()


class VaryingRoute:
    """A component whose route sets its own Vary, as a compressing or negotiating one would."""

    name = "varying"

    def add_routes(self, app: web.Application) -> None:
        async def negotiated(request: web.Request) -> web.Response:
            return web.Response(text="ok", headers={"Vary": "Accept-Encoding"})

        app.router.add_post("/test/negotiated", negotiated)

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


async def test_vary_joins_a_header_the_route_set(tmp_path: Path) -> None:
    settings = load_settings({"data_dir": str(tmp_path), "cors_origins": APP})
    app = build_app(settings, Components(Metrics()))
    VaryingRoute().add_routes(app)
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/test/negotiated", headers={"Origin": APP})
        assert resp.status == 200
        assert resp.headers[ACAO] == APP
        assert resp.headers.getall("Vary") == ["Accept-Encoding, Origin"]


# --- secrets: never logged, compared in constant time --------------------------------------------


async def test_request_log_masks_secret_query_values(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    from sfu_sidecar import logs

    client = await make_client(view_token="view-secret-1")
    logger = logs.get("http")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)  # whether or not the sfu_sidecar tree propagates to the root
    try:
        with caplog.at_level("INFO", logger=logger.name):
            assert (await client.get("/?stream=live&token=view-secret-1")).status == 200
            await client.get("/captions/live/en.vtt?start=0&end=1&access_token=view-secret-1")
            await client.get("/healthz?Api%20Key=view-secret-1&x&note=a%0Ab")
    finally:
        logger.removeHandler(handler)
    lines = [r.getMessage() for r in records]
    assert len(lines) == 3
    assert not any("view-secret-1" in line for line in lines)
    assert lines[0].startswith("GET /?stream=live&token=*** 200")
    assert "start=0&end=1&access_token=***" in lines[1]
    assert "Api%20Key=***&x&note=a%0Ab 200" in lines[2]  # as sent: no value breaks a line


def test_tokens_match_only_the_same_token_of_any_length() -> None:
    from sfu_sidecar.httpapi import tokens_match

    assert tokens_match("s3cret", "s3cret")
    for other in ("", "s3cre", "s3cret!", "S3cret", "s3cret" * 100, "\udcff"):
        assert not tokens_match(other, "s3cret")
