"""The asyncio adapter of sync metadata: relay hooks in, ``sync`` DataChannel messages out.

Per published stream one :class:`~sfu_sidecar.sync.feed.PublisherSync` maps every publisher
packet to its capture time (once per packet, from the relay's publisher-level hook); per viewer one
:class:`~sfu_sidecar.sync.feed.ViewerSync` turns the packets that viewer is sent into anchor and
frame records keyed by the RTP timestamps it receives, rebuilds the NTP field of the sender reports
it gets from capture time, and batches everything onto the viewer's ``sync`` channel (proto/sync.md
"Channel"). Caption events and the stream epoch ride the same channel as control records, and a
viewer may join the house clock over it (``clock_req`` -> ``clock_resp``).

The pure cores never see a clock: ``now_ns`` (house time) is read here and passed in.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from sfu_sidecar import logs
from sfu_sidecar.httpapi import json_ok
from sfu_sidecar.metrics import Metrics
from sfu_sidecar.relay.hooks import PacketInfo, RelayObserver, SenderReport
from sfu_sidecar.sync.feed import PublisherSync, ViewerSync
from sfu_sidecar.sync.mapping import CaptureTime
from sfu_sidecar.sync.wire import (
    ClockReport,
    ClockReq,
    ClockResp,
    ControlMessage,
    Cue,
    CueRetract,
    Epoch,
    SyncWireError,
    Telemetry,
    control_from_map,
    parse_message,
)

if TYPE_CHECKING:
    from aiortc.rtcdatachannel import RTCDataChannel

    from sfu_sidecar.captions.service import CaptionService
    from sfu_sidecar.relay.service import RelayService
    from sfu_sidecar.relay.session import ViewerSession

log = logs.get("sync")

CHANNEL_LABEL = "sync"
# The batcher emits at most one message per 200 ms; polling at 50 ms keeps that cadence within
# a quarter interval without a timer per viewer.
POLL_INTERVAL_S = 0.05
# Cues sent to a viewer when it connects: those still on screen or coming (stream seconds).
CATCH_UP_BEHIND_S = 10.0
CATCH_UP_AHEAD_S = 120.0


@dataclass
class _Viewer:
    session: ViewerSession
    sync: ViewerSync
    channel: RTCDataChannel | None = None
    telemetry: Telemetry | None = None
    clock_report: ClockReport | None = None
    bad_messages: int = 0
    started_ns: int = 0


@dataclass
class _Publisher:
    sync: PublisherSync = field(default_factory=PublisherSync)
    # The publisher packet whose capture time is current: every viewer's observer for that
    # packet runs before the next packet arrives, so one entry per kind is the whole cache.
    last: dict[str, tuple[int, int, CaptureTime]] = field(default_factory=dict)
    publisher_id: str | None = None


class SyncService(RelayObserver):
    """Component: sync metadata for every viewer of every stream."""

    name = "sync"

    def __init__(
        self,
        relay: RelayService,
        metrics: Metrics,
        *,
        now_ns: Callable[[], int],
        captions: CaptionService | None = None,
    ) -> None:
        self.relay = relay
        self.captions = captions
        self.now_ns = now_ns
        self.publishers: dict[str, _Publisher] = {}
        self.viewers: dict[str, _Viewer] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._messages = metrics.counter("sync_messages", "Messages sent on sync channels")
        self._bytes = metrics.counter("sync_bytes", "Bytes sent on sync channels")
        self._bad = metrics.counter(
            "sync_bad_messages", "Undecodable messages received on sync channels", ("kind",)
        )
        self._dropped = metrics.counter(
            "sync_records_dropped", "Frame records dropped for slow or stalled viewers"
        )
        self._joins = metrics.counter("sync_clock_joins", "clock_req answered on sync channels")

    # --- component ------------------------------------------------------------------------

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/api/sync", self._status_route)

    async def start(self) -> None:
        self.relay.add_observer(self)
        self._tasks.append(asyncio.create_task(self._poll_loop(), name="sync-poll"))
        if self.captions is not None:
            self._tasks.append(asyncio.create_task(self._caption_loop(), name="sync-captions"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    # --- relay hooks ------------------------------------------------------------------------

    def _publisher(self, stream: str) -> _Publisher:
        pub = self.publishers.get(stream)
        if pub is None:
            pub = self.publishers[stream] = _Publisher()
        return pub

    def publisher_packet(self, stream: str, publisher_id: str, packet: PacketInfo) -> None:
        pub = self._publisher(stream)
        if pub.publisher_id != publisher_id:
            if pub.publisher_id is not None:
                pub.sync.reconnect()  # a new session: new SSRCs, timestamp bases and clock
            pub.publisher_id = publisher_id
        capture = pub.sync.on_packet(
            packet.kind, packet.ssrc, packet.timestamp, packet.arrival_ns, packet.clock_rate,
            packet.extensions,
        )
        pub.last[packet.kind] = (packet.ssrc, packet.sequence_number, capture)
        # The stream epoch is the capture time of its first frame (captions/service.py).
        if (
            self.captions is not None and capture.first_packet and packet.kind == "video"
            and self.captions.epoch(stream) is None
        ):
            self.captions.fix_epoch(stream, capture.capture_ns)

    def publisher_sender_report(self, stream: str, kind: str, report: SenderReport) -> None:
        arrival = report.arrival_ns if report.arrival_ns is not None else self.now_ns()
        self._publisher(stream).sync.on_sender_report(
            kind, report.ntp_timestamp, report.rtp_timestamp, arrival
        )

    def viewer_connected(self, viewer: ViewerSession) -> None:
        entry = _Viewer(viewer, ViewerSync(), started_ns=self.now_ns())
        stream = viewer.stream.name
        for kind, output in viewer.tracks.items():
            entry.sync.add_track(kind, output.config.mid or "")
            output.observers.append(self._forwarded_observer(entry, stream, kind))
            output.sender_report_rewriter = self._sr_rewriter(entry, kind)
        self.viewers[viewer.id] = entry
        self._catch_up(entry, stream)

    def viewer_closed(self, viewer: ViewerSession) -> None:
        entry = self.viewers.pop(viewer.id, None)
        if entry is not None:
            self._dropped.inc(entry.sync.batcher.stats.frames_dropped)

    def _forwarded_observer(
        self, entry: _Viewer, stream: str, kind: str
    ) -> Callable[[PacketInfo, int], None]:
        def observe(packet: PacketInfo, viewer_ts: int) -> None:
            pub = self.publishers.get(stream)
            if pub is None:
                return
            last = pub.last.get(kind)
            if last is None or last[0] != packet.ssrc or last[1] != packet.sequence_number:
                return  # not the packet just mapped (a retransmission): nothing new to say
            mapping = pub.sync.tracks.get(kind)
            if mapping is None:
                return
            entry.sync.on_forwarded(
                kind, mapping, last[2], viewer_ts, packet.arrival_ns, keyframe=packet.keyframe
            )

        return observe

    def _sr_rewriter(
        self, entry: _Viewer, kind: str
    ) -> Callable[[SenderReport | None], SenderReport | None]:
        def rewrite(report: SenderReport | None) -> SenderReport | None:
            if report is None:
                return None
            ntp = entry.sync.sender_report_ntp(kind, report.rtp_timestamp)
            if ntp is None:
                # No capture map yet: an SR from relay time would teach the browser a wrong
                # A/V alignment that it then has to unlearn, so send none.
                return None
            return dataclasses.replace(report, ntp_timestamp=ntp)

        return rewrite

    # --- captions -----------------------------------------------------------------------------

    def _catch_up(self, entry: _Viewer, stream: str) -> None:
        """Epoch and the cues around now, so a late joiner has what is on screen."""
        if self.captions is None:
            return
        epoch = self.captions.epoch(stream)
        if epoch is None:
            return
        entry.sync.batcher.add_control(Epoch(stream=stream, epoch_ns=epoch))
        now_ms = self.captions.stream_now_ms(stream)
        start_ms = now_ms - int(CATCH_UP_BEHIND_S * 1000)
        end_ms = now_ms + int(CATCH_UP_AHEAD_S * 1000)
        for lang in self.captions.languages(stream):
            for cue in self.captions.cues_between(stream, lang, start_ms, end_ms):
                entry.sync.batcher.add_control(
                    Cue(stream=stream, lang=lang, id=cue.id, start=cue.start, end=cue.end,
                        text=cue.text, final=cue.final)
                )

    async def _caption_loop(self) -> None:
        assert self.captions is not None
        subscription = self.captions.events.subscribe()
        try:
            async for event in subscription:
                control = control_from_map(event.message())
                assert isinstance(control, Epoch | Cue | CueRetract)
                for entry in self.viewers.values():
                    if entry.session.stream.name == control.stream:
                        entry.sync.batcher.add_control(control)
        finally:
            subscription.close()

    # --- channel I/O ----------------------------------------------------------------------

    def _attach(self, entry: _Viewer) -> RTCDataChannel | None:
        if entry.channel is None:
            channel = entry.session.data_channels.get(CHANNEL_LABEL)
            if channel is None:
                return None
            entry.channel = channel
            channel.on("message", lambda data: self._on_message(entry, data))
        return entry.channel if entry.channel.readyState == "open" else None

    def _on_message(self, entry: _Viewer, data: Any) -> None:
        t2 = self.now_ns()
        if isinstance(data, str):
            data = data.encode()
        try:
            message = parse_message(data)
        except SyncWireError as exc:
            entry.bad_messages += 1
            self._bad.labels(exc.kind).inc()
            log.info("bad sync message from viewer %s: %s", entry.session.id[:8], exc.reason)
            return
        if not isinstance(message, ControlMessage):
            return  # viewers send control messages only; batches from them are ignored
        control = message.message
        if isinstance(control, ClockReq):
            reply = ControlMessage(ClockResp(t1=control.t1, t2=t2, t3=self.now_ns()))
            if entry.channel is not None and entry.channel.readyState == "open":
                entry.channel.send(reply.serialize())
                self._joins.inc()
        elif isinstance(control, ClockReport):
            entry.clock_report = control
        elif isinstance(control, Telemetry):
            entry.telemetry = control

    def poll_once(self) -> None:
        now = self.now_ns()
        for entry in list(self.viewers.values()):
            channel = self._attach(entry)
            if channel is None:
                continue
            try:
                raw = entry.sync.poll(now, channel.bufferedAmount)
                if raw is not None:
                    channel.send(raw)
                    self._messages.inc()
                    self._bytes.inc(len(raw))
            except Exception:
                # One viewer's broken channel must not stop the others' records.
                log.exception("sync channel of viewer %s failed", entry.session.id[:8])

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(POLL_INTERVAL_S)
            self.poll_once()

    # --- status -------------------------------------------------------------------------------

    def viewer_status(self, entry: _Viewer, now_ns: int) -> dict[str, Any]:
        stats = entry.sync.batcher.stats
        elapsed_s = max((now_ns - entry.started_ns) / 1e9, 1e-9)
        return {
            "id": entry.session.id,
            "stream": entry.session.stream.name,
            "channel": entry.channel.readyState if entry.channel is not None else None,
            "messages": stats.messages,
            "bytes": stats.bytes,
            "records": stats.records,
            "messages_per_s": round(stats.messages / elapsed_s, 3),
            "bytes_per_s": round(stats.bytes / elapsed_s, 1),
            "frames_dropped": stats.frames_dropped,
            "frames_expired": stats.frames_expired,
            "stalls": stats.stalls,
            "bad_messages": entry.bad_messages,
            "clock_report": dataclasses.asdict(entry.clock_report) if entry.clock_report else None,
            "telemetry": dataclasses.asdict(entry.telemetry) if entry.telemetry else None,
        }

    async def _status_route(self, request: web.Request) -> web.Response:
        now = self.now_ns()
        return json_ok({"viewers": [self.viewer_status(v, now) for v in self.viewers.values()]})
