"""WHIP/WHEP HTTP edges: created resources, trickle, teardown, and every refusal's status."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time

from aiortc import RTCSessionDescription

from sfu_sidecar.relay import aiortc_adapter
from tests.conftest import free_port
from tests.relay.conftest import Relay
from tests.relay.peers import (
    LOOPBACK,
    PatternVideo,
    client_pc,
    frames,
    publish,
    view,
    wait_for,
)

SDP = {"Content-Type": "application/sdp"}


async def _offer(kind: str = "video", direction: str = "sendonly") -> str:
    pc = client_pc()
    pc.addTransceiver(kind, direction=direction)
    aiortc_adapter.install_ice(pc, LOOPBACK, None)
    await pc.setLocalDescription(await pc.createOffer())
    sdp = str(pc.localDescription.sdp)
    await pc.close()
    return sdp


async def _post(relay: Relay, path: str, body: str | bytes, headers: dict[str, str]) -> tuple[
    int, dict[str, object], dict[str, str]
]:
    async with relay.http.post(relay.base + path, data=body, headers=headers) as resp:
        data = await resp.json() if resp.content_type == "application/json" else {}
        return resp.status, data, dict(resp.headers)


async def test_publish_answers_201_with_location_etag_and_ice_server_links(relay_factory) -> None:
    relay: Relay = await relay_factory(
        ice_servers="stun:127.0.0.1:3478,turn:u:p@127.0.0.1:3478?transport=udp"
    )
    offer = await _offer()
    async with relay.http.post(relay.base + "/whip/cam", data=offer, headers=SDP) as resp:
        assert resp.status == 201
        assert resp.content_type == "application/sdp"
        location = resp.headers["Location"]
        assert location.startswith("/whip/cam/")
        assert resp.headers["ETag"].startswith('"')
        links = resp.headers.getall("Link")
        answer = await resp.text()
    assert answer.startswith("v=0")
    assert "a=candidate:" in answer and " 127.0.0.1 " in answer
    assert links == [
        '<stun:127.0.0.1:3478>; rel="ice-server"',
        '<turn:127.0.0.1:3478?transport=udp>; rel="ice-server"; username="u"; '
        'credential="p"; credential-type="password"',
    ]
    async with relay.http.options(relay.base + "/whip/cam") as resp:
        assert resp.status == 204
        assert len(resp.headers.getall("Link")) == 2
    async with relay.http.delete(relay.base + location) as resp:
        assert resp.status == 200
    async with relay.http.delete(relay.base + location) as resp:
        assert resp.status == 404


async def test_ice_port_range_and_turn_secrets_follow_settings(relay_factory) -> None:
    low = free_port(kind=2)  # SOCK_DGRAM
    relay: Relay = await relay_factory(
        ice_port_range=f"{low}-{low + 5}", publish_token="pub",
        ice_servers="turn:user:secret@127.0.0.1:3478",
    )
    headers = {**SDP, "Authorization": "Bearer pub"}
    status, _, resp_headers = await _post(relay, "/whip/p", await _offer(), headers)
    assert status == 201
    async with relay.http.delete(relay.base + resp_headers["Location"],
                                 headers={"Authorization": "Bearer pub"}) as resp:
        assert resp.status == 200
    async with relay.http.post(relay.base + "/whip/p", data=await _offer(),
                               headers=headers) as resp:
        answer = await resp.text()
    ports = [int(line.split()[5]) for line in answer.splitlines()
             if line.startswith("a=candidate:")]
    assert ports and all(low <= p <= low + 5 for p in ports)
    # TURN credentials only go to callers holding the token.
    async with relay.http.options(relay.base + "/whip/p") as resp:
        assert resp.status == 204 and "Link" not in resp.headers
    async with relay.http.options(relay.base + "/whip/p",
                                  headers={"Authorization": "Bearer pub"}) as resp:
        assert 'credential="secret"' in resp.headers["Link"]
    async with relay.http.options(relay.base + "/whip/p",
                                  headers={"Authorization": "Bearer bad"}) as resp:
        assert resp.status == 401


async def test_tokens_are_required_when_configured(relay_factory) -> None:
    relay: Relay = await relay_factory(publish_token="pub-secret", view_token="view-secret")
    offer = await _offer()
    status, body, headers = await _post(relay, "/whip/s", offer, SDP)
    assert status == 401 and "Bearer" in headers["WWW-Authenticate"]
    status, body, _ = await _post(relay, "/whip/s", offer, {**SDP, "Authorization": "Bearer no"})
    assert status == 401 and "wrong token" in str(body["error"])
    # The view token does not open publishing, and the other way round.
    status, _, _ = await _post(
        relay, "/whip/s", offer, {**SDP, "Authorization": "Bearer view-secret"}
    )
    assert status == 401
    view_offer = await _offer(direction="recvonly")
    status, _, _ = await _post(
        relay, "/whep/s", view_offer, {**SDP, "Authorization": "Bearer pub-secret"}
    )
    assert status == 401
    status, _, headers = await _post(
        relay, "/whep/s", view_offer, {**SDP, "Authorization": "Bearer view-secret"}
    )
    assert status == 201
    # Teardown needs the token too.
    async with relay.http.delete(relay.base + headers["Location"]) as resp:
        assert resp.status == 401
    async with relay.http.delete(
        relay.base + headers["Location"], headers={"Authorization": "Bearer view-secret"}
    ) as resp:
        assert resp.status == 200


async def test_bad_requests_get_specific_statuses(relay_factory) -> None:
    relay: Relay = await relay_factory(max_body_bytes="4096")
    offer = await _offer()
    status, body, _ = await _post(relay, "/whip/s", offer, {"Content-Type": "text/plain"})
    assert status == 415 and "application/sdp" in str(body["error"])
    status, body, _ = await _post(relay, "/whip/s", "hello, not sdp", SDP)
    assert status == 400
    status, body, _ = await _post(relay, "/whip/s", "v=0\r\ns=-\r\n", SDP)
    assert status == 400 and "no audio or video" in str(body["error"])
    status, body, _ = await _post(relay, "/whip/s", b"\xff\xfe" * 10, SDP)
    assert status == 400
    status, body, _ = await _post(relay, "/whip/s", "v=0\r\n" + "a=x\r\n" * 2000, SDP)
    assert status == 413
    # Only codecs we cannot forward: 406 naming the ones we accept.
    unforwardable = (offer.replace("VP8/90000", "AV1/90000").replace("VP9/90000", "AV1/90000")
                     .replace("H264/90000", "H265/90000"))
    status, body, _ = await _post(relay, "/whip/s", unforwardable, SDP)
    assert status == 406 and "VP8" in str(body["error"]) and "Opus" in str(body["error"])
    # A viewer offer sent to WHIP (recvonly) is refused, and the stream slot stays free.
    status, body, _ = await _post(relay, "/whip/s", await _offer(direction="recvonly"), SDP)
    assert status == 400 and "must send" in str(body["error"])
    assert relay.service.streams.by_name == {}


async def test_unknown_resources_are_404(relay: Relay) -> None:
    missing = "/whip/s/" + "0" * 32
    for method in ("DELETE", "PATCH"):
        async with relay.http.request(
            method, relay.base + missing,
            headers={"Content-Type": "application/trickle-ice-sdpfrag"},
        ) as resp:
            assert resp.status == 404
            assert "error" in await resp.json()
    async with relay.http.get(relay.base + "/api/streams/nope") as resp:
        assert resp.status == 404


async def test_second_publisher_conflicts_until_the_first_is_gone(relay: Relay) -> None:
    first = await publish(relay.http, relay.base, "one", video=PatternVideo())
    try:
        status, body, _ = await _post(relay, "/whip/one", await _offer(), SDP)
        assert status == 409 and "already has a publisher" in str(body["error"])
    finally:
        async with relay.http.delete(relay.base + first.location) as resp:
            assert resp.status == 200
        await first.close()
    second = await publish(relay.http, relay.base, "one", video=PatternVideo())
    await second.close()


async def test_publisher_that_vanishes_is_replaced_after_the_timeout(relay_factory) -> None:
    relay: Relay = await relay_factory(publisher_timeout_s="1")
    first = await publish(relay.http, relay.base, "drop", video=PatternVideo())
    watcher = await view(relay.http, relay.base, "drop", kinds=("video",))
    await frames(watcher.tracks["video"], 5, limit_s=10)
    # Vanish without DELETE: stop sending media (a crashed encoder, a pulled cable).
    for transceiver in first.pc.getTransceivers():
        await transceiver.sender.stop()
    stream = relay.service.streams.get("drop")
    for _ in range(100):
        if stream.publisher is None:
            break
        await asyncio.sleep(0.05)
    assert stream.publisher is None
    second = await publish(relay.http, relay.base, "drop", video=PatternVideo())
    await frames(watcher.tracks["video"], 5, limit_s=10)
    await second.close()
    await first.close()
    await watcher.close()


async def test_trickle_patch_adds_candidates_and_refuses_ice_restart(relay: Relay) -> None:
    pc = client_pc()
    pc.addTransceiver(PatternVideo(), direction="sendonly")
    aiortc_adapter.install_ice(pc, LOOPBACK, None)
    await pc.setLocalDescription(await pc.createOffer())
    full = str(pc.localDescription.sdp)
    candidates = [line for line in full.split("\r\n") if line.startswith("a=candidate:")]
    without = "\r\n".join(line for line in full.split("\r\n")
                          if not line.startswith(("a=candidate:", "a=end-of-candidates")))
    ufrag = next(line for line in full.split("\r\n") if line.startswith("a=ice-ufrag:"))
    pwd = next(line for line in full.split("\r\n") if line.startswith("a=ice-pwd:"))
    async with relay.http.post(relay.base + "/whip/t", data=without, headers=SDP) as resp:
        assert resp.status == 201
        location = resp.headers["Location"]
        answer = await resp.text()
    frag_headers = {"Content-Type": "application/trickle-ice-sdpfrag"}
    mdns = "a=candidate:1 1 udp 2122260223 0b6c0c1a-aaaa.local 50000 typ host"
    frag = "\r\n".join([ufrag, pwd, "m=video 9 UDP/TLS/RTP/SAVPF 0", "a=mid:0",
                        *candidates, mdns, "a=end-of-candidates", ""])
    async with relay.http.patch(relay.base + location, data=frag, headers=frag_headers) as resp:
        assert resp.status == 204
    session = relay.service.streams.get("t").publisher
    assert session is not None
    ice = session.pc.getTransceivers()[0].receiver.transport.transport
    remote = {(c.ip, c.port) for c in ice.getRemoteCandidates()}
    assert {(c.split()[4], int(c.split()[5])) for c in candidates} <= remote
    assert not any(ip.endswith(".local") for ip, _ in remote)
    async with relay.http.patch(relay.base + location, data=frag,
                                headers={"Content-Type": "application/sdp"}) as resp:
        assert resp.status == 415
    restart = frag.replace(ufrag, "a=ice-ufrag:zzzz")
    async with relay.http.patch(relay.base + location, data=restart,
                                headers=frag_headers) as resp:
        assert resp.status == 422
    # With the answer applied the publisher connects and media reaches the relay.
    await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
    stream = relay.service.streams.get("t")
    await wait_for(
        lambda: stream.forwarders["video"].packets_in > 0, 10, "media from the trickled publisher"
    )
    async with relay.http.delete(relay.base + location) as resp:
        assert resp.status == 200
    await pc.close()


async def test_status_api_and_metrics_describe_streams(relay: Relay) -> None:
    pub = await publish(relay.http, relay.base, "st", video=PatternVideo())
    v = await view(relay.http, relay.base, "st", kinds=("video",))
    try:
        await frames(v.tracks["video"], 10, limit_s=10)
        async with relay.http.get(relay.base + "/api/streams") as resp:
            listing = await resp.json()
        assert [s["stream"] for s in listing["streams"]] == ["st"]
        async with relay.http.get(relay.base + "/api/streams/st") as resp:
            st = await resp.json()
        track = st["publisher"]["tracks"][0]
        assert track["kind"] == "video" and track["codec"] == "vp8"
        assert track["packets"] > 0 and isinstance(track["ssrc"], int)
        viewer = st["viewers"][0]
        assert viewer["state"] == "connected"
        assert viewer["tracks"][0]["packets_sent"] > 0
        assert {"nacks_received", "retransmitted", "plis_forwarded"} <= set(viewer["tracks"][0])
        # The adapter registers abs-capture-time with aiortc, so this viewer negotiated it (a
        # far end that does not is shown as False: tests/relay/test_push_whip_server.py).
        assert viewer["tracks"][0]["abs_capture_time"] is True
        # Garbage that got past SRTP (a buggy peer) is counted, never raised.
        session = relay.service.streams.get("st").publisher
        assert session is not None
        session._on_rtp(b"\x00garbage", 0)
        session._on_rtp(bytes.fromhex("80ff00010000000000000001") + b"x", 0)
        session._on_rtcp(b"\x80\xc8\x00\x09")
        viewer_session = next(iter(relay.service.streams.get("st").viewers.values()))
        viewer_session._on_rtcp(b"\x80\xcd\x00\x01\x00")
        assert (session.counters.parse_errors, session.counters.unknown_payload) == (1, 1)
        assert session.counters.rtcp_errors == 1 and viewer_session.counters.rtcp_errors == 1
        text = relay.service.metrics.render().decode()
        assert 'sfu_sidecar_relay_packets_received_total{kind="video",stream="st"}' in text
        assert 'sfu_sidecar_relay_viewers{stream="st"} 1.0' in text
        assert 'sfu_sidecar_relay_bad_packets_total{reason="rtp",stream="st"} 1.0' in text
    finally:
        await v.close()
        await pub.close()


def _limited(relay: Relay, limit: str) -> float:
    text = relay.service.metrics.render().decode()
    prefix = f'sfu_sidecar_requests_limited_total{{limit="{limit}"}} '
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(lines[0].removeprefix(prefix)) if lines else 0.0


async def test_viewer_limits_refuse_with_retry_after_and_spare_the_viewers_already_there(
    relay_factory,
) -> None:
    relay: Relay = await relay_factory(max_viewers_per_stream="1", max_viewers="2")
    pub = await publish(relay.http, relay.base, "full", video=PatternVideo())
    first = await view(relay.http, relay.base, "full", kinds=("video",))
    try:
        await frames(first.tracks["video"], 5, limit_s=10)
        viewer_offer = await _offer(direction="recvonly")
        for _ in range(5):
            status, body, headers = await _post(relay, "/whep/full", viewer_offer, SDP)
            assert status == 429, body
            assert "max_viewers_per_stream" in str(body["error"])
            assert int(headers["Retry-After"]) >= 1
        status, _, other = await _post(relay, "/whep/other", viewer_offer, SDP)
        assert status == 201
        status, body, headers = await _post(relay, "/whep/third", viewer_offer, SDP)
        assert status == 503 and "max_viewers" in str(body["error"])
        assert int(headers["Retry-After"]) >= 1
        assert _limited(relay, "max_viewers_per_stream") == 5
        assert _limited(relay, "max_viewers") == 1
        # The refusals cost the viewer already there nothing: its frames keep coming.
        await frames(first.tracks["video"], 10, limit_s=10)
        assert len(relay.service.streams.get("full").viewers) == 1
        # A slot that frees is taken again.
        async with relay.http.delete(relay.base + other["Location"]) as resp:
            assert resp.status == 200
        status, _, _ = await _post(relay, "/whep/third", viewer_offer, SDP)
        assert status == 201
    finally:
        await first.close()
        await pub.close()


async def test_sessions_per_client_count_publishers_and_viewers(relay_factory) -> None:
    relay: Relay = await relay_factory(max_sessions_per_client="2")
    status, _, published = await _post(relay, "/whip/mine", await _offer(), SDP)
    assert status == 201
    viewer_offer = await _offer(direction="recvonly")
    status, _, viewing = await _post(relay, "/whep/mine", viewer_offer, SDP)
    assert status == 201
    for path, offer in (("/whep/yours", viewer_offer), ("/whip/yours", await _offer())):
        status, body, headers = await _post(relay, path, offer, SDP)
        assert status == 429 and "max_sessions_per_client" in str(body["error"])
        assert "Retry-After" in headers
    async with relay.http.delete(relay.base + viewing["Location"]) as resp:
        assert resp.status == 200
    status, _, _ = await _post(relay, "/whep/yours", viewer_offer, SDP)
    assert status == 201
    async with relay.http.delete(relay.base + published["Location"]) as resp:
        assert resp.status == 200


async def test_sdp_size_and_line_limits_name_their_settings(relay_factory) -> None:
    offer = await _offer()
    size, lines = len(offer.encode()) + 200, len(offer.splitlines()) + 5
    relay: Relay = await relay_factory(max_sdp_bytes=str(size), max_sdp_lines=str(lines))
    padded = offer + "a=x-pad:" + "p" * 300 + "\r\n"
    status, body, _ = await _post(relay, "/whip/s", padded, SDP)
    assert status == 413 and "max_sdp_bytes" in str(body["error"])
    long = offer + "a=x-pad\r\n" * 6
    status, body, _ = await _post(relay, "/whip/s", long, SDP)
    assert status == 400 and "max_sdp_lines" in str(body["error"])
    status, _, headers = await _post(relay, "/whip/s", offer, SDP)
    assert status == 201
    trickle = "a=ice-ufrag:x\r\na=ice-pwd:y\r\n" + "a=end-of-candidates\r\n" * lines
    async with relay.http.patch(
        relay.base + headers["Location"], data=trickle,
        headers={"Content-Type": "application/trickle-ice-sdpfrag"},
    ) as resp:
        assert resp.status == 400
        assert "max_sdp_lines" in (await resp.json())["error"]
    assert relay.service.streams.get("s").publisher is not None
    async with relay.http.delete(relay.base + headers["Location"]) as resp:
        assert resp.status == 200


async def test_publishing_without_a_token_is_refused_from_other_hosts(relay_factory) -> None:
    relay: Relay = await relay_factory(ice_servers="turn:u:secret@127.0.0.1:3478")
    # Through a proxy the connection is loopback, but the client is not this host.
    proxied = {**SDP, "X-Forwarded-For": "203.0.113.9"}
    status, body, _ = await _post(relay, "/whip/s", await _offer(), proxied)
    assert status == 403
    assert "publish_token" in str(body["error"]) and "open_ingest" in str(body["error"])
    assert relay.service.streams.by_name == {}
    async with relay.http.options(relay.base + "/whip/s", headers=proxied) as resp:
        assert resp.status == 204 and "Link" not in resp.headers
    # Viewing needs no token, from anywhere.
    status, _, _ = await _post(relay, "/whep/s", await _offer(direction="recvonly"), proxied)
    assert status == 201
    # This host itself publishes without one (the demo, a local encoder).
    status, _, headers = await _post(relay, "/whip/s", await _offer(), SDP)
    assert status == 201
    async with relay.http.delete(relay.base + headers["Location"], headers=proxied) as resp:
        assert resp.status == 403


async def test_open_ingest_lets_anyone_publish_without_a_token(relay_factory) -> None:
    relay: Relay = await relay_factory(open_ingest="true")
    proxied = {**SDP, "Forwarded": "for=203.0.113.9"}
    status, _, headers = await _post(relay, "/whip/s", await _offer(), proxied)
    assert status == 201
    async with relay.http.delete(relay.base + headers["Location"], headers=proxied) as resp:
        assert resp.status == 200


async def test_new_viewers_are_refused_while_the_process_is_over_its_cpu_limit(
    relay_factory,
) -> None:
    """Real load on the server's process (threads hashing beside its event loop): past
    max_cpu_percent a new viewer gets 503 naming the setting, the viewer already there keeps
    its frames, and once the load is gone viewers are admitted again.

    The load is two threads hashing large buffers, which release the GIL: with the other cores
    busy (another test's browser, a busy loop) the process still gets its share of the machine,
    which one Python thread contending with the event loop for the GIL does not."""
    relay: Relay = await relay_factory(max_cpu_percent="60")
    pub = await publish(relay.http, relay.base, "busy", video=PatternVideo())
    first = await view(relay.http, relay.base, "busy", kinds=("video",))
    stop = threading.Event()
    block = bytes(1 << 20)

    def spin() -> None:
        deadline = time.monotonic() + 40  # bounded even if the test fails before stop.set()
        while not stop.is_set() and time.monotonic() < deadline:
            hashlib.sha256(block).digest()

    burners = [threading.Thread(target=spin, daemon=True) for _ in range(2)]
    try:
        await frames(first.tracks["video"], 5, limit_s=10)
        viewer_offer = await _offer(direction="recvonly")
        for burner in burners:
            burner.start()
        await wait_for(lambda: (relay.service.cpu.percent() or 0) > 60, 10, "load above 60%")
        status, body, headers = await _post(relay, "/whep/busy", viewer_offer, SDP)
        assert status == 503, body
        assert "max_cpu_percent" in str(body["error"])
        assert int(headers["Retry-After"]) >= 1
        assert _limited(relay, "max_cpu_percent") == 1
        await frames(first.tracks["video"], 10, limit_s=10)
        stop.set()
        await wait_for(lambda: (relay.service.cpu.percent() or 100) < 60, 15, "load below 60%")
        status, body, _ = await _post(relay, "/whep/busy", viewer_offer, SDP)
        assert status == 201, body
    finally:
        stop.set()
        await first.close()
        await pub.close()
