"""Live caption push over HTTP: Server-Sent Events for viewers without a sync DataChannel.

``GET /captions/{stream}/live`` (``text/event-stream``, the HTML Living Standard's
EventSource format): the player of the HTTP path (MSE, a CDN in between, UDP blocked) gets the
same caption events the DataChannel carries to WebRTC viewers, as they are ingested, instead of
waiting for its next chunk poll. On connect it sends the epoch and every cue displayed from
:data:`CATCH_UP_BEHIND_S` before now to :data:`CATCH_UP_AHEAD_S` after (what a late joiner
needs), then each event; the subscription is made first, so nothing ingested in between is
missed (a cue sent twice is harmless: the same id replaces it). Events, times in stream
seconds::

    event: epoch    data: {"epoch_ns": N}
    event: cue      data: {"lang", "id", "start", "end", "text", "final", "settings"}
    event: retract  data: {"lang", "id"}
    event: lost     data: {}   (the client fell behind; EventSource reconnects and catches up)

A comment line every :data:`KEEPALIVE_S` keeps proxies from closing an idle stream.
:func:`format_event` is pure; :class:`LiveCaptions` is the adapter.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

from aiohttp import web

from sfu_sidecar import logs
from sfu_sidecar.captions.events import (
    CaptionEvent,
    Cue,
    CueRetract,
    Epoch,
    Subscription,
    SubscriptionLost,
)
from sfu_sidecar.captions.model import check_stream
from sfu_sidecar.captions.service import CaptionService
from sfu_sidecar.exceptions import TooManyRequests
from sfu_sidecar.limits import client_key

__all__ = ["CATCH_UP_AHEAD_S", "CATCH_UP_BEHIND_S", "KEEPALIVE_S", "LiveCaptions",
           "format_event"]

log = logs.get("captions.live")

CATCH_UP_BEHIND_S = 10.0  # as the sync DataChannel's catch-up
CATCH_UP_AHEAD_S = 120.0
KEEPALIVE_S = 15.0
RETRY_MS = 1000  # how soon EventSource reconnects after the stream ends
HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
           "X-Accel-Buffering": "no"}  # nginx and others would otherwise buffer the stream


def format_event(event: CaptionEvent) -> bytes:
    """One caption event as an SSE event block."""
    data: dict[str, Any]
    if isinstance(event, Epoch):
        name, data = "epoch", {"epoch_ns": event.epoch_ns}
    elif isinstance(event, Cue):
        name, data = "cue", {"lang": event.lang, "id": event.id, "start": event.start,
                             "end": event.end, "text": event.text, "final": event.final,
                             "settings": event.settings}
    else:
        assert isinstance(event, CueRetract)
        name, data = "retract", {"lang": event.lang, "id": event.id}
    # json.dumps escapes newlines, so the data is one line, as SSE needs.
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class LiveCaptions:
    """The SSE route; at most ``max_per_client`` streams open from one client address.
    :meth:`close` (on the app's shutdown) ends every stream, so none holds the shutdown up."""

    def __init__(self, service: CaptionService, max_per_client: int) -> None:
        self.service = service
        self.max_per_client = max_per_client
        self.open: Counter[str] = Counter()
        self.subscriptions: set[Subscription] = set()

    async def close(self, _app: web.Application | None = None) -> None:
        for subscription in list(self.subscriptions):
            subscription.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        stream = check_stream(request.match_info["stream"])
        if request.method == "HEAD":  # what a GET would start, without a stream to hold open
            return web.Response(headers=HEADERS)
        client = client_key(request.remote)
        if self.open[client] >= self.max_per_client:
            raise TooManyRequests(
                f"your address has {self.max_per_client} live caption streams open, the limit "
                "(setting max_sessions_per_client); close one first", retry_after="5")
        self.open[client] += 1
        subscription = self.service.events.subscribe(stream)
        self.subscriptions.add(subscription)
        resp = web.StreamResponse(headers=HEADERS)
        try:
            await resp.prepare(request)
            await resp.write(f"retry: {RETRY_MS}\n\n".encode())
            for event in self._catch_up(stream):
                await resp.write(format_event(event))
            while True:
                try:
                    event = await asyncio.wait_for(subscription.get(), KEEPALIVE_S)
                except TimeoutError:
                    await resp.write(b": keep-alive\n\n")
                    continue
                except SubscriptionLost:
                    await resp.write(b"event: lost\ndata: {}\n\n")
                    break
                except StopAsyncIteration:
                    break
                await resp.write(format_event(event))
        except ConnectionError:
            pass  # the viewer left
        finally:
            subscription.close()
            self.subscriptions.discard(subscription)
            self.open[client] -= 1
            if self.open[client] <= 0:
                del self.open[client]
        return resp

    def _catch_up(self, stream: str) -> list[CaptionEvent]:
        epoch = self.service.epoch(stream)
        if epoch is None:
            return []
        now_s = self.service.stream_now_ms(stream) / 1000
        events: list[CaptionEvent] = [Epoch(stream, epoch)]
        events += self.service.snapshot(stream, now_s - CATCH_UP_BEHIND_S,
                                        now_s + CATCH_UP_AHEAD_S)
        return events
