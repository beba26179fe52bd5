"""VP9 without decoding: GStreamer's encoder and RTP packetizer (``vp9enc ! rtpvp9pay``) feed
the depacketizer, whose frames must equal byte for byte what GStreamer's own WebM muxer stores
from the same encoder; the segmenter's WebM segments are read back with ffprobe."""

from __future__ import annotations

import logging
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import av
import pytest

from sfu_sidecar.relay.packet import is_keyframe_start
from sfu_sidecar.relay.vp9 import Vp9Descriptor
from sfu_sidecar.segments.depacketize import Frame
from sfu_sidecar.segments.segmenter import StreamSegmenter
from sfu_sidecar.segments.vp9 import Vp9Depacketizer, vp9_frame_header, vp9_superframe
from tests.segments.media import ffprobe, first_video_packet_per_range

pytestmark = pytest.mark.needs("gst-launch-1.0")

FRAMES, GOP, FPS = 60, 15, 30


@dataclass(frozen=True)
class Packet:
    seq: int
    timestamp: int
    marker: bool
    payload: bytes


@dataclass(frozen=True)
class GstVp9:
    packets: list[Packet]
    frames: list[bytes]  # the encoder's frames as GStreamer's webmmux stored them
    keyframes: list[bool]


def _rtp(data: bytes) -> Packet:
    marker, (seq, ts) = bool(data[1] & 0x80), struct.unpack_from("!HI", data, 2)
    pos = 12 + 4 * (data[0] & 0x0F)
    if data[0] & 0x10:  # header extension
        pos += 4 + 4 * struct.unpack_from("!H", data, pos + 2)[0]
    return Packet(seq, ts, marker, data[pos:])


@pytest.fixture(scope="module")
def gst_vp9(tmp_path_factory: pytest.TempPathFactory) -> GstVp9:
    """60 frames of 640x360 VP9 (a keyframe every 15), packetized in 600-byte packets."""
    out = tmp_path_factory.mktemp("vp9")
    gst = shutil.which("gst-launch-1.0")
    assert gst is not None
    subprocess.run(
        [gst, "-q", "videotestsrc", f"num-buffers={FRAMES}", "pattern=smpte",
         "horizontal-speed=4", "!", f"video/x-raw,width=640,height=360,framerate={FPS}/1", "!",
         "vp9enc", "deadline=1", "cpu-used=8", f"keyframe-max-dist={GOP}",
         "target-bitrate=2000000", "!",
         "tee", "name=t", "!", "queue", "!", "rtpvp9pay", "mtu=600", "picture-id-mode=15-bit",
         "!", "rtpstreampay", "!",
         "filesink", f"location={out / 'vp9.rtp'}",
         "t.", "!", "queue", "!", "webmmux", "!", "filesink", f"location={out / 'vp9.webm'}"],
        check=True, timeout=60)
    raw = (out / "vp9.rtp").read_bytes()
    packets, pos = [], 0
    while pos < len(raw):  # RFC 4571 framing: a 16-bit length before each packet
        (size,) = struct.unpack_from("!H", raw, pos)
        packets.append(_rtp(raw[pos + 2:pos + 2 + size]))
        pos += 2 + size
    with av.open(str(out / "vp9.webm")) as container:
        demuxed = [(bytes(p), bool(p.is_keyframe)) for p in container.demux(video=0) if p.size]
    return GstVp9(packets, [d for d, _ in demuxed], [k for _, k in demuxed])


def _depacketize(packets: list[Packet], lost: frozenset[int] = frozenset()) -> list[Frame]:
    dep = Vp9Depacketizer()
    out = []
    for i, p in enumerate(packets):
        if i not in lost and (frame := dep.push(p.seq, p.timestamp, p.marker, p.payload)):
            out.append(frame)
    return out


def test_frames_from_gstreamers_packetizer_are_the_encoders_bytes(gst_vp9: GstVp9) -> None:
    assert len(gst_vp9.packets) > 2 * FRAMES  # frames span several packets
    frames = _depacketize(gst_vp9.packets)
    assert [f.data for f in frames] == gst_vp9.frames
    assert [f.keyframe for f in frames] == gst_vp9.keyframes
    assert sum(gst_vp9.keyframes) == FRAMES // GOP
    assert all((f.width, f.height) == (640, 360) for f in frames if f.keyframe)
    assert vp9_frame_header(frames[0].data) == (True, 640, 360)
    # The relay's keyframe test agrees on every picture's first packet.
    firsts = [p for i, p in enumerate(gst_vp9.packets)
              if i == 0 or p.timestamp != gst_vp9.packets[i - 1].timestamp]
    assert [is_keyframe_start("vp9", p.payload) for p in firsts] == gst_vp9.keyframes


def test_a_lost_packet_drops_frames_until_the_next_keyframe(gst_vp9: GstVp9) -> None:
    packets = gst_vp9.packets
    # A middle packet of the third picture.
    third = sorted({p.timestamp for p in packets}, key=[p.timestamp for p in packets].index)[2]
    lost = next(i for i, p in enumerate(packets)
                if p.timestamp == third and not p.marker and i > 0
                and packets[i - 1].timestamp == third)
    frames = _depacketize(packets, frozenset({lost}))
    assert [f.data for f in frames] == gst_vp9.frames[:2] + gst_vp9.frames[GOP:]


def test_a_picture_lost_whole_is_noticed_by_its_picture_id(gst_vp9: GstVp9) -> None:
    """Every packet of the fifth picture lost: the sixth starts cleanly, but its PictureID
    says one is missing, so nothing is muxed until the next keyframe."""
    packets = gst_vp9.packets
    stamps = sorted({p.timestamp for p in packets}, key=[p.timestamp for p in packets].index)
    fifth = frozenset(i for i, p in enumerate(packets) if p.timestamp == stamps[4])
    assert Vp9Descriptor.parse(packets[min(fifth)].payload).picture_id_bits == 15
    frames = _depacketize(packets, fifth)
    assert [f.data for f in frames] == gst_vp9.frames[:4] + gst_vp9.frames[GOP:]


def test_layer_frames_of_one_picture_become_one_superframe() -> None:
    base = b"\x82\x49\x83\x42" + b"\x00" * 10 + b"base"
    upper = b"\x86" + b"upper layer" * 30  # a non-key frame header (frame_type 1)
    dep = Vp9Depacketizer()
    # SID 0 in one packet, SID 1 in two (B, then E with the marker); non-flexible mode.
    assert dep.push(1, 900, False, bytes([0x2C, 0x00, 0x00]) + base) is None
    assert dep.push(2, 900, False, bytes([0x28, 0x02, 0x00]) + upper[:100]) is None
    frame = dep.push(3, 900, True, bytes([0x24, 0x02, 0x00]) + upper[100:])
    assert frame is not None and frame.keyframe
    assert frame.data == vp9_superframe([base, upper])
    # The index (Annex B): marker 0b110 | size bytes - 1 | frames - 1, sizes little-endian.
    marker = frame.data[-1]
    assert marker == 0xC0 | (1 << 3) | 1 and frame.data[-6] == marker
    assert struct.unpack("<HH", frame.data[-5:-1]) == (len(base), len(upper))


def test_vp9_segments_read_back_by_ffprobe(gst_vp9: GstVp9, tmp_path: Path) -> None:
    frames = _depacketize(gst_vp9.packets)
    seg = StreamSegmenter("s", target_us=400_000, window=100,
                          request_keyframe=lambda: None, log=logging.getLogger("test"))
    seg.video_codec = "vp9"
    times = []
    for i, f in enumerate(frames):
        times.append(1_000_000 + i * 1_000_000 // FPS + 137)
        seg.push("video", f, times[-1])
    assert seg.container == "webm" and seg.index()["codecs"] == ["vp9"]
    assert seg.init is not None and len(seg.segments) == FRAMES // GOP - 1
    path = tmp_path / "all.webm"
    ranges = []
    with path.open("wb") as out:
        out.write(seg.init)
        for s in seg.segments:
            ranges.append((out.tell(), out.tell() + len(s.data)))
            out.write(s.data)
    probe = ffprobe(path)
    (video,) = probe["streams"]
    assert (video["codec_name"], video["width"], video["height"]) == ("vp9", 640, 360)
    for first in first_video_packet_per_range(probe, ranges):
        assert first is not None and "K" in first["flags"]
    pts = [float(p["pts_time"]) * 1e6 for p in probe["packets"]]
    assert max(abs(p - t) for p, t in zip(pts, times, strict=False)) <= 500
    with av.open(str(path)) as container:  # and libvpx decodes every frame
        decoded = list(container.decode(video=0))
    assert len(decoded) == len(pts) and (decoded[0].width, decoded[0].height) == (640, 360)
