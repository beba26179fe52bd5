"""The demo's sources and broadcaster: the presenter's talk laid out from the synthesiser's own
timing, captions placed on it with the configured offset, the beep source's one caption per
flash, the fall-back to it without text-to-speech, and one run of the speech demo against the
service in process: its voice heard where the synthesiser said, its captions measured early by
the configured amount, and the caption_lag alert raised."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from sfu_sidecar import demo, tts
from sfu_sidecar.app import build_app, house_clock
from sfu_sidecar.config import load_settings
from sfu_sidecar.exceptions import TtsUnavailable
from sfu_sidecar.synthetic import (
    AUDIO_RATE,
    BeepAudioTrack,
    FlashVideoTrack,
    PcmAudioTrack,
    Timeline,
)
from tests.conftest import IN_PROCESS

T0 = 1_790_000_000_000_000_000
S = 1_000_000_000


def _said(text: str, onset: int, end: int, size: int) -> tts.Utterance:
    pcm = np.zeros(size, dtype=np.int16)
    pcm[onset:end] = 1000
    return tts.Utterance(text, "en-us", 160, pcm, (tts.Word(0, text),), onset, end)


def _talk() -> demo.Talk:
    return demo.compose([_said("one", 100, 30_000, 31_000), _said("two", 4_000, 60_000, 62_000),
                         _said("", 0, 0, 500), _said("three", 50, 9_000, 9_500)],
                        pauses_s=(0.5, 1.0), lead_s=1.0)


def test_compose_lays_each_sentence_a_pause_after_the_last() -> None:
    talk = _talk()
    assert [line.text for line in talk.lines] == ["one", "two", "three"]  # the silent one left
    onsets = [line.onset for line in talk.lines]
    ends = [line.end for line in talk.lines]
    assert onsets[0] == AUDIO_RATE  # lead_s
    assert onsets[1] - ends[0] == AUDIO_RATE // 2
    assert onsets[2] - ends[1] == AUDIO_RATE
    assert talk.pcm.size == ends[2] + AUDIO_RATE // 2  # the last pause before the loop restarts
    loud = np.flatnonzero(talk.pcm)
    spans = np.zeros(talk.pcm.size, dtype=bool)
    for line in talk.lines:
        spans[line.onset:line.end] = True
    assert np.array_equal(loud, np.flatnonzero(spans))  # sound where the lines say, only there


@pytest.mark.parametrize("offset_ms", [-400, 0, 250])
def test_speech_captions_are_the_sentences_shifted_by_the_offset(offset_ms: int) -> None:
    talk = _talk()
    timeline = Timeline(T0, 0.0)
    cues = list(itertools.islice(demo.SpeechSource(talk, offset_ms).cues(timeline), 7))
    loop_ns = talk.pcm.size * S // AUDIO_RATE
    for n, (post_at, cue) in enumerate(cues):
        loop, i = divmod(n, len(talk.lines))
        line = talk.lines[i]
        onset = T0 + (loop * talk.pcm.size + line.onset) * S // AUDIO_RATE
        end = T0 + (loop * talk.pcm.size + line.end) * S // AUDIO_RATE
        start = onset + offset_ms * 1_000_000
        # Its one word begins in the silence before the sound: said from the caption's start.
        assert cue == {"id": f"say-{loop}-{i}", "start": start,
                       "end": end + offset_ms * 1_000_000, "text": line.text, "final": True,
                       "words": [{"start": start, "text": line.text}]}
        # Posted ahead of its start, as a TTS pipeline would, never before the timeline starts.
        assert post_at == max(Fraction(int(cue["start"]) - T0, S) - demo.LOOKAHEAD_S, 0)
    assert cues[3][1]["start"] == cues[0][1]["start"] + loop_ns
    assert [p for p, _ in cues] == sorted(p for p, _ in cues)
    tracks = demo.SpeechSource(talk, 0).tracks(timeline)
    assert [type(t) for t in tracks] == [PcmAudioTrack, FlashVideoTrack]
    assert tracks[0].loop and tracks[0].pcm is talk.pcm


def test_beep_source_keeps_one_caption_per_flash() -> None:
    timeline = Timeline(T0, 0.0)
    source = demo.BeepSource()
    assert [type(t) for t in source.tracks(timeline)] == [BeepAudioTrack, FlashVideoTrack]
    cues = list(itertools.islice(source.cues(timeline), 5))
    assert [p for p, _ in cues] == [0, 0, 0, 1, 2]  # two seconds ahead of each flash
    assert [c["start"] for _, c in cues] == [T0 + s * S for s in range(5)]
    assert [c for _, c in cues] == [demo.caption_for_second(timeline, s) for s in range(5)]


async def test_the_source_is_the_setting_s_and_beep_without_speech(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "sfu_sidecar.demo")
    beep = await demo.choose_source(load_settings({"demo_source": "beep"}))
    assert isinstance(beep, demo.BeepSource)
    assert "demo source: beep" in caplog.text

    def no_tts() -> demo.Talk:
        raise TtsUnavailable("no text-to-speech: the test took it away")

    monkeypatch.setattr(demo, "presenter_talk", no_tts)
    caplog.clear()
    fallback = await demo.choose_source(load_settings({}))
    assert isinstance(fallback, demo.BeepSource)
    assert "no speech for the demo: no text-to-speech: the test took it away" in caplog.text
    assert "demo source: beep" in caplog.text


# --- the speech demo against the service ---------------------------------------------------


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[tuple[str, web.Application]]:
    settings = load_settings({"ice_addresses": "127.0.0.1", "data_dir": str(tmp_path),
                              **IN_PROCESS})
    app = build_app(settings)
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server()
    try:
        yield f"http://127.0.0.1:{srv.port}", app
    finally:
        await srv.close()


async def _get(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url) as r:
        assert r.status == 200, await r.text()
        body: dict[str, Any] = await r.json()
        return body


@pytest.mark.integration
async def test_the_speech_demo_is_heard_and_its_captions_measured_early(
    service: tuple[str, web.Application], caplog: pytest.LogCaptureFixture,
) -> None:
    base, app = service
    caplog.set_level(logging.INFO, "sfu_sidecar.demo")
    settings = load_settings({})  # the defaults: speech, captions 400 ms early
    offset_ms = settings.demo_caption_offset_ms
    assert (settings.demo_source, offset_ms) == ("speech", -400)
    source = await demo.choose_source(settings)
    assert isinstance(source, demo.SpeechSource), caplog.text
    assert "demo source: speech, 12 sentences" in caplog.text
    assert "captions 400 ms early (demo_caption_offset_ms -400" in caplog.text
    talk = source.talk
    broadcaster = demo.Broadcaster(base, None, house_clock(app), source)
    running = asyncio.create_task(broadcaster.run())
    sync = f"{base}/api/streams/{demo.STREAM}/sync"
    try:
        async with aiohttp.ClientSession() as http:
            # Three sentences heard and their captions matched: about 10 s in.
            deadline = time.monotonic() + 40
            body: dict[str, Any] = {}
            while body.get("caption_lag", {}).get(demo.LANG, {}).get("matched", 0) < 3:
                assert not running.done(), running
                assert time.monotonic() < deadline, body
                await asyncio.sleep(0.5)
                async with http.get(sync) as r:  # 404 until the broadcaster has published
                    body = await r.json() if r.status == 200 else {}
            feed = await _get(http, f"{base}/api/streams/{demo.STREAM}/captions?since=0")
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await broadcaster.close()

    timeline = broadcaster.timeline
    assert timeline is not None

    def house(sample: int) -> int:
        return timeline.capture_ns(Fraction(sample, AUDIO_RATE))

    # Captions as posted: each sentence's start and end as the synthesiser timed them, shifted.
    posted = {c["id"]: c for c in feed["cues"]}
    assert {f"say-0-{i}" for i in range(3)} <= set(posted), sorted(posted)
    for i, line in enumerate(talk.lines[:len(posted)]):
        cue = posted[f"say-0-{i}"]
        # The sentence, each word timed as the synthesiser said it, shifted like the caption.
        assert " ".join(w["text"] for w in cue["words"]).split() == line.text.split()
        said = demo.cue_words([(house(at), w) for at, w in line.words], house(line.onset),
                              house(line.end))
        # (A word espeak-ng times with the one before it is shown at that one's time.)
        starts = sorted({feed["epoch_ns"] + round(w["start"] * S) for w in cue["words"]})
        assert starts == pytest.approx([t + offset_ms * 1_000_000 for t, _ in said],
                                       abs=1_000_000)
        start_ns = feed["epoch_ns"] + round(cue["start"] * S)
        end_ns = feed["epoch_ns"] + round(cue["end"] * S)
        assert abs(start_ns - (house(line.onset) + offset_ms * 1_000_000)) <= 1_000_000, i
        assert abs(end_ns - (house(line.end) + offset_ms * 1_000_000)) <= 1_000_000, i

    # The voice, heard through the relay where the synthesiser put each sentence.
    heard = body["speech"]
    assert heard["state"] == "listening" and not heard["estimated"], heard
    # (A caption is matched to a sentence still being spoken: the last one may be open yet.)
    assert heard["segments_heard"] >= 2 and heard["refused_packets"] == 0, heard
    onsets = [house(line.onset) for line in talk.lines]
    errors_ms = [min(abs(on - t) for t in onsets) / 1e6 for on, _ in heard["segments"]]
    assert max(errors_ms) < 20, errors_ms

    lag = body["caption_lag"][demo.LANG]
    print(f"demo: captions posted {offset_ms:+d} ms; measured caption lag median "
          f"{lag['median_ms']:+.1f} ms over {lag['matched']} sentences (p95 |lag| "
          f"{lag['p95_ms']:.1f} ms); heard onsets |error| max {max(errors_ms):.1f} ms")
    assert (lag["unmatched_cues"], lag["unmatched_speech"]) == (0, 0), lag
    assert abs(lag["median_ms"] - offset_ms) <= 40, lag
    assert any(a["alert"] == "caption_lag" for a in body["alerts"]), body["alerts"]
