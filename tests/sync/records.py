"""What a viewer learns from its ``sync`` channel, decoded with the product's wire codec."""

from __future__ import annotations

from typing import Any

from sfu_sidecar.sync.wire import (
    AnchorRecord,
    Batch,
    ControlMessage,
    ControlRecord,
    FrameRecord,
    Source,
    parse_message,
)

MASK32 = 0xFFFFFFFF


class ViewerRecords:
    """What a viewer learns from its sync channel: anchors, frame records, control messages."""

    def __init__(self) -> None:
        self.anchors: dict[tuple[int, int], AnchorRecord] = {}
        self.current: dict[int, AnchorRecord] = {}
        self.frames: dict[tuple[int, int], tuple[int, Source, bool]] = {}
        self.controls: list[Any] = []
        self.messages = 0
        self.bytes = 0

    def feed(self, data: bytes) -> None:
        self.messages += 1
        self.bytes += len(data)
        message = parse_message(data)
        if isinstance(message, ControlMessage):
            self.controls.append(message.message)
            return
        assert isinstance(message, Batch)
        for record in message.records:
            if isinstance(record, AnchorRecord):
                self.anchors[(record.track, record.generation)] = record
                self.current[record.track] = record
            elif isinstance(record, FrameRecord):
                anchor = self.anchors[(record.track, record.generation)]
                self.frames[(record.track, record.rtp_ts(anchor))] = (
                    record.capture_ns(anchor), record.source, anchor.estimated,
                )
            elif isinstance(record, ControlRecord):
                self.controls.append(record.message)

    def track_for(self, mid: str) -> int:
        return next(t for t, a in self.current.items() if a.mid == mid)

    def frame(self, track: int, rtp_ts: int) -> tuple[int, Source, bool] | None:
        # aiortc's decoder reports pts through a rescale that can be one tick off the RTP
        # timestamp it came from; frames are 3000 ticks apart, so +-2 is unambiguous.
        for delta in (0, -1, 1, -2, 2):
            found = self.frames.get((track, (rtp_ts + delta) & MASK32))
            if found is not None:
                return found
        return None
