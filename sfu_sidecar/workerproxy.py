"""What the supervisor of ``serve --workers`` does as an HTTP proxy, apart from choosing the
worker: the headers it drops, answers streamed as they come, WebSockets spliced frame by
frame, and its own JSON answers."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import aiohttp
from aiohttp import web

from sfu_sidecar.httpapi import CLIENT_HEADER, PROXY_KEY_HEADER

HOP_BY_HOP = frozenset(h.lower() for h in (
    "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailers",
    "Transfer-Encoding", "Upgrade", "Host", "Content-Length", CLIENT_HEADER, PROXY_KEY_HEADER,
))


async def splice_websocket(request: web.Request,
                           upstream: aiohttp.ClientWebSocketResponse) -> web.StreamResponse:
    """Accept the client's WebSocket and pass every frame between it and ``upstream`` until
    either side closes; the close code goes on to the client."""
    client = web.WebSocketResponse(max_msg_size=0)
    await client.prepare(request)

    async def pump(source: Any, sink: Any) -> None:
        async for message in source:
            if message.type == aiohttp.WSMsgType.TEXT:
                await sink.send_str(message.data)
            elif message.type == aiohttp.WSMsgType.BINARY:
                await sink.send_bytes(message.data)
            else:
                break

    tasks = [asyncio.ensure_future(pump(client, upstream)),
             asyncio.ensure_future(pump(upstream, client))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        code = upstream.close_code
        await upstream.close()
        await client.close(code=code or aiohttp.WSCloseCode.OK)
    return client


async def stream_in_body(request: web.Request) -> str | None:
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        doc = json.loads(await request.read())
        if isinstance(doc, dict) and isinstance(doc.get("stream"), str):
            return str(doc["stream"])
    return None


async def stream_answer(request: web.Request, resp: aiohttp.ClientResponse,
                  headers: dict[str, str]) -> web.StreamResponse:
    """A worker's answer without a length, passed on as it comes (live captions, a segment
    being made); one the worker cut off is cut off here too, so no client takes it for whole."""
    out = web.StreamResponse(status=resp.status, headers=headers)
    await out.prepare(request)
    try:
        async for chunk in resp.content.iter_any():
            await out.write(chunk)
    except ConnectionError:
        return out  # the client left
    except (aiohttp.ClientError, TimeoutError, asyncio.CancelledError):
        # Cut off by the worker, or ended by the supervisor's shutdown: cut off here too.
        if request.transport is not None:
            request.transport.close()
        return out
    await out.write_eof()
    return out


def json_answer(status: int, reason: str | None, headers: dict[str, str] | None = None,
          body: dict[str, Any] | None = None) -> web.Response:
    doc = body if body is not None else {"error": reason}
    return web.json_response(doc, status=status, headers=headers or {})


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
