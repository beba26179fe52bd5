"""1000 WHEP joins and leaves against a serving process with a live publisher: half end with
DELETE, half are dropped without one. Afterwards every dropped session is reaped, and the
process's open fds, asyncio tasks and resident memory are back near the baseline taken after
a warm-up; a leak of one fd, task or a few hundred KiB per session would show many times over.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from aiortc import RTCPeerConnection

from tests.conftest import ServerProcess
from tests.faults.procs import PeerProcess, aget_json, metric
from tests.relay.peers import client_pc

STREAM = "churn"
CYCLES = 1000
# The warm-up is the same churn as the measured one, so it reaches the same peak number of live
# sessions (dropped ones live until the connect timeout, so that peak depends on how fast this
# machine churns): the allocator keeps that high-water mark, which is not a leak (measured: the
# first 1000 cycles from cold add ~55 MiB, each further 1000 add 0.3-3 MiB; a warm-up of 400
# that ended before the connect timeout left a fast machine 32 MiB short of its peak).
WARMUP = CYCLES
WORKERS = 4  # concurrent clients: enough to overlap sessions, not to starve 2 cores
CONNECT_TIMEOUT_S = 3.0  # session_connect_timeout_s (default 30), shortened to keep this fast
# Bounds over the warm baseline. Measured on a 2-core machine: fds and tasks come back to the
# baseline or one below; the slack is for the HTTP server's keep-alive sockets and the
# publisher's own tasks coming and going. Memory gets allocator slack: 1000 sessions leaking
# only 30 KiB each would pass 30 MiB.
FD_SLACK = 5
TASK_SLACK = 5
RSS_SLACK_BYTES = 30 * 1024 * 1024


async def viewer_offer() -> str:
    """A minimal valid recvonly WHEP offer (audio, video and the sync channel) from aiortc,
    made once and posted by every cycle; its peer connection is closed, so nothing ever
    answers the relay's ICE checks for it."""
    pc: RTCPeerConnection = client_pc()
    pc.addTransceiver("audio", direction="recvonly")
    pc.addTransceiver("video", direction="recvonly")
    pc.createDataChannel("sync", ordered=False, maxRetransmits=0)
    await pc.setLocalDescription(await pc.createOffer())
    sdp = str(pc.localDescription.sdp)
    await pc.close()
    return sdp


def footprint(pid: int) -> tuple[int, int]:
    """(open fds, resident bytes) of a process, read from /proc."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/status") as status:
        rss_kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return fds, rss_kib * 1024


async def cycle(http: aiohttp.ClientSession, base: str, offer: str, delete: bool) -> None:
    async with http.post(f"{base}/whep/{STREAM}", data=offer,
                         headers={"Content-Type": "application/sdp"}) as resp:
        body = await resp.text()
        assert resp.status == 201, (resp.status, body)
        location = resp.headers["Location"]
    if delete:
        async with http.delete(base + location) as resp:
            assert resp.status == 200, await resp.text()


async def churn(base: str, offer: str, first: int, count: int) -> None:
    """Cycles first..first+count-1, even ones ending with DELETE, odd ones just dropped."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(first, first + count):
        queue.put_nowait(i)

    async def work(http: aiohttp.ClientSession) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            await cycle(http, base, offer, delete=i % 2 == 0)

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(work(http) for _ in range(WORKERS)))


async def viewers_left(base: str) -> int:
    status = await aget_json(f"{base}/api/streams/{STREAM}")
    return len(status["viewers"])


async def settle(base: str, limit_s: float) -> float:
    """Seconds until the stream has no viewer session left."""
    started = time.monotonic()
    while await viewers_left(base):
        assert time.monotonic() - started < limit_s, f"{await viewers_left(base)} not reaped"
        await asyncio.sleep(0.2)
    return time.monotonic() - started


@pytest.mark.timeout(300)
async def test_thousand_joins_and_drops_leak_no_fds_tasks_or_memory(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = server_factory(
        "--ice-addresses", "127.0.0.1", "--log-level", "warning",
        "--session-connect-timeout-s", str(CONNECT_TIMEOUT_S),
        # Dropped sessions live until reaped: room for those of the last few seconds.
        "--max-viewers", "1000", "--max-viewers-per-stream", "1000",
        "--max-sessions-per-client", "1000",
        # This churn keeps one core busy by itself; refusing viewers for CPU (tested on its
        # own) would only hide what this test is about.
        "--max-cpu-percent", "1000",
    )
    base, pid = server.base, server.proc.pid
    publisher = PeerProcess("publish", base, STREAM, tmp_path / "publisher.log")
    try:
        await publisher.wait_event("connected", 30)
        offer = await viewer_offer()

        await churn(base, offer, 0, WARMUP)
        await settle(base, CONNECT_TIMEOUT_S + 15)
        await asyncio.sleep(1.0)
        fds0, rss0 = footprint(pid)
        tasks0 = metric(base, "sfu_sidecar_asyncio_tasks")

        started = time.monotonic()
        await churn(base, offer, WARMUP, CYCLES)
        churn_s = time.monotonic() - started
        peak_fds, peak_rss = footprint(pid)
        # Every dropped session goes within the connect timeout (plus a loaded machine's lag).
        reap_s = await settle(base, CONNECT_TIMEOUT_S + 15)
        await asyncio.sleep(1.0)
        fds1, rss1 = footprint(pid)
        tasks1 = metric(base, "sfu_sidecar_asyncio_tasks")

        total = WARMUP + CYCLES
        assert metric(base, "sfu_sidecar_relay_sessions_total", role="viewer") == total
        deleted = metric(base, "sfu_sidecar_relay_sessions_ended_total", role="viewer",
                         reason="deleted")
        timed_out = metric(base, "sfu_sidecar_relay_sessions_ended_total", role="viewer",
                           reason="connect_timeout")
        dropped = timed_out + metric(base, "sfu_sidecar_relay_sessions_ended_total",
                                     role="viewer", reason="disconnected")
        assert (deleted, dropped) == (total // 2, total // 2)
        status = await aget_json(f"{base}/api/streams/{STREAM}")
        assert status["publisher"] is not None, "the publisher was lost in the churn"
        print(f"{CYCLES} cycles in {churn_s:.1f} s; last dropped reaped {reap_s:.1f} s after; "
              f"fds {fds0} -> peak {peak_fds} -> {fds1}; tasks {tasks0:.0f} -> {tasks1:.0f}; "
              f"RSS {rss0 / 2**20:.1f} -> peak {peak_rss / 2**20:.1f} -> {rss1 / 2**20:.1f} MiB; "
              f"{timed_out:.0f} of the dropped ended by the connect timeout")
        assert fds1 <= fds0 + FD_SLACK
        assert tasks1 <= tasks0 + TASK_SLACK
        assert rss1 <= rss0 + RSS_SLACK_BYTES
    finally:
        publisher.stop()
