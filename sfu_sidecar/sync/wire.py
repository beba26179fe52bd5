"""Codec for the ``sync`` DataChannel (spec: ``proto/sync.md``).

Sans-I/O: bytes in, frozen dataclasses out, and back. Every malformed input becomes a
:class:`SyncWireError` with a machine-readable :attr:`~SyncWireError.kind`; nothing here
raises anything else on bad bytes, so the channel adapter can count and drop.

Two message kinds share one 2-byte envelope (version, kind):

* ``BATCH`` carries binary records: mapping anchors (a linear RTP -> capture-time map),
  frame records (deltas against an anchor) and length-prefixed control records;
* ``CONTROL`` carries one msgpack map with a ``"type"`` field (epoch, captions, clock join,
  viewer telemetry) and is sent on its own when it must not wait for the next batch.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import ClassVar

from sfu_sidecar.captions.events import (
    Cue,
    CueRetract,
    Epoch,
)
from sfu_sidecar.clock.exchange import (
    ClockReport,
    ClockReq,
    ClockResp,
)
from sfu_sidecar.sync.control import (
    CONTROL_TYPES,
    Control,
    KnownControl,
    Playout,
    PublisherState,
    Telemetry,
    UnknownControl,
    control_from_map,
    control_to_map,
    pack_control,
    unpack_control,
)
from sfu_sidecar.sync.wireerror import (
    MAX_MESSAGE,
    ErrorKind,
    SyncWireError,
)

# Clock-join messages are defined once, in the clock package; re-exported as control messages.

VERSION = 1
NS_PER_S = 1_000_000_000
# aiortc puts at most this many user bytes in one SCTP DATA chunk (USERDATA_MAX_LENGTH for
# SCTP_MAX_PACKET_LENGTH 1189); a message that fits is one datagram, so losing a datagram
# loses exactly one message and never half of a larger one.
MAX_UNFRAGMENTED = 1160


class MessageKind(IntEnum):
    BATCH = 0x01
    CONTROL = 0x02


class RecordType(IntEnum):
    ANCHOR = 0x01
    FRAME = 0x02
    CONTROL = 0x03


class Source(IntEnum):
    """Where a capture time came from, best first (docs/architecture.md, "The four timelines")."""

    ABS_CAPTURE_TIME = 0
    SENDER_REPORT = 1
    ARRIVAL = 2


# Envelope, first two bytes of every message:
#   0: version u8 (= 1)   1: kind u8 (MessageKind)
_ENVELOPE = struct.Struct("!BB")
# BATCH header after the envelope:
#   2-3: seq u16 (per viewer, +1 per message, wraps; a gap means a lost message)
#   4:   count u8 (records that follow)
_BATCH = struct.Struct("!HB")
# ANCHOR record, 25 bytes + mid:
#   0: type u8 (=1)  1: track u8  2: generation u8 (0-15)  3: flags u8
#   4-7: clock_rate u32 (Hz)  8-11: rtp_ts u32 (as the viewer receives it)
#   12-19: capture_ns u64 (house ns at rtp_ts)  20-23: drift_ppb i32
#   24: mid_len u8  25..: mid (UTF-8)
_ANCHOR = struct.Struct("!BBBBIIQiB")
# FRAME record, 11 bytes:
#   0: type u8 (=2)  1: track u8  2: flags u8 (source 0-1, keyframe 2, audio 3, generation 4-7)
#   3-6: rtp_delta i32 (frame rtp_ts - anchor rtp_ts, serial arithmetic)
#   7-10: residual_ns i32 (capture_ns - anchor prediction)
_FRAME = struct.Struct("!BBBii")
# CONTROL record inside a batch: 0: type u8 (=3)  1-2: length u16  3..: msgpack map
_CONTROL = struct.Struct("!BH")

_SOURCE_MASK = 0x03
_FLAG_KEYFRAME = 0x04  # frame
_FLAG_RESET = 0x04  # anchor: a new timeline; earlier anchors of the track are void
_FLAG_AUDIO = 0x08
_FLAG_ESTIMATED = 0x10  # anchor: publisher offset estimated, not from a clock join
_GEN_SHIFT = 4
GENERATIONS = 16

_U32 = 0xFFFFFFFF
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1


def _source(bits: int) -> Source:
    try:
        return Source(bits & _SOURCE_MASK)
    except ValueError:
        raise SyncWireError(ErrorKind.BAD_FIELD, f"reserved source code {bits & 3}") from None


def signed32(value: int) -> int:
    """RFC 1982 serial difference of two 32-bit RTP timestamps, as a signed int."""
    value &= _U32
    return value - (1 << 32) if value & 0x80000000 else value


def _round_div(num: int, den: int) -> int:
    # Round half up with floor division; JS reproduces it exactly with BigInt (syncwire.js).
    return (2 * num + den) // (2 * den)


def predict_ns(capture_ns: int, clock_rate: int, drift_ppb: int, rtp_delta: int) -> int:
    """House ns ``rtp_delta`` ticks after an anchor: the one formula every side uses, in
    exact integers, so a viewer's interpolation equals the relay's to the nanosecond."""
    num = rtp_delta * NS_PER_S * (NS_PER_S + drift_ppb)
    return capture_ns + _round_div(num, clock_rate * NS_PER_S)


def _need(data: bytes, offset: int, size: int, what: str) -> None:
    if len(data) - offset < size:
        raise SyncWireError(
            ErrorKind.TRUNCATED, f"{what} needs {size} bytes at {offset}, {len(data) - offset} left"
        )


@dataclass(frozen=True, slots=True)
class AnchorRecord:
    """A linear map, valid from ``rtp_ts`` on, from viewer RTP time to house capture time.

    capture(rtp) = capture_ns + round(d * 1e9 * (1e9 + drift_ppb) / (clock_rate * 1e9))
    with d the signed serial difference rtp - rtp_ts (RFC 1982 arithmetic over 32 bits).
    """

    track: int
    generation: int
    source: Source
    clock_rate: int
    rtp_ts: int
    capture_ns: int
    drift_ppb: int = 0
    mid: str = ""
    audio: bool = False
    reset: bool = False
    estimated: bool = False

    type: ClassVar[RecordType] = RecordType.ANCHOR

    def __post_init__(self) -> None:
        if not 0 <= self.track <= 0xFF:
            raise SyncWireError(ErrorKind.BAD_FIELD, f"track {self.track} out of range")
        if not 0 <= self.generation < GENERATIONS:
            raise SyncWireError(ErrorKind.BAD_FIELD, f"generation {self.generation} not 0-15")
        if not 0 < self.clock_rate <= _U32:
            raise SyncWireError(ErrorKind.BAD_FIELD, f"clock rate {self.clock_rate}")
        if not 0 <= self.rtp_ts <= _U32:
            raise SyncWireError(ErrorKind.BAD_FIELD, f"rtp_ts {self.rtp_ts} out of range")
        if not 0 <= self.capture_ns < (1 << 64):
            raise SyncWireError(ErrorKind.BAD_FIELD, f"capture_ns {self.capture_ns} out of range")
        # A drift of ±10 % is no clock at all; refusing it keeps predictions sane.
        if not -100_000_000 <= self.drift_ppb <= 100_000_000:
            raise SyncWireError(ErrorKind.BAD_FIELD, f"drift {self.drift_ppb} ppb")
        if len(self.mid.encode()) > 0xFF:
            raise SyncWireError(ErrorKind.BAD_FIELD, "mid longer than 255 bytes")

    @property
    def size(self) -> int:
        return _ANCHOR.size + len(self.mid.encode())

    def predict(self, rtp_delta: int) -> int:
        """House ns of the RTP timestamp ``rtp_ts + rtp_delta`` (delta already signed)."""
        return predict_ns(self.capture_ns, self.clock_rate, self.drift_ppb, rtp_delta)

    def capture_of(self, rtp_ts: int) -> int:
        """House ns of a 32-bit viewer RTP timestamp near this anchor."""
        return self.predict(signed32(rtp_ts - self.rtp_ts))

    def serialize(self) -> bytes:
        flags = self.source | (_FLAG_RESET if self.reset else 0)
        flags |= (_FLAG_AUDIO if self.audio else 0) | (_FLAG_ESTIMATED if self.estimated else 0)
        mid = self.mid.encode()
        return _ANCHOR.pack(
            RecordType.ANCHOR, self.track, self.generation, flags, self.clock_rate,
            self.rtp_ts, self.capture_ns, self.drift_ppb, len(mid),
        ) + mid

    @classmethod
    def parse_from(cls, data: bytes, offset: int) -> tuple[AnchorRecord, int]:
        _need(data, offset, _ANCHOR.size, "anchor")
        _, track, gen, flags, rate, rtp_ts, capture_ns, drift, mid_len = _ANCHOR.unpack_from(
            data, offset
        )
        offset += _ANCHOR.size
        _need(data, offset, mid_len, "anchor mid")
        try:
            mid = data[offset : offset + mid_len].decode()
        except UnicodeDecodeError:
            raise SyncWireError(ErrorKind.BAD_FIELD, "mid is not UTF-8") from None
        record = cls(
            track=track, generation=gen, source=_source(flags), clock_rate=rate, rtp_ts=rtp_ts,
            capture_ns=capture_ns, drift_ppb=drift, mid=mid, audio=bool(flags & _FLAG_AUDIO),
            reset=bool(flags & _FLAG_RESET), estimated=bool(flags & _FLAG_ESTIMATED),
        )
        return record, offset + mid_len


@dataclass(frozen=True, slots=True)
class FrameRecord:
    """One frame's capture time, as a delta against the anchor ``(track, generation)``."""

    track: int
    generation: int
    source: Source
    rtp_delta: int
    residual_ns: int
    keyframe: bool = False
    audio: bool = False

    type: ClassVar[RecordType] = RecordType.FRAME
    size: ClassVar[int] = _FRAME.size

    def __post_init__(self) -> None:
        if not 0 <= self.track <= 0xFF:
            raise SyncWireError(ErrorKind.BAD_FIELD, f"track {self.track} out of range")
        if not 0 <= self.generation < GENERATIONS:
            raise SyncWireError(ErrorKind.BAD_FIELD, f"generation {self.generation} not 0-15")
        if not _I32_MIN <= self.rtp_delta <= _I32_MAX:
            raise SyncWireError(ErrorKind.BAD_FIELD, f"rtp_delta {self.rtp_delta} out of range")
        if not _I32_MIN <= self.residual_ns <= _I32_MAX:
            raise SyncWireError(ErrorKind.BAD_FIELD, f"residual {self.residual_ns} out of range")

    @classmethod
    def against(
        cls, anchor: AnchorRecord, rtp_ts: int, capture_ns: int, source: Source,
        *, keyframe: bool = False, audio: bool = False,
    ) -> FrameRecord | None:
        """The record for a frame, or None when it is too far from ``anchor`` to encode
        (the caller then issues a new anchor at this frame)."""
        delta = signed32(rtp_ts - anchor.rtp_ts)
        residual = capture_ns - anchor.predict(delta)
        if not _I32_MIN <= residual <= _I32_MAX:
            return None
        return cls(anchor.track, anchor.generation, source, delta, residual, keyframe, audio)

    def rtp_ts(self, anchor: AnchorRecord) -> int:
        return (anchor.rtp_ts + self.rtp_delta) & _U32

    def capture_ns(self, anchor: AnchorRecord) -> int:
        return anchor.predict(self.rtp_delta) + self.residual_ns

    def serialize(self) -> bytes:
        flags = self.source | (self.generation << _GEN_SHIFT)
        flags |= (_FLAG_KEYFRAME if self.keyframe else 0) | (_FLAG_AUDIO if self.audio else 0)
        return _FRAME.pack(RecordType.FRAME, self.track, flags, self.rtp_delta, self.residual_ns)

    @classmethod
    def parse_from(cls, data: bytes, offset: int) -> tuple[FrameRecord, int]:
        _need(data, offset, _FRAME.size, "frame")
        _, track, flags, delta, residual = _FRAME.unpack_from(data, offset)
        record = cls(
            track=track, generation=flags >> _GEN_SHIFT, source=_source(flags), rtp_delta=delta,
            residual_ns=residual, keyframe=bool(flags & _FLAG_KEYFRAME),
            audio=bool(flags & _FLAG_AUDIO),
        )
        return record, offset + _FRAME.size


@dataclass(frozen=True, slots=True)
class ControlRecord:
    """A control message travelling inside a batch."""

    message: Control
    # Packed once, at construction: a message that cannot be packed fails where it is
    # queued, not later inside a batcher's poll, and sizing it for a batch costs nothing.
    _payload: bytes = field(init=False, repr=False, compare=False)
    type: ClassVar[RecordType] = RecordType.CONTROL

    def __post_init__(self) -> None:
        payload = pack_control(self.message)
        if len(payload) > 0xFFFF:
            raise SyncWireError(ErrorKind.TOO_LARGE, "control record over 65535 bytes")
        object.__setattr__(self, "_payload", payload)

    def serialize(self) -> bytes:
        return _CONTROL.pack(RecordType.CONTROL, len(self._payload)) + self._payload

    @property
    def size(self) -> int:
        return _CONTROL.size + len(self._payload)

    @classmethod
    def parse_from(cls, data: bytes, offset: int) -> tuple[ControlRecord, int]:
        _need(data, offset, _CONTROL.size, "control record")
        _, length = _CONTROL.unpack_from(data, offset)
        offset += _CONTROL.size
        _need(data, offset, length, "control payload")
        return cls(unpack_control(data[offset : offset + length])), offset + length


Record = AnchorRecord | FrameRecord | ControlRecord

_RECORD_PARSERS: dict[int, Callable[[bytes, int], tuple[Record, int]]] = {
    RecordType.ANCHOR: AnchorRecord.parse_from,
    RecordType.FRAME: FrameRecord.parse_from,
    RecordType.CONTROL: ControlRecord.parse_from,
}


@dataclass(frozen=True, slots=True)
class Batch:
    """One BATCH message: a sequence number and up to 255 records."""

    seq: int
    records: tuple[Record, ...] = ()

    kind: ClassVar[MessageKind] = MessageKind.BATCH
    header_size: ClassVar[int] = _ENVELOPE.size + _BATCH.size

    def __post_init__(self) -> None:
        if not 0 <= self.seq <= 0xFFFF:
            raise SyncWireError(ErrorKind.BAD_FIELD, f"seq {self.seq} out of range")
        if len(self.records) > 0xFF:
            raise SyncWireError(ErrorKind.TOO_LARGE, "more than 255 records in one batch")

    def serialize(self) -> bytes:
        parts = [
            _ENVELOPE.pack(VERSION, MessageKind.BATCH), _BATCH.pack(self.seq, len(self.records))
        ]
        parts.extend(r.serialize() for r in self.records)
        return b"".join(parts)


@dataclass(frozen=True, slots=True)
class ControlMessage:
    """One CONTROL message: a single msgpack map after the envelope."""

    message: Control
    kind: ClassVar[MessageKind] = MessageKind.CONTROL

    def serialize(self) -> bytes:
        return _ENVELOPE.pack(VERSION, MessageKind.CONTROL) + pack_control(self.message)


Message = Batch | ControlMessage


def parse_message(data: bytes | bytearray | memoryview) -> Message:
    """Decode one DataChannel message; raises :class:`SyncWireError` on anything malformed."""
    data = bytes(data)
    if len(data) > MAX_MESSAGE:
        raise SyncWireError(ErrorKind.TOO_LARGE, f"{len(data)} bytes")
    _need(data, 0, _ENVELOPE.size, "envelope")
    version, kind = _ENVELOPE.unpack_from(data, 0)
    if version != VERSION:
        raise SyncWireError(ErrorKind.BAD_VERSION, f"version {version}, expected {VERSION}")
    if kind == MessageKind.CONTROL:
        return ControlMessage(unpack_control(data[_ENVELOPE.size :]))
    if kind != MessageKind.BATCH:
        raise SyncWireError(ErrorKind.UNKNOWN_TYPE, f"message kind {kind}")
    _need(data, _ENVELOPE.size, _BATCH.size, "batch header")
    seq, count = _BATCH.unpack_from(data, _ENVELOPE.size)
    offset = Batch.header_size
    records: list[Record] = []
    for _ in range(count):
        _need(data, offset, 1, "record type")
        parser = _RECORD_PARSERS.get(data[offset])
        if parser is None:
            raise SyncWireError(ErrorKind.UNKNOWN_TYPE, f"record type {data[offset]} at {offset}")
        record, offset = parser(data, offset)
        records.append(record)
    if offset != len(data):
        raise SyncWireError(ErrorKind.TRAILING_BYTES, f"{len(data) - offset} bytes after records")
    return Batch(seq, tuple(records))


# The whole codec under one name: its own records and envelope, and the control messages,
# errors and caption and clock-join messages it carries.
__all__ = [
    "CONTROL_TYPES",
    "GENERATIONS",
    "MAX_MESSAGE",
    "MAX_UNFRAGMENTED",
    "NS_PER_S",
    "VERSION",
    "AnchorRecord",
    "Batch",
    "ClockReport",
    "ClockReq",
    "ClockResp",
    "Control",
    "ControlMessage",
    "ControlRecord",
    "Cue",
    "CueRetract",
    "Epoch",
    "ErrorKind",
    "FrameRecord",
    "KnownControl",
    "Message",
    "MessageKind",
    "Playout",
    "PublisherState",
    "Record",
    "RecordType",
    "Source",
    "SyncWireError",
    "Telemetry",
    "UnknownControl",
    "control_from_map",
    "control_to_map",
    "pack_control",
    "parse_message",
    "predict_ns",
    "signed32",
    "unpack_control",
]
