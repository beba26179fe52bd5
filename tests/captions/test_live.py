"""Live caption push over Server-Sent Events: the wire form of each event, and the route
against the real app: catch-up on connect, then each ingest and retraction as it happens,
the per-client limit, and the subscription freed when the viewer leaves."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from sfu_sidecar.captions.events import Cue, CueRetract, Epoch
from sfu_sidecar.captions.live import format_event
from tests.captions.helpers import Clock, Env, start_env


def test_each_event_is_one_sse_block_with_one_data_line() -> None:
    cue = Cue("s", "en", "c1", 1.5, 2.25, "two\nlines", True, "line:10%")
    assert format_event(cue) == (
        b'event: cue\ndata: {"lang":"en","id":"c1","start":1.5,"end":2.25,'
        b'"text":"two\\nlines","final":true,"settings":"line:10%"}\n\n')
    assert format_event(CueRetract("s", "en", "c1")) == (
        b'event: retract\ndata: {"lang":"en","id":"c1"}\n\n')
    assert format_event(Epoch("s", 17)) == b'event: epoch\ndata: {"epoch_ns":17}\n\n'


class EventReader:
    """The events of one SSE response, parsed as EventSource does (comments skipped)."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp

    async def next(self, timeout_s: float = 5.0) -> tuple[str, Any]:
        name, data = "message", ""
        while True:
            line = (await asyncio.wait_for(self.resp.content.readline(), timeout_s)).decode()
            assert line, "the stream ended"
            line = line.rstrip("\n")
            if line == "":
                if data:
                    return name, json.loads(data)
                continue
            if line.startswith(":") or line.startswith("retry:"):
                continue
            field, _, value = line.partition(": ")
            if field == "event":
                name = value
            elif field == "data":
                data += value


async def _cue(env: Env, cue_id: str, start: float) -> None:
    resp = await env.post("s", {"timebase": "stream_s", "lang": "en", "cues": [
        {"id": cue_id, "start": start, "end": start + 1, "text": cue_id}]})
    assert resp.status == 200, await resp.text()


async def test_catch_up_then_every_change_as_it_is_ingested(tmp_path: Path) -> None:
    env = await start_env(tmp_path, Clock())
    try:
        await _cue(env, "old", 1.0)  # fixes the epoch at T0
        env.clock.advance(30)
        await _cue(env, "recent", 25.0)  # shown from 10 s before now on: caught up
        resp = await env.client.get("/captions/s/live")
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream"
        assert resp.headers["Cache-Control"] == "no-cache"
        events = EventReader(resp)
        assert await events.next() == ("epoch", {"epoch_ns": env.service.epoch("s")})
        name, data = await events.next()
        assert (name, data["id"], data["start"]) == ("cue", "recent", 25.0)
        await _cue(env, "live", 31.0)
        name, data = await events.next()
        assert (name, data["id"], data["start"], data["end"], data["text"]) == (
            "cue", "live", 31.0, 32.0, "live")
        resp_del = await env.client.delete("/api/streams/s/captions/en/live",
                                           headers=env.auth())
        assert resp_del.status == 200
        assert await events.next() == ("retract", {"lang": "en", "id": "live"})
        resp.close()
        for _ in range(50):  # the handler sees the viewer gone at its next write
            await asyncio.sleep(0.02)
            await _cue(env, "after", 33.0)
            if env.service.events.subscriber_count == 0:  # type: ignore[attr-defined]
                break
        assert env.service.events.subscriber_count == 0  # type: ignore[attr-defined]
    finally:
        await env.client.close()


async def test_a_stream_without_captions_yet_gets_its_epoch_when_fixed(tmp_path: Path) -> None:
    env = await start_env(tmp_path, Clock())
    try:
        resp = await env.client.get("/captions/s/live")
        assert resp.status == 200
        events = EventReader(resp)
        await _cue(env, "first", 0.5)
        assert await events.next() == ("epoch", {"epoch_ns": env.service.epoch("s")})
        assert (await events.next())[1]["id"] == "first"
        resp.close()
    finally:
        await env.client.close()


async def test_live_streams_per_client_are_limited_and_names_checked(tmp_path: Path) -> None:
    env = await start_env(tmp_path, Clock(), max_sessions_per_client=2)
    try:
        held = [await env.client.get("/captions/s/live") for _ in range(2)]
        assert [r.status for r in held] == [200, 200]
        resp = await env.client.get("/captions/s/live")
        assert resp.status == 429 and "max_sessions_per_client" in (await resp.json())["error"]
        assert "Retry-After" in resp.headers
        held[0].close()
        for _ in range(100):
            await asyncio.sleep(0.02)
            await _cue(env, "c", 1.0)  # a write shows the handler its viewer is gone
            resp = await env.client.get("/captions/s/live")
            if resp.status == 200:
                break
        assert resp.status == 200
        resp.close()
        held[1].close()
        bad = await env.client.get("/captions/" + "x" * 300 + "/live")
        assert bad.status in (400, 404) and "error" in await bad.json()
    finally:
        await env.client.close()


async def test_open_streams_end_when_the_service_shuts_down(tmp_path: Path) -> None:
    env = await start_env(tmp_path, Clock())
    resp = await env.client.get("/captions/s/live")
    assert resp.status == 200
    await asyncio.wait_for(env.client.close(), 5)  # not the 60 s aiohttp waits for handlers
    assert env.service.events.subscriber_count == 0  # type: ignore[attr-defined]


async def test_head_answers_the_headers_without_holding_a_stream(tmp_path: Path) -> None:
    env = await start_env(tmp_path, Clock())
    try:
        resp = await asyncio.wait_for(env.client.head("/captions/s/live"), 5)
        assert resp.status == 200 and resp.headers["Content-Type"] == "text/event-stream"
        assert env.service.events.subscriber_count == 0  # type: ignore[attr-defined]
    finally:
        await env.client.close()
