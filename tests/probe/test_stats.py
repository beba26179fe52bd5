"""Track and viewer timing statistics against references worked out by hand on synthetic traces.

Traces are 25 fps video at 90 kHz (3600 ticks, 40 ms per frame) unless a test says otherwise, so
every expected figure is a short calculation written next to its assertion.
"""

from __future__ import annotations

import math

import pytest

from sfu_sidecar.probe.stats import (
    FIT_BUCKET_NS,
    KURTOSIS_WINDOW,
    BucketCounts,
    Cause,
    ClockFit,
    InterarrivalJitter,
    TrackStats,
    capture_skew_ms,
    grade,
)

MS = 1_000_000
T0 = 1_000 * FIT_BUCKET_NS  # arrival of the first frame, on a fit-bucket boundary
TICKS = 3600
PUB = "publisher-1"


def feed(stats: TrackStats, arrivals_ms: list[float], *, ssrc: int = 7, ts0: int = 0,
         seq0: int = 100, publisher: str = PUB) -> list[bool]:
    """One packet per frame: frame i has timestamp ts0 + i * TICKS, arriving at arrivals_ms[i]."""
    return [
        stats.on_packet(publisher, ssrc, (seq0 + i) & 0xFFFF, (ts0 + i * TICKS) & 0xFFFFFFFF,
                        T0 + round(a * MS))
        for i, a in enumerate(arrivals_ms)
    ]


def test_constant_trace_has_no_jitter_and_a_flat_clock() -> None:
    stats = TrackStats("video", 90000)
    starts = feed(stats, [40.0 * i for i in range(200)])
    assert all(starts)
    assert stats.frames == 199  # intervals: the first frame has none
    assert stats.jitter.jitter == 0.0
    assert stats.frame_jitter_rms_ms == 0.0
    assert stats.frame_jitter_p2p_ms == 0.0
    assert stats.kurtosis is None  # no spread: kurtosis is undefined, and not bursty
    assert stats.discontinuity_count == 0
    model = stats.fit.model()
    assert model is not None and model.basis == "rtp"
    assert model.rate_error_ppm == 0.0
    assert model.offset_ms == 0.0
    assert model.residual_ms == 0.0
    # 200 frames = 8 s: buckets 0..15 are closed, the 16th is still open.
    assert model.points == 15


def test_jittered_trace_matches_the_rfc3550_recurrence() -> None:
    stats = TrackStats("video", 90000)
    # Every other frame arrives 10 ms late: each arrival gap is 30 or 50 ms for 40 ms of media.
    feed(stats, [40.0 * i + (10.0 if i % 2 else 0.0) for i in range(101)])
    # |D| = 10 ms = 900 ticks for each of the 100 pairs: J_k = 900 * (1 - (15/16)**k).
    expected = 900 * (1 - (15 / 16) ** 100)
    assert stats.jitter.jitter == pytest.approx(expected, rel=1e-12)
    assert stats.jitter.jitter_ms == pytest.approx(expected / 90, rel=1e-12)
    # Deviations alternate +10 / -10 ms.
    assert stats.frame_jitter_rms_ms == pytest.approx(10.0)
    assert stats.frame_jitter_p2p_ms == pytest.approx(20.0)
    # Gaps of 50 and 30 ms half and half: a symmetric two-point distribution, kurtosis -2.
    assert stats.kurtosis == pytest.approx(-2.0)
    # The least-delayed frame of every bucket is an on-time one: the fit sees no jitter at all.
    model = stats.fit.model()
    assert model is not None
    assert model.rate_error_ppm == pytest.approx(0.0, abs=1e-9)
    assert model.offset_ms == pytest.approx(0.0, abs=1e-9)
    assert model.residual_ms == pytest.approx(0.0, abs=1e-9)
    summary = stats.summary()
    # The recurrence approaches 10 ms from below (9.986 ms here): still "good".
    assert summary["jitter"]["grade"] == "good"  # type: ignore[index]
    assert summary["frame_interval"]["grade"] == "fair"  # type: ignore[index]
    assert summary["frame_interval"]["bursty"] is False  # type: ignore[index]


def test_bursty_trace_has_heavy_tailed_gaps() -> None:
    stats = TrackStats("video", 90000)
    # Regular frames, then a renderer stall: the next frame is 120 ms late and the three after
    # it arrive with it, in one burst. Gaps of the last 32 frames: 28 x 40, 160, 0, 0, 0 ms.
    arrivals = [40.0 * i for i in range(29)]  # gaps 1..28 are 40 ms
    stall = arrivals[-1] + 160.0
    arrivals += [stall] * 4
    feed(stats, arrivals)
    assert list(stats.intervals_ms) == [40.0] * 28 + [160.0, 0.0, 0.0, 0.0]
    assert len(stats.intervals_ms) == KURTOSIS_WINDOW
    # Mean 40; deviations 0 (x28), +120, -40 (x3): m2 = 19200/32 = 600,
    # m4 = (120**4 + 3 * 40**4) / 32 = 6_720_000, kurtosis = m4 / m2**2 - 3 = 47/3.
    assert stats.kurtosis == pytest.approx(47 / 3)
    assert stats.summary()["frame_interval"]["bursty"] is True  # type: ignore[index]
    # Deviations from the 40 ms the timestamps announce: 0 (x27), +120, -40, -40, -40.
    assert stats.frame_jitter_p2p_ms == pytest.approx(160.0)
    assert stats.frame_jitter_rms_ms == pytest.approx(math.sqrt((120**2 + 3 * 40**2) / 32))


def test_drifting_publisher_clock() -> None:
    stats = TrackStats("video", 90000)
    # 3600 ticks (40 ms of the publisher's clock) every 39.996 ms of house time: the
    # publisher's clock runs 40 / 39.996 - 1 = 100.010001 ppm fast.
    step_ms = 39.996
    feed(stats, [step_ms * i for i in range(600)])
    model = stats.fit.model()
    assert model is not None
    assert model.rate_error_ppm == pytest.approx((40 / step_ms - 1) * 1e6, abs=1e-6)
    # On the RTP basis the offset starts at 0 on the first frame and grows 4 us per frame; the
    # least-delayed frame of a bucket is its last one, and the model is read at that frame.
    k = round((model.at_ns - T0) / (step_ms * MS))
    assert model.at_ns == T0 + round(k * step_ms * MS)
    assert model.offset_ms == pytest.approx(0.004 * k, abs=1e-6)
    # RFC 3550: D = 39.996 ms * 90 - 3600 = -0.36 ticks per pair.
    assert stats.jitter.jitter == pytest.approx(0.36 * (1 - (15 / 16) ** 599), rel=1e-6)
    assert stats.frame_jitter_rms_ms == pytest.approx(0.004, abs=1e-9)
    assert stats.frame_jitter_p2p_ms == pytest.approx(0.0, abs=1e-9)


def test_timestamps_wrap_at_32_bits_without_a_discontinuity() -> None:
    stats = TrackStats("video", 90000)
    feed(stats, [40.0 * i for i in range(10)], ts0=(1 << 32) - 3 * TICKS, seq0=65530)
    assert stats.frames == 9
    assert stats.discontinuity_count == 0
    assert stats.jitter.jitter == 0.0
    assert stats.frame_jitter_p2p_ms == 0.0
    assert stats.reordered == 0


def test_reordered_packet_counts_in_jitter_but_starts_no_frame() -> None:
    stats = TrackStats("video", 90000)
    # seq/ts n arrive at 40n ms, except 3, which arrives 5 ms after 4.
    order = [(1, 40.0), (2, 80.0), (4, 160.0), (3, 165.0), (5, 200.0)]
    starts = [stats.on_packet(PUB, 7, n, n * TICKS, T0 + round(a * MS)) for n, a in order]
    assert starts == [True, True, True, False, True]
    assert stats.reordered == 1
    assert stats.frames == 3  # 1->2, 2->4, 4->5
    assert list(stats.deviations_ms) == [0.0, 0.0, 0.0]
    # D(4,3) = 5 ms * 90 - (-3600) = 4050; D(3,5) = 35 ms * 90 - 7200 = -4050.
    j = 4050 / 16
    j += (4050 - j) / 16
    assert stats.jitter.jitter == pytest.approx(j)
    assert stats.discontinuity_count == 0


def test_packets_of_one_frame_start_it_once() -> None:
    stats = TrackStats("video", 90000)
    starts = []
    seq = 0
    for frame in range(5):
        for part in range(3):
            starts.append(stats.on_packet(PUB, 7, seq, frame * TICKS,
                                          T0 + frame * 40 * MS + part * MS))
            seq += 1
    assert starts == [True, False, False] * 5
    assert stats.frames == 4
    assert list(stats.deviations_ms) == [0.0] * 4


def test_reconnect_ssrc_change_and_timestamp_jumps_are_discontinuities() -> None:
    stats = TrackStats("video", 90000)
    feed(stats, [40.0 * i for i in range(10)])
    # The same source leaps 5 s ahead in 40 ms of arrival.
    t = T0 + 400 * MS
    assert stats.on_packet(PUB, 7, 110, 9 * TICKS + 5 * 90000, t)
    last = stats.last_discontinuity
    assert last is not None and last.cause is Cause.TIMESTAMP_JUMP
    assert last.jump_ms == pytest.approx(5000.0 - 40.0)
    # ... and then steps back 10 frames.
    t += 40 * MS
    assert stats.on_packet(PUB, 7, 111, 9 * TICKS + 5 * 90000 - 10 * TICKS, t)
    assert stats.discontinuities[Cause.TIMESTAMP_JUMP] == 2
    # A new SSRC in the same session, then a new publisher session.
    t += 40 * MS
    assert stats.on_packet(PUB, 8, 5000, 123456, t)
    assert stats.discontinuities[Cause.SSRC_CHANGE] == 1
    t += 40 * MS
    assert stats.on_packet("publisher-2", 9, 42, 999, t)
    assert stats.discontinuities[Cause.PUBLISHER_RECONNECT] == 1
    assert stats.discontinuity_count == 4
    # None of the breaks entered the jitter figures: all deviations are from before them.
    assert list(stats.deviations_ms) == [0.0] * 9
    assert stats.jitter.jitter == 0.0
    # The new timeline continues normally.
    t += 40 * MS
    assert stats.on_packet("publisher-2", 9, 43, 999 + TICKS, t)
    assert list(stats.deviations_ms)[-1] == 0.0
    summary = stats.summary()["discontinuities"]
    assert summary["total"] == 4  # type: ignore[index]
    assert summary["publisher_reconnect"] == 1  # type: ignore[index]


def test_a_stall_is_jitter_not_a_discontinuity() -> None:
    stats = TrackStats("video", 90000)
    # Arrival pauses for a second while capture time moves on by one frame.
    feed(stats, [0.0, 40.0, 80.0, 1080.0, 1120.0])
    assert stats.discontinuity_count == 0
    assert list(stats.deviations_ms) == [0.0, 0.0, 960.0, 0.0]


def test_clock_fit_ignores_a_wild_bucket() -> None:
    fit = ClockFit("house")
    for i in range(400):  # 16 s of frames 40 ms apart, captured 30 ms before arrival
        arrival = T0 + i * 40 * MS
        late = 200 * MS if 100 <= i < 112 else 0  # one whole bucket queued 200 ms
        fit.add(arrival + late, arrival - 30 * MS)
    model = fit.model()
    assert model is not None and model.basis == "house"
    assert model.rate_error_ppm == pytest.approx(0.0, abs=1e-6)
    assert model.offset_ms == pytest.approx(-30.0, abs=1e-6)
    assert model.residual_ms == pytest.approx(0.0, abs=1e-6)


def test_house_capture_times_give_the_publisher_av_skew() -> None:
    audio, video = TrackStats("audio", 48000), TrackStats("video", 90000)
    for i in range(300):
        t = T0 + i * 20 * MS
        if audio.on_packet(PUB, 1, i, i * 960, t):
            audio.on_frame_capture(t, t - 20 * MS, "house")  # 20 ms capture-to-arrival
        if i % 2 == 0 and video.on_packet(PUB, 2, i // 2, (i // 2) * TICKS // 2 * 2, t):
            video.on_frame_capture(t, t - 60 * MS, "house")  # 60 ms: video is later
    a, v = audio.fit.model(), video.fit.model()
    assert a is not None and v is not None
    # Audio captured 40 ms after the video that arrives with it: audio leads by 40 ms.
    assert capture_skew_ms(a, v, T0 + 6 * 10**9) == pytest.approx(40.0, abs=1e-6)
    # Separate RTP timelines have no common clock: no skew.
    assert capture_skew_ms(TrackStats("audio", 48000).fit.model(), v, T0) is None
    # Back to RTP time when the capture time is no longer known.
    video.on_frame_capture(T0, None, "house")
    assert video.fit.basis == "rtp"


def test_jitter_grades() -> None:
    assert grade(None) is None
    assert grade(9.999) == "good"
    assert grade(10.0) == "fair"
    assert grade(30.0) == "fair"
    assert grade(30.001) == "poor"


def test_interarrival_jitter_ignores_steps_past_the_discontinuity_limit() -> None:
    j = InterarrivalJitter(90000)
    j.add(0, 0)
    j.add(3600, 40 * MS + 900 * MS)  # 900 ms late: a step, not jitter
    assert j.jitter == 0.0
    j.add(7200, 80 * MS + 900 * MS + 10 * MS)
    assert j.jitter == pytest.approx(900 / 16)


def test_bucket_counts_put_a_value_on_a_bound_in_that_bound_and_export_cumulatively() -> None:
    counts = BucketCounts((0.01, 0.1))
    for value in (0.005, 0.01, 0.05, 0.5):
        counts.observe(value)
    assert counts.counts == [2, 1, 1]  # le 0.01, le 0.1, +Inf
    assert counts.buckets() == [("0.01", 2.0), ("0.1", 3.0), ("+Inf", 4.0)]
    assert counts.total == pytest.approx(0.565)
    other = BucketCounts((0.01, 0.1))
    other.observe(0.02)
    counts.add(other)
    assert counts.buckets() == [("0.01", 2.0), ("0.1", 4.0), ("+Inf", 5.0)]
    assert counts.total == pytest.approx(0.585)
