"""Serving a stream's captions as files: chunks (live ones rendered per request and cached,
closed ones frozen durably on first request so every later request and every node serves the
same bytes), windows of any span, and the HLS subtitle playlist.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import Counter

from sfu_sidecar.captions import chunks
from sfu_sidecar.captions.model import StoredCue
from sfu_sidecar.captions.store import CueStore, WriteBatch
from sfu_sidecar.config import Settings
from sfu_sidecar.exceptions import BadInput, NotFound

FROZEN_CACHE_CHUNKS = 8192  # ~4.5 h of 2 s chunks for one language, a few MB
LIVE_CACHE_CHUNKS = 1024
MAX_WINDOW_MS = 6 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class Served:
    body: bytes
    state: chunks.ChunkState
    epoch_ns: int


class CaptionState(Protocol):
    """What the files are made of: the caption service's tracks, epochs and store."""

    settings: Settings
    tracks: dict[tuple[str, str], chunks.Track]
    epochs: dict[str, int]
    store: CueStore
    chunk_ms: int
    retention_ms: int
    chunk_requests: Counter

    def now_ns(self) -> int: ...

    async def write(self, batch: WriteBatch) -> list[StoredCue]: ...


class ChunkServer:
    """The caption files of one caption service, over its tracks, epochs and store."""

    def __init__(self, service: CaptionState) -> None:
        self.service = service
        self._live_cache: OrderedDict[tuple[str, str, int], bytes] = OrderedDict()
        self._frozen: OrderedDict[tuple[str, str, int], bytes] = OrderedDict()
        self._freezing: dict[tuple[str, str, int], asyncio.Future[bytes]] = {}

    def changed(self, key: tuple[str, str, int]) -> None:
        """A cue in the live chunk ``key`` changed: render it afresh at the next request."""
        self._live_cache.pop(key, None)

    def purge(self, stream: str, first_n: int) -> None:
        """Forget ``stream``'s chunks before chunk ``first_n`` (out of the retention window)."""
        for cache in (self._frozen, self._live_cache):
            for key in [k for k in cache if k[0] == stream and k[2] < first_n]:
                del cache[key]

    def _track_or_404(self, stream: str, lang: str) -> chunks.Track:
        track = self.service.tracks.get((stream, lang))
        if track is None:
            raise NotFound(f"no captions for stream {stream!r} in {lang!r}")
        return track

    def _first_chunk(self, now_ms: int) -> int:
        horizon = now_ms - self.service.retention_ms
        return max(0, horizon // self.service.chunk_ms)

    async def chunk(self, stream: str, lang: str, n: int) -> Served:
        epoch = self.service.epochs.get(stream)
        if epoch is None:
            raise NotFound(f"no captions or media for stream {stream!r} yet")
        track = self._track_or_404(stream, lang)
        now_ms = (self.service.now_ns() - epoch) // 1_000_000
        state = chunks.chunk_state(n, self.service.chunk_ms, now_ms)
        self.service.chunk_requests.labels(state.value).inc()
        if state is chunks.ChunkState.FUTURE:
            wait_s = max(1, -(-(n * self.service.chunk_ms - now_ms) // 1000))
            raise NotFound(
                f"chunk {n} starts in the future", headers={"Retry-After": str(wait_s)}
            )
        if n < self._first_chunk(now_ms):
            raise NotFound(f"chunk {n} is older than the retention window")
        key = (stream, lang, n)
        if state is chunks.ChunkState.LIVE:
            body = self._live_cache.get(key)
            if body is None:
                body = chunks.render_chunk(track, n, self.service.chunk_ms, epoch)
                self._live_cache[key] = body
                if len(self._live_cache) > LIVE_CACHE_CHUNKS:
                    self._live_cache.popitem(last=False)
            return Served(body, state, epoch)
        body = self._frozen.get(key)
        if body is not None:
            self._frozen.move_to_end(key)
            return Served(body, state, epoch)
        return Served(await self._freeze(key, track, epoch), state, epoch)

    async def _freeze(self, key: tuple[str, str, int], track: chunks.Track, epoch: int) -> bytes:
        """A closed chunk's bytes: as stored when first served, else rendered and stored now.

        It is durable before it is served as immutable, so a restart serves the same bytes
        even if a late cue changed the chunk's interval afterwards.
        """
        inflight = self._freezing.get(key)
        if inflight is not None:
            return await asyncio.shield(inflight)
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._freezing[key] = future
        try:
            stream, lang, n = key
            body = await self.service.store.frozen_chunk(stream, lang, n)
            if body is None:
                body = chunks.render_chunk(track, n, self.service.chunk_ms, epoch)
                await self.service.write(WriteBatch(chunks=[(stream, lang, n, body)]))
                # Stored only if absent: on a store shared with other nodes one of them may
                # have frozen this chunk first, and every node must serve the same bytes.
                body = await self.service.store.frozen_chunk(stream, lang, n) or body
            self._frozen[key] = body
            if len(self._frozen) > FROZEN_CACHE_CHUNKS:
                self._frozen.popitem(last=False)
            self._live_cache.pop(key, None)
            future.set_result(body)
            return body
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters get it, nobody logs "never retrieved"
            raise
        finally:
            del self._freezing[key]

    def window(self, stream: str, lang: str, start_ms: int, end_ms: int) -> bytes:
        epoch = self.service.epochs.get(stream)
        if epoch is None:
            raise NotFound(f"no captions or media for stream {stream!r} yet")
        track = self._track_or_404(stream, lang)
        if not 0 <= start_ms < end_ms:
            raise BadInput("need 0 <= start < end (stream seconds)")
        if end_ms - start_ms > MAX_WINDOW_MS:
            raise BadInput(f"a window may span at most {MAX_WINDOW_MS // 3_600_000} hours")
        return chunks.render(track.between(start_ms, end_ms), start_ms, epoch)

    def playlist(self, stream: str, lang: str) -> tuple[str | None, int]:
        """(playlist text or None if no chunk closed yet, seconds until one closes)."""
        epoch = self.service.epochs.get(stream)
        if epoch is None:
            raise NotFound(f"no captions or media for stream {stream!r} yet")
        self._track_or_404(stream, lang)
        now_ms = (self.service.now_ns() - epoch) // 1_000_000
        text = chunks.playlist(
            now_ms=now_ms, chunk_ms=self.service.chunk_ms,
            window=self.service.settings.caption_playlist_chunks,
            epoch_ns=epoch, first_n=self._first_chunk(now_ms),
        )
        wait_ms = self.service.chunk_ms + chunks.CLOSE_GRACE_MS - now_ms
        return text, max(1, -(-wait_ms // 1000))
