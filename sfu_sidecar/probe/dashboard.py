"""The operator dashboard's push channel: one WebSocket per open dashboard, one JSON per tick.

Each tick's snapshot is serialised once and the same text goes to every dashboard (with none
open it is kept as built, and serialised only when one opens). A dashboard
whose previous push has not left yet skips this one (it is a live view: the next snapshot
replaces it), so a stalled browser never holds up the others or queues memory. A dashboard that
connects first gets the recent history, so its plots start full.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import WSMsgType, web

from sfu_sidecar import logs
from sfu_sidecar.exceptions import AtCapacity
from sfu_sidecar.limits import MessageLimiter, Verdict
from sfu_sidecar.tasks import Tasks

log = logs.get("probe.dashboard")

HISTORY_TICKS = 120  # two minutes of one-second ticks
MAX_DASHBOARDS = 64
MAX_MESSAGE_BYTES = 4096  # dashboards send nothing the hub reads


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


@dataclass(eq=False)
class _Dashboard:
    ws: web.WebSocketResponse
    sending: asyncio.Task[None] | None = None
    sent: int = 0
    skipped: int = 0


class DashboardHub:
    """Open dashboards and the recent ticks; ``publish`` sends one tick to all."""

    def __init__(self, hello: Callable[[], dict[str, Any]],
                 history: int = HISTORY_TICKS, *, limiter: MessageLimiter | None = None,
                 max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self._hello = hello  # static part of the first message (alert rules, version)
        # What a dashboard sends is ignored, but a peer flooding messages still costs reads:
        # over the rate it is closed.
        self.limiter = limiter
        self.max_message_bytes = max_message_bytes
        # Ticks as sent, or as built while no dashboard was open (serialised when one opens).
        self.history: deque[str | dict[str, Any]] = deque(maxlen=history)
        self.dashboards: set[_Dashboard] = set()
        self.pushes = 0
        self.skipped = 0
        self._sends = Tasks("dashboard", log)

    def publish(self, tick: dict[str, Any]) -> str | None:
        """Serialise ``tick`` once, keep it for late joiners and push it to every dashboard."""
        if not self.dashboards:
            self.history.append(tick)
            return None
        text = dumps(tick)
        self.history.append(text)
        for dash in list(self.dashboards):
            if dash.sending is not None and not dash.sending.done():
                dash.skipped += 1
                self.skipped += 1
                continue
            dash.sending = self._sends.start("push", self._send(dash, text))
            self.pushes += 1
        return text

    async def _send(self, dash: _Dashboard, text: str) -> None:
        try:
            await dash.ws.send_str(text)
            dash.sent += 1
        except (ConnectionError, RuntimeError):
            self.dashboards.discard(dash)  # closed under us; its handler finishes the rest

    def hello_text(self) -> str:
        # The stored ticks are JSON already: splice them in rather than decode and re-encode.
        for i, tick in enumerate(self.history):
            if not isinstance(tick, str):
                self.history[i] = dumps(tick)
        head = dumps({"type": "hello", **self._hello()})
        return f'{head[:-1]},"history":[{",".join(map(str, self.history))}]}}'

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        """``GET /api/dashboard/ws``: read-only; whatever a dashboard sends is ignored."""
        if len(self.dashboards) >= MAX_DASHBOARDS:
            raise AtCapacity(f"{MAX_DASHBOARDS} dashboards are open, the most this server "
                             "pushes to; close one", retry_after="5")
        ws = web.WebSocketResponse(heartbeat=20.0, max_msg_size=self.max_message_bytes)
        await ws.prepare(request)
        dash = _Dashboard(ws)
        admit = self.limiter.gate(str(request.remote)) if self.limiter is not None else None
        try:
            await ws.send_str(self.hello_text())
            self.dashboards.add(dash)
            async for msg in ws:
                if msg.type == WSMsgType.ERROR:
                    break
                if admit is not None and admit().verdict is Verdict.CLOSE:
                    await ws.close(code=1008, message=b"over ws_messages_per_s")
                    break
        except ConnectionError:
            pass
        finally:
            self.dashboards.discard(dash)
            if dash.sending is not None:
                dash.sending.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await dash.sending
        return ws

    async def close(self) -> None:
        await self._sends.stop()
        for dash in list(self.dashboards):
            await dash.ws.close()
        self.dashboards.clear()
