"""The demo: the service plus a synthetic broadcaster with scripted captions.

The broadcaster publishes one of two sources over WHIP to the service it runs beside, both
with a flashing, frame-numbered picture (:mod:`sfu_sidecar.synthetic`):

- ``speech`` (the default): a presenter's sentences spoken by espeak-ng (:mod:`sfu_sidecar.tts`)
  in a loop with pauses, and one caption per sentence placed by the synthesiser's own timing:
  from the sentence's first sound plus ``demo_caption_offset_ms`` to its last sound plus the
  same, as a TTS pipeline posts them. The service hears the voice, so the dashboard shows each
  caption's lag to it (the offset, measured) and raises ``caption_lag`` beyond 300 ms.
- ``beep``: a 100 ms flash and 1 kHz beep at the start of every second, and one caption per
  second starting at that second's flash: the pattern A/V skew is measured with.

Captions are posted :data:`LOOKAHEAD_S` ahead of their start, as TTS word timings would be.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

import aiohttp
import numpy as np
import numpy.typing as npt
from aiortc.mediastreams import MediaStreamTrack

from sfu_sidecar import app, logs, tts
from sfu_sidecar.client.presenter import cue_words
from sfu_sidecar.client.whip import WhipSession, publish
from sfu_sidecar.config import Settings
from sfu_sidecar.exceptions import SidecarError, TtsError
from sfu_sidecar.synthetic import (
    AUDIO_RATE,
    BeepAudioTrack,
    FlashVideoTrack,
    PcmAudioTrack,
    Timeline,
)

log = logs.get("demo")

STREAM = "demo"
LANG = "en"
SCRIPT = (
    "Hello, I am a synthetic presenter.",
    "Every caption starts with a flash",
    "and the flash comes with a beep.",
    "Captions follow capture time,",
    "not arrival time.",
    "So they stay on the lips.",
)
# The speech source's presenter: sentences of different lengths, whose first sounds differ
# (/h/, vowels, /m/, /k/, /s/, /θ/), spoken in this order with PAUSES_S between them.
PRESENTER = (
    "Hello, and welcome to the sidecar demo.",
    "I am a synthetic presenter.",
    "Everything you hear is spoken by a speech synthesiser on this machine.",
    "My voice travels through a relay, packet by packet, and is never transcoded.",
    "Each sample carries the time it was captured, on one house clock.",
    "Captions carry the same clock.",
    "So a player can show each line exactly while I say it.",
    "The sidecar listens to my voice, and finds where every sentence begins.",
    "Then it measures how far each caption is from the speech it captions.",
    "Many speech pipelines post their captions too early.",
    "Open the dashboard to see by how much, and the alert it raises.",
    "Thank you for watching.",
)
VOICE = "en-us"
WPM = 160
PAUSES_S = (0.8, 1.2, 0.7, 1.5, 1.0)  # from one sentence's last sound to the next one's first
LEAD_S = 1.0  # silence before the first sentence too: the detector reads the floor before onsets
LOOKAHEAD_S = 2  # captions are posted this far ahead of their start, as TTS timings would be

Cue = dict[str, object]


class Source(Protocol):
    """What a broadcaster publishes: its tracks, and its captions with when to post each."""

    def tracks(self, timeline: Timeline) -> list[MediaStreamTrack]: ...

    def cues(self, timeline: Timeline) -> Iterator[tuple[Fraction, Cue]]:
        """(timeline offset in seconds to post at, cue in house ns), in posting order."""
        ...


def caption_for_second(timeline: Timeline, second: int) -> Cue:
    start = timeline.start_house_ns + second * 1_000_000_000
    return {
        "id": f"line-{second}",
        "start": start,
        "end": start + 950_000_000,
        "text": f"{SCRIPT[second % len(SCRIPT)]} [{second}]",
        "final": True,
    }


class BeepSource:
    """A flash and a beep at the start of every second, a caption starting on each flash."""

    def tracks(self, timeline: Timeline) -> list[MediaStreamTrack]:
        return [BeepAudioTrack(timeline), FlashVideoTrack(timeline)]

    def cues(self, timeline: Timeline) -> Iterator[tuple[Fraction, Cue]]:
        for second in itertools.count():
            yield Fraction(max(second - LOOKAHEAD_S, 0)), caption_for_second(timeline, second)


@dataclass(frozen=True)
class Line:
    """A sentence in a talk: its first sounding sample and the one after its last (48 kHz)."""

    text: str
    onset: int
    end: int
    words: tuple[tuple[int, str], ...] = ()  # (sample where espeak-ng begins it, word)


@dataclass(frozen=True)
class Talk:
    """Sentences laid on one 48 kHz track that plays in a loop."""

    pcm: npt.NDArray[np.int16]
    lines: tuple[Line, ...]

    @property
    def duration_s(self) -> float:
        return self.pcm.size / AUDIO_RATE


def compose(utterances: Sequence[tts.Utterance], pauses_s: Sequence[float] = PAUSES_S,
            lead_s: float = LEAD_S) -> Talk:
    """``lead_s`` of silence, then each utterance followed by its pause (cycling through
    ``pauses_s``, from its last sound to the next one's first); the loop ends after the last
    pause. Utterances never overlap, not even in their silent margins; silent ones are left out."""
    placed: list[tuple[int, tts.Utterance]] = []
    length = 0
    cue = round(lead_s * AUDIO_RATE)  # where the next sentence's first sound goes
    for i, said in enumerate(u for u in utterances if not u.silent):
        if said.rate != AUDIO_RATE:
            raise ValueError(f"utterance at {said.rate} Hz, not {AUDIO_RATE}")
        at = max(cue - said.onset, length)
        placed.append((at, said))
        length = at + said.pcm.size
        cue = at + said.end + round(pauses_s[i % len(pauses_s)] * AUDIO_RATE)
    pcm = np.zeros(max(length, cue), dtype=np.int16)
    for at, said in placed:
        pcm[at:at + said.pcm.size] = said.pcm
    return Talk(pcm, tuple(Line(s.text, at + s.onset, at + s.end,
                                tuple((at + w.start, w.text) for w in s.words))
                           for at, s in placed))


def presenter_talk() -> Talk:
    """The presenter's script spoken by espeak-ng (blocking: CPU work, about 1 s)."""
    return compose([tts.synthesize(text, VOICE, WPM) for text in PRESENTER])


class SpeechSource:
    """A talk played in a loop, one caption per sentence ``offset_ms`` from its true timing."""

    def __init__(self, talk: Talk, offset_ms: int) -> None:
        if not talk.lines:
            raise ValueError("a talk with nothing said")
        self.talk = talk
        self.offset_ns = offset_ms * 1_000_000

    def tracks(self, timeline: Timeline) -> list[MediaStreamTrack]:
        return [PcmAudioTrack(timeline, self.talk.pcm, loop=True), FlashVideoTrack(timeline)]

    def cues(self, timeline: Timeline) -> Iterator[tuple[Fraction, Cue]]:
        size = self.talk.pcm.size
        for loop in itertools.count():
            for i, line in enumerate(self.talk.lines):
                # Sample k is captured at timeline.capture_ns(k / 48000) (PcmAudioTrack).
                onset = timeline.capture_ns(Fraction(loop * size + line.onset, AUDIO_RATE))
                end = timeline.capture_ns(Fraction(loop * size + line.end, AUDIO_RATE))
                start = onset + self.offset_ns
                post_at = Fraction(start - timeline.start_house_ns, 1_000_000_000) - LOOKAHEAD_S
                said = [(timeline.capture_ns(Fraction(loop * size + at, AUDIO_RATE)), word)
                        for at, word in line.words]
                # Every word as early or late as its sentence's caption.
                words = [(t + self.offset_ns, w) for t, w in cue_words(said, onset, end)]
                yield max(post_at, Fraction(0)), {
                    "id": f"say-{loop}-{i}",
                    "start": start,
                    "end": end + self.offset_ns,
                    "text": line.text,
                    "final": True,
                    **({"words": [{"start": t, "text": w} for t, w in words]} if words else {}),
                }


class Broadcaster:
    """Publishes a source and its captions to one stream of a running service."""

    def __init__(self, base_url: str, token: str | None, now_ns: Callable[[], int],
                 source: Source | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.now_ns = now_ns
        self.source: Source = source if source is not None else BeepSource()
        self.session: WhipSession | None = None
        self.timeline: Timeline | None = None

    async def run(self) -> None:
        timeline = self.timeline = Timeline.starting_now(self.now_ns)
        self.session = await publish(
            f"{self.base_url}/whip/{STREAM}", self.source.tracks(timeline), token=self.token,
            capture_start_ns=timeline.start_house_ns, clock_ns=self.now_ns,
            ice_addresses=("127.0.0.1",),
        )
        log.info("broadcaster publishing to stream %r", STREAM)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        async with aiohttp.ClientSession(headers=headers) as http:
            for post_at, cue in self.source.cues(timeline):
                await timeline.sleep_until(post_at)
                body = {"timebase": "house_ns", "lang": LANG, "cues": [cue]}
                async with http.post(
                    f"{self.base_url}/api/streams/{STREAM}/captions", json=body
                ) as resp:
                    if resp.status >= 300:
                        log.warning("caption post answered %d: %s", resp.status,
                                    (await resp.text()).strip())

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


def _lead(offset_ms: int) -> str:
    if offset_ms == 0:
        return "on the voice"
    return f"{abs(offset_ms)} ms {'early' if offset_ms < 0 else 'late'}"


async def choose_source(settings: Settings) -> Source:
    """The source ``demo_source`` names; the beep source, said so in the log, when speech was
    asked for and there is no text-to-speech."""
    if settings.demo_source == "speech":
        try:
            talk = await asyncio.to_thread(presenter_talk)
            engine = await asyncio.to_thread(tts.engine)
        except TtsError as exc:
            log.error("no speech for the demo: %s; publishing the beep source instead",
                      exc.reason)
        else:
            offset = settings.demo_caption_offset_ms
            log.info("demo source: speech, %d sentences in a %.0f s loop spoken by %s; captions "
                     "%s (demo_caption_offset_ms %d; 0 gives true captions): the dashboard "
                     "shows their lag to the voice and raises caption_lag beyond 300 ms",
                     len(talk.lines), talk.duration_s, engine, _lead(offset), offset)
            return SpeechSource(talk, offset)
    log.info("demo source: beep, a flash and a beep every second with a caption on each flash")
    return BeepSource()


async def _broadcast(settings: Settings, base_url: str, now_ns: Callable[[], int],
                     started: list[Broadcaster]) -> None:
    broadcaster = Broadcaster(base_url, settings.publish_token, now_ns,
                              await choose_source(settings))
    started.append(broadcaster)
    await broadcaster.run()


async def _demo(settings: Settings) -> None:
    ready = asyncio.Event()
    application = app.build_app(settings)
    server = asyncio.create_task(app.serve(settings, ready=ready, app=application))
    await ready.wait()
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    base = f"http://{host}:{settings.port}"
    started: list[Broadcaster] = []
    # The broadcaster stamps capture times on the house clock it runs beside.
    task = asyncio.create_task(
        _broadcast(settings, base, app.house_clock(application), started))
    log.info("demo running: open %s/ to watch stream %r, %s/dashboard for its timing and "
             "alerts", base, STREAM, base)
    done, _ = await asyncio.wait({server, task}, return_when=asyncio.FIRST_COMPLETED)
    if task in done and task.exception() is not None:
        exc = task.exception()
        reason = exc.reason if isinstance(exc, SidecarError) else repr(exc)
        log.error("broadcaster stopped: %s (the service keeps running)", reason)
        await server
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    for broadcaster in started:
        await broadcaster.close()


def run_demo(settings: Settings) -> int:
    app.install_event_loop_policy()
    asyncio.run(_demo(settings))
    return 0
