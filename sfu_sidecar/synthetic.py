"""A synthetic broadcaster source: flash/beep video and audio paced from one clock.

Both tracks derive every capture time from one start instant, so the capture time of each frame
and each audio sample is known exactly (a flash and its beep are captured at the same house
instant). Each video frame also carries its frame number as a row of black/white blocks that
survive lossy VP8/H.264 coding, so a receiver can name the frame it decoded without a side channel.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame, VideoFrame

VIDEO_CLOCK = 90000
AUDIO_RATE = 48000
AUDIO_PTIME_S = 0.020
FLASH_S = 0.1  # flash and beep last 100 ms at the start of every second
BEEP_HZ = 1000.0
CODE_BITS = 20
CODE_ROWS = 24  # height of the frame-number strip; 32 px wide blocks survive 1.5 Mbps VP8


@dataclass(frozen=True)
class Timeline:
    """One start instant on two clocks: house time (for capture stamps) and monotonic (pacing)."""

    start_house_ns: int
    start_monotonic: float

    @classmethod
    def starting_now(cls, now_ns: Callable[[], int]) -> Timeline:
        return cls(now_ns(), time.monotonic())

    def capture_ns(self, offset_s: fractions.Fraction) -> int:
        return self.start_house_ns + int(offset_s * 1_000_000_000)

    async def sleep_until(self, offset_s: fractions.Fraction) -> None:
        delay = self.start_monotonic + float(offset_s) - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


def is_flash(offset_s: fractions.Fraction) -> bool:
    return offset_s % 1 < FLASH_S


def encode_frame_number(y_plane: np.ndarray, number: int) -> None:
    """Write ``number`` as CODE_BITS blocks across the top strip of a luma plane."""
    width = y_plane.shape[1]
    block = width // CODE_BITS
    for bit in range(CODE_BITS):
        value = 235 if (number >> (CODE_BITS - 1 - bit)) & 1 else 16
        y_plane[:CODE_ROWS, bit * block : (bit + 1) * block] = value


def decode_frame_number(y_plane: np.ndarray) -> int:
    """Read back the number written by :func:`encode_frame_number` from a decoded luma plane."""
    width = y_plane.shape[1]
    block = width // CODE_BITS
    number = 0
    for bit in range(CODE_BITS):
        # Sample the block's centre: edges blur under lossy coding.
        centre = y_plane[4 : CODE_ROWS - 4, bit * block + 4 : (bit + 1) * block - 4]
        number = (number << 1) | int(float(centre.mean()) > 128)
    return number


class FlashVideoTrack(MediaStreamTrack):
    """Gray frames, white for the first 100 ms of every second, numbered in the top strip."""

    kind = "video"

    def __init__(
        self, timeline: Timeline, *, width: int = 640, height: int = 360, fps: int = 30
    ) -> None:
        super().__init__()
        self.timeline = timeline
        self.width, self.height, self.fps = width, height, fps
        self.frame_index = 0
        self.capture_log: dict[int, int] = {}  # frame number -> capture house ns
        self._chroma = np.full((height // 2, width), 128, dtype=np.uint8)

    async def recv(self) -> VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        n = self.frame_index
        self.frame_index += 1
        offset = fractions.Fraction(n, self.fps)
        await self.timeline.sleep_until(offset)
        luma = np.full((self.height, self.width), 235 if is_flash(offset) else 60, dtype=np.uint8)
        # A moving bar keeps the encoder honest (a static picture compresses to nothing).
        x = (n * 8) % self.width
        luma[CODE_ROWS + 8 :, x : x + 16] = 128
        encode_frame_number(luma, n)
        frame = VideoFrame.from_ndarray(np.vstack([luma, self._chroma]), format="yuv420p")
        frame.pts = n * VIDEO_CLOCK // self.fps
        frame.time_base = fractions.Fraction(1, VIDEO_CLOCK)
        self.capture_log[n] = self.timeline.capture_ns(offset)
        return frame


class BeepAudioTrack(MediaStreamTrack):
    """Silence with a 1 kHz beep for the first 100 ms of every second, 20 ms frames at 48 kHz."""

    kind = "audio"

    def __init__(self, timeline: Timeline) -> None:
        super().__init__()
        self.timeline = timeline
        self.samples_sent = 0
        self._per_frame = int(AUDIO_RATE * AUDIO_PTIME_S)

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        start = self.samples_sent
        self.samples_sent += self._per_frame
        await self.timeline.sleep_until(fractions.Fraction(start, AUDIO_RATE))
        k = np.arange(start, start + self._per_frame)
        in_beep = (k % AUDIO_RATE) < int(FLASH_S * AUDIO_RATE)
        wave = np.sin(2 * np.pi * BEEP_HZ * k / AUDIO_RATE) * 0.5 * in_beep
        pcm = (wave * 32767).astype("<i2").reshape(1, -1)
        frame = AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
        frame.sample_rate = AUDIO_RATE
        frame.pts = start
        frame.time_base = fractions.Fraction(1, AUDIO_RATE)
        return frame


class PcmAudioTrack(MediaStreamTrack):
    """Given mono 48 kHz samples (speech, say) paced from ``timeline``, then silence; 20 ms
    frames. Sample ``k`` is captured at ``timeline.capture_ns(k / 48000)``, exactly."""

    kind = "audio"

    def __init__(self, timeline: Timeline, pcm: np.ndarray, *, loop: bool = False) -> None:
        super().__init__()
        self.timeline = timeline
        self.pcm = np.asarray(pcm, dtype="<i2")
        self.loop = loop
        self.samples_sent = 0
        self._per_frame = int(AUDIO_RATE * AUDIO_PTIME_S)

    def _samples(self, start: int) -> np.ndarray:
        n, size = self._per_frame, len(self.pcm)
        if self.loop and size:
            return self.pcm[np.arange(start, start + n) % size]
        out = np.zeros(n, dtype="<i2")
        if start < size:
            chunk = self.pcm[start:start + n]
            out[:len(chunk)] = chunk
        return out

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        start = self.samples_sent
        self.samples_sent += self._per_frame
        await self.timeline.sleep_until(fractions.Fraction(start, AUDIO_RATE))
        frame = AudioFrame.from_ndarray(self._samples(start).reshape(1, -1), format="s16",
                                        layout="mono")
        frame.sample_rate = AUDIO_RATE
        frame.pts = start
        frame.time_base = fractions.Fraction(1, AUDIO_RATE)
        return frame
