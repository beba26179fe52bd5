"""aiortc publisher -> relay -> aiortc viewers over loopback, all real peers in one event loop."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

from aiortc import RTCRtpReceiver

from sfu_sidecar.relay import (
    DataChannel,
    PacketInfo,
    RelayObserver,
    SenderReport,
    ViewerHandle,
    aiortc_adapter,
    rtcp,
    sdp,
)
from sfu_sidecar.relay.packet import RtpPacket, is_keyframe_start, seq_newer
from sfu_sidecar.relay.peersessions import ViewerSession
from tests.relay.conftest import Relay
from tests.relay.peers import (
    LOOPBACK,
    PatternVideo,
    Peer,
    ToneAudio,
    client_pc,
    frames,
    publish,
    view,
    wait_for,
)


def _media(packets: list[RtpPacket], pt: int) -> list[RtpPacket]:
    return [p for p in packets if p.payload_type == pt]


def _pt(peer: Peer, kind: str) -> int:
    """Payload type of ``kind``'s primary codec in the SDP this peer was answered with."""
    desc = sdp.parse(peer.answer, what="answer")
    return next(m.primary.payload_type for m in desc.media if m.kind == kind)


async def test_viewers_decode_and_receive_the_publishers_exact_payloads(relay: Relay) -> None:
    pub = await publish(relay.http, relay.base, "s", video=PatternVideo(), audio=ToneAudio())
    viewers = [await view(relay.http, relay.base, "s") for _ in range(3)]
    try:
        for v in viewers:
            video = await frames(v.tracks["video"], 15, limit_s=10)
            audio = await frames(v.tracks["audio"], 10, limit_s=10)
            assert (video[-1].width, video[-1].height) == (320, 240)
            assert audio[-1].sample_rate == 48000
        await wait_for(lambda: all(len(v.received) > 40 for v in viewers), 5, "packets")
        sent = {kind: _media(pub.sent, _pt(pub, kind)) for kind in ("audio", "video")}
        for v in viewers:
            for kind in ("audio", "video"):
                got = _media(v.received, _pt(v, kind))
                assert len(got) > 10
                # Same payload bytes in the same order: a contiguous run of what was sent.
                first = next(i for i, p in enumerate(sent[kind]) if p.payload == got[0].payload)
                expected = [p.payload for p in sent[kind][first : first + len(got)]]
                assert [p.payload for p in got] == expected
                # Rewritten per viewer: its own SSRC, consecutive sequence numbers.
                assert len({p.ssrc for p in got}) == 1
                assert got[0].ssrc != sent[kind][0].ssrc
                for a, b in itertools.pairwise(got):
                    assert b.sequence_number == (a.sequence_number + 1) & 0xFFFF
        ssrcs = {_media(v.received, _pt(v, "video"))[0].ssrc for v in viewers}
        assert len(ssrcs) == 3
    finally:
        for v in viewers:
            await v.close()
        await pub.close()


async def test_h264_is_forwarded_as_h264_and_other_codecs_are_refused(relay: Relay) -> None:
    pub = await publish(relay.http, relay.base, "avc", video=PatternVideo(), video_codec="h264")
    v = await view(relay.http, relay.base, "avc", kinds=("video",))
    try:
        got = await frames(v.tracks["video"], 10, limit_s=10)
        assert got[-1].width == 320
        assert sdp.parse(v.answer, what="answer").media[0].primary.name == "h264"
        sent = {p.payload for p in _media(pub.sent, _pt(pub, "video"))}
        received = _media(v.received, _pt(v, "video"))
        assert received and all(p.payload in sent for p in received)
        # A viewer that only takes VP8 cannot watch an H.264 stream: no transcoding, 406.
        vp8_only = client_pc()
        transceiver = vp8_only.addTransceiver("video", direction="recvonly")
        caps = RTCRtpReceiver.getCapabilities("video")
        assert caps is not None
        transceiver.setCodecPreferences(
            [c for c in caps.codecs if c.mimeType.lower() in ("video/vp8", "video/rtx")]
        )
        aiortc_adapter.install_ice(vp8_only, LOOPBACK, None)
        await vp8_only.setLocalDescription(await vp8_only.createOffer())
        async with relay.http.post(
            relay.base + "/whep/avc", data=vp8_only.localDescription.sdp,
            headers={"Content-Type": "application/sdp"},
        ) as resp:
            assert resp.status == 406
            assert "h264" in (await resp.json())["error"]
        await vp8_only.close()
    finally:
        await v.close()
        await pub.close()


async def test_publisher_loss_is_nacked_upstream_and_rtx_unwrapped(relay: Relay) -> None:
    dropped: set[int] = set()
    count = {"n": 0}

    def drop(pkt: RtpPacket) -> bool:
        # Lose every 9th first transmission of a video packet between publisher and relay.
        if pkt.payload_type != 97 or pkt.sequence_number in dropped:
            return False
        count["n"] += 1
        if count["n"] > 30 and count["n"] % 9 == 0 and len(dropped) < 6:
            dropped.add(pkt.sequence_number)
            return True
        return False

    pub = await publish(relay.http, relay.base, "up", video=PatternVideo(), drop=drop)
    v = await view(relay.http, relay.base, "up", kinds=("video",))
    try:
        assert _pt(pub, "video") == 97
        await frames(v.tracks["video"], 45, limit_s=15)
        await wait_for(lambda: len(dropped) == 6, 10, "six upstream losses")
        track = relay.service.streams.get("up").publisher.tracks[0]  # type: ignore[union-attr]
        await wait_for(lambda: track.rtx_packets >= 6, 5, "RTX repairs from the publisher")
        assert track.nack is not None and track.nack.nacked >= 6
        # Every lost packet reached the viewer, as a plain packet with its original payload.
        sent = {p.sequence_number: p.payload for p in pub.dropped}
        # The relay counted the repairs; the copies are then on their way to the viewer.
        await wait_for(lambda: set(sent.values()) <= {
            p.payload for p in _media(v.received, _pt(v, "video"))}, 2,
            "the repaired packets at the viewer")
        # Feedback a normal receiver gives: NACKs, receiver reports, REMB.
        feedback = [m for d in pub.rtcp_received for m in rtcp.parse_compound(d)]
        video_ssrc = pub.sent[0].ssrc if pub.sent else 0
        assert any(isinstance(m, rtcp.Nack) and m.media_ssrc == video_ssrc for m in feedback)
        assert any(isinstance(m, rtcp.ReceiverReportPacket) for m in feedback)
        await wait_for(
            lambda: any(isinstance(m, rtcp.Remb)
                        for d in pub.rtcp_received for m in rtcp.parse_compound(d)),
            5, "REMB from the relay",
        )
        # The publisher saw our receiver reports (its stats carry remote-inbound data).
        stats = await pub.pc.getSenders()[0].getStats()
        remote = [s for s in stats.values() if s.type == "remote-inbound-rtp"]
        assert remote and remote[0].packetsReceived > 0
    finally:
        await v.close()
        await pub.close()


async def test_a_broken_viewer_does_not_hold_up_the_others(relay: Relay) -> None:
    pub = await publish(relay.http, relay.base, "broken", video=PatternVideo())
    good = await view(relay.http, relay.base, "broken", kinds=("video",))
    bad = await view(relay.http, relay.base, "broken", kinds=("video",))
    try:
        await frames(bad.tracks["video"], 5, limit_s=10)
        stream = relay.service.streams.get("broken")
        sessions = list(stream.viewers.values())
        bad_output = next(
            s.outputs["video"] for s in sessions
            if _media(bad.received, _pt(bad, "video"))[0].ssrc == s.outputs["video"].ssrc
        )

        def fail(data: bytes) -> None:
            raise OSError("socket gone")

        bad_output.transmit = fail
        before = len(good.received)
        await wait_for(lambda: len(good.received) >= before + 30, 10, "the good viewer's media")
        assert bad_output.send_errors >= 20
        await frames(good.tracks["video"], 20, limit_s=10)
    finally:
        await good.close()
        await bad.close()
        await pub.close()


async def test_viewer_may_arrive_before_the_publisher(relay: Relay) -> None:
    v = await view(relay.http, relay.base, "early")
    try:
        await wait_for(lambda: v.pc.connectionState == "connected", 10, "viewer connected")
        assert relay.service.streams.get("early").publisher is None
        pub = await publish(relay.http, relay.base, "early", video=PatternVideo(),
                            audio=ToneAudio())
        try:
            await frames(v.tracks["video"], 10, limit_s=10)
            await frames(v.tracks["audio"], 10, limit_s=10)
        finally:
            await pub.close()
    finally:
        await v.close()


async def test_late_viewer_gets_a_keyframe_on_request(relay: Relay) -> None:
    pub = await publish(relay.http, relay.base, "late", video=PatternVideo())
    early = await view(relay.http, relay.base, "late", kinds=("video",))
    try:
        await frames(early.tracks["video"], 30, limit_s=10)  # past the first keyframe
        stream = relay.service.streams.get("late")
        requests_before = stream.forwarders["video"].keyframe_requests_sent
        keyframes_before = stream.forwarders["video"].keyframes_in
        late = await view(relay.http, relay.base, "late", kinds=("video",))
        await wait_for(lambda: "video" in late.tracks, 5, "late viewer track")
        await frames(late.tracks["video"], 1, limit_s=10)
        # aiortc's encoder makes a keyframe only every 3000 frames (100 s) unless asked: the
        # late viewer decoding at all proves its join triggered a keyframe request upstream.
        assert stream.forwarders["video"].keyframes_in > keyframes_before
        assert stream.forwarders["video"].keyframe_requests_sent > requests_before
        first = _media(late.received, _pt(late, "video"))[0]
        assert is_keyframe_start("vp8", first.payload)
        await late.close()
    finally:
        await early.close()
        await pub.close()


async def test_loss_on_one_viewer_is_repaired_by_nack_without_touching_others(
    relay: Relay,
) -> None:
    pub = await publish(relay.http, relay.base, "lossy", video=PatternVideo())
    clean = await view(relay.http, relay.base, "lossy", kinds=("video",))
    lossy = await view(relay.http, relay.base, "lossy", kinds=("video",))
    video_pt = _pt(lossy, "video")
    counter = {"n": 0}
    dropped_once: set[int] = set()

    def drop(pkt: RtpPacket) -> bool:
        # Drop every 7th first transmission of a media packet; retransmissions get through.
        if pkt.payload_type != video_pt or pkt.sequence_number in dropped_once:
            return False
        counter["n"] += 1
        if counter["n"] % 7 == 0 and counter["n"] > 20:
            dropped_once.add(pkt.sequence_number)
            return True
        return False

    lossy.drop = drop
    try:
        await frames(lossy.tracks["video"], 60, limit_s=15)
        await frames(clean.tracks["video"], 60, limit_s=15)
        lossy.drop = None
        assert len(dropped_once) >= 3
        video_media = next(
            m for m in sdp.parse(lossy.answer, what="answer").media if m.kind == "video"
        )
        rtx_pt = video_media.rtx_for(video_pt)
        assert rtx_pt is not None

        def missing() -> set[int]:
            repaired = {
                int.from_bytes(p.payload[:2], "big")
                for p in lossy.received if p.payload_type == rtx_pt
            }
            return dropped_once - repaired

        # A gap is noticed (and NACKed) when the next packet arrives; give the last one time.
        await wait_for(lambda: not missing(), 5, f"RTX repair of {sorted(missing())}")
        stream = relay.service.streams.get("lossy")
        by_id = {v.id: v for v in stream.viewers.values()}
        outputs = [s.outputs["video"] for s in by_id.values()]
        lossy_out = next(o for o in outputs if o.retransmitted > 0)
        clean_out = next(o for o in outputs if o is not lossy_out)
        assert lossy_out.retransmitted >= len(dropped_once) - 2
        assert clean_out.nacks_received == 0 and clean_out.retransmitted == 0
        # The clean viewer got every packet in order, none missing.
        got = _media(clean.received, video_pt)
        for a, b in itertools.pairwise(got):
            assert b.sequence_number == (a.sequence_number + 1) & 0xFFFF
    finally:
        await clean.close()
        await lossy.close()
        await pub.close()


async def test_publisher_reconnect_keeps_viewer_sequence_and_time_monotonic(
    relay: Relay,
) -> None:
    pub = await publish(relay.http, relay.base, "re", video=PatternVideo(), audio=ToneAudio())
    v = await view(relay.http, relay.base, "re")
    try:
        await frames(v.tracks["video"], 20, limit_s=10)
        async with relay.http.delete(relay.base + pub.location) as resp:
            assert resp.status == 200
        await pub.close()
        await _until_no_publisher(relay, "re")
        before = len(v.received)
        pub = await publish(relay.http, relay.base, "re", video=PatternVideo(),
                            audio=ToneAudio())
        await frames(v.tracks["video"], 20, limit_s=10)
        await frames(v.tracks["audio"], 20, limit_s=10)
        assert len(v.received) > before
        for kind in ("audio", "video"):
            got = _media(v.received, _pt(v, kind))
            for a, b in itertools.pairwise(got):
                assert seq_newer(b.sequence_number, a.sequence_number), (a, b)
                assert b.sequence_number == (a.sequence_number + 1) & 0xFFFF
                assert (b.timestamp - a.timestamp) & 0xFFFFFFFF < 0x80000000
        assert relay.service.streams.get("re").publishers_seen == 2
    finally:
        await v.close()
        await pub.close()


class Recorder(RelayObserver):
    def __init__(self) -> None:
        self.reports: list[tuple[str, str, SenderReport]] = []
        self.connected: list[ViewerSession] = []
        self.closed: list[ViewerSession] = []
        self.packets: list[tuple[str, str, PacketInfo, int]] = []

    def publisher_sender_report(self, stream: str, kind: str, report: SenderReport) -> None:
        self.reports.append((stream, kind, report))

    def viewer_connected(self, viewer: ViewerSession) -> None:
        self.connected.append(viewer)
        for kind, track in viewer.outputs.items():
            track.observers.append(self._observer(viewer.id, kind))
            track.sender_report_rewriter = self._rewrite

    def _observer(self, viewer_id: str, kind: str) -> Callable[[PacketInfo, int], None]:
        def observe(info: PacketInfo, viewer_ts: int) -> None:
            self.packets.append((viewer_id, kind, info, viewer_ts))

        return observe

    @staticmethod
    def _rewrite(default: SenderReport | None) -> SenderReport | None:
        if default is None:
            return None
        return SenderReport(0x1234_5678_0000_0000, default.rtp_timestamp,
                            default.packet_count, default.octet_count)

    def viewer_closed(self, viewer: ViewerSession) -> None:
        self.closed.append(viewer)


async def test_hooks_see_packets_sender_reports_and_data_channels(relay: Relay) -> None:
    recorder = Recorder()
    relay.service.add_observer(recorder)
    pub = await publish(relay.http, relay.base, "hooks", video=PatternVideo(), audio=ToneAudio())
    v = await view(relay.http, relay.base, "hooks", data_channel=True)
    recorder_done = len(recorder.connected)
    plain = await view(relay.http, relay.base, "hooks")
    # Only the first viewer gets the rewriter; the second shows the relay's default SRs.
    await wait_for(lambda: len(recorder.connected) == 2, 5, "second viewer")
    recorder.connected[1].outputs["video"].sender_report_rewriter = None
    recorder.connected[1].outputs["audio"].sender_report_rewriter = None
    assert recorder_done <= 1
    try:
        await frames(v.tracks["video"], 10, limit_s=10)
        # aiortc reports each kind on its own random interval: wait for one of each.
        await wait_for(lambda: {k for _, k, _ in recorder.reports} == {"audio", "video"}, 10,
                       "publisher sender reports of both kinds")
        session = recorder.connected[0]
        assert session.accepts_data_channel
        await wait_for(lambda: "hello" in session.peer.data_channels, 5, "viewer's data channel")
        server_channel = session.pc.createDataChannel("sync")
        received: list[str] = []
        v_channels: dict[str, object] = {}

        @v.pc.on("datachannel")
        def on_channel(channel: object) -> None:
            v_channels["sync"] = channel
            channel.on("message", received.append)  # type: ignore[attr-defined]

        server_channel.on("open", lambda: server_channel.send("tick"))
        await wait_for(lambda: received == ["tick"], 5, "message on the sync channel")

        # Observer timestamps are the ones the viewer actually received.
        video = [(i, ts) for vid, k, i, ts in recorder.packets
                 if k == "video" and vid == session.id]
        got_ts = {p.timestamp for p in _media(v.received, _pt(v, "video"))}
        assert {ts for _, ts in video[:50]} <= got_ts | {ts for _, ts in video[-5:]}
        assert any(i.keyframe for i, _ in video)
        offsets = {(ts - i.timestamp) & 0xFFFFFFFF for i, ts in video}
        assert len(offsets) == 1
        # Extensions arrive raw and keyed by URI; the publisher's mid is among them.
        assert any("urn:ietf:params:rtp-hdrext:sdes:mid" in i.extensions for i, _ in video)
        assert {k for _, k, _ in recorder.reports} == {"audio", "video"}

        # Sender reports: rewritten for the first viewer, the publisher's NTP/RTP pair moved
        # into the viewer's RTP time for the second.
        def srs(peer: Peer, kind: str) -> list[rtcp.SenderReportPacket]:
            ssrc = _media(peer.received, _pt(peer, kind))[0].ssrc
            return [m for data in peer.rtcp_received for m in rtcp.parse_compound(data)
                    if isinstance(m, rtcp.SenderReportPacket) and m.ssrc == ssrc]

        await wait_for(lambda: bool(srs(v, "video")) and bool(srs(plain, "video")), 6,
                       "sender reports at the viewers")
        assert all(m.info.ntp_timestamp == 0x1234_5678_0000_0000 for m in srs(v, "video"))
        pub_pairs = {(r.ntp_timestamp, r.rtp_timestamp) for _, k, r in recorder.reports
                     if k == "video"}
        sent_video = _media(pub.sent, _pt(pub, "video"))
        got_video = _media(plain.received, _pt(plain, "video"))
        by_payload = {p.payload: p.timestamp for p in sent_video}
        offset = next((p.timestamp - by_payload[p.payload]) & 0xFFFFFFFF for p in got_video)
        for m in srs(plain, "video"):
            assert (m.info.ntp_timestamp, (m.info.rtp_timestamp - offset) & 0xFFFFFFFF) in (
                pub_pairs
            )
    finally:
        await v.close()
        await plain.close()
        await pub.close()
    await wait_for(lambda: len(recorder.closed) == 2, 5, "viewer_closed")


async def _until_no_publisher(relay: Relay, stream: str, limit_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + limit_s
    while True:
        async with relay.http.get(f"{relay.base}/api/streams/{stream}") as resp:
            body = await resp.json()
        if resp.status == 404 or body.get("publisher") is None:
            return
        assert asyncio.get_running_loop().time() < deadline, body
        await asyncio.sleep(0.02)


class ChannelListener(RelayObserver):
    """Records what reaches observers on each viewer's data channels."""

    def __init__(self) -> None:
        self.messages: dict[str, list[bytes | str]] = {}

    def viewer_data_channel(self, viewer: ViewerHandle, channel: DataChannel) -> None:
        received = self.messages.setdefault(viewer.id, [])
        channel.on_message(received.append)


async def test_data_channel_messages_over_the_rate_are_dropped_per_peer(relay_factory) -> None:
    relay: Relay = await relay_factory(channel_messages_per_s="0.01")  # one message, no refill
    listener = ChannelListener()
    relay.service.add_observer(listener)
    flooder = await view(relay.http, relay.base, "dc", kinds=("video",), data_channel=True)
    calm = await view(relay.http, relay.base, "dc", kinds=("video",), data_channel=True)
    try:
        for peer, count in ((flooder, 20), (calm, 1)):
            channel = peer.channel
            await wait_for(lambda c=channel: c.readyState == "open", 5, "data channel open")
            for i in range(count):
                channel.send(f"m{i}")
        dropped = 'sfu_sidecar_messages_dropped_total{channel="data_channel"} 19.0'
        await wait_for(lambda: dropped in relay.service.metrics.render().decode(), 5,
                       "the flood's messages dropped and counted")
        await wait_for(lambda: sum(map(len, listener.messages.values())) == 2, 5,
                       "each viewer's first message")
        # Each peer has its own allowance: the flood cost the calm viewer nothing.
        assert sorted(listener.messages.values()) == [["m0"], ["m0"]]
    finally:
        await flooder.close()
        await calm.close()
