"""RTP payloads back into coded frames, without decoding: VP8 (RFC 7741), H.264 (RFC 6184), Opus.

Each depacketizer takes one track's packets in arrival order and returns a :class:`Frame` when
the last packet of a frame has arrived. A frame with a missing packet (a gap in sequence numbers
inside it) is dropped whole, and a video track then waits for the next keyframe, because every
frame after a lost one refers to it and a container would carry undecodable data.
"""

from __future__ import annotations

import contextlib
import struct
from dataclasses import dataclass

__all__ = [
    "Frame", "H264Depacketizer", "OpusDepacketizer", "PictureCounter", "Vp8Depacketizer",
    "annex_b", "avc_codec_string", "nal_units", "sps_dimensions", "vp8_descriptor_size",
    "vp8_picture_id",
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

    ``need_keyframe`` turns true when a frame was given up (a gap inside it, or its last packet
    never came), as it is at the start: every frame until the next keyframe refers to what is
    missing. The depacketizer clears it at a keyframe.
    """

    def __init__(self) -> None:
        self.timestamp: int | None = None
        self.parts: list[bytes] = []
        self.next_seq: int | None = None
        self.broken = False
        self.started = False
        self.need_keyframe = True

    def add(self, seq: int, timestamp: int) -> None:
        """Account for one packet; a new timestamp starts a new frame."""
        gap = self.next_seq is not None and seq != self.next_seq
        self.next_seq = (seq + 1) & 0xFFFF
        if timestamp != self.timestamp:
            if self.parts:
                self.need_keyframe = True  # the previous frame's marker packet never came
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
            self.need_keyframe = True
            return None
        return ts, data


class PictureCounter:
    """Whether whole pictures went missing in a gap. A gap in sequence numbers before a
    picture's first packet may have taken entire pictures, which no start bit shows (a small
    inter frame is one packet); the PictureID of VP8 (RFC 7741 §4.2) and VP9 (RFC 9628 §4.2)
    counts pictures, so a picture that follows the last one by exactly one lost nothing."""

    def __init__(self) -> None:
        self._last: tuple[int, int] | None = None  # (PictureID, its bits)

    def follows(self, picture_id: int | None, bits: int) -> bool:
        """Records this picture's id; whether it is the one after the last (False when either
        is unknown)."""
        last = self._last
        self._last = None if picture_id is None else (picture_id, bits)
        return (picture_id is not None and last is not None and last[1] == bits
                and picture_id == (last[0] + 1) % (1 << bits))


def vp8_picture_id(payload: bytes) -> tuple[int, int] | None:
    """(PictureID, bits) of a VP8 payload descriptor that carries one (RFC 7741 §4.2)."""
    if len(payload) < 3 or not payload[0] & 0x80 or not payload[1] & 0x80:
        return None
    high = payload[2]
    if not high & 0x80:
        return high, 7
    if len(payload) < 4:
        return None
    return ((high & 0x7F) << 8) | payload[3], 15


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
        self._pictures = PictureCounter()

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
                # The frame's first packet is here: a gap before it took nothing of it, but
                # it may have taken whole frames before it, unless their count says not.
                if not self._pictures.follows(*(vp8_picture_id(payload) or (None, 0))) \
                        and asm.broken:
                    self._asm.need_keyframe = True
                asm.started = True
                asm.broken = False
        asm.parts.append(payload[size:])
        if not marker:
            return None
        taken = asm.take()
        if taken is None:
            return None
        ts, data = taken
        if not data:
            return None
        keyframe = data[0] & 0x01 == 0  # P bit of the frame tag: 0 for a key frame
        if self._asm.need_keyframe and not keyframe:
            return None
        self._asm.need_keyframe = False
        width = height = 0
        if keyframe and len(data) >= 10 and data[3:6] == b"\x9d\x01\x2a":
            w, h = struct.unpack_from("<HH", data, 6)
            width, height = w & 0x3FFF, h & 0x3FFF
        return Frame(ts, data, keyframe, width, height)


class H264Depacketizer:
    """H.264 access units from RTP payloads (RFC 6184 single NAL, STAP-A, FU-A; packetization
    mode 0 or 1), as length-prefixed NAL units. The last SPS and PPS seen are kept, so every
    keyframe can carry them and its dimensions are known."""

    def __init__(self) -> None:
        self._asm = _Assembler()
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
        if taken is None:
            return None
        ts, data = taken
        keyframe = self._has_idr(data)
        if keyframe and not self._has_parameter_sets(data):
            if self.sps is None or self.pps is None:
                self._asm.need_keyframe = True  # undecodable without them: wait for the next IDR
                return None
            # Senders may send SPS/PPS once; every keyframe here starts a segment a player may
            # join at, so it carries them.
            data = _length_prefixed(self.sps) + _length_prefixed(self.pps) + data
        if not data or (self._asm.need_keyframe and not keyframe):
            return None
        self._asm.need_keyframe = False
        width = height = 0
        if keyframe and self.sps is not None:
            # Left 0 when unreadable: the segmenter starts no segment without dimensions.
            with contextlib.suppress(ValueError):
                width, height = sps_dimensions(self.sps)
        return Frame(ts, data, keyframe, width, height)

    @staticmethod
    def _has_parameter_sets(data: bytes) -> bool:
        kinds = {nal[0] & 0x1F for nal in nal_units(data) if nal}
        return 7 in kinds and 8 in kinds

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
        return any(nal and nal[0] & 0x1F == 5 for nal in nal_units(data))


class OpusDepacketizer:
    """Opus: one RTP payload is one Opus packet (RFC 7587)."""

    def push(self, seq: int, timestamp: int, marker: bool, payload: bytes) -> Frame | None:
        if not payload:
            return None
        return Frame(timestamp, payload, True)


def _length_prefixed(nal: bytes) -> bytes:
    return struct.pack(">I", len(nal)) + nal


def nal_units(data: bytes) -> list[bytes]:
    """The NAL units of a 4-byte length-prefixed access unit."""
    out = []
    pos = 0
    while pos + 4 <= len(data):
        (size,) = struct.unpack_from(">I", data, pos)
        out.append(data[pos + 4:pos + 4 + size])
        pos += 4 + size
    return out


def annex_b(data: bytes) -> bytes:
    """A length-prefixed access unit with start codes instead (ITU-T H.264 Annex B)."""
    return b"".join(b"\x00\x00\x00\x01" + nal for nal in nal_units(data))


def avc_codec_string(sps: bytes) -> str:
    """The RFC 6381 codec string of an SPS: avc1.PPCCLL (profile, constraints, level)."""
    return "avc1." + sps[1:4].hex()


class _Bits:
    """Big-endian bit reader (an H.264 RBSP, a VP9 frame header), with Exp-Golomb codes (H.264
    §9.1)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def u(self, n: int) -> int:
        value = 0
        for _ in range(n):
            byte = self.pos >> 3
            if byte >= len(self.data):
                raise ValueError("bitstream truncated")
            value = (value << 1) | ((self.data[byte] >> (7 - (self.pos & 7))) & 1)
            self.pos += 1
        return value

    def ue(self) -> int:
        zeros = 0
        while self.u(1) == 0:
            zeros += 1
            if zeros > 31:
                raise ValueError("bad Exp-Golomb code")
        return (1 << zeros) - 1 + self.u(zeros)

    def se(self) -> int:
        k = self.ue()
        return (k + 1) // 2 if k & 1 else -(k // 2)


def _rbsp(nal: bytes) -> bytes:
    """NAL payload without its header and emulation-prevention bytes (00 00 03)."""
    out = bytearray()
    zeros = 0
    for b in nal[1:]:
        if zeros >= 2 and b == 3:
            zeros = 0
            continue
        out.append(b)
        zeros = zeros + 1 if b == 0 else 0
    return bytes(out)


HIGH_PROFILES = {100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135}


def sps_dimensions(sps: bytes) -> tuple[int, int]:
    """Display width and height from an SPS (H.264 §7.3.2.1.1, cropping applied); the MP4
    sample entry needs them and the muxer does not parse the SPS itself."""
    r = _Bits(_rbsp(sps))
    profile = r.u(8)
    r.u(16)  # constraint flags, level
    r.ue()  # seq_parameter_set_id
    chroma = 1
    if profile in HIGH_PROFILES:
        chroma = r.ue()
        if chroma == 3:
            r.u(1)  # separate_colour_plane_flag
        r.ue()
        r.ue()  # bit depths
        r.u(1)  # qpprime_y_zero_transform_bypass_flag
        if r.u(1):  # seq_scaling_matrix_present_flag
            for i in range(8 if chroma != 3 else 12):
                if r.u(1):
                    last = nxt = 8
                    for _ in range(16 if i < 6 else 64):
                        if nxt:
                            nxt = (last + r.se() + 256) % 256
                        last = nxt or last
    r.ue()  # log2_max_frame_num_minus4
    poc_type = r.ue()
    if poc_type == 0:
        r.ue()
    elif poc_type == 1:
        r.u(1)
        r.se()
        r.se()
        for _ in range(r.ue()):
            r.se()
    r.ue()  # max_num_ref_frames
    r.u(1)  # gaps_in_frame_num_value_allowed_flag
    width_mbs = r.ue() + 1
    height_units = r.ue() + 1
    frame_mbs_only = r.u(1)
    if not frame_mbs_only:
        r.u(1)  # mb_adaptive_frame_field_flag
    r.u(1)  # direct_8x8_inference_flag
    width = width_mbs * 16
    height = height_units * 16 * (2 - frame_mbs_only)
    if r.u(1):  # frame_cropping_flag
        left, right, top, bottom = r.ue(), r.ue(), r.ue(), r.ue()
        crop_x = 1 if chroma in (0, 3) else 2
        crop_y = (1 if chroma in (0, 3) else (2 if chroma == 1 else 1)) * (2 - frame_mbs_only)
        width -= crop_x * (left + right)
        height -= crop_y * (top + bottom)
    return width, height
