"""The abs-capture-time RTP header extension: its payload read and written (pure).

http://www.webrtc.org/experiments/rtp-hdrext/abs-capture-time carries a frame's capture
timestamp (NTP Q32.32 on the capture system's clock) and optionally the estimated offset of
that clock from the sender's.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from sfu_sidecar.ntptime import ns_to_q32, ntp_to_unix_ns, q32_to_ns, unix_ns_to_ntp

ABS_CAPTURE_TIME_URI = "http://www.webrtc.org/experiments/rtp-hdrext/abs-capture-time"


class AbsCaptureTimeError(ValueError):
    """An abs-capture-time extension of a length the spec does not define."""


_ACT_SHORT = struct.Struct("!Q")  # absolute capture timestamp, NTP Q32.32
_ACT_LONG = struct.Struct("!Qq")  # + estimated capture clock offset, signed Q32.32


@dataclass(frozen=True, slots=True)
class AbsCaptureTime:
    """The abs-capture-time header extension payload (8 or 16 bytes)."""

    capture_ntp: int
    # Sender's NTP clock minus the capture system's NTP clock (spec: "Capture NTP Clock =
    # Sender NTP Clock - Capture Clock Offset"); None in the 8-byte form.
    clock_offset_q32: int | None = None

    @classmethod
    def parse(cls, data: bytes) -> AbsCaptureTime:
        if len(data) == _ACT_SHORT.size:
            return cls(_ACT_SHORT.unpack(data)[0])
        if len(data) == _ACT_LONG.size:
            ts, offset = _ACT_LONG.unpack(data)
            return cls(ts, offset)
        raise AbsCaptureTimeError(f"abs-capture-time of {len(data)} bytes (8 or 16 expected)")

    def serialize(self) -> bytes:
        if self.clock_offset_q32 is None:
            return _ACT_SHORT.pack(self.capture_ntp)
        return _ACT_LONG.pack(self.capture_ntp, self.clock_offset_q32)

    def sender_clock_ns(self) -> int:
        """Capture time in Unix ns on the sender's (publisher's) NTP clock."""
        ns = ntp_to_unix_ns(self.capture_ntp)
        return ns if self.clock_offset_q32 is None else ns + q32_to_ns(self.clock_offset_q32)


def build_abs_capture_time(capture_ns: int, clock_offset_ns: int | None = None) -> bytes:
    """The extension payload for a viewer: capture time (house ns) as NTP Q32.32.

    The relay's own NTP clock is the house clock, so the capture time is already on the
    sender's clock and the 8-byte form is exact; pass ``clock_offset_ns`` only to state a
    non-zero offset (16-byte form).
    """
    offset = None if clock_offset_ns is None else ns_to_q32(clock_offset_ns)
    return AbsCaptureTime(unix_ns_to_ntp(capture_ns), offset).serialize()
