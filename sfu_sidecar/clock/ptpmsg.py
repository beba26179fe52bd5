"""IEEE 1588-2008 (PTPv2) messages, clause 13: bytes to frozen dataclasses and back, pure.

:func:`parse` reads any message the slave meets (Sync, Delay_Req, Follow_Up, Delay_Resp,
Announce) and refuses the rest with :class:`PtpError`; each message's ``pack`` writes it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum, IntFlag
from typing import ClassVar

from sfu_sidecar.exceptions import BadInput

PTP_PRIMARY_MULTICAST = "224.0.1.129"  # Annex D.3
EVENT_PORT = 319
GENERAL_PORT = 320

NS_PER_S = 1_000_000_000
# TAI - UTC since 2017-01-01 (IERS Bulletin C); used when a PTP-timescale master does not mark
# its currentUtcOffset valid, as ptp4l does.
DEFAULT_UTC_OFFSET_S = 37


class PtpError(BadInput):
    """A datagram that is not a PTPv2 message we can read."""


class MessageType(IntEnum):
    """messageType nibble, Table 19."""

    SYNC = 0x0
    DELAY_REQ = 0x1
    FOLLOW_UP = 0x8
    DELAY_RESP = 0x9
    ANNOUNCE = 0xB


class Flag(IntFlag):
    """flagField as one big-endian 16-bit word, Table 20 (octet 0 is the high byte)."""

    ALTERNATE_MASTER = 0x0100
    TWO_STEP = 0x0200
    UNICAST = 0x0400
    LEAP_61 = 0x0001
    LEAP_59 = 0x0002
    UTC_OFFSET_VALID = 0x0004
    PTP_TIMESCALE = 0x0008
    TIME_TRACEABLE = 0x0010
    FREQUENCY_TRACEABLE = 0x0020


# controlField, Table 23 (kept for v1 hardware that still reads it).
_CONTROL = {
    MessageType.SYNC: 0,
    MessageType.DELAY_REQ: 1,
    MessageType.FOLLOW_UP: 2,
    MessageType.DELAY_RESP: 3,
    MessageType.ANNOUNCE: 5,
}

# Common header, 13.3.1, 34 bytes:
#   B  transportSpecific(4) | messageType(4)
#   B  reserved(4) | versionPTP(4)
#   H  messageLength
#   B  domainNumber           B reserved
#   H  flagField
#   q  correctionField (ns * 2^16)
#   4s reserved
#   8s clockIdentity  H portNumber   (sourcePortIdentity)
#   H  sequenceId     B controlField  b logMessageInterval
_HEADER = struct.Struct("!BBHBBHq4s8sHHBb")
# Timestamp, 5.3.3: UInteger48 secondsField (as 16 + 32 bits) and UInteger32 nanosecondsField.
_TIMESTAMP = struct.Struct("!HII")
# Announce body after originTimestamp, 13.5.1:
#   h currentUtcOffset  B reserved  B grandmasterPriority1
#   B clockClass  B clockAccuracy  H offsetScaledLogVariance   (grandmasterClockQuality)
#   B grandmasterPriority2  8s grandmasterIdentity  H stepsRemoved  B timeSource
_ANNOUNCE = struct.Struct("!hBBBBHB8sHB")
# PortIdentity, 5.3.5.
_PORT_ID = struct.Struct("!8sH")

HEADER_LEN = _HEADER.size
TIMESTAMP_LEN = _TIMESTAMP.size


@dataclass(frozen=True, order=True)
class PortIdentity:
    clock_identity: bytes
    port_number: int

    def __post_init__(self) -> None:
        if len(self.clock_identity) != 8:
            raise ValueError("clockIdentity is 8 bytes")
        if not 0 <= self.port_number <= 0xFFFF:
            raise ValueError("portNumber is 16 bits")

    def __str__(self) -> str:
        return f"{format_identity(self.clock_identity)}-{self.port_number}"


def format_identity(identity: bytes) -> str:
    """clockIdentity as ptp4l and RFC 7273 write it: ``xx-xx-xx-xx-xx-xx-xx-xx`` upper hex."""
    return "-".join(f"{b:02X}" for b in identity)


@dataclass(frozen=True)
class Timestamp:
    """A PTP timestamp: seconds (48 bits) and nanoseconds, on the master's timescale."""

    seconds: int
    nanoseconds: int

    def __post_init__(self) -> None:
        if not 0 <= self.seconds < 1 << 48:
            raise ValueError("seconds is 48 bits")
        if not 0 <= self.nanoseconds < NS_PER_S:
            raise ValueError("nanoseconds must be below 10^9")

    @classmethod
    def from_ns(cls, ns: int) -> Timestamp:
        return cls(*divmod(ns, NS_PER_S))

    def to_ns(self) -> int:
        return self.seconds * NS_PER_S + self.nanoseconds

    def pack(self) -> bytes:
        return _TIMESTAMP.pack(self.seconds >> 32, self.seconds & 0xFFFFFFFF, self.nanoseconds)

    @classmethod
    def unpack(cls, data: bytes, offset: int) -> Timestamp:
        hi, lo, ns = _TIMESTAMP.unpack_from(data, offset)
        if ns >= NS_PER_S:
            raise PtpError(f"nanosecondsField {ns} out of range")
        return cls((hi << 32) | lo, ns)


@dataclass(frozen=True)
class Header:
    message_type: MessageType
    domain: int
    flags: Flag
    correction: int  # scaled nanoseconds: ns * 2^16, 13.3.2.7
    source: PortIdentity
    sequence_id: int
    log_interval: int = 0x7F
    message_length: int = 0
    transport_specific: int = 0

    @property
    def correction_ns(self) -> float:
        return self.correction / 65536.0


@dataclass(frozen=True)
class Message:
    """Base of the five message kinds a slave handles; ``LENGTH`` is the 13.x body size."""

    header: Header
    LENGTH: ClassVar[int] = HEADER_LEN
    TYPE: ClassVar[MessageType]

    def _body(self) -> bytes:
        raise NotImplementedError

    def serialize(self) -> bytes:
        body = self._body()
        h = self.header
        head = _HEADER.pack(
            (h.transport_specific << 4) | self.TYPE,
            2,
            HEADER_LEN + len(body),
            h.domain,
            0,
            int(h.flags),
            h.correction,
            b"\0" * 4,
            h.source.clock_identity,
            h.source.port_number,
            h.sequence_id,
            _CONTROL[self.TYPE],
            h.log_interval,
        )
        return head + body


@dataclass(frozen=True)
class Sync(Message):
    origin: Timestamp
    TYPE: ClassVar[MessageType] = MessageType.SYNC
    LENGTH: ClassVar[int] = 44

    def _body(self) -> bytes:
        return self.origin.pack()


@dataclass(frozen=True)
class DelayReq(Message):
    origin: Timestamp
    TYPE: ClassVar[MessageType] = MessageType.DELAY_REQ
    LENGTH: ClassVar[int] = 44

    def _body(self) -> bytes:
        return self.origin.pack()


@dataclass(frozen=True)
class FollowUp(Message):
    precise_origin: Timestamp
    TYPE: ClassVar[MessageType] = MessageType.FOLLOW_UP
    LENGTH: ClassVar[int] = 44

    def _body(self) -> bytes:
        return self.precise_origin.pack()


@dataclass(frozen=True)
class DelayResp(Message):
    receive: Timestamp
    requesting: PortIdentity
    TYPE: ClassVar[MessageType] = MessageType.DELAY_RESP
    LENGTH: ClassVar[int] = 54

    def _body(self) -> bytes:
        return self.receive.pack() + _PORT_ID.pack(
            self.requesting.clock_identity, self.requesting.port_number
        )


@dataclass(frozen=True)
class ClockQuality:
    clock_class: int = 248  # default for a slave-capable clock, 7.6.2.4
    clock_accuracy: int = 0xFE  # unknown
    offset_scaled_log_variance: int = 0xFFFF


@dataclass(frozen=True)
class Announce(Message):
    origin: Timestamp
    current_utc_offset: int
    priority1: int
    quality: ClockQuality
    priority2: int
    grandmaster: bytes
    steps_removed: int
    time_source: int = 0xA0  # INTERNAL_OSCILLATOR, Table 7
    TYPE: ClassVar[MessageType] = MessageType.ANNOUNCE
    LENGTH: ClassVar[int] = 64

    def _body(self) -> bytes:
        q = self.quality
        return self.origin.pack() + _ANNOUNCE.pack(
            self.current_utc_offset, 0, self.priority1, q.clock_class, q.clock_accuracy,
            q.offset_scaled_log_variance, self.priority2, self.grandmaster,
            self.steps_removed, self.time_source,
        )


def parse(data: bytes) -> Message:
    """One PTPv2 datagram -> message. Raises :class:`PtpError` for anything else.

    Trailing bytes past the body (TLVs, 13.4) are accepted and ignored: a slave needs none.
    """
    if len(data) < HEADER_LEN:
        raise PtpError(f"{len(data)} bytes is shorter than a PTP header")
    (ts_type, version, length, domain, _, flags, correction, _, clock_id, port, seq, _,
     log_interval) = _HEADER.unpack_from(data)
    if version & 0x0F != 2:
        raise PtpError(f"versionPTP {version & 0x0F}, only 2 is understood")
    try:
        mtype = MessageType(ts_type & 0x0F)
    except ValueError:
        raise PtpError(f"messageType {ts_type & 0x0F:#x} not handled by a slave") from None
    cls = MESSAGE_CLASSES[mtype]
    if length < cls.LENGTH or len(data) < cls.LENGTH:
        raise PtpError(f"{mtype.name} needs {cls.LENGTH} bytes, got {min(length, len(data))}")
    header = Header(
        message_type=mtype, domain=domain, flags=Flag(flags), correction=correction,
        source=PortIdentity(clock_id, port), sequence_id=seq, log_interval=log_interval,
        message_length=length, transport_specific=ts_type >> 4,
    )
    ts = Timestamp.unpack(data, HEADER_LEN)
    if mtype is MessageType.SYNC:
        return Sync(header, ts)
    if mtype is MessageType.DELAY_REQ:
        return DelayReq(header, ts)
    if mtype is MessageType.FOLLOW_UP:
        return FollowUp(header, ts)
    if mtype is MessageType.DELAY_RESP:
        req_id, req_port = _PORT_ID.unpack_from(data, HEADER_LEN + TIMESTAMP_LEN)
        return DelayResp(header, ts, PortIdentity(req_id, req_port))
    (utc, _, p1, cclass, cacc, var, p2, gm, steps, tsrc) = _ANNOUNCE.unpack_from(
        data, HEADER_LEN + TIMESTAMP_LEN
    )
    return Announce(header, ts, utc, p1, ClockQuality(cclass, cacc, var), p2, gm, steps, tsrc)


MESSAGE_CLASSES: dict[MessageType, type[Message]] = {
    MessageType.SYNC: Sync,
    MessageType.DELAY_REQ: DelayReq,
    MessageType.FOLLOW_UP: FollowUp,
    MessageType.DELAY_RESP: DelayResp,
    MessageType.ANNOUNCE: Announce,
}
