"""The house clock: one never-decreasing Unix-ns timeline for the whole room.

``ptp`` (IEEE 1588 messages and slave port) and ``ntp`` (SNTP) are pure protocol cores; ``net``
owns the sockets and kernel timestamps; ``servo`` and ``fused`` turn measurements into house
time; ``exchange`` is the four-timestamp clock join for peers (proto/clock.md); ``service`` is
the component the application runs (``ClockService``); ``local`` is the one seam to the host's
clocks; ``cli`` is ``sfu-sidecar clock``.
"""
