"""HTTP routes of the live segments: init segment, media segments, JSON index, per stream.

``GET /streams/{stream}/media/index.json``, ``.../init.webm`` and ``.../{n}.webm`` (VP8, VP9), or
``.../init.mp4`` and ``.../{n}.m4s`` (H.264), and for H.264 the HLS playlists
``.../master.m3u8``, ``.../media.m3u8`` and ``.../subtitles-{lang}.m3u8`` (a request for one
made before the first segment closes waits for it). The segment being
made (the index's ``open``) is served while it is made, with chunked transfer: each part as it
is muxed, the rest when it closes, so a player can append media a part behind the live edge
instead of a segment. The first request for a stream starts its segmenting (see
:class:`SegmentService`); on an edge, for a stream with no publisher here, it first pulls the
stream from upstream as a WHEP viewer's request does, and the pull lasts while the segments are
read. Closed segments never
change, so they are served as immutable; the index, playlists and init segment are not cached,
as a new segmenter (after an idle stop) starts over with its own numbering. The view token
guards these routes as it guards WHEP viewing.
"""

from __future__ import annotations

import asyncio
import math

from aiohttp import web

from sfu_sidecar import logs
from sfu_sidecar.captions.chunks import CLOSE_GRACE_MS
from sfu_sidecar.exceptions import NotFound
from sfu_sidecar.httpapi import json_ok, require_bearer
from sfu_sidecar.segments import hls
from sfu_sidecar.segments.segmenter import StreamSegmenter
from sfu_sidecar.segments.service import SegmentService
from sfu_sidecar.streamname import ROUTE_VARIABLE as STREAM_PATTERN

__all__ = ["IMMUTABLE", "add_routes"]

IMMUTABLE = "public, max-age=31536000, immutable"
NO_CACHE = "no-cache"
CONTENT_TYPES = {"webm": "video/webm", "mp4": "video/mp4"}
MAX_SEGMENT_NUMBER = 10**12

log = logs.get("segments.http")


def add_routes(app: web.Application, service: SegmentService) -> None:
    base = f"/streams/{STREAM_PATTERN}/media"

    async def segmenter(request: web.Request) -> StreamSegmenter:
        require_bearer(request, service.settings.view_token, "viewing")
        stream = request.match_info["stream"]
        found = service.reader(stream)
        if found is None and service.relay.is_edge:
            # An edge: pull it (raises the upstream's refusal: 404, 503, 508), then segment.
            await service.relay.ensure_stream(stream)
            found = service.reader(stream)
        if found is None:
            raise NotFound(f"no stream {stream}")
        return found

    async def index(request: web.Request) -> web.Response:
        seg = await segmenter(request)
        # The epoch maps stream time back to house time (a frame's capture time); the caption
        # chunk length and languages let a player fetch chunk-{n}.vtt alongside the media.
        doc = seg.index() | {
            "epoch_ns": service.captions.epoch(seg.stream),
            "caption_chunk_s": service.settings.caption_chunk_s,
            "languages": service.captions.languages(seg.stream),
        }
        return json_ok(doc, headers={"Cache-Control": NO_CACHE})

    async def init(request: web.Request) -> web.Response:
        seg = await segmenter(request)
        ext = seg.extensions[0]
        if request.match_info["ext"] != ext:
            raise NotFound(f"stream {seg.stream} is segmented as {seg.container} (init.{ext})")
        if seg.init is None:
            raise NotFound(f"stream {seg.stream} has no init segment yet (waiting for a "
                           "keyframe on the stream timeline)")
        return web.Response(body=seg.init, content_type=CONTENT_TYPES[seg.container],
                             headers={"Cache-Control": NO_CACHE})

    async def media(request: web.Request) -> web.StreamResponse:
        seg = await segmenter(request)
        number = int(request.match_info["n"])
        ext = seg.extensions[1]
        if request.match_info["ext"] != ext:
            raise NotFound(f"stream {seg.stream} is segmented as {seg.container} "
                           f"({number}.{ext})")
        found = seg.find(number) if number <= MAX_SEGMENT_NUMBER else None
        if found is not None:
            return web.Response(body=found.data, content_type=CONTENT_TYPES[seg.container],
                                headers={"Cache-Control": IMMUTABLE})
        current = seg.open_segment()
        if current is None or current.number != number:
            raise NotFound(f"stream {seg.stream} has no segment {number} (see index.json)")
        return await open_segment(request, seg, number)

    async def open_segment(request: web.Request, seg: StreamSegmenter,
                           number: int) -> web.StreamResponse:
        # Immutable like a closed one: the bytes are the closed segment's, and a response that
        # cannot be completed is cut off without its last chunk, so no cache keeps a part of it.
        headers = {"Content-Type": CONTENT_TYPES[seg.container], "Cache-Control": IMMUTABLE}
        if request.method == "HEAD":  # its length is not known until it closes
            return web.Response(headers=headers)
        resp = web.StreamResponse(headers=headers)
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        try:
            if await stream_parts(resp, seg, number):
                return resp
        except ConnectionError:
            return resp  # the reader left
        log.info("stream %s: open segment %d not completed, response cut off", seg.stream,
                 number)
        if request.transport is not None:
            request.transport.close()
        return resp

    async def stream_parts(resp: web.StreamResponse, seg: StreamSegmenter, number: int) -> bool:
        """Writes segment ``number``'s parts as they are made; True once it closed and all of
        it is written, False when it will not close (dropped, or the segmenter stopped)."""
        sent_parts = sent = 0
        # A part comes every segment_part_s; this long without one, the publisher has stalled.
        patience_s = max(5.0, 4 * service.settings.segment_duration_s)
        while True:
            version = service.version(seg.stream)
            closed = seg.find(number)
            if closed is not None:
                await resp.write(memoryview(closed.data)[sent:])
                await resp.write_eof()
                return True
            current = seg.open_segment()
            if current is None or current.number != number:
                return False  # dropped (oversize, refused by the muxer) or started over
            for part in current.parts[sent_parts:]:
                await resp.write(part)
                sent += len(part)
            sent_parts = len(current.parts)
            if not await service.changed_since(seg.stream, seg, version, patience_s):
                return False

    def refuse_other_codecs(seg: StreamSegmenter) -> None:
        # The first keyframe fixes the codec; before it, the publisher's negotiated one tells.
        codec: str | None = seg.video_codec if seg.video is not None else None
        relay_stream = service.relay.stream(seg.stream)
        if codec is None and relay_stream is not None:
            codec = relay_stream.codec("video")
        if codec is not None and codec != "h264":
            # 404, not 415 or 406: those answer a request's own body or Accept header, and
            # here the resource itself does not exist for this stream.
            raise NotFound(f"stream {seg.stream} has {codec.upper()} video; HLS carries "
                           "fragmented MP4 (H.264 publishers), and VP8 and VP9 streams are WebM: "
                           "read them through index.json")

    async def hls_segmenter(request: web.Request) -> tuple[StreamSegmenter, int]:
        """The segmenter of an H.264 stream with a closed segment, and the stream epoch.

        A playlist the master names must be one a player can read: a live playlist with no
        segment gives it nothing to start from (hls.js reports such a playlist as an error),
        and a player does not retry a 404 for its master playlist (hls.js retries no 4xx). So
        a request made before the first segment closes, as a viewer arriving with the
        broadcast makes it (its read starts the segmenting), waits for that segment,
        ``service.first_segment_wait_s`` at most, before a 404 with Retry-After."""
        seg = await segmenter(request)
        refuse_other_codecs(seg)

        def ready() -> bool:
            return (seg.init is not None and bool(seg.segments)
                    and service.captions.epoch(seg.stream) is not None)

        loop = asyncio.get_running_loop()
        deadline = loop.time() + service.first_segment_wait_s
        while not ready():
            remaining = deadline - loop.time()
            # False: the wait timed out, or the segmenter stopped (no change will come).
            if remaining <= 0 or not await service.changed_since(
                    seg.stream, seg, service.version(seg.stream), remaining):
                if ready():
                    break
                wait_s = max(1, math.ceil(service.settings.segment_duration_s))
                raise NotFound(f"stream {seg.stream} has no closed segment yet (waiting for a "
                               "keyframe on the stream timeline)",
                               headers={"Retry-After": str(wait_s)})
        refuse_other_codecs(seg)  # the first keyframe may have named another codec
        epoch = service.captions.epoch(seg.stream)
        assert epoch is not None
        return seg, epoch

    def playlist(text: str) -> web.Response:
        # RFC 8216 6.2.1: a live playlist changes every target duration.
        return web.Response(body=text.encode(), content_type=hls.CONTENT_TYPE,
                            headers={"Cache-Control": NO_CACHE})

    async def media_playlist(request: web.Request) -> web.Response:
        seg, epoch = await hls_segmenter(request)
        return playlist(hls.media_playlist(list(seg.segments), init_url=seg.init_url(),
                                           epoch_ns=epoch, media_ext=seg.extensions[1]))

    async def master_playlist(request: web.Request) -> web.Response:
        seg, _ = await hls_segmenter(request)
        video = seg.video
        # The frame rate is not measured by the segmenter, so FRAME-RATE (optional) is left out.
        return playlist(hls.master_playlist(
            list(seg.segments), codecs=seg.codecs,
            resolution=(video.width, video.height) if video is not None else None,
            languages=service.captions.languages(seg.stream),
        ))

    async def subtitle_playlist(request: web.Request) -> web.Response:
        seg, epoch = await hls_segmenter(request)
        lang = request.match_info["lang"]
        if lang not in service.captions.languages(seg.stream):
            raise NotFound(f"stream {seg.stream} has no captions in {lang!r}")
        # Every window the media playlist lists, each reaching back the caption chunks' grace
        # for cues sent late (see hls.py).
        return playlist(hls.subtitle_playlist(list(seg.segments), stream=seg.stream, lang=lang,
                                              epoch_ns=epoch, lookback_us=CLOSE_GRACE_MS * 1000))

    app.router.add_get(f"{base}/index.json", index)
    app.router.add_get(f"{base}/subtitles-{{lang:[A-Za-z0-9-]{{1,35}}}}.m3u8", subtitle_playlist)
    app.router.add_get(f"{base}/master.m3u8", master_playlist)
    app.router.add_get(f"{base}/media.m3u8", media_playlist)
    app.router.add_get(f"{base}/init.{{ext:webm|mp4}}", init)
    app.router.add_get(f"{base}/{{n:[0-9]{{1,15}}}}.{{ext:webm|m4s}}", media)
