"""Text-to-speech through espeak-ng's library: the samples at 48 kHz and the synthesiser's own
timing (word starts, the first and last sounding sample), voices, and the errors it gives."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from sfu_sidecar import tts
from sfu_sidecar.exceptions import LocalError, TtsError, TtsUnavailable
from tests.support import speech

MS = tts.RATE // 1000
TEXTS = (
    "Hello, and welcome to the evening news.",
    "Keep calm.",  # a /k/: its closure is silent, so the word starts before the sound
    "Stocks fell sharply today.",
    "After a long and careful review, the committee approved the new budget.",
)


def _sounding(pcm: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.abs(pcm.astype(np.int32)) > tts.SOUND_THRESHOLD)


@pytest.mark.parametrize("text", TEXTS)
def test_onset_and_end_are_the_first_and_last_sounding_samples(text: str) -> None:
    said = tts.synthesize(text)
    assert said.rate == 48_000 and said.pcm.dtype == np.int16 and said.pcm.ndim == 1
    assert not said.silent
    loud = _sounding(said.pcm)
    assert abs(int(loud[0]) - said.onset) <= MS, (loud[0], said.onset)
    assert abs(int(loud[-1]) + 1 - said.end) <= MS, (loud[-1], said.end)
    assert 0 <= said.onset < said.end <= said.pcm.size
    # Speech, not a click: most of what lies between is sound (words' own pauses aside).
    assert said.end - said.onset > 0.5 * said.pcm.size


@pytest.mark.parametrize("text", TEXTS)
def test_word_starts_increase_and_name_the_words(text: str) -> None:
    said = tts.synthesize(text)
    assert [w.text for w in said.words] == [w.strip(",.") for w in text.split()]
    starts = [w.start for w in said.words]
    assert starts == sorted(set(starts)), starts
    # The first word begins at or before the first sound; every word before the last sound.
    assert starts[0] <= said.onset and starts[-1] < said.end
    # A word starts where sound follows within its first 300 ms (silence of a stop aside).
    for start in starts:
        assert _sounding(said.pcm[start:start + 300 * MS]).size, start


def test_speaking_rate_sets_the_duration() -> None:
    slow = tts.synthesize(TEXTS[3], wpm=120)
    fast = tts.synthesize(TEXTS[3], wpm=240)
    spoken = (slow.end - slow.onset) / (fast.end - fast.onset)
    assert 1.6 < spoken < 2.4, spoken


def test_voices_and_their_variants_sound_different() -> None:
    voices = ("en-us", "en-us+f3", "en-gb", "de+m3", "fr+f2")
    said = {v: tts.synthesize("Guten Abend, bonsoir, good evening.", voice=v) for v in voices}
    for voice, u in said.items():
        assert not u.silent and u.voice == voice, voice
    sounds = {u.pcm.tobytes() for u in said.values()}
    assert len(sounds) == len(voices)


@pytest.mark.parametrize(("voice", "wpm", "message"), [
    ("zz-yy", 160, "no espeak-ng voice 'zz-yy'"),  # (espeak-ng does speak Klingon: art/piqd)
    ("en-us+nosuch", 160, "no espeak-ng voice variant 'nosuch'"),
    ("", 160, "no espeak-ng voice ''"),
    ("en-us", 20, "wpm must be between 80 and 450"),
])
def test_a_bad_voice_or_rate_is_a_clear_error(voice: str, wpm: int, message: str) -> None:
    with pytest.raises(TtsError, match=message) as err:
        tts.synthesize("Hello.", voice=voice, wpm=wpm)
    assert isinstance(err.value, LocalError) and not isinstance(err.value, TtsUnavailable)
    # The engine is still good after a refusal.
    assert not tts.synthesize("Hello.").silent


@pytest.mark.parametrize("text", ["", "   \n", "..."])
def test_nothing_to_say_gives_a_silent_utterance(text: str) -> None:
    said = tts.synthesize(text)
    assert said.silent and (said.onset, said.end) == (0, 0) and said.words == ()
    assert _sounding(said.pcm).size == 0


def test_without_a_library_it_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tts, "_engine", None)
    monkeypatch.setattr(tts, "_failure", None)
    monkeypatch.setitem(sys.modules, "espeakng_loader", None)  # import fails
    monkeypatch.setattr(tts, "SYSTEM_LIBRARY", "libespeak-ng-absent.so.1")
    for _ in range(2):  # the failure is remembered, and said again
        with pytest.raises(TtsUnavailable, match=r"pip install 'sfu-sidecar\[demo\]'") as err:
            tts.synthesize("Hello.")
        assert "no system libespeak-ng-absent.so.1" in err.value.reason
    with pytest.raises(TtsUnavailable):
        tts.engine()


def test_engine_names_its_version_and_origin() -> None:
    assert tts.engine().startswith("espeak-ng 1.")


@pytest.mark.needs("espeak-ng")
def test_onsets_match_the_espeak_ng_command() -> None:
    """The library's onsets against the truths the speech tests read off the espeak-ng command
    (tests/support/speech.py). The two may be different builds: their sentence ends differ by
    tens of milliseconds for some voices, their onsets by a fraction of one."""
    for voice in speech.VOICES:
        for text in speech.sentences_for(voice)[:3]:
            said = tts.synthesize(text, voice=voice)
            _, onset, _ = speech.sentence(voice, 160, text)
            assert abs(said.onset - onset) <= MS, (voice, text, said.onset, onset)


def test_words_are_cut_from_the_text_by_character() -> None:
    said = tts.synthesize("Schöne Grüße aus München, liebe Zuschauer.", voice="de")
    assert [w.text for w in said.words] == ["Schöne", "Grüße", "aus", "München", "liebe",
                                            "Zuschauer"]
