"""RTP feeds: a stream sent as plain RTP to UDP sockets of the test, checked against what the
sidecar's sync channel says of the same frames.

An aiortc publisher (WHIP) and an aiortc WHEP viewer with a ``sync`` channel share the stream
with the feed; the viewer's frame records are the capture times the feed's sender reports and
abs-capture-time values must agree with. Everything is on 127.0.0.0/8.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
import time
from collections import Counter
from typing import Any, cast

import aiohttp
import pytest

from sfu_sidecar.ntptime import ntp_to_unix_ns
from sfu_sidecar.relay import RelayService, rtcp
from sfu_sidecar.relay.feed import ABS_CAPTURE_TIME_ID, parse_feed_request
from sfu_sidecar.relay.packet import RtpPacket, is_keyframe_start
from sfu_sidecar.relay.tap import is_rtcp
from sfu_sidecar.sync.abscapture import AbsCaptureTime
from sfu_sidecar.sync.wire import AnchorRecord
from tests.relay.conftest import Relay
from tests.relay.peers import (
    Peer,
    mid_of,
    received_ssrc,
    view,
    wait_for,
)
from tests.sync.records import ViewerRecords
from tests.syncchannel.test_service import start_publisher

MASK32 = 0xFFFFFFFF
RATES = {"video": 90000, "audio": 48000}


class Socket(asyncio.DatagramProtocol):
    """A UDP socket of the test on 127.0.0.x that keeps every datagram with its arrival."""

    def __init__(self) -> None:
        self.datagrams: list[tuple[bytes, int]] = []
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.datagrams.append((data, time.time_ns()))

    @property
    def port(self) -> int:
        assert self.transport is not None
        return int(self.transport.get_extra_info("sockname")[1])

    def send(self, data: bytes, port: int) -> None:
        assert self.transport is not None
        self.transport.sendto(data, ("127.0.0.1", port))

    def rtp(self) -> list[RtpPacket]:
        return [RtpPacket.parse(d) for d, _ in self.datagrams if not is_rtcp(d)]

    def sender_reports(self) -> list[tuple[rtcp.SenderReportPacket, int]]:
        return [(m, at) for d, at in self.datagrams if is_rtcp(d)
                for m in rtcp.parse_compound(d) if isinstance(m, rtcp.SenderReportPacket)]

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def bound(host: str = "127.0.0.1") -> Socket:
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_datagram_endpoint(Socket, local_addr=(host, 0))
    return protocol


async def create_feed(http: aiohttp.ClientSession, base: str, body: Any,
                      token: str | None = None) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with http.post(f"{base}/api/feeds", json=body, headers=headers) as resp:
        return resp.status, await resp.json()


def receiver_report(sender_ssrc: int, media_ssrc: int, fraction_lost: int) -> bytes:
    """An RTCP RR with one report block (RFC 3550 §6.4.2), as a receiver sends it."""
    block = struct.pack("!IB3sIIII", media_ssrc, fraction_lost, b"\x00\x00\x01", 1000, 7, 0, 0)
    return struct.pack("!BBHI", 0x81, 201, 7, sender_ssrc) + block


def ts_delta(viewer: Peer, kind: str, fed: list[RtpPacket]) -> int:
    """WHEP viewer RTP time minus feed RTP time, found from packets with the same payload
    (both are copies of one publisher packet, and the relay never touches payloads)."""
    ssrc = received_ssrc(viewer, kind)
    seen: dict[bytes, list[int]] = {}
    for p in viewer.received:
        if p.ssrc == ssrc:
            seen.setdefault(p.payload, []).append(p.timestamp)
    deltas = Counter((ts[0] - p.timestamp) & MASK32 for p in fed
                     if len(ts := seen.get(p.payload, [])) == 1)
    assert deltas, f"no {kind} payload seen by both the feed and the viewer"
    delta, count = deltas.most_common(1)[0]
    assert count >= 0.9 * sum(deltas.values()), deltas.most_common(3)
    return delta


# --- the API ------------------------------------------------------------------------------

VIDEO = {"kind": "video", "rtp_port": 5004}


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ([], "JSON object"),
        ({"host": "127.0.0.1", "media": [VIDEO]}, "stream"),
        ({"stream": "s", "media": [VIDEO]}, "host"),
        ({"stream": "s", "host": "janus.example", "media": [VIDEO]}, "not an IP address"),
        ({"stream": "s", "host": "0.0.0.0", "media": [VIDEO]}, "unicast"),
        ({"stream": "s", "host": "127.0.0.1", "media": []}, "media"),
        ({"stream": "s", "host": "127.0.0.1", "media": [VIDEO], "x": 1}, "unknown field"),
        ({"stream": "s", "host": "127.0.0.1", "media": [{"kind": "data", "rtp_port": 1}]},
         "kind"),
        ({"stream": "s", "host": "127.0.0.1", "media": [{"kind": "video"}]}, "rtp_port"),
        ({"stream": "s", "host": "127.0.0.1", "media": [{"kind": "video", "rtp_port": 70000}]},
         "between 1 and 65535"),
        ({"stream": "s", "host": "127.0.0.1", "media": [{**VIDEO, "rtcp_port": "5005"}]},
         "integer"),
        ({"stream": "s", "host": "127.0.0.1", "media": [{**VIDEO, "payload_type": 72}]},
         "between 96 and 127"),
        ({"stream": "s", "host": "127.0.0.1", "media": [{**VIDEO, "ssrc": -1}]}, "ssrc"),
        ({"stream": "s", "host": "127.0.0.1", "media": [VIDEO, VIDEO]}, "one audio"),
        ({"stream": "s", "host": "127.0.0.1", "media": [VIDEO], "extensions": "yes"},
         "true or false"),
    ],
)
async def test_bad_feed_requests_get_400_with_the_reason(
    relay: Relay, body: Any, reason: str
) -> None:
    status, answer = await create_feed(relay.http, relay.base, body)
    assert status == 400, answer
    assert reason in answer["error"]
    assert relay.service.streams.by_name == {}


async def test_feed_api_refusals(relay_factory: Any) -> None:
    relay = await relay_factory(host="127.0.0.1", publish_token="pub")
    http, base = relay.http, relay.base
    body = {"stream": "s", "host": "127.0.0.1", "media": [VIDEO]}
    status, answer = await create_feed(http, base, body)
    assert status == 401 and "Bearer" in answer["error"]
    status, answer = await create_feed(http, base, body, token="pub")
    assert status == 404 and "no stream s" in answer["error"]
    # A stream with audio only (a tap says so before any packet): no video to feed.
    async with http.post(f"{base}/api/taps", headers={"Authorization": "Bearer pub"}, json={
            "stream": "s", "media": [{"kind": "audio", "codec": "opus",
                                      "payload_type": 111}]}) as resp:
        assert resp.status == 201
    status, answer = await create_feed(http, base, body, token="pub")
    assert status == 409 and "no video track" in answer["error"]
    status, feed = await create_feed(
        http, base, {**body, "media": [{"kind": "audio", "rtp_port": 5004}]}, token="pub")
    assert status == 201, feed
    assert feed["media"][0]["payload_type"] == 111  # the stream's, when none is asked for
    assert feed["media"][0]["rtcp_port"] == 5004  # multiplexed when no RTCP port is given
    async with http.delete(f"{base}{feed['location']}") as resp:
        assert resp.status == 401
    async with http.delete(f"{base}/whep/s/{feed['id']}") as resp:
        assert resp.status == 404  # a feed is no WHEP resource
    async with http.get(f"{base}/api/feeds/{'0' * 32}") as resp:
        assert resp.status == 404 and "no feed" in (await resp.json())["error"]
    async with http.delete(f"{base}{feed['location']}",
                           headers={"Authorization": "Bearer pub"}) as resp:
        assert resp.status == 200 and (await resp.json())["ended"] == "deleted"
    async with http.get(f"{base}/api/feeds") as resp:
        assert (await resp.json())["feeds"] == []


def test_parse_feed_request_normalises_the_host() -> None:
    request = parse_feed_request({"stream": "s", "host": "::ffff:127.0.0.1",
                                  "media": [VIDEO], "extensions": True})
    assert request.host == "127.0.0.1" and request.extensions
    assert request.media[0].rtcp_port is None and request.media[0].payload_type is None


# --- a feed to sockets of the test --------------------------------------------------------


async def test_feed_sends_rewritten_rtp_with_capture_time_reports_and_answers_feedback(
    app_base: tuple[str, RelayService],
) -> None:
    base, relay = app_base
    video_rtp, video_rtcp, audio_rtp, plain = [await bound() for _ in range(4)]
    stranger = await bound("127.0.0.2")
    sockets = (video_rtp, video_rtcp, audio_rtp, plain, stranger)
    async with aiohttp.ClientSession() as http:
        # A publisher that stamps its capture times and joins the house clock: its capture
        # times are exact (after the join lands), so the copies carry abs-capture-time.
        publisher, _, _ = await start_publisher(base, "fed", stamp=True)
        viewer = await view(http, base, "fed", data_channel="sync", decode=False)
        records = ViewerRecords()
        anchors: dict[int, list[tuple[int, AnchorRecord]]] = {}

        def on_message(data: bytes) -> None:
            records.feed(data)
            at = time.time_ns()
            for track, anchor in records.current.items():
                seen = anchors.setdefault(track, [])
                if not seen or seen[-1][1] is not anchor:
                    seen.append((at, anchor))

        viewer.channel.on("message", on_message)
        try:
            await wait_for(lambda: set(relay.streams.get("fed").codecs) == {"audio", "video"},
                           20, "the publisher's tracks")
            status, feed = await create_feed(http, base, {
                "stream": "fed", "host": "127.0.0.1", "extensions": True, "media": [
                    {"kind": "video", "rtp_port": video_rtp.port,
                     "rtcp_port": video_rtcp.port, "payload_type": 100},
                    # No RTCP port: reports come multiplexed on the RTP port.
                    {"kind": "audio", "rtp_port": audio_rtp.port, "payload_type": 109},
                ]})
            assert status == 201, feed
            video, audio = feed["media"]
            assert video["abs_capture_time_id"] == ABS_CAPTURE_TIME_ID
            # A second feed, without header extensions, for receivers that refuse them.
            status, bare = await create_feed(http, base, {
                "stream": "fed", "host": "127.0.0.1",
                "media": [{"kind": "audio", "rtp_port": plain.port}]})
            assert status == 201, bare
            await wait_for(lambda: len(video_rtcp.sender_reports()) >= 6, 20,
                           "six video sender reports")
            await wait_for(lambda: len(audio_rtp.sender_reports()) >= 6, 10,
                           "six audio sender reports")
            await wait_for(lambda: len(plain.rtp()) >= 50, 10, "the second feed's audio")

            # RTP: the feed's SSRC and payload type, sequence numbers without a gap, video
            # from a keyframe on (asked of the publisher when the feed joined).
            packets = {"video": video_rtp.rtp(), "audio": [
                p for p in audio_rtp.rtp() if p.ssrc == audio["ssrc"]]}
            for kind, answer, pt in (("video", video, 100), ("audio", audio, 109)):
                got = packets[kind]
                assert {(p.ssrc, p.payload_type) for p in got} == {(answer["ssrc"], pt)}
                steps = {(b.sequence_number - a.sequence_number) & 0xFFFF
                         for a, b in itertools.pairwise(got)}
                assert steps == {1}, (kind, steps)
            assert is_keyframe_start("vp8", packets["video"][0].payload)
            frames = {p.timestamp for p in packets["video"]}
            assert len(frames) >= 60, len(frames)
            for p in plain.rtp():
                assert p.extensions == () and p.payload_type == bare["media"][0]["payload_type"]

            # abs-capture-time in every fed packet of a frame whose capture time is exact is
            # the capture time the sync channel reports for the same frame; a frame whose
            # capture time is estimated (before the publisher's join landed) carries none.
            tracks = {k: records.track_for(mid_of(viewer, k)) for k in ("video", "audio")}
            act_errors = []
            for kind in ("video", "audio"):
                delta = ts_delta(viewer, kind, packets[kind])
                for p in packets[kind]:
                    ext = dict(p.extensions)
                    assert set(ext) <= {ABS_CAPTURE_TIME_ID}, p.extensions
                    found = records.frames.get((tracks[kind], (p.timestamp + delta) & MASK32))
                    if found is None:
                        continue
                    if found[2]:
                        assert not ext, p.extensions
                        continue
                    act_ns = ntp_to_unix_ns(AbsCaptureTime.parse(ext[ABS_CAPTURE_TIME_ID])
                                            .capture_ntp)
                    act_errors.append(abs(act_ns - found[0]))
            assert len(act_errors) >= 100, len(act_errors)
            assert max(act_errors) <= 1_000_000, max(act_errors)

            # Sender reports: the NTP time of each is the capture time the sync channel
            # reports for its RTP time (its anchor's line, RTP time -> house time). The map is
            # refined as the publisher's own reports come in, so each SR is held against the
            # anchors announced around when it left: the last before it and those up to
            # 0.5 s after (the channel batches records for up to 200 ms).
            sr_errors: dict[str, list[int]] = {"video": [], "audio": []}
            for kind, sock, answer in (("video", video_rtcp, video), ("audio", audio_rtp, audio)):
                delta = ts_delta(viewer, kind, packets[kind])
                announced = anchors[tracks[kind]]
                for sr, sr_at in sock.sender_reports():
                    assert sr.ssrc == answer["ssrc"]
                    before = [a for at, a in announced if at <= sr_at][-1:]
                    after = [a for at, a in announced if sr_at < at <= sr_at + 500_000_000]
                    viewer_ts = (sr.info.rtp_timestamp + delta) & MASK32
                    errors = [ntp_to_unix_ns(sr.info.ntp_timestamp) - a.capture_of(viewer_ts)
                              for a in before + after]
                    if errors:
                        sr_errors[kind].append(min(errors, key=abs))
            print("feed SR NTP minus sync-channel capture time, us: "
                  + "; ".join(f"{k} {[round(e / 1000) for e in v]}"
                              for k, v in sr_errors.items()))
            for kind, errors in sr_errors.items():
                assert len(errors) >= 4, (kind, errors)
                assert max(abs(e) for e in errors) <= 1_000_000, (kind, errors)

            # Feedback from the receiver: a PLI is a keyframe request upstream, a NACK is
            # answered from the cache, a receiver report shows in the status.
            session = relay.find_feed(feed["id"])
            assert session is not None
            output = session.outputs["video"]
            requested = relay.streams.get("fed").forwarders["video"].keyframe_requests_sent
            pli_at = time.time_ns()
            video_rtcp.send(rtcp.build_pli(1, video["ssrc"]), video["local_port"])
            await wait_for(lambda: output.keyframe_requests == 1, 5, "the PLI taken")
            await wait_for(
                lambda: relay.streams.get("fed").forwarders["video"].keyframe_requests_sent
                > requested, 5, "a keyframe asked of the publisher")
            await wait_for(
                lambda: any(at > pli_at and is_keyframe_start("vp8", RtpPacket.parse(d).payload)
                            for d, at in video_rtp.datagrams), 10, "a keyframe after the PLI")
            lost = video_rtp.rtp()[-5]
            video_rtcp.send(rtcp.build_nack(1, video["ssrc"], [lost.sequence_number]),
                            video["local_port"])
            await wait_for(
                lambda: sum(p.sequence_number == lost.sequence_number
                            for p in video_rtp.rtp()) == 2, 5, "the NACKed packet again")
            again = [p for p in video_rtp.rtp() if p.sequence_number == lost.sequence_number]
            assert again[0].payload == again[1].payload
            assert output.retransmitted == 1
            video_rtcp.send(receiver_report(1, video["ssrc"], 64), video["local_port"])
            await wait_for(lambda: output.last_report is not None, 5, "the receiver report")

            # Bad datagrams are counted: not RTCP, torn RTCP, or from another host.
            video_rtcp.send(b"\x00garbage", video["local_port"])
            video_rtcp.send(b"\x80\xc8\x00\x09", video["local_port"])
            stranger.send(rtcp.build_pli(1, video["ssrc"]), video["local_port"])
            await wait_for(lambda: (session.counters.parse_errors, session.counters.rtcp_errors,
                                    session.counters.foreign_packets) == (1, 1, 1),
                           5, "the bad datagrams counted")
            assert output.keyframe_requests == 1  # the stranger's PLI was not taken
            async with http.get(f"{base}{feed['location']}") as resp:
                shown = await resp.json()
            assert shown["viewer_kind"] == "rtp_feed"
            (video_status,) = [t for t in shown["tracks"] if t["kind"] == "video"]
            assert video_status["fraction_lost"] == 0.25 and video_status["plis_forwarded"] == 1
            assert video_status["retransmitted"] == 1
            assert (shown["not_rtcp"], shown["rtcp_errors"], shown["foreign_packets"]) == (1, 1, 1)
            assert shown["rtcp_received"] == 4  # PLI, NACK, RR and the torn one
            async with http.get(f"{base}/metrics") as resp:
                metrics = await resp.text()
            assert ('sfu_sidecar_relay_feed_bad_packets_total{reason="source",stream="fed"} 1.0'
                    in metrics)
            async with http.get(f"{base}/api/feeds") as resp:
                assert sorted(f["id"] for f in (await resp.json())["feeds"]) == sorted(
                    [feed["id"], bare["id"]])

            # DELETE stops the sending; the publisher and the WHEP viewer carry on.
            for location in (feed["location"], bare["location"]):
                async with http.delete(f"{base}{location}") as resp:
                    assert resp.status == 200
            await asyncio.sleep(0.5)  # anything already in flight lands
            counts = [len(s.datagrams) for s in sockets]
            viewer_count = len(viewer.received)
            await asyncio.sleep(2)
            assert [len(s.datagrams) for s in sockets] == counts
            assert len(viewer.received) > viewer_count + 50
            async with http.get(f"{base}{feed['location']}") as resp:
                assert resp.status == 404
        finally:
            await viewer.close()
            await publisher.close()
            for s in sockets:
                s.close()


async def test_a_feed_of_a_stream_without_sender_reports_still_gets_them(
    app_base: tuple[str, RelayService],
) -> None:
    """A tap whose sender sends no RTCP (capture times from arrival): the feed's receiver
    still gets sender reports, tying its RTP time to when the media arrived."""
    base, _ = app_base
    receiver, sender = await bound(), await bound()
    ssrc = 0x0BADCAFE
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{base}/api/taps", json={"stream": "nosr", "media": [
                    {"kind": "audio", "codec": "opus", "payload_type": 111}]}) as resp:
                tap = await resp.json()
                assert resp.status == 201, tap
            port = tap["media"][0]["rtp_port"]
            status, feed = await create_feed(http, base, {
                "stream": "nosr", "host": "127.0.0.1",
                "media": [{"kind": "audio", "rtp_port": receiver.port}]})
            assert status == 201, feed
            sent_at: dict[bytes, int] = {}
            start = time.monotonic()
            for seq in range(200):  # 4 s of 20 ms packets, bounded
                # Paced on a fixed schedule, so the packets go out at their RTP time's rate.
                await asyncio.sleep(max(0.0, start + seq * 0.02 - time.monotonic()))
                payload = b"\xfc" + seq.to_bytes(2, "big") + bytes(40)  # unique per packet
                sent_at[payload] = time.time_ns()
                sender.send(struct.pack("!BBHII", 0x80, 111, seq, seq * 960, ssrc) + payload,
                            port)
                if len(receiver.sender_reports()) >= 2:
                    break
            reports = receiver.sender_reports()
            assert len(reports) >= 2, len(reports)
            # The feed's RTP time -> when the test sent that packet.
            fed = {p.timestamp: sent_at[p.payload] for p in receiver.rtp()
                   if p.payload in sent_at}
            for sr, _ in reports:
                assert sr.ssrc == feed["media"][0]["ssrc"]
                ts = min(fed, key=lambda t, r=sr.info.rtp_timestamp: abs(signed(t - r)))
                expected = fed[ts] + signed(sr.info.rtp_timestamp - ts) * 1_000_000_000 // 48000
                # Arrival-based capture times sit within a few ms of sending on loopback.
                assert abs(ntp_to_unix_ns(sr.info.ntp_timestamp) - expected) < 50_000_000
    finally:
        receiver.close()
        sender.close()


def signed(value: int) -> int:
    return ((value + 2**31) & MASK32) - 2**31
