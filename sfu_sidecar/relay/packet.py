"""RTP packets as the relay sees them: parsed once, header extensions kept raw, rebuilt per viewer.

aiortc's own ``RtpPacket`` drops header extensions it does not know (abs-capture-time among them)
and costs more than the relay needs, so the hot path uses this narrower view (RFC 3550 §5.1,
RFC 8285 for header extensions, RFC 4588 for RTX). Pure: bytes in, values out.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from sfu_sidecar.exceptions import BadInput
from sfu_sidecar.relay.vp9 import vp9_keyframe_start

# Fixed RTP header (RFC 3550 §5.1):
#   V(2) P(1) X(1) CC(4) | M(1) PT(7) | sequence number (16) | timestamp (32) | SSRC (32)
RTP_HEADER = struct.Struct("!BBHII")
# Header-extension block preamble (RFC 8285 §4.2/§4.3): profile (16) | length in 32-bit words (16)
EXT_PREAMBLE = struct.Struct("!HH")
ONE_BYTE_PROFILE = 0xBEDE
TWO_BYTE_PROFILE = 0x1000  # low 4 bits are "appbits", ignored
# RTCP generic NACK FCI (RFC 4585 §6.2.1): PID (16) | BLP (16)
NACK_FCI = struct.Struct("!HH")
RTX_OSN = struct.Struct("!H")

RtpExtensions = tuple[tuple[int, bytes], ...]


class RtpParseError(BadInput):
    """Bytes that are not a well-formed RTP packet."""


@dataclass(slots=True)
class RtpPacket:
    """One RTP packet; ``extensions`` are (id, raw value) in wire order, padding removed."""

    payload_type: int
    sequence_number: int
    timestamp: int
    ssrc: int
    marker: bool
    payload: bytes
    extensions: RtpExtensions = ()
    csrcs: tuple[int, ...] = ()

    @classmethod
    def parse(cls, data: bytes) -> RtpPacket:
        size = len(data)
        if size < 12:
            raise RtpParseError(f"RTP packet of {size} bytes is shorter than its header")
        b0, b1, seq, ts, ssrc = RTP_HEADER.unpack_from(data)
        if b0 >> 6 != 2:
            raise RtpParseError(f"RTP version {b0 >> 6}, expected 2")
        pos = 12
        csrcs: tuple[int, ...] = ()
        cc = b0 & 0x0F
        if cc:
            if size < pos + 4 * cc:
                raise RtpParseError("RTP CSRC list truncated")
            csrcs = struct.unpack_from(f"!{cc}I", data, pos)
            pos += 4 * cc
        extensions: RtpExtensions = ()
        if b0 & 0x10:
            if size < pos + 4:
                raise RtpParseError("RTP header extension truncated")
            profile, words = EXT_PREAMBLE.unpack_from(data, pos)
            pos += 4
            end = pos + 4 * words
            if size < end:
                raise RtpParseError("RTP header extension longer than the packet")
            extensions = parse_extensions(profile, data[pos:end])
            pos = end
        stop = size
        if b0 & 0x20:
            padding = data[-1]
            if padding == 0 or pos + padding > size:
                raise RtpParseError("RTP padding length invalid")
            stop -= padding
        return cls(
            payload_type=b1 & 0x7F,
            sequence_number=seq,
            timestamp=ts,
            ssrc=ssrc,
            marker=bool(b1 & 0x80),
            payload=data[pos:stop],
            extensions=extensions,
            csrcs=csrcs,
        )

    def serialize(self) -> bytes:
        return build_rtp(
            self.payload_type, self.sequence_number, self.timestamp, self.ssrc,
            self.marker, self.payload, self.extensions, self.csrcs,
        )


def parse_extensions(profile: int, block: bytes) -> RtpExtensions:
    """Elements of a one-byte (RFC 8285 §4.2) or two-byte (§4.3) extension block."""
    out: list[tuple[int, bytes]] = []
    pos = 0
    size = len(block)
    if profile == ONE_BYTE_PROFILE:
        while pos < size:
            head = block[pos]
            if head == 0:  # padding byte between elements
                pos += 1
                continue
            ext_id = head >> 4
            if ext_id == 15:  # reserved: stop processing (§4.2)
                break
            length = (head & 0x0F) + 1
            pos += 1
            if pos + length > size:
                raise RtpParseError(f"header extension {ext_id} truncated")
            out.append((ext_id, block[pos : pos + length]))
            pos += length
    elif profile & 0xFFF0 == TWO_BYTE_PROFILE:
        while pos < size:
            ext_id = block[pos]
            if ext_id == 0:
                pos += 1
                continue
            if pos + 2 > size:
                raise RtpParseError("two-byte header extension truncated")
            length = block[pos + 1]
            pos += 2
            if pos + length > size:
                raise RtpParseError(f"header extension {ext_id} truncated")
            out.append((ext_id, block[pos : pos + length]))
            pos += length
    # Any other profile is an extension this relay does not understand: forward nothing of it.
    return tuple(out)


def build_extensions(extensions: RtpExtensions) -> bytes:
    """The extension block, preamble included; one-byte form whenever every element fits."""
    if not extensions:
        return b""
    one_byte = all(0 < i < 15 and 0 < len(v) <= 16 for i, v in extensions)
    if one_byte:
        body = b"".join(bytes([(i << 4) | (len(v) - 1)]) + v for i, v in extensions)
        profile = ONE_BYTE_PROFILE
    else:
        body = b"".join(bytes([i, len(v)]) + v for i, v in extensions)
        profile = TWO_BYTE_PROFILE
    body += b"\x00" * (-len(body) % 4)
    return EXT_PREAMBLE.pack(profile, len(body) // 4) + body


def build_rtp(
    payload_type: int,
    sequence_number: int,
    timestamp: int,
    ssrc: int,
    marker: bool,
    payload: bytes,
    extensions: RtpExtensions = (),
    csrcs: tuple[int, ...] = (),
) -> bytes:
    return build_rtp_with_block(
        payload_type, sequence_number, timestamp, ssrc, marker, payload,
        build_extensions(extensions), csrcs,
    )


def build_rtp_with_block(
    payload_type: int,
    sequence_number: int,
    timestamp: int,
    ssrc: int,
    marker: bool,
    payload: bytes,
    ext: bytes,
    csrcs: tuple[int, ...] = (),
) -> bytes:
    """Like :func:`build_rtp` with the extension block already serialised."""
    b0 = 0x80 | (0x10 if ext else 0) | len(csrcs)
    head = RTP_HEADER.pack(
        b0, (0x80 if marker else 0) | payload_type, sequence_number, timestamp, ssrc
    )
    if csrcs:
        head += struct.pack(f"!{len(csrcs)}I", *csrcs)
    return head + ext + payload


def unwrap_rtx(payload: bytes) -> tuple[int, bytes]:
    """(original sequence number, original payload) of an RTX payload (RFC 4588 §4)."""
    if len(payload) < 2:
        raise RtpParseError("RTX payload shorter than its original sequence number")
    return RTX_OSN.unpack_from(payload)[0], payload[2:]


def wrap_rtx(original_sequence_number: int, payload: bytes) -> bytes:
    return RTX_OSN.pack(original_sequence_number) + payload


def is_keyframe_start(codec: str, payload: bytes) -> bool:
    """Whether this packet starts a frame a decoder can start from. ``codec``: lower-case name."""
    if codec == "vp8":
        return _vp8_keyframe_start(payload)
    if codec == "h264":
        return _h264_keyframe_start(payload)
    if codec == "vp9":
        return vp9_keyframe_start(payload)
    return False


def _vp8_keyframe_start(payload: bytes) -> bool:
    # VP8 payload descriptor (RFC 7741 §4.2): X R N S R PID(3), then optional I/L/T/K bytes.
    size = len(payload)
    if size < 1:
        return False
    b0 = payload[0]
    if not b0 & 0x10 or b0 & 0x07:  # S=1 and PID=0: first partition of a frame
        return False
    pos = 1
    if b0 & 0x80:
        if size < 2:
            return False
        x = payload[1]
        pos = 2
        if x & 0x80:  # I: picture id, 7 or 15 bits
            if size <= pos:
                return False
            pos += 2 if payload[pos] & 0x80 else 1
        if x & 0x40:  # L: TL0PICIDX
            pos += 1
        if x & 0x30:  # T or K: TID/Y/KEYIDX byte
            pos += 1
    # VP8 payload header (RFC 7741 §4.3): P bit (inverse key frame flag) is bit 0.
    return size > pos and not payload[pos] & 0x01


_H264_KEY_NALS = frozenset((5, 7))  # IDR slice, SPS (a keyframe starts with SPS/PPS/IDR)


def _h264_keyframe_start(payload: bytes) -> bool:
    if not payload:
        return False
    nal = payload[0] & 0x1F
    if nal in _H264_KEY_NALS:
        return True
    if nal == 24:  # STAP-A (RFC 6184 §5.7.1): 16-bit size + NAL unit, repeated
        pos = 1
        while pos + 3 <= len(payload):
            length = (payload[pos] << 8) | payload[pos + 1]
            if payload[pos + 2] & 0x1F in _H264_KEY_NALS:
                return True
            pos += 2 + length
        return False
    if nal == 28 and len(payload) >= 2:  # FU-A (§5.8): S bit and original type in byte 2
        return bool(payload[1] & 0x80) and payload[1] & 0x1F in _H264_KEY_NALS
    return False


def parse_nack_fci(fci: bytes) -> list[int]:
    """Lost sequence numbers of a generic NACK, wrapping at 2^16 (RFC 4585 §6.2.1)."""
    lost: list[int] = []
    for pos in range(0, len(fci) - 3, 4):
        pid, blp = NACK_FCI.unpack_from(fci, pos)
        lost.append(pid)
        for bit in range(16):
            if blp >> bit & 1:
                lost.append((pid + bit + 1) & 0xFFFF)
    return lost


def build_nack_fci(lost: list[int]) -> bytes:
    """Pack sequence numbers (in send order) into PID/BLP pairs."""
    out = bytearray()
    pid: int | None = None
    blp = 0
    for seq in lost:
        if pid is not None:
            delta = (seq - pid) & 0xFFFF
            if 1 <= delta <= 16:
                blp |= 1 << (delta - 1)
                continue
            out += NACK_FCI.pack(pid, blp)
        pid, blp = seq, 0
    if pid is not None:
        out += NACK_FCI.pack(pid, blp)
    return bytes(out)


def seq_newer(a: int, b: int) -> bool:
    """Whether 16-bit sequence number ``a`` comes after ``b`` (RFC 3550 A.1 arithmetic)."""
    return a != b and (a - b) & 0xFFFF < 0x8000
