"""What the sync channel keeps per viewer and per publisher, and what its status says of them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from sfu_sidecar.relay.hooks import DataChannel, ViewerHandle
from sfu_sidecar.sync.feed import PublisherSync, ViewerSync
from sfu_sidecar.sync.mapping import CaptureTime
from sfu_sidecar.sync.wire import ClockReport, Telemetry


@dataclass
class ViewerEntry:
    """One viewer of a stream, with its sync state and channel."""

    session: ViewerHandle
    sync: ViewerSync
    channel: DataChannel | None = None
    telemetry: Telemetry | None = None
    clock_report: ClockReport | None = None
    started_ns: int = 0
    state_sent_ns: int = 0  # when the publisher state last went into the batcher
    # The batcher's drop counts already added to sync_records_dropped, by reason.
    drops_counted: dict[str, int] = field(default_factory=dict)

    def status(self, now_ns: int) -> dict[str, Any]:
        stats = self.sync.batcher.stats
        elapsed_s = max((now_ns - self.started_ns) / 1e9, 1e-9)
        return {
            "id": self.session.id,
            "stream": self.session.stream_name,
            "channel": self.channel.ready_state if self.channel is not None else None,
            "messages": stats.messages,
            "bytes": stats.bytes,
            "records": stats.records,
            "messages_per_s": round(stats.messages / elapsed_s, 3),
            "bytes_per_s": round(stats.bytes / elapsed_s, 1),
            "frames_dropped": stats.frames_dropped,
            "frames_expired": stats.frames_expired,
            "control_dropped": stats.control_dropped,
            "stalls": stats.stalls,
            # What waits for this viewer: in the batcher, and in the channel's own buffer.
            "queued_frames": self.sync.batcher.queued_frames,
            "queued_control": self.sync.batcher.queued_control,
            "buffered_bytes": (
                self.channel.buffered_amount if self.channel is not None else 0
            ),
            "clock_report": dataclasses.asdict(self.clock_report) if self.clock_report else None,
            "telemetry": dataclasses.asdict(self.telemetry) if self.telemetry else None,
        }


@dataclass
class PublisherEntry:
    """One stream's publisher side: its capture-time mapping, channel and epoch state."""

    sync: PublisherSync = field(default_factory=PublisherSync)
    # The publisher packet whose capture time is current: every viewer's observer for that
    # packet runs before the next packet arrives, so one entry per kind is the whole cache.
    last: dict[str, tuple[int, int, CaptureTime]] = field(default_factory=dict)
    publisher_id: str | None = None
    channel: DataChannel | None = None
    clock_report: ClockReport | None = None
    first_frame: tuple[int, int] | None = None  # (RTP timestamp, arrival ns) of frame one
    epoch_fixed: bool = False

    def status(self, stream: str) -> dict[str, Any]:
        """Per track: where capture times come from and what became of the sender reports."""
        tracks: dict[str, Any] = {}
        for kind, m in self.sync.mappings.items():
            cur = m.current
            tracks[kind] = {
                "source": cur.source.name.lower() if cur is not None else None,
                "estimated": cur.estimated if cur is not None else None,
                "drift_ppb": cur.drift_ppb if cur is not None else None,
                "sender_reports_refused": m.sr_rejected,
                "sender_reports_distrusted": m.sr_distrust,
                "frames_slewed": m.slewed,
            }
        return {"stream": stream, "tracks": tracks}
