"""The pure glue between the relay's per-packet callbacks and the sync cores.

One :class:`PublisherSync` per published stream (its tracks share one publisher clock, so
audio and video land on one timeline); one :class:`ViewerSync` per viewer session (its
batcher, and what it has learnt of the relay's timestamp rewrite for each track). Nothing
here touches a socket or reads a clock; the adapter passes arrival and ``now`` times in and
sends what :meth:`ViewerSync.poll` returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sfu_sidecar.ntptime import unix_ns_to_ntp
from sfu_sidecar.sync.abscapture import ABS_CAPTURE_TIME_URI, AbsCaptureTime, AbsCaptureTimeError
from sfu_sidecar.sync.batcher import SyncBatcher
from sfu_sidecar.sync.mapping import MASK32, CaptureTime, TrackMapping
from sfu_sidecar.sync.publisherclock import PublisherClock


class PublisherSync:
    """Capture-time mappings of one publisher's tracks, keyed by kind ("audio"/"video")."""

    def __init__(self) -> None:
        self.clock = PublisherClock()
        self.mappings: dict[str, TrackMapping] = {}
        self.bad_extensions = 0  # abs-capture-time payloads of a length the spec lacks
        self.relayed = False  # see TrackMapping.relayed

    def track(self, kind: str, clock_rate: int) -> TrackMapping:
        m = self.mappings.get(kind)
        if m is None or m.clock_rate != clock_rate:
            m = self.mappings[kind] = TrackMapping(clock_rate, self.clock, audio=kind == "audio")
            m.relayed = self.relayed
        return m

    def set_relayed(self, relayed: bool) -> None:
        """Whether the publisher is a pull from another sidecar (TrackMapping.relayed)."""
        self.relayed = relayed
        for m in self.mappings.values():
            m.relayed = relayed

    def join(self, house_minus_publisher_ns: int) -> None:
        """The publisher's ``clock_report`` ``offset_ns`` (proto/clock.md)."""
        self.clock.join(house_minus_publisher_ns)

    def reconnect(self) -> None:
        """A new publisher session on the same stream: its clock is a stranger again."""
        self.clock.reset()
        for m in self.mappings.values():
            m.reset()

    def on_packet(
        self, kind: str, ssrc: int, timestamp: int, arrival_ns: int, clock_rate: int,
        extensions: Mapping[str, bytes] | None = None,
    ) -> CaptureTime:
        abs_capture = None
        raw = (extensions or {}).get(ABS_CAPTURE_TIME_URI)
        if raw is not None:
            try:
                abs_capture = AbsCaptureTime.parse(raw)
            except AbsCaptureTimeError:
                self.bad_extensions += 1
        return self.track(kind, clock_rate).on_rtp(ssrc, timestamp, arrival_ns, abs_capture)

    def on_sender_report(
        self, kind: str, ntp: int, rtp_ts: int, arrival_ns: int, ssrc: int | None = None,
    ) -> bool:
        m = self.mappings.get(kind)
        return False if m is None else m.on_sender_report(ssrc, ntp, rtp_ts, arrival_ns)


@dataclass
class _ViewerTrack:
    index: int
    mid: str
    ts_offset: int | None = None
    map_version: int = -1
    mapping: TrackMapping | None = None


class ViewerSync:
    """One viewer's sync state: its batcher and the relay's rewrite of each track."""

    def __init__(self, batcher: SyncBatcher | None = None) -> None:
        self.batcher = batcher or SyncBatcher()
        self._tracks: dict[str, _ViewerTrack] = {}

    def add_track(self, kind: str, mid: str) -> int:
        """Register a track of this viewer; returns its wire track index."""
        t = self._tracks.get(kind)
        if t is None:
            t = self._tracks[kind] = _ViewerTrack(len(self._tracks), mid)
        return t.index

    def on_forwarded(
        self, kind: str, mapping: TrackMapping, capture: CaptureTime, viewer_ts: int,
        now_ns: int, *, keyframe: bool = False,
    ) -> None:
        """A packet was sent to this viewer with RTP timestamp ``viewer_ts``."""
        t = self._tracks.get(kind)
        if t is None:
            self.add_track(kind, "")
            t = self._tracks[kind]
        offset = (viewer_ts - capture.rtp_ts) & MASK32
        current = mapping.current
        if current is None:
            return
        if offset != t.ts_offset or current.version != t.map_version or mapping is not t.mapping:
            self.batcher.set_anchor(current.to_anchor(t.index, offset, mid=t.mid,
                                                      audio=mapping.audio))
            t.ts_offset, t.map_version, t.mapping = offset, current.version, mapping
        if capture.first_packet:
            self.batcher.add_frame(t.index, viewer_ts, capture.capture_ns, capture.source,
                                   now_ns, keyframe=keyframe, audio=mapping.audio)

    def sender_report_ntp(self, kind: str, viewer_rtp_ts: int) -> int | None:
        """NTP field for an SR to this viewer carrying ``viewer_rtp_ts``: the capture time of
        that RTP time. None until a packet of the track has taught us the rewrite."""
        t = self._tracks.get(kind)
        if t is None or t.ts_offset is None or t.mapping is None:
            return None
        current = t.mapping.current
        if current is None:
            return None
        return unix_ns_to_ntp(current.capture_of((viewer_rtp_ts - t.ts_offset) & MASK32))

    def poll(self, now_ns: int, buffered_amount: int = 0) -> bytes | None:
        return self.batcher.poll(now_ns, buffered_amount)
