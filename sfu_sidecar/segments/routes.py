"""HTTP routes of the live segments: init segment, media segments, JSON index, per stream.

``GET /streams/{stream}/media/index.json``, ``.../init.webm`` and ``.../{n}.webm`` (VP8), or
``.../init.mp4`` and ``.../{n}.m4s`` (H.264). The first
request for a stream starts its segmenting (see :class:`SegmentService`). Closed segments never
change, so they are served as immutable; the index and init segment are not cached, as a new
segmenter (after an idle stop) starts over with its own numbering. The view token guards these
routes as it guards WHEP viewing.
"""

from __future__ import annotations

from aiohttp import web

from sfu_sidecar.exceptions import NotFound
from sfu_sidecar.httpapi import json_ok, require_bearer
from sfu_sidecar.relay.routes import STREAM_PATTERN
from sfu_sidecar.segments.segmenter import StreamSegmenter
from sfu_sidecar.segments.service import SegmentService

__all__ = ["IMMUTABLE", "add_routes"]

IMMUTABLE = "public, max-age=31536000, immutable"
NO_CACHE = "no-cache"
CONTENT_TYPES = {"webm": "video/webm", "mp4": "video/mp4"}
MAX_SEGMENT_NUMBER = 10**12


def add_routes(app: web.Application, service: SegmentService) -> None:
    base = f"/streams/{STREAM_PATTERN}/media"

    def segmenter(request: web.Request) -> StreamSegmenter:
        require_bearer(request, service.settings.view_token, "viewing")
        stream = request.match_info["stream"]
        found = service.reader(stream)
        if found is None:
            raise NotFound(f"no stream {stream}")
        return found

    async def index(request: web.Request) -> web.Response:
        seg = segmenter(request)
        # The epoch maps stream time back to house time (a frame's capture time).
        doc = seg.index() | {"epoch_ns": service.captions.epoch(seg.stream)}
        return json_ok(doc, headers={"Cache-Control": NO_CACHE})

    async def init(request: web.Request) -> web.Response:
        seg = segmenter(request)
        ext = seg.extensions[0]
        if request.match_info["ext"] != ext:
            raise NotFound(f"stream {seg.stream} is segmented as {seg.container} (init.{ext})")
        if seg.init is None:
            raise NotFound(f"stream {seg.stream} has no init segment yet (waiting for a "
                           "keyframe on the stream timeline)")
        return web.Response(body=seg.init, content_type=CONTENT_TYPES[seg.container],
                             headers={"Cache-Control": NO_CACHE})

    async def media(request: web.Request) -> web.Response:
        seg = segmenter(request)
        number = int(request.match_info["n"])
        ext = seg.extensions[1]
        if request.match_info["ext"] != ext:
            raise NotFound(f"stream {seg.stream} is segmented as {seg.container} "
                           f"({number}.{ext})")
        found = seg.find(number) if number <= MAX_SEGMENT_NUMBER else None
        if found is None:
            raise NotFound(f"stream {seg.stream} has no segment {number} (see index.json)")
        return web.Response(body=found.data, content_type=CONTENT_TYPES[seg.container],
                            headers={"Cache-Control": IMMUTABLE})

    app.router.add_get(f"{base}/index.json", index)
    app.router.add_get(f"{base}/init.{{ext:webm|mp4}}", init)
    app.router.add_get(f"{base}/{{n:[0-9]{{1,15}}}}.{{ext:webm|m4s}}", media)
