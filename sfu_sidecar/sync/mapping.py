"""RTP timestamp -> capture time on the house clock, per published track. Pure: no clock is
read here; every arrival time is passed in, in house ns.

Sources, best first (docs/architecture.md, "The four timelines"), and each result says which
one it came from:

1. **abs-capture-time** (http://www.webrtc.org/experiments/rtp-hdrext/abs-capture-time): the
   capture timestamp itself (NTP Q32.32 on the capture system's clock), moved to the sender's
   clock by the optional estimated capture clock offset, then to house time by the publisher's
   clock offset. Packets without the extension are extrapolated from the last one that had it,
   as the spec's "timestamp interpolation" section tells receivers to do.
2. **RTCP sender reports**: RFC 3550 section 6.4.1 says an SR's NTP and RTP timestamps name the
   same instant, so successive SRs give a line RTP -> publisher NTP (its slope is the drift of
   the RTP clock against the publisher's NTP clock); the publisher's clock offset moves it to
   house time. Publishers do send inconsistent reports (GStreamer 1.22's ``webrtcbin`` advances
   the SR's RTP timestamp at twice the clock rate of its media), so reports are trusted only once
   checked against each other and against the media that actually arrives: two reports at least
   half a second apart whose RTP advance matches their NTP advance, and whose line puts every
   frame's capture before its arrival and within a sane latency of it, stable over time. A
   track whose reports fail is marked and mapped from arrivals for the rest of its timeline.
3. **arrival**: the house time the first packet of the frame arrived; the anchor line is the
   lower envelope of arrivals (minimum delay), the least jittered guess there is, and flagged
   estimated like every guess.

The publisher's clock offset (house - publisher) is shared by all tracks of one publisher
(:class:`PublisherClock`), which is what puts its audio and video on one timeline. It is
exact when the publisher joined the house clock (``proto/clock.md``), otherwise estimated
from SR NTP vs arrival by minimum-delay filtering and flagged as estimated: such an estimate
is late by the smallest one-way delay seen in its window and cannot be better.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import ClassVar

from sfu_sidecar.ntptime import ntp_to_unix_ns, unix_ns_to_ntp
from sfu_sidecar.sync.abscapture import AbsCaptureTime
from sfu_sidecar.sync.publisherclock import PublisherClock, RtpTimestampUnwrapper
from sfu_sidecar.sync.wire import AnchorRecord, Source, predict_ns, signed32

NS = 1_000_000_000
MASK32 = 0xFFFFFFFF
# How far an RTP clock may run off its nominal rate and still be a clock. Oscillators drift by
# tens of ppm, but a sender's RTP time may count what its device delivered: Chromium's fake
# microphone in an idle headless run counted 0.5 % fewer samples than its NTP clock's seconds
# (its reports and its packets agreed). Past this a fitted slope is a bad fit, and two reports
# apart by more are broken (GStreamer 1.22's webrtcbin advances them at twice the media rate).
MAX_DRIFT_PPB = 10_000_000
# Sender report checks. Two reports at least this far apart measure their rate.
SR_MIN_SPAN_NS = 500_000_000
# How far a sender may stamp a report off its true RTP <-> NTP relation: aiortc, for one, pairs
# the send time of its last packet with that packet's timestamp, which is late by the encode and
# pacing delay (a few ms, up to a frame interval). A rate error shows as much more than this
# within SR_MIN_SPAN_NS (0.5 s for a report running at twice the media rate).
SR_JITTER_NS = 40_000_000
# Reports within this of the line through the window's first and last count as exact: their
# fitted drift is real. A sender stamping at send time scatters by its encode delay, far more.
SR_EXACT_NS = 1_000_000
# Scattered reports anchor on the least late one no older than this. The anchor is extrapolated
# at the nominal rate, so its error grows by the RTP clock's true rate error times its age, and
# RTP clocks are not always near nominal: Chromium's audio under CPU load skips captured samples
# (its RTP time counts samples), so its RTP time fell 1700 ppm behind its NTP time in a loaded
# run, and an anchor 80 s old (16 reports at 5 s) put capture 100 ms early. 8 s bounds that to
# about 14 ms plus the drift until the next report, and still leaves the eight reports of a 1 s
# report interval (aiortc's, for both kinds) to choose the least late from. The cost falls on a
# sender that stamps late and reports only every 5 s: two reports to choose from, so in
# simulation a median error of 9 ms where the whole window gave 2 ms (0-30 ms late stamps).
SR_ANCHOR_AGE_NS = 8 * NS
# Capture precedes arrival; this much apparent lead is left to estimate error (the publisher
# offset taken from the least-delay report, jitter of the report's send instant).
SR_MAX_LEAD_NS = 50_000_000
# A live publisher captures at most this long before its packets arrive.
SR_MAX_LATENCY_NS = 5_000_000_000
# The latency a report line implies may wander by this much from the latency at trust time
# before the reports count as out of step with the media, and only when the reports' own line
# moved that far against the nominal media clock while the media's arrivals did not follow it
# half way. Latency that grows under a line that stays is the path: a sender whose encoder
# falls behind under CPU load queues its packets (110 ms over a minute in one loaded run, with
# reports that were right all along); a line that moves with the media is an RTP clock off its
# nominal rate (Chromium's audio skipping samples), and the two together are both of those.
SR_MAX_LATENCY_CHANGE_NS = 100_000_000
# Reports refused in a row before a track's reports are given up for its timeline.
SR_STRIKES = 3
# A frame's capture time follows its predecessor's by at least a quarter of their RTP spacing,
# up to this (see TrackMapping._forward).
FRAME_MIN_STEP_NS = 10_000_000
# Frames whose capture time later packets (the rest of a frame, reordered, retransmitted) are
# given: 2 s of 60 fps video, 2.5 s of 20 ms audio.
RECENT_FRAMES = 128

@dataclass(frozen=True, slots=True)
class LinearMap:
    """Capture time of any RTP timestamp of the track from ``rtp_ts`` on (upstream RTP
    time); the same formula as a wire anchor, so a viewer interpolates exactly as we do."""

    rtp_ts: int
    rtp_ext: int
    capture_ns: int
    clock_rate: int
    drift_ppb: int
    source: Source
    estimated: bool
    reset: bool  # first map of a new timeline (publisher reconnect, new SSRC)
    version: int  # increases with every new map of the track

    def capture_of_ext(self, rtp_ext: int) -> int:
        return predict_ns(self.capture_ns, self.clock_rate, self.drift_ppb, rtp_ext - self.rtp_ext)

    def capture_of(self, rtp_ts: int) -> int:
        """Capture ns of a 32-bit upstream RTP timestamp within 2**31 ticks of the map."""
        return predict_ns(
            self.capture_ns, self.clock_rate, self.drift_ppb, signed32(rtp_ts - self.rtp_ts)
        )

    def to_anchor(
        self, track: int, ts_offset: int = 0, *, mid: str = "", audio: bool = False,
        generation: int = 0,
    ) -> AnchorRecord:
        """The wire anchor for a viewer whose RTP time is ``upstream + ts_offset`` (mod 2**32)."""
        return AnchorRecord(
            track=track, generation=generation, source=self.source, clock_rate=self.clock_rate,
            rtp_ts=(self.rtp_ts + ts_offset) & MASK32, capture_ns=self.capture_ns,
            drift_ppb=self.drift_ppb, mid=mid, audio=audio, reset=self.reset,
            estimated=self.estimated,
        )


@dataclass(frozen=True, slots=True)
class CaptureTime:
    """The capture time of one RTP packet's frame."""

    rtp_ts: int
    rtp_ext: int
    capture_ns: int
    source: Source
    estimated: bool
    first_packet: bool  # the first packet seen with this timestamp: one frame record each


def _drift_ppb(points: deque[tuple[int, int]], clock_rate: int) -> int:
    """Drift of (ext, ns) points against the nominal rate, from the first and last point."""
    if len(points) < 2:
        return 0
    (e0, n0), (e1, n1) = points[0], points[-1]
    ticks = e1 - e0
    if ticks <= 0:
        return 0
    nominal = ticks * NS / clock_rate
    drift = round(((n1 - n0) / nominal - 1.0) * NS)
    return max(-MAX_DRIFT_PPB, min(MAX_DRIFT_PPB, drift))


class TrackMapping:
    """RTP -> capture time for one published track (one SSRC at a time).

    Feed every packet to :meth:`on_rtp` and every sender report to :meth:`on_sender_report`;
    read :attr:`current` for the anchor to send viewers and :meth:`sender_report_ntp` when a
    viewer's SR is built.
    """

    # Deviation of the active map from the source's newest line that warrants a new map;
    # below it the frame records' residuals carry the difference at no extra cost.
    DEFAULT_TOLERANCE_NS: ClassVar[int] = 500_000

    def __init__(
        self, clock_rate: int, publisher: PublisherClock, *, audio: bool = False,
        tolerance_ns: int = DEFAULT_TOLERANCE_NS, sr_window: int = 16,
        abs_max_age_s: float = 5.0, abs_window_s: float = 30.0, arrival_window: int = 64,
    ) -> None:
        if clock_rate <= 0:
            raise ValueError("clock rate must be positive")
        self.clock_rate = clock_rate
        self.publisher = publisher
        self.audio = audio
        # A pull from another sidecar: that relay writes abs-capture-time only on packets whose
        # capture time it knows exactly, so a packet without it is an estimate there and must
        # be one here too (neither an older stamp nor its sender reports may vouch for it).
        self.relayed = False
        self._tolerance = tolerance_ns
        self._sr_window = sr_window
        self._abs_max_age = int(abs_max_age_s * clock_rate)
        self._abs_window = int(abs_window_s * clock_rate)
        self._arrival_window = arrival_window
        self.ssrc: int | None = None
        self.resets = 0
        self.sr_rejected = 0  # sender reports refused by the checks
        # Frames placed later than their source's line put them, so that capture time never
        # runs backwards (see _forward).
        self.slewed = 0
        # Why this track's reports are not used, None while they are (or none came yet).
        self.sr_distrust: str | None = None
        self._version = 0
        self._map: LinearMap | None = None
        self._start_timeline()

    def _start_timeline(self) -> None:
        self._unwrap = RtpTimestampUnwrapper()
        self._sr: deque[tuple[int, int]] = deque(maxlen=self._sr_window)  # (ext, publisher ns)
        self._sr_pending: tuple[int, int] | None = None  # a first report awaiting a second
        # Latency the trusted line implied when trusted, and where that line then met RTP 0.
        self._sr_latency: tuple[int, int] | None = None
        self._sr_strikes = 0  # reports refused in a row
        self.sr_distrust = None
        self._abs: deque[tuple[int, int]] = deque()  # (ext, sender-clock ns), ≥ 100 ms apart
        self._abs_last: tuple[int, int] | None = None
        self._arrivals: deque[tuple[int, int]] = deque(maxlen=self._arrival_window)
        # The last RECENT_FRAMES frames, oldest first: ext -> (capture ns, source, estimated).
        self._frames: dict[int, tuple[int, Source, bool]] = {}
        self._pending_reset = self.ssrc is not None

    def reset(self, ssrc: int | None = None) -> None:
        """A new timeline: the publisher reconnected or its timestamp base jumped."""
        self.ssrc = ssrc
        self.resets += 1
        self._map = None
        self._start_timeline()
        self._pending_reset = True

    # --- inputs ---------------------------------------------------------------------------

    def on_rtp(
        self, ssrc: int, rtp_ts: int, arrival_ns: int, abs_capture: AbsCaptureTime | None = None,
    ) -> CaptureTime:
        """Capture time of this packet's frame; updates the map as a side effect."""
        if ssrc != self.ssrc:
            if self.ssrc is None:
                self.ssrc = ssrc
            else:
                self.reset(ssrc)
        ext = self._unwrap.unwrap(rtp_ts)
        # Only a timestamp newer than any seen starts a frame: a reordered or retransmitted
        # packet of an older frame must neither repeat its record nor lend it a late arrival.
        newest = next(reversed(self._frames), None)
        first = newest is None or ext > newest
        if first:
            self._arrivals.append((ext, arrival_ns - self._ticks_ns(ext)))
        exact: int | None = None
        if abs_capture is None and self.relayed:
            self._abs_last = None
        if abs_capture is not None:
            exact = abs_capture.sender_clock_ns()
            self._abs_last = (ext, exact)
            if not self._abs or ext - self._abs[-1][0] >= self.clock_rate // 10:
                self._abs.append((ext, exact))
            while self._abs and ext - self._abs[0][0] > self._abs_window:
                self._abs.popleft()
            if first:
                self.publisher.observe_capture(exact, arrival_ns)
        self._refresh(ext)
        m = self._map
        assert m is not None
        if not first:
            known = self._frames.get(ext)
            if known is not None:
                # A later, reordered or retransmitted packet of a recent frame: that frame's
                # time, source and flag, whatever the map says now.
                return CaptureTime(rtp_ts & MASK32, ext, *known, first)
        if m.source is Source.ABS_CAPTURE_TIME and exact is not None:
            capture = exact + (self.publisher.offset_ns or 0)
        else:
            capture = m.capture_of_ext(ext)
        estimated = m.estimated
        if first:
            capture, slewed = self._forward(ext, capture)
            estimated = estimated or slewed
            self._frames[ext] = (capture, m.source, estimated)
            if len(self._frames) > RECENT_FRAMES:
                del self._frames[next(iter(self._frames))]
        return CaptureTime(rtp_ts & MASK32, ext, capture, m.source, estimated, first)

    def _forward(self, ext: int, capture: int) -> tuple[int, bool]:
        """The capture time of a new frame, never before the previous frame's, and whether
        that moved it.

        A better line (a less late report, a lower arrival envelope, a source switch, a
        publisher offset that improved) can put a frame before the one already sent to every
        viewer, and a timeline that runs backwards shows a caption twice and gives a segment a
        timestamp behind its predecessor. A frame is therefore placed at least a quarter of its
        RTP spacing (at most FRAME_MIN_STEP_NS) after the previous one, flagged estimated where
        that moved it, and the following frames close the gap by the rest of their spacing
        each until the line is met: a 100 ms correction takes 4 frames of 40 ms. A smaller step
        (arrival to an exact source, typically the path's few ms) is taken at once. The cap
        keeps a timestamp jump on one SSRC (a sender restarting its RTP time) from pushing
        capture time ahead by a quarter of the jump.
        """
        if self._frames:
            last_ext = next(reversed(self._frames))
            if ext > last_ext:
                step = min((ext - last_ext) * NS // (4 * self.clock_rate), FRAME_MIN_STEP_NS)
                floor = self._frames[last_ext][0] + step
                if capture < floor:
                    self.slewed += 1
                    return floor, True
        return capture, False

    def on_sender_report(
        self, ssrc: int | None, ntp: int, rtp_ts: int, arrival_ns: int,
    ) -> bool:
        """An RTCP SR of this track (RFC 3550 6.4.1); False when it is not for our SSRC.
        ``ssrc=None``: the caller vouches that the report is for the current stream."""
        if ssrc is None:
            ssrc = self.ssrc
        if ssrc is None:
            return False  # nothing to tie an anonymous report to yet
        if self.ssrc is None:
            self.ssrc = ssrc  # a report may come before the stream's first packet
        if ssrc != self.ssrc:
            return False
        publisher_ns = ntp_to_unix_ns(ntp)
        # Without a reference yet the report's timestamp becomes it, so the first packet
        # unwraps against the same base even when the two straddle a 32-bit wrap.
        ext = self._unwrap.peek(rtp_ts) if self._unwrap.last is not None else (
            self._unwrap.unwrap(rtp_ts)
        )
        self.publisher.observe_sender_report(publisher_ns, arrival_ns)
        newest = self._sr[-1] if self._sr else self._sr_pending
        if newest is not None and ext <= newest[0]:
            return True  # repeated or reordered report adds no new line
        if self.sr_distrust is None:
            self._check_sender_report(ext, publisher_ns)
        last = self._unwrap.last
        assert last is not None
        self._refresh(last)
        return True

    def _check_sender_report(self, ext: int, publisher_ns: int) -> None:
        """Take the report into the line only if it agrees with the reports before it and with
        the media; the first one waits for a second to vouch for its rate. A report that does
        not agree is left out; SR_STRIKES of them in a row and the track's reports are not used
        again on this timeline (one late report on a loaded sender is not a broken sender)."""
        newest = self._sr[-1] if self._sr else self._sr_pending
        if (newest is not None and not self._sr
                and 0 < publisher_ns - newest[1] < SR_MIN_SPAN_NS):
            return  # too close to the pending one to measure a rate: wait for a later one
        implied = self._implied_latency(ext, publisher_ns)
        fault = self._sr_fault(ext, publisher_ns, newest, implied)
        if fault is not None:
            self.sr_rejected += 1
            self._sr_strikes += 1
            if self._sr_strikes >= SR_STRIKES:
                self._distrust(fault)
            elif not self._sr:
                self._sr_pending = (ext, publisher_ns)  # start over from this one
            return
        self._sr_strikes = 0
        if newest is None:
            self._sr_pending = (ext, publisher_ns)
            return
        if not self._sr:
            self._sr.append(newest)
            self._sr_latency = implied
        self._sr.append((ext, publisher_ns))

    def _sr_fault(self, ext: int, publisher_ns: int, newest: tuple[int, int] | None,
                  implied: tuple[int, int] | None) -> str | None:
        """Why this report disagrees with the previous one or with the media, if it does."""
        if newest is not None:
            p_ext, p_ns = newest
            span = publisher_ns - p_ns
            if span <= 0:
                return "sender report NTP time not increasing"
            advance = (ext - p_ext) * NS // self.clock_rate
            if abs(advance - span) > span * MAX_DRIFT_PPB // NS + SR_JITTER_NS:
                return f"sender report RTP time advances {advance / span:.3f}x its NTP time"
        if implied is not None:
            latency, zero = implied
            if latency < -SR_MAX_LEAD_NS:
                return f"sender reports put capture {-latency / 1e6:.0f} ms after arrival"
            if latency > SR_MAX_LATENCY_NS:
                return f"sender reports put capture {latency / 1e9:.1f} s before arrival"
            if self._sr_latency is not None:
                latency0, zero0 = self._sr_latency
                moved = zero - zero0  # the reports' line, against the nominal clock
                followed = (latency - latency0) + moved  # the media's arrivals, likewise
                if (abs(latency - latency0) > SR_MAX_LATENCY_CHANGE_NS
                        and abs(moved) > SR_MAX_LATENCY_CHANGE_NS
                        and followed * moved < moved * moved // 2):
                    return (f"sender reports drift {(latency - latency0) / 1e6:+.0f} ms "
                            "against the media")
        return None

    def _sr_line(self) -> tuple[int, int, int]:
        """(anchor ext, publisher ns, drift ppb) from the trusted reports.

        Reports that lie on one line (an exact sender, such as a browser that derives both
        halves from the capture clock) give the newest point and the fitted drift. Reports
        that scatter (a sender that pairs a packet's timestamp with the time it was sent)
        are never early, only late by that sender's delay: the least late of the recent ones
        (SR_ANCHOR_AGE_NS) is the anchor, and the slope is left nominal, since jitter of
        milliseconds over a window of seconds would fit a drift of hundreds of ppm that is not
        there.
        """
        (e0, n0), (e1, n1) = self._sr[0], self._sr[-1]
        # Distance of every report from the line through the first and the last: an exact
        # sender's reports sit on it whatever its drift.
        slope = (n1 - n0) / (e1 - e0) if e1 > e0 else NS / self.clock_rate
        if all(abs(ns - n0 - (ext - e0) * slope) <= SR_EXACT_NS for ext, ns in self._sr):
            s_ext, s_ns = self._sr[-1]
            return s_ext, s_ns, _drift_ppb(self._sr, self.clock_rate)
        recent = [(ext, ns) for ext, ns in self._sr if n1 - ns <= SR_ANCHOR_AGE_NS]
        s_ext, s_ns = min(recent, key=lambda report: report[1] - self._ticks_ns(report[0]))
        return s_ext, s_ns, 0

    def _implied_latency(self, ext: int, publisher_ns: int) -> tuple[int, int] | None:
        """Least capture-to-arrival delay of recent frames if the report's line were true,
        and that line's house time at RTP 0 at the nominal rate. The latter moves when the
        reports' RTP time runs off the nominal rate against their NTP time (or the publisher's
        offset estimate moves); the former also when the media's path to us gets longer."""
        offset = self.publisher.offset_ns
        if offset is None or not self._arrivals:
            return None
        line_at_zero = publisher_ns + offset - self._ticks_ns(ext)
        return min(d for _, d in self._arrivals) - line_at_zero, line_at_zero

    def _distrust(self, reason: str) -> None:
        self.sr_distrust = reason
        self._sr.clear()
        self._sr_pending = None
        self._sr_latency = None

    # --- outputs --------------------------------------------------------------------------

    @property
    def current(self) -> LinearMap | None:
        return self._map

    def capture_of(self, rtp_ts: int) -> int | None:
        return None if self._map is None else self._map.capture_of(rtp_ts)

    def sender_report_ntp(self, viewer_rtp_ts: int, ts_offset: int) -> int | None:
        """NTP timestamp for a viewer's SR carrying ``viewer_rtp_ts``: the capture time of
        that RTP time, so the browser's lip sync (RFC 3550 6.4.1) follows capture, not
        relay send time. ``ts_offset`` is the relay's rewrite, viewer = upstream + offset."""
        capture = self.capture_of((viewer_rtp_ts - ts_offset) & MASK32)
        return None if capture is None else unix_ns_to_ntp(capture)

    # --- internals ------------------------------------------------------------------------

    def _ticks_ns(self, ext: int) -> int:
        return ext * NS // self.clock_rate

    def _line(self, ext: int) -> tuple[Source, int, int, int, bool] | None:
        """Best source's line at ``ext``: (source, anchor ext, capture ns, drift, estimated)."""
        offset = self.publisher.offset_ns
        estimated = self.publisher.estimated
        if offset is not None and self._abs_last is not None:
            a_ext, a_ns = self._abs_last
            if ext - a_ext <= self._abs_max_age:
                return Source.ABS_CAPTURE_TIME, a_ext, a_ns + offset, \
                    _drift_ppb(self._abs, self.clock_rate), estimated
        if offset is not None and self._sr and not self.relayed:
            s_ext, s_ns, drift = self._sr_line()
            return Source.SENDER_REPORT, s_ext, s_ns + offset, drift, estimated
        if self._arrivals:
            lowest = min(d for _, d in self._arrivals)
            # An arrival is an estimate of capture by nature: late by the path's delay.
            return Source.ARRIVAL, ext, lowest + self._ticks_ns(ext), 0, True
        return None

    def _refresh(self, ext: int) -> None:
        line = self._line(ext)
        if line is None:
            return
        source, l_ext, l_ns, drift, estimated = line
        m = self._map
        # Same source: keep the map while it still predicts the line's point (and, for the
        # fitted sources, its slope within 1 ppm: 1 µs per second of extrapolation).
        if (
            m is not None and m.source is source and m.estimated == estimated
            and abs(m.capture_of_ext(l_ext) - l_ns) <= self._tolerance
            and (source is Source.ARRIVAL or abs(m.drift_ppb - drift) <= 1000)
        ):
            return
        self._version += 1
        self._map = LinearMap(
            rtp_ts=l_ext & MASK32, rtp_ext=l_ext, capture_ns=l_ns, clock_rate=self.clock_rate,
            drift_ppb=drift, source=source, estimated=estimated,
            reset=self._pending_reset, version=self._version,
        )
        self._pending_reset = False
