"""Stamp a publisher's outgoing RTP packets with abs-capture-time.

aiortc sends no abs-capture-time, so without this a relay learns capture times only from sender
reports (built from send time, not capture time) or arrival. A publisher whose frames are
timestamped from a known capture instant (``pts`` 0 = ``start_ns``, as the synthetic source
does) can say exactly when each frame was captured; this module writes that into every packet
(http://www.webrtc.org/experiments/rtp-hdrext/abs-capture-time, 8-byte form: the capture time
as a 64-bit NTP timestamp on the sender's clock).

Pure: packet bytes in, packet bytes out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sfu_sidecar.relay.packet import RtpPacket, RtpParseError
from sfu_sidecar.sync.abscapture import build_abs_capture_time

MASK32 = 0xFFFFFFFF


def is_rtcp(data: bytes) -> bool:
    # RFC 5761 §4: RTCP packet types 192-223 fall on RTP payload types 64-95 with marker set.
    return len(data) >= 2 and 192 <= data[1] <= 223


@dataclass
class CaptureStamper:
    """Adds abs-capture-time to RTP packets of known SSRCs.

    ``clock_rates`` maps SSRC -> RTP clock rate; the first packet of each SSRC fixes its RTP
    timestamp origin (pts 0, captured at ``start_ns``).
    """

    start_ns: int
    ext_id: int
    clock_rates: dict[int, int]
    origins: dict[int, int] = field(default_factory=dict)
    stamped: int = 0

    def capture_ns(self, ssrc: int, rtp_ts: int) -> int | None:
        rate = self.clock_rates.get(ssrc)
        if rate is None:
            return None
        origin = self.origins.setdefault(ssrc, rtp_ts)
        ticks = (rtp_ts - origin) & MASK32
        return self.start_ns + ticks * 1_000_000_000 // rate

    def __call__(self, data: bytes) -> bytes:
        if is_rtcp(data):
            return data
        try:
            packet = RtpPacket.parse(data)
        except RtpParseError:
            return data
        capture = self.capture_ns(packet.ssrc, packet.timestamp)
        if capture is None:
            return data
        packet.extensions = (
            *(e for e in packet.extensions if e[0] != self.ext_id),
            (self.ext_id, build_abs_capture_time(capture)),
        )
        self.stamped += 1
        return packet.serialize()
