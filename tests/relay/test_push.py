"""Push: node A forwards a stream to node B's WHIP endpoint, real ``sfu-sidecar serve`` processes.

The publisher (the synthetic source, every frame's capture instant known and its number in its
pixels) publishes to A; A pushes the stream to B (``/whip/<stream>``); a viewer on B decodes
frames and checks the capture time B's sync records give for each: B maps the abs-capture-time
A writes (A's house time) with the offset the push measured when it joined B's clock.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sfu_sidecar.config import load_settings
from sfu_sidecar.exceptions import ConfigError
from sfu_sidecar.relay.push import RETRY_FIRST_S, RETRY_MAX_S, Pushes, PushSession
from sfu_sidecar.relay.streams import Streams
from tests.conftest import free_port
from tests.relay.peers import view, wait_for
from tests.relay.test_cascade import TOLERANCE_NS, Node, capture_errors
from tests.syncchannel.test_service import _mid, collect, decoded_frames, start_publisher

pytestmark = pytest.mark.timeout(150)


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[Node, Node]]:
    a = Node(tmp_path / "a", node_id="a")
    b = Node(tmp_path / "b", node_id="b")
    a.start()
    b.start()
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


async def get_json(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with http.get(url) as resp:
        return resp.status, await resp.json()


async def until(check: Callable[[], Awaitable[bool]], limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {limit_s} s waiting for {what}")


async def b_has_publisher(http: aiohttp.ClientSession, b: Node, stream: str) -> bool:
    status, doc = await get_json(http, f"{b.base}/api/streams/{stream}")
    return status == 200 and doc["publisher"] is not None


async def check_capture_times(http: aiohttp.ClientSession, b: Node, stream: str,
                              video: Any, count: int) -> list[int]:
    """A viewer with a sync channel on B: |mapped - true| capture time of ``count`` frames."""
    viewer = await view(http, b.base, stream, data_channel="sync")
    records = collect(viewer)
    try:
        frames = await decoded_frames(viewer, count)
        track = records.track_for(_mid(viewer, "video"))
        await wait_for(lambda: records.frame(track, frames[-1][1]) is not None, 3,
                       "the record of the last decoded frame")
        errors, unmapped, estimated = capture_errors(records, viewer, video, frames)
        assert unmapped == 0, b.log()
        # The push joined B's clock: B maps A's stamps exactly, nothing is estimated.
        assert estimated == 0, estimated
        assert len(errors) == count and max(errors) <= TOLERANCE_NS, sorted(errors)[-5:]
        return errors
    finally:
        await viewer.close()


async def test_push_carries_capture_times_to_another_sidecar(
    nodes: tuple[Node, Node],
) -> None:
    a, b = nodes
    stream = "pushed"
    publisher, video, _ = await start_publisher(a.base, stream, stamp=True)
    async with aiohttp.ClientSession() as http:
        try:
            assert await publisher.joined() is not None
            body = {"stream": stream, "url": f"{b.base}/whip/{stream}"}
            async with http.post(f"{a.base}/api/pushes", json=body) as resp:
                created = await resp.json()
                assert resp.status == 201, created
                location = resp.headers["Location"]
            assert location == f"/api/pushes/{created['id']}"
            assert created["token"] is None and created["stream"] == stream

            async def joined() -> bool:
                _, doc = await get_json(http, a.base + location)
                session = doc["session"]
                return (doc["state"] == "connected" and session is not None
                        and session["clock"] is not None)

            await until(joined, 15, "the push connected and joined B's clock")
            await until(lambda: b_has_publisher(http, b, stream), 5, "B's publisher")

            errors = await check_capture_times(http, b, stream, video, 60)
            print(f"push: capture error max {max(errors) / 1e3:.1f} us over {len(errors)} "
                  "frames on B")

            _, listing = await get_json(http, f"{a.base}/api/pushes")
            [push] = listing["pushes"]
            assert push["state"] == "connected" and push["attempts"] == 1, push
            clock = push["session"]["clock"]
            assert clock["error_ns"] < 5_000_000, clock  # same host: a sub-ms round trip
            assert {t["kind"] for t in push["session"]["tracks"]} == {"audio", "video"}
            assert all(t["packets_sent"] > 0 for t in push["session"]["tracks"]), push
            _, on_b = await get_json(http, f"{b.base}/api/streams/{stream}")
            assert {t["kind"] for t in on_b["publisher"]["tracks"]} == {"audio", "video"}
            assert all(t["packets"] > 0 for t in on_b["publisher"]["tracks"]), on_b
            async with http.get(f"{a.base}/metrics") as resp:
                text = await resp.text()
            assert 'sfu_sidecar_relay_pushes{state="connected"} 1.0' in text
        finally:
            await publisher.close()


async def test_push_from_settings_reconnects_after_the_remote_restarts(
    tmp_path: Path,
) -> None:
    stream = "again"
    b = Node(tmp_path / "b", free_port(), node_id="b")
    # Set before A starts, before the stream exists: the push waits for its publisher. A
    # short consent timeout: A notices the dead B within 3 s.
    a = Node(tmp_path / "a", node_id="a", push_targets=f"{stream}={b.base}/whip/{stream}",
             ice_consent_timeout_s="3")
    b.start()
    a.start()
    publisher = None
    try:
        async with aiohttp.ClientSession() as http:
            _, listing = await get_json(http, f"{a.base}/api/pushes")
            [push] = listing["pushes"]
            assert push["source"] == "settings" and push["state"] == "waiting", push
            push_url = f"{a.base}/api/pushes/{push['id']}"

            publisher, video, _ = await start_publisher(a.base, stream, stamp=True)
            assert await publisher.joined() is not None

            async def state(wanted: str, attempts: int = 1) -> bool:
                _, doc = await get_json(http, push_url)
                return bool(doc["state"] == wanted and doc["attempts"] >= attempts
                            and doc["session"] is not None
                            and doc["session"]["clock"] is not None)

            await until(lambda: state("connected"), 15, "the configured push connected")
            await check_capture_times(http, b, stream, video, 30)

            b.kill()
            b.start()  # the same port, nothing of the old process left
            await until(lambda: state("connected", 2), 30, "the push reconnected by itself")
            _, doc = await get_json(http, push_url)
            assert doc["last_error"], doc  # why the first session ended, or a later try
            await until(lambda: b_has_publisher(http, b, stream), 5, "B's publisher again")
            errors = await check_capture_times(http, b, stream, video, 30)
            print(f"push after B restarted: attempts {doc['attempts']}, capture error max "
                  f"{max(errors) / 1e3:.1f} us over {len(errors)} frames")
    finally:
        if publisher is not None:
            await publisher.close()
        a.stop()
        b.stop()


async def test_push_input_is_checked_and_delete_ends_it(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    stream = "checked"
    api = f"{a.base}/api/pushes"
    target = f"{b.base}/whip/{stream}"
    async with aiohttp.ClientSession() as http:
        for body, status, words in [
            ({"stream": stream, "url": target}, 404, "no stream"),  # nothing published yet
            ({"stream": stream, "url": target, "to": "x"}, 400, "unknown field"),
            ({"stream": stream, "url": "ftp://host/whip"}, 422, "http(s)"),
            ({"stream": stream, "url": "/whip/x"}, 422, "http(s)"),
            ({"stream": stream, "url": 5}, 400, "url"),
            ({"stream": "no/slash", "url": target}, 400, "stream"),
            ({"stream": stream, "url": target, "token": "a b"}, 400, "token"),
            ([], 400, "object"),
        ]:
            async with http.post(api, json=body) as resp:
                text = await resp.text()
                assert resp.status == status, (body, text)
                assert words in text, (body, text)
        async with http.post(api, data="{", headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400 and "JSON" in await r.text()
        async with http.post(api, data="x", headers={"Content-Type": "text/plain"}) as r:
            assert r.status == 415
        async with http.get(f"{api}/{'0' * 32}") as r:
            assert r.status == 404
        async with http.delete(f"{api}/{'0' * 32}") as r:
            assert r.status == 404

        publisher, _, _ = await start_publisher(a.base, stream, stamp=True)
        try:
            body = {"stream": stream, "url": target, "token": "s3cret-token"}
            async with http.post(api, json=body) as resp:
                text = await resp.text()
                assert resp.status == 201, text
                assert "s3cret" not in text
                created = await resp.json()
            assert created["token"] == "***"
            async with http.post(api, json=body) as resp:
                assert resp.status == 409, await resp.text()
            _, listing = await get_json(http, api)
            assert "s3cret" not in str(listing)
            await until(lambda: b_has_publisher(http, b, stream), 15, "B's publisher")

            async with http.delete(f"{api}/{created['id']}") as resp:
                deleted = await resp.json()
                assert resp.status == 200, deleted
            assert deleted["state"] == "stopped", deleted

            async def b_lost_it() -> bool:
                return not await b_has_publisher(http, b, stream)

            # DELETE reached B at once, not after a consent timeout.
            await until(b_lost_it, 3, "B's stream losing its publisher")
            _, listing = await get_json(http, api)
            assert listing["pushes"] == []
        finally:
            await publisher.close()


async def test_failed_attempts_back_off_exponentially() -> None:
    """The delays between failed attempts, with the waiting itself replaced (no wall clock)."""
    streams = Streams()
    stream = streams.get_or_create("s")
    stream.codecs["video"] = object()  # type: ignore[assignment]

    class Live:
        closed = asyncio.Event()

    stream.publisher = Live()  # type: ignore[assignment]
    delays: list[float] = []

    async def sleep(seconds: float) -> None:
        delays.append(seconds)
        await asyncio.sleep(0)

    async def refuse(stream: str, url: str, token: str | None) -> PushSession:
        raise ConnectionRefusedError("refused")

    pushes = Pushes(streams, refuse, sleep)
    push = pushes.add("s", "http://127.0.0.1:9/whip/s", None)
    await wait_for(lambda: push.attempts >= 10, 5, "ten attempts")
    await pushes.remove(push.id)
    first = delays[:9]
    assert first[0] == RETRY_FIRST_S
    assert all(b == min(a * 2, RETRY_MAX_S) for a, b in itertools.pairwise(first))
    assert max(delays) == RETRY_MAX_S
    assert push.last_error == "refused" and push.state == "stopped"


def test_push_targets_setting_is_checked() -> None:
    settings = load_settings({"push_targets": "a=https://x.example/whip/a, b=http://h:1/w"})
    assert [str(t) for t in settings.push_targets] == ["a=https://x.example/whip/a",
                                                       "b=http://h:1/w"]
    for bad in ("a", "a=ftp://x/y", "a b=http://x/", "a=http://x/,a=http://x/"):
        with pytest.raises(ConfigError, match="push-targets"):
            load_settings({"push_targets": bad})
