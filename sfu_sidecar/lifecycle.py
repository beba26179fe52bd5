"""Components: the units the application starts in order and stops in reverse; process signals."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import Protocol


class Component(Protocol):
    """Something with a lifetime: clock, relay, caption store, sync channel...

    ``start`` runs before the server accepts requests; ``stop`` runs after it stopped
    accepting them, in reverse start order, and must finish promptly (the whole shutdown
    has a 5 s budget). Routes are not the component's business: the application registers
    them from the component (``app.add_component_routes``).
    """

    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM (on the running loop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop
