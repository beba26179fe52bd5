"""Speech segments from PCM blocks stamped with their capture times (pure: no clock, no I/O).

Three stages, each for a reason:

1. **Frame decisions.** A voice activity detector (``vad.Vad``) judges frames of
   ``vad.frame_samples``. Frames quieter than ``gate_dbfs`` are never speech whatever it says:
   Opus comfort noise and the hiss of an idle microphone sit far below any voice.
2. **Smoothing with hangover.** A segment opens after ``onset_ms`` of voiced frames in a row
   and closes after ``hangover_ms`` of unvoiced ones, so a click does not open one and the
   pauses inside a sentence (espeak-ng pauses 175-230 ms at a comma at 160 wpm) do not split it.
3. **Onset refinement.** The first voiced frame only says that speech began somewhere near it:
   a VAD frame is 10-32 ms, and soft onsets (/h/, /s/) are voiced late or not at all. That
   frame and the one before it are analysed in short frames (``analysis_ms`` long, every
   ``step_ms``), each split into frequency bands and compared with the bands' noise floor
   measured before them; a short frame is loud when a band rises ``rise_db`` above its floor
   (bands, because a fricative stands out of white noise at high frequencies and a vowel out of
   rumble at low ones). The onset lies in the first loud frame of the run that leads into the
   voiced frame, walking back across quiet stretches shorter than ``bridge_ms`` (a plosive's
   closure) and at most ``lookback_ms``; within it, it is the first sample louder than the
   noise could be. Where the floor is digital silence that is the first sample above
   ``floor_dbfs``: exact. Offsets are found the same way around the last voiced frame.

Times: every block carries the capture time of its first sample; sample ``k`` of it was
captured ``k / sample_rate`` later. A block that does not continue the previous one within
``gap_ms`` is a gap (lost packets, DTX, a restarted publisher): whatever speech was open ends
at the last sample heard, and nothing is looked for across it.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

from sfu_sidecar.speech.segments import SpeechSegment
from sfu_sidecar.speech.vad import Vad

NS = 1_000_000_000
FULL_SCALE = 32768.0

Samples = npt.NDArray[np.float32]
Floats = npt.NDArray[np.float64]
# Where the bands of the refinement's analysis start (Hz; the last runs to Nyquist): every band
# spans at least three bins of a 4 ms frame (250 Hz apart), so its power over noise is steady
# enough for a fixed rise above its median to be crossed by speech and not by the noise itself.
# Below 250 Hz is rumble and hum.
BAND_EDGES_HZ = (250, 1000, 2000, 4000, 8000, 16000)
# A sample is sound rather than noise at 4.5 times the noise's RMS: Gaussian noise gets there
# once in 150 000 samples, so the few hundred searched before an onset hold no false first one.
SAMPLE_RISE = 4.5
_SIGNED = frozenset({"gate_dbfs", "floor_dbfs"})


@dataclass(frozen=True, slots=True)
class Tuning:
    """The detector's constants; each can be given to ``SpeechDetector`` by name."""

    onset_ms: float = 60.0  # voiced run that opens a segment (at least two frames)
    hangover_ms: float = 400.0  # unvoiced run that closes one
    gate_dbfs: float = -55.0  # frames with less energy (RMS) than this are never speech
    gap_ms: float = 5.0  # a block starting further than this from the last one's end: a gap
    step_ms: float = 1.0  # step of the refinement's analysis frames
    analysis_ms: float = 4.0  # length of the refinement's analysis frames
    rise_db: float = 9.0  # a band this far above its noise floor is sound
    # A sample this loud is sound however quiet the floor is: below the first period of any
    # phoneme (the tests' truth uses the same level on espeak-ng's output), above digital
    # silence and Opus's coding noise in it.
    floor_dbfs: float = -54.0
    bridge_ms: float = 40.0  # quiet stretches shorter than this inside an onset are bridged
    lookback_ms: float = 250.0  # how far before the voiced frame an onset may lie
    noise_ms: float = 200.0  # audio before the search in which the noise floor is measured
    dc_ms: float = 500.0  # time constant of the DC offset estimate

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not math.isfinite(value) or (value <= 0 and f.name not in _SIGNED):
                raise ValueError(f"speech detector: {f.name} must be positive, got {value}")


class _History:
    """The most recent samples heard, addressed by their index in the stream."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._buf: Samples = np.zeros(2 * keep, dtype=np.float32)
        self.start = 0  # stream index of _buf[0]
        self.end = 0  # stream index just after the last sample

    def append(self, x: Samples) -> None:
        used = self.end - self.start
        if used + x.size > self._buf.size:
            kept = min(used, self.keep)
            tail = self._buf[used - kept:used].copy()
            if kept + x.size > self._buf.size:
                self._buf = np.zeros(kept + x.size + self.keep, dtype=np.float32)
            self._buf[:kept] = tail
            self.start = self.end - kept
            used = kept
        self._buf[used:used + x.size] = x
        self.end += x.size

    def view(self, lo: int, hi: int) -> tuple[Samples, int]:
        """Samples ``[lo, hi)`` as far as they are still held, and the index of the first."""
        lo = max(lo, self.start)
        hi = max(min(hi, self.end), lo)
        return self._buf[lo - self.start:hi - self.start], lo


class SpeechDetector:
    """Finds speech segments in one audio stream; see the module docstring for how."""

    def __init__(self, sample_rate: int, vad: Vad, **tuning: float) -> None:
        self.sample_rate = sample_rate
        self.vad = vad
        self.tuning = t = Tuning(**tuning)
        per_ms = sample_rate / 1000.0
        self._frame = vad.frame_samples
        frame_ms = self._frame / per_ms
        self._onset_frames = max(2, math.ceil(t.onset_ms / frame_ms))
        self._hangover_frames = max(1, math.ceil(t.hangover_ms / frame_ms))
        self._gap_ns = round(t.gap_ms * 1_000_000)
        self._hop = max(1, round(t.step_ms * per_ms))
        self._hann = np.hanning(max(8, round(t.analysis_ms * per_ms))).astype(np.float64)
        self._hann_energy = float(np.dot(self._hann, self._hann))
        bin_hz = sample_rate / self._hann.size
        edges = [round(hz / bin_hz) for hz in BAND_EDGES_HZ if hz < sample_rate / 2]
        self._bands = np.array(sorted({max(1, e) for e in edges}))
        self._band_floor: Floats = np.zeros(self._bands.size)
        self._bridge = max(1, round(t.bridge_ms * per_ms))
        self._lookback = round(t.lookback_ms * per_ms)
        self._noise = round(t.noise_ms * per_ms)
        self._dc_tau = t.dc_ms * per_ms
        self._gate_power = (FULL_SCALE * 10 ** (t.gate_dbfs / 20)) ** 2
        self._rise = 10 ** (t.rise_db / 10)
        self._floor_amp = FULL_SCALE * 10 ** (t.floor_dbfs / 20)
        # Enough history for the refinement of an onset (noise, lookback, the frame before the
        # voiced run and the run itself) and of an offset (the hangover after it).
        keep = (self._noise + self._lookback + self._hann.size
                + self._frame * (2 + max(self._onset_frames, self._hangover_frames)))
        self._history = _History(keep)
        # (stream index, capture ns) of each block's first sample, oldest first.
        self._anchor_index: list[int] = []
        self._anchor_ns: list[int] = []
        self._dc: float | None = None
        self._next_frame = 0  # stream index where the next VAD frame starts
        self._barrier = 0  # refinement never looks before this index (a gap, the last offset)
        self._run = 0  # voiced frames in a row while no segment is open
        self._run_start = 0
        self._unvoiced = 0  # unvoiced frames in a row while a segment is open
        self._open: int | None = None  # stream index of the open segment's onset
        self._open_ns: int | None = None
        self._last_voiced_end = 0
        self._noise_power = 0.0  # the floor measured before the latest onset

    @property
    def open_onset_ns(self) -> int | None:
        """Onset of speech still going on (``None`` when none is)."""
        return self._open_ns

    @property
    def heard_until_ns(self) -> int | None:
        """Capture time just after the last sample fed (``None`` before any)."""
        if not self._anchor_index:
            return None
        return self._time(self._history.end)

    def push(self, pcm: npt.NDArray[np.generic], first_sample_ns: int) -> list[SpeechSegment]:
        """Feed samples whose first sample was captured at ``first_sample_ns``; returns the
        segments that closed in this call. A gap in time (``first_sample_ns`` not continuing
        the previous block within ``gap_ms``) ends any open segment at the last sample heard."""
        samples = np.asarray(pcm)
        if samples.ndim != 1:
            raise ValueError(f"speech detector: mono samples expected, got shape {samples.shape}")
        closed: list[SpeechSegment] = []
        heard = self.heard_until_ns
        if heard is not None and abs(first_sample_ns - heard) > self._gap_ns:
            closed += self._interrupt()
        if samples.size == 0:
            return closed
        if heard is None or first_sample_ns != heard:
            self._anchor(first_sample_ns)
        self._history.append(self._remove_dc(samples))
        while self._next_frame + self._frame <= self._history.end:
            frame, _ = self._history.view(self._next_frame, self._next_frame + self._frame)
            segment = self._step(frame)
            if segment is not None:
                closed.append(segment)
            self._next_frame += self._frame
        return closed

    def end(self) -> list[SpeechSegment]:
        """The audio stopped: close any open segment (at the last sample heard if it was
        still voiced)."""
        return self._interrupt()

    # -- frames and the smoothing state machine

    def _step(self, frame: Samples) -> SpeechSegment | None:
        start = self._next_frame
        power = float(np.dot(frame, frame)) / frame.size
        # The VAD sees every frame, quiet ones too: a recurrent model's state follows the
        # audio, and the cost per second stays the same in silence and in speech.
        said = self.vad.is_speech(_int16(frame))
        voiced = said and power >= self._gate_power
        if self._open is None:
            if not voiced:
                self._run = 0
                return None
            if self._run == 0:
                self._run_start = start
            self._run += 1
            if self._run >= self._onset_frames:
                onset = self._refine_onset(self._run_start)
                self._open = onset
                self._open_ns = self._time(onset)
                self._last_voiced_end = start + self._frame
                self._unvoiced = 0
            return None
        if voiced:
            self._last_voiced_end = start + self._frame
            self._unvoiced = 0
            return None
        self._unvoiced += 1
        if self._unvoiced < self._hangover_frames:
            return None
        return self._close(self._refine_offset(self._last_voiced_end))

    def _close(self, offset: int) -> SpeechSegment:
        assert self._open is not None and self._open_ns is not None
        offset = max(offset, self._open)
        segment = SpeechSegment(self._open_ns, max(self._time(offset), self._open_ns))
        self._open = self._open_ns = None
        self._barrier = offset
        self._run = self._unvoiced = 0
        return segment

    def _interrupt(self) -> list[SpeechSegment]:
        """No more samples follow the ones heard: close what is open, start afresh."""
        end = self._history.end
        closed = []
        if self._open is not None:
            # Still voiced at the last frame: speech ran at least to the last sample heard.
            offset = end if self._unvoiced == 0 else self._refine_offset(self._last_voiced_end)
            closed.append(self._close(offset))
        self._barrier = self._next_frame = end
        self._run = self._unvoiced = 0
        return closed

    # -- refinement

    def _spectra(self, lo: int, hi: int) -> tuple[Floats, Floats, int]:
        """Band powers and broadband power (mean square) of the analysis frames laid from
        ``lo`` by ``hop`` samples, as far as ``[lo, hi)`` holds them; and the first's start."""
        n, hop = self._hann.size, self._hop
        x, first = self._history.view(lo, hi)
        count = (x.size - n) // hop + 1 if x.size >= n else 0
        if count <= 0:
            return np.zeros((0, self._bands.size)), np.zeros(0), first
        frames = x[(np.arange(count) * hop)[:, None] + np.arange(n)] * self._hann
        spectrum = np.abs(np.fft.rfft(frames, axis=1)) ** 2
        bands = np.add.reduceat(spectrum, self._bands, axis=1)
        power = (frames * frames).sum(axis=1) / self._hann_energy
        return bands, power, first

    def _loud(self, bands: Floats, power: Floats) -> npt.NDArray[np.bool_]:
        """Frames with sound in them: a band risen ``rise_db`` above its floor, and the frame
        louder than ``floor_dbfs`` (which alone decides where the floor is digital silence)."""
        risen = (bands >= self._band_floor * self._rise).any(axis=1)
        return risen & (power >= self._floor_amp**2)

    def _refine_onset(self, run_start: int) -> int:
        """The first sample of speech, near the first frame of a voiced run."""
        n, hop = self._hann.size, self._hop
        search_lo = max(run_start - self._frame, self._barrier)
        search_hi = run_start + self._frame
        reach = max(search_lo - self._lookback, self._barrier)
        bands, power, first = self._spectra(max(reach - self._noise, self._barrier), search_hi)
        centres = first + np.arange(power.size) * hop + n // 2
        # The noise floor: the median of each band over the frames before the search, so a
        # soft onset that began before the searched frames (and is among them) barely moves
        # it. Kept for the offset, and for an onset right after a gap, with nothing before it.
        before = centres < search_lo
        if before.sum() >= 10:
            self._band_floor = np.median(bands[before], axis=0)
            self._noise_power = float(np.median(power[before]))
        loud = self._loud(bands, power)
        searched = np.flatnonzero(loud & (centres >= search_lo))
        if searched.size == 0:
            return max(run_start, self._history.start)
        k = int(searched[0])
        # Walk back over the loud frames before it, across short quiet stretches.
        bridge = self._bridge // hop + 1
        j = k
        for i in range(k - 1, -1, -1):
            if centres[i] < reach:
                break
            if loud[i]:
                j = i
            elif j - i > bridge:
                break
        start = first + j * hop
        return self._first_sound(start - n // 2, start + n, start + n // 2)

    def _amplitude(self) -> float:
        return max(SAMPLE_RISE * math.sqrt(self._noise_power), self._floor_amp)

    def _first_sound(self, lo: int, hi: int, otherwise: int) -> int:
        """The first sample in ``[lo, hi)`` louder than the noise allows: exact where the
        noise is low; in loud noise the frame's centre is as close as one gets."""
        x, at = self._history.view(max(lo, self._barrier), hi)
        hits = np.flatnonzero(np.abs(x) >= self._amplitude())
        return at + int(hits[0]) if hits.size else otherwise

    def _refine_offset(self, voiced_end: int) -> int:
        """Just after the last sample of speech, near the end of the last voiced frame (which
        may hold only the first few samples of the sound's tail)."""
        n, hop = self._hann.size, self._hop
        lo = max(voiced_end - 2 * self._frame, self._barrier, self._open or 0)
        hi = min(voiced_end + self._frame, self._history.end)
        bands, power, first = self._spectra(lo, hi)
        loud = np.flatnonzero(self._loud(bands, power))
        if loud.size == 0:
            return voiced_end
        start = first + int(loud[-1]) * hop
        x, at = self._history.view(start, start + n + n // 2)
        hits = np.flatnonzero(np.abs(x) >= self._amplitude())
        return at + int(hits[-1]) + 1 if hits.size else start + n // 2

    # -- time and level

    def _anchor(self, first_sample_ns: int) -> None:
        index = self._history.end
        self._anchor_index.append(index)
        self._anchor_ns.append(first_sample_ns)
        # Anchors before the oldest sample still held are of no further use (the latest one
        # at or before it still times that sample).
        drop = bisect.bisect_right(self._anchor_index, self._history.start) - 1
        if drop > 0:
            del self._anchor_index[:drop]
            del self._anchor_ns[:drop]

    def _time(self, index: int) -> int:
        i = max(0, bisect.bisect_right(self._anchor_index, index) - 1)
        return self._anchor_ns[i] + (index - self._anchor_index[i]) * NS // self.sample_rate

    def _remove_dc(self, samples: npt.NDArray[np.generic]) -> Samples:
        """The samples as float32 less a slowly tracked DC offset; the estimate moves linearly
        across the block, so its updates put no steps into the signal."""
        x = samples.astype(np.float32)
        mean = float(x.mean())
        previous = mean if self._dc is None else self._dc
        alpha = 1.0 - math.exp(-x.size / self._dc_tau)
        self._dc = previous + alpha * (mean - previous)
        x -= np.linspace(previous, self._dc, x.size, dtype=np.float32)
        return x


def _int16(frame: Samples) -> npt.NDArray[np.int16]:
    return np.clip(np.rint(frame), -32768, 32767).astype(np.int16)
