"""Per-viewer batching of sync records into DataChannel messages. Pure: time is passed in.

Why batch at all: in aiortc one DataChannel message is one SCTP chunk in one datagram and
costs ~0.2 ms of CPU; peers collapsed past a few thousand messages a second, while 32
records per message carried ~229 k records/s (docs/architecture.md, aiortc facts). So a
viewer gets at most one message per ``interval_ns`` (200 ms: 5 messages/s), each at most one
SCTP chunk. Control records (captions: a cue, a retraction, a cue cut by a barge-in) do not wait
that long: a message may go ``control_interval_ns`` (20 ms) after the last one when it carries
one, so an interrupted speaker's caption leaves the screen within a frame or two, not up to a
fifth of a second later. Captions change a few times a second at most, so this adds little.

What is kept when a viewer falls behind: frame records are only useful before their frame
is presented, so the backlog of frames is bounded and loses its oldest first, and frames
older than ``max_frame_age_ns`` are dropped when a message is built. The current anchor of
each track is state, not backlog: it is never dropped, is repeated in the next
``anchor_copies`` messages after it changes and every ``anchor_repeat_ns`` after that,
because the channel is unreliable (``proto/sync.md``) and a viewer that lost an anchor
cannot resolve the frames that refer to it. Control records are kept in order, bounded.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sfu_sidecar.sync.wire import (
    GENERATIONS,
    MAX_UNFRAGMENTED,
    AnchorRecord,
    Batch,
    Control,
    ControlRecord,
    FrameRecord,
    Record,
    Source,
)

MS = 1_000_000


@dataclass
class BatcherStats:
    """Counters for ``/metrics`` and the test output, per viewer."""

    messages: int = 0
    bytes: int = 0
    records: int = 0
    frames_sent: int = 0
    anchors_sent: int = 0
    control_sent: int = 0
    frames_dropped: int = 0  # pushed out of a full backlog
    frames_expired: int = 0  # too old to be of use by the time a message could go
    frames_unanchored: int = 0  # arrived before any anchor of their track
    control_dropped: int = 0
    stalls: int = 0  # polls held back because the channel's own buffer was full


@dataclass
class _TrackState:
    anchor: AnchorRecord
    copies_left: int
    last_sent_ns: int | None = None
    # Anchors of earlier generations still referenced by queued frames: (anchor, last sent)
    older: dict[int, tuple[AnchorRecord, int | None]] = dataclasses.field(default_factory=dict)


def _same_map(a: AnchorRecord, b: AnchorRecord) -> bool:
    return dataclasses.replace(a, generation=b.generation, reset=b.reset) == b


class SyncBatcher:
    """Collects one viewer's anchors, frame records and control messages; :meth:`poll`
    returns the next message's bytes when one is due."""

    def __init__(
        self, *, interval_ns: int = 200 * MS, control_interval_ns: int = 20 * MS,
        max_frames: int = 256, max_control: int = 256,
        max_message_bytes: int = MAX_UNFRAGMENTED, max_frame_age_ns: int = 2_000 * MS,
        anchor_repeat_ns: int = 1_000 * MS, anchor_copies: int = 2,
        max_buffered_bytes: int = 16 * 1024,
    ) -> None:
        self.interval_ns = interval_ns
        self.control_interval_ns = control_interval_ns
        self.max_frames = max_frames
        self.max_control = max_control
        self.max_message_bytes = max_message_bytes
        self.max_frame_age_ns = max_frame_age_ns
        self.anchor_repeat_ns = anchor_repeat_ns
        self.anchor_copies = anchor_copies
        self.max_buffered_bytes = max_buffered_bytes
        self.stats = BatcherStats()
        self._tracks: dict[int, _TrackState] = {}
        self._frames: deque[tuple[int, FrameRecord]] = deque()
        self._control: deque[ControlRecord] = deque()
        self._seq = 0
        self._last_emit: int | None = None

    # --- input ------------------------------------------------------------------------------

    def set_anchor(self, anchor: AnchorRecord) -> AnchorRecord:
        """Make ``anchor`` (its generation is ignored) the track's current map; returns the
        stored record. The same map again is a no-op, so callers may pass it every frame."""
        st = self._tracks.get(anchor.track)
        # A map keeps its reset flag for life, so "same map" ignores it: passing the current
        # map again never restarts the timeline.
        if st is not None and _same_map(anchor, st.anchor):
            return st.anchor
        generation = 0 if st is None else (st.anchor.generation + 1) % GENERATIONS
        stored = dataclasses.replace(anchor, generation=generation)
        if st is None or anchor.reset:
            # A new timeline voids the old anchors and any frames still queued against them.
            if st is not None:
                self._drop_track_frames(anchor.track)
            self._tracks[anchor.track] = _TrackState(stored, self.anchor_copies)
            return stored
        if any(f.track == anchor.track and f.generation == st.anchor.generation
               for _, f in self._frames):
            st.older[st.anchor.generation] = (st.anchor, st.last_sent_ns)
        st.older.pop(generation, None)
        # A queued frame still naming the generation being reused would resolve against the
        # wrong map on the viewer: it goes (a 16-map turnover within one backlog is extreme).
        self._drop_frames(lambda f: f.track == anchor.track and f.generation == generation)
        st.anchor, st.copies_left, st.last_sent_ns = stored, self.anchor_copies, None
        return stored

    def add_frame(
        self, track: int, rtp_ts: int, capture_ns: int, source: Source, now_ns: int, *,
        keyframe: bool = False, audio: bool = False,
    ) -> FrameRecord | None:
        """Queue a frame record (viewer RTP time). A frame too far from the current anchor
        to encode gets a new anchor at itself, continuing the current slope."""
        st = self._tracks.get(track)
        if st is None:
            self.stats.frames_unanchored += 1
            return None
        rec = FrameRecord.against(st.anchor, rtp_ts, capture_ns, source,
                                  keyframe=keyframe, audio=audio)
        if rec is None:
            fresh = dataclasses.replace(st.anchor, rtp_ts=rtp_ts & 0xFFFFFFFF,
                                        capture_ns=capture_ns, reset=False)
            rec = FrameRecord.against(self.set_anchor(fresh), rtp_ts, capture_ns, source,
                                      keyframe=keyframe, audio=audio)
            assert rec is not None  # zero delta, zero residual
        self._frames.append((now_ns, rec))
        if len(self._frames) > self.max_frames:
            self._frames.popleft()
            self.stats.frames_dropped += 1
        return rec

    def add_control(self, message: Control) -> None:
        self._control.append(ControlRecord(message))
        if len(self._control) > self.max_control:
            self._control.popleft()
            self.stats.control_dropped += 1

    # --- output -----------------------------------------------------------------------------

    @property
    def pending(self) -> bool:
        return bool(self._frames or self._control)

    @property
    def queued_frames(self) -> int:
        return len(self._frames)

    @property
    def queued_control(self) -> int:
        return len(self._control)

    def next_poll_ns(self) -> int | None:
        """Earliest time :meth:`poll` may emit, or None if it may emit now."""
        if self._last_emit is None:
            return None
        return self._last_emit + self._interval()

    def _interval(self) -> int:
        return self.control_interval_ns if self._control else self.interval_ns

    def poll(self, now_ns: int, buffered_amount: int = 0) -> bytes | None:
        """The next message, or None when none is due. ``buffered_amount`` is the channel's
        ``bufferedAmount``: while it is above the limit nothing is added to it, so a slow
        viewer's SCTP queue stays bounded and costs other viewers nothing."""
        if self._last_emit is not None and now_ns - self._last_emit < self._interval():
            return None
        self._expire(now_ns)
        if buffered_amount > self.max_buffered_bytes:
            self.stats.stalls += 1
            return None
        records = self._build(now_ns)
        if not records:
            return None
        raw = Batch(self._seq, tuple(records)).serialize()
        self._seq = (self._seq + 1) & 0xFFFF
        self._last_emit = now_ns
        self.stats.messages += 1
        self.stats.bytes += len(raw)
        self.stats.records += len(records)
        return raw

    # --- internals --------------------------------------------------------------------------

    def _expire(self, now_ns: int) -> None:
        while self._frames and now_ns - self._frames[0][0] > self.max_frame_age_ns:
            self._frames.popleft()
            self.stats.frames_expired += 1

    def _drop_frames(self, pred: Callable[[FrameRecord], bool]) -> None:
        self._frames = deque(item for item in self._frames if not pred(item[1]))

    def _drop_track_frames(self, track: int) -> None:
        self._drop_frames(lambda f: f.track == track)

    def _anchor_due(self, last_sent: int | None, now_ns: int) -> bool:
        return last_sent is None or now_ns - last_sent >= self.anchor_repeat_ns

    def _build(self, now_ns: int) -> list[Record]:
        budget = self.max_message_bytes - Batch.header_size
        records: list[Record] = []
        used = 0

        def fits(size: int) -> bool:
            # The first record always goes, even an oversized one, or it would block forever.
            return len(records) < 255 and (not records or used + size <= budget)

        referenced = {(f.track, f.generation) for _, f in self._frames}
        for track, st in self._tracks.items():
            for gen, (older, last) in list(st.older.items()):
                if (track, gen) not in referenced:
                    del st.older[gen]
                elif self._anchor_due(last, now_ns) and fits(older.size):
                    records.append(older)
                    used += older.size
                    st.older[gen] = (older, now_ns)
            if (st.copies_left > 0 or self._anchor_due(st.last_sent_ns, now_ns)) and fits(
                st.anchor.size
            ):
                records.append(st.anchor)
                used += st.anchor.size
                st.copies_left = max(0, st.copies_left - 1)
                st.last_sent_ns = now_ns
        anchors = len(records)
        while self._control and fits(size := self._control[0].size):
            records.append(self._control.popleft())
            used += size
            self.stats.control_sent += 1
        while self._frames and fits(FrameRecord.size):
            records.append(self._frames.popleft()[1])
            used += FrameRecord.size
            self.stats.frames_sent += 1
        self.stats.anchors_sent += anchors
        return records
