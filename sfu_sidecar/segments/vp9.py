"""VP9 frames from RTP payloads (RFC 9628), without decoding.

A picture is the packets of one RTP timestamp up to the marker; with spatial layers it holds
one layer frame per layer, each from its B to its E packet. A picture of one frame goes to the
container as it is; several are joined into one superframe (VP9 bitstream spec, Annex B), the
form WebM stores. The keyframe flag and the dimensions come from the base layer frame's
uncompressed header (VP9 bitstream spec §6.2), which is read, not decoded.
"""

from __future__ import annotations

from sfu_sidecar.relay.vp9 import Vp9Descriptor, Vp9DescriptorError
from sfu_sidecar.segments.depacketize import Frame, PictureCounter, _Assembler, _Bits

__all__ = ["Vp9Depacketizer", "vp9_frame_header", "vp9_superframe"]

_SYNC_CODE = 0x498342  # frame_sync_code of a keyframe
_CS_RGB = 7


def vp9_frame_header(data: bytes) -> tuple[bool, int, int]:
    """(keyframe, width, height) from a frame's uncompressed header; dimensions are 0 unless it
    is a keyframe. ValueError when it is not a VP9 frame."""
    bits = _Bits(data)
    if bits.u(2) != 2:
        raise ValueError("not a VP9 frame (frame_marker)")
    profile = bits.u(1) | (bits.u(1) << 1)
    if profile == 3:
        bits.u(1)  # reserved_zero
    if bits.u(1):  # show_existing_frame: a repeat of a decoded frame, no new picture
        return False, 0, 0
    if bits.u(1):  # frame_type: 1 = NON_KEY_FRAME
        return False, 0, 0
    bits.u(2)  # show_frame, error_resilient_mode
    if bits.u(24) != _SYNC_CODE:
        raise ValueError("VP9 keyframe without its sync code")
    if profile >= 2:
        bits.u(1)  # ten_or_twelve_bit
    if bits.u(3) != _CS_RGB:  # color_space
        bits.u(1)  # color_range
        if profile in (1, 3):
            bits.u(3)  # subsampling_x, subsampling_y, reserved_zero
    elif profile in (1, 3):
        bits.u(1)  # reserved_zero
    return True, bits.u(16) + 1, bits.u(16) + 1


def vp9_superframe(frames: list[bytes]) -> bytes:
    """One superframe of ``frames`` (VP9 bitstream spec Annex B): the frames, then an index of
    their sizes framed by a marker byte at both ends."""
    if len(frames) == 1:
        return frames[0]
    if not 1 <= len(frames) <= 8:
        raise ValueError("a superframe holds 1 to 8 frames")
    size_bytes = max(1, (max(len(f) for f in frames).bit_length() + 7) // 8)
    if size_bytes > 4:
        raise ValueError("VP9 frame too large for a superframe index")
    marker = 0xC0 | ((size_bytes - 1) << 3) | (len(frames) - 1)
    index = bytes([marker]) + b"".join(len(f).to_bytes(size_bytes, "little") for f in frames)
    return b"".join(frames) + index + bytes([marker])


class Vp9Depacketizer:
    """Pictures of one VP9 track, as the container takes them."""

    def __init__(self) -> None:
        self._asm = _Assembler()
        self._starts: list[bool] = []  # B flag of each payload the assembler holds
        self._pictures = PictureCounter()
        # The top layer's size from a scalability structure in the picture being assembled.
        self._resolution: tuple[int, int] | None = None

    def push(self, seq: int, timestamp: int, marker: bool, payload: bytes) -> Frame | None:
        asm = self._asm
        asm.add(seq, timestamp)
        if not asm.parts:
            self._starts = []
            self._resolution = None
        try:
            desc = Vp9Descriptor.parse(payload)
        except Vp9DescriptorError:
            asm.broken = True
        else:
            if desc.resolutions:
                self._resolution = desc.resolutions[-1]
            if desc.start and not asm.parts and desc.spatial_id == 0:
                # The picture's first packet is here: a gap before it took nothing of it, but
                # it may have taken whole pictures before it, unless their count says not.
                follows = self._pictures.follows(desc.picture_id, desc.picture_id_bits)
                if asm.broken and not follows:
                    asm.need_keyframe = True
                asm.started = True
                asm.broken = False
            asm.parts.append(payload[desc.size:])
            self._starts.append(desc.start)
        if not marker:
            return None
        pieces = list(zip(self._starts, asm.parts, strict=True))
        taken = asm.take()
        if taken is None:
            return None
        layers: list[bytearray] = []
        for begins, piece in pieces:
            if begins or not layers:
                layers.append(bytearray())
            layers[-1] += piece
        try:
            keyframe, width, height = vp9_frame_header(bytes(layers[0]))
            data = vp9_superframe([bytes(layer) for layer in layers])
        except ValueError:
            asm.need_keyframe = True
            return None
        if asm.need_keyframe and not keyframe:
            return None
        asm.need_keyframe = False
        if keyframe and self._resolution is not None:
            # With spatial layers the top layer's size (the scalability structure sent with
            # this picture) is the picture's; a plain stream's only layer says its own in its
            # header.
            width, height = self._resolution
        return Frame(taken[0], data, keyframe, width, height)
