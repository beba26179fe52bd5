"""Push captions to the service over its WebSocket (``/api/streams/{stream}/captions/ws``).

::

    async with CaptionPublisher("ws://host:8080", "studio1", token="...") as pub:
        ids = await pub.send("en", [{"id": "u1", "start": 1.0, "end": 2.5, "text": "Hello",
                                      "final": False}], timebase="stream_s")
        await pub.retract("en", "u1")
        # Word times (the TTS knows them) travel as WebVTT timestamp tags in the cue's text:
        await pub.send("en", [{"id": "u2", "start": t0, "end": t0 + 900_000_000,
                               "words": [{"start": t0, "text": "Good"},
                                         {"start": t0 + 400_000_000, "text": "evening"}]}],
                       timebase="house_ns")
        # The speaker was cut off: later cues retracted, the one speaking cut at that instant.
        await pub.interrupt("en", house_ns_when_it_stopped)

Every message is acknowledged after the cues are durable; :meth:`send` returns the stored ids
or raises :class:`CaptionRejected` with the service's reason. Messages are msgpack by default
(``encoding="json"`` sends text frames instead); several may be in flight at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import msgpack
import websockets


class CaptionRejected(Exception):
    """The service refused a message; ``status`` is the HTTP-like code (4xx)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.reason = reason


class CaptionPublisher:
    def __init__(
        self,
        base_url: str,
        stream: str,
        *,
        token: str | None = None,
        encoding: str = "msgpack",
        open_timeout: float = 10.0,
    ) -> None:
        if encoding not in ("msgpack", "json"):
            raise ValueError("encoding is 'msgpack' or 'json'")
        base = base_url.rstrip("/")
        if base.startswith("http"):
            base = "ws" + base[4:]
        self.url = f"{base}/api/streams/{stream}/captions/ws"
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._encoding = encoding
        self._open_timeout = open_timeout
        self._refs = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ws: Any = None
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> CaptionPublisher:
        await self.connect()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def connect(self) -> None:
        self._ws = await websockets.connect(
            self.url, additional_headers=self._headers, open_timeout=self._open_timeout,
            max_size=None,
        )
        self._reader = asyncio.create_task(self._read())

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        self._fail_all(ConnectionError("caption publisher closed"))

    async def send(
        self,
        lang: str,
        cues: Sequence[Mapping[str, Any]],
        *,
        timebase: str = "stream_s",
    ) -> list[str]:
        """Store cues (``id?``, ``start``, ``end``, ``text``, ``final?``, ``words?``); return
        their ids. ``words`` is ``[{"start", "text"}, ...]`` in the same timebase, each word
        inside its cue and after the one before; without ``text`` the words make it."""
        reply = await self._request(
            {"op": "cues", "timebase": timebase, "lang": lang, "cues": [dict(c) for c in cues]}
        )
        return [str(i) for i in reply["ids"]]

    async def retract(self, lang: str, cue_id: str) -> bool:
        reply = await self._request({"op": "retract", "lang": lang, "id": cue_id})
        return bool(reply["retracted"])

    async def interrupt(self, lang: str, at: float, *, timebase: str = "house_ns",
                        ) -> dict[str, Any]:
        """Barge-in: the ``lang`` speaker was cut off at ``at`` (house ns, or stream seconds).
        Cues starting then or later are retracted and the cue being spoken ends there with
        the words after it dropped; returns ``{"retracted": [ids], "cut": [ids], ...}``."""
        return await self._request(
            {"op": "interrupt", "lang": lang, "at": at, "timebase": timebase})

    async def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        if self._ws is None:
            raise ConnectionError("not connected")
        ref = next(self._refs)
        message["ref"] = ref
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[ref] = future
        if self._encoding == "msgpack":
            await self._ws.send(msgpack.packb(message, use_bin_type=True))
        else:
            await self._ws.send(json.dumps(message))
        reply = await future
        if not reply.get("ok"):
            raise CaptionRejected(int(reply.get("status", 400)), str(reply.get("error")))
        return reply

    async def _read(self) -> None:
        try:
            async for raw in self._ws:
                reply = (
                    msgpack.unpackb(raw, raw=False) if isinstance(raw, bytes) else json.loads(raw)
                )
                future = self._waiting.pop(reply.get("ref"), None)
                if future is not None and not future.done():
                    future.set_result(reply)
        except websockets.ConnectionClosed:
            pass
        finally:
            self._fail_all(ConnectionError("caption connection closed"))

    def _fail_all(self, exc: Exception) -> None:
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(exc)
        self._waiting.clear()
