"""RTP payloads back into coded frames, without decoding: VP8 (RFC 7741), H.264 (RFC 6184), Opus.

Each depacketizer takes one track's packets in arrival order and returns a :class:`Frame` when
the last packet of a frame has arrived. A frame with a missing packet (a gap in sequence numbers
inside it) is dropped whole, and a video track then waits for the next keyframe, because every
frame after a lost one refers to it and a container would carry undecodable data.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "Frame", "H264Depacketizer", "OpusDepacketizer", "Vp8Depacketizer", "h264_avcc",
    "vp8_descriptor_size",
]


@dataclass(frozen=True, slots=True)
class Frame:
    """One coded frame: ``data`` as a container takes it (H.264: 4-byte length-prefixed NAL
    units, the avcC layout), the RTP timestamp all its packets carried, and for video whether
    it can be decoded alone. ``width``/``height`` come from a VP8 keyframe header or are 0."""

    timestamp: int
    data: bytes
    keyframe: bool
    width: int = 0
    height: int = 0


class _Assembler:
    """Collects the payloads of one frame (same RTP timestamp, consecutive sequence numbers).

    ``lost`` turns true when a frame was given up (a gap inside it, or its last packet never
    came); the depacketizer then waits for a keyframe.
    """

    def __init__(self) -> None:
        self.timestamp: int | None = None
        self.parts: list[bytes] = []
        self.next_seq: int | None = None
        self.broken = False
        self.started = False
        self.lost = False

    def add(self, seq: int, timestamp: int) -> None:
        """Account for one packet; a new timestamp starts a new frame."""
        gap = self.next_seq is not None and seq != self.next_seq
        self.next_seq = (seq + 1) & 0xFFFF
        if timestamp != self.timestamp:
            if self.parts:
                self.lost = True  # the previous frame's marker packet never came
            self.timestamp = timestamp
            self.parts = []
            self.started = False
            # A gap before a new timestamp may have taken this frame's first packets; VP8 can
            # tell from its start bit and clears this, H.264 cannot.
            self.broken = gap
        elif gap:
            self.broken = True

    def take(self) -> tuple[int, bytes] | None:
        """The frame ended (marker): its timestamp and bytes, or None when it is incomplete."""
        ts = self.timestamp
        ok = self.started and not self.broken
        data = b"".join(self.parts)
        self.parts = []
        self.started = self.broken = False
        self.timestamp = None
        if ts is None or not ok:
            self.lost = True
            return None
        return ts, data


def vp8_descriptor_size(payload: bytes) -> int:
    """Bytes of the VP8 payload descriptor at the start of ``payload`` (RFC 7741 §4.2)."""
    if not payload:
        raise ValueError("empty VP8 payload")
    size = 1
    if payload[0] & 0x80:  # X: extension byte follows
        if len(payload) < 2:
            raise ValueError("VP8 descriptor truncated")
        ext = payload[1]
        size = 2
        if ext & 0x80:  # I: PictureID, 7 or 15 bits (M bit)
            if len(payload) <= size:
                raise ValueError("VP8 descriptor truncated")
            size += 2 if payload[size] & 0x80 else 1
        if ext & 0x40:  # L: TL0PICIDX
            size += 1
        if ext & 0x30:  # T or K: TID/Y/KEYIDX
            size += 1
    if size > len(payload):
        raise ValueError("VP8 descriptor truncated")
    return size


class Vp8Depacketizer:
    """VP8 frames from RTP payloads (RFC 7741): descriptor stripped, partitions concatenated."""

    def __init__(self) -> None:
        self._asm = _Assembler()
        self._need_keyframe = True

    def push(self, seq: int, timestamp: int, marker: bool, payload: bytes) -> Frame | None:
        try:
            size = vp8_descriptor_size(payload)
        except ValueError:
            self._asm.broken = True
            return None
        asm = self._asm
        asm.add(seq, timestamp)
        # S=1 with partition index 0: the first packet of the frame.
        if payload[0] & 0x10 and payload[0] & 0x07 == 0:
            if asm.parts:
                asm.broken = True  # a second start within one timestamp: not one frame
            else:
                asm.started = True
                asm.broken = False
        asm.parts.append(payload[size:])
        if not marker:
            return None
        taken = asm.take()
        if asm.lost:
            asm.lost = False
            self._need_keyframe = True
        if taken is None:
            return None
        ts, data = taken
        if not data:
            return None
        keyframe = data[0] & 0x01 == 0  # P bit of the frame tag: 0 for a key frame
        if self._need_keyframe and not keyframe:
            return None
        self._need_keyframe = False
        width = height = 0
        if keyframe and len(data) >= 10 and data[3:6] == b"\x9d\x01\x2a":
            w, h = struct.unpack_from("<HH", data, 6)
            width, height = w & 0x3FFF, h & 0x3FFF
        return Frame(ts, data, keyframe, width, height)


class H264Depacketizer:
    """H.264 access units from RTP payloads (RFC 6184 single NAL, STAP-A, FU-A; packetization
    mode 0 or 1), as length-prefixed NAL units. SPS and PPS seen in the stream are kept for
    the container's avcC record."""

    def __init__(self) -> None:
        self._asm = _Assembler()
        self._need_keyframe = True
        self._fu: bytearray | None = None
        self.sps: bytes | None = None
        self.pps: bytes | None = None

    def _nal(self, nal: bytes) -> None:
        if not nal:
            return
        kind = nal[0] & 0x1F
        if kind == 7:
            self.sps = bytes(nal)
        elif kind == 8:
            self.pps = bytes(nal)
        self._asm.parts.append(struct.pack(">I", len(nal)) + nal)

    def push(self, seq: int, timestamp: int, marker: bool, payload: bytes) -> Frame | None:
        asm = self._asm
        if timestamp != asm.timestamp:
            self._fu = None
        asm.add(seq, timestamp)
        # H.264 has no start flag: a frame starts with its timestamp's first packet, and a gap
        # before that packet marks it broken (the assembler's doing).
        asm.started = True
        try:
            self._payload(payload)
        except (ValueError, IndexError, struct.error):
            asm.broken = True
        if not marker:
            return None
        self._fu = None
        taken = asm.take()
        if asm.lost:
            asm.lost = False
            self._need_keyframe = True
        if taken is None:
            return None
        ts, data = taken
        keyframe = self._has_idr(data)
        if not data or (self._need_keyframe and not keyframe):
            return None
        self._need_keyframe = False
        return Frame(ts, data, keyframe)

    def _payload(self, payload: bytes) -> None:
        if not payload:
            raise ValueError("empty H.264 payload")
        kind = payload[0] & 0x1F
        if 1 <= kind <= 23:
            self._nal(payload)
        elif kind == 24:  # STAP-A: 16-bit size before each NAL unit
            pos = 1
            while pos + 2 <= len(payload):
                (size,) = struct.unpack_from(">H", payload, pos)
                pos += 2
                if size == 0 or pos + size > len(payload):
                    raise ValueError("STAP-A unit overruns the packet")
                self._nal(payload[pos:pos + size])
                pos += size
        elif kind == 28:  # FU-A: the NAL header is rebuilt from indicator and FU header
            if len(payload) < 2:
                raise ValueError("FU-A truncated")
            fu_header = payload[1]
            if fu_header & 0x80:
                self._fu = bytearray([(payload[0] & 0xE0) | (fu_header & 0x1F)])
            elif self._fu is None:
                raise ValueError("FU-A continues a unit whose start was not seen")
            self._fu += payload[2:]
            if fu_header & 0x40:
                self._nal(bytes(self._fu))
                self._fu = None
        else:
            raise ValueError(f"H.264 packet type {kind} not supported")

    @staticmethod
    def _has_idr(data: bytes) -> bool:
        pos = 0
        while pos + 5 <= len(data):
            (size,) = struct.unpack_from(">I", data, pos)
            if data[pos + 4] & 0x1F == 5:
                return True
            pos += 4 + size
        return False


class OpusDepacketizer:
    """Opus: one RTP payload is one Opus packet (RFC 7587)."""

    def push(self, seq: int, timestamp: int, marker: bool, payload: bytes) -> Frame | None:
        if not payload:
            return None
        return Frame(timestamp, payload, True)


def h264_avcc(sps: bytes, pps: bytes) -> bytes:
    """An AVCDecoderConfigurationRecord (ISO/IEC 14496-15 §5.2.4.1) for one SPS and one PPS,
    with 4-byte NAL lengths."""
    if len(sps) < 4:
        raise ValueError("SPS too short")
    return (
        bytes([1, sps[1], sps[2], sps[3], 0xFF, 0xE1])
        + struct.pack(">H", len(sps)) + sps
        + b"\x01" + struct.pack(">H", len(pps)) + pps
    )
