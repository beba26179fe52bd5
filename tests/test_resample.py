"""The windowed-sinc resampler: lengths, a tone carried through, and onsets kept in place."""

from __future__ import annotations

import numpy as np
import pytest

from sfu_sidecar.resample import resample


@pytest.mark.parametrize(("src", "dst"), [(22_050, 48_000), (44_100, 48_000), (48_000, 16_000)])
def test_a_tone_comes_through_at_the_new_rate(src: int, dst: int) -> None:
    n = src // 2
    tone = np.sin(2 * np.pi * 440.0 * np.arange(n) / src)
    out = resample(tone, src, dst)
    assert out.size == -(-n * dst // src)
    t = np.arange(out.size) / dst
    inner = slice(64, out.size - 64)  # away from the zero padding at both ends
    error = out[inner] - np.sin(2 * np.pi * 440.0 * t[inner])
    assert float(np.max(np.abs(error))) < 1e-3


def test_an_onset_stays_within_a_millisecond() -> None:
    src, dst = 22_050, 48_000
    x = np.zeros(src)
    x[10_000:] = 8000 * np.sin(2 * np.pi * 300.0 * np.arange(src - 10_000) / src)
    out = resample(x, src, dst)
    first = int(np.flatnonzero(np.abs(out) > 64)[0])
    assert abs(first - 10_000 * dst / src) <= dst / 1000


def test_short_and_empty_inputs() -> None:
    assert resample(np.zeros(0), 22_050, 48_000).size == 0
    assert resample(np.ones(3, dtype=np.int16), 22_050, 48_000).size == 7
