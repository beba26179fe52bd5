"""The robust and windowed estimators, on values worked out by hand."""

from __future__ import annotations

import math

import pytest

from sfu_sidecar.estimators import excess_kurtosis, peak_to_peak, rms, theil_sen


def test_theil_sen_on_a_small_set_by_hand() -> None:
    # Slopes of the pairs: (0,1) 1, (0,2) 1, (0,3) 3, (1,2) 1, (1,3) 4, (2,3) 7 -> median 2;
    # intercepts y - 2x: 0, -1, -2, 3 -> median -0.5.
    assert theil_sen([0, 1, 2, 3], [0, 1, 2, 9]) == (2.0, -0.5)
    with pytest.raises(ValueError):
        theil_sen([1, 1], [0, 2])


def test_excess_kurtosis_reference_values() -> None:
    assert excess_kurtosis([1.0, 2.0, 3.0]) is None
    assert excess_kurtosis([5.0] * 8) is None
    # Uniform on four points 1..4: m2 = 1.25, m4 = (2 * 1.5**4 + 2 * 0.5**4) / 4 = 2.5625.
    assert excess_kurtosis([1.0, 2.0, 3.0, 4.0]) == pytest.approx(2.5625 / 1.5625 - 3)


def test_rms_and_peak_to_peak() -> None:
    assert rms([]) is None and peak_to_peak([]) is None
    assert rms([3.0, -4.0]) == pytest.approx(math.sqrt(12.5))
    assert peak_to_peak([2.0, -1.0, 5.0]) == 6.0
