"""Depacketizers against packets built by hand per RFC 7741 / RFC 6184, and against the
payloads aiortc's own packetizers (``Vp8Encoder.pack``, ``H264Encoder.pack``) produce from real
encoder output: the frames must come back byte for byte."""

from __future__ import annotations

import fractions
import itertools
import random
import struct

import av
import pytest
from aiortc.codecs.h264 import H264Encoder
from aiortc.codecs.vpx import Vp8Encoder

from sfu_sidecar.segments.depacketize import (
    Frame,
    H264Depacketizer,
    OpusDepacketizer,
    Vp8Depacketizer,
    sps_dimensions,
    vp8_descriptor_size,
    vp8_picture_id,
)

# A VP8 keyframe's first bytes: frame tag (P bit 0), start code, 320x240 (RFC 6386 §9.1).
VP8_KEY = bytes([0x50, 0x2A, 0x00, 0x9D, 0x01, 0x2A]) + struct.pack("<HH", 320, 240) + b"k" * 40
VP8_INTER = bytes([0x51, 0x02, 0x00]) + b"i" * 30


def _pattern(i: int, width: int = 320, height: int = 240) -> av.VideoFrame:
    # Noise, so frames are large enough to need several RTP packets.
    rng = random.Random(i)
    frame = av.VideoFrame(width, height, "yuv420p")
    for plane in frame.planes:
        plane.update(rng.randbytes(plane.buffer_size))
    frame.pts = i
    frame.time_base = fractions.Fraction(1, 30)
    return frame


def _encoded(codec: str, count: int) -> list[av.Packet]:
    enc = av.CodecContext.create(codec, "w")
    enc.width, enc.height, enc.pix_fmt = 320, 240, "yuv420p"
    enc.time_base = fractions.Fraction(1, 30)
    enc.bit_rate = 3_000_000
    enc.options = ({"deadline": "realtime", "g": "10"} if codec == "libvpx"
                   else {"tune": "zerolatency", "g": "10", "bf": "0"})
    out: list[av.Packet] = []
    for i in range(count):
        out.extend(enc.encode(_pattern(i)))  # type: ignore[arg-type]
    out.extend(enc.encode(None))  # type: ignore[arg-type]
    return out


def _feed(dep: Vp8Depacketizer | H264Depacketizer, frames: list[tuple[int, list[bytes]]],
          seq: int = 65530, skip: frozenset[int] = frozenset()) -> list[Frame]:
    """Push each frame's payloads with rising sequence numbers (wrapping), marker on the last;
    packets whose running index is in ``skip`` are lost."""
    out = []
    n = 0
    for ts, payloads in frames:
        for i, payload in enumerate(payloads):
            if n not in skip:
                got = dep.push(seq & 0xFFFF, ts, i == len(payloads) - 1, payload)
                if got is not None:
                    out.append(got)
            seq += 1
            n += 1
    return out


# --- VP8 -----------------------------------------------------------------------------------

def test_vp8_descriptor_sizes_per_rfc7741() -> None:
    assert vp8_descriptor_size(bytes([0x10])) == 1                     # no extension
    assert vp8_descriptor_size(bytes([0x90, 0x80, 0x05])) == 3          # I, 7-bit PictureID
    assert vp8_descriptor_size(bytes([0x90, 0x80, 0x81, 0x23])) == 4    # I, 15-bit (M bit)
    assert vp8_descriptor_size(bytes([0x90, 0xC0, 0x81, 0x23, 7])) == 5  # I + L (TL0PICIDX)
    assert vp8_descriptor_size(bytes([0x90, 0xF0, 0x05, 7, 0x20])) == 5  # I + L + T/K
    assert vp8_descriptor_size(bytes([0x90, 0x20, 0x20])) == 3          # K alone
    with pytest.raises(ValueError):
        vp8_descriptor_size(bytes([0x90, 0x80]))  # PictureID promised, missing


def test_vp8_frame_across_packets_and_partitions() -> None:
    # Keyframe in three packets: the first with S=1 PID=0 and a 15-bit PictureID, then a
    # continuation, then the start of partition 1 (S=1, PID=1) which does not start a frame.
    d1 = bytes([0x90, 0x80, 0x80, 0x01])
    d2 = bytes([0x80, 0x80, 0x80, 0x01])
    d3 = bytes([0x91, 0x80, 0x80, 0x01])
    key = [d1 + VP8_KEY[:20], d2 + VP8_KEY[20:35], d3 + VP8_KEY[35:]]
    inter = [bytes([0x10]) + VP8_INTER]
    frames = _feed(Vp8Depacketizer(), [(1000, key), (4000, inter)])
    assert [(f.timestamp, f.data, f.keyframe) for f in frames] == [
        (1000, VP8_KEY, True), (4000, VP8_INTER, False)
    ]
    assert (frames[0].width, frames[0].height) == (320, 240)


def test_vp8_lost_packet_drops_the_frame_until_the_next_keyframe() -> None:
    key = [bytes([0x10]) + VP8_KEY[:20], bytes([0x00]) + VP8_KEY[20:]]
    inter = [bytes([0x10]) + VP8_INTER[:10], bytes([0x00]) + VP8_INTER[10:]]
    # Packet 3 (the second half of the first inter frame) is lost: that frame and the next
    # inter frame are not emitted; the keyframe after them is.
    frames = _feed(Vp8Depacketizer(), [(0, key), (3000, inter), (6000, inter), (9000, key)],
                   skip=frozenset({3}))
    assert [(f.timestamp, f.keyframe) for f in frames] == [(0, True), (9000, True)]


def test_vp8_nothing_before_the_first_keyframe() -> None:
    inter = [bytes([0x10]) + VP8_INTER]
    key = [bytes([0x10]) + VP8_KEY]
    frames = _feed(Vp8Depacketizer(), [(0, inter), (3000, key), (6000, inter)])
    assert [f.timestamp for f in frames] == [3000, 6000]


def test_vp8_from_aiortc_packetizer() -> None:
    packets = _encoded("libvpx", 20)
    encoder = Vp8Encoder()
    frames_in = []
    for packet in packets:
        payloads, ts = encoder.pack(packet)
        frames_in.append((ts, payloads))
    assert any(len(p) > 1 for _, p in frames_in), "want frames split over several packets"
    frames = _feed(Vp8Depacketizer(), frames_in)
    assert [f.data for f in frames] == [bytes(p) for p in packets]
    assert [f.keyframe for f in frames] == [p.is_keyframe for p in packets]
    assert (frames[0].width, frames[0].height) == (320, 240)


def test_vp8_a_frame_lost_whole_waits_for_the_next_keyframe() -> None:
    """A gap that took every packet of one frame shows no broken frame: the frame after it
    starts cleanly. aiortc's packetizer counts frames in the PictureID, so the depacketizer
    sees one missing and waits for a keyframe instead of muxing frames that refer to it."""
    packets = _encoded("libvpx", 20)  # keyframes at 0 and 10
    encoder = Vp8Encoder()
    frames_in = [encoder.pack(packet)[::-1] for packet in packets]
    assert vp8_picture_id(frames_in[3][1][0]) is not None
    first_of = list(itertools.accumulate([0] + [len(p) for _, p in frames_in]))
    lost = frozenset(range(first_of[3], first_of[4]))  # the whole of frame 3
    frames = _feed(Vp8Depacketizer(), [(ts, p) for ts, p in frames_in], skip=lost)
    assert [f.data for f in frames] == [bytes(p) for p in packets[:3] + packets[10:]]
    # The same gap with a frame's count intact (only its own packets lost) is no loss of
    # another frame: frame 4 is dropped, and nothing more until the keyframe.
    dep = Vp8Depacketizer()
    frames = _feed(dep, [(ts, p) for ts, p in frames_in], skip=frozenset({first_of[4]}))
    assert [f.data for f in frames] == [bytes(p) for p in packets[:4] + packets[10:]]


# --- H.264 -----------------------------------------------------------------------------------

def _nal(kind: int, body: bytes) -> bytes:
    return bytes([0x60 | kind]) + body


def _length_prefixed(*nals: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(n)) + n for n in nals)


def test_h264_single_stap_a_and_fu_a() -> None:
    sps = _nal(7, bytes([0x42, 0xC0, 0x1F]) + b"s" * 5)
    pps = _nal(8, b"p" * 3)
    idr = _nal(5, b"I" * 300)
    stap = bytes([0x78]) + b"".join(struct.pack(">H", len(n)) + n for n in (sps, pps))
    # FU-A: indicator keeps NRI (0x60) with type 28, header carries S/E and type 5.
    fu = [bytes([0x7C, 0x85]) + idr[1:101], bytes([0x7C, 0x05]) + idr[101:201],
          bytes([0x7C, 0x45]) + idr[201:]]
    slice_ = _nal(1, b"P" * 50)
    dep = H264Depacketizer()
    frames = _feed(dep, [(0, [stap, *fu]), (3000, [slice_])])
    assert [(f.timestamp, f.data, f.keyframe) for f in frames] == [
        (0, _length_prefixed(sps, pps, idr), True), (3000, _length_prefixed(slice_), False)
    ]
    assert dep.sps == sps and dep.pps == pps


SPS = _nal(7, bytes([0x42, 0xC0, 0x1F]) + b"s" * 5)
PPS = _nal(8, b"p" * 3)


def test_h264_lost_fragment_waits_for_an_idr() -> None:
    idr = _nal(5, b"I" * 200)
    fu = [bytes([0x7C, 0x85]) + idr[1:100], bytes([0x7C, 0x45]) + idr[100:]]
    slice_ = [_nal(1, b"P" * 20)]
    frames = _feed(H264Depacketizer(),
                   [(0, [SPS, PPS, *fu]), (3000, slice_), (6000, fu), (9000, slice_)],
                   skip=frozenset({5}))  # the first packet of the IDR at 6000
    assert [f.timestamp for f in frames] == [0, 3000]


def test_h264_idr_without_parameter_sets() -> None:
    idr = _nal(5, b"I" * 20)
    # None seen yet: the IDR cannot be decoded, nothing comes out until they arrive.
    frames = _feed(H264Depacketizer(), [(0, [idr]), (3000, [SPS, PPS, idr]), (6000, [idr])])
    assert [(f.timestamp, f.keyframe) for f in frames] == [(3000, True), (6000, True)]
    # The later IDR gets the parameter sets seen before, so a segment can start on it.
    assert frames[1].data == _length_prefixed(SPS, PPS, idr)


def _annexb_nals(data: bytes) -> list[bytes]:
    parts = data.replace(b"\x00\x00\x00\x01", b"\x00\x00\x01").split(b"\x00\x00\x01")
    return [p for p in parts if p]


def test_h264_from_aiortc_packetizer() -> None:
    packets = _encoded("libx264", 20)
    encoder = H264Encoder()
    frames_in = []
    for packet in packets:
        payloads, ts = encoder.pack(packet)
        frames_in.append((ts, payloads))
    assert any(p[0] & 0x1F == 28 for _, ps in frames_in for p in ps), "want FU-A packets"
    assert any(p[0] & 0x1F == 24 for _, ps in frames_in for p in ps), "want STAP-A packets"
    frames = _feed(H264Depacketizer(), frames_in)
    assert [f.data for f in frames] == [
        _length_prefixed(*_annexb_nals(bytes(p))) for p in packets
    ]
    assert frames[0].keyframe and (frames[0].width, frames[0].height) == (320, 240)


@pytest.mark.parametrize(("width", "height", "profile"),
                         [(176, 100, "baseline"), (640, 360, "high"), (322, 242, "main")])
def test_sps_dimensions_with_cropping(width: int, height: int, profile: str) -> None:
    enc = av.CodecContext.create("libx264", "w")
    enc.width, enc.height, enc.pix_fmt = width, height, "yuv420p"
    enc.time_base = fractions.Fraction(1, 30)
    enc.options = {"profile": profile, "tune": "zerolatency"}
    frame = av.VideoFrame(width, height, "yuv420p")
    frame.pts = 0
    data = b"".join(bytes(p) for p in enc.encode(frame))  # type: ignore[arg-type]
    sps = next(n for n in _annexb_nals(data) if n[0] & 0x1F == 7)
    assert sps_dimensions(sps) == (width, height)


def test_opus_one_packet_one_frame() -> None:
    dep = OpusDepacketizer()
    assert dep.push(1, 960, True, b"\xfc\x01\x02") == Frame(960, b"\xfc\x01\x02", True)
    assert dep.push(2, 1920, False, b"") is None
