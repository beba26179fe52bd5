"""Publisher and viewer glue: a relayed stream with a per-viewer timestamp rewrite resolves,
on the viewer side, to the publisher's true capture times; rebuilt SRs carry capture time."""

from __future__ import annotations

from sfu_sidecar.ntptime import ntp_to_unix_ns, unix_ns_to_ntp
from sfu_sidecar.sync.abscapture import ABS_CAPTURE_TIME_URI, build_abs_capture_time
from sfu_sidecar.sync.feed import PublisherSync, ViewerSync
from sfu_sidecar.sync.mapping import NS
from sfu_sidecar.sync.wire import AnchorRecord, Batch, FrameRecord, Source, parse_message

T0 = 1_796_025_600 * NS
OFFSET = 750_000_000  # house - publisher


def test_relayed_stream_resolves_to_true_capture_times() -> None:
    pub = PublisherSync()
    pub.join(OFFSET)
    viewers = [ViewerSync(), ViewerSync()]
    offsets = [0x1234_5678, 0xFFFF_FF00]
    for v in viewers:
        v.add_track("video", "0")
        v.add_track("audio", "1")
    truth: list[dict[tuple[int, int], int]] = [{}, {}]
    anchors: list[dict[tuple[int, int], AnchorRecord]] = [{}, {}]
    resolved: list[dict[tuple[int, int], int]] = [{}, {}]

    def deliver(i: int, now: int) -> None:
        raw = viewers[i].poll(now)
        if raw is None:
            return
        msg = parse_message(raw)
        assert isinstance(msg, Batch)
        for rec in msg.records:
            if isinstance(rec, AnchorRecord):
                anchors[i][(rec.track, rec.generation)] = rec
            elif isinstance(rec, FrameRecord):
                a = anchors[i][(rec.track, rec.generation)]
                resolved[i][(rec.track, rec.rtp_ts(a))] = rec.capture_ns(a)

    events = []
    for f in range(90):  # 3 s of video, abs-capture-time on every frame
        events.append((T0 + f * NS // 30, "video"))
    for p in range(150):  # 3 s of audio, sender reports only
        events.append((T0 + p * 20_000_000, "audio"))
    events.sort()
    for capture, kind in events:
        arrival = capture + 40_000_000
        if kind == "video":
            ts = (10_000 + (capture - T0) * 90_000 // NS) & 0xFFFFFFFF
            ext = {ABS_CAPTURE_TIME_URI: build_abs_capture_time(capture - OFFSET)}
            got = pub.on_packet("video", 111, ts, arrival, 90_000, ext)
            track = 0
        else:
            ts = ((1 << 32) - 48_000 + (capture - T0) * 48_000 // NS) & 0xFFFFFFFF
            if (capture - T0) % NS == 0:
                pub.on_sender_report("audio", unix_ns_to_ntp(capture - OFFSET), ts, arrival)
            got = pub.on_packet("audio", 222, ts, arrival, 48_000)
            track = 1
        for i, v in enumerate(viewers):
            viewer_ts = (ts + offsets[i]) & 0xFFFFFFFF
            v.on_forwarded(kind, pub.mappings[kind], got, viewer_ts, arrival, keyframe=False)
            # Exact frames only: not arrival estimates, nor the audio frames that close the
            # step back from arrival to the sender reports' line.
            if not got.estimated:
                truth[i][(track, viewer_ts)] = capture
            deliver(i, arrival)
    for i in range(2):
        for k in range(5):  # drain what the last 200 ms left queued
            deliver(i, T0 + 3_100_000_000 + k * 200_000_000)
        checked = 0
        for key, capture in truth[i].items():
            if key in resolved[i]:
                # RTP quantisation (one tick: 11 µs video, 21 µs audio) is the only error.
                assert abs(resolved[i][key] - capture) <= 21_000, key
                checked += 1
        assert checked == len(truth[i])
        # Every video frame is exact. The audio maps by arrival until its second report that
        # follows a packet (2 s in: the one at 0 s came before any packet, so before the SSRC
        # was known), then all of its 50 frames but the few that close the 40 ms step back.
        assert sum(1 for track, _ in truth[i] if track == 0) == 90
        assert 45 <= sum(1 for track, _ in truth[i] if track == 1) < 50
    # The audio frames before the first SR came from arrival; from it on, sender reports.
    assert pub.mappings["audio"].current is not None
    assert pub.mappings["audio"].current.source is Source.SENDER_REPORT
    assert pub.mappings["video"].current is not None
    assert pub.mappings["video"].current.source is Source.ABS_CAPTURE_TIME

    # Each viewer's SR carries the capture time of its own rewritten timestamp.
    at = T0 + 2 * NS + 500_000_000
    audio_ts = ((1 << 32) - 48_000 + (at - T0) * 48_000 // NS) & 0xFFFFFFFF
    for i, v in enumerate(viewers):
        ntp = v.sender_report_ntp("audio", (audio_ts + offsets[i]) & 0xFFFFFFFF)
        assert ntp is not None and abs(ntp_to_unix_ns(ntp) - at) <= 21_000
    assert ViewerSync().sender_report_ntp("audio", 0) is None


def test_bad_abs_capture_time_is_counted_and_ignored() -> None:
    pub = PublisherSync()
    got = pub.on_packet("video", 1, 0, T0, 90_000, {ABS_CAPTURE_TIME_URI: b"\x01\x02\x03"})
    assert pub.bad_extensions == 1 and got.source is Source.ARRIVAL


def test_reconnect_forgets_the_publisher_clock() -> None:
    pub = PublisherSync()
    pub.join(OFFSET)
    pub.on_packet("audio", 5, 100, T0, 48_000)
    pub.reconnect()
    assert pub.clock.offset_ns is None and pub.mappings["audio"].resets == 1
