"""A viewer process SIGKILLed mid-stream: the relay keeps every other viewer at full rate,
notices the dead one by its unanswered ICE consent checks, reaps it and counts it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from tests.conftest import ServerProcess
from tests.faults.procs import PeerProcess, aget_json, metric
from tests.relay.peers import PatternVideo, Peer, ToneAudio, publish, view, wait_for

STREAM = "killed-viewer"
CONSENT_TIMEOUT_S = 6.0  # the product's RFC 7675 default is 30 s; shortened to keep this fast


async def rate_window(publisher: Peer, viewers: list[Peer], seconds: float) -> list[float]:
    """Each viewer's packets received over ``seconds``, as a fraction of what the publisher
    sent meanwhile."""
    sent0, got0 = len(publisher.sent), [len(v.received) for v in viewers]
    await asyncio.sleep(seconds)
    sent = len(publisher.sent) - sent0
    assert sent > seconds * 50, f"the publisher itself stalled: {sent} packets in {seconds} s"
    return [(len(v.received) - g) / sent for v, g in zip(viewers, got0, strict=True)]


async def test_killed_viewer_is_reaped_and_the_others_keep_their_rate(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = server_factory("--ice-addresses", "127.0.0.1", "--log-level", "warning",
                            "--ice-consent-timeout-s", str(CONSENT_TIMEOUT_S))
    base = server.base
    doomed = PeerProcess("view", base, STREAM, tmp_path / "doomed.log", sync=True)
    try:
        async with aiohttp.ClientSession() as http:
            pub = await publish(http, base, STREAM, video=PatternVideo(fps=30), audio=ToneAudio())
            viewers = [await view(http, base, STREAM, decode=False) for _ in range(2)]
            await doomed.wait_event("connected", 30)
            await wait_for(lambda: all(len(v.received) > 100 for v in viewers), 20,
                           "both local viewers receiving")
            status = await aget_json(f"{base}/api/streams/{STREAM}")
            assert len(status["viewers"]) == 3
            doomed_id = doomed.last["location"].rsplit("/", 1)[1]
            assert doomed_id in {v["id"] for v in status["viewers"]}
            await wait_for(lambda: doomed.lines.qsize() >= 1, 5, "the doomed viewer's stats")
            before = await rate_window(pub, viewers, 3.0)

            doomed.kill()
            killed_at = time.monotonic()
            # While the relay still sends to the dead viewer's port (ICMP unreachable comes
            # back), the others must not notice.
            during = await rate_window(pub, viewers, 3.0)
            reaped_s = 0.0
            while True:
                status = await aget_json(f"{base}/api/streams/{STREAM}")
                if doomed_id not in {v["id"] for v in status["viewers"]}:
                    reaped_s = time.monotonic() - killed_at
                    break
                # Consent checks go every timeout/6 (randomised up to 1.2x) and six must
                # fail: past twice the timeout, something else is wrong.
                assert time.monotonic() - killed_at < 2 * CONSENT_TIMEOUT_S + 10, status
                await asyncio.sleep(0.2)
            after = await rate_window(pub, viewers, 3.0)

            assert len(status["viewers"]) == 2
            assert metric(base, "sfu_sidecar_relay_viewers", stream=STREAM) == 2
            assert metric(base, "sfu_sidecar_relay_sessions_ended_total", role="viewer",
                          reason="disconnected") == 1
            assert metric(base, "sfu_sidecar_relay_sessions_ended_total", role="viewer",
                          reason="deleted") == 0
            # Full rate: every packet the publisher sent, give or take the window's edges.
            for fractions in (before, during, after):
                assert all(f > 0.9 for f in fractions), (before, during, after)
            print(f"reaped after {reaped_s:.1f} s; received/sent before {before}, "
                  f"during {during}, after {after}")
            for v in viewers:
                await v.close()
            await pub.close()
    finally:
        doomed.stop()
