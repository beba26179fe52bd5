"""Speech with known onsets: espeak-ng sentences laid on a 48 kHz timeline, with the truth.

espeak-ng's output is deterministic, so the truth is read off its own samples: a sentence's
onset is where it was placed plus its first sample louder than ``TRUTH_THRESHOLD``, its offset
just after its last one. Sentences are resampled from espeak-ng's 22050 Hz to 48 kHz with the
product's windowed-sinc interpolator (:mod:`sfu_sidecar.resample`: its pre-ringing reaches less
than a millisecond before an onset, at under 1 % of the onset's amplitude). Noise (white, pink)
or music-like tones can be mixed in at a given SNR, measured against the speech's power over
its sentences.

Each sentence is synthesised once per test session (``espeak``/``sentence`` are cached).
"""

from __future__ import annotations

import fractions
import functools
import shutil
import struct
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from sfu_sidecar.resample import resample

RATE = 48_000
ESPEAK_RATE = 22_050
ESPEAK = shutil.which("espeak-ng") or "/usr/bin/espeak-ng"
# |sample| in espeak-ng's int16 output above which a sentence has begun: -54 dBFS, below any
# phoneme's first period and above the sinc interpolator's pre-ringing.
TRUTH_THRESHOLD = 64

# Voices with their variants (+f3: a female voice, +m3: another male one), and sentences of
# different lengths whose first sounds cover the hard onsets: /h/ and /s/ (quiet noise), /p/ /t/
# /k/ (a burst after silence), vowels, nasals and approximants.
VOICES = ("en-us", "en-gb+f3", "de+m3", "fr+f2")
SENTENCES: dict[str, tuple[str, ...]] = {
    "en": (
        "Hello and welcome to the evening news.",
        "Stocks fell sharply today.",
        "Power was restored to most homes by midnight, the company said.",
        "Many people watched the launch.",
        "Keep calm.",
        "After a long and careful review, the committee approved the new budget.",
        "The weather tomorrow will be mild and dry.",
        "Summer is coming.",
    ),
    "de": (
        "Guten Abend, meine Damen und Herren.",
        "Heute hat es in Berlin geregnet.",
        "Sieben Kinder spielten im Park.",
        "Achtung.",
        "Die Regierung hat am Montag einen neuen Plan vorgestellt.",
        "Morgen wird es sonnig.",
    ),
    "fr": (
        "Bonsoir et bienvenue.",
        "Le train part dans cinq minutes.",
        "Il fait beau aujourd'hui, mais demain il pleuvra.",
        "Silence.",
        "Nous avons appris la nouvelle ce matin.",
        "Tout le monde est parti.",
    ),
}


def sentences_for(voice: str) -> tuple[str, ...]:
    return SENTENCES[voice.split("+")[0].split("-")[0]]


@dataclass(frozen=True)
class Speech:
    """Mono int16 PCM at ``RATE`` and where its sentences are (sample indices)."""

    pcm: npt.NDArray[np.int16]
    onsets: tuple[int, ...]
    offsets: tuple[int, ...]
    texts: tuple[str, ...] = field(default=())
    rate: int = RATE

    def onset_ns(self, start_ns: int = 0) -> list[int]:
        return [start_ns + i * 1_000_000_000 // self.rate for i in self.onsets]

    def offset_ns(self, start_ns: int = 0) -> list[int]:
        return [start_ns + i * 1_000_000_000 // self.rate for i in self.offsets]


@functools.lru_cache(maxsize=256)
def espeak(voice: str, wpm: int, text: str) -> npt.NDArray[np.int16]:
    """espeak-ng's own int16 samples at 22050 Hz (read-only; cached per session)."""
    out = subprocess.run([ESPEAK, "-v", voice, "-s", str(wpm), "--stdout", text],
                         check=True, capture_output=True, timeout=60).stdout
    samples = _wav_data(out)
    samples.setflags(write=False)
    return samples


def _wav_data(wav: bytes) -> npt.NDArray[np.int16]:
    """The sample data of a 16-bit mono WAV. espeak-ng writing to a pipe cannot seek back to
    fill in sizes, so its RIFF and data sizes are placeholders: the data runs to the end."""
    if wav[:4] != b"RIFF" or wav[8:12] != b"WAVE":
        raise ValueError("espeak-ng did not write a WAV")
    pos = 12
    while pos + 8 <= len(wav):
        chunk, size = struct.unpack_from("<4sI", wav, pos)
        if chunk == b"fmt ":
            _, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", wav, pos + 8)
            if (channels, rate, bits) != (1, ESPEAK_RATE, 16):
                raise ValueError(f"unexpected WAV format {channels} ch {rate} Hz {bits} bit")
        elif chunk == b"data":
            data = wav[pos + 8:]
            return np.frombuffer(data[:len(data) // 2 * 2], dtype="<i2").astype(np.int16)
        pos += 8 + size + (size & 1)
    raise ValueError("no data chunk in espeak-ng's WAV")


@functools.lru_cache(maxsize=256)
def sentence(voice: str, wpm: int, text: str) -> tuple[npt.NDArray[np.float64], int, int]:
    """One sentence at ``RATE``, with its first and just-after-last sound sample there."""
    raw = espeak(voice, wpm, text)
    loud = np.flatnonzero(np.abs(raw.astype(np.int32)) > TRUTH_THRESHOLD)
    if loud.size == 0:
        raise ValueError(f"espeak-ng said nothing for {text!r}")
    pcm = resample(raw, ESPEAK_RATE, RATE)
    pcm.setflags(write=False)
    scale = RATE / ESPEAK_RATE
    return pcm, round(int(loud[0]) * scale), round((int(loud[-1]) + 1) * scale)


def compose(parts: Sequence[tuple[str, int, str]], pauses_s: Sequence[float],
            lead_s: float = 0.5, tail_s: float = 0.8, gain: float = 1.0) -> Speech:
    """Sentences ``(voice, wpm, text)`` one after another: ``lead_s`` of silence, then each
    sentence followed by its pause (cycling through ``pauses_s``), then ``tail_s``. A pause
    runs from a sentence's last sound to the next one's first."""
    pieces = []
    placed: list[tuple[int, int]] = []
    length = 0
    cue = round(lead_s * RATE)  # where the next sentence's first sound goes
    for i, (voice, wpm, text) in enumerate(parts):
        pcm, first, end = sentence(voice, wpm, text)
        # Sentences never overlap, not even in their silent margins (the sum of two margins
        # could cross the truth threshold); a pause shorter than the margins grows.
        at = max(cue - first, length)
        pieces.append((at, pcm))
        placed.append((at + first, at + end))
        length = at + pcm.size
        cue = at + end + round(pauses_s[i % len(pauses_s)] * RATE)
    total = max(length, placed[-1][1] + round(tail_s * RATE)) if placed else length
    out = np.zeros(total)
    for at, pcm in pieces:
        out[at:at + pcm.size] += pcm
    out *= gain
    return Speech(_to_int16(out), tuple(a for a, _ in placed), tuple(b for _, b in placed),
                  tuple(text for _, _, text in parts))


def script(voice: str, wpm: int = 160, count: int | None = None,
           pauses_s: Sequence[float] = (0.9, 1.6, 0.7, 2.2, 1.2)) -> Speech:
    """A voice's sentences, in order, with varied pauses between them."""
    texts = sentences_for(voice)[:count]
    return compose([(voice, wpm, t) for t in texts], pauses_s)


def mix(speech: Speech, kind: str, snr_db: float, seed: int = 1) -> Speech:
    """``speech`` with ``kind`` ("white", "pink" or "tones") added at ``snr_db`` below the
    speech's power over its sentences (onset to offset, pauses within them included)."""
    rng = np.random.default_rng(seed)
    n = speech.pcm.size
    if kind == "white":
        noise = rng.standard_normal(n)
    elif kind == "pink":
        noise = pink(n, rng)
    elif kind == "tones":
        noise = tones(n, rng)
    else:
        raise ValueError(f"no such noise: {kind}")
    clean = speech.pcm.astype(np.float64)
    spans = np.concatenate([clean[a:b] for a, b in zip(speech.onsets, speech.offsets, strict=True)])
    speech_power = float(np.mean(spans**2))
    noise *= np.sqrt(speech_power / np.mean(noise**2) / 10 ** (snr_db / 10))
    return Speech(_to_int16(clean + noise), speech.onsets, speech.offsets, speech.texts,
                  speech.rate)


def pink(n: int, rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """Noise with a 1/f power spectrum (shaped in the frequency domain), 20 Hz upwards."""
    spectrum = rng.standard_normal(n // 2 + 1) + 1j * rng.standard_normal(n // 2 + 1)
    f = np.fft.rfftfreq(n, 1 / RATE)
    spectrum *= 1 / np.sqrt(np.maximum(f, 20.0))
    spectrum[0] = 0
    return np.fft.irfft(spectrum, n)


def tones(n: int, rng: np.random.Generator, note_s: float = 0.25) -> npt.NDArray[np.float64]:
    """Music-like: a chord of three notes of a pentatonic scale every ``note_s``, each with
    two overtones and 10 ms fades, so the level never drops to silence."""
    scale = 220.0 * 2 ** (np.array([0, 2, 4, 7, 9, 12, 14, 16, 19, 21]) / 12)
    step = round(note_s * RATE)
    out = np.zeros(n)
    t = np.arange(step) / RATE
    fade = np.minimum(1.0, np.minimum(t, t[::-1]) / 0.010)
    for lo in range(0, n, step):
        chord = np.zeros(step)
        for f in rng.choice(scale, size=3, replace=False):
            for k, amp in ((1, 1.0), (2, 0.5), (3, 0.25)):
                chord += amp * np.sin(2 * np.pi * f * k * t + rng.uniform(0, 2 * np.pi))
        hi = min(lo + step, n)
        out[lo:hi] = (chord * fade)[:hi - lo]
    return out


class Segment(Protocol):
    onset_ns: int
    offset_ns: int


def score(truth: Speech, start_ns: int, found: Sequence[Segment]
          ) -> tuple[list[float], int, int]:
    """Onset errors in ms (found - true) of the sentences found, sentences missed, and false
    segments, for ``truth`` laid from ``start_ns``. A segment belongs to the first sentence it
    overlaps that no earlier segment took; any segment left over is false (noise, or a
    sentence split in two), and a sentence no segment took is missed (or merged into the one
    before it)."""
    errors = []
    used = set()
    for onset, offset in zip(truth.onset_ns(start_ns), truth.offset_ns(start_ns), strict=True):
        for i, seg in enumerate(found):
            if i not in used and seg.onset_ns < offset and seg.offset_ns > onset:
                used.add(i)
                errors.append((seg.onset_ns - onset) / 1e6)
                break
    return errors, len(truth.onsets) - len(errors), len(found) - len(used)


def opus_packets(pcm: npt.NDArray[np.int16], bitrate: int = 32_000, frame_ms: int = 20,
                 application: str = "voip", channels: int = 1) -> list[bytes]:
    """``pcm`` (mono, or ``channels`` rows) encoded as a WebRTC publisher does: libopus through
    PyAV, one packet per ``frame_ms`` (a partial last frame is dropped), in order."""
    import av

    layout = "mono" if channels == 1 else "stereo"
    enc = av.CodecContext.create("libopus", "w")
    enc.sample_rate = RATE
    enc.layout = layout
    enc.format = "s16"
    enc.bit_rate = bitrate
    enc.time_base = fractions.Fraction(1, RATE)
    enc.options = {"application": application, "frame_duration": str(frame_ms)}
    enc.open()
    rows = pcm.reshape(channels, -1)
    step = RATE * frame_ms // 1000
    packets = []
    for lo in range(0, rows.shape[1] - step + 1, step):
        interleaved = np.ascontiguousarray(rows[:, lo:lo + step].T).reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(interleaved, format="s16", layout=layout)
        frame.sample_rate = RATE
        frame.pts = lo
        packets += [bytes(p) for p in enc.encode(frame)]
    packets += [bytes(p) for p in enc.encode(None)]
    return packets


def _to_int16(x: npt.NDArray[np.float64]) -> npt.NDArray[np.int16]:
    return np.clip(np.rint(x), -32768, 32767).astype(np.int16)
