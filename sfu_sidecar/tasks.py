"""Background tasks owned by one component or session: started by name, stopped together."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any


class Tasks:
    """The background tasks of one owner.

    A task that raises is logged once, with its name and traceback, when it ends (nobody else
    awaits it until ``stop``, so without this the error would surface only then, or never).
    ``stop`` cancels every task still running and waits for all of them; ``drain`` waits
    without cancelling, for work that must finish (a durable write).
    """

    def __init__(self, owner: str, log: logging.Logger) -> None:
        self.owner = owner
        self._log = log
        self._running: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._running)

    def start(self, name: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` as a task named ``owner-name``; needs a running loop (RuntimeError)."""
        try:
            task = asyncio.get_running_loop().create_task(coro, name=f"{self.owner}-{name}")
        except RuntimeError:
            coro.close()  # never awaited otherwise, and Python would warn about it
            raise
        self._running.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self._log.error("task %s failed", task.get_name(), exc_info=exc)

    async def drain(self) -> None:
        """Wait for every task started so far (and any they start) to end on its own."""
        while self._running:
            await asyncio.wait(list(self._running))

    async def stop(self) -> None:
        """Cancel every running task except the caller's own, and wait for them to end."""
        current = asyncio.current_task()
        pending = [t for t in self._running if t is not current]
        for task in pending:
            task.cancel()
        for task in pending:
            # Failures were logged when they happened; cancellation is what was asked.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            self._running.discard(task)
