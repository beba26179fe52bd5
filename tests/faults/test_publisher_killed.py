"""A publisher process SIGKILLed mid-stream, then a new publisher on the same stream.

The relay must notice on its own (no DELETE comes), tell the viewers that the stream has no
publisher (``/api/streams`` and the sync channel's ``publisher`` state), keep the viewers
connected, and let the next publisher take over with the viewers' timeline continuing: RTP
sequence numbers, RTP timestamps and capture times (the sync records, house clock) never go
backwards.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from sfu_sidecar.relay import aiortc_adapter
from sfu_sidecar.relay.hooks import ABS_CAPTURE_TIME
from sfu_sidecar.sync.wire import (
    Batch,
    ControlMessage,
    ControlRecord,
    PublisherState,
    parse_message,
)
from tests.conftest import ServerProcess
from tests.faults.procs import PeerProcess, aget_json, metric
from tests.relay.peers import Peer, received_ssrc, view, wait_for
from tests.sync.records import ViewerRecords
from tests.syncchannel.test_service import _mid, collect

STREAM = "killed-publisher"
PUBLISHER_TIMEOUT_S = 3.0  # seconds without media (default 10), shortened to keep this fast


def publisher_states(peer: Peer) -> list[tuple[float, bool]]:
    """(monotonic arrival, live) of every ``publisher`` state the viewer's sync channel got."""
    seen: list[tuple[float, bool]] = []

    def on_message(data: Any) -> None:
        message = parse_message(bytes(data))
        controls = (
            [message.message] if isinstance(message, ControlMessage)
            else [r.message for r in message.records if isinstance(r, ControlRecord)]
            if isinstance(message, Batch) else []
        )
        seen.extend((time.monotonic(), c.live) for c in controls if isinstance(c, PublisherState))

    peer.channel.on("message", on_message)
    return seen


def video_timeline(peer: Peer, records: ViewerRecords) -> list[tuple[int, int, int | None]]:
    """(extended sequence number, RTP timestamp, capture ns or None) of the viewer's video
    packets, in sequence order (RTX repairs left out: they repeat an original). The capture
    time is the one the sync records give the packet's frame: this publisher never joins the
    house clock, so every capture time is an estimate, which only the records carry (the
    copies carry abs-capture-time for exact capture times alone)."""
    ssrc = received_ssrc(peer, "video")
    mid = _mid(peer, "video")
    track = next((t for t, a in records.current.items() if a.mid == mid), None)
    out: dict[int, tuple[int, int, int | None]] = {}
    last: int | None = None
    packets = [p for p in list(peer.received) if p.ssrc == ssrc]
    for pkt in packets:
        step = (pkt.sequence_number - (last or 0) + 0x8000) % 0x10000 - 0x8000
        seq = pkt.sequence_number if last is None else last + step
        last = seq
        found = records.frames.get((track, pkt.timestamp)) if track is not None else None
        out[seq] = (seq, pkt.timestamp, found[0] if found is not None else None)
    assert len(out) == len(packets), "a sequence number was sent twice"
    return [out[k] for k in sorted(out)]


def mapped(timeline: list[tuple[int, int, int | None]]) -> list[tuple[int, int, int]]:
    return [(s, ts, c) for s, ts, c in timeline if c is not None]


async def test_killed_publisher_is_reaped_viewers_told_and_a_new_one_takes_over(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = server_factory("--ice-addresses", "127.0.0.1", "--log-level", "warning",
                            "--publisher-timeout-s", str(PUBLISHER_TIMEOUT_S))
    base = server.base
    # The viewer offers abs-capture-time as a browser does (it gets none on this stream: the
    # publisher never joins the house clock, so its capture times are estimates).
    aiortc_adapter.negotiate_header_extension("video", ABS_CAPTURE_TIME)
    first = PeerProcess("publish", base, STREAM, tmp_path / "first.log")
    second: PeerProcess | None = None
    try:
        async with aiohttp.ClientSession() as http:
            await first.wait_event("connected", 30)
            viewer = await view(http, base, STREAM, data_channel="sync", decode=False)
            states = publisher_states(viewer)
            records = collect(viewer)
            await wait_for(lambda: len(mapped(video_timeline(viewer, records))) > 90, 20,
                           "video at the viewer")
            await wait_for(lambda: bool(states) and states[-1][1], 10, "publisher live state")
            before_kill = len(mapped(video_timeline(viewer, records)))

            first.kill()
            killed_at = time.monotonic()
            while True:
                status = await aget_json(f"{base}/api/streams/{STREAM}")
                if status["publisher"] is None:
                    reaped_s = time.monotonic() - killed_at
                    break
                assert time.monotonic() - killed_at < PUBLISHER_TIMEOUT_S + 12, status
                await asyncio.sleep(0.1)
            # Gone for lack of media (or, if consent checks notice first, the transport).
            ended = sum(metric(base, "sfu_sidecar_relay_sessions_ended_total", role="publisher",
                               reason=r) for r in ("no_media", "disconnected"))
            assert ended == 1
            assert metric(base, "sfu_sidecar_relay_publishers") == 0
            # The stream and its viewer stay, told there is no publisher.
            assert [v["state"] for v in status["viewers"]] == ["connected"]
            listed = await aget_json(f"{base}/api/streams")
            assert any(s["stream"] == STREAM and s["publisher"] is None
                       for s in (listed["streams"] if isinstance(listed, dict) else listed))
            await wait_for(lambda: not states[-1][1], 3, "the viewer told: no publisher")
            told_at = next(t for t, live in reversed(states) if not live)
            assert told_at >= killed_at
            assert viewer.pc.connectionState == "connected"

            second = PeerProcess("publish", base, STREAM, tmp_path / "second.log")
            await second.wait_event("connected", 30)
            await wait_for(lambda: states[-1][1], 5, "the viewer told: live again")
            await wait_for(lambda: len(mapped(video_timeline(viewer, records))) > before_kill + 90,
                           20,
                           "video from the second publisher")
            status = await aget_json(f"{base}/api/streams/{STREAM}")
            assert status["publisher"] is not None and status["publishers_seen"] == 2

            everything = video_timeline(viewer, records)
            # One sequence across both publishers: at most a few packets lost on loopback.
            assert everything[-1][0] - everything[0][0] + 1 - len(everything) <= 5
            for (_, ts0, _), (s1, ts1, _) in itertools.pairwise(everything):
                assert (ts1 - ts0) % (1 << 32) < (1 << 31), f"RTP time went back at seq {s1}"
            timeline = mapped(everything)
            for (_, _, cap0), (s1, _, cap1) in itertools.pairwise(timeline):
                assert cap1 >= cap0, f"capture time went back {cap0 - cap1} ns at seq {s1}"
            gap_s = max(b[2] - a[2] for a, b in itertools.pairwise(timeline)) / 1e9
            print(f"publisher reaped {reaped_s:.1f} s after SIGKILL; capture-time gap across "
                  f"the takeover {gap_s:.1f} s; {len(timeline)} video packets in order")
            await viewer.close()
    finally:
        first.stop()
        if second is not None:
            second.stop()
