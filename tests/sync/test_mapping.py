"""RTP -> capture time from sender reports, abs-capture-time and arrival, against publishers
simulated with exactly known capture times."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import pytest

from sfu_sidecar.ntptime import ns_to_q32, ntp_to_unix_ns, unix_ns_to_ntp
from sfu_sidecar.sync.abscapture import AbsCaptureTime, AbsCaptureTimeError, build_abs_capture_time
from sfu_sidecar.sync.mapping import NS, TrackMapping
from sfu_sidecar.sync.publisherclock import PublisherClock, RtpTimestampUnwrapper
from sfu_sidecar.sync.wire import FrameRecord, Source

HOUSE_T0 = 1_796_025_600 * NS + 987_654_321  # 2026-11-30T08:00Z and change
PUB_OFFSET = -3_210_987_654  # house - publisher: the publisher's clock runs 3.2 s ahead


@dataclass
class SimTrack:
    """A publisher track whose capture times are known exactly.

    RTP time runs from ``base`` at ``HOUSE_T0`` at ``clock_rate * (1 + rtp_drift)``, so the
    true capture time of a timestamp is known; the publisher's NTP clock reads house time
    minus ``PUB_OFFSET``.
    """

    clock_rate: int
    base: int
    ssrc: int
    rtp_drift: float = 0.0

    def rtp_at(self, house_ns: int) -> int:
        ticks = (house_ns - HOUSE_T0) * self.clock_rate * (1 + self.rtp_drift) / NS
        return (self.base + round(ticks)) & 0xFFFFFFFF

    def true_capture(self, ticks_since_base: int) -> int:
        return HOUSE_T0 + round(ticks_since_base * NS / (self.clock_rate * (1 + self.rtp_drift)))

    def sr(self, house_ns: int) -> tuple[int, int]:
        """(NTP, RTP) of an SR taken at ``house_ns``: both name the same instant (RFC 3550)."""
        return unix_ns_to_ntp(house_ns - PUB_OFFSET), self.rtp_at(house_ns)


# --- conversions ----------------------------------------------------------------------------


def test_ntp_epoch_and_round_trip() -> None:
    assert unix_ns_to_ntp(0) == 2_208_988_800 << 32
    assert ntp_to_unix_ns(2_208_988_800 << 32) == 0
    assert ntp_to_unix_ns((2_208_988_800 << 32) | (1 << 31)) == NS // 2
    rng = random.Random(5)
    for _ in range(1000):
        ns = rng.randrange(HOUSE_T0 - 10**17, HOUSE_T0 + 10**17)
        # Q32.32 resolves 0.23 ns: a round trip is exact to the nanosecond.
        assert abs(ntp_to_unix_ns(unix_ns_to_ntp(ns)) - ns) <= 1


def test_ntp_after_the_2036_rollover() -> None:
    later = (2_085_978_496 + 3600) * NS  # one hour after 2036-02-07T06:28:16Z (era 1)
    ntp = unix_ns_to_ntp(later)
    assert ntp >> 32 == 3600
    assert ntp_to_unix_ns(ntp) == later


def test_abs_capture_time_forms() -> None:
    capture = HOUSE_T0 + 123
    short = build_abs_capture_time(capture)
    assert len(short) == 8
    parsed = AbsCaptureTime.parse(short)
    assert parsed.clock_offset_q32 is None
    assert abs(parsed.sender_clock_ns() - capture) <= 1

    # 16-byte form: offset = sender clock - capture clock, so sender time = capture + offset.
    long = AbsCaptureTime(unix_ns_to_ntp(capture), ns_to_q32(-2_500_000)).serialize()
    assert len(long) == 16
    assert abs(AbsCaptureTime.parse(long).sender_clock_ns() - (capture - 2_500_000)) <= 1
    assert build_abs_capture_time(capture, -2_500_000) == long
    for bad in (b"", b"\x00" * 7, b"\x00" * 9, b"\x00" * 17):
        with pytest.raises(AbsCaptureTimeError):
            AbsCaptureTime.parse(bad)


def test_unwrapper_crosses_the_wrap_both_ways() -> None:
    u = RtpTimestampUnwrapper()
    a = u.unwrap(0xFFFF_FF00)
    b = u.unwrap(0x0000_0100)  # wrapped forward
    assert b - a == 0x200
    c = u.unwrap(0xFFFF_FF80)  # a reordered packet from before the wrap
    assert c == a + 0x80
    assert u.last == b  # and it did not drag the reference back


# --- sender reports -------------------------------------------------------------------------


def _feed_video(
    m: TrackMapping, track: SimTrack, seconds: float, *, sr_every: float | None = 1.0,
    start: int = HOUSE_T0, net_delay_ns: int = 20_000_000,
) -> list[tuple[int, int, Source]]:
    """30 fps, 3 packets a frame, SRs at ``sr_every``; returns (ticks, mapped, source)."""
    out = []
    next_sr = start
    for i in range(int(seconds * 30)):
        t = start + i * NS // 30
        if sr_every is not None and t >= next_sr:
            ntp, rtp = track.sr(t)
            assert m.on_sender_report(track.ssrc, ntp, rtp, t + net_delay_ns)
            next_sr += int(sr_every * NS)
        ts = track.rtp_at(t)
        for p in range(3):
            got = m.on_rtp(track.ssrc, ts, t + net_delay_ns + p * 100_000)
            assert got.first_packet == (p == 0)
        ticks = (ts - track.base) & 0xFFFFFFFF
        out.append((ticks, got.capture_ns, got.source))
    return out


def test_sender_reports_map_frames_to_true_capture_time_across_the_wrap() -> None:
    # RTP clock 20 ppm fast against the publisher's clock; base 10 s before the 32-bit wrap.
    track = SimTrack(90_000, base=(1 << 32) - 900_000, ssrc=0x1234, rtp_drift=20e-6)
    clock = PublisherClock()
    clock.join(PUB_OFFSET)
    m = TrackMapping(90_000, clock)
    frames = _feed_video(m, track, 20.0)
    # The first report waits for a second one to vouch for its rate: arrival until then.
    assert all(src is Source.ARRIVAL for _, _, src in frames[:30])
    assert all(src is Source.SENDER_REPORT for _, _, src in frames[30:])
    # From the second SR on the slope is fitted: the error is the SR timestamps' own
    # rounding to whole ticks (one 90 kHz tick is 11.1 µs), wrap included.
    errors = [abs(cap - track.true_capture(ticks)) for ticks, cap, _ in frames[30:]]
    assert max(errors) < 12_000
    assert any(ticks > 900_000 for ticks, _, _ in frames)  # the wrap was crossed
    cur = m.current
    assert cur is not None and not cur.estimated and abs(cur.drift_ppb + 20_000) < 50


def test_arrival_until_the_first_sender_report() -> None:
    track = SimTrack(90_000, base=1000, ssrc=7)
    clock = PublisherClock()
    clock.join(PUB_OFFSET)
    m = TrackMapping(90_000, clock)
    first = m.on_rtp(7, track.rtp_at(HOUSE_T0), HOUSE_T0 + 30_000_000)
    assert first.source is Source.ARRIVAL and first.capture_ns == HOUSE_T0 + 30_000_000
    assert not m.on_sender_report(8, *track.sr(HOUSE_T0), HOUSE_T0)  # not our SSRC
    assert m.on_sender_report(7, *track.sr(HOUSE_T0), HOUSE_T0 + 30_000_000)
    t = HOUSE_T0 + NS // 30
    got = m.on_rtp(7, track.rtp_at(t), t + 30_000_000)
    assert got.source is Source.ARRIVAL  # one report alone is not trusted yet
    t_sr = HOUSE_T0 + NS
    m.on_rtp(7, track.rtp_at(t_sr), t_sr + 30_000_000)
    assert m.on_sender_report(7, *track.sr(t_sr), t_sr + 30_000_000)
    # The line is 30 ms earlier than the arrivals were, and the frames are 33 ms apart: the
    # first frame on it would land 3 ms after the last arrival-mapped one, so it is placed a
    # quarter frame (8.3 ms) after it, flagged; the next frame is on the line.
    t = t_sr + NS // 30
    got = m.on_rtp(7, track.rtp_at(t), t + 30_000_000)
    assert got.source is Source.SENDER_REPORT and got.estimated
    assert abs(got.capture_ns - (t_sr + 30_000_000 + NS // 120)) <= 12_000
    assert m.slewed == 1
    t += NS // 30
    got = m.on_rtp(7, track.rtp_at(t), t + 30_000_000)
    assert got.source is Source.SENDER_REPORT and not got.estimated
    assert abs(got.capture_ns - t) <= 1


def test_offset_estimated_from_jittered_sender_reports() -> None:
    """No clock join: the offset comes from SR NTP vs arrival. With a one-way delay of
    8 ms + exponential jitter (mean 15 ms) and 60 reports, the minimum-delay estimate is the
    true offset plus the 8 ms base delay plus at most 2 ms (P(miss) = e**-8 per run; seeded)."""
    rng = random.Random(20261130)
    video = SimTrack(90_000, base=5_000, ssrc=1)
    audio = SimTrack(48_000, base=3_000_000_000, ssrc=2)
    clock = PublisherClock(window=64)
    mv, ma = TrackMapping(90_000, clock), TrackMapping(48_000, clock, audio=True)
    mv.on_rtp(1, video.rtp_at(HOUSE_T0), HOUSE_T0)
    ma.on_rtp(2, audio.rtp_at(HOUSE_T0), HOUSE_T0)
    base_delay = 8_000_000
    for i in range(30):
        for track, m in ((video, mv), (audio, ma)):
            t = HOUSE_T0 + i * NS + rng.randrange(NS // 2)
            arrival = t + base_delay + int(rng.expovariate(1 / 15_000_000))
            m.on_sender_report(track.ssrc, *track.sr(t), arrival)
    offset = clock.offset_ns
    assert offset is not None and clock.estimated
    bias = offset - PUB_OFFSET - base_delay
    assert 0 <= bias <= 2_000_000, bias
    t = HOUSE_T0 + 31 * NS
    got = mv.on_rtp(1, video.rtp_at(t), t + base_delay)
    assert got.source is Source.SENDER_REPORT and got.estimated
    assert 0 <= got.capture_ns - t - base_delay <= 2_000_000
    cur = mv.current
    assert cur is not None and cur.estimated
    assert cur.to_anchor(0).estimated


def test_audio_and_video_land_on_one_timeline() -> None:
    """A flash and a beep captured at the same instant map to the same house time, though
    their RTP clocks, bases and SR instants all differ (the lip-sync requirement)."""
    video = SimTrack(90_000, base=123_456, ssrc=10, rtp_drift=-30e-6)
    audio = SimTrack(48_000, base=(1 << 32) - 48_000, ssrc=11, rtp_drift=15e-6)
    for joined in (True, False):
        clock = PublisherClock()
        if joined:
            clock.join(PUB_OFFSET)
        mv, ma = TrackMapping(90_000, clock), TrackMapping(48_000, clock, audio=True)
        mv.on_rtp(10, video.rtp_at(HOUSE_T0), HOUSE_T0)
        ma.on_rtp(11, audio.rtp_at(HOUSE_T0), HOUSE_T0)
        for i in range(6):
            tv, ta = HOUSE_T0 + i * NS, HOUSE_T0 + i * NS + 370_000_000
            mv.on_sender_report(10, *video.sr(tv), tv + 12_000_000)
            ma.on_sender_report(11, *audio.sr(ta), ta + 12_000_000)
        event = HOUSE_T0 + 6 * NS + 250_000_000
        cv = mv.on_rtp(10, video.rtp_at(event), event + 40_000_000)
        ca = ma.on_rtp(11, audio.rtp_at(event), event + 25_000_000)
        assert cv.source is ca.source is Source.SENDER_REPORT
        # RTP rounding (11 µs at 90 kHz, 21 µs at 48 kHz) bounds the skew, nothing else.
        assert abs(cv.capture_ns - ca.capture_ns) < 25_000
        if joined:
            assert abs(cv.capture_ns - event) < 25_000


def test_sender_report_rebuilt_for_a_viewer() -> None:
    track = SimTrack(48_000, base=77, ssrc=3)
    clock = PublisherClock()
    clock.join(PUB_OFFSET)
    m = TrackMapping(48_000, clock, audio=True)
    m.on_rtp(3, track.rtp_at(HOUSE_T0), HOUSE_T0)
    m.on_sender_report(3, *track.sr(HOUSE_T0), HOUSE_T0)
    ts_offset = 0xDEAD_BEEF
    t = HOUSE_T0 + 2 * NS + 5_000_000  # the SR's instant, not a frame's
    viewer_ts = (track.rtp_at(t) + ts_offset) & 0xFFFFFFFF
    ntp = m.sender_report_ntp(viewer_ts, ts_offset)
    assert ntp is not None
    assert abs(ntp_to_unix_ns(ntp) - t) <= 21_000  # one 48 kHz tick
    assert TrackMapping(48_000, clock).sender_report_ntp(viewer_ts, ts_offset) is None


# --- abs-capture-time -----------------------------------------------------------------------


def test_abs_capture_time_wins_and_is_exact_with_its_clock_offset() -> None:
    """A mixer stamps the capturer's clock plus the offset to its own; the publisher's SRs
    are there too, but abs-capture-time ranks first."""
    track = SimTrack(90_000, base=42, ssrc=5)
    clock = PublisherClock()
    clock.join(PUB_OFFSET)
    m = TrackMapping(90_000, clock)
    capture_clock_offset = 7_000_000  # sender clock - capture clock
    for i in range(90):
        t = HOUSE_T0 + i * NS // 30
        if i % 30 == 0:
            m.on_sender_report(5, *track.sr(t), t + 1_000_000)
        # Give each capture a little jitter the RTP timestamp does not show.
        true = t + (i % 7) * 50_000
        ext = AbsCaptureTime(
            unix_ns_to_ntp(true - PUB_OFFSET - capture_clock_offset),
            ns_to_q32(capture_clock_offset),
        )
        got = m.on_rtp(5, track.rtp_at(t), t + 30_000_000, ext if i % 2 == 0 else None)
        assert got.source is Source.ABS_CAPTURE_TIME
        if i % 2 == 0:
            assert abs(got.capture_ns - true) <= 2
        else:
            # Extrapolated from the previous stamped frame (spec: timestamp interpolation).
            assert abs(got.capture_ns - t) < 400_000
    # Stamps stop: after abs_max_age of RTP time the sender reports take over.
    t = HOUSE_T0 + 9 * NS
    m.on_sender_report(5, *track.sr(t), t + 1_000_000)
    got = m.on_rtp(5, track.rtp_at(t), t + 30_000_000)
    assert got.source is Source.SENDER_REPORT and abs(got.capture_ns - t) < 1_000


def test_a_relayed_track_is_exact_only_on_packets_that_carry_abs_capture_time() -> None:
    """A pull from another sidecar: that relay stamps only the capture times it knows
    exactly. An unstamped packet is an estimate there, so it is one here: neither the last
    stamp nor the upstream's sender reports (built from its estimates) may make it exact."""
    track = SimTrack(90_000, base=7, ssrc=3)
    clock = PublisherClock()
    clock.join(PUB_OFFSET)  # the edge joined the upstream's house clock
    m = TrackMapping(90_000, clock)
    m.relayed = True
    frame_ns = NS // 30
    seen = []
    for i in range(60):
        t = HOUSE_T0 + i * frame_ns
        if i % 15 == 0:
            m.on_sender_report(3, *track.sr(t), t + 1_000_000)
        stamped = 20 <= i < 40  # the upstream knew these exactly; before and after, not
        ext = AbsCaptureTime(unix_ns_to_ntp(t - PUB_OFFSET)) if stamped else None
        got = m.on_rtp(3, track.rtp_at(t), t + 20_000_000, ext)
        seen.append((stamped, got.source, got.estimated))
        if stamped:
            assert abs(got.capture_ns - t) <= 2
    for stamped, source, estimated in seen:
        if stamped:
            assert source is Source.ABS_CAPTURE_TIME and not estimated
        else:
            assert source is Source.ARRIVAL and estimated

    # The same packets on a track that is not relayed: the sender reports make them exact.
    m = TrackMapping(90_000, clock)
    for i in range(90):
        t = HOUSE_T0 + i * frame_ns
        if i % 15 == 0:
            m.on_sender_report(3, *track.sr(t), t + 1_000_000)
        got = m.on_rtp(3, track.rtp_at(t), t + 20_000_000)
    assert got.source is Source.SENDER_REPORT and not got.estimated


def test_abs_capture_time_without_join_or_reports_is_estimated_from_arrival() -> None:
    m = TrackMapping(90_000, PublisherClock())
    t = HOUSE_T0
    ext = AbsCaptureTime(unix_ns_to_ntp(t - PUB_OFFSET))
    got = m.on_rtp(9, 1000, t + 50_000_000, ext)
    assert got.source is Source.ABS_CAPTURE_TIME and got.estimated
    assert got.capture_ns == pytest.approx(t + 50_000_000, abs=2)


# --- reconnect and arrival ------------------------------------------------------------------


def test_publisher_reconnect_starts_a_new_timeline() -> None:
    clock = PublisherClock()
    clock.join(PUB_OFFSET)
    m = TrackMapping(90_000, clock)
    old = SimTrack(90_000, base=100, ssrc=0xAAAA)
    _feed_video(m, old, 3.0)
    first = m.current
    assert first is not None and not first.reset and first.source is Source.SENDER_REPORT

    start = HOUSE_T0 + 10 * NS
    new = SimTrack(90_000, base=3_000_000_000, ssrc=0xBBBB)
    # HOUSE_T0-based SimTrack: shift so the new track's base is at `start`.
    new_base_at_start = new.rtp_at(start)
    got = m.on_rtp(0xBBBB, new_base_at_start, start + 20_000_000)
    assert m.resets == 1
    # The old SR line means nothing for the new base: arrival until the new SRs come.
    assert got.source is Source.ARRIVAL and got.capture_ns == start + 20_000_000
    cur = m.current
    assert cur is not None and cur.reset and cur.version > first.version
    m.on_sender_report(0xBBBB, *new.sr(start), start + 20_000_000)
    m.on_sender_report(0xBBBB, *new.sr(start + NS), start + NS + 20_000_000)
    t = start + NS + NS // 30
    got = m.on_rtp(0xBBBB, new.rtp_at(t), t + 20_000_000)
    assert got.source is Source.SENDER_REPORT and abs(got.capture_ns - t) <= 12_000
    assert m.current is not None and not m.current.reset  # reset flags the first map only


def test_arrival_line_is_the_lower_envelope_and_frames_sit_on_it() -> None:
    """Frames map to the lower envelope of arrivals, not each to its own arrival: the
    least jittered guess, and the same line a viewer's anchor carries, so a frame whose record
    a viewer lacks maps to where its record would have put it."""
    rng = random.Random(3)
    m = TrackMapping(90_000, PublisherClock())
    track = SimTrack(90_000, base=0xFFFF_0000, ssrc=4)
    arrivals, frames = [], []
    for i in range(120):
        t = HOUSE_T0 + i * NS // 30
        # Jitter of up to a few frame intervals: raw arrivals would run backwards.
        arrival = t + 10_000_000 + int(rng.expovariate(1 / 25_000_000))
        got = m.on_rtp(4, track.rtp_at(t), arrival)
        cur = m.current
        assert got.source is Source.ARRIVAL and got.estimated and cur is not None
        assert got.capture_ns <= arrival + m.DEFAULT_TOLERANCE_NS  # the map's own slack
        assert abs(got.capture_ns - cur.capture_of(got.rtp_ts)) <= 12_000
        arrivals.append((track.rtp_at(t), arrival))
        frames.append((arrival, got.capture_ns, got.source))
    _monotonic_and_rate(frames)
    cur = m.current
    assert cur is not None and cur.source is Source.ARRIVAL
    recent = arrivals[-64:]
    # Never later than an arrival it saw, and close to the earliest ones.
    slack = [arr - cur.capture_of(ts) for ts, arr in recent]
    assert min(slack) >= -m.DEFAULT_TOLERANCE_NS - 12_000
    assert min(slack) <= 12_000 + m.DEFAULT_TOLERANCE_NS


def test_frames_encode_against_the_viewer_anchor_exactly() -> None:
    """The relay's map, rewritten by its ts offset, resolves every frame on the viewer side
    to the capture time the mapping produced."""
    track = SimTrack(90_000, base=(1 << 32) - 30_000, ssrc=6, rtp_drift=35e-6)
    clock = PublisherClock()
    clock.join(PUB_OFFSET)
    m = TrackMapping(90_000, clock)
    ts_offset = 0x8000_0001
    records = []
    for i in range(150):
        t = HOUSE_T0 + i * NS // 30
        if i % 30 == 0:
            m.on_sender_report(6, *track.sr(t), t)
        got = m.on_rtp(6, track.rtp_at(t), t + 5_000_000)
        cur = m.current
        assert cur is not None
        anchor = cur.to_anchor(0, ts_offset, mid="0")
        viewer_ts = (got.rtp_ts + ts_offset) & 0xFFFFFFFF
        rec = FrameRecord.against(anchor, viewer_ts, got.capture_ns, got.source)
        assert rec is not None
        records.append((anchor, rec, got.capture_ns, viewer_ts))
    for anchor, rec, capture, viewer_ts in records:
        assert rec.capture_ns(anchor) == capture
        assert rec.rtp_ts(anchor) == viewer_ts


def test_retransmitted_packet_of_an_older_frame_is_not_a_new_frame() -> None:
    m = TrackMapping(90_000, PublisherClock())
    a = m.on_rtp(1, 3000, HOUSE_T0)
    b = m.on_rtp(1, 6000, HOUSE_T0 + 33_000_000)
    late = m.on_rtp(1, 3000, HOUSE_T0 + 400_000_000)  # RTX of the first frame, 400 ms on
    assert a.first_packet and b.first_packet and not late.first_packet
    assert late.source is Source.ARRIVAL
    # Mapped by the arrival line, not given the retransmission's arrival.
    assert abs(late.capture_ns - HOUSE_T0) < 1_000_000
    assert m.on_rtp(1, 9000, HOUSE_T0 + 66_000_000).first_packet


# --- sender reports that disagree with the media ----------------------------------------------


def _sr_trace(m: TrackMapping, track: SimTrack, seconds: float, sr_rtp: object,
              net_delay_ns: int = 3_000_000) -> list[tuple[int, int, Source]]:
    """30 fps media at the nominal rate with an SR every 1 s whose RTP timestamp comes from
    ``sr_rtp(house_ns)`` (a publisher's own, possibly wrong, idea). Returns (arrival, mapped,
    source) per frame."""
    assert callable(sr_rtp)
    out = []
    next_sr = HOUSE_T0 + NS // 2
    for i in range(int(seconds * 30)):
        t = HOUSE_T0 + i * NS // 30
        if t >= next_sr:
            m.on_sender_report(track.ssrc, unix_ns_to_ntp(t - PUB_OFFSET), sr_rtp(t),
                               t + net_delay_ns)
            next_sr += NS
        got = m.on_rtp(track.ssrc, track.rtp_at(t), t + net_delay_ns)
        out.append((t + net_delay_ns, got.capture_ns, got.source))
    return out


def _monotonic_and_rate(frames: list[tuple[int, int, Source]]) -> float:
    captures = [c for _, c, _ in frames]
    assert all(b > a for a, b in itertools.pairwise(captures)), "went backwards"
    (a0, c0, _), (a1, c1, _) = frames[0], frames[-1]
    return (c1 - c0) / (a1 - a0) - 1.0


def test_sender_reports_running_at_twice_the_media_rate_are_refused() -> None:
    """GStreamer 1.22 webrtcbin: the SR's RTP timestamp advances 2x against its (correct) NTP
    time while its packets advance at the nominal rate. Used, such reports throw capture time
    back by seconds at every report; refused, the track maps from arrivals and stays steady."""
    track = SimTrack(90_000, base=5_000, ssrc=9)
    m = TrackMapping(90_000, PublisherClock())
    frames = _sr_trace(m, track, 30.0,
                       lambda t: (track.base + 2 * (t - HOUSE_T0) * 90_000 // NS) & 0xFFFFFFFF)
    assert abs(_monotonic_and_rate(frames)) < 1e-3
    assert {src for _, _, src in frames} == {Source.ARRIVAL}
    assert m.sr_distrust is not None and "2.000x" in m.sr_distrust
    assert m.sr_rejected == 3  # three in a row, then the track's reports are given up


def test_sender_reports_that_put_capture_after_arrival_are_refused() -> None:
    track = SimTrack(90_000, base=77, ssrc=3)
    m = TrackMapping(90_000, PublisherClock())
    # Right rate, but the RTP timestamp names an instant 300 ms earlier than the NTP time.
    frames = _sr_trace(m, track, 10.0, lambda t: track.rtp_at(t - 300_000_000))
    assert {src for _, _, src in frames} == {Source.ARRIVAL}
    assert m.sr_distrust is not None and "after arrival" in m.sr_distrust
    _monotonic_and_rate(frames)


def test_sender_reports_drifting_from_the_media_are_dropped_when_they_part() -> None:
    """Reports consistent among themselves (their RTP runs 800 ppm fast against their NTP,
    inside what a clock may drift) while the packets run at the nominal rate: trusted while
    they agree with arrivals, refused once the two part by more than 100 ms (~2 minutes)."""
    track = SimTrack(90_000, base=1, ssrc=4)
    m = TrackMapping(90_000, PublisherClock())
    frames = _sr_trace(m, track, 150.0,
                       lambda t: (track.base + round((t - HOUSE_T0) * 90_072 / NS)) & 0xFFFFFFFF)
    sources = [src for _, _, src in frames]
    assert Source.SENDER_REPORT in sources and sources[-1] is Source.ARRIVAL
    assert m.sr_distrust is not None and "against the media" in m.sr_distrust


def test_consistent_sender_reports_are_kept_for_the_whole_stream() -> None:
    track = SimTrack(90_000, base=123_456, ssrc=5, rtp_drift=30e-6)
    m = TrackMapping(90_000, PublisherClock())
    frames = _sr_trace(m, track, 60.0, track.rtp_at)
    assert m.sr_distrust is None and m.sr_rejected == 0
    assert all(src is Source.SENDER_REPORT for _, _, src in frames[60:])
    assert abs(_monotonic_and_rate(frames)) < 1e-3


def test_a_new_timeline_trusts_reports_afresh() -> None:
    track = SimTrack(90_000, base=5_000, ssrc=9)
    m = TrackMapping(90_000, PublisherClock())
    _sr_trace(m, track, 5.0,
              lambda t: (track.base + 2 * (t - HOUSE_T0) * 90_000 // NS) & 0xFFFFFFFF)
    assert m.sr_distrust is not None
    m.reset(10)
    assert m.sr_distrust is None


def test_reports_stamped_at_send_time_map_to_the_least_late_one() -> None:
    """aiortc pairs the send time of its last packet with that packet's timestamp: reports late
    by 2-9 ms of encode and pacing delay. Used as exact lines they jump by that jitter and fit a
    drift of hundreds of ppm; the least late report of the window with the nominal slope stays
    within the smallest delay of the truth."""
    rng = random.Random(11)
    track = SimTrack(90_000, base=40_000, ssrc=12)
    clock = PublisherClock()
    clock.join(PUB_OFFSET)
    m = TrackMapping(90_000, clock)
    frames = _sr_trace(m, track, 30.0,
                       lambda t: track.rtp_at(t - rng.randint(2_000_000, 9_000_000)))
    assert m.sr_distrust is None
    assert abs(_monotonic_and_rate(frames)) < 1e-4
    late = [c - (a - 3_000_000) for a, c, src in frames[300:] if src is Source.SENDER_REPORT]
    assert len(late) == len(frames) - 300
    # Never early; late by the least delay among the window's eight reports (2 + 7/9 ms on
    # average), where the newest report alone would be late by 5.5 ms on average, 9 at worst.
    assert min(late) >= 1_990_000 and max(late) < 5_000_000, (min(late), max(late))
    assert sorted(late)[len(late) // 2] < 3_500_000
    cur = m.current
    assert cur is not None and cur.drift_ppb == 0


def test_one_late_report_is_left_out_and_the_rest_kept() -> None:
    """A loaded sender may stamp one report 150 ms late: that report is refused and counted,
    the track keeps its reports, and the timeline does not move."""
    track = SimTrack(90_000, base=9, ssrc=21)
    clock = PublisherClock()
    clock.join(PUB_OFFSET)
    m = TrackMapping(90_000, clock)
    late_at = HOUSE_T0 + NS // 2 + 10 * NS  # the eleventh report

    def sr_rtp(t: int) -> int:
        return track.rtp_at(t - 150_000_000 if t == late_at else t)

    frames = _sr_trace(m, track, 30.0, sr_rtp)
    assert m.sr_rejected == 1 and m.sr_distrust is None
    assert all(src is Source.SENDER_REPORT for _, _, src in frames[60:])
    errors = [abs(c - (a - 3_000_000)) for a, c, _ in frames[60:]]
    assert max(errors) <= 12_000


def test_reports_of_a_sender_that_skips_samples_anchor_on_recent_ones() -> None:
    """Chromium's audio under CPU load skips captured samples, and its RTP time counts samples:
    RTP time falls behind (1700 ppm in a loaded run) while every report, taken from the last
    frame's capture time, names its instant exactly. The reports then scatter away from any
    one line; anchored on the least late of a long window (the oldest), capture time fell 100 ms
    behind. Anchored on the least late of the last 8 s it stays within 20 ms and runs at 1 s
    per second within 0.1 %."""
    clock = PublisherClock()
    clock.join(PUB_OFFSET)
    m = TrackMapping(48_000, clock)
    rtp, t = 3_000, HOUSE_T0
    next_sr = HOUSE_T0 + NS // 2
    last: tuple[int, int] | None = None  # (capture house ns, RTP) of the last frame
    frames = []
    for i in range(3000):  # a minute of 20 ms frames
        if last is not None and t >= next_sr:
            since = (t - last[0]) * 48_000 // NS
            m.on_sender_report(1, unix_ns_to_ntp(t - PUB_OFFSET), (last[1] + since) & 0xFFFFFFFF,
                               t + 3_000_000)
            next_sr += 5 * NS
        got = m.on_rtp(1, rtp & 0xFFFFFFFF, t + 3_000_000)
        frames.append((t + 3_000_000, got.capture_ns, got.source))
        last = (t, rtp)
        rtp += 960
        t += 20_000_000 + (10_000_000 if i % 300 == 299 else 0)  # 10 ms skipped every 6 s
    steady = frames[300:]
    assert all(src is Source.SENDER_REPORT for _, _, src in steady)
    assert abs(_monotonic_and_rate(steady)) < 1e-3
    errors = [c - (a - 3_000_000) for a, c, _ in steady]
    assert max(abs(e) for e in errors) <= 20_000_000, (min(errors), max(errors))
    assert m.sr_distrust is None and m.sr_rejected == 0


def test_reports_of_an_rtp_clock_half_a_percent_slow_are_kept() -> None:
    """Chromium's fake microphone in an idle headless run counted 0.5 % fewer samples than its
    clock's seconds; its reports said so and its packets arrived at that rate. Such a clock is
    odd but real: its reports are kept and fit its drift, so frames map to the true capture."""
    track = SimTrack(90_000, base=55, ssrc=0x55, rtp_drift=-0.005)
    clock = PublisherClock()
    clock.join(PUB_OFFSET)
    m = TrackMapping(90_000, clock)
    frames = _feed_video(m, track, 30.0)
    assert m.sr_distrust is None and m.sr_rejected == 0
    assert all(src is Source.SENDER_REPORT for _, _, src in frames[30:])
    errors = [abs(cap - track.true_capture(ticks)) for ticks, cap, _ in frames[30:]]
    assert max(errors) < 12_000
    cur = m.current
    assert cur is not None and abs(cur.drift_ppb - 5_025_126) < 5_000  # 1/0.995 - 1


def test_reports_are_kept_while_a_loaded_sender_queues_its_media() -> None:
    """A sender whose encoder falls behind under CPU load queues its packets: the latency from
    capture to arrival grows (2000 ppm, 150 ms over 75 s) while its reports, taken from the
    capture clock, stay right. The reports are kept and frames stay on the true capture time;
    it is the reports' own line moving against the media that gets them refused."""
    track = SimTrack(90_000, base=9_000, ssrc=0x66)
    clock = PublisherClock()
    clock.join(PUB_OFFSET)
    m = TrackMapping(90_000, clock)
    out = []
    next_sr = HOUSE_T0
    for i in range(75 * 30):
        t = HOUSE_T0 + i * NS // 30
        delay = 5_000_000 + (t - HOUSE_T0) // 500  # 2000 ppm of the elapsed time
        if t >= next_sr:
            m.on_sender_report(0x66, *track.sr(t), t + 1_000_000)
            next_sr += NS
        got = m.on_rtp(0x66, track.rtp_at(t), t + delay)
        out.append((t, got.capture_ns, got.source))
    assert m.sr_distrust is None and m.sr_rejected == 0
    assert all(src is Source.SENDER_REPORT for _, _, src in out[30:])
    assert max(abs(cap - t) for t, cap, _ in out[30:]) < 12_000


def test_a_better_line_never_runs_capture_time_backwards() -> None:
    """Arrival-mapped frames whose path delay drops by 150 ms (a sender's queue drains): the
    envelope moves 150 ms earlier. Taken at once, capture time would step back by more than
    four frames. Instead every frame stays after the previous one by at least a quarter of
    its spacing, the moved ones are flagged and counted, and the line is met within 7 frames."""
    m = TrackMapping(90_000, PublisherClock())
    track = SimTrack(90_000, base=1_000, ssrc=0x77)
    frames, moved = [], []
    for i in range(300):
        t = HOUSE_T0 + i * NS // 30
        delay = 160_000_000 if i < 150 else 10_000_000
        got = m.on_rtp(0x77, track.rtp_at(t), t + delay)
        frames.append((t + delay, got.capture_ns, got.source))
        cur = m.current
        assert cur is not None
        moved.append(got.capture_ns - cur.capture_of(got.rtp_ts))
    captures = [c for _, c, _ in frames]
    spacing = NS // 30
    assert all(b - a >= spacing // 4 - 1 for a, b in itertools.pairwise(captures))
    assert m.slewed >= 1
    slewed_frames = [i for i, d in enumerate(moved) if d > 0]
    assert slewed_frames and slewed_frames[0] >= 150 and slewed_frames[-1] < 157
    on_line = HOUSE_T0 + 160 * spacing + 10_000_000
    assert moved[160] == 0 and abs(captures[160] - on_line) < NS // 1000


def test_every_packet_of_a_frame_gets_that_frames_time_and_flag() -> None:
    """Frames of three packets, the last arriving after a report that moves the line (the map
    changes within a frame), and a retransmission of a frame the guard moved: each packet
    gets the time, source and flag its frame was given, so a segment timed by a frame's last
    packet stays in order, and no packet claims an exactness its frame did not have."""
    track = SimTrack(90_000, base=70, ssrc=0x88)
    clock = PublisherClock()
    clock.join(PUB_OFFSET)
    m = TrackMapping(90_000, clock)
    given: dict[int, tuple[int, Source, bool]] = {}
    next_sr = HOUSE_T0
    for i in range(90):
        t = HOUSE_T0 + i * NS // 30
        ts = track.rtp_at(t)
        for p in range(3):
            # 120 ms late until the reports are trusted; the second report lands mid-frame.
            got = m.on_rtp(0x88, ts, t + 120_000_000 + p * 1_000_000)
            if p == 0:
                given[ts] = (got.capture_ns, got.source, got.estimated)
            else:
                assert (got.capture_ns, got.source, got.estimated) == given[ts]
            if p == 0 and t >= next_sr:
                m.on_sender_report(0x88, *track.sr(t), t + 1_000_000)
                next_sr += NS
    captures = [c for c, _, _ in given.values()]
    assert all(b > a for a, b in itertools.pairwise(captures))
    moved = [ts for ts, (c, src, est) in given.items()
             if src is Source.SENDER_REPORT and est]
    assert moved and m.slewed == len(moved)
    # A retransmission of a moved frame keeps its place, where the line would put it before
    # its predecessor.
    ts = moved[0]
    again = m.on_rtp(0x88, ts, HOUSE_T0 + 4 * NS)
    assert not again.first_packet
    assert (again.capture_ns, again.source, again.estimated) == given[ts]
    # Frames after the step are exact and on the line.
    last_ts = track.rtp_at(HOUSE_T0 + 89 * NS // 30)
    assert given[last_ts][1:] == (Source.SENDER_REPORT, False)
    assert abs(given[last_ts][0] - (HOUSE_T0 + 89 * NS // 30)) <= 12_000


def test_a_timestamp_jump_on_one_ssrc_does_not_push_capture_time_ahead() -> None:
    """A sender that restarts its RTP time 10 s ahead on the same SSRC: the frame after the
    jump follows its predecessor by at most FRAME_MIN_STEP_NS, not a quarter of the jump, and
    stays on its arrival."""
    m = TrackMapping(90_000, PublisherClock())
    out = []
    for i in range(120):
        t = HOUSE_T0 + i * NS // 30
        ts = 1_000 + i * 3_000 + (900_000 if i >= 60 else 0)
        got = m.on_rtp(0x99, ts, t + 20_000_000)
        out.append((t + 20_000_000, got.capture_ns))
    assert all(b > a for (_, a), (_, b) in itertools.pairwise(out))
    assert all(capture <= arrival + m.DEFAULT_TOLERANCE_NS for arrival, capture in out)


def test_reports_of_a_sender_that_skips_samples_and_queues_under_load_are_kept() -> None:
    """Both at once, as on a loaded machine: audio whose RTP time falls behind its clock by
    1700 ppm (skipped samples; exact reports) and a send queue growing by 2000 ppm. The
    reports' line moves against the nominal clock and the implied latency grows, each past
    100 ms within a minute, but the media's arrivals moved with the line: the reports stay."""
    clock = PublisherClock()
    clock.join(PUB_OFFSET)
    m = TrackMapping(48_000, clock)
    rtp, t = 3_000, HOUSE_T0
    next_sr = HOUSE_T0 + NS // 2
    last: tuple[int, int] | None = None
    frames = []
    for i in range(4500):  # 90 s of 20 ms frames
        if last is not None and t >= next_sr:
            since = (t - last[0]) * 48_000 // NS
            m.on_sender_report(1, unix_ns_to_ntp(t - PUB_OFFSET), (last[1] + since) & 0xFFFFFFFF,
                               t + 1_000_000)
            next_sr += 5 * NS
        queue = 3_000_000 + (t - HOUSE_T0) // 500
        got = m.on_rtp(1, rtp & 0xFFFFFFFF, t + queue)
        frames.append((t, got.capture_ns, got.source))
        last = (t, rtp)
        rtp += 960
        t += 20_000_000 + (10_000_000 if i % 300 == 299 else 0)
    assert m.sr_distrust is None and m.sr_rejected == 0
    steady = frames[300:]
    assert all(src is Source.SENDER_REPORT for _, _, src in steady)
    assert max(abs(c - true) for true, c, _ in steady) <= 20_000_000


def test_reports_two_percent_off_their_media_are_refused_at_the_first_pair() -> None:
    """Reports whose RTP time runs 1.9 % fast against their NTP time, 5 s apart, while the
    packets run at the nominal rate: past what any clock here did (0.5 %), refused at the
    first pair, so no frame is mapped by them."""
    track = SimTrack(90_000, base=1, ssrc=4)
    clock = PublisherClock()
    clock.join(PUB_OFFSET)
    m = TrackMapping(90_000, clock)
    next_sr = HOUSE_T0
    for i in range(30 * 30):
        t = HOUSE_T0 + i * NS // 30
        if t >= next_sr:
            rtp = (track.base + round((t - HOUSE_T0) * 90_000 * 1.019 / NS)) & 0xFFFFFFFF
            m.on_sender_report(4, unix_ns_to_ntp(t - PUB_OFFSET), rtp, t + 1_000_000)
            next_sr += 5 * NS
        got = m.on_rtp(4, track.rtp_at(t), t + 3_000_000)
        assert got.source is Source.ARRIVAL
    assert m.sr_rejected >= 1
