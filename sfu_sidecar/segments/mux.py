"""Coded frames into WebM segments with PyAV, without decoding or encoding.

Each media segment is muxed as a complete live-WebM file of its own (header, one cluster) and
split at its first Cluster element: the bytes before it are the init segment, the rest the media
segment. With ``fflags +bitexact`` the muxer writes no random UIDs and no dates, so every
segment's header is the same bytes for the same track parameters; :class:`Muxer` checks that
and serves the first one as the init segment. Frames are muxed as :class:`av.Packet` objects
built from the bitstream; no codec ever sees them.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import av
from av.container import OutputContainer

__all__ = ["CLUSTER_ID", "MuxError", "Sample", "TrackSpec", "mux_webm"]

CLUSTER_ID = b"\x1f\x43\xb6\x75"  # Matroska Cluster element ID
# Timestamps go to PyAV in microseconds; it rescales them to the muxer's timebase (WebM: 1 ms)
# rounding to nearest, so a packet's pts is its stream time to within half a millisecond.
_US = Fraction(1, 1_000_000)


class MuxError(Exception):
    """The muxer refused the input (reported, never raised to a client)."""


@dataclass(frozen=True, slots=True)
class TrackSpec:
    """One track of the container: ``codec`` is vp8 or opus; video needs its dimensions."""

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


def _add_track(container: OutputContainer, spec: TrackSpec) -> av.stream.Stream:
    if spec.codec == "vp8":
        # A stream without a codec context: nothing is opened, the packets pass through.
        return container.add_mux_stream("vp8", width=spec.width, height=spec.height)
    if spec.codec == "opus":
        # The libopus encoder context is opened (never fed) only because it writes the
        # OpusHead the WebM CodecPrivate needs; PyAV cannot set a mux stream's extradata.
        layout = "stereo" if spec.channels == 2 else "mono"
        return container.add_stream("libopus", rate=spec.sample_rate, layout=layout)
    raise MuxError(f"codec {spec.codec} not supported in WebM")


def mux_webm(tracks: Sequence[TrackSpec], samples: Sequence[Sample]) -> tuple[bytes, bytes]:
    """(header, cluster bytes) for ``samples``, muxed in pts order per track."""
    buf = io.BytesIO()
    try:
        container = av.open(buf, "w", format="webm",
                            options={"live": "1", "fflags": "+bitexact"})
        assert isinstance(container, OutputContainer)
        with container:
            streams = [_add_track(container, spec) for spec in tracks]
            container.start_encoding()
            header_len = len(buf.getvalue())
            for sample in samples:
                packet = av.Packet(sample.data)
                packet.stream = streams[sample.track]
                packet.time_base = _US
                packet.pts = packet.dts = sample.pts_us
                packet.is_keyframe = sample.keyframe
                container.mux(packet)
    except (av.FFmpegError, ValueError) as e:
        raise MuxError(str(e)) from e
    out = buf.getvalue()
    cut = out.find(CLUSTER_ID, header_len)
    if cut < 0:
        raise MuxError("the muxer wrote no cluster")
    return out[:cut], out[cut:]
