"""The one seam through which the clock package reads the host's clocks.

Pure cores never call these; adapters do, and tests replace them with simulated clocks by
passing readings into the cores instead.
"""

from __future__ import annotations

import time


def realtime_ns() -> int:
    """CLOCK_REALTIME: the host's UTC, the timescale of kernel packet timestamps."""
    return time.clock_gettime_ns(time.CLOCK_REALTIME)


def monotonic_ns() -> int:
    """CLOCK_MONOTONIC: for timeouts and intervals, immune to host clock steps."""
    return time.monotonic_ns()
