"""A publisher's clock against the house clock, and extended RTP time (pure).

:class:`PublisherClock` keeps one publisher's offset, ``house = publisher + offset``: exact
once the publisher joined the house clock, otherwise the least-delay estimate from its sender
reports (or, before any, its capture stamps) against their arrival, flagged as estimated.
"""

from __future__ import annotations

from collections import deque

from sfu_sidecar.sync.wire import signed32

NS = 1_000_000_000
MASK32 = 0xFFFFFFFF


class RtpTimestampUnwrapper:
    """32-bit RTP timestamps -> 64-bit extended ones, by serial arithmetic on the difference
    to the previous timestamp (as RFC 3550 appendix A.1 extends sequence numbers). The first
    timestamp maps to ``2**32 + ts`` so a small step backwards never goes negative."""

    def __init__(self) -> None:
        self._last: int | None = None

    @property
    def last(self) -> int | None:
        return self._last

    def peek(self, ts: int) -> int:
        if self._last is None:
            return (1 << 32) + (ts & MASK32)
        return self._last + signed32(ts - self._last)

    def unwrap(self, ts: int) -> int:
        ext = self.peek(ts)
        # Only move forward: a late (reordered) packet must not drag the reference back.
        if self._last is None or ext > self._last:
            self._last = ext
        return ext


class MinDelayEstimator:
    """Offset from one-way samples ``receiver_time - sender_time = offset + delay``, delay
    >= 0: the minimum over a window is the offset plus the smallest delay in it."""

    def __init__(self, window: int = 32, max_age_ns: int = 30 * NS) -> None:
        self._samples: deque[tuple[int, int]] = deque(maxlen=window)  # (arrival, sample)
        self._max_age = max_age_ns

    def observe(self, sender_ns: int, arrival_ns: int) -> None:
        self._samples.append((arrival_ns, arrival_ns - sender_ns))
        # Old samples go so a drifting publisher clock is followed, not frozen at its past.
        while self._samples and arrival_ns - self._samples[0][0] > self._max_age:
            self._samples.popleft()

    def clear(self) -> None:
        self._samples.clear()

    @property
    def value(self) -> int | None:
        return min(s for _, s in self._samples) if self._samples else None


class PublisherClock:
    """One publisher's clock offset, ``house = publisher + offset_ns``, shared by its tracks."""

    def __init__(self, window: int = 32, max_age_ns: int = 30 * NS) -> None:
        self._joined: int | None = None
        self._sr = MinDelayEstimator(window, max_age_ns)
        # abs-capture-time vs arrival also includes encode and pacing delay, so it is used
        # only while no sender report has been seen.
        self._capture = MinDelayEstimator(window, max_age_ns)

    def join(self, house_minus_publisher_ns: int) -> None:
        """The offset measured by the clock-join exchange (proto/clock.md)."""
        self._joined = house_minus_publisher_ns

    def observe_sender_report(self, publisher_ns: int, arrival_ns: int) -> None:
        self._sr.observe(publisher_ns, arrival_ns)

    def observe_capture(self, publisher_ns: int, arrival_ns: int) -> None:
        self._capture.observe(publisher_ns, arrival_ns)

    def reset(self) -> None:
        """A new publisher session: forget the join and every sample."""
        self._joined = None
        self._sr.clear()
        self._capture.clear()

    @property
    def offset_ns(self) -> int | None:
        if self._joined is not None:
            return self._joined
        sr = self._sr.value
        return sr if sr is not None else self._capture.value

    @property
    def estimated(self) -> bool:
        return self._joined is None
