"""HTTP and WebSocket adapters of the caption service (thin: parse, call, format).

Routes::

    POST   /api/streams/{stream}/captions             ingest (JSON or text/vtt), Bearer token
    DELETE /api/streams/{stream}/captions/{lang}/{id} retract a cue, Bearer token
    POST   /api/streams/{stream}/captions/{lang}/interrupt  barge-in at a time, Bearer token
    GET    /api/streams/{stream}/captions?since=SEQ   JSON change feed (lang=, limit=)
    GET    /api/streams/{stream}/captions/ws          WebSocket push ingest (msgpack or JSON)
    GET    /captions/{stream}/{lang}/chunk-{n}.vtt    chunk n of stream time [n*D, (n+1)*D)
    GET    /captions/{stream}/{lang}.vtt?start=&end=  cues displayed in a window (seconds)
    GET    /captions/{stream}/{lang}/live.m3u8        HLS subtitle playlist (RFC 8216)
    GET    /captions/{stream}/live                    live push, Server-Sent Events (live.py)
"""

from __future__ import annotations

import json
import time
from typing import Any

import msgpack
from aiohttp import WSMsgType, web

from sfu_sidecar import logs
from sfu_sidecar.captions import chunks
from sfu_sidecar.captions.live import LiveCaptions
from sfu_sidecar.captions.model import (
    MAX_STREAM_MS,
    IngestBatch,
    check_lang,
    check_stream,
    parse_interrupt,
    parse_json_batch,
    parse_vtt_batch,
)
from sfu_sidecar.captions.service import CaptionService
from sfu_sidecar.exceptions import (
    BadInput,
    NotFound,
    SidecarError,
    TooManyRequests,
    Unprocessable,
)
from sfu_sidecar.httpapi import (
    METRICS_KEY,
    json_ok,
    read_body,
    require_content_type,
    require_publish,
)
from sfu_sidecar.limits import MessageLimiter, RateLimits, Verdict, retry_after
from sfu_sidecar.metrics import Metrics

log = logs.get("captions.http")

EPOCH_HTTP_HEADER = "X-Stream-Epoch-Ns"
VTT_TYPE = "text/vtt; charset=utf-8"
IMMUTABLE = "public, max-age=31536000, immutable"


def add_routes(app: web.Application, service: CaptionService) -> None:
    api = Api(service, app.get(METRICS_KEY) or Metrics())
    r = app.router
    r.add_post("/api/streams/{stream}/captions", api.post)
    r.add_get("/api/streams/{stream}/captions", api.feed)
    r.add_get("/api/streams/{stream}/captions/ws", api.websocket)
    r.add_delete("/api/streams/{stream}/captions/{lang}/{cue_id}", api.delete)
    r.add_post("/api/streams/{stream}/captions/{lang}/interrupt", api.interrupt)
    r.add_get(r"/captions/{stream}/{lang}/chunk-{n:[0-9]{1,12}}.vtt", api.chunk)
    r.add_get("/captions/{stream}/{lang}/live.m3u8", api.playlist)
    live = LiveCaptions(service, service.settings.max_sessions_per_client)
    r.add_get("/captions/{stream}/live", live.handle)
    app.on_shutdown.append(live.close)
    r.add_get(r"/captions/{stream}/{lang:[A-Za-z0-9-]+}.vtt", api.window)


def _decode_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except RecursionError:
        raise BadInput("malformed JSON: nested too deeply") from None
    except ValueError as exc:
        # JSONDecodeError, UnicodeDecodeError, and the ValueError int() raises for a number
        # past its digit limit (4300 digits): all a malformed body, none a server fault.
        raise BadInput(f"malformed JSON: {exc}") from None


def _decode_msgpack(body: bytes) -> Any:
    try:
        return msgpack.unpackb(body, raw=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise BadInput(f"malformed msgpack: {exc}") from None


def _number_param(request: web.Request, name: str, lo: float, hi: float) -> float | None:
    """Query parameter ``name`` as a number in [lo, hi], or None when it is absent.

    One place for every numeric parameter: "nan", "inf" and "1e309" (which float() turns into
    infinity) and finite values out of range are all a 400 naming the parameter, before any
    arithmetic on them can overflow.
    """
    raw = request.query.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise BadInput(f"{name}={raw[:40]!r} is not a number") from None
    if not lo <= value <= hi:  # also false for NaN
        raise BadInput(f"{name} must be a number from {lo:.15g} to {hi:.15g}")
    return value


def _seconds_param(request: web.Request, name: str) -> int:
    """A required time on the stream timeline in seconds, as stream milliseconds."""
    value = _number_param(request, name, 0, MAX_STREAM_MS / 1000)
    if value is None:
        raise BadInput(f"query parameter {name} (stream seconds) is required")
    return round(value * 1000)


def _int_param(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:  # also int()'s digit limit
        raise BadInput(f"{name}={raw[:40]!r} is not an integer") from None
    if not lo <= value <= hi:
        raise BadInput(f"{name} must be between {lo} and {hi}")
    return value


class Api:
    def __init__(self, service: CaptionService, metrics: Metrics) -> None:
        self.service = service
        self.settings = s = service.settings
        # A full bucket holds one request's worth, so any request within max_cues_per_request
        # passes when the stream has been quiet.
        self.cue_rates = RateLimits(s.max_cues_per_s, max(s.max_cues_per_request,
                                                          s.max_cues_per_s))
        self.ws_limiter = MessageLimiter("caption_ws", s.ws_messages_per_s,
                                         metrics.messages_dropped, log)
        self._refused = metrics.requests_limited

    def _take_cues(self, stream: str, count: int) -> None:
        wait_s = self.cue_rates.take(stream, count, time.monotonic())
        if wait_s:
            self._refused.labels("max_cues_per_s").inc()
            raise TooManyRequests(
                f"stream {stream} is over {self.settings.max_cues_per_s:g} cues/s "
                "(setting max_cues_per_s); nothing of this request was stored",
                retry_after=retry_after(wait_s),
            )

    async def _ingest(self, stream: str, batch: IngestBatch) -> dict[str, Any]:
        self._take_cues(stream, len(batch.cues))
        results = await self.service.ingest(stream, batch)
        return {
            "stream": stream,
            "lang": batch.lang,
            "epoch_ns": self.service.epoch(stream),
            "ids": [r.cue.id for r in results],
            "cues": [r.to_json() for r in results],
        }

    async def post(self, request: web.Request) -> web.Response:
        require_publish(request, self.settings, "caption ingest")
        stream = check_stream(request.match_info["stream"])
        ctype = require_content_type(request, "application/json", "text/vtt")
        body = await read_body(request, self.settings.max_body_bytes)
        most = self.settings.max_cues_per_request
        if ctype == "text/vtt":
            batch = parse_vtt_batch(body, request.query.get("lang"), most)
        else:
            batch = parse_json_batch(_decode_json(body), most)
        return json_ok(await self._ingest(stream, batch))

    async def delete(self, request: web.Request) -> web.Response:
        require_publish(request, self.settings, "caption retraction")
        stream = check_stream(request.match_info["stream"])
        lang, cue_id = request.match_info["lang"], request.match_info["cue_id"]
        retracted = await self.service.retract(stream, lang, cue_id)
        return json_ok({"stream": stream, "lang": lang, "id": cue_id, "retracted": retracted})

    async def interrupt(self, request: web.Request) -> web.Response:
        require_publish(request, self.settings, "caption barge-in")
        stream = check_stream(request.match_info["stream"])
        lang = check_lang(request.match_info["lang"])
        require_content_type(request, "application/json")
        body = await read_body(request, self.settings.max_body_bytes)
        at, timebase = parse_interrupt(_decode_json(body))
        done = await self.service.interrupt(stream, lang, at, timebase)
        return json_ok(done.to_json())

    async def feed(self, request: web.Request) -> web.Response:
        stream = check_stream(request.match_info["stream"])
        since = _int_param(request, "since", 0, 0, 2**63 - 1)
        limit = _int_param(request, "limit", 1000, 1, 1000)
        lang = request.query.get("lang")
        if lang is not None:
            check_lang(lang)
        items = self.service.changes(stream, since, lang, limit)
        return json_ok(
            {
                "stream": stream,
                "epoch_ns": self.service.epoch(stream),
                "languages": self.service.languages(stream),
                "cues": [c.to_json() for c in items],
                # Pass back as since= to continue; equal to since when nothing is new.
                "next": items[-1].seq if items else since,
            }
        )

    async def chunk(self, request: web.Request) -> web.Response:
        stream = check_stream(request.match_info["stream"])
        lang = check_lang(request.match_info["lang"])
        served = await self.service.serving.chunk(stream, lang, int(request.match_info["n"]))
        closed = served.state is chunks.ChunkState.CLOSED
        return web.Response(
            body=served.body,
            headers={
                "Content-Type": VTT_TYPE,
                "Cache-Control": IMMUTABLE if closed else "no-cache",
                EPOCH_HTTP_HEADER: str(served.epoch_ns),
            },
        )

    async def window(self, request: web.Request) -> web.Response:
        stream = check_stream(request.match_info["stream"])
        lang = check_lang(request.match_info["lang"])
        start, end = _seconds_param(request, "start"), _seconds_param(request, "end")
        body = self.service.serving.window(stream, lang, start, end)
        return web.Response(
            body=body,
            headers={
                "Content-Type": VTT_TYPE,
                "Cache-Control": "no-cache",
                EPOCH_HTTP_HEADER: str(self.service.epoch(stream)),
            },
        )

    async def playlist(self, request: web.Request) -> web.Response:
        stream = check_stream(request.match_info["stream"])
        lang = check_lang(request.match_info["lang"])
        text, retry_s = self.service.serving.playlist(stream, lang)
        if text is None:
            raise NotFound(
                "no caption chunk has closed yet", headers={"Retry-After": str(retry_s)}
            )
        return web.Response(
            body=text.encode(),  # RFC 8216 4: always UTF-8, no charset parameter needed
            headers={
                "Content-Type": "application/vnd.apple.mpegurl",
                # RFC 8216 6.2.1: a live playlist changes every target duration.
                "Cache-Control": "no-cache",
            },
        )

    async def websocket(self, request: web.Request) -> web.WebSocketResponse:
        require_publish(request, self.settings, "caption ingest")
        stream = check_stream(request.match_info["stream"])
        ws = web.WebSocketResponse(max_msg_size=self.settings.ws_max_message_bytes,
                                   heartbeat=30.0)
        await ws.prepare(request)
        admit = self.ws_limiter.gate(f"{request.remote} on stream {stream}")
        async for msg in ws:
            if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                continue
            binary = msg.type == WSMsgType.BINARY
            reply: dict[str, Any]
            ref: Any = None
            admission = admit()
            if admission.verdict is Verdict.CLOSE:
                # 1008: policy violation (RFC 6455 7.4.1); the reason names the setting.
                await ws.close(code=1008, message=b"over ws_messages_per_s")
                break
            try:
                doc = (
                    _decode_msgpack(msg.data) if binary else _decode_json(msg.data.encode())
                )
                if isinstance(doc, dict):
                    ref = doc.get("ref")
                if not admission.accepted:
                    # Answered, not silently dropped: the producer matches replies by ref
                    # and resends what it was told was not stored.
                    raise TooManyRequests(
                        f"over {self.settings.ws_messages_per_s:g} messages/s "
                        "(setting ws_messages_per_s); message not processed",
                        retry_after="1",
                    )
                reply = await self._ws_op(stream, doc)
                reply.update(ok=True, ref=ref)
            except SidecarError as exc:
                reply = {"ok": False, "ref": ref, "status": exc.status, "error": exc.reason}
                if "Retry-After" in exc.headers:
                    reply["retry_after"] = int(exc.headers["Retry-After"])
            except Exception:
                log.exception("caption websocket message failed")
                reply = {"ok": False, "ref": ref, "status": 500, "error": "internal error"}
            if binary:
                await ws.send_bytes(msgpack.packb(reply, use_bin_type=True))
            else:
                await ws.send_str(json.dumps(reply))
        return ws

    async def _ws_op(self, stream: str, doc: Any) -> dict[str, Any]:
        if not isinstance(doc, dict):
            raise Unprocessable("a message must be an object")
        op = doc.get("op", "cues")
        if op == "cues":
            return await self._ingest(
                stream, parse_json_batch(doc, self.settings.max_cues_per_request)
            )
        if op == "retract":
            lang, cue_id = doc.get("lang"), doc.get("id")
            if not isinstance(lang, str) or not isinstance(cue_id, str):
                raise Unprocessable("retract needs lang and id")
            retracted = await self.service.retract(stream, lang, cue_id)
            return {"stream": stream, "lang": lang, "id": cue_id, "retracted": retracted}
        if op == "interrupt":
            lang = check_lang(doc.get("lang"))
            at, timebase = parse_interrupt(doc)
            return (await self.service.interrupt(stream, lang, at, timebase)).to_json()
        raise Unprocessable(f"unknown op {op!r}; use 'cues', 'retract' or 'interrupt'")
