"""Live segments as a component: relay packets in, WebM or fragmented MP4 over HTTP out.

A stream is segmented only while someone reads its segments: the first request starts it, and
:meth:`SegmentService.sweep` stops it after ``segment_idle_s`` without one. Packets come
through the relay's publisher-level hook (``publisher_packet``), after the sync component has
mapped each one to its capture time on the house clock; the stream epoch comes from the caption
component. Streams nobody reads cost one dictionary lookup per packet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sfu_sidecar import logs
from sfu_sidecar.captions.service import CaptionService
from sfu_sidecar.config import Settings
from sfu_sidecar.relay.hooks import PacketInfo, RelayObserver, RelayView
from sfu_sidecar.segments.depacketize import (
    H264Depacketizer,
    OpusDepacketizer,
    Vp8Depacketizer,
)
from sfu_sidecar.segments.segmenter import StreamSegmenter
from sfu_sidecar.segments.vp9 import Vp9Depacketizer
from sfu_sidecar.syncchannel.service import SyncService
from sfu_sidecar.tasks import Tasks

__all__ = ["SegmentService"]

log = logs.get("segments")

SWEEP_S = 1.0
# How long an HLS playlist request made before the stream's first segment closes waits for it:
# the first request starts the segmenting, whose first segment closes about a segment after the
# keyframe it asks for; under hls.js's 10 s limit on a playlist's first byte.
FIRST_SEGMENT_WAIT_S = 8.0
Depacketizer = Vp8Depacketizer | Vp9Depacketizer | H264Depacketizer | OpusDepacketizer
VIDEO_DEPACKETIZERS: dict[str, type[Vp8Depacketizer | Vp9Depacketizer | H264Depacketizer]] = {
    "vp8": Vp8Depacketizer, "vp9": Vp9Depacketizer, "h264": H264Depacketizer,
}


@dataclass
class _Live:
    segmenter: StreamSegmenter
    last_read_ns: int
    depacketizers: dict[str, Depacketizer] = field(default_factory=dict)
    ssrcs: dict[str, int] = field(default_factory=dict)
    unsupported: set[str] = field(default_factory=set)
    # Set and replaced on every change of the open segment: readers streaming it wait on
    # the one they hold (a fresh event per change, so no reader misses one).
    change: asyncio.Event = field(default_factory=asyncio.Event)
    version: int = 0  # changes so far, so a reader knows whether one came while it wrote

    def changed(self) -> None:
        self.version += 1
        self.change.set()
        self.change = asyncio.Event()


class SegmentService(RelayObserver):
    """Component: per-stream live segments on the stream timeline."""

    name = "segments"

    def __init__(
        self,
        settings: Settings,
        relay: RelayView,
        sync: SyncService,
        captions: CaptionService,
        *,
        now_ns: Callable[[], int],
    ) -> None:
        self.settings = settings
        self.relay = relay
        self.sync = sync
        self.captions = captions
        self.now_ns = now_ns
        self.live: dict[str, _Live] = {}
        self.sweep_s: float | None = SWEEP_S
        self.first_segment_wait_s = FIRST_SEGMENT_WAIT_S
        self._tasks = Tasks("segments", log)

    async def start(self) -> None:
        self.relay.add_observer(self)
        # On an edge a pull lasts while its segments are read, as while it has viewers.
        self.relay.add_interest(lambda stream: stream in self.live)
        if self.sweep_s is not None:
            self._tasks.start("sweep", self._sweep_loop(self.sweep_s))

    async def stop(self) -> None:
        await self._tasks.stop()
        for live in self.live.values():
            live.changed()  # readers of open segments end now
        self.live.clear()

    async def _sweep_loop(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.sweep()

    def sweep(self) -> None:
        """Stop segmenting streams nobody asked about for ``segment_idle_s``."""
        cutoff = self.now_ns() - int(self.settings.segment_idle_s * 1e9)
        for name, live in list(self.live.items()):
            if live.last_read_ns < cutoff:
                log.info("stream %s: live segments stopped (no reader)", name)
                del self.live[name]
                live.changed()

    def version(self, stream: str) -> int:
        """How many times the stream's open segment changed (a part made, closed, dropped)."""
        live = self.live.get(stream)
        return -1 if live is None else live.version

    async def changed_since(self, stream: str, segmenter: StreamSegmenter, version: int,
                            timeout_s: float) -> bool:
        """Wait until ``segmenter`` (the stream's) has changed since ``version``; False when
        it was stopped or nothing changed within ``timeout_s``. A wait counts as a read, so
        a stream whose open segment is being streamed keeps being segmented."""
        live = self.live.get(stream)
        if live is None or live.segmenter is not segmenter:
            return False
        live.last_read_ns = self.now_ns()
        if live.version == version:
            try:
                await asyncio.wait_for(live.change.wait(), timeout_s)
            except TimeoutError:
                return False
        return self.live.get(stream) is live

    def reader(self, stream: str) -> StreamSegmenter | None:
        """The stream's segmenter for a request, started on the first one; None when the relay
        has no such stream and none is being segmented."""
        now = self.now_ns()
        live = self.live.get(stream)
        if live is None:
            relay_stream = self.relay.stream(stream)
            if relay_stream is None:
                return None
            segmenter = StreamSegmenter(
                stream,
                target_us=round(self.settings.segment_duration_s * 1e6),
                window=self.settings.segment_window,
                request_keyframe=lambda: self.relay.request_keyframe(stream, "video"),
                log=log,
                part_us=round(self.settings.segment_part_s * 1e6),
            )
            # The container follows the video codec; known before the first packet when the
            # publisher has negotiated, so the index names it from the first request.
            if relay_stream.codec("video") == "h264":
                segmenter.video_codec = "h264"
            # Its audio too, so the first init segment has the track even when the first
            # keyframe comes before the first audio packet.
            if relay_stream.codec("audio") == "opus":
                segmenter.add_audio_track("opus", 48000, 2)
            live = self.live[stream] = _Live(segmenter, now)
            segmenter.on_change = live.changed
            log.info("stream %s: live segments started", stream)
            # A segment can only start on a keyframe: ask now rather than wait for the next.
            self.relay.request_keyframe(stream, "video")
        live.last_read_ns = now
        return live.segmenter

    # --- relay hook -------------------------------------------------------------------------

    def publisher_packet(
        self, stream: str, publisher_id: str, packet: PacketInfo
    ) -> Mapping[str, bytes] | None:
        live = self.live.get(stream)
        if live is None:
            return None
        kind = packet.kind
        if live.ssrcs.get(kind) != packet.ssrc:
            # A new publisher session (or the first packet): new sequence and timestamp bases.
            live.ssrcs[kind] = packet.ssrc
            live.depacketizers.pop(kind, None)
        dep = live.depacketizers.get(kind)
        if dep is None:
            dep = self._depacketizer(stream, live, kind)
            if dep is None:
                return None
            live.depacketizers[kind] = dep
        frame = dep.push(packet.sequence_number, packet.timestamp, packet.marker, packet.payload)
        if frame is None:
            return None
        # The frame's capture time is its last packet's (all carry one RTP timestamp).
        epoch = self.captions.epoch(stream)
        capture = self.sync.capture_time(stream, packet)
        if epoch is None or capture is None:
            live.segmenter.dropped += 1  # not on the stream timeline yet
            return None
        live.segmenter.push(kind, frame, (capture.capture_ns - epoch) // 1000)
        return None

    def _depacketizer(
        self, stream: str, live: _Live, kind: str
    ) -> Depacketizer | None:
        relay_stream = self.relay.stream(stream)
        name = (relay_stream.codec(kind) if relay_stream is not None else None) or ""
        segmenter = live.segmenter
        # The container follows the video codec, fixed by the first keyframe; a later publisher
        # with another codec cannot continue these segments.
        if kind == "video" and name in VIDEO_DEPACKETIZERS and (
            segmenter.video is None or segmenter.video_codec == name
        ):
            segmenter.video_codec = name
            return VIDEO_DEPACKETIZERS[name]()
        if kind == "audio" and name == "opus":
            segmenter.add_audio_track("opus", 48000, 2)
            return OpusDepacketizer()
        if kind not in live.unsupported:
            live.unsupported.add(kind)
            log.warning("stream %s: %s codec %s not segmented", stream, kind, name or "unknown")
        return None
