"""Caption routes' limits and who may ingest: cue counts and rates, socket rates and sizes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from sfu_sidecar.httpapi import METRICS_KEY
from tests.captions.helpers import TOKEN, Clock, Env, start_env


def cues(*starts: int) -> dict[str, Any]:
    return {"timebase": "stream_s", "lang": "en",
            "cues": [{"id": f"c{s}", "start": s, "end": s + 1, "text": f"t{s}"} for s in starts]}


async def stored(env: Env, stream: str) -> list[str]:
    resp = await env.client.get(f"/api/streams/{stream}/captions")
    return [c["id"] for c in (await resp.json())["cues"]]


def metrics_text(env: Env) -> str:
    return env.client.server.app[METRICS_KEY].render().decode()


def limited(env: Env, limit: str) -> str:
    prefix = f'sfu_sidecar_requests_limited_total{{limit="{limit}"}} '
    return next((line.removeprefix(prefix) for line in metrics_text(env).splitlines()
                 if line.startswith(prefix)), "0")


async def test_too_many_cues_in_one_request_name_the_setting(tmp_path: Path) -> None:
    env = await start_env(tmp_path, Clock(), max_cues_per_request=3)
    try:
        resp = await env.post("s", cues(1, 2, 3, 4))
        assert resp.status == 413
        assert "max_cues_per_request" in (await resp.json())["error"]
        vtt = "WEBVTT\n\n" + "".join(f"00:00:0{i}.000 --> 00:00:0{i}.500\nline {i}\n\n"
                                     for i in range(4))
        resp = await env.client.post("/api/streams/s/captions?lang=en", data=vtt,
                                     headers={**env.auth(), "Content-Type": "text/vtt"})
        assert resp.status == 413
        assert (await env.post("s", cues(1, 2, 3))).status == 200
    finally:
        await env.client.close()


async def test_cue_rate_per_stream_answers_429_with_retry_after_and_stores_nothing(
    tmp_path: Path,
) -> None:
    # A bucket of two cues that refills once in a hundred seconds: no test is that slow.
    env = await start_env(tmp_path, Clock(), max_cues_per_request=2, max_cues_per_s=0.01)
    try:
        assert (await env.post("s", cues(1, 2))).status == 200
        resp = await env.post("s", cues(3))
        assert resp.status == 429
        assert int(resp.headers["Retry-After"]) >= 60
        assert "max_cues_per_s" in (await resp.json())["error"]
        assert await stored(env, "s") == ["c1", "c2"]
        assert limited(env, "max_cues_per_s") == "1.0"
        # Another stream has its own budget.
        assert (await env.post("t", cues(3))).status == 200
    finally:
        await env.client.close()


async def test_websocket_over_its_rate_is_answered_429_then_closed_1008(tmp_path: Path) -> None:
    env = await start_env(tmp_path, Clock(), ws_messages_per_s=0.01)
    try:
        async with env.client.ws_connect("/api/streams/w/captions/ws",
                                         headers=env.auth()) as ws:
            await ws.send_str(json.dumps({**cues(1), "ref": 1}))
            assert (await ws.receive_json())["ok"] is True
            replies = []
            for ref in range(2, 20):
                await ws.send_str(json.dumps({**cues(ref), "ref": ref}))
                msg = await ws.receive()
                if msg.type != aiohttp.WSMsgType.TEXT:
                    break
                replies.append(json.loads(msg.data))
            assert msg.type == aiohttp.WSMsgType.CLOSE
            assert ws.close_code == 1008
        assert replies and all(r["ok"] is False and r["status"] == 429 for r in replies)
        assert [r["ref"] for r in replies] == list(range(2, 2 + len(replies)))
        assert all("ws_messages_per_s" in r["error"] and r["retry_after"] >= 1
                   for r in replies)
        assert await stored(env, "w") == ["c1"]
        text = metrics_text(env)
        assert f'messages_dropped_total{{channel="caption_ws"}} {len(replies) + 1:.1f}' in text
    finally:
        await env.client.close()


async def test_websocket_message_over_its_size_closes_the_socket(tmp_path: Path) -> None:
    env = await start_env(tmp_path, Clock(), ws_max_message_bytes=1024)
    try:
        async with env.client.ws_connect("/api/streams/w/captions/ws",
                                         headers=env.auth()) as ws:
            big = cues(1)
            big["cues"][0]["text"] = "x" * 1500
            await ws.send_str(json.dumps(big))
            msg = await ws.receive()
            assert msg.type == aiohttp.WSMsgType.CLOSE
            assert ws.close_code == 1009  # RFC 6455 7.4.1: message too big
        assert await stored(env, "w") == []
    finally:
        await env.client.close()


async def test_ingest_without_a_token_is_for_this_host_only_unless_opened(
    tmp_path: Path,
) -> None:
    proxied = {"X-Forwarded-For": "203.0.113.9"}
    env = await start_env(tmp_path / "closed", Clock(), publish_token=None)
    try:
        resp = await env.client.post("/api/streams/s/captions", json=cues(1), headers=proxied)
        assert resp.status == 403
        reason = (await resp.json())["error"]
        assert "publish_token" in reason and "open_ingest" in reason
        resp = await env.client.delete("/api/streams/s/captions/en/c1", headers=proxied)
        assert resp.status == 403
        resp = await env.client.get("/api/streams/s/captions/ws", headers={
            **proxied, "Upgrade": "websocket", "Connection": "Upgrade",
            "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        })
        assert resp.status == 403
        # Reading stays open to everyone; this host itself ingests without a token.
        assert (await env.client.get("/api/streams/s/captions", headers=proxied)).status == 200
        assert (await env.client.post("/api/streams/s/captions", json=cues(1))).status == 200
    finally:
        await env.client.close()
    env = await start_env(tmp_path / "open", Clock(), publish_token=None, open_ingest=True)
    try:
        resp = await env.client.post("/api/streams/s/captions", json=cues(1), headers=proxied)
        assert resp.status == 200
    finally:
        await env.client.close()


async def test_a_token_once_set_is_required_even_from_this_host(tmp_path: Path) -> None:
    env = await start_env(tmp_path, Clock())
    try:
        resp = await env.client.post("/api/streams/s/captions", json=cues(1))
        assert resp.status == 401
        resp = await env.client.post("/api/streams/s/captions", json=cues(1),
                                     headers={"Authorization": f"Bearer {TOKEN}x"})
        assert resp.status == 401
    finally:
        await env.client.close()
