"""The pure fan-out core: rewriting, keyframe gating, reconnect continuity, NACK, throttling."""

from __future__ import annotations

from sfu_sidecar.relay.forwarder import (
    CACHE_SIZE,
    KEYFRAME_INTERVAL_NS,
    OutputConfig,
    TrackForwarder,
    ViewerOutput,
)
from sfu_sidecar.relay.hooks import (
    ABS_CAPTURE_TIME,
    ABS_SEND_TIME,
    AUDIO_LEVEL,
    SDES_MID,
    PacketInfo,
    SenderReport,
)
from sfu_sidecar.relay.packet import RtpPacket, unwrap_rtx

MS = 1_000_000
KEY = bytes([0x10, 0x00, 0x9D, 0x01, 0x2A])  # VP8: S=1, PID=0, P=0 -> keyframe start
DELTA = bytes([0x10, 0x01, 0x00])  # VP8 interframe
# Publisher's ids: mid=1, abs-send-time=3, abs-capture-time=5, and id 9 the viewer lacks
PUB_URIS = {1: SDES_MID, 3: ABS_SEND_TIME, 5: ABS_CAPTURE_TIME, 9: "urn:example:other"}


def pkt(seq: int, ts: int, payload: bytes = DELTA, *, ssrc: int = 0xAAAA,
        marker: bool = False) -> RtpPacket:
    return RtpPacket(
        96, seq, ts, ssrc, marker, payload,
        extensions=((1, b"v"), (3, b"\x01\x02\x03"), (5, b"12345678"), (9, b"x")),
    )


def output(name: str, kind: str = "video", *, rtx: bool = True, seq_base: int = 1000,
           ts_base: int = 50_000) -> ViewerOutput:
    config = OutputConfig(
        ssrc=hash(name) & 0xFFFFFFFF,
        payload_type=100 if kind == "video" else 111,
        extension_ids={SDES_MID: 4, ABS_SEND_TIME: 2, ABS_CAPTURE_TIME: 7, AUDIO_LEVEL: 8},
        mid=name,
        rtx_payload_type=101 if rtx else None,
        rtx_ssrc=(hash(name) + 1) & 0xFFFFFFFF if rtx else None,
    )
    return ViewerOutput(name, kind, config, seq_base=seq_base, ts_base=ts_base)


def forwarder(kind: str = "video") -> TrackForwarder:
    fw = TrackForwarder(kind, "vp8" if kind == "video" else "opus", 90000)
    fw.set_source(PUB_URIS, "vp8" if kind == "video" else "opus", 90000)
    return fw


def sent(fw: TrackForwarder, p: RtpPacket, now: int = 0) -> dict[str, RtpPacket]:
    copies, observations = fw.push(p, now, now)
    if observations is not None:
        observations.deliver()  # as the session does once every copy is sent
    return {o.viewer_id: RtpPacket.parse(data) for o, data in copies}


def test_each_viewer_gets_its_own_ssrc_pt_offsets_and_extension_ids() -> None:
    fw = forwarder()
    a, b = output("a", seq_base=10), output("b", seq_base=60000, ts_base=7)
    fw.add_output(a)
    fw.add_output(b)
    now = 1_700_000_000 * 10**9
    out = sent(fw, pkt(500, 90_000, KEY), now)
    assert set(out) == {"a", "b"}
    pa, pb = out["a"], out["b"]
    assert (pa.ssrc, pa.payload_type, pa.sequence_number, pa.timestamp) == (a.ssrc, 100, 10,
                                                                           50_000)
    assert (pb.sequence_number, pb.timestamp) == (60000, 7)
    assert pa.payload == pb.payload == KEY
    exts = dict(pa.extensions)
    assert exts[4] == b"a"  # the viewer's own mid, not the publisher's "v"
    assert dict(pb.extensions)[4] == b"b"
    assert exts[7] == b"12345678"  # abs-capture-time passed through under the viewer's id
    assert 9 not in exts and 5 not in exts and 1 not in exts
    # abs-send-time is the relay's send time (6.18 fixed point), not the publisher's value.
    assert exts[2] == ((now << 18) // 10**9 & 0xFFFFFF).to_bytes(3, "big")
    # Next packet: both advance together.
    out = sent(fw, pkt(501, 93_000, marker=True))
    assert out["a"].sequence_number == 11 and out["a"].timestamp == 53_000
    assert out["b"].sequence_number == 60001 and out["a"].marker


def test_video_viewer_starts_at_a_keyframe_audio_at_once() -> None:
    video = forwarder("video")
    late = output("late")
    video.add_output(late)
    assert sent(video, pkt(1, 0)) == {}
    assert not late.started
    assert video.keyframe_due(0)  # a waiting viewer makes a keyframe request due
    first = sent(video, pkt(2, 3000, KEY))["late"]
    assert first.payload == KEY and late.started
    audio = forwarder("audio")
    listener = output("l", "audio")
    audio.add_output(listener)
    assert "l" in sent(audio, pkt(1, 0, b"opus"))
    assert not audio.keyframe_due(0)


def test_reconnect_continues_sequence_and_time() -> None:
    fw = forwarder()
    v = output("v")
    fw.add_output(v)
    sent(fw, pkt(100, 1_000, KEY), 0)
    last = sent(fw, pkt(101, 4_000), 33 * MS)["v"]
    # The publisher comes back 2 s later with a new SSRC and random seq/ts.
    fw.set_source(PUB_URIS, "vp8", 90000)
    nxt = sent(fw, pkt(40000, 123_456_789, KEY, ssrc=0xBBBB), 33 * MS + 2_000 * MS)["v"]
    assert nxt.sequence_number == (last.sequence_number + 1) & 0xFFFF
    assert (nxt.timestamp - last.timestamp) & 0xFFFFFFFF == 2 * 90000
    assert fw.source_ssrc == 0xBBBB
    # A stray packet from the old source is not forwarded.
    assert sent(fw, pkt(102, 7_000)) == {}
    assert fw.foreign_packets == 1


def test_nack_is_answered_from_the_cache_as_rtx_or_plain() -> None:
    fw = forwarder()
    with_rtx, plain = output("r", seq_base=5), output("p", rtx=False, seq_base=65535)
    fw.add_output(with_rtx)
    fw.add_output(plain)
    for i in range(5):
        sent(fw, pkt(200 + i, 3000 * i, KEY if i == 0 else DELTA + bytes([i])))
    (rtx,) = [RtpPacket.parse(d) for d in fw.retransmit(with_rtx, [7], 0)]
    assert rtx.payload_type == 101 and rtx.ssrc == with_rtx.config.rtx_ssrc
    osn, payload = unwrap_rtx(rtx.payload)
    assert osn == 7 and payload == DELTA + bytes([2])
    assert rtx.timestamp == 50_000 + 6000
    # Plain re-send under the viewer's own numbers, across its 2^16 wrap.
    (again,) = [RtpPacket.parse(d) for d in fw.retransmit(plain, [1], 0)]
    assert (again.payload_type, again.sequence_number) == (100, 1)
    assert again.payload == DELTA + bytes([2])
    # Too old (overwritten) or never sent: counted, not answered.
    assert fw.retransmit(plain, [(65535 + 5000) & 0xFFFF], 0) == []
    assert plain.nack_misses == 1
    for i in range(5, 5 + CACHE_SIZE):
        sent(fw, pkt(200 + i, 3000 * i))
    assert fw.retransmit(with_rtx, [7], 0) == []
    assert (with_rtx.nacks_received, with_rtx.retransmitted) == (2, 1)


def test_keyframe_requests_are_throttled_per_track() -> None:
    fw = forwarder()
    v = output("v")
    fw.add_output(v)
    sent(fw, pkt(1, 0, KEY))
    assert fw.request_keyframe(0, v)
    assert not fw.request_keyframe(100 * MS, v)  # within 500 ms: held back, still pending
    assert not fw.keyframe_due(KEYFRAME_INTERVAL_NS - 1)
    assert fw.keyframe_due(KEYFRAME_INTERVAL_NS)
    assert not fw.keyframe_due(3 * KEYFRAME_INTERVAL_NS)  # nothing pending any more
    assert fw.keyframe_requests_sent == 2 and v.keyframe_requests == 2


def test_observers_see_original_and_viewer_timestamps_and_survive_a_broken_one() -> None:
    fw = forwarder()
    v, w = output("v"), output("w", ts_base=0)
    fw.add_output(v)
    fw.add_output(w)
    seen: list[tuple[PacketInfo, int]] = []

    def broken(info: PacketInfo, ts: int) -> None:
        raise RuntimeError("observer bug")

    v.observers.extend([broken, lambda info, ts: seen.append((info, ts))])
    out = sent(fw, pkt(7, 12345, KEY, marker=True), 99)
    assert "w" in out and "v" in out
    ((info, viewer_ts),) = seen
    assert viewer_ts == out["v"].timestamp == 50_000
    assert (info.timestamp, info.sequence_number, info.ssrc) == (12345, 7, 0xAAAA)
    assert info.keyframe and info.marker and info.arrival_ns == 99
    assert info.extensions[ABS_CAPTURE_TIME] == b"12345678"
    assert info.extensions["urn:example:other"] == b"x"
    assert v.observer_errors == 1 and isinstance(v.last_observer_error, RuntimeError)


def test_sender_report_moves_the_publishers_pair_into_viewer_time() -> None:
    fw = forwarder()
    v = output("v")
    fw.add_output(v)
    assert fw.sender_report_for(v) is None
    sent(fw, pkt(1, 90_000, KEY))
    fw.note_sender_report(0xAAAA, SenderReport(0xABCDEF, 180_000, 5, 500))
    fw.note_sender_report(0xBBBB, SenderReport(1, 1, 1, 1))  # not the current source: ignored
    sr = fw.sender_report_for(v)
    assert sr == SenderReport(0xABCDEF, 50_000 + 90_000, 1, len(KEY))


def test_direct_media_clock_ties_viewer_rtp_time_to_the_reference_clock() -> None:
    # RFC 7273 a=mediaclk:direct=0: RTP time = reference time x clock rate (mod 2^32).
    fw = forwarder("video")
    direct = output("direct")
    direct.media_clock_rate = 90000
    plain = output("plain", ts_base=1234)
    fw.add_output(direct)
    fw.add_output(plain)
    now = 1_796_000_000_123_456_789
    first = sent(fw, pkt(10, 5000, KEY), now)
    assert first["direct"].timestamp == (now * 90000 // 1_000_000_000) & 0xFFFFFFFF
    assert first["plain"].timestamp == 1234
    # Later packets keep the RTP clock: +3000 ticks per 1/30 s, whatever the send time.
    later = sent(fw, pkt(11, 8000), now + 7_000_000)
    assert later["direct"].timestamp == (first["direct"].timestamp + 3000) & 0xFFFFFFFF


def test_a_publisher_hook_writes_extensions_into_every_copy() -> None:
    value = b"\x11" * 8
    fw = forwarder("video")
    fw.add_output(output("a"))
    fw.add_output(output("b"))
    out = {o.viewer_id: RtpPacket.parse(d)
           for o, d in fw.push(pkt(1, 100, KEY), 0, 0, lambda info: {ABS_CAPTURE_TIME: value})[0]}
    for copy in out.values():
        # Replaces the publisher's value (id 5 upstream) under the viewer's id 7.
        assert dict(copy.extensions)[7] == value

    # A publisher that never negotiated the extension: the relay still writes it.
    bare = TrackForwarder("video", "vp8", 90000)
    bare.set_source({1: SDES_MID}, "vp8", 90000)
    bare.add_output(output("c"))
    ((_, data),), _ = bare.push(pkt(1, 100, KEY), 0, 0, lambda info: {ABS_CAPTURE_TIME: value})
    assert dict(RtpPacket.parse(data).extensions)[7] == value


def test_each_push_returns_its_own_observations_so_none_are_lost() -> None:
    fw = forwarder("video")
    watched = output("a", seq_base=0, ts_base=0)
    seen: list[tuple[int, int]] = []
    watched.observers.append(lambda info, viewer_ts: seen.append((info.sequence_number,
                                                                  viewer_ts)))
    fw.add_output(watched)
    fw.add_output(output("b"))  # no observers: nothing to deliver for it
    first_copies, first = fw.push(pkt(1, 100, KEY), 0, 0)
    second_copies, second = fw.push(pkt(2, 100), 0, 0)
    assert len(first_copies) == len(second_copies) == 2
    assert first is not None and second is not None
    assert seen == []  # nothing runs before the caller has sent the copies
    second.deliver()
    first.deliver()
    assert seen == [(2, 0), (1, 0)]
    unwatched = forwarder("video")
    unwatched.add_output(output("c"))
    assert unwatched.push(pkt(1, 100, KEY), 0, 0)[1] is None


def test_totals_sent_keep_what_departed_viewers_were_sent() -> None:
    """The totals behind /metrics' counters never go down when a viewer leaves."""
    fw = forwarder()
    stays, leaves = output("stays"), output("leaves")
    fw.add_output(stays)
    fw.add_output(leaves)
    for i in range(4):
        sent(fw, pkt(300 + i, 3000 * i, KEY if i == 0 else DELTA))
    fw.retransmit(leaves, [1001], 0)
    assert (fw.packets_sent(), fw.retransmitted()) == (8, 1)
    fw.remove_output(leaves)
    fw.remove_output(leaves)  # a second removal counts nothing twice
    assert (fw.packets_sent(), fw.retransmitted()) == (8, 1)
    sent(fw, pkt(304, 12000))
    assert fw.packets_sent() == 9


def test_a_publisher_hook_writes_an_extension_or_takes_it_out() -> None:
    """The sync hook writes abs-capture-time in house time over the publisher's stamp, or,
    for a capture time it only estimates, takes the extension out of every copy."""
    fw = forwarder()
    a = output("a")
    fw.add_output(a)
    house = b"87654321"
    copies, _ = fw.push(pkt(1, 90_000, KEY), 0, 0, on_packet=lambda info: {ABS_CAPTURE_TIME: house})
    assert dict(RtpPacket.parse(copies[0][1]).extensions)[7] == house
    copies, _ = fw.push(pkt(2, 93_000), 0, 0, on_packet=lambda info: {ABS_CAPTURE_TIME: b""})
    exts = dict(RtpPacket.parse(copies[0][1]).extensions)
    assert 7 not in exts and exts[4] == b"a"  # the publisher's own stamp is not passed on
