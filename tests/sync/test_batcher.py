"""The per-viewer batcher: message rate, size, bounded backlog, anchor repeats, and a viewer
that resolves what it receives (decoded with the real codec)."""

from __future__ import annotations

import itertools
import random

from sfu_sidecar.sync.batcher import SyncBatcher
from sfu_sidecar.sync.wire import (
    MAX_UNFRAGMENTED,
    AnchorRecord,
    Batch,
    ControlRecord,
    Cue,
    Epoch,
    FrameRecord,
    Source,
    parse_message,
)

MS = 1_000_000
T0 = 1_796_025_600 * 10**9


def video_anchor(**kw: object) -> AnchorRecord:
    fields: dict[str, object] = dict(track=0, generation=0, source=Source.SENDER_REPORT,
                                     clock_rate=90_000, rtp_ts=1000, capture_ns=T0, mid="0")
    fields.update(kw)
    return AnchorRecord(**fields)  # type: ignore[arg-type]


def audio_anchor(**kw: object) -> AnchorRecord:
    fields: dict[str, object] = dict(track=1, generation=0, source=Source.SENDER_REPORT,
                                     clock_rate=48_000, rtp_ts=5000, capture_ns=T0, mid="1",
                                     audio=True)
    fields.update(kw)
    return AnchorRecord(**fields)  # type: ignore[arg-type]


class Viewer:
    """What a browser does with the messages (the JS SyncState, in Python for the test)."""

    def __init__(self) -> None:
        self.anchors: dict[tuple[int, int], AnchorRecord] = {}
        self.captures: dict[tuple[int, int], int] = {}
        self.unresolved = 0
        self.controls: list[object] = []
        self.seqs: list[int] = []

    def receive(self, raw: bytes) -> None:
        msg = parse_message(raw)
        assert isinstance(msg, Batch)
        self.seqs.append(msg.seq)
        for rec in msg.records:
            if isinstance(rec, AnchorRecord):
                self.anchors[(rec.track, rec.generation)] = rec
            elif isinstance(rec, FrameRecord):
                a = self.anchors.get((rec.track, rec.generation))
                if a is None:
                    self.unresolved += 1
                else:
                    self.captures[(rec.track, rec.rtp_ts(a))] = rec.capture_ns(a)
            else:
                assert isinstance(rec, ControlRecord)
                self.controls.append(rec.message)


def run_stream(
    b: SyncBatcher, seconds: float, *, loss: float = 0.0, seed: int = 1,
    poll_every_ns: int = 10 * MS,
) -> tuple[Viewer, dict[tuple[int, int], int], list[int]]:
    """30 fps video + 50 packets/s audio with jittered capture times; polls every 10 ms."""
    rng = random.Random(seed)
    viewer = Viewer()
    truth: dict[tuple[int, int], int] = {}
    emitted_at: list[int] = []
    events = []
    for i in range(int(seconds * 30)):
        events.append((T0 + i * 1_000_000_000 // 30, 0, 1000 + 3000 * i))
    for i in range(int(seconds * 50)):
        events.append((T0 + i * 20 * MS, 1, 5000 + 960 * i))
    events.sort()
    ev = iter(events)
    nxt = next(ev, None)
    now = T0
    end = T0 + int(seconds * 1e9) + 3_000 * MS
    while now < end:
        while nxt is not None and nxt[0] <= now:
            t, track, ts = nxt
            capture = t + rng.randrange(-300_000, 300_000)
            truth[(track, ts)] = capture
            b.add_frame(track, ts, capture, Source.SENDER_REPORT, now, keyframe=ts == 1000,
                        audio=track == 1)
            nxt = next(ev, None)
        raw = b.poll(now)
        if raw is not None:
            assert len(raw) <= MAX_UNFRAGMENTED
            emitted_at.append(now)
            if rng.random() >= loss:
                viewer.receive(raw)
        now += poll_every_ns
    return viewer, truth, emitted_at


def test_steady_state_rate_size_and_exact_resolution() -> None:
    b = SyncBatcher()
    b.set_anchor(video_anchor())
    b.set_anchor(audio_anchor())
    viewer, truth, emitted = run_stream(b, 10.0)
    # At most one message per 200 ms: 5 per second.
    gaps = [b2 - a for a, b2 in itertools.pairwise(emitted)]
    assert min(gaps) >= 200 * MS
    assert len(emitted) <= 10 * 5 + 1 + 3 * 5
    # Every frame arrived, and resolves to its capture time to the nanosecond.
    assert viewer.captures == truth
    assert b.stats.frames_sent == len(truth) and b.stats.frames_dropped == 0
    # Bytes per second of payload: 80 frame records/s at 11 bytes plus anchors and headers.
    rate = b.stats.bytes / 10.0
    print(f"sync traffic per viewer: {len(emitted) / 10.0:.1f} msg/s, {rate:.0f} B/s")
    assert rate < 80 * 11 + 2 * 26 * 2 + 5 * 5 + 100


def test_lost_messages_cost_only_their_own_frames() -> None:
    """On the unreliable channel a lost message loses its records; the anchor repeats mean
    later frames still resolve (nothing resolves wrongly)."""
    b = SyncBatcher()
    b.set_anchor(video_anchor())
    b.set_anchor(audio_anchor())
    viewer, truth, _ = run_stream(b, 10.0, loss=0.2, seed=7)
    assert viewer.captures  # most came through
    for key, capture in viewer.captures.items():
        assert truth[key] == capture
    # The anchors were sent twice and then every second: the first ones may be lost, later
    # frames never wait long for one.
    assert viewer.unresolved < 0.1 * len(truth)
    assert len(viewer.captures) > 0.7 * len(truth)


def test_backlog_is_bounded_and_drops_oldest_frames_first() -> None:
    b = SyncBatcher(max_frames=50)
    b.set_anchor(video_anchor())
    b.add_control(Epoch("s", T0))
    for i in range(200):
        b.add_frame(0, 1000 + 3000 * i, T0 + i * 33 * MS, Source.ARRIVAL, T0)
    assert b.stats.frames_dropped == 150
    viewer = Viewer()
    now = T0 + 1
    while (raw := b.poll(now)) is not None or b.pending:
        if raw is not None:
            viewer.receive(raw)
        now += 200 * MS
    # The newest 50 frames, the anchor and the control message survived.
    assert sorted(ts for _, ts in viewer.captures) == [1000 + 3000 * i for i in range(150, 200)]
    assert viewer.controls == [Epoch("s", T0)]


def test_slow_viewer_buffer_stalls_then_expires_old_frames() -> None:
    b = SyncBatcher(max_frame_age_ns=1_000 * MS)
    b.set_anchor(video_anchor())
    for i in range(30):
        b.add_frame(0, 1000 + 3000 * i, T0 + i * 33 * MS, Source.ARRIVAL, T0 + i * 33 * MS)
    assert b.poll(T0 + 1_000 * MS, buffered_amount=1 << 20) is None
    assert b.stats.stalls == 1
    raw = b.poll(T0 + 1_500 * MS, buffered_amount=0)
    assert raw is not None
    msg = parse_message(raw)
    assert isinstance(msg, Batch)
    frames = [r for r in msg.records if isinstance(r, FrameRecord)]
    # Frames queued before T0 + 500 ms were too old to matter by T0 + 1.5 s.
    assert b.stats.frames_expired == sum(1 for i in range(30) if i * 33 < 500)
    assert len(frames) == 30 - b.stats.frames_expired


def test_control_records_survive_and_go_in_order_within_the_size_cap() -> None:
    b = SyncBatcher(max_control=3)
    long_text = "x" * 400
    cues = [Cue("s", "en", str(i), i, i + 1.5, long_text, True) for i in range(5)]
    for cue in cues:
        b.add_control(cue)
    assert b.stats.control_dropped == 2
    got: list[object] = []
    now = T0
    sizes = []
    while b.pending:
        raw = b.poll(now)
        if raw is not None:
            sizes.append(len(raw))
            msg = parse_message(raw)
            assert isinstance(msg, Batch)
            got.extend(r.message for r in msg.records if isinstance(r, ControlRecord))
        now += 200 * MS
    assert got == cues[2:]
    assert max(sizes) <= MAX_UNFRAGMENTED and len(sizes) == 2  # 2 cues fit, then 1


def test_anchor_changes_generations_and_old_frames_keep_their_anchor() -> None:
    b = SyncBatcher()
    first = b.set_anchor(video_anchor())
    assert b.set_anchor(video_anchor(generation=9)) == first  # same map: no new generation
    b.add_frame(0, 4000, T0 + 33 * MS, Source.SENDER_REPORT, T0)
    second = b.set_anchor(video_anchor(rtp_ts=7000, capture_ns=T0 + 66_666_667, drift_ppb=30))
    assert second.generation == (first.generation + 1) % 16
    b.add_frame(0, 10_000, T0 + 100 * MS, Source.SENDER_REPORT, T0)
    viewer = Viewer()
    raw = b.poll(T0)
    assert raw is not None
    viewer.receive(raw)
    assert viewer.captures == {(0, 4000): T0 + 33 * MS, (0, 10_000): T0 + 100 * MS}


def test_frame_far_from_its_anchor_gets_a_fresh_one() -> None:
    b = SyncBatcher()
    b.set_anchor(video_anchor())
    rec = b.add_frame(0, 1000 + 90_000, T0 + 5_000 * MS, Source.ARRIVAL, T0)  # 4 s residual
    assert rec is not None and rec.generation == 1 and rec.residual_ns == 0
    viewer = Viewer()
    raw = b.poll(T0)
    assert raw is not None
    viewer.receive(raw)
    assert viewer.captures == {(0, 91_000): T0 + 5_000 * MS}


def test_reset_anchor_voids_queued_frames_of_the_old_timeline() -> None:
    b = SyncBatcher()
    b.set_anchor(video_anchor())
    assert b.add_frame(1, 0, T0, Source.ARRIVAL, T0) is None  # no anchor for track 1 yet
    assert b.stats.frames_unanchored == 1
    b.add_frame(0, 4000, T0, Source.SENDER_REPORT, T0)
    b.set_anchor(video_anchor(rtp_ts=50, capture_ns=T0 + 9 * 10**9, reset=True))
    # The same map again (its reset flag and all) is not another reset.
    b.set_anchor(video_anchor(rtp_ts=50, capture_ns=T0 + 9 * 10**9, reset=True))
    raw = b.poll(T0)
    assert raw is not None
    msg = parse_message(raw)
    assert isinstance(msg, Batch)
    assert [type(r).__name__ for r in msg.records] == ["AnchorRecord"]
    assert isinstance(msg.records[0], AnchorRecord) and msg.records[0].reset


def test_nothing_to_say_means_no_message() -> None:
    b = SyncBatcher()
    assert b.poll(T0) is None
    b.set_anchor(video_anchor())
    assert b.poll(T0) is not None  # the new anchor
    assert b.poll(T0 + 200 * MS) is not None  # its second copy
    assert b.poll(T0 + 400 * MS) is None  # no frames, repeat not yet due
    assert b.poll(T0 + 1_400 * MS) is not None  # the periodic repeat
    assert b.next_poll_ns() == T0 + 1_600 * MS


def test_unpackable_control_fails_when_queued_not_when_polled() -> None:
    import pytest

    from sfu_sidecar.sync.wire import SyncWireError, UnknownControl

    b = SyncBatcher()
    with pytest.raises(SyncWireError):
        b.add_control(UnknownControl("x", {"v": object()}))
    b.add_control(Epoch("s", T0))
    raw = b.poll(T0)
    assert raw is not None and parse_message(raw) == Batch(0, (ControlRecord(Epoch("s", T0)),))


def test_a_caption_change_goes_out_without_waiting_for_the_frame_interval() -> None:
    """Frames go at most every 200 ms; a cue or a retraction (a barge-in's cut) may follow the
    last message after 20 ms, so it reaches the screen within a frame or two."""
    b = SyncBatcher()
    b.set_anchor(video_anchor())
    b.add_frame(0, 1000, T0, Source.SENDER_REPORT, T0)
    assert b.poll(T0) is not None
    b.add_frame(0, 4000, T0 + 33 * MS, Source.SENDER_REPORT, T0 + 33 * MS)
    assert b.poll(T0 + 40 * MS) is None  # frames alone wait for the interval
    assert b.next_poll_ns() == T0 + 200 * MS
    cut = Cue("s", "en", "c1", 1.0, 1.2, "cut here", True)
    b.add_control(cut)
    assert b.next_poll_ns() == T0 + 20 * MS
    assert b.poll(T0 + 10 * MS) is None  # not sooner than 20 ms after the last message
    raw = b.poll(T0 + 40 * MS)
    assert raw is not None
    msg = parse_message(raw)
    assert isinstance(msg, Batch)
    kinds = [type(r).__name__ for r in msg.records]
    assert "ControlRecord" in kinds and "FrameRecord" in kinds  # the queued frame rides along
    assert b.next_poll_ns() == T0 + 240 * MS  # and frames are back on their own interval
