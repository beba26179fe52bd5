"""The speech component's HTTP routes: caption alignment per stream, and dub declarations."""

from __future__ import annotations

from aiohttp import web

from sfu_sidecar import logs
from sfu_sidecar.exceptions import BadInput, NotFound
from sfu_sidecar.httpapi import json_ok, read_json, require_publish
from sfu_sidecar.speech.service import ALIGN_MODES, MAX_ALIGN_MODES, DubFollow, SpeechService
from sfu_sidecar.streamname import ROUTE_VARIABLE, RULE, is_stream_name

log = logs.get("speech")


def add_routes(app: web.Application, service: SpeechService) -> None:
    api = SpeechApi(service)
    path = f"/api/streams/{ROUTE_VARIABLE}/dub"
    app.router.add_get(path, api.dub_get)
    app.router.add_put(path, api.dub_put)
    app.router.add_delete(path, api.dub_delete)
    path = f"/api/streams/{ROUTE_VARIABLE}/caption-align"
    app.router.add_get(path, api.align_get)
    app.router.add_put(path, api.align_put)


class SpeechApi:
    """The handlers, over the component's state."""

    def __init__(self, service: SpeechService) -> None:
        self.service = service

    async def json_field(self, request: web.Request, key: str) -> object:
        """``key`` of a JSON object body (None when absent or not an object)."""
        doc = await read_json(request, self.service.settings.max_body_bytes)
        return doc.get(key) if isinstance(doc, dict) else None

    async def align_get(self, request: web.Request) -> web.Response:
        name = request.match_info["stream"]
        return json_ok({"stream": name, "mode": self.service.align_mode(name),
                        "max_ms": self.service.settings.caption_align_max_ms})

    async def align_put(self, request: web.Request) -> web.Response:
        """This stream's caption_align mode, over the setting's (``{"mode": MODE}``)."""
        require_publish(request, self.service.settings, "caption alignment")
        name = request.match_info["stream"]
        mode = await self.json_field(request, "mode")
        if mode not in ALIGN_MODES:
            raise BadInput(f'body must be {{"mode": MODE}}, MODE one of {", ".join(ALIGN_MODES)}')
        modes = self.service.align_modes
        if len(modes) >= MAX_ALIGN_MODES and name not in modes:
            raise BadInput(f"at most {MAX_ALIGN_MODES} streams may override caption_align")
        self.service.align_modes[name] = mode
        log.info("stream %s: caption_align %s", name, mode)
        return json_ok({"stream": name, "mode": mode,
                        "max_ms": self.service.settings.caption_align_max_ms})

    async def dub_get(self, request: web.Request) -> web.Response:
        name = request.match_info["stream"]
        status = self.service.dub_status(name)
        if status is None:
            raise NotFound(f"stream {name} follows no source (PUT a source to declare one)")
        return json_ok({"dub": name, **status})

    async def dub_put(self, request: web.Request) -> web.Response:
        """Declare the stream a dub of ``source``: its speech is matched to the source's."""
        require_publish(request, self.service.settings, "dub declarations")
        name = request.match_info["stream"]
        source = await self.json_field(request, "source")
        if not is_stream_name(source):
            raise BadInput(f'body must be {{"source": STREAM}}, a stream name of {RULE}')
        if source == name:
            raise BadInput("a stream cannot be a dub of itself")
        if source in self.service.dubs:
            raise BadInput(f"stream {source} is itself a dub; name the stream it follows")
        if any(f.source == name for f in self.service.dubs.values()):
            raise BadInput(f"stream {name} is the source of a dub; it cannot be a dub too")
        current = self.service.dubs.get(name)
        if current is None or current.source != source:
            self.service.dubs[name] = DubFollow(source)  # a new source: its figures start afresh
            log.info("stream %s declared a dub of %s", name, source)
        return json_ok({"dub": name, "source": source})

    async def dub_delete(self, request: web.Request) -> web.Response:
        require_publish(request, self.service.settings, "dub declarations")
        name = request.match_info["stream"]
        if self.service.dubs.pop(name, None) is None:
            raise NotFound(f"stream {name} follows no source")
        return web.Response(status=204)
