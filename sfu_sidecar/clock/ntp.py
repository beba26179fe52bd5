"""SNTP client (RFC 4330 over the RFC 5905 packet), sans I/O.

The adapter asks for a request packet with the local send time, sends it, and hands back the
reply with the local receive time. Each reply becomes a four-timestamp sample (RFC 5905 §8);
the client keeps a window of them and offers the one with the smallest round-trip delay, the
same clock filter idea as RFC 5905 §10 (the least-delay sample has the least queueing error).
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass
from enum import IntEnum

from sfu_sidecar.exceptions import BadInput
from sfu_sidecar.ntptime import ntp_to_unix_ns, unix_ns_to_ntp

NS_PER_S = 1_000_000_000
NTP_VERSION = 4
WINDOW = 8  # RFC 5905 §10 clock filter: the last eight samples
PHI_PPB = 15_000  # RFC 5905 §7.2 PHI: 15 ppm frequency tolerance, dispersion growth per second

# RFC 5905 Figure 8, 48 bytes:
#   B  LI(2) | VN(3) | Mode(3)   B stratum   b poll   b precision
#   I  root delay (16.16 s)      I root dispersion (16.16 s)   4s reference ID
#   Q  reference  Q origin (T1)  Q receive (T2)  Q transmit (T3)   (32.32 s since 1900)
_PACKET = struct.Struct("!BBbbII4sQQQQ")
PACKET_LEN = _PACKET.size


class NtpError(BadInput):
    """A reply that is not a usable NTP server response."""


class Mode(IntEnum):
    CLIENT = 3
    SERVER = 4


LEAP_NOT_SYNCHRONIZED = 3


@dataclass(frozen=True)
class NtpPacket:
    leap: int
    version: int
    mode: int
    stratum: int
    poll: int
    precision: int
    root_delay: int
    root_dispersion: int
    reference_id: bytes
    reference: int
    origin: int
    receive: int
    transmit: int

    def serialize(self) -> bytes:
        return _PACKET.pack(
            (self.leap << 6) | (self.version << 3) | self.mode, self.stratum, self.poll,
            self.precision, self.root_delay, self.root_dispersion, self.reference_id,
            self.reference, self.origin, self.receive, self.transmit,
        )

    @classmethod
    def parse(cls, data: bytes) -> NtpPacket:
        if len(data) < PACKET_LEN:
            raise NtpError(f"{len(data)} bytes is shorter than an NTP packet")
        (first, stratum, poll, precision, rdelay, rdisp, refid, ref, org, rec,
         xmt) = _PACKET.unpack_from(data)
        return cls(first >> 6, (first >> 3) & 7, first & 7, stratum, poll, precision, rdelay,
                   rdisp, refid, ref, org, rec, xmt)


@dataclass(frozen=True)
class NtpSample:
    """RFC 5905 §8: offset = ((T2 - T1) + (T3 - T4)) / 2, delay = (T4 - T1) - (T3 - T2)."""

    local_ns: int  # T4, when the sample was taken on the local clock
    offset_ns: int  # server - local
    delay_ns: int
    stratum: int

    def error_ns(self, now_ns: int) -> int:
        """Bound on the error of this sample's offset taken as the offset at ``now_ns``: half
        the round trip (the asymmetry nobody can see) plus PHI per second of age, the frequency
        tolerance RFC 5905 §7.2 assumes between two clocks."""
        return self.delay_ns // 2 + max(0, now_ns - self.local_ns) * PHI_PPB // 1_000_000_000

    @classmethod
    def from_timestamps(cls, t1: int, t2: int, t3: int, t4: int, stratum: int) -> NtpSample:
        return cls(t4, ((t2 - t1) + (t3 - t4)) // 2, (t4 - t1) - (t3 - t2), stratum)


class SntpClient:
    """One server's association: builds requests, validates replies, keeps the filter window."""

    def __init__(self, window: int = WINDOW) -> None:
        self._outstanding: dict[int, int] = {}  # transmit timestamp on the wire -> T1 in ns
        self.samples: deque[NtpSample] = deque(maxlen=window)
        self.rejected = 0

    def request(self, local_ns: int) -> bytes:
        """A client packet sent at ``local_ns``. Its transmit field comes back as origin
        (RFC 5905 §8 bogus-packet check), which is how replies are matched to requests."""
        xmt = unix_ns_to_ntp(local_ns)
        self._outstanding[xmt] = local_ns
        while len(self._outstanding) > 4:  # bound: old requests are answered or lost
            del self._outstanding[next(iter(self._outstanding))]
        return NtpPacket(0, NTP_VERSION, Mode.CLIENT, 0, 0, 0, 0, 0, b"\0" * 4, 0, 0, 0,
                         xmt).serialize()

    def response(self, data: bytes, local_ns: int) -> NtpSample:
        """Validate a reply received at ``local_ns`` (RFC 4330 §5) and add its sample."""
        try:
            pkt = NtpPacket.parse(data)
            t1 = self._outstanding.pop(pkt.origin, None)
            if t1 is None:
                raise NtpError("origin timestamp matches no request (bogus or duplicate)")
            if pkt.mode != Mode.SERVER:
                raise NtpError(f"mode {pkt.mode}, expected server (4)")
            if pkt.stratum == 0:
                code = pkt.reference_id.decode("ascii", "replace")
                raise NtpError(f"kiss-o'-death {code!r}")
            if pkt.stratum > 15:
                raise NtpError(f"stratum {pkt.stratum} is unsynchronized")
            if pkt.leap == LEAP_NOT_SYNCHRONIZED:
                raise NtpError("server clock not synchronized (LI=3)")
            if pkt.transmit == 0:
                raise NtpError("zero transmit timestamp")
        except NtpError:
            self.rejected += 1
            raise
        t2 = ntp_to_unix_ns(pkt.receive, local_ns)
        t3 = ntp_to_unix_ns(pkt.transmit, local_ns)
        sample = NtpSample.from_timestamps(t1, t2, t3, local_ns, pkt.stratum)
        if sample.delay_ns < 0:
            self.rejected += 1
            raise NtpError("negative round-trip delay")
        self.samples.append(sample)
        return sample

    def best(self, now_ns: int | None = None) -> NtpSample | None:
        """The sample of the window with the least error bound at ``now_ns``: half its
        round-trip delay plus the dispersion it gathered since (RFC 5905 §10 picks by the same
        distance); without ``now_ns``, the least-delay sample."""
        if now_ns is None:
            return min(self.samples, key=lambda s: s.delay_ns, default=None)
        return min(self.samples, key=lambda s: s.error_ns(now_ns), default=None)
