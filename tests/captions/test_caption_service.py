"""Caption ingest, storage and delivery through the real HTTP app (in process, real SQLite)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sfu_sidecar.captions import webvtt
from sfu_sidecar.captions.chunks import CLOSE_GRACE_MS
from sfu_sidecar.captions.events import Cue, CueRetract, Epoch
from tests.captions.helpers import T0, Clock, Env, start_env


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    e = await start_env(tmp_path / "data", Clock())
    yield e
    await e.client.close()


def cue(i: str, start: float, end: float, text: str = "x", **kw: Any) -> dict[str, Any]:
    return {"id": i, "start": start, "end": end, "text": text, **kw}


def stream_doc(*cues: dict[str, Any], lang: str = "en") -> dict[str, Any]:
    return {"timebase": "stream_s", "lang": lang, "cues": list(cues)}


def vtt_header(body: str) -> list[str]:
    return body.split("\n\n", 1)[0].split("\n")


async def get_vtt(env: Env, path: str) -> tuple[int, webvtt.ParseResult | None, Any]:
    resp = await env.client.get(path)
    body = await resp.read()
    if resp.status != 200:
        return resp.status, None, resp
    return resp.status, webvtt.parse(body), resp


# --- ingest --------------------------------------------------------------------------------------


async def test_post_then_chunk_has_the_cue(env: Env) -> None:
    resp = await env.post("s1", stream_doc(cue("a", 0.5, 1.5, "hello")))
    assert resp.status == 200, await resp.text()
    doc = await resp.json()
    assert doc["ids"] == ["a"]
    assert doc["cues"][0]["result"] == "new"
    env.clock.advance(1.0)
    status, parsed, raw = await get_vtt(env, "/captions/s1/en/chunk-0.vtt")
    assert status == 200 and parsed is not None
    assert [(c.id, c.start, c.end, c.text) for c in parsed.cues] == [("a", 0.5, 1.5, "hello")]
    assert raw.headers["Cache-Control"] == "no-cache"
    assert raw.headers["Content-Type"].startswith("text/vtt")
    epoch = env.service.epoch("s1")
    # Stream time cues before media: "now" minus the first start fixes the epoch.
    assert epoch == T0 - 500_000_000
    assert raw.headers["X-Stream-Epoch-Ns"] == str(epoch)
    header = vtt_header(await raw.text())
    assert header == [
        "WEBVTT", "X-TIMESTAMP-MAP=MPEGTS:0,LOCAL:00:00:00.000", f"X-STREAM-EPOCH-NS={epoch}"
    ]


async def test_ids_are_generated_when_missing(env: Env) -> None:
    resp = await env.post("s1", stream_doc({"start": 0, "end": 1, "text": "a"},
                                           {"start": 1, "end": 2, "text": "b"}))
    ids = (await resp.json())["ids"]
    assert len(set(ids)) == 2 and all(i.startswith("auto-") for i in ids)
    resp = await env.post("s1", stream_doc(cue("auto-1", 0, 1)))
    assert resp.status == 422 and "reserved" in (await resp.json())["error"]


async def test_vtt_body_ingest(env: Env) -> None:
    body = "WEBVTT\n\nq1\n00:00:01.000 --> 00:00:02.000 align:start line:0\nfrom a file\n\n" \
           "00:00:02.000 --> 00:00:03.000\nno id\n"
    resp = await env.client.post(
        "/api/streams/s2/captions?lang=de", data=body.encode(),
        headers={**env.auth(), "Content-Type": "text/vtt"},
    )
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["ids"][0] == "q1"
    env.clock.advance(5)
    _, parsed, _ = await get_vtt(env, "/captions/s2/de.vtt?start=0&end=10")
    assert parsed is not None
    assert parsed.cues[0].id == "q1" and parsed.cues[0].align == "start"
    assert parsed.cues[0].line == 0
    assert parsed.cues[1].text == "no id"


async def test_json_cue_settings_are_stored_served_and_pushed(env: Env) -> None:
    sub = env.service.events.subscribe("st")
    resp = await env.post("st", stream_doc(
        cue("p", 1, 2, settings="align:end  line:-2,center position:30%"),
        cue("d", 2, 3, settings="align:center")))
    assert resp.status == 200, await resp.text()
    got = [await asyncio.wait_for(sub.get(), 1) for _ in range(3)]
    # Stored in WebVTT's order with defaults left out, as from a text/vtt body.
    assert got[1] == Cue("st", "en", "p", 1.0, 2.0, "x", True,
                         "line:-2,center position:30% align:end")
    assert got[2] == Cue("st", "en", "d", 2.0, 3.0, "x", True)
    feed = await (await env.client.get("/api/streams/st/captions")).json()
    assert [c.get("settings") for c in feed["cues"]] == [
        "line:-2,center position:30% align:end", None]
    env.clock.advance(5)
    _, parsed, _ = await get_vtt(env, "/captions/st/en.vtt?start=0&end=10")
    assert parsed is not None
    placed = parsed.cues[0]
    assert (placed.line, placed.line_align, placed.position, placed.align) == (
        -2, "center", 30, "end")
    sub.close()


async def test_update_interim_to_final_and_events(env: Env) -> None:
    sub = env.service.events.subscribe("s1")
    await env.post("s1", stream_doc(cue("u", 1, 2, "helo", final=False)))
    r2 = await env.post("s1", stream_doc(cue("u", 1, 2.5, "hello", final=True)))
    assert (await r2.json())["cues"][0]["result"] == "updated"
    # Same again: idempotent, no write, no event.
    r3 = await env.post("s1", stream_doc(cue("u", 1, 2.5, "hello", final=True)))
    assert (await r3.json())["cues"][0]["result"] == "unchanged"
    # An interim arriving after the final (reordered delivery) is ignored.
    r4 = await env.post("s1", stream_doc(cue("u", 1, 2, "hel", final=False)))
    assert (await r4.json())["cues"][0]["result"] == "stale"
    resp = await env.client.delete("/api/streams/s1/captions/en/u", headers=env.auth())
    assert (await resp.json())["retracted"] is True
    got = [await asyncio.wait_for(sub.get(), 1) for _ in range(4)]
    assert isinstance(got[0], Epoch)
    assert got[1] == Cue("s1", "en", "u", 1.0, 2.0, "helo", False)
    assert got[2] == Cue("s1", "en", "u", 1.0, 2.5, "hello", True)
    assert got[3] == CueRetract("s1", "en", "u")
    assert sub._queue.empty()  # type: ignore[attr-defined]
    sub.close()


async def test_a_mirrored_cue_keeps_its_settings_as_this_node_would_store_them(
    env: Env,
) -> None:
    """An upstream's cue event stores here with its placement; settings are parsed again as
    WebVTT does (a bad one dropped, the region gone), and the live event carries the result."""
    sub = env.service.events.subscribe("m")
    env.service.follow_epoch("m", T0)
    await env.service.mirror(Cue("m", "en", "p", 1.0, 2.0, "placed", True,
                                 "region:r1 line:10% bogus:1 size:x align:end"))
    await env.service.mirror(Cue("m", "en", "q", 2.0, 3.0, "plain", True))
    got = [await asyncio.wait_for(sub.get(), 1) for _ in range(3)]
    assert isinstance(got[0], Epoch)
    assert got[1] == Cue("m", "en", "p", 1.0, 2.0, "placed", True, "line:10% align:end")
    assert got[2] == Cue("m", "en", "q", 2.0, 3.0, "plain", True)
    env.clock.advance(5)
    _, parsed, _ = await get_vtt(env, "/captions/m/en.vtt?start=0&end=10")
    assert parsed is not None
    assert (parsed.cues[0].line, parsed.cues[0].snap_to_lines, parsed.cues[0].align) == (
        10, False, "end")
    assert parsed.cues[1].line is None
    sub.close()


async def test_snapshot_for_late_joiners(env: Env) -> None:
    await env.post("j", stream_doc(cue("a", 0, 1), cue("b", 5, 6)))
    await env.post("j", stream_doc(cue("x", 0.5, 2, "salut"), lang="fr"))
    got = env.service.snapshot("j", 0.9, 5)
    assert [(c.lang, c.id) for c in got] == [("en", "a"), ("fr", "x")]
    assert got[1] == Cue("j", "fr", "x", 0.5, 2.0, "salut", True)


async def test_retraction(env: Env) -> None:
    await env.post("s1", stream_doc(cue("a", 0, 1), cue("b", 0.5, 1.5)))
    env.clock.advance(1)
    resp = await env.client.delete("/api/streams/s1/captions/en/a", headers=env.auth())
    assert resp.status == 200
    _, parsed, _ = await get_vtt(env, "/captions/s1/en/chunk-0.vtt")
    assert parsed is not None and [c.id for c in parsed.cues] == ["b"]
    again = await env.client.delete("/api/streams/s1/captions/en/a", headers=env.auth())
    assert (await again.json())["retracted"] is False
    missing = await env.client.delete("/api/streams/s1/captions/en/zz", headers=env.auth())
    assert missing.status == 404
    noauth = await env.client.delete("/api/streams/s1/captions/en/b")
    assert noauth.status == 401
    # A retracted id can come back.
    await env.post("s1", stream_doc(cue("a", 0, 1, "back")))
    _, parsed, _ = await get_vtt(env, "/captions/s1/en/chunk-0.vtt")
    assert parsed is not None and sorted(c.id for c in parsed.cues) == ["a", "b"]


async def test_house_time_ingest_and_epoch_rules(env: Env) -> None:
    sub = env.service.events.subscribe()
    t = T0 + 5 * 10**9
    doc = {"timebase": "house_ns", "lang": "en",
           "cues": [{"id": "h1", "start": t + 10**9, "end": t + 2 * 10**9, "text": "b"},
                    {"id": "h0", "start": t, "end": t + 10**9 + 1_400_000, "text": "a"}]}
    resp = await env.post("h", doc)
    assert resp.status == 200, await resp.text()
    assert env.service.epoch("h") == t  # the earliest cue of the first batch
    # Media arriving later does not move it: the relay adopts the caption epoch.
    assert env.service.fix_epoch("h", t - 7) == t
    feed = await (await env.client.get("/api/streams/h/captions")).json()
    times = {c["id"]: (c["start"], c["end"]) for c in feed["cues"]}
    assert times == {"h0": (0.0, 1.001), "h1": (1.0, 2.0)}
    early = dict(doc, cues=[{"id": "e", "start": t - 10**9, "end": t - 10**6, "text": "x"}])
    resp = await env.post("h", early)
    assert resp.status == 422 and "before the stream epoch" in (await resp.json())["error"]
    # Straddling the epoch: shown from stream time 0.
    straddle = dict(doc, cues=[{"id": "s", "start": t - 10**9, "end": t + 10**9, "text": "x"}])
    resp = await env.post("h", straddle)
    assert (await resp.json())["cues"][0]["start"] == 0
    # fix_epoch first: media fixes it and an epoch event goes out.
    assert env.service.fix_epoch("m", T0 + 123) == T0 + 123
    assert env.service.epoch("m") == T0 + 123
    env.clock.advance(2)
    assert env.service.stream_now_ms("m") == 1999  # 2 s minus the 123 ns, floored
    events = [await asyncio.wait_for(sub.get(), 1) for _ in range(5)]
    assert events[-1] == Epoch("m", T0 + 123)
    sub.close()


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "status", "words"),
    [
        (stream_doc(cue("a", 2, 1)), 422, "end must be after start"),
        (stream_doc(cue("a", 1, 1)), 422, "end must be after start"),
        (stream_doc(cue("a", 0, 1, "")), 422, "empty"),
        (stream_doc(cue("a", 0, 1, "  \n ")), 422, "empty"),
        (stream_doc(cue("a", 0, 1, "a\n\nb")), 422, "blank lines"),
        (stream_doc(cue("a", 0, 1, "a --> b")), 422, "-->"),
        (stream_doc(cue("a", 0, 1, "x" * 3000)), 413, "characters"),
        ({"timebase": "ms", "lang": "en", "cues": [cue("a", 0, 1)]}, 422, "timebase"),
        ({"timebase": "stream_s", "cues": [cue("a", 0, 1)]}, 422, "lang"),
        ({"timebase": "stream_s", "lang": "en", "cues": []}, 422, "non-empty"),
        (stream_doc(cue("a", -1, 1)), 422, "outside the stream timeline"),
        (stream_doc(cue("a", 0, 1e12)), 422, "outside the stream timeline"),
        (stream_doc(cue("a", 0, 4000)), 422, "at most 3600 s"),
        (stream_doc(cue("a", "0", 1)), 422, "number"),
        (stream_doc(cue("a", True, 1)), 422, "number"),
        (stream_doc(cue("a b", 0, 1)), 422, "cue ids"),
        (stream_doc(cue("a", 0, 1), cue("a", 1, 2)), 422, "twice"),
        (stream_doc(cue("a", 0, 1, extra=1)), 422, "unknown field"),
        (stream_doc(cue("a", 0, 1, settings=5)), 422, "string of WebVTT cue settings"),
        (stream_doc(cue("a", 0, 1, settings="lin:0")), 422, "'lin:0' is not a cue setting"),
        (stream_doc(cue("a", 0, 1, settings="region:r1")), 422, "not a cue setting"),
        (stream_doc(cue("a", 0, 1, settings="line:0 size:120%")), 422,
         "'size:120%' has a value WebVTT does not accept"),
        (stream_doc(cue("a", 0, 1, settings="align:" + "x" * 300)), 422, "longer than"),
        (stream_doc(*[cue(f"c{i}", i, i + 1) for i in range(501)]), 413, "at most 500"),
        ({"timebase": "house_ns", "lang": "en", "cues": [cue("a", 1, 2)]}, 422, "away from"),
        ({"timebase": "house_ns", "lang": "en", "cues": [cue("a", T0 + 0.5, T0 + 1e9)]}, 422,
         "integer"),
        ([1, 2], 422, "object"),
    ],
)
async def test_bad_json_cues_get_clear_4xx(
    env: Env, doc: Any, status: int, words: str
) -> None:
    resp = await env.post("s1", doc)
    assert resp.status == status, await resp.text()
    assert words in (await resp.json())["error"]


async def test_bad_requests_and_server_keeps_serving(env: Env) -> None:
    c = env.client
    url = "/api/streams/s1/captions"
    r = await c.post(url, json=stream_doc(cue("a", 0, 1)))
    assert r.status == 401 and "Bearer" in r.headers["WWW-Authenticate"]
    r = await c.post(url, json=stream_doc(cue("a", 0, 1)), headers={"Authorization": "Bearer no"})
    assert r.status == 401 and (await r.json())["error"] == "wrong token for caption ingest"
    r = await c.post(url, data=b"{not json", headers={**env.auth(), "Content-Type":
                                                        "application/json"})
    assert r.status == 400 and "malformed JSON" in (await r.json())["error"]
    r = await c.post(url, data=b"\xff\xfe", headers={**env.auth(), "Content-Type":
                                                      "application/json"})
    assert r.status == 400
    r = await c.post(url, data=b"hello", headers={**env.auth(), "Content-Type": "text/plain"})
    assert r.status == 415
    r = await c.post(url + "?lang=en", data=b"WEBVTTX\n",
                     headers={**env.auth(), "Content-Type": "text/vtt"})
    assert r.status == 422 and "not a WebVTT file" in (await r.json())["error"]
    r = await c.post(url, data=b"WEBVTT\n\n00:00.000 --> 00:01.000\nx\n",
                     headers={**env.auth(), "Content-Type": "text/vtt"})
    assert r.status == 422 and "lang" in (await r.json())["error"]
    r = await c.post(url + "?lang=en", data=b"WEBVTT\n\nno cues here\n",
                     headers={**env.auth(), "Content-Type": "text/vtt"})
    assert r.status == 422 and "no valid cues" in (await r.json())["error"]
    big = b"x" * (env.settings.max_body_bytes + 1)
    r = await c.post(url, data=big, headers={**env.auth(), "Content-Type": "application/json"})
    assert r.status == 413
    r = await c.post("/api/streams/bad%20name/captions", json=stream_doc(cue("a", 0, 1)),
                     headers=env.auth())
    assert r.status == 400
    r = await c.get("/captions/nope/en/chunk-0.vtt")
    assert r.status == 404
    r = await c.get("/api/streams/s1/captions?since=-1")
    assert r.status == 400
    # Still serving, and a good request after all that works.
    assert (await c.get("/healthz")).status == 200
    r = await env.post("s1", stream_doc(cue("ok", 0, 1)))
    assert r.status == 200


# --- chunks --------------------------------------------------------------------------------------


async def test_chunk_invariants(env: Env) -> None:
    rng = random.Random(7)
    cues = []
    for i in range(120):
        start = rng.randrange(0, 60_000)
        length = rng.choice([1, 300, 1999, 2000, 2001, 4000, 9000, rng.randrange(1, 12_000)])
        cues.append(cue(f"k{i}", start / 1000, (start + length) / 1000, f"t{i}"))
    cues.append(cue("edge", 4.0, 6.0, "exactly two chunks"))
    for i in range(0, len(cues), 50):
        assert (await env.post("inv", stream_doc(*cues[i:i + 50]))).status == 200
    env.clock.advance(200)  # every chunk below is closed now
    expected = {c["id"]: (round(c["start"] * 1000), round(c["end"] * 1000)) for c in cues}
    # Stream time: the epoch was fixed at T0 minus the earliest start.
    seen: dict[str, set[int]] = {}
    D = env.service.chunk_ms
    for n in range(0, 75_000 // D):
        status, parsed, raw = await get_vtt(env, f"/captions/inv/en/chunk-{n}.vtt")
        assert status == 200
        assert parsed is not None
        assert raw.headers["Cache-Control"] == "public, max-age=31536000, immutable"
        header = vtt_header(await raw.text())
        assert header[1] == f"X-TIMESTAMP-MAP=MPEGTS:{n * D * 90},LOCAL:" + \
            webvtt.format_timestamp(n * D / 1000)
        ids = [c.id for c in parsed.cues]
        assert len(ids) == len(set(ids))
        for c in parsed.cues:
            s, e = round(c.start * 1000), round(c.end * 1000)
            assert (s, e) == expected[c.id]  # full display times, not clipped
            assert e > s  # never zero-length
            assert s < (n + 1) * D and e > n * D  # displayed in the chunk
            seen.setdefault(c.id, set()).add(n)
    for cid, (s, e) in expected.items():
        assert seen[cid] == set(range(s // D, (e - 1) // D + 1)), cid
    assert seen["edge"] == {2}


async def test_chunk_states_and_freezing(env: Env) -> None:
    await env.post("fz", stream_doc(cue("a", 0, 1)))  # epoch = T0; now = stream 0
    r = await env.client.get("/captions/fz/en/chunk-3.vtt")
    assert r.status == 404 and r.headers["Retry-After"] == "6"
    assert (await env.client.get("/captions/fz/xx/chunk-0.vtt")).status == 404
    env.clock.advance(2.5)
    r = await env.client.get("/captions/fz/en/chunk-1.vtt")
    assert r.status == 200 and r.headers["Cache-Control"] == "no-cache"
    # Chunk 0 stays live for the grace period after its end, then closes.
    r = await env.client.get("/captions/fz/en/chunk-0.vtt")
    assert r.headers["Cache-Control"] == "no-cache"
    env.clock.advance(CLOSE_GRACE_MS / 1000)
    first = await env.client.get("/captions/fz/en/chunk-0.vtt")
    assert first.headers["Cache-Control"].endswith("immutable")
    frozen = await first.read()
    # A late cue in chunk 0 is stored and visible elsewhere, but chunk 0's bytes never change.
    assert (await env.post("fz", stream_doc(cue("late", 0.5, 1.5)))).status == 200
    assert await (await env.client.get("/captions/fz/en/chunk-0.vtt")).read() == frozen
    _, parsed, _ = await get_vtt(env, "/captions/fz/en.vtt?start=0&end=2")
    assert parsed is not None and {c.id for c in parsed.cues} == {"a", "late"}


async def test_window_queries(env: Env) -> None:
    await env.post("w", stream_doc(cue("a", 0, 1), cue("b", 1, 3), cue("c", 2.999, 3.5),
                                   cue("d", 10, 11)))
    env.clock.advance(20)

    async def ids(q: str) -> list[str]:
        status, parsed, raw = await get_vtt(env, f"/captions/w/en.vtt?{q}")
        assert status == 200 and parsed is not None
        assert vtt_header(await raw.text())[1].startswith("X-TIMESTAMP-MAP=MPEGTS:")
        return [c.id for c in parsed.cues]

    assert await ids("start=0&end=1") == ["a"]
    assert await ids("start=1&end=2.999") == ["b"]
    assert await ids("start=0.999&end=3") == ["a", "b", "c"]
    assert await ids("start=3&end=10") == ["c"]
    assert await ids("start=3.5&end=10") == []
    assert await ids("start=0&end=100") == ["a", "b", "c", "d"]
    for bad in ("start=2&end=1", "start=x&end=1", "end=1", "start=0&end=100000",
                "start=-1&end=2", "start=nan&end=1"):
        r = await env.client.get(f"/captions/w/en.vtt?{bad}")
        assert r.status == 400, bad


async def test_hls_playlist(env: Env) -> None:
    await env.post("p", stream_doc(cue("a", 0, 1)))
    r = await env.client.get("/captions/p/en/live.m3u8")
    assert r.status == 404 and int(r.headers["Retry-After"]) >= 1
    window = env.settings.caption_playlist_chunks
    D = env.service.chunk_ms
    for step in (10.0, 100.0):
        env.clock.advance(step)
        r = await env.client.get("/captions/p/en/live.m3u8")
        assert r.status == 200
        assert r.headers["Content-Type"] == "application/vnd.apple.mpegurl"
        lines = (await r.text()).splitlines()
        assert lines[0] == "#EXTM3U"
        tags = dict(line.split(":", 1) for line in lines if line.startswith("#EXT-X-"))
        assert tags["#EXT-X-VERSION"] == "3"
        target = int(tags["#EXT-X-TARGETDURATION"])
        assert "#EXT-X-ENDLIST" not in lines  # live
        uris = [line for line in lines if line and not line.startswith("#")]
        extinf = [float(line[8:].rstrip(",")) for line in lines if line.startswith("#EXTINF:")]
        assert len(uris) == len(extinf) <= window
        assert all(round(d) <= target for d in extinf)  # RFC 8216 4.3.3.1
        seq = int(tags["#EXT-X-MEDIA-SEQUENCE"])
        assert uris == [f"chunk-{n}.vtt" for n in range(seq, seq + len(uris))]
        now_ms = (env.clock() - env.service.epoch("p")) // 1_000_000  # type: ignore[operator]
        assert (seq + len(uris)) * D + CLOSE_GRACE_MS <= now_ms  # only closed chunks
        for uri in uris:
            seg = await env.client.get(f"/captions/p/en/{uri}")
            assert seg.status == 200 and seg.headers["Cache-Control"].endswith("immutable")
    assert len(uris) == window  # a sliding window once enough chunks closed


async def test_json_feed_since(env: Env) -> None:
    await env.post("f", stream_doc(cue("a", 0, 1), cue("b", 1, 2)))
    await env.post("f", stream_doc(cue("x", 0, 1), lang="fr"))
    doc = await (await env.client.get("/api/streams/f/captions")).json()
    assert [c["id"] for c in doc["cues"]] == ["a", "b", "x"]
    assert doc["languages"] == ["en", "fr"]
    cursor = doc["next"]
    await env.client.delete("/api/streams/f/captions/en/a", headers=env.auth())
    await env.post("f", stream_doc(cue("b", 1, 2, "new")))
    doc = await (await env.client.get(f"/api/streams/f/captions?since={cursor}")).json()
    assert [(c["id"], c.get("retracted", False), c["text"]) for c in doc["cues"]] == [
        ("a", True, ""), ("b", False, "new")]
    doc = await (await env.client.get(f"/api/streams/f/captions?since={doc['next']}")).json()
    assert doc["cues"] == []
    doc = await (await env.client.get("/api/streams/f/captions?lang=fr")).json()
    assert [c["id"] for c in doc["cues"]] == ["x"]


# --- durability across restarts, retention -------------------------------------------------------


async def test_restart_keeps_cues_epoch_and_frozen_chunks(tmp_path: Path) -> None:
    clock = Clock()
    env = await start_env(tmp_path / "d", clock)
    await env.post("r", stream_doc(cue("a", 0, 1, "one"), cue("b", 1, 3, "two")))
    await env.client.delete("/api/streams/r/captions/en/b", headers=env.auth())
    env.service.fix_epoch("media-only", T0 + 99)
    clock.advance(10)
    frozen = await (await env.client.get("/captions/r/en/chunk-0.vtt")).read()
    epoch = env.service.epoch("r")
    await env.client.close()

    env2 = await start_env(tmp_path / "d", clock)
    try:
        assert env2.service.epoch("r") == epoch
        assert env2.service.epoch("media-only") == T0 + 99
        assert await (await env2.client.get("/captions/r/en/chunk-0.vtt")).read() == frozen
        doc = await (await env2.client.get("/api/streams/r/captions")).json()
        assert [(c["id"], c.get("retracted", False)) for c in doc["cues"]] == [
            ("a", False), ("b", True)]
        # Sequence numbers keep growing after a restart.
        r = await env2.post("r", stream_doc(cue("c", 2, 3)))
        assert (await r.json())["cues"][0]["seq"] > max(c["seq"] for c in doc["cues"])
    finally:
        await env2.client.close()


async def test_retention_drops_old_cues(tmp_path: Path) -> None:
    clock = Clock()
    env = await start_env(tmp_path / "d", clock, caption_retention_s=60.0)
    try:
        await env.post("old", stream_doc(cue("a", 0, 1), cue("b", 100, 101)))
        clock.advance(30)
        assert (await env.client.get("/captions/old/en/chunk-0.vtt")).status == 200
        assert await env.service.purge_expired() == 0
        clock.advance(75)
        assert await env.service.purge_expired() == 1
        r = await env.client.get("/captions/old/en/chunk-0.vtt")
        assert r.status == 404 and "retention" in (await r.json())["error"]
        doc = await (await env.client.get("/api/streams/old/captions")).json()
        assert [c["id"] for c in doc["cues"]] == ["b"]
    finally:
        await env.client.close()
    env2 = await start_env(tmp_path / "d", clock, caption_retention_s=60.0)
    try:
        doc = await (await env2.client.get("/api/streams/old/captions")).json()
        assert [c["id"] for c in doc["cues"]] == ["b"]  # the purge was durable
    finally:
        await env2.client.close()


async def test_concurrent_posts_all_durable(tmp_path: Path) -> None:
    clock = Clock()
    env = await start_env(tmp_path / "d", clock)
    results = await asyncio.gather(
        *[env.post("cc", stream_doc(cue(f"n{i}", i, i + 1, f"text {i}"))) for i in range(60)]
    )
    assert all(r.status == 200 for r in results)
    await env.client.close()
    env2 = await start_env(tmp_path / "d", clock)
    try:
        doc = await (await env2.client.get("/api/streams/cc/captions")).json()
        assert sorted(c["id"] for c in doc["cues"]) == sorted(f"n{i}" for i in range(60))
    finally:
        await env2.client.close()


async def test_align_moves_a_cue_onto_the_voice_durably_and_keeps_its_authors_times(
    env: Env, tmp_path: Path,
) -> None:
    """Caption alignment moves a cue (duration kept), records the shift with the author's
    times readable, pushes the moved cue live, and survives a restart; it leaves a cue marked
    fixed, a cue changed since it was measured and a retracted one alone."""
    sub = env.service.events.subscribe("al")
    resp = await env.post("al", stream_doc(cue("a", 2.0, 3.5), cue("t", 4.0, 6.0, fixed=True),
                                           cue("b", 7.0, 8.0), cue("gone", 9.0, 9.5)))
    assert resp.status == 200, await resp.text()
    await env.client.delete("/api/streams/al/captions/en/gone", headers=env.auth())
    moved = await env.service.align("al", "en", "a", 2000, 310)
    assert moved is not None and (moved.start_ms, moved.end_ms, moved.shift_ms) == (
        2310, 3810, 310)
    assert await env.service.align("al", "en", "a", 2000, 20) is None  # moved already
    assert await env.service.align("al", "en", "t", 4000, 300) is None  # fixed
    assert await env.service.align("al", "en", "b", 6900, 300) is None  # not what was measured
    assert await env.service.align("al", "en", "gone", 9000, 300) is None  # retracted
    got = [await asyncio.wait_for(sub.get(), 1) for _ in range(7)]
    assert got[-1] == Cue("al", "en", "a", 2.31, 3.81, "x", True, shift_ms=310)
    assert got[2] == Cue("al", "en", "t", 4.0, 6.0, "x", True, fixed=True)
    feed = await (await env.client.get("/api/streams/al/captions")).json()
    by_id = {c["id"]: c for c in feed["cues"]}
    assert (by_id["a"]["start"], by_id["a"]["aligned_ms"], by_id["a"]["author_start"],
            by_id["a"]["author_end"]) == (2.31, 310, 2.0, 3.5)
    assert by_id["t"]["fixed"] is True and "aligned_ms" not in by_id["b"]
    # The author's revision replaces the aligned one: times as posted, no shift.
    await env.post("al", stream_doc(cue("a", 2.1, 3.6)))
    feed = await (await env.client.get("/api/streams/al/captions")).json()
    assert {c["id"]: c for c in feed["cues"]}["a"]["start"] == 2.1
    assert "aligned_ms" not in {c["id"]: c for c in feed["cues"]}["a"]
    again = await env.service.align("al", "en", "a", 2100, 200)
    assert again is not None
    sub.close()
    await env.client.close()
    await env.service.stop()
    reopened = await start_env(env.settings.data_dir, env.clock)
    try:
        feed = await (await reopened.client.get("/api/streams/al/captions")).json()
        by_id = {c["id"]: c for c in feed["cues"]}
        assert (by_id["a"]["start"], by_id["a"]["aligned_ms"]) == (2.3, 200)
        assert by_id["t"]["fixed"] is True
    finally:
        await reopened.client.close()
        await reopened.service.stop()


async def test_fixed_must_be_a_boolean(env: Env) -> None:
    resp = await env.post("fx", stream_doc(cue("a", 1, 2, fixed="yes")))
    assert resp.status == 422
    assert "fixed" in (await resp.json())["error"]
