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
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from sfu_sidecar import logs
from sfu_sidecar.captions.service import CaptionService
from sfu_sidecar.metrics import Metrics
from sfu_sidecar.relay.hooks import (
    ABS_CAPTURE_TIME,
    DataChannel,
    PacketInfo,
    PublisherHandle,
    PublisherView,
    RelayObserver,
    RelayView,
    SenderReport,
    ViewerHandle,
)
from sfu_sidecar.sync.abscapture import build_abs_capture_time
from sfu_sidecar.sync.feed import ViewerSync
from sfu_sidecar.sync.mapping import CaptureTime
from sfu_sidecar.sync.wire import (
    ClockReport,
    ClockReq,
    ClockResp,
    ControlMessage,
    Cue,
    CueRetract,
    Epoch,
    PublisherState,
    SyncWireError,
    Telemetry,
    parse_message,
)
from sfu_sidecar.syncchannel.entries import PublisherEntry, ViewerEntry
from sfu_sidecar.tasks import Tasks

log = logs.get("sync")

CHANNEL_LABEL = "sync"
# The batcher emits at most one message per 200 ms; polling at 50 ms keeps that cadence within
# a quarter interval without a timer per viewer. Caption changes are sent at once
# (_flush_captions), not at the next poll.
POLL_INTERVAL_S = 0.05
# Cues sent to a viewer when it connects: those still on screen or coming (stream seconds).
CATCH_UP_BEHIND_S = 10.0
CATCH_UP_AHEAD_S = 120.0
# How long the epoch waits for a publisher's clock join before an estimated capture time
# fixes it: a join lands within a fraction of a second of the channel opening.
EPOCH_SETTLE_NS = 2_000_000_000
# The publisher state is repeated this often: the channel is unreliable, and state is repeated
# rather than retransmitted (proto/sync.md).
STATE_REPEAT_NS = 1_000_000_000


class SyncService(RelayObserver):
    """Component: sync metadata for every viewer of every stream."""

    name = "sync"

    def __init__(
        self,
        relay: RelayView,
        metrics: Metrics,
        *,
        now_ns: Callable[[], int],
        captions: CaptionService | None = None,
    ) -> None:
        self.relay = relay
        self.captions = captions
        self.now_ns = now_ns
        self.publishers: dict[str, PublisherEntry] = {}
        self.viewers: dict[str, ViewerEntry] = {}
        # Channels that opened before their viewer's transport counted as connected.
        self._pending_channels: dict[str, DataChannel] = {}
        self._tasks = Tasks("sync", log)
        self._flush: asyncio.Handle | None = None  # a caption change's send, when one is due
        # Cues an upstream sidecar pushed, waiting to be stored here (_mirror).
        self._mirrored: asyncio.Queue[Cue | CueRetract] = asyncio.Queue(maxsize=10_000)
        self._messages = metrics.counter("sync_messages", "Messages sent on sync channels")
        self._bytes = metrics.counter("sync_bytes", "Bytes sent on sync channels")
        self._bad = metrics.counter(
            "sync_bad_messages", "Undecodable messages received on sync channels", ("kind",)
        )
        self._dropped = metrics.counter(
            "sync_records_dropped",
            "Records dropped for slow or stalled viewers, by reason: frames pushed out of a "
            "full backlog, frames too old when the channel could take them, control records "
            "pushed out of a full backlog", ("reason",),
        )
        self._joins = metrics.counter("sync_clock_joins", "clock_req answered on sync channels")
        self._sr_refused = metrics.counter(
            "sync_sender_reports_refused",
            "Publisher sender reports refused as inconsistent with each other or the media",
        )

    # --- component ------------------------------------------------------------------------

    async def start(self) -> None:
        self.relay.add_observer(self)
        self._tasks.start("poll", self._poll_loop())
        if self.captions is not None:
            self._tasks.start("captions", self._caption_loop())
            self._tasks.start("mirror", self._mirror_loop())

    async def stop(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        await self._tasks.stop()

    # --- relay hooks ------------------------------------------------------------------------

    def _publisher(self, stream: str) -> PublisherEntry:
        pub = self.publishers.get(stream)
        if pub is None:
            pub = self.publishers[stream] = PublisherEntry()
        return pub

    def _publisher_session(self, stream: str, publisher_id: str) -> PublisherEntry:
        """The stream's state, reset when a new publisher session shows up (whichever of its
        transport, channel or first packet is seen first)."""
        pub = self._publisher(stream)
        if pub.publisher_id != publisher_id:
            if pub.publisher_id is not None:
                pub.sync.reconnect()  # new SSRCs, timestamp bases and clock
                pub.channel = pub.clock_report = None
            pub.publisher_id = publisher_id
            slot = self.relay.stream(stream)
            publisher = slot.publisher if slot is not None else None
            pub.sync.set_relayed(publisher is not None and publisher.id == publisher_id
                                 and publisher.relayed)
            if (publisher is not None and publisher.id == publisher_id
                    and publisher.sender_clock_is_house):
                # Declared on the house clock: no offset between the two, known exactly.
                pub.sync.join(0)
        return pub

    def publisher_connected(self, publisher: PublisherHandle) -> None:
        self._publisher_session(publisher.stream_name, publisher.id)
        self._announce(publisher.stream_name)

    def publisher_closed(self, publisher: PublisherHandle) -> None:
        self._announce(publisher.stream_name)

    def publisher_state(self, publisher: PublisherHandle) -> None:
        self._announce(publisher.stream_name)

    def _live_publisher(self, stream_name: str) -> PublisherView | None:
        stream = self.relay.stream(stream_name)
        publisher = stream.publisher if stream is not None else None
        if publisher is None or not publisher.live:
            return None
        return publisher

    def _publisher_live(self, stream_name: str) -> bool:
        publisher = self._live_publisher(stream_name)
        return publisher is not None and publisher.upstream_live

    def _relayed(self, stream_name: str, pub: PublisherEntry) -> bool:
        """Whether ``stream_name``'s publisher is a pull from another sidecar whose clock it
        joined: its epoch and captions are the upstream's."""
        publisher = self._live_publisher(stream_name)
        return (publisher is not None and publisher.relayed
                and publisher.id == pub.publisher_id)

    def _send_state(self, entry: ViewerEntry, now_ns: int) -> None:
        stream = entry.session.stream_name
        entry.sync.batcher.add_control(PublisherState(stream, self._publisher_live(stream)))
        entry.state_sent_ns = now_ns

    def _announce(self, stream: str) -> None:
        """Tell every viewer of ``stream`` whether it has a live publisher now."""
        now = self.now_ns()
        for entry in self.viewers.values():
            if entry.session.stream_name == stream:
                self._send_state(entry, now)

    def publisher_packet(
        self, stream: str, publisher_id: str, packet: PacketInfo
    ) -> Mapping[str, bytes] | None:
        pub = self._publisher_session(stream, publisher_id)
        capture = pub.sync.on_packet(
            packet.kind, packet.ssrc, packet.timestamp, packet.arrival_ns, packet.clock_rate,
            packet.extensions,
        )
        pub.last[packet.kind] = (packet.ssrc, packet.sequence_number, capture)
        if packet.kind == "video" and self.captions is not None:
            self._maybe_fix_epoch(stream, pub, packet, capture)
        # Every copy carries abs-capture-time in house time, whatever the publisher sent, so
        # a browser's getSynchronizationSources() shows capture times on the house clock; but
        # only a capture time known exactly: the extension cannot say "estimated", and a
        # receiver (a browser, attach(), an edge relay) takes what it carries as the truth. An
        # estimate goes out in the sync records, flagged; the copies then carry none at all
        # (not even the publisher's own stamp, which is on the publisher's clock).
        if capture.estimated:
            return {ABS_CAPTURE_TIME: b""}
        return {ABS_CAPTURE_TIME: build_abs_capture_time(capture.capture_ns)}

    def capture_time(self, stream: str, packet: PacketInfo) -> CaptureTime | None:
        """The capture time this component mapped for ``packet`` (call from a later observer's
        ``publisher_packet`` for the same packet), or None when it has not seen that packet."""
        pub = self.publishers.get(stream)
        last = pub.last.get(packet.kind) if pub is not None else None
        if last is None or last[0] != packet.ssrc or last[1] != packet.sequence_number:
            return None
        return last[2]

    def _maybe_fix_epoch(
        self, stream: str, pub: PublisherEntry, packet: PacketInfo, capture: CaptureTime
    ) -> None:
        """The stream epoch is the capture time of its first frame (captions/service.py).

        It is fixed for the stream's life, so it waits until that capture time is known
        exactly (the publisher joined the house clock) or EPOCH_SETTLE_NS has passed, and is
        then read off the current map at the first frame's RTP time.
        """
        assert self.captions is not None
        if pub.epoch_fixed or self.captions.epoch(stream) is not None:
            pub.epoch_fixed = True
            return
        if self._relayed(stream, pub):
            return  # the upstream's epoch comes over its sync channel (_mirror)
        if pub.first_frame is None:
            pub.first_frame = (packet.timestamp, packet.arrival_ns)
        first_ts, first_arrival = pub.first_frame
        if capture.estimated and packet.arrival_ns - first_arrival < EPOCH_SETTLE_NS:
            return
        mapping = pub.sync.mappings["video"]
        epoch = mapping.capture_of(first_ts)
        if epoch is not None:
            self.captions.fix_epoch(stream, epoch)
            pub.epoch_fixed = True

    def publisher_sender_report(self, stream: str, kind: str, report: SenderReport) -> None:
        arrival = report.arrival_ns if report.arrival_ns is not None else self.now_ns()
        sync = self._publisher(stream).sync
        mapping = sync.mappings.get(kind)
        refused = mapping.sr_rejected if mapping is not None else 0
        sync.on_sender_report(kind, report.ntp_timestamp, report.rtp_timestamp, arrival)
        if mapping is not None and mapping.sr_rejected > refused:
            self._sr_refused.inc(mapping.sr_rejected - refused)
            log.warning("stream %s %s: sender reports not used, capture time from arrival: %s",
                        stream, kind, mapping.sr_distrust)

    def publisher_data_channel(self, publisher: PublisherHandle, channel: DataChannel) -> None:
        if channel.label != CHANNEL_LABEL:
            return
        pub = self._publisher_session(publisher.stream_name, publisher.id)
        pub.channel = channel
        channel.on_message(lambda data: self._on_publisher_message(pub, channel, data))

    def viewer_data_channel(self, viewer: ViewerHandle, channel: DataChannel) -> None:
        if channel.label != CHANNEL_LABEL:
            return
        viewer_id = viewer.id
        self._pending_channels[viewer_id] = channel
        channel.on_message(lambda data: self._on_viewer_message(viewer_id, channel, data))

    def viewer_connected(self, viewer: ViewerHandle) -> None:
        entry = ViewerEntry(viewer, ViewerSync(), started_ns=self.now_ns())
        stream = viewer.stream_name
        for kind, output in viewer.outputs.items():
            entry.sync.add_track(kind, output.mid or "")
            output.observers.append(self._forwarded_observer(entry, stream, kind))
            output.sender_report_rewriter = self._sr_rewriter(entry, kind)
        self.viewers[viewer.id] = entry
        self._send_state(entry, entry.started_ns)
        self._catch_up(entry, stream)

    def viewer_closed(self, viewer: ViewerHandle) -> None:
        self._pending_channels.pop(viewer.id, None)
        entry = self.viewers.pop(viewer.id, None)
        if entry is not None:
            self._count_drops(entry)

    def _count_drops(self, entry: ViewerEntry) -> None:
        """Bring sync_records_dropped up to the viewer's batcher counts, so a stalled viewer's
        drops show while it is still connected."""
        stats = entry.sync.batcher.stats
        for reason, total in (("backlog_full", stats.frames_dropped),
                              ("expired", stats.frames_expired),
                              ("control_backlog_full", stats.control_dropped)):
            new = total - entry.drops_counted.get(reason, 0)
            if new > 0:
                self._dropped.labels(reason).inc(new)
                entry.drops_counted[reason] = total

    def _forwarded_observer(
        self, entry: ViewerEntry, stream: str, kind: str
    ) -> Callable[[PacketInfo, int], None]:
        def observe(packet: PacketInfo, viewer_ts: int) -> None:
            # Runs per packet per viewer: return early for everything but a frame's first
            # packet (anchors change only with a frame, and a record is one per frame).
            pub = self.publishers.get(stream)
            if pub is None:
                return
            last = pub.last.get(kind)
            if last is None or not last[2].first_packet:
                return
            if last[0] != packet.ssrc or last[1] != packet.sequence_number:
                return  # not the packet just mapped (a retransmission): nothing new to say
            mapping = pub.sync.mappings.get(kind)
            if mapping is None:
                return
            entry.sync.on_forwarded(
                kind, mapping, last[2], viewer_ts, packet.arrival_ns, keyframe=packet.keyframe
            )

        return observe

    def _sr_rewriter(
        self, entry: ViewerEntry, kind: str
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

    def _catch_up(self, entry: ViewerEntry, stream: str) -> None:
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
                entry.sync.batcher.add_control(cue.cue_event())

    async def _caption_loop(self) -> None:
        assert self.captions is not None
        subscription = self.captions.events.subscribe()
        try:
            async for event in subscription:  # caption events are sync control messages
                for entry in self.viewers.values():
                    if entry.session.stream_name == event.stream:
                        entry.sync.batcher.add_control(event)
                if self._flush is None:
                    # After the events already queued (a barge-in makes several at once).
                    self._flush = asyncio.get_running_loop().call_soon(self._flush_captions)
        finally:
            subscription.close()

    def _flush_captions(self, retry: bool = True) -> None:
        """A caption change goes out now rather than at the next poll: a viewer whose last
        message went out less than the batcher's control interval ago gets it once that has
        passed (one timer for all of them)."""
        self._flush = None
        self.poll_once()
        due = [when for entry in self.viewers.values()
               if entry.sync.batcher.queued_control and (when := entry.sync.batcher.next_poll_ns())]
        if retry and due:
            delay_s = max(0, min(due) - self.now_ns()) / 1e9
            self._flush = asyncio.get_running_loop().call_later(
                delay_s, self._flush_captions, False)

    # --- channel I/O ----------------------------------------------------------------------

    def _attach(self, entry: ViewerEntry) -> DataChannel | None:
        if entry.channel is None:
            entry.channel = self._pending_channels.pop(entry.session.id, None)
        if entry.channel is None or entry.channel.ready_state != "open":
            return None
        return entry.channel

    def _receive(self, channel: DataChannel, data: Any, who: str) -> ControlMessage | None:
        """Decode one message from a peer and answer a clock join at once; the control
        message is returned for the caller to act on, None when it was bad or handled."""
        t2 = self.now_ns()
        if isinstance(data, str):
            data = data.encode()
        try:
            message = parse_message(data)
        except SyncWireError as exc:
            self._bad.labels(exc.kind).inc()
            log.info("bad sync message from %s: %s", who, exc.reason)
            return None
        if not isinstance(message, ControlMessage):
            return None  # peers send control messages only; batches from them are ignored
        if isinstance(message.message, ClockReq):
            reply = ControlMessage(ClockResp(t1=message.message.t1, t2=t2, t3=self.now_ns()))
            if channel.ready_state == "open":
                channel.send(reply.serialize())
                self._joins.inc()
            return None
        return message

    def _on_viewer_message(self, viewer_id: str, channel: DataChannel, data: Any) -> None:
        message = self._receive(channel, data, f"viewer {viewer_id[:8]}")
        entry = self.viewers.get(viewer_id)
        if message is None or entry is None:
            return
        control = message.message
        if isinstance(control, ClockReport):
            entry.clock_report = control
        elif isinstance(control, Telemetry):
            entry.telemetry = control

    def _on_publisher_message(self, pub: PublisherEntry, channel: DataChannel, data: Any) -> None:
        message = self._receive(channel, data, f"publisher {(pub.publisher_id or '?')[:8]}")
        if message is None:
            return
        control = message.message
        if isinstance(control, ClockReport):
            # The publisher measured house - its clock: its capture stamps map exactly.
            pub.clock_report = control
            pub.sync.join(control.offset_ns)
            log.info("publisher %s joined the house clock: offset %d ns, error %d ns",
                     (pub.publisher_id or "?")[:8], control.offset_ns, control.error_ns)
        elif isinstance(control, Epoch | Cue | CueRetract):
            self._mirror(pub, control)

    def _mirror(self, pub: PublisherEntry, control: Epoch | Cue | CueRetract) -> None:
        """The stream's epoch and captions as an upstream sidecar has them, taken over by
        this node; from any other publisher they are ignored (a publisher cannot write
        captions without the ingest token)."""
        stream = control.stream
        if (self.captions is None or pub.clock_report is None
                or not self._relayed(stream, pub)):
            return
        if isinstance(control, Epoch):
            # Upstream house time -> ours: house = publisher + offset.
            self.captions.follow_epoch(stream, control.epoch_ns + pub.clock_report.offset_ns)
            pub.epoch_fixed = True
        else:
            try:
                self._mirrored.put_nowait(control)
            except asyncio.QueueFull:
                log.warning("cue %s of %s from upstream dropped: store too slow", control.id,
                            stream)

    async def _mirror_loop(self) -> None:
        """Stores mirrored cues one at a time, in the order the upstream sent them."""
        assert self.captions is not None
        while True:
            event = await self._mirrored.get()
            try:
                await self.captions.mirror(event)
            except Exception as exc:  # storage refusing: the upstream still has the cue
                log.warning("cue %s of %s from upstream not stored: %s", event.id,
                            event.stream, exc)

    def poll_once(self) -> None:
        now = self.now_ns()
        for entry in list(self.viewers.values()):
            channel = self._attach(entry)
            if channel is None:
                continue
            if now - entry.state_sent_ns >= STATE_REPEAT_NS:
                self._send_state(entry, now)
            try:
                raw = entry.sync.poll(now, channel.buffered_amount)
                if raw is not None:
                    channel.send(raw)
                    self._messages.inc()
                    self._bytes.inc(len(raw))
                self._count_drops(entry)
            except Exception:
                # One viewer's broken channel must not stop the others' records.
                log.exception("sync channel of viewer %s failed", entry.session.id[:8])

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(POLL_INTERVAL_S)
            self.poll_once()
