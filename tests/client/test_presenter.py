"""The TTS presenter: utterances on one sample timeline (pure), and a presenter publishing to
a real in-process service, whose relay hears its voice where the word-timed cues say, and
whose interruption silences the voice and cuts the cue at the same sample."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from sfu_sidecar import tts
from sfu_sidecar.app import build_app
from sfu_sidecar.captions.webvtt import seconds_from_ms
from sfu_sidecar.client.presenter import FaceVideoTrack, SpeechTimeline, TtsPresenter
from sfu_sidecar.config import load_settings
from sfu_sidecar.synthetic import Timeline
from tests.conftest import IN_PROCESS
from tests.relay.peers import LOOPBACK

RATE = 48_000


def utterance(n: int, onset: int, end: int, value: int = 1000) -> tts.Utterance:
    pcm = np.zeros(n, dtype=np.int16)
    pcm[onset:end] = value
    return tts.Utterance("x", "en-us", 160, pcm, (tts.Word(onset, "x"),), onset, end)


def test_utterances_follow_each_other_with_the_gap_between_sounds() -> None:
    speech = SpeechTimeline()
    first = speech.place(utterance(1000, 100, 900), earliest=5000, gap=200)
    assert (first.at, first.onset, first.end) == (4900, 5000, 5800)
    second = speech.place(utterance(1000, 100, 800), earliest=5000, gap=200)
    # Its sound 200 after the first's, and its PCM not over the first's.
    assert second.onset == 6000 and second.at == 5900
    third = speech.place(utterance(1000, 10, 800), earliest=0, gap=0)
    assert third.at == second.at + 1000  # never over PCM already laid
    chunk = speech.samples(4990, 20)
    assert list(chunk) == [0] * 10 + [1000] * 10


def test_an_interruption_silences_from_its_sample_and_new_speech_is_not_delayed() -> None:
    speech = SpeechTimeline()
    a = speech.place(utterance(2000, 100, 1900), earliest=100, gap=0)
    speech.place(utterance(2000, 100, 1900), earliest=0, gap=100)
    touched = speech.interrupt(1000)
    assert [p.at for p in touched] == [a.at, 2000]
    assert speech.samples(990, 20).tolist() == [1000] * 10 + [0] * 10
    assert not speech.samples(1000, 3000).any()
    again = speech.place(utterance(2000, 100, 1900), earliest=1200, gap=50)
    assert again.onset == 1200  # the cut sentence's unsaid rest holds nothing up
    assert speech.samples(1200, 10).tolist() == [1000] * 10


def test_the_mouth_opens_with_the_loudness_at_the_frames_capture() -> None:
    speech = SpeechTimeline()
    speech.place(utterance(RATE, RATE // 2, RATE, value=8000), earliest=RATE // 2, gap=0)
    face = FaceVideoTrack(Timeline(0, 0.0), speech, fps=30)
    assert face.opening(0) == 0.0  # frame 0: silence
    assert face.opening(29) == 1.0  # loud all through its window
    assert 0.5 < face.opening(15) < 0.99  # 0.5 s: the sound starts in the window's middle


@pytest.fixture
async def base(tmp_path: Path) -> AsyncIterator[str]:
    settings = load_settings({"ice_addresses": "127.0.0.1", "data_dir": str(tmp_path),
                              **IN_PROCESS})
    srv = TestServer(build_app(settings), host="127.0.0.1")
    await srv.start_server()
    try:
        yield f"http://127.0.0.1:{srv.port}"
    finally:
        await srv.close()


async def sync_of(http: aiohttp.ClientSession, base: str, stream: str) -> dict[str, Any]:
    async with http.get(f"{base}/api/streams/{stream}/sync") as r:
        assert r.status == 200, await r.text()
        body: dict[str, Any] = await r.json()
        return body


@pytest.mark.needs("espeak-ng")
async def test_the_relay_hears_the_presenter_where_its_cues_say_and_the_interruption_cuts_both(
    base: str,
) -> None:
    async with TtsPresenter(base, "anchor", ice_addresses=LOOPBACK) as presenter, \
            aiohttp.ClientSession() as http:
        first = await presenter.say("Good evening, and welcome to the late news.")
        second = await presenter.say("Tonight we look at the weather across the whole country.")
        assert second.onset_ns > first.end_ns
        assert len(first.words) >= 6 and first.words[0][0] == first.onset_ns
        # Cut the second sentence after its third word has begun.
        cut_word = second.words[3][0]
        deadline = time.monotonic() + 20
        while time.time_ns() < cut_word + 100_000_000:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        stopped = await presenter.interrupt()
        assert cut_word < stopped < second.end_ns, (cut_word, stopped, second.end_ns)
        body: dict[str, Any] = {}
        deadline = time.monotonic() + 20
        while True:
            body = await sync_of(http, base, "anchor")
            lag = body["caption_lag"].get("en")
            if lag and lag["matched"] + lag["unmatched_cues"] >= 2 \
                    and body["speech"]["segments_heard"] >= 2:
                break
            assert time.monotonic() < deadline, body
            await asyncio.sleep(0.3)
        async with http.get(f"{base}/api/streams/anchor/captions") as r:
            feed = await r.json()
        cues = {c["id"]: c for c in feed["cues"]}
        epoch = feed["epoch_ns"]
    heard = body["speech"]
    segments = [tuple(s) for s in heard["segments"]]
    print(f"said {first.onset_ns}..{first.end_ns}, {second.onset_ns}..cut {stopped}; "
          f"heard {segments}; lag {body['caption_lag']['en']}")
    assert not heard["estimated"], heard  # capture stamps and a clock join
    (on1, off1), (on2, off2) = segments[:2]
    assert abs(on1 - first.onset_ns) <= 20_000_000
    assert abs(off1 - first.end_ns) <= 40_000_000
    assert abs(on2 - second.onset_ns) <= 20_000_000
    # The voice stops at the sample the cue was cut at: the speech heard ends there.
    assert -40_000_000 <= off2 - stopped <= 20_000_000, (off2, stopped)
    assert abs(body["caption_lag"]["en"]["median_ms"]) <= 20.0
    cut = cues[second.cue_id]
    # The service keeps stream milliseconds (rounded half up) and hands out the double a
    # browser parses from them; a word stays when its millisecond is before the cut's.
    def stream_ms(house_ns: int) -> int:
        return (house_ns - epoch + 500_000) // 1_000_000

    said = [w for t, w in second.words if stream_ms(t) < stream_ms(stopped)]
    assert cut["end"] == seconds_from_ms(stream_ms(stopped)), (cut, stopped, epoch)
    assert [w["text"] for w in cut["words"]] == said
    assert first.cue_id in cues and "retracted" not in cues[first.cue_id]
