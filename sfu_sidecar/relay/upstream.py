"""What the relay owes a publisher as its receiver: reception statistics and NACKs (RFC 3550/4585).

Pure: sequence numbers, timestamps and times in; report fields and sequence numbers to NACK out.
aiortc's equivalents read the wall clock themselves and do not wrap NACK sequence numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from sfu_sidecar.relay.packet import seq_newer

# A missing packet is NACKed at most this often and this many times, and forgotten after
# NACK_WINDOW packets: past that the viewer-side jitter buffers have moved on anyway.
NACK_RETRY_NS = 100_000_000
NACK_MAX_TRIES = 4
NACK_WINDOW = 512


@dataclass(frozen=True, slots=True)
class ReceptionReport:
    """The fields of one RTCP report block (RFC 3550 §6.4.1)."""

    fraction_lost: int
    packets_lost: int
    highest_sequence: int
    jitter: int


class ReceiveStatistics:
    """Sequence tracking (RFC 3550 A.1), interarrival jitter (A.8), loss fraction (A.3)."""

    def __init__(self, clock_rate: int) -> None:
        self.clock_rate = clock_rate
        self.packets_received = 0
        self._base_seq: int | None = None
        self._max_seq = 0
        self._cycles = 0
        self._jitter_q4 = 0
        self._last_transit: int | None = None
        self._expected_prior = 0
        self._received_prior = 0

    def add(self, seq: int, timestamp: int, arrival_ns: int) -> None:
        self.packets_received += 1
        if self._base_seq is None:
            self._base_seq = self._max_seq = seq
        elif seq_newer(seq, self._max_seq):
            if seq < self._max_seq:
                self._cycles += 1 << 16
            self._max_seq = seq
        arrival = arrival_ns * self.clock_rate // 1_000_000_000
        transit = arrival - timestamp
        if self._last_transit is not None:
            d = abs(transit - self._last_transit)
            # Ignore the step a timestamp wrap or a source restart makes (over ~1 s).
            if d < self.clock_rate:
                self._jitter_q4 += d - ((self._jitter_q4 + 8) >> 4)
        self._last_transit = transit

    @property
    def started(self) -> bool:
        return self._base_seq is not None

    def report(self) -> ReceptionReport:
        """Report block fields; each call closes one reporting interval for ``fraction_lost``."""
        if self._base_seq is None:
            return ReceptionReport(0, 0, 0, 0)
        extended_max = self._cycles + self._max_seq
        expected = extended_max - self._base_seq + 1
        lost = max(min(expected - self.packets_received, 0x7FFFFF), -0x800000)
        expected_interval = expected - self._expected_prior
        received_interval = self.packets_received - self._received_prior
        self._expected_prior = expected
        self._received_prior = self.packets_received
        lost_interval = expected_interval - received_interval
        fraction = 0
        if expected_interval > 0 and lost_interval > 0:
            fraction = min((lost_interval << 8) // expected_interval, 255)
        return ReceptionReport(fraction, lost, extended_max & 0xFFFFFFFF, self._jitter_q4 >> 4)


class NackGenerator:
    """Which sequence numbers to NACK, and when, for one media SSRC."""

    def __init__(self) -> None:
        self._max_seq: int | None = None
        # seq -> (tries so far, time of the last NACK)
        self._missing: dict[int, tuple[int, int]] = {}
        self.nacked = 0
        self.recovered = 0

    def add(self, seq: int, now_ns: int) -> list[int]:
        """Note a received packet; returns sequence numbers to NACK at once (a new gap)."""
        if self._max_seq is None:
            self._max_seq = seq
            return []
        if not seq_newer(seq, self._max_seq):
            if self._missing.pop(seq, None) is not None:
                self.recovered += 1
            return []
        gap = (seq - self._max_seq - 1) & 0xFFFF
        self._max_seq = seq
        if gap == 0:
            self._trim(seq)
            return []
        # A jump of thousands is a restart or a reordering storm, not loss worth NACKing.
        if gap > NACK_WINDOW:
            self._missing.clear()
            return []
        new = [(seq - gap + i) & 0xFFFF for i in range(gap)]
        for s in new:
            self._missing[s] = (1, now_ns)
        self.nacked += len(new)
        self._trim(seq)
        return new

    def due(self, now_ns: int) -> list[int]:
        """Sequence numbers still missing whose last NACK is old enough to repeat."""
        out = []
        for seq, (tries, last) in list(self._missing.items()):
            if now_ns - last < NACK_RETRY_NS:
                continue
            if tries >= NACK_MAX_TRIES:
                del self._missing[seq]
                continue
            self._missing[seq] = (tries + 1, now_ns)
            out.append(seq)
        self.nacked += len(out)
        return out

    def _trim(self, newest: int) -> None:
        if len(self._missing) > NACK_WINDOW:
            for seq in list(self._missing):
                if (newest - seq) & 0xFFFF > NACK_WINDOW:
                    del self._missing[seq]

    @property
    def missing(self) -> int:
        return len(self._missing)
