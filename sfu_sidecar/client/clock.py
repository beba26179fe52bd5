"""Join the service's house clock from a publisher: the clock kit's join, for clients.

::

    clock = await join_clock("ws://host:8080")
    cue_start_ns = clock.now_ns()          # house time, to stamp captions with

The join itself lives with the clock (:mod:`sfu_sidecar.clock.join`), where the relay's pull
uses it too.
"""

from sfu_sidecar.clock.join import HouseClock, clock_ws_url, join_clock

__all__ = ["HouseClock", "clock_ws_url", "join_clock"]
