"""WebSocket push ingest with the Python publisher client, msgpack and JSON."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import websockets

from sfu_sidecar.captions.events import Cue, CueRetract
from sfu_sidecar.client.captions import CaptionPublisher, CaptionRejected
from tests.captions.helpers import T0, TOKEN, Clock, Env, start_env


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    e = await start_env(tmp_path / "data", Clock())
    yield e
    await e.client.close()


def base(env: Env) -> str:
    return str(env.client.make_url("/")).rstrip("/")


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
async def test_push_update_retract(env: Env, encoding: str) -> None:
    sub = env.service.events.subscribe("live")
    async with CaptionPublisher(base(env), "live", token=TOKEN, encoding=encoding) as pub:
        ids = await pub.send("en", [{"id": "w1", "start": 0.0, "end": 1.0, "text": "hel",
                                     "final": False}])
        assert ids == ["w1"]
        # Several messages in flight at once, answered by ref.
        many = await asyncio.gather(
            *[pub.send("en", [{"start": i, "end": i + 0.5, "text": f"n{i}"}]) for i in range(20)]
        )
        assert len({i[0] for i in many}) == 20
        await pub.send("en", [{"id": "w1", "start": 0.0, "end": 1.2, "text": "hello"}])
        assert await pub.retract("en", "w1") is True
        with pytest.raises(CaptionRejected) as info:
            await pub.send("en", [{"id": "bad", "start": 2, "end": 1, "text": "x"}])
        assert info.value.status == 422 and "end must be after start" in info.value.reason
        with pytest.raises(CaptionRejected) as info:
            await pub.retract("en", "never")
        assert info.value.status == 404
        # The connection survives rejected messages.
        assert await pub.send("fr", [{"id": "f", "start": 3, "end": 4, "text": "salut"}]) == ["f"]
    events = []
    while not sub._queue.empty():  # type: ignore[attr-defined]
        events.append(await sub.get())
    cue_events = [e for e in events if isinstance(e, Cue) and e.id == "w1"]
    assert [(e.text, e.final) for e in cue_events] == [("hel", False), ("hello", True)]
    assert CueRetract("live", "en", "w1") in events
    sub.close()


async def test_malformed_messages_get_error_replies(env: Env) -> None:
    url = base(env).replace("http", "ws") + "/api/streams/raw/captions/ws"
    async with websockets.connect(
        url, additional_headers={"Authorization": f"Bearer {TOKEN}"}
    ) as ws:
        await ws.send("{nope")
        reply = await ws.recv()
        assert '"ok": false' in str(reply) and "malformed JSON" in str(reply)
        await ws.send(b"\xc1")  # never-used msgpack byte
        import msgpack

        decoded = msgpack.unpackb(await ws.recv())
        assert decoded["ok"] is False and decoded["status"] == 400
        await ws.send('{"op": "dance", "ref": 7}')
        assert '"ref": 7' in str(await ws.recv())


async def test_wrong_token_is_refused_at_handshake(env: Env) -> None:
    with pytest.raises(websockets.InvalidStatus) as info:
        async with CaptionPublisher(base(env), "live", token="wrong"):
            pass
    assert info.value.response.status_code == 401


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
async def test_the_client_sends_word_times_and_interrupts_the_speaker(
    env: Env, encoding: str,
) -> None:
    t0 = T0 + 1_000_000_000
    said = [{"start": t0 + i * 250_000_000, "text": w}
            for i, w in enumerate(["we", "now", "turn", "to", "the", "weather"])]
    async with CaptionPublisher(base(env), "tts", token=TOKEN, encoding=encoding) as pub:
        assert await pub.send("en", [{"id": "u1", "start": t0, "end": t0 + 1_500_000_000,
                                      "words": said},
                                     {"id": "u2", "start": t0 + 2_000_000_000,
                                      "end": t0 + 3_000_000_000, "text": "Sunny."}],
                              timebase="house_ns") == ["u1", "u2"]
        env.clock.advance(2)
        done = await pub.interrupt("en", t0 + 800_000_000)  # during "to" (750..1000 ms)
        assert (done["retracted"], done["cut"], done["at"]) == (["u2"], ["u1"], 0.8)
        with pytest.raises(CaptionRejected) as info:
            await pub.interrupt("en", t0 + 60_000_000_000)
        assert info.value.status == 422 and "after now" in info.value.reason
    cue = env.service.cues_between("tts", "en", 0, 10_000)
    assert [(c.id, c.end_ms, c.text, c.deleted) for c in cue] == [
        ("u1", 800, "we <00:00:00.250>now <00:00:00.500>turn <00:00:00.750>to", False)]
