"""The VP9 RTP payload descriptor (RFC 9628 §4.2), read without decoding anything.

The relay needs it to tell a keyframe's first packet (to answer a late joiner's keyframe wait)
and the segmenter to reassemble frames. Layout of the first byte, then the optional parts in
order:

    +-+-+-+-+-+-+-+-+
    |I|P|L|F|B|E|V|Z|   I: PictureID present   P: inter-picture predicted   L: layer indices
    +-+-+-+-+-+-+-+-+   F: flexible mode   B: start of a layer frame   E: end of a layer frame
    |M| PICTURE ID  |   V: scalability structure present   Z: not a reference for upper layers
    | EXTENDED PID  |   (when M=1: a 15-bit PictureID)
    | TID |U| SID |D|   (L=1)
    |   TL0PICIDX   |   (L=1 and F=0)
    |  P_DIFF     |N|   (F=1 and P=1: up to three, N=1 while another follows)
    |N_S|Y|G|-|-|-|     (V=1: scalability structure, RFC 9628 §4.2.1)
    | WIDTH, HEIGHT |   (Y=1: 2 + 2 bytes for each of the N_S + 1 spatial layers)
    |      N_G      |   (G=1, then N_G pictures: | TID |U| R |-|-| and R P_DIFF bytes)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Vp9Descriptor", "Vp9DescriptorError", "vp9_keyframe_start"]

_MAX_P_DIFFS = 3  # RFC 9628 §4.2: "up to 3 reference indices"


class Vp9DescriptorError(ValueError):
    """A descriptor truncated or breaking the RFC's limits."""


@dataclass(frozen=True, slots=True)
class Vp9Descriptor:
    """What the relay and the segmenter read of one packet's descriptor."""

    size: int  # bytes of descriptor before the VP9 payload
    inter: bool  # P: the frame refers to earlier frames
    start: bool  # B: first packet of a layer frame
    end: bool  # E: last packet of a layer frame
    spatial_id: int  # SID, 0 without layer indices
    # (width, height) per spatial layer from a scalability structure, () without one.
    resolutions: tuple[tuple[int, int], ...] = ()
    picture_id: int | None = None  # counts pictures, modulo 2**picture_id_bits
    picture_id_bits: int = 0

    @classmethod
    def parse(cls, payload: bytes) -> Vp9Descriptor:
        if not payload:
            raise Vp9DescriptorError("empty VP9 payload")
        b0 = payload[0]
        pos = 1

        def take(n: int) -> bytes:
            nonlocal pos
            if pos + n > len(payload):
                raise Vp9DescriptorError("VP9 payload descriptor truncated")
            out = payload[pos:pos + n]
            pos += n
            return out

        inter, flexible = bool(b0 & 0x40), bool(b0 & 0x10)
        picture_id, picture_id_bits = None, 0
        if b0 & 0x80:  # I: PictureID, 7 bits or (M=1) 15 bits
            high = take(1)[0]
            if high & 0x80:
                picture_id, picture_id_bits = ((high & 0x7F) << 8) | take(1)[0], 15
            else:
                picture_id, picture_id_bits = high, 7
        spatial_id = 0
        if b0 & 0x20:  # L: layer indices
            spatial_id = (take(1)[0] >> 1) & 0x07
            if not flexible:
                take(1)  # TL0PICIDX
        if flexible and inter:
            for _ in range(_MAX_P_DIFFS):
                if not take(1)[0] & 0x01:
                    break
            else:
                raise Vp9DescriptorError("more than three VP9 reference indices")
        resolutions: tuple[tuple[int, int], ...] = ()
        if b0 & 0x02:  # V: scalability structure
            ss = take(1)[0]
            layers = (ss >> 5) + 1
            if ss & 0x10:  # Y: resolutions
                sizes = take(4 * layers)
                resolutions = tuple(
                    (int.from_bytes(sizes[4 * i:4 * i + 2], "big"),
                     int.from_bytes(sizes[4 * i + 2:4 * i + 4], "big"))
                    for i in range(layers))
            if ss & 0x08:  # G: picture group description
                for _ in range(take(1)[0]):
                    take((take(1)[0] >> 2) & 0x03)
        return cls(pos, inter, bool(b0 & 0x08), bool(b0 & 0x04), spatial_id, resolutions,
                   picture_id, picture_id_bits)


def vp9_keyframe_start(payload: bytes) -> bool:
    """Whether this packet starts a picture a decoder can start from: the first packet of the
    base spatial layer's frame, not inter-picture predicted."""
    # The forwarder asks this of every video packet: most are not a frame's first (B clear) or
    # are predicted (P set), which the first byte alone says.
    if not payload or payload[0] & 0x48 != 0x08:
        return False
    try:
        d = Vp9Descriptor.parse(payload)
    except Vp9DescriptorError:
        return False
    return d.start and not d.inter and d.spatial_id == 0 and len(payload) > d.size
