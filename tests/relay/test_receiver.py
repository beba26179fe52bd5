"""The publisher receive path without I/O: bytes and times in, copies and RTCP out."""

from __future__ import annotations

from sfu_sidecar.relay import rtcp
from sfu_sidecar.relay.forwarder import OutputConfig, TrackForwarder, ViewerOutput
from sfu_sidecar.relay.hooks import ABS_SEND_TIME, PacketInfo, SenderReport
from sfu_sidecar.relay.packet import RtpPacket, wrap_rtx
from sfu_sidecar.relay.receiver import PublisherReceiver, PublisherTrack, SessionCounters
from sfu_sidecar.relay.sdp import CodecInfo
from sfu_sidecar.relay.upstream import NackGenerator, ReceiveStatistics

VP8 = CodecInfo(96, "vp8", 90000, None, {})
KEY = bytes([0x10, 0x00, 0x9D, 0x01, 0x2A])  # VP8 keyframe start
DELTA = bytes([0x10, 0x01, 0x00])
MEDIA, RTX, OURS = 0x1111, 0x2222, 0x9999
MS = 1_000_000


def receiver(**kw: object) -> tuple[PublisherReceiver, PublisherTrack, ViewerOutput]:
    fw = TrackForwarder("video", "vp8", 90000)
    fw.set_source({}, "vp8", 90000)
    output = ViewerOutput("v", "video", OutputConfig(ssrc=5, payload_type=100),
                          seq_base=0, ts_base=0)
    fw.add_output(output)
    track = PublisherTrack(
        kind="video", mid="0", codec=VP8, rtx_payload_type=97, forwarder=fw,
        stats=ReceiveStatistics(90000), nack=NackGenerator(), extensions={},
        rtx_ssrcs={RTX: MEDIA}, media_ssrc=MEDIA,
    )
    rx = PublisherReceiver(OURS, SessionCounters(), **kw)  # type: ignore[arg-type]
    rx.add_track(track)
    return rx, track, output


def rtp(seq: int, payload: bytes = DELTA, *, pt: int = 96, ssrc: int = MEDIA,
        extensions: tuple[tuple[int, bytes], ...] = ()) -> bytes:
    return RtpPacket(pt, seq, seq * 3000, ssrc, False, payload, extensions).serialize()


def test_a_packet_comes_back_as_the_viewers_copy_in_its_own_ssrc_and_payload_type() -> None:
    rx, track, output = receiver()
    copies, observations = rx.receive_rtp(rtp(10, KEY), 1 * MS, 1) or ([], None)
    assert [(o, RtpPacket.parse(d).ssrc, RtpPacket.parse(d).payload_type) for o, d in copies] \
        == [(output, 5, 100)]
    assert observations is None  # the viewer has no observers
    assert track.stats.started and rx.data_to_send() == ()


def test_a_gap_queues_a_nack_and_the_rtx_repair_is_forwarded_as_media() -> None:
    rx, track, _ = receiver()
    rx.receive_rtp(rtp(10, KEY), 1 * MS, 1)
    rx.receive_rtp(rtp(12), 2 * MS, 2)
    (nack,) = rx.data_to_send()
    (msg,) = rtcp.parse_compound(nack)
    assert msg == rtcp.Nack(OURS, MEDIA, (11,))
    assert rx.data_to_send() == ()  # handed out once
    repaired = rx.receive_rtp(rtp(500, wrap_rtx(11, DELTA), pt=97, ssrc=RTX), 3 * MS, 3)
    assert repaired is not None
    ((_, data),), _ = repaired
    assert RtpPacket.parse(data).payload == DELTA
    assert track.rtx_packets == 1


def test_bad_bytes_and_unknown_payload_types_are_counted_not_forwarded() -> None:
    rx, _, _ = receiver()
    assert rx.receive_rtp(b"\x80", 0, 0) is None
    assert rx.receive_rtp(rtp(1, pt=111), 0, 0) is None
    assert rx.receive_rtp(rtp(1, b"", pt=97, ssrc=RTX), 0, 0) is None  # padding-only probe
    assert (rx.counters.parse_errors, rx.counters.unknown_payload) == (1, 1)
    assert rx.receive_rtcp(b"\x80\xc8\x00\x09", 0) == []
    assert rx.counters.rtcp_errors == 1


def test_sender_reports_are_returned_for_observers_and_echoed_in_receiver_reports() -> None:
    rx, track, _ = receiver()
    rx.receive_rtp(rtp(10, KEY), 1 * MS, 1)
    info = SenderReport(0x0102030405060708, 30000, 5, 500)
    reports = rx.receive_rtcp(rtcp.build_sr(MEDIA, info), 1000 * MS)
    assert reports == [(track, SenderReport(0x0102030405060708, 30000, 5, 500, 1000 * MS))]
    rx.receiver_report(1500 * MS)
    (rr,) = rx.data_to_send()
    (msg,) = rtcp.parse_compound(rr)
    assert isinstance(msg, rtcp.ReceiverReportPacket) and msg.ssrc == OURS
    (block,) = msg.reports
    assert block.ssrc == MEDIA and block.lsr == 0x03040506
    assert block.dlsr == 500 * 65536 // 1000  # 0.5 s in 1/65536 s


def test_a_report_before_the_first_packet_is_handed_on_after_that_packet() -> None:
    """ffmpeg sends its first sender report with its first packet, on another socket: the
    report may win, and it is the one that lets the capture-time mapping trust the second."""
    rx, track, _ = receiver()
    info = SenderReport(0x0102030405060708, 30000, 0, 0)
    assert rx.receive_rtcp(rtcp.build_sr(MEDIA, info), 900 * MS) == []
    assert rx.receive_rtcp(rtcp.build_sr(0x7777, info), 901 * MS) == []  # not this track's
    assert rx.reports_due() == []
    rx.receive_rtp(rtp(10, KEY), 1000 * MS, 1000)
    assert rx.reports_due() == [(track, SenderReport(0x0102030405060708, 30000, 0, 0, 900 * MS))]
    assert rx.reports_due() == []  # handed out once
    assert track.last_sr is not None and track.last_sr_arrival_ns == 900 * MS
    rx.receive_rtp(rtp(11), 1020 * MS, 1020)
    assert rx.reports_due() == []  # the other SSRC's report names no track


def test_early_reports_are_kept_for_a_few_ssrcs_only() -> None:
    rx, track, _ = receiver()
    for ssrc in range(100, 120):  # a tap's port takes datagrams from anyone
        rx.receive_rtcp(rtcp.build_sr(ssrc, SenderReport(ssrc, 0, 0, 0)), ssrc * MS)
    rx.receive_rtcp(rtcp.build_sr(MEDIA, SenderReport(1, 2, 0, 0)), 500 * MS)
    rx.receive_rtp(rtp(10, KEY), 1000 * MS, 1000)
    assert rx.reports_due() == [(track, SenderReport(1, 2, 0, 0, 500 * MS))]
    assert len(rx._early_reports) <= 4
    rx.receive_rtcp(rtcp.build_sr(0x4444, SenderReport(1, 2, 0, 0)), 1100 * MS)
    assert 0x4444 not in rx._early_reports  # every track has its packets: nothing to wait for


def test_keyframes_are_asked_for_on_request_and_for_a_waiting_viewer_on_tick() -> None:
    rx, _, _ = receiver()
    rx.request_keyframe("video")
    rx.request_keyframe("audio")  # no such track: nothing
    (pli,) = rx.data_to_send()
    assert rtcp.parse_compound(pli) == [rtcp.KeyframeRequest(OURS, (MEDIA,), fir=False)]
    rx.tick(10_000 * MS)  # the viewer has not started: it waits for a keyframe
    assert [rtcp.parse_compound(d)[0] for d in rx.data_to_send()] == [
        rtcp.KeyframeRequest(OURS, (MEDIA,), fir=False)
    ]


class Estimator:
    def __init__(self) -> None:
        self.seen: list[tuple[int, int, int, int]] = []

    def add(self, arrival_time_ms: int, abs_send_time: int, payload_size: int,
            ssrc: int) -> tuple[int, list[int]] | None:
        self.seen.append((arrival_time_ms, abs_send_time, payload_size, ssrc))
        return (300_000, [ssrc]) if len(self.seen) == 2 else None


def test_abs_send_time_estimate_goes_out_as_remb_and_the_hook_sees_each_packet() -> None:
    estimator = Estimator()
    seen: list[PacketInfo] = []
    rx, track, _ = receiver(bitrate=estimator, on_packet=lambda info: seen.append(info))
    track.extensions = {ABS_SEND_TIME: 3}
    for seq in (1, 2):
        rx.receive_rtp(rtp(seq, KEY, extensions=((3, b"\x00\x01\x02"),)), seq * MS, seq)
    assert estimator.seen == [(1, 0x000102, len(KEY), MEDIA), (2, 0x000102, len(KEY), MEDIA)]
    (remb,) = rx.data_to_send()
    assert rtcp.parse_compound(remb) == [rtcp.Remb(OURS, 300_000, (MEDIA,))]
    # The publisher-level hook saw each packet once, with its arrival time.
    assert [(i.sequence_number, i.arrival_ns) for i in seen] == [(1, MS), (2, 2 * MS)]
