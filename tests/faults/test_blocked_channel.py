"""One viewer stops reading: its process is stopped (SIGSTOP), so nothing drains its SCTP
association or acknowledges what the relay sends it. The other viewers keep their media and
sync messages at full rate, and the stalled viewer's backlog stays bounded (the channel's
buffered bytes and the batcher's queue).

Two cases. With the sync channel opened as proto/sync.md asks (unordered, no retransmission)
aiortc's SCTP abandons what goes unacknowledged (RFC 3758), so nothing piles up even in the
channel's buffer. Opened ordered and reliable, as a client may do anyway, SCTP keeps every
message: the buffer fills to the batcher's gate, the batcher holds back, its queue drops the
oldest frames, and those drops are counted in ``/api/sync`` and in ``sync_records_dropped``
while the viewer is still connected."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sfu_sidecar.sync.batcher import SyncBatcher
from sfu_sidecar.sync.wire import MAX_UNFRAGMENTED
from tests.conftest import ServerProcess
from tests.faults.procs import PeerProcess, aget_json, metric
from tests.relay.peers import PatternVideo, Peer, ToneAudio, publish, view, wait_for

STREAM = "blocked-channel"
# About 1 KiB of sync messages a second reach a viewer of 30 fps video and 50 audio packets a
# second, so a reliable channel's buffer reaches the batcher's 16 KiB gate after ~16 s; the
# channel as specified sheds what goes unacknowledged within seconds. The consent timeout is
# raised past the stall: this viewer is slow, not gone.
STALL_S = {False: 12.0, True: 30.0}
CONSENT_TIMEOUT_S = 90.0
DEFAULTS = SyncBatcher()


def counting(peer: Peer) -> list[int]:
    """A one-element counter of the sync messages ``peer`` receives."""
    count = [0]

    def on_message(_: Any) -> None:
        count[0] += 1

    peer.channel.on("message", on_message)
    return count


async def sync_entry(base: str, viewer_id: str) -> dict[str, Any]:
    status = await aget_json(f"{base}/api/sync")
    entry: dict[str, Any] = next(v for v in status["viewers"] if v["id"] == viewer_id)
    return entry


def dropped_total(base: str) -> float:
    return sum(metric(base, "sfu_sidecar_sync_records_dropped_total", reason=r)
               for r in ("backlog_full", "expired", "control_backlog_full"))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("reliable", [False, True], ids=["as-specified", "reliable"])
async def test_stalled_viewer_channel_is_bounded_counted_and_harms_no_one(
    server_factory: Callable[..., ServerProcess], tmp_path: Path, reliable: bool
) -> None:
    server = server_factory("--ice-addresses", "127.0.0.1", "--log-level", "warning",
                            "--ice-consent-timeout-s", str(CONSENT_TIMEOUT_S))
    base = server.base
    stalled = PeerProcess("view", base, STREAM, tmp_path / "stalled.log", sync=True,
                          reliable=reliable)
    try:
        async with aiohttp.ClientSession() as http:
            pub = await publish(http, base, STREAM, video=PatternVideo(fps=30), audio=ToneAudio())
            viewers = [await view(http, base, STREAM, data_channel="sync", decode=False)
                       for _ in range(2)]
            counts = [counting(v) for v in viewers]
            await stalled.wait_event("connected", 30)
            stalled_id = stalled.last["location"].rsplit("/", 1)[1]
            await wait_for(lambda: all(c[0] > 5 for c in counts), 20, "sync at both viewers")
            for _ in range(100):
                entry = await sync_entry(base, stalled_id)
                if entry["channel"] == "open" and entry["messages"] > 5:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"the stalled viewer's channel never carried: {entry}")

            async def window(seconds: float) -> tuple[list[float], list[float]]:
                """Media received / sent, and sync messages per second, of each viewer."""
                sent0 = len(pub.sent)
                got0 = [len(v.received) for v in viewers]
                msgs0 = [c[0] for c in counts]
                await asyncio.sleep(seconds)
                sent = len(pub.sent) - sent0
                media = [(len(v.received) - g) / sent for v, g in zip(viewers, got0, strict=True)]
                sync = [(c[0] - m) / seconds for c, m in zip(counts, msgs0, strict=True)]
                return media, sync

            media_before, sync_before = await window(3.0)
            dropped_before = dropped_total(base)
            stalled.proc.send_signal(signal.SIGSTOP)
            peak_buffered = peak_queued = 0
            watch = asyncio.create_task(window(STALL_S[reliable]))
            while not watch.done():
                entry = await sync_entry(base, stalled_id)
                peak_buffered = max(peak_buffered, entry["buffered_bytes"])
                peak_queued = max(peak_queued, entry["queued_frames"])
                await asyncio.sleep(0.25)
            media_during, sync_during = await watch
            entry = await sync_entry(base, stalled_id)
            dropped_after = dropped_total(base)
            stalled.proc.send_signal(signal.SIGCONT)

            print(f"stalled {STALL_S[reliable]:.0f} s: peak buffered {peak_buffered} B, "
                  f"peak queued {peak_queued} frames, stalls {entry['stalls']}, dropped "
                  f"{entry['frames_dropped']} + expired {entry['frames_expired']}; others: "
                  f"media {media_before} -> {media_during}, sync/s {sync_before} -> "
                  f"{sync_during}")
            # The others: every media packet, and their sync messages at the same pace.
            assert all(f > 0.9 for f in media_before + media_during)
            assert all(d >= 0.8 * b for d, b in zip(sync_during, sync_before, strict=True))
            # The stalled one: nothing piles up past the bounds, and what it lost is counted.
            assert peak_buffered <= DEFAULTS.max_buffered_bytes + MAX_UNFRAGMENTED
            assert peak_queued <= DEFAULTS.max_frames
            if reliable:
                assert entry["stalls"] > 0, entry
                lost = entry["frames_dropped"] + entry["frames_expired"]
                assert lost > 0, entry
                # Counted as they happen, not only when the viewer leaves.
                assert dropped_after - dropped_before >= lost, (dropped_before, dropped_after)
            for v in viewers:
                await v.close()
            await pub.close()
    finally:
        stalled.stop()
