"""Timing statistics of published tracks. Pure: every time is passed in.

Per published track, :class:`TrackStats` takes each RTP packet in arrival order and keeps

* RFC 3550 §6.4.1 interarrival jitter, the exact recurrence ``J += (|D| - J) / 16`` in
  timestamp units (:class:`InterarrivalJitter`);
* frame-interval jitter: how far each frame's arrival gap strays from the gap its RTP
  timestamps announce, as RMS and peak-to-peak over the last ``FRAME_WINDOW`` frames, and the
  excess kurtosis of the last ``KURTOSIS_WINDOW`` arrival gaps (a renderer that stalls and then
  bursts gives a heavy-tailed gap distribution);
* capture-time discontinuities by cause (:class:`Cause`);
* a robust line through capture time against arrival time (:class:`ClockFit`): the publisher
  clock's rate error in ppm and its offset against the house clock in ms, with the spread of the
  points around the line.

What viewers report is in ``viewers.py``.

Everything per packet is a few arithmetic operations; per frame, a few appends to bounded
deques; the windowed figures are computed when read (about once a second) and the line is
refitted after every FIT_REFIT_POINTS new points, so the cost per packet and per frame stays O(1)
amortised.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from sfu_sidecar.estimators import (
    MAD_TO_SIGMA,
    excess_kurtosis,
    peak_to_peak,
    rms,
    theil_sen,
)

NS = 1_000_000_000
MS = 1_000_000
MASK32 = 0xFFFFFFFF

# A capture-time step this far ahead of the arrival step, or any step backwards, is a
# discontinuity rather than jitter: it is counted by cause and kept out of the jitter figures.
DISCONTINUITY_NS = 800_000_000
FRAME_WINDOW = 64  # frames in the RMS / peak-to-peak window: about 2 s of 30 fps video
KURTOSIS_WINDOW = 32
BURSTY_KURTOSIS = 3.5
# Jitter grades, ms: good below GOOD_MS, fair up to FAIR_MS, poor above.
GOOD_MS = 10.0
FAIR_MS = 30.0
# Clock fit: one point per bucket (its least-delayed frame: the lower envelope of arrivals is
# where queueing noise is smallest), the last FIT_POINTS buckets (32 s) in the fit.
FIT_BUCKET_NS = 500_000_000
FIT_POINTS = 64
# Refit after this many new points (4 s): the slope moves by parts per million, and a fit of
# 64 points costs about 0.1 ms.
FIT_REFIT_POINTS = 8
FIT_MIN_POINTS = 8  # 4 s: fewer points give slopes dominated by one bucket's queueing
# 1.4826 x MAD estimates a normal distribution's standard deviation.

RTP_BASIS = "rtp"


class Cause(StrEnum):
    """Why a track's capture timeline broke."""

    PUBLISHER_RECONNECT = "publisher_reconnect"  # a new publisher session: new clock, new bases
    SSRC_CHANGE = "ssrc_change"  # same session, a new source (encoder restart, simulcast switch)
    TIMESTAMP_JUMP = "timestamp_jump"  # same source, timestamps leapt ahead or went back


def signed32(value: int) -> int:
    """A 32-bit difference as a signed number (RFC 3550 timestamps wrap at 2**32)."""
    value &= MASK32
    return value - (1 << 32) if value >= 1 << 31 else value


def grade(jitter_ms: float | None) -> str | None:
    """``good`` below 10 ms, ``fair`` up to 30 ms, ``poor`` above; None without a value."""
    if jitter_ms is None:
        return None
    if jitter_ms < GOOD_MS:
        return "good"
    return "fair" if jitter_ms <= FAIR_MS else "poor"


class InterarrivalJitter:
    """RFC 3550 §6.4.1 interarrival jitter of one RTP source, in timestamp units.

    ``D(i, j) = (Rj - Ri) - (Sj - Si)`` for consecutive packets in arrival order (not sequence
    order), ``J += (|D| - J) / 16``, in floating point rather than A.8's integer scaling. Arrival
    times are converted to timestamp units at the nominal clock rate; timestamps are compared
    modulo 2**32. A step of more than ``DISCONTINUITY_NS`` is a discontinuity, not jitter, and
    is left out.
    """

    __slots__ = ("_last_arrival_ns", "_last_ts", "_limit", "_started", "clock_rate", "jitter")

    def __init__(self, clock_rate: int) -> None:
        self.clock_rate = clock_rate
        self.jitter = 0.0
        self._started = False
        self._last_ts = 0
        self._last_arrival_ns = 0
        self._limit = DISCONTINUITY_NS * clock_rate / NS

    def add(self, timestamp: int, arrival_ns: int) -> None:
        if self._started:
            d = ((arrival_ns - self._last_arrival_ns) * self.clock_rate / NS
                 - signed32(timestamp - self._last_ts))
            d = abs(d)
            if d <= self._limit:
                self.jitter += (d - self.jitter) / 16.0
        self._started = True
        self._last_ts = timestamp
        self._last_arrival_ns = arrival_ns

    def reset(self) -> None:
        self.jitter = 0.0
        self._started = False

    @property
    def jitter_ms(self) -> float:
        return self.jitter * 1000.0 / self.clock_rate


@dataclass(frozen=True, slots=True)
class ClockModel:
    """capture = arrival + offset, with the offset changing at ``rate_error_ppm``.

    ``rate_error_ppm``: how much faster the publisher's capture clock runs than the house
    clock (alpha). ``offset_ms``: capture time minus arrival time at ``at_ns`` (beta): when capture
    times are on the house clock this is minus the capture-to-arrival latency; on the
    ``rtp`` basis it is relative to the track's first frame. ``residual_ms``: robust spread of
    the points around the line (sigma).
    """

    basis: str
    rate_error_ppm: float
    offset_ms: float
    residual_ms: float
    at_ns: int
    points: int
    span_s: float

    def offset_ms_at(self, arrival_ns: int) -> float:
        return self.offset_ms + (arrival_ns - self.at_ns) / MS * self.rate_error_ppm * 1e-6


class ClockFit:
    """Robust linear fit of capture time against arrival time for one track.

    Feed every frame's (arrival, capture) pair; the frame with the largest ``capture -
    arrival`` (least delayed) of each ``FIT_BUCKET_NS`` of arrival time becomes a point, and
    :meth:`model` fits the last ``FIT_POINTS`` points with :func:`theil_sen`.
    """

    def __init__(self, basis: str = RTP_BASIS) -> None:
        self.basis = basis
        self._points: deque[tuple[int, int]] = deque(maxlen=FIT_POINTS)
        self._bucket: int | None = None
        self._best: tuple[int, int] | None = None
        self._model: ClockModel | None = None
        self._fresh = 0  # points added since the last fit

    def add(self, arrival_ns: int, capture_ns: int) -> None:
        bucket = arrival_ns // FIT_BUCKET_NS
        if bucket != self._bucket:
            if self._best is not None:
                self._points.append(self._best)
                self._fresh += 1
            self._bucket, self._best = bucket, (arrival_ns, capture_ns)
        elif self._best is not None and capture_ns - arrival_ns > self._best[1] - self._best[0]:
            self._best = (arrival_ns, capture_ns)

    def model(self) -> ClockModel | None:
        """The fit over the closed buckets; None before FIT_MIN_POINTS of them. Refitted
        once FIT_REFIT_POINTS new points arrived (and for the first model at once)."""
        if not self._fresh or (self._model is not None and self._fresh < FIT_REFIT_POINTS):
            return self._model
        self._fresh = 0
        pts = list(self._points)
        if len(pts) < FIT_MIN_POINTS:
            self._fresh = len(pts)  # fit as soon as there are enough
            self._model = None
            return None
        x0, y0 = pts[0]
        # Seconds from the first point: float64 keeps well under a nanosecond at this range.
        xs = [(a - x0) / NS for a, _ in pts]
        ys = [(c - y0) / NS for _, c in pts]
        slope, intercept = theil_sen(xs, ys)
        residuals = np.asarray(ys) - (slope * np.asarray(xs) + intercept)
        sigma = MAD_TO_SIGMA * float(np.median(np.abs(residuals - np.median(residuals))))
        at_ns, x_last = pts[-1][0], xs[-1]
        offset_s = (y0 - x0) / NS + slope * x_last + intercept - x_last
        self._model = ClockModel(
            basis=self.basis,
            rate_error_ppm=(slope - 1.0) * 1e6,
            offset_ms=offset_s * 1000.0,
            residual_ms=sigma * 1000.0,
            at_ns=at_ns,
            points=len(pts),
            span_s=x_last,
        )
        return self._model


@dataclass(frozen=True, slots=True)
class Discontinuity:
    cause: Cause
    arrival_ns: int
    ssrc: int
    # Capture step minus arrival step, ms; None when the timeline itself was replaced.
    jump_ms: float | None


class TrackStats:
    """Timing statistics of one published track (one kind of one stream)."""

    # Slots: every packet reads and writes a dozen of these.
    __slots__ = (
        "_candidate_bucket", "_candidate_delay", "_external_basis", "_first_arrival",
        "_frame_arrival", "_frame_ext", "_frame_ts", "_limit_ns", "_max_seq", "_ticks_to_ns",
        "_window_memo", "candidate", "clock_rate", "deviations_ms", "discontinuities", "fit",
        "frames", "intervals_ms", "jitter", "kind", "last_deviation_ms", "last_discontinuity",
        "packets", "publisher", "reordered", "ssrc",
    )

    def __init__(self, kind: str, clock_rate: int) -> None:
        self.kind = kind
        self.clock_rate = clock_rate
        self.packets = 0
        self.frames = 0
        self.reordered = 0
        self.ssrc: int | None = None
        self.publisher: str | None = None
        self.jitter = InterarrivalJitter(clock_rate)
        self.deviations_ms: deque[float] = deque(maxlen=FRAME_WINDOW)
        self.intervals_ms: deque[float] = deque(maxlen=KURTOSIS_WINDOW)
        self.last_deviation_ms: float | None = None  # of the newest frame, None if it had none
        self.discontinuities: dict[Cause, int] = dict.fromkeys(Cause, 0)
        self.last_discontinuity: Discontinuity | None = None
        self.fit = ClockFit()
        self._external_basis: str | None = None
        self._max_seq = 0
        self._frame_ts = 0
        self._frame_arrival = 0
        self._frame_ext = 0  # timestamp of the newest frame, unwrapped, from the first one
        self._first_arrival = 0
        self._candidate_bucket = -1
        self._candidate_delay = 0
        # Whether the newest frame may be its fit bucket's least-delayed one (see on_packet).
        self.candidate = False
        self._ticks_to_ns = NS / clock_rate
        self._limit_ns = DISCONTINUITY_NS
        self._window_memo: tuple[int, float | None, float | None, float | None] = (
            -1, None, None, None)

    # --- input --------------------------------------------------------------------------------

    def on_packet(
        self, publisher: str, ssrc: int, seq: int, timestamp: int, arrival_ns: int
    ) -> bool:
        """One RTP packet in arrival order. True when it is the first packet of a new frame
        (then :attr:`last_deviation_ms` is that frame's deviation and the caller may hand its
        capture time to :meth:`on_frame_capture`)."""
        self.packets += 1
        if ssrc != self.ssrc or publisher != self.publisher:
            self._restart(publisher, ssrc, seq, timestamp, arrival_ns)
            return True
        # InterarrivalJitter.add, inline: this runs for every packet of every stream.
        jitter = self.jitter
        d = ((arrival_ns - jitter._last_arrival_ns) * self.clock_rate / NS
             - (((timestamp - jitter._last_ts + 0x80000000) & MASK32) - 0x80000000))
        if d < 0:
            d = -d
        if d <= jitter._limit:
            jitter.jitter += (d - jitter.jitter) / 16.0
        jitter._last_ts = timestamp
        jitter._last_arrival_ns = arrival_ns
        ahead = (seq - self._max_seq) & 0xFFFF
        if ahead == 0 or ahead >= 0x8000:
            self.reordered += ahead != 0
            return False  # an older packet (reordered or repaired): never a new frame
        self._max_seq = seq
        step = ((timestamp - self._frame_ts + 0x80000000) & MASK32) - 0x80000000  # signed32
        if step == 0:
            return False
        gap_ns = arrival_ns - self._frame_arrival
        capture_step_ns = step * self._ticks_to_ns
        if step < 0 or capture_step_ns - gap_ns > self._limit_ns:
            self._discontinuity(Cause.TIMESTAMP_JUMP, ssrc, arrival_ns,
                                (capture_step_ns - gap_ns) / MS)
            self._start_frames(timestamp, arrival_ns)
            return True
        self.frames += 1
        deviation = (gap_ns - capture_step_ns) / MS
        self.last_deviation_ms = deviation
        self.deviations_ms.append(deviation)
        self.intervals_ms.append(gap_ns / MS)
        self._frame_ts = timestamp
        self._frame_arrival = arrival_ns
        self._frame_ext += step
        # Only the least-delayed frame of each fit bucket becomes a point, and on one capture
        # timeline every basis orders frames by delay as the RTP timestamps do: frames that
        # cannot be a bucket's best are settled here, without asking for their capture time.
        rtp_capture = self._first_arrival + int(self._frame_ext * self._ticks_to_ns)
        delay = rtp_capture - arrival_ns
        bucket = arrival_ns // FIT_BUCKET_NS
        if bucket != self._candidate_bucket or delay > self._candidate_delay:
            self._candidate_bucket, self._candidate_delay = bucket, delay
            self.candidate = True
            if self._external_basis is None:
                self.fit.add(arrival_ns, rtp_capture)
        else:
            self.candidate = False
        return True

    def on_frame_capture(self, arrival_ns: int, capture_ns: int | None, basis: str) -> None:
        """The newest frame's capture time on another basis than its RTP timestamps (e.g. the
        house clock, from the publisher's clock join); None returns to the RTP basis. A change
        of basis starts a new fit. Only frames flagged :attr:`candidate` need it."""
        if capture_ns is None:
            if self._external_basis is not None:
                self._external_basis = None
                self.fit = ClockFit()
                self.fit.add(arrival_ns, self._rtp_capture_ns(self._frame_ext))
            return
        if basis != self._external_basis:
            self._external_basis = basis
            self.fit = ClockFit(basis)
        self.fit.add(arrival_ns, capture_ns)

    def _rtp_capture_ns(self, ext: int) -> int:
        # The RTP timeline placed on the arrival clock at the timeline's first frame.
        return self._first_arrival + int(ext * self._ticks_to_ns)

    def _restart(
        self, publisher: str, ssrc: int, seq: int, timestamp: int, arrival_ns: int
    ) -> None:
        if self.publisher is not None:
            cause = Cause.PUBLISHER_RECONNECT if publisher != self.publisher else Cause.SSRC_CHANGE
            self._discontinuity(cause, ssrc, arrival_ns, None)
        self.publisher, self.ssrc = publisher, ssrc
        self.jitter.reset()
        self.jitter.add(timestamp, arrival_ns)
        self._max_seq = seq
        self._start_frames(timestamp, arrival_ns)

    def _start_frames(self, timestamp: int, arrival_ns: int) -> None:
        """A new capture timeline: frame gaps across the break mean nothing."""
        self._frame_ts = timestamp
        self._frame_arrival = self._first_arrival = arrival_ns
        self._frame_ext = 0
        self.last_deviation_ms = None
        self.fit = ClockFit()
        self._external_basis = None
        self.fit.add(arrival_ns, arrival_ns)
        self._candidate_bucket, self._candidate_delay = arrival_ns // FIT_BUCKET_NS, 0
        self.candidate = True

    def _discontinuity(
        self, cause: Cause, ssrc: int, arrival_ns: int, jump_ms: float | None
    ) -> None:
        self.discontinuities[cause] += 1
        self.last_discontinuity = Discontinuity(cause, arrival_ns, ssrc, jump_ms)

    # --- output -------------------------------------------------------------------------------

    @property
    def last_frame_ns(self) -> int:
        """Arrival of the newest frame's first packet."""
        return self._frame_arrival

    def _windowed(self) -> tuple[float | None, float | None, float | None]:
        # Read several times a second (alerts, dashboard, API); the windows change only with
        # a new frame, so the figures are kept until then.
        if self._window_memo[0] != self.frames:
            kurt = (excess_kurtosis(self.intervals_ms)
                    if len(self.intervals_ms) >= KURTOSIS_WINDOW else None)
            self._window_memo = (self.frames, rms(self.deviations_ms),
                                 peak_to_peak(self.deviations_ms), kurt)
        return self._window_memo[1:]

    @property
    def frame_jitter_rms_ms(self) -> float | None:
        return self._windowed()[0]

    @property
    def frame_jitter_p2p_ms(self) -> float | None:
        return self._windowed()[1]

    @property
    def kurtosis(self) -> float | None:
        """Excess kurtosis of the last KURTOSIS_WINDOW arrival gaps (None until it is full)."""
        return self._windowed()[2]

    @property
    def discontinuity_count(self) -> int:
        return sum(self.discontinuities.values())

    def summary(self) -> dict[str, object]:
        """Every figure of the track, JSON-ready (ms, ppm)."""
        jitter_ms = self.jitter.jitter_ms
        rms_ms = self.frame_jitter_rms_ms
        kurt = self.kurtosis
        model = self.fit.model()
        last = self.last_discontinuity
        return {
            "kind": self.kind,
            "clock_rate": self.clock_rate,
            "ssrc": self.ssrc,
            "packets": self.packets,
            "frames": self.frames,
            "reordered": self.reordered,
            "jitter": {
                "rfc3550_ticks": round(self.jitter.jitter, 3),
                "rfc3550_ms": round(jitter_ms, 3),
                "grade": grade(jitter_ms),
            },
            "frame_interval": {
                "window": len(self.deviations_ms),
                "rms_ms": round_or_none(rms_ms),
                "peak_to_peak_ms": round_or_none(self.frame_jitter_p2p_ms),
                "grade": grade(rms_ms),
                "kurtosis": round_or_none(kurt),
                "bursty": kurt is not None and kurt > BURSTY_KURTOSIS,
            },
            "discontinuities": {
                "total": self.discontinuity_count,
                **{cause.value: n for cause, n in self.discontinuities.items()},
                "last": None if last is None else {
                    "cause": last.cause.value, "arrival_ns": last.arrival_ns,
                    "ssrc": last.ssrc, "jump_ms": round_or_none(last.jump_ms),
                },
            },
            "clock": None if model is None else {
                "basis": model.basis,
                "rate_error_ppm": round(model.rate_error_ppm, 3),
                "offset_ms": round(model.offset_ms, 3),
                "residual_ms": round(model.residual_ms, 3),
                "points": model.points,
                "span_s": round(model.span_s, 3),
            },
        }


def capture_skew_ms(audio: ClockModel | None, video: ClockModel | None,
                    at_ns: int) -> float | None:
    """A/V capture-time skew of one publisher at arrival time ``at_ns``: audio capture minus
    video capture of what arrives together, ms. Positive: audio leads (ITU-R BT.1359 sign).
    Only when both fits share a clock basis other than their separate RTP timelines."""
    if audio is None or video is None or audio.basis != video.basis or audio.basis == RTP_BASIS:
        return None
    return audio.offset_ms_at(at_ns) - video.offset_ms_at(at_ns)


def round_or_none(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


# Buckets around the thresholds the alerts and grades use (seconds).
FRAME_DEVIATION_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.08, 0.112, 0.2, 0.5, 1.0)


class BucketCounts:
    """A histogram kept as plain numbers on the packet path and exported when scraped
    (prometheus_client's observe() takes a lock and costs several times more per frame)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...] = FRAME_DEVIATION_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # le: value <= bound
        self.total += value

    def add(self, other: BucketCounts) -> None:
        for i, n in enumerate(other.counts):
            self.counts[i] += n
        self.total += other.total

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative (le, count) pairs as Prometheus writes them."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == math.inf else repr(float(bound)), float(running)))
        return out
