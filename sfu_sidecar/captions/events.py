"""Live caption events and the small publish/subscribe seam they travel through.

:class:`CaptionEvents` is the interface callers use; :class:`LocalEvents` is the in-process
implementation (one bounded queue per subscriber). A networked bus (Redis pub/sub, say) can
replace it without touching the publisher (the caption service) or the subscribers (the sync
DataChannel).

The events, defined once here and carried as they are by the sync wire format (``sync/wire.py``
control messages, spec ``proto/sync.md``), times in stream seconds:

* :class:`Cue` - a cue was added or changed (the same id replaces what a viewer holds);
* :class:`CueRetract` - drop the cue;
* :class:`Epoch` - the stream's epoch was fixed (once per stream).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import ClassVar, Protocol

from sfu_sidecar import logs

log = logs.get("captions.events")


@dataclass(frozen=True, slots=True)
class Epoch:
    """The stream's epoch: stream time 0 in house ns (docs/architecture.md, timelines)."""

    stream: str
    epoch_ns: int
    type: ClassVar[str] = "epoch"


@dataclass(frozen=True, slots=True)
class Cue:
    """Caption cue add or update (same ``id`` replaces); times in stream seconds.

    ``settings`` is the WebVTT cue settings list (``line:10% align:start``), empty for none: a
    viewer places the cue where the producer asked, and an edge stores it as the origin does.
    ``fixed``: its author's times are not to be moved by caption alignment (a chapter title);
    ``shift_ms``: how far alignment moved it onto the voice (its author's start is ``start``
    less that). Both travel so an edge stores the cue as the origin does.
    """

    stream: str
    lang: str
    id: str
    start: float
    end: float
    text: str
    final: bool
    settings: str = ""
    fixed: bool = False
    shift_ms: int = 0
    type: ClassVar[str] = "cue"


@dataclass(frozen=True, slots=True)
class CueRetract:
    """Drop the cue ``id`` of ``lang``."""

    stream: str
    lang: str
    id: str
    type: ClassVar[str] = "cue_retract"


CaptionEvent = Cue | CueRetract | Epoch


class SubscriptionLost(Exception):
    """The subscriber fell too far behind and events were dropped: resynchronise from
    ``GET /api/streams/{stream}/captions`` and subscribe again."""


class Subscription(Protocol):
    def __aiter__(self) -> AsyncIterator[CaptionEvent]: ...

    async def get(self) -> CaptionEvent: ...

    def close(self) -> None: ...


class CaptionEvents(Protocol):
    def publish(self, event: CaptionEvent) -> None:
        """Deliver to current subscribers without waiting (never blocks the publisher)."""
        ...

    def subscribe(self, stream: str | None = None, *, maxsize: int = 1024) -> Subscription:
        """Events of one stream (or all streams with None), in publish order."""
        ...


_CLOSED = object()


class LocalSubscription:
    def __init__(self, hub: LocalEvents, stream: str | None, maxsize: int) -> None:
        self._hub = hub
        self.stream = stream
        self._queue: asyncio.Queue[object] = asyncio.Queue(maxsize + 1)
        self._maxsize = maxsize
        self.lost = False
        self.closed = False

    def _offer(self, event: CaptionEvent) -> None:
        if self.closed:
            return
        if self._queue.qsize() >= self._maxsize:
            # A slow subscriber must not hold back the producer or grow memory without bound;
            # it learns it lost events instead of silently showing wrong captions.
            self.lost = True
            self.close()
            return
        self._queue.put_nowait(event)

    async def get(self) -> CaptionEvent:
        item = await self._queue.get()
        if item is _CLOSED:
            self._queue.put_nowait(_CLOSED)  # keep later get() calls ending too
            if self.lost:
                raise SubscriptionLost("subscriber fell behind; events were dropped")
            raise StopAsyncIteration
        assert isinstance(item, Cue | CueRetract | Epoch)
        return item

    def __aiter__(self) -> AsyncIterator[CaptionEvent]:
        return self

    async def __anext__(self) -> CaptionEvent:
        return await self.get()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._hub._remove(self)
            self._queue.put_nowait(_CLOSED)


class LocalEvents:
    """In-process fan-out: one bounded queue per subscriber."""

    def __init__(self) -> None:
        self._subs: set[LocalSubscription] = set()

    def publish(self, event: CaptionEvent) -> None:
        for sub in list(self._subs):
            if sub.stream is None or sub.stream == event.stream:
                sub._offer(event)

    def subscribe(self, stream: str | None = None, *, maxsize: int = 1024) -> LocalSubscription:
        sub = LocalSubscription(self, stream, maxsize)
        self._subs.add(sub)
        return sub

    def _remove(self, sub: LocalSubscription) -> None:
        self._subs.discard(sub)

    @property
    def subscriber_count(self) -> int:
        return len(self._subs)
