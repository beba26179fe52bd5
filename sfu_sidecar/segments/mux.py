"""Coded frames into WebM or fragmented MP4 segments with PyAV, without decoding or encoding.

Each media segment is muxed as a complete file of its own and split where its media starts:
live WebM (header, one cluster) at its first Cluster element, fragmented MP4 (ftyp, moov, then
moof + mdat) at its first moof box. The bytes before are the init segment, the rest the media
segment. With ``fflags +bitexact`` the muxers write no random UIDs and no dates, so every
segment's header is the same bytes for the same track parameters (the segmenter checks that and
serves the first one as the init segment). Frames are muxed as :class:`av.Packet` objects built
from the bitstream; no codec ever sees them.

MP4: ``frag_discont`` makes each file's fragment carry its packets' own decode time (tfdt)
rather than restart at zero, so concatenated segments keep stream time. H.264 goes in as
Annex B; the MP4 muxer takes SPS and PPS from the first keyframe (``delay_moov``) into the avcC
record and rewrites NAL units with length prefixes, as PyAV cannot set a stream's extradata
without opening a codec.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import av
from av.container import OutputContainer

from sfu_sidecar.segments.depacketize import annex_b

__all__ = ["CLUSTER_ID", "MuxError", "Sample", "TrackSpec", "mux_mp4", "mux_webm"]

CLUSTER_ID = b"\x1f\x43\xb6\x75"  # Matroska Cluster element ID
# Timestamps go to PyAV in microseconds; it rescales them to the muxer's timebase (WebM: 1 ms)
# rounding to nearest, so a packet's pts is its stream time to within half a millisecond.
_US = Fraction(1, 1_000_000)


class MuxError(Exception):
    """The muxer refused the input (reported, never raised to a client)."""


@dataclass(frozen=True, slots=True)
class TrackSpec:
    """One track of the container: ``codec`` is vp8, vp9, h264 or opus; video needs its
    dimensions in WebM (MP4 players read them from the SPS)."""

    kind: str
    codec: str
    width: int = 0
    height: int = 0
    sample_rate: int = 48000
    channels: int = 2


@dataclass(frozen=True, slots=True)
class Sample:
    """One frame to mux: its track's index in the spec list, stream time in µs, the bytes."""

    track: int
    pts_us: int
    data: bytes
    keyframe: bool


MP4_FLAGS = "frag_keyframe+empty_moov+delay_moov+default_base_moof+frag_discont+skip_trailer"


def _add_track(container: OutputContainer, spec: TrackSpec) -> av.stream.Stream:
    if spec.codec in ("vp8", "vp9", "h264"):
        # A stream without a codec context: nothing is opened, the packets pass through.
        # The RTP clock's timebase; WebM replaces it with its own 1 ms.
        return container.add_mux_stream(spec.codec, width=spec.width, height=spec.height,
                                        time_base=Fraction(1, 90000))
    if spec.codec == "opus":
        # The libopus encoder context is opened (never fed) only because it writes the
        # OpusHead the WebM CodecPrivate needs; PyAV cannot set a mux stream's extradata.
        layout = "stereo" if spec.channels == 2 else "mono"
        return container.add_stream("libopus", rate=spec.sample_rate, layout=layout)
    raise MuxError(f"codec {spec.codec} not supported")


def _mux(fmt: str, options: dict[str, str], tracks: Sequence[TrackSpec],
         samples: Sequence[Sample]) -> tuple[bytes, int]:
    buf = io.BytesIO()
    try:
        container = av.open(buf, "w", format=fmt, options=options)
        assert isinstance(container, OutputContainer)
        with container:
            streams = [_add_track(container, spec) for spec in tracks]
            container.start_encoding()
            header_len = len(buf.getvalue())
            for sample in samples:
                data = sample.data
                if tracks[sample.track].codec == "h264":
                    data = annex_b(data)
                packet = av.Packet(data)
                packet.stream = streams[sample.track]
                packet.time_base = _US
                packet.pts = packet.dts = sample.pts_us
                packet.is_keyframe = sample.keyframe
                container.mux(packet)
    except (av.FFmpegError, ValueError) as e:
        raise MuxError(str(e)) from e
    return buf.getvalue(), header_len


def mux_webm(tracks: Sequence[TrackSpec], samples: Sequence[Sample]) -> tuple[bytes, bytes]:
    """(header, cluster bytes) for ``samples`` (VP8 or VP9, Opus), muxed in pts order per
    track."""
    out, header_len = _mux("webm", {"live": "1", "fflags": "+bitexact"}, tracks, samples)
    cut = out.find(CLUSTER_ID, header_len)
    if cut < 0:
        raise MuxError("the muxer wrote no cluster")
    return out[:cut], sort_cluster_blocks(out[cut:])


def _element(data: bytes, pos: int) -> tuple[int, int, int]:
    """(id, start of payload, payload size) of the EBML element at ``pos``."""
    first = data[pos]
    id_len = 1 + (8 - first.bit_length()) if first else 9
    if id_len > 4 or pos + id_len >= len(data):
        raise MuxError("bad EBML element id")
    element_id = int.from_bytes(data[pos:pos + id_len], "big")
    pos += id_len
    first = data[pos]
    size_len = 9 - first.bit_length() if first else 9
    if size_len > 8 or pos + size_len > len(data):
        raise MuxError("bad EBML element size")
    size = int.from_bytes(data[pos:pos + size_len], "big") & ((1 << (7 * size_len)) - 1)
    if size == (1 << (7 * size_len)) - 1:
        raise MuxError("unknown-size EBML element")
    return element_id, pos + size_len, size


SIMPLE_BLOCK_ID = 0xA3
BLOCK_GROUP_ID = 0xA0
BLOCK_ID = 0xA1


def _block_time(data: bytes, element_id: int, start: int, size: int) -> int:
    """The cluster-relative timecode of a SimpleBlock or of a BlockGroup's Block."""
    if element_id == BLOCK_GROUP_ID:
        pos = start
        while pos < start + size:
            child, child_start, child_size = _element(data, pos)
            if child == BLOCK_ID:
                return _block_time(data, SIMPLE_BLOCK_ID, child_start, child_size)
            pos = child_start + child_size
        raise MuxError("BlockGroup without a Block")
    track_len = 9 - data[start].bit_length()  # the track number is a vint
    return int.from_bytes(data[start + track_len:start + track_len + 2], "big", signed=True)


def sort_cluster_blocks(clusters: bytes) -> bytes:
    """The clusters with each one's blocks in stored-timecode order.

    The muxer interleaves packets by timestamp, then stores Opus blocks later by the codec
    delay it declares (CodecDelay, 6.5 ms), so an audio block can sit before a video block with
    a smaller stored timecode; Chromium's MSE refuses such a cluster ("a block with a timecode
    before the previous block"). The blocks are moved, not changed, and a stable sort keeps
    each track's order.
    """
    out = bytearray()
    pos = 0
    while pos < len(clusters):
        element_id, start, size = _element(clusters, pos)
        end = start + size
        if element_id != int.from_bytes(CLUSTER_ID, "big"):
            out += clusters[pos:end]
            pos = end
            continue
        head = bytearray()
        blocks: list[tuple[int, bytes]] = []
        child = start
        while child < end:
            child_id, child_start, child_size = _element(clusters, child)
            child_end = child_start + child_size
            if child_id in (SIMPLE_BLOCK_ID, BLOCK_GROUP_ID):
                blocks.append((_block_time(clusters, child_id, child_start, child_size),
                               clusters[child:child_end]))
            elif blocks:
                raise MuxError("cluster element after its blocks")
            else:
                head += clusters[child:child_end]
            child = child_end
        out += clusters[pos:start]  # the same id and size: the payload keeps its length
        out += head
        for _, block in sorted(blocks, key=lambda b: b[0]):
            out += block
        pos = end
    return bytes(out)


def mux_mp4(tracks: Sequence[TrackSpec], samples: Sequence[Sample]) -> tuple[bytes, bytes]:
    """(ftyp + moov, moof + mdat boxes) for ``samples`` (H.264, Opus); the first video sample
    must be a keyframe carrying SPS and PPS."""
    out, _ = _mux("mp4", {"movflags": MP4_FLAGS, "fflags": "+bitexact"}, tracks, samples)
    pos = 0
    while pos + 8 <= len(out):
        size = int.from_bytes(out[pos:pos + 4], "big")
        if out[pos + 4:pos + 8] == b"moof":
            return out[:pos], out[pos:]
        if size < 8:
            break
        pos += size
    raise MuxError("the muxer wrote no fragment")
