"""A TTS presenter: text in, a speaking face published over WHIP, word-timed captions posted.

::

    async with TtsPresenter("http://host:8080", "studio1", token="...") as presenter:
        said = await presenter.say("Good evening, here is the weather.")
        await asyncio.sleep(1.0)
        stopped_at = await presenter.interrupt()  # barge-in at the exact sample it stopped

Speech comes from espeak-ng offline (:mod:`sfu_sidecar.tts`). Every sample of the published
audio has a known capture instant (one :class:`~sfu_sidecar.synthetic.Timeline` paces audio and
video; packets carry abs-capture-time and the publisher joins the house clock), so each cue and
each word is posted at the house time its sound was captured. The face is a simple drawing
whose mouth opens with the audio's loudness at each frame's capture instant: enough to judge lip
sync by eye. :meth:`TtsPresenter.interrupt` silences the speech from the first sample not yet
captured and tells the caption service the speaker was cut off at exactly that sample.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fractions
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType

import numpy as np
import numpy.typing as npt
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame, VideoFrame

from sfu_sidecar import tts
from sfu_sidecar.client.captions import CaptionPublisher
from sfu_sidecar.client.whip import WhipSession, publish
from sfu_sidecar.synthetic import AUDIO_PTIME_S, AUDIO_RATE, VIDEO_CLOCK, Timeline

# Speech starts this long after it is asked for: the caption is posted before its sound is
# captured, so a viewer has it in time (a real TTS service streams ahead the same way).
LEAD_S = 0.3
# Silence between two utterances said back to back, from the last sound to the next: a
# speaker's pause between sentences, long enough for a listener (and a voice detector) to
# hear two.
GAP_S = 0.6
# Loudness (RMS of int16 samples) at which the mouth is wide open.
FULL_MOUTH_RMS = 6000.0
# The loudness a frame shows is the audio's over this window around its capture instant.
MOUTH_WINDOW_S = 0.04


@dataclass(frozen=True)
class Placed:
    """An utterance on the presenter's sample timeline: ``at`` is where its PCM begins."""

    utterance: tts.Utterance
    at: int

    @property
    def onset(self) -> int:
        return self.at + self.utterance.onset

    @property
    def end(self) -> int:
        return self.at + self.utterance.end


class SpeechTimeline:
    """Utterances laid on one 48 kHz sample timeline (sample 0 is the timeline's start). Pure:
    the caller says which sample is the next to be captured."""

    def __init__(self) -> None:
        self.placed: list[Placed] = []

    def place(self, utterance: tts.Utterance, earliest: int, gap: int) -> Placed:
        """Lay ``utterance`` so its first sound is at ``earliest`` or ``gap`` after the last
        sound already laid, whichever is later, and never over PCM already laid."""
        cue = earliest
        if self.placed:
            cue = max(cue, self.placed[-1].end + gap)
        at = max(cue - utterance.onset, self.pcm_end)
        placed = Placed(utterance, at)
        self.placed.append(placed)
        return placed

    @property
    def pcm_end(self) -> int:
        return max((p.at + p.utterance.pcm.size for p in self.placed), default=0)

    def interrupt(self, at: int) -> list[Placed]:
        """The speaker stops at sample ``at``: what is laid from there on is dropped. Returns
        the utterances that had sound left to say."""
        touched = [p for p in self.placed if p.end > at]
        kept = []
        for p in self.placed:
            if p.at >= at:
                continue
            u = p.utterance
            if p.at + u.pcm.size > at:
                n = at - p.at
                u = dataclasses.replace(u, pcm=u.pcm[:n], onset=min(u.onset, n),
                                        end=min(u.end, n))
            kept.append(Placed(u, p.at))
        self.placed = kept
        return touched

    def samples(self, start: int, n: int) -> npt.NDArray[np.int16]:
        """The PCM of samples [start, start + n): silence where nothing is said."""
        out = np.zeros(n, dtype=np.int32)
        for p in self.placed:
            pcm = p.utterance.pcm
            lo, hi = max(start, p.at), min(start + n, p.at + pcm.size)
            if lo < hi:
                out[lo - start:hi - start] += pcm[lo - p.at:hi - p.at]
        return np.clip(out, -32768, 32767).astype(np.int16)

    def loudness(self, start: int, n: int) -> float:
        """RMS of samples [start, start + n)."""
        if n <= 0:
            return 0.0
        chunk = self.samples(max(0, start), n).astype(np.float64)
        return float(np.sqrt(np.mean(chunk * chunk)))

    def drop_said(self, before: int) -> None:
        """Forget utterances whose sound is all before sample ``before`` (already sent)."""
        self.placed = [p for p in self.placed if p.at + p.utterance.pcm.size > before]


class SpeechAudioTrack(MediaStreamTrack):
    """The speech timeline as 20 ms Opus-ready frames, paced from ``timeline``: sample ``k``
    is captured at ``timeline.capture_ns(k / 48000)``."""

    kind = "audio"

    def __init__(self, timeline: Timeline, speech: SpeechTimeline) -> None:
        super().__init__()
        self.timeline = timeline
        self.speech = speech
        self.captured = 0  # samples whose content is fixed (handed to the encoder)
        self._next = 0
        self._per_frame = int(AUDIO_RATE * AUDIO_PTIME_S)

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        start = self._next
        self._next += self._per_frame
        await self.timeline.sleep_until(fractions.Fraction(start, AUDIO_RATE))
        # The content is read at the frame's capture instant: an interruption until then
        # silences it.
        pcm = self.speech.samples(start, self._per_frame)
        self.captured = start + self._per_frame
        self.speech.drop_said(start - AUDIO_RATE)  # the face still looks a moment back
        frame = AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = AUDIO_RATE
        frame.pts = start
        frame.time_base = fractions.Fraction(1, AUDIO_RATE)
        return frame


class FaceVideoTrack(MediaStreamTrack):
    """A face whose mouth opens with the speech's loudness at each frame's capture instant."""

    kind = "video"

    def __init__(self, timeline: Timeline, speech: SpeechTimeline, *, width: int = 640,
                 height: int = 360, fps: int = 30) -> None:
        super().__init__()
        self.timeline = timeline
        self.speech = speech
        self.width, self.height, self.fps = width, height, fps
        self.frame_index = 0
        self.openings: dict[int, float] = {}  # frame number -> mouth opening drawn, 0..1
        yy, xx = np.mgrid[0:height, 0:width]
        cy, cx = height / 2, width / 2
        self._yy, self._xx, self._cy, self._cx = yy, xx, cy, cx
        head = ((xx - cx) / (height * 0.32)) ** 2 + ((yy - cy) / (height * 0.42)) ** 2 <= 1
        eyes = np.zeros_like(head)
        for ex in (cx - height * 0.12, cx + height * 0.12):
            eyes |= ((xx - ex) / (height * 0.04)) ** 2 + ((yy - cy + height * 0.1)
                                                           / (height * 0.04)) ** 2 <= 1
        self._base = np.where(head, 180, 40).astype(np.uint8)
        self._base[eyes] = 30
        self._chroma = np.full((height // 2, width), 128, dtype=np.uint8)

    def opening(self, n: int) -> float:
        """How far open the mouth of frame ``n`` is, 0..1, from the audio around its capture."""
        centre = n * AUDIO_RATE // self.fps
        half = int(MOUTH_WINDOW_S * AUDIO_RATE / 2)
        return min(1.0, self.speech.loudness(centre - half, 2 * half) / FULL_MOUTH_RMS)

    async def recv(self) -> VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        n = self.frame_index
        self.frame_index += 1
        await self.timeline.sleep_until(fractions.Fraction(n, self.fps))
        opening = self.opening(n)
        self.openings[n] = opening
        luma = self._base.copy()
        h = self.height
        mouth = (((self._xx - self._cx) / (h * 0.12)) ** 2
                 + ((self._yy - self._cy - h * 0.17) / (h * (0.012 + 0.08 * opening))) ** 2 <= 1)
        luma[mouth] = 20
        frame = VideoFrame.from_ndarray(np.vstack([luma, self._chroma]), format="yuv420p")
        frame.pts = n * VIDEO_CLOCK // self.fps
        frame.time_base = fractions.Fraction(1, VIDEO_CLOCK)
        return frame


@dataclass(frozen=True)
class Said:
    """A cue the presenter posted: its id, and the house times of its sound and words."""

    cue_id: str
    onset_ns: int
    end_ns: int
    words: tuple[tuple[int, str], ...]


def cue_words(words: Sequence[tuple[int, str]], start: int, end: int) -> list[tuple[int, str]]:
    """A synthesiser's word times (any one timebase) as a cue [start, end) takes them: espeak-ng
    begins a word in the silence before its sound, so a word is said from the cue's start at
    the earliest; none from its end on; each after the one before (a word espeak-ng times
    with its predecessor goes without a time of its own)."""
    timed: list[tuple[int, str]] = []
    for t, w in words:
        t = max(start, t)
        if t >= end or not w.strip():
            continue
        if timed and t <= timed[-1][0]:
            continue  # timed with the word before: shown with it, under its timestamp
        timed.append((t, w))
    return timed


class TtsPresenter:
    """Speaks text on a stream of a running service, with word-timed captions in ``lang``."""

    def __init__(
        self, base_url: str, stream: str, *, token: str | None = None, lang: str = "en",
        voice: str = "en-us", wpm: int = 160, clock_ns: Callable[[], int] = time.time_ns,
        ice_addresses: tuple[str, ...] = (),
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.stream = stream
        self.token = token
        self.lang = lang
        self.voice = voice
        self.wpm = wpm
        self.clock_ns = clock_ns
        self.ice_addresses = ice_addresses
        self.speech = SpeechTimeline()
        self.timeline: Timeline | None = None
        self.audio: SpeechAudioTrack | None = None
        self.video: FaceVideoTrack | None = None
        self.session: WhipSession | None = None
        self.captions: CaptionPublisher | None = None
        # House time minus this presenter's clock, from the clock join (0 without one: the
        # same host, or a presenter that could not join).
        self.house_offset_ns = 0
        self._count = 0

    async def __aenter__(self) -> TtsPresenter:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Publish the face and the voice (silent until :meth:`say`) and join the house clock."""
        timeline = self.timeline = Timeline.starting_now(self.clock_ns)
        self.audio = SpeechAudioTrack(timeline, self.speech)
        self.video = FaceVideoTrack(timeline, self.speech)
        self.session = await publish(
            f"{self.base_url}/whip/{self.stream}", [self.audio, self.video], token=self.token,
            capture_start_ns=timeline.start_house_ns, clock_ns=self.clock_ns,
            ice_addresses=self.ice_addresses,
        )
        report = await self.session.joined()
        if report is not None:
            self.house_offset_ns = report.offset_ns
        self.captions = CaptionPublisher(self.base_url, self.stream, token=self.token)
        await self.captions.connect()

    def house_ns(self, sample: int) -> int:
        """The house time sample ``sample`` of the voice is captured at."""
        assert self.timeline is not None
        return (self.timeline.capture_ns(fractions.Fraction(sample, AUDIO_RATE))
                + self.house_offset_ns)

    async def say(self, text: str, *, cue_id: str | None = None) -> Said:
        """Speak ``text`` after what is already queued (or LEAD_S from now) and post its cue
        with espeak-ng's word timings, before its sound is captured."""
        if self.audio is None or self.captions is None:
            raise RuntimeError("start the presenter first")
        utterance = await asyncio.to_thread(tts.synthesize, text, self.voice, self.wpm)
        if utterance.silent:
            raise ValueError(f"nothing to say in {text!r}")
        earliest = self.audio.captured + round(LEAD_S * AUDIO_RATE)
        placed = self.speech.place(utterance, earliest, round(GAP_S * AUDIO_RATE))
        self._count += 1
        cue_id = cue_id or f"say-{self._count}"
        onset, end = self.house_ns(placed.onset), self.house_ns(placed.end)
        timed = cue_words([(self.house_ns(placed.at + w.start), w.text)
                           for w in utterance.words], onset, end)
        cue = {"id": cue_id, "start": onset, "end": end, "text": utterance.text.strip(),
               "words": [{"start": t, "text": w} for t, w in timed]}
        await self.captions.send(self.lang, [cue], timebase="house_ns")
        return Said(cue_id, onset, end, tuple(timed))

    async def interrupt(self) -> int:
        """Stop speaking now: silence from the first sample not yet captured, and tell the
        caption service the speaker was cut off at that sample's house time (returned)."""
        if self.audio is None or self.captions is None:
            raise RuntimeError("start the presenter first")
        at = self.audio.captured
        self.speech.interrupt(at)
        house = self.house_ns(at)
        await self.captions.interrupt(self.lang, house)
        return house

    async def close(self) -> None:
        if self.captions is not None:
            await self.captions.close()
        if self.session is not None:
            await self.session.close()
        for track in (self.audio, self.video):
            if track is not None:
                track.stop()
