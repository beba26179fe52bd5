"""The stream directory in Redis: two ``sfu-sidecar serve`` nodes on one real redis-server.

The publisher publishes to node A; a viewer asks node B, which has no origin_url: B finds A in
the directory and pulls the stream from it, with capture times exact across the hop. The entry
goes when the publisher does, and expires when its node dies without a word.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import redis

from sfu_sidecar.relay.redis_directory import PREFIX, TTL_S
from tests.captions.test_caption_redis import RedisServer
from tests.relay.peers import view, wait_for
from tests.relay.test_cascade import Node, capture_errors
from tests.syncchannel.test_service import _mid, collect, decoded_frames, start_publisher

pytestmark = [pytest.mark.needs("redis-server"), pytest.mark.timeout(150)]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[RedisServer, Node, Node]]:
    server = RedisServer(tmp_path / "redis")
    nodes = []
    for name in ("a", "b"):
        node = Node(tmp_path / name, node_id=name, redis_url=server.url)
        node.env["advertise_url"] = node.base
        nodes.append(node)
    try:
        for node in nodes:
            node.start()
        yield server, nodes[0], nodes[1]
    finally:
        for node in nodes:
            node.stop()
        server.kill()


def entry(server: RedisServer, stream: str) -> dict[str, str] | None:
    client = redis.Redis(port=server.port, socket_timeout=1)
    try:
        raw = client.get(PREFIX + stream)
    finally:
        client.close()
    return None if raw is None else dict(json.loads(raw))


async def test_any_node_serves_a_stream_published_on_another(
    cluster: tuple[RedisServer, Node, Node],
) -> None:
    server, a, b = cluster
    stream = "dir"
    publisher, video, _ = await start_publisher(a.base, stream, stamp=True)
    async with aiohttp.ClientSession() as http:
        await wait_for(lambda: entry(server, stream) is not None, 5, "A listing the stream")
        assert entry(server, stream) == {"node": "a", "url": a.base}
        viewer = await view(http, b.base, stream, data_channel="sync")
        records = collect(viewer)
        try:
            assert await publisher.joined() is not None
            frames = await decoded_frames(viewer, 60)
            track = records.track_for(_mid(viewer, "video"))
            await wait_for(lambda: records.frame(track, frames[-1][1]) is not None, 3,
                           "the record of the last decoded frame")
            errors, unmapped, estimated = capture_errors(records, viewer, video, frames)
            assert unmapped == 0 and estimated == 0, (unmapped, estimated)
            assert max(errors) <= 1_000_000, sorted(errors)[-3:]
            async with http.get(f"{b.base}/api/streams/{stream}") as resp:
                status = await resp.json()
            assert status["publisher"]["upstream"] == f"{a.base}/whep/{stream}"
            # B pulls; it does not list itself as the stream's origin.
            assert entry(server, stream) == {"node": "a", "url": a.base}
        finally:
            await viewer.close()
            await publisher.close()
        # The publisher's DELETE unlists the stream at once.
        await wait_for(lambda: entry(server, stream) is None, 5, "the entry removed")


async def test_a_viewer_waiting_on_b_gets_the_stream_when_a_publishes_and_entries_expire(
    cluster: tuple[RedisServer, Node, Node],
) -> None:
    server, a, b = cluster
    stream = "later"
    async with aiohttp.ClientSession() as http:
        # Nobody publishes yet: the viewer on B waits, as on a single node.
        viewer = await view(http, b.base, stream, kinds=("video",))
        publisher = None
        try:
            publisher, _, _ = await start_publisher(a.base, stream, stamp=True)
            await wait_for(lambda: len(viewer.received) > 0, 10, "B pulling once A publishes")
            frame = await asyncio.wait_for(viewer.tracks["video"].recv(), 10)
            assert frame is not None
            # A dies without a word: its entry expires within the TTL.
            a.kill()
            started = time.monotonic()
            await wait_for(lambda: entry(server, stream) is None, TTL_S + 3, "the entry expired")
            assert time.monotonic() - started <= TTL_S + 3
        finally:
            await viewer.close()
            if publisher is not None:
                await publisher.close()


async def test_redis_away_media_keeps_flowing_and_listing_recovers(
    cluster: tuple[RedisServer, Node, Node],
) -> None:
    server, a, b = cluster
    async with aiohttp.ClientSession() as http:
        first, _, _ = await start_publisher(a.base, "one", stamp=True)
        await wait_for(lambda: entry(server, "one") is not None, 5, "A listing the stream")
        watching = await view(http, b.base, "one", kinds=("video",))
        second = None
        waiting = None
        try:
            await wait_for(lambda: len(watching.received) > 0, 10, "B pulling from A")
            await asyncio.wait_for(watching.tracks["video"].recv(), 10)
            server.kill()
            # Media never waits on Redis: the pull B runs goes on.
            before = len(watching.received)
            await asyncio.sleep(2)
            assert len(watching.received) > before + 60
            # Published while Redis is away: B cannot find it yet, its viewer waits.
            second, _, _ = await start_publisher(a.base, "two", stamp=True)
            waiting = await view(http, b.base, "two", kinds=("video",))
            await asyncio.sleep(1)
            assert not waiting.received
            server.start()
            # A lists "two" at its next heartbeat; B's watch pulls it for the waiting viewer.
            await wait_for(lambda: entry(server, "two") is not None, 8, "A listing again")
            await wait_for(lambda: len(waiting.received) > 0, 10, "the waiting viewer served")
            await asyncio.wait_for(waiting.tracks["video"].recv(), 10)
        finally:
            for peer in (watching, waiting):
                if peer is not None:
                    await peer.close()
            for pub in (first, second):
                if pub is not None:
                    await pub.close()
