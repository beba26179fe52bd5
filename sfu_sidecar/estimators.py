"""Robust and windowed estimators over short series: RMS, peak-to-peak, excess kurtosis and
the Theil-Sen line. Pure; shared by the probe's timing statistics and the speech alignment's
drift fit.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

# The median absolute deviation times this estimates a normal distribution's sigma.
MAD_TO_SIGMA = 1.4826


def rms(values: Iterable[float]) -> float | None:
    vals = list(values)
    if not vals:
        return None
    return math.sqrt(sum(v * v for v in vals) / len(vals))


def peak_to_peak(values: Sequence[float]) -> float | None:
    return max(values) - min(values) if values else None


def excess_kurtosis(values: Sequence[float]) -> float | None:
    """Population excess kurtosis ``m4 / m2**2 - 3`` (moments about the mean, divided by n).

    0 for a normal distribution, -1.2 for a uniform one, large for a few outliers among
    regular values. None with fewer than four values or no spread at all.
    """
    n = len(values)
    if n < 4:
        return None
    mean = sum(values) / n
    dev2 = [(v - mean) * (v - mean) for v in values]
    m2 = sum(dev2) / n
    if m2 <= 1e-18:
        return None
    m4 = sum(d * d for d in dev2) / n
    return m4 / (m2 * m2) - 3.0


@functools.lru_cache(maxsize=256)
def _pairs(n: int) -> tuple[Any, Any]:
    return np.triu_indices(n, k=1)


def theil_sen(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Theil-Sen line: the median of the slopes of all pairs, then the median intercept.

    Robust to up to ~29 % of wild points; O(n**2) pairs, done in numpy for the few dozen
    points a fit holds.
    """
    xs = np.asarray(x, dtype=np.float64)
    ys = np.asarray(y, dtype=np.float64)
    i, j = _pairs(len(xs))
    dx = xs[j] - xs[i]
    keep = dx != 0
    if not keep.any():
        raise ValueError("theil_sen needs two distinct x values")
    slope = float(np.median((ys[j] - ys[i])[keep] / dx[keep]))
    intercept = float(np.median(ys - slope * xs))
    return slope, intercept
