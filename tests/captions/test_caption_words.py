"""Word-timed cues and barge-in through the real HTTP app (in process, real SQLite): words in
the WebVTT served and read back by the project's parser, in the feed and the live events,
moved with an aligned cue; an interruption that retracts and cuts durably and at once."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sfu_sidecar.captions import webvtt, words
from sfu_sidecar.captions.events import Cue, CueRetract
from tests.captions.helpers import T0, Clock, Env, start_env

S = 10**9
MS = 10**6


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    e = await start_env(tmp_path / "data", Clock())
    yield e
    await e.client.close()


def spoken(cue_id: str, start_ns: int, sentence: str, gap_ns: int = 300 * MS,
           **extra: Any) -> dict[str, Any]:
    """A house-time cue whose words start every ``gap_ns`` from ``start_ns``."""
    said = [{"start": start_ns + i * gap_ns, "text": w} for i, w in enumerate(sentence.split())]
    return {"id": cue_id, "start": start_ns, "end": start_ns + len(said) * gap_ns,
            "words": said, **extra}


def house(*cues: dict[str, Any], lang: str = "en") -> dict[str, Any]:
    return {"timebase": "house_ns", "lang": lang, "cues": list(cues)}


async def feed(env: Env, stream: str) -> dict[str, dict[str, Any]]:
    doc = await (await env.client.get(f"/api/streams/{stream}/captions")).json()
    return {c["id"]: c for c in doc["cues"]}


async def cue_events(sub: Any, n: int) -> list[Cue | CueRetract]:
    """The next ``n`` cue events of a subscription (the stream's epoch event is skipped)."""
    out: list[Cue | CueRetract] = []
    while len(out) < n:
        event = await asyncio.wait_for(sub.get(), 1)
        if isinstance(event, Cue | CueRetract):
            out.append(event)
    return out


async def interrupt(env: Env, stream: str, body: dict[str, Any], lang: str = "en") -> Any:
    return await env.client.post(f"/api/streams/{stream}/captions/{lang}/interrupt", json=body,
                                 headers=env.auth())


async def test_word_times_are_served_as_timestamp_tags_in_every_reader(env: Env) -> None:
    sub = env.service.events.subscribe("w")
    resp = await env.post("w", house(spoken("a", T0, "Good morning, dear viewers."),
                                     spoken("b", T0 + 2 * S, "News now.", gap_ns=450 * MS)))
    assert resp.status == 200, await resp.text()
    (event_a, event_b) = await cue_events(sub, 2)
    assert isinstance(event_a, Cue)
    assert event_a.text == ("Good <00:00:00.300>morning, <00:00:00.600>dear "
                            "<00:00:00.900>viewers.")
    by_id = await feed(env, "w")
    assert by_id["a"]["words"] == [
        {"start": 0.0, "text": "Good"}, {"start": 0.3, "text": "morning,"},
        {"start": 0.6, "text": "dear"}, {"start": 0.9, "text": "viewers."}]
    assert [w["start"] for w in by_id["b"]["words"]] == [2.0, 2.45]
    env.clock.advance(5)
    body = await (await env.client.get("/captions/w/en/chunk-0.vtt")).read()
    parsed = webvtt.parse(body)
    assert [c.text for c in parsed.cues] == [event_a.text]  # valid WebVTT, read back whole
    assert words.words_of(parsed.cues[0].text, 0) == [
        (0, "Good"), (300, "morning,"), (600, "dear"), (900, "viewers.")]
    whole = webvtt.parse(await (await env.client.get("/captions/w/en.vtt?start=0&end=5")).read())
    assert [words.tags(c.text)[-1].ms for c in whole.cues] == [900, 2450]
    assert isinstance(event_b, Cue) and "<00:00:02.450>now." in event_b.text
    sub.close()


async def test_words_in_stream_time_with_their_own_text(env: Env) -> None:
    doc = {"timebase": "stream_s", "lang": "de", "cues": [{
        "id": "k", "start": 10.0, "end": 12.0, "text": "<v Anna>Guten Tag</v>",
        "words": [{"start": 10.0, "text": "Guten", "end": 10.4}, {"start": 10.5, "text": "Tag"}],
    }]}
    resp = await env.post("ws", doc)
    assert resp.status == 200, await resp.text()
    cue = (await resp.json())["cues"][0]
    assert cue["text"] == "<v Anna>Guten <00:00:10.500>Tag</v>"
    assert cue["words"] == [{"start": 10.0, "text": "Guten"}, {"start": 10.5, "text": "Tag"}]


@pytest.mark.parametrize(
    ("words_field", "text", "status", "reason"),
    [
        ([{"start": 0.5, "text": "a"}], None, 422, "outside its cue"),
        ([{"start": 3.0, "text": "a"}], None, 422, "outside its cue"),
        ([{"start": 1.5, "text": "a"}, {"start": 1.2, "text": "b"}], None, 422,
         "at or before the word before it"),
        ([{"start": 1.5, "text": "a"}, {"start": 1.5, "text": "b"}], None, 422,
         "at or before the word before it"),
        ([{"start": 1.0, "text": "a", "end": 1.6}, {"start": 1.5, "text": "b"}], None, 422,
         "overlapping"),
        ([{"start": 1.0, "text": "a", "end": 0.9}], None, 422, "end must be after"),
        ([{"start": 1.0, "text": "a", "end": 2.5}], None, 422, "end must be after"),
        ([{"start": 1.0, "text": "zebra"}], "a b", 422, "not in the cue's text"),
        ([{"start": 1.0, "text": "a"}], "a <00:00:01.500>b", 422, "not both"),
        ([{"start": 1.0}], None, 422, "non-empty string"),
        ([{"text": "a"}], None, 422, "needs start"),
        ([{"start": 1.0, "text": "a", "pitch": 3}], None, 422, "object of start, text"),
        ([], None, 422, "non-empty list"),
        ("a b", None, 422, "non-empty list"),
        ([{"start": 1.0 + i / 1000, "text": "w"} for i in range(600)], None, 413,
         "at most 500"),
        ([{"start": 1.0 + i / 10_000, "text": "w"} for i in range(10_000)], None, 413,
         "max_body_bytes"),
    ],
)
async def test_bad_word_times_get_a_clear_4xx_and_store_nothing(
    env: Env, words_field: Any, text: str | None, status: int, reason: str,
) -> None:
    body: dict[str, Any] = {"id": "bad", "start": 1.0, "end": 2.0, "words": words_field}
    if text is not None:
        body["text"] = text
    resp = await env.post("bw", {"timebase": "stream_s", "lang": "en", "cues": [body]})
    assert resp.status == status, await resp.text()
    assert reason in (await resp.json())["error"]
    assert await feed(env, "bw") == {}


async def test_an_aligned_cue_moves_its_words_with_it(env: Env) -> None:
    await env.post("al", house(spoken("a", T0 + S, "one two three")))
    moved = await env.service.align("al", "en", "a", 0, 250)
    assert moved is not None
    assert [w["start"] for w in (await feed(env, "al"))["a"]["words"]] == [0.25, 0.55, 0.85]


async def test_barge_in_retracts_what_was_not_said_and_cuts_the_sentence_it_stopped(
    env: Env, tmp_path: Path,
) -> None:
    sub = env.service.events.subscribe("bi")
    await env.post("bi", house(spoken("s1", T0, "I will tell you a story"),
                               spoken("s2", T0 + 2 * S, "about a dragon"),
                               spoken("s3", T0 + 3 * S, "who lived far away"),
                               {"id": "title", "start": T0, "end": T0 + 60 * S,
                                "text": "Chapter one", "fixed": True}))
    await env.post("bi", house(spoken("fr", T0, "Je vais vous raconter"), lang="fr"))
    await cue_events(sub, 5)
    env.clock.advance(2.5)
    at = T0 + 2 * S + 450 * MS  # during "a", the second word of s2 (2.3 s .. 2.6 s)
    resp = await interrupt(env, "bi", {"at": at})
    assert resp.status == 200, await resp.text()
    assert await resp.json() == {"stream": "bi", "lang": "en", "at": 2.45,
                                 "retracted": ["s3"], "cut": ["s2"]}
    events = {e.id: e for e in await cue_events(sub, 2)}
    assert events["s3"] == CueRetract("bi", "en", "s3")
    cut_event = events["s2"]
    assert isinstance(cut_event, Cue) and (cut_event.start, cut_event.end) == (2.0, 2.45)
    assert cut_event.text == "about <00:00:02.300>a"
    by_id = await feed(env, "bi")
    assert by_id["s1"]["end"] == 1.8 and by_id["s3"]["retracted"] is True
    assert by_id["title"]["end"] == 60.0  # fixed: not speech
    assert [w["text"] for w in by_id["s2"]["words"]] == ["about", "a"]
    french = await (await env.client.get("/api/streams/bi/captions?lang=fr")).json()
    assert "retracted" not in french["cues"][0]  # another language's speaker went on
    # Again: nothing left to do. A late revision of a touched cue brings nothing back.
    again = await interrupt(env, "bi", {"at": at})
    assert (await again.json())["retracted"] == [] and (await again.json())["cut"] == []
    late = await env.post("bi", house(spoken("s2", T0 + 2 * S, "about a dragon"),
                                      spoken("s4", T0 + 4 * S, "Hello again")))
    results = {c["id"]: c["result"] for c in (await late.json())["cues"]}
    assert results == {"s2": "interrupted", "s4": "new"}
    env.clock.advance(10)
    chunk = webvtt.parse(await (await env.client.get("/captions/bi/en/chunk-1.vtt")).read())
    assert [(c.id, c.end, c.text) for c in chunk.cues if c.id != "title"] == [
        ("s2", 2.45, "about <00:00:02.300>a")]
    sub.close()
    # Durable: the cut and the retraction are what a restarted service serves.
    await env.client.close()
    await env.service.stop()
    reopened = await start_env(env.settings.data_dir, env.clock)
    try:
        by_id = await feed(reopened, "bi")
        assert by_id["s2"]["end"] == 2.45 and by_id["s3"].get("retracted") is True
    finally:
        await reopened.client.close()
        await reopened.service.stop()


async def test_barge_in_over_the_websocket_and_in_stream_time(env: Env) -> None:
    await env.post("bw", house(spoken("a", T0, "one two three four")))
    env.clock.advance(1)
    async with env.client.ws_connect("/api/streams/bw/captions/ws", headers=env.auth()) as ws:
        await ws.send_str(json.dumps({"op": "interrupt", "lang": "en", "at": 0.6,
                                      "timebase": "stream_s"}))
        reply = json.loads((await ws.receive()).data)
    assert reply["ok"] is True
    assert {k: reply[k] for k in ("stream", "lang", "at", "retracted", "cut")} == {
        "stream": "bw", "lang": "en", "at": 0.6, "retracted": [], "cut": ["a"]}
    assert (await feed(env, "bw"))["a"]["text"] == "one <00:00:00.300>two"


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        ({"at": T0 + 30 * S}, 422, "after now"),
        ({"at": T0 - 5 * S}, 422, "before the stream's epoch"),
        ({"at": T0 + 400 * 86_400 * S}, 422, "after now"),
        ({"at": 1.5}, 422, "integer"),
        ({"at": -1, "timebase": "stream_s"}, 422, "outside the stream timeline"),
        ({"timebase": "house_ns"}, 422, "at is required"),
        ({"at": T0, "timebase": "frames"}, 422, "timebase must be one of"),
        ({"at": T0, "why": "x"}, 422, "unknown field"),
    ],
)
async def test_bad_barge_in_times_get_a_clear_4xx_and_change_nothing(
    env: Env, body: dict[str, Any], status: int, reason: str,
) -> None:
    await env.post("bt", house(spoken("a", T0, "one two three")))
    resp = await interrupt(env, "bt", body)
    assert resp.status == status, await resp.text()
    assert reason in (await resp.json())["error"]
    assert "retracted" not in (await feed(env, "bt"))["a"]
    assert (await feed(env, "bt"))["a"]["end"] == 0.9


async def test_barge_in_before_any_caption_says_nothing_was_said_and_needs_the_token(
    env: Env,
) -> None:
    resp = await interrupt(env, "quiet", {"at": T0})
    assert await resp.json() == {"stream": "quiet", "lang": "en", "at": None,
                                 "retracted": [], "cut": []}
    anonymous = await env.client.post("/api/streams/quiet/captions/en/interrupt",
                                      json={"at": T0})
    assert anonymous.status == 401
    bad_lang = await interrupt(env, "quiet", {"at": T0}, lang="no_such_lang!")
    assert bad_lang.status in (404, 422)


async def test_a_hundred_barge_ins_at_random_instants_leave_no_unsaid_word_anywhere(
    env: Env,
) -> None:
    """A presenter interrupted 100 times, each at a random instant of a sentence, with the next
    sentence already posted: after each, every reader (change feed, chunks, live events) has
    no word at or after the instant, and the cut cue ends exactly there."""
    rng = random.Random(7)
    sub = env.service.events.subscribe("talk")
    await env.post("talk", stream_doc_words(0, 0.0))  # fixes the stream's epoch
    await cue_events(sub, 1)
    t = 10.0
    for n in range(1, 101):
        said = stream_doc_words(n, t)
        following = stream_doc_words(10_000 + n, t + 3.0)
        resp = await env.post("talk", {**said, "cues": said["cues"] + following["cues"]})
        assert resp.status == 200, await resp.text()
        await cue_events(sub, 2)
        at_ms = round((t + rng.uniform(0.05, 2.35)) * 1000)
        env.clock.t = env.service.epoch("talk") + at_ms * MS + 100 * MS  # said a moment ago
        resp = await interrupt(env, "talk", {"at": at_ms / 1000, "timebase": "stream_s"})
        done = await resp.json()
        assert (done["cut"], done["retracted"]) == ([f"c{n}"], [f"c{10_000 + n}"]), done
        pushed = await cue_events(sub, 2)
        cut = next(e for e in pushed if isinstance(e, Cue))
        assert [e.id for e in pushed if isinstance(e, CueRetract)] == [f"c{10_000 + n}"]
        assert round(cut.end * 1000) == at_ms
        assert all(ms < at_ms for ms, _ in words.words_of(cut.text, round(cut.start * 1000)))
        t += 6.0
    feed_cues = await feed(env, "talk")
    env.clock.advance(20)
    served = []
    for chunk in range(0, 4 + round(t) // 2):
        resp = await env.client.get(f"/captions/talk/en/chunk-{chunk}.vtt")
        served += webvtt.parse(await resp.read()).cues
    for n in range(1, 101):
        cue = feed_cues[f"c{n}"]
        assert all(w["start"] < cue["end"] for w in cue.get("words", [])), cue
        assert feed_cues[f"c{10_000 + n}"].get("retracted") is True
    assert not any(c.id.startswith("c1000") for c in served)
    assert all(tag.ms < round(c.end * 1000) for c in served for tag in words.tags(c.text))
    sub.close()


def stream_doc_words(n: int, start_s: float) -> dict[str, Any]:
    """A 2.4 s sentence at ``start_s`` of stream time, a word every 0.3 s."""
    said = [{"start": round(start_s + 0.3 * i, 3), "text": f"w{i}"} for i in range(8)]
    return {"timebase": "stream_s", "lang": "en",
            "cues": [{"id": f"c{n}", "start": start_s, "end": round(start_s + 2.4, 3),
                      "words": said}]}
