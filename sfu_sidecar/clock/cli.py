"""``sfu-sidecar clock``: run the house clock alone and print one status line a second."""

from __future__ import annotations

import asyncio
import contextlib
import sys

from sfu_sidecar.clock.service import ClockService, status_line
from sfu_sidecar.config import Settings
from sfu_sidecar.exceptions import ConfigError
from sfu_sidecar.lifecycle import stop_on_signals
from sfu_sidecar.metrics import Metrics


async def _run(settings: Settings, count: int) -> int:
    service = ClockService(settings, Metrics())
    stop = stop_on_signals()
    try:
        await service.start()
    except ConfigError as exc:
        print(f"sfu-sidecar clock: {exc.reason}", file=sys.stderr)
        return 2
    try:
        printed = 0
        while count == 0 or printed < count:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            if stop.is_set():
                break
            print(status_line(service.status()), flush=True)
            printed += 1
    finally:
        await service.stop()
    return 0


def run_clock(settings: Settings, count: int = 0) -> int:
    """Print house clock status once a second; ``count`` lines, or until ^C when 0."""
    return asyncio.run(_run(settings, count))
