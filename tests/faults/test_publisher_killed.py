"""A publisher process SIGKILLed mid-stream, then a new publisher on the same stream.

The relay must notice on its own (no DELETE comes), tell the viewers that the stream has no
publisher (``/api/streams`` and the sync channel's ``publisher`` state), keep the viewers
connected, and let the next publisher take over with the viewers' timeline continuing: RTP
sequence numbers, RTP timestamps and capture times (abs-capture-time, house clock) never go
backwards.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from sfu_sidecar.ntptime import ntp_to_unix_ns
from sfu_sidecar.relay import aiortc_adapter
from sfu_sidecar.relay.hooks import ABS_CAPTURE_TIME
from sfu_sidecar.sync.mapping import AbsCaptureTime
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


def video_timeline(peer: Peer) -> list[tuple[int, int, int]]:
    """(extended sequence number, RTP timestamp, capture ns) of the viewer's video packets,
    in sequence order (RTX repairs left out: they repeat an original)."""
    section = peer.answer.split("m=video", 1)[1]
    found = re.search(rf"a=extmap:(\d+)\S* {re.escape(ABS_CAPTURE_TIME)}", section)
    assert found, "the relay's answer lacks abs-capture-time"
    ext_id = int(found[1])
    ssrc = received_ssrc(peer, "video")
    out: dict[int, tuple[int, int, int]] = {}
    last: int | None = None
    packets = [p for p in list(peer.received) if p.ssrc == ssrc]
    for pkt in packets:
        step = (pkt.sequence_number - (last or 0) + 0x8000) % 0x10000 - 0x8000
        seq = pkt.sequence_number if last is None else last + step
        last = seq
        raw = dict(pkt.extensions)[ext_id]
        out[seq] = (seq, pkt.timestamp, ntp_to_unix_ns(AbsCaptureTime.parse(raw).capture_ntp))
    assert len(out) == len(packets), "a sequence number was sent twice"
    return [out[k] for k in sorted(out)]


async def test_killed_publisher_is_reaped_viewers_told_and_a_new_one_takes_over(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = server_factory("--ice-addresses", "127.0.0.1", "--log-level", "warning",
                            "--publisher-timeout-s", str(PUBLISHER_TIMEOUT_S))
    base = server.base
    # The viewer offers abs-capture-time as a browser does, so it receives the capture times.
    aiortc_adapter.negotiate_header_extension("video", ABS_CAPTURE_TIME)
    first = PeerProcess("publish", base, STREAM, tmp_path / "first.log")
    second: PeerProcess | None = None
    try:
        async with aiohttp.ClientSession() as http:
            await first.wait_event("connected", 30)
            viewer = await view(http, base, STREAM, data_channel="sync", decode=False)
            states = publisher_states(viewer)
            await wait_for(lambda: len(video_timeline(viewer)) > 90, 20, "video at the viewer")
            await wait_for(lambda: bool(states) and states[-1][1], 10, "publisher live state")
            before_kill = len(video_timeline(viewer))

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
            await wait_for(lambda: len(video_timeline(viewer)) > before_kill + 90, 20,
                           "video from the second publisher")
            status = await aget_json(f"{base}/api/streams/{STREAM}")
            assert status["publisher"] is not None and status["publishers_seen"] == 2

            timeline = video_timeline(viewer)
            # One sequence across both publishers: at most a few packets lost on loopback.
            assert timeline[-1][0] - timeline[0][0] + 1 - len(timeline) <= 5
            for (_, ts0, cap0), (s1, ts1, cap1) in itertools.pairwise(timeline):
                assert (ts1 - ts0) % (1 << 32) < (1 << 31), f"RTP time went back at seq {s1}"
                assert cap1 >= cap0, f"capture time went back {cap0 - cap1} ns at seq {s1}"
            gap_s = max(b[2] - a[2] for a, b in itertools.pairwise(timeline)) / 1e9
            print(f"publisher reaped {reaped_s:.1f} s after SIGKILL; capture-time gap across "
                  f"the takeover {gap_s:.1f} s; {len(timeline)} video packets in order")
            await viewer.close()
    finally:
        first.stop()
        if second is not None:
            second.stop()
