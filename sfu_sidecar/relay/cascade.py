"""Cascade: when this node pulls a stream from its upstream, and for how long.

A viewer asking for a stream this node has no publisher for starts a pull (``relay/pull.py``)
from the stream's origin as the stream directory names it (``relay/directory.py``, with Redis),
else from the upstream named by ``origin_url``, and the viewer's answer waits for the pull's: the
stream's codecs are then the upstream's, so the viewer negotiates what will arrive. Every later
viewer rides the same pull. Other readers of a stream hold a pull as viewers do: the live
segments (MSE and HLS players on an edge) start one with their first request and keep it while
they are read (``add_interest``). A pull that fails while it is wanted (the upstream restarted,
a network break) is tried again with backoff; one no longer wanted ends after
``cascade_linger_s``, so a viewer that reloads the page finds it still running.

Loops are refused, not broken: every pull request names the nodes it passed (``Sidecar-Via``),
and a node that finds itself in that list answers 508 instead of pulling again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from urllib.parse import quote, urlsplit

from sfu_sidecar import logs
from sfu_sidecar.exceptions import LoopDetected
from sfu_sidecar.relay.directory import Directory
from sfu_sidecar.relay.hooks import PublisherHandle, RelayObserver, ViewerHandle
from sfu_sidecar.relay.pull import PullSession, Upstream, is_refusal
from sfu_sidecar.relay.session import ENDED_DELETED, ENDED_SHUTDOWN
from sfu_sidecar.relay.streams import Streams
from sfu_sidecar.tasks import Tasks

log = logs.get("relay.cascade")

RETRY_FIRST_S = 0.5
RETRY_MAX_S = 8.0
WATCH_S = 1.0  # how often streams with viewers and no publisher are looked up
SWEEP_S = 1.0  # how often pulls are checked for being still wanted
ENDED_IDLE = "idle"  # a pull no viewer or reader wanted, ended after cascade_linger_s

Pull = Callable[[str, Upstream], Awaitable[PullSession]]


def whep_url(origin_url: str, stream: str) -> str:
    """The upstream's WHEP endpoint for ``stream``: ``origin_url`` with ``{stream}`` filled in,
    or, for a plain base URL (a sidecar), its ``/whep/<stream>``."""
    if "{stream}" in origin_url:
        return origin_url.replace("{stream}", quote(stream, safe=""))
    return f"{origin_url.rstrip('/')}/whep/{quote(stream, safe='')}"


class Cascade(RelayObserver):
    """Pulls streams on demand from their origin in the directory or from ``origin_url`` (an
    observer of the relay, for its viewers leaving and its pulls ending)."""

    def __init__(
        self,
        *,
        node_id: str,
        origin_url: str | None,
        token: str | None,
        linger_s: float,
        streams: Streams,
        pull: Pull,
        directory: Directory | None = None,
    ) -> None:
        self.node_id = node_id
        self.directory = directory
        self.origin_url = origin_url
        self.token = token
        self.linger_s = linger_s
        self.streams = streams
        self._pull = pull
        self._pending: dict[str, asyncio.Future[PullSession | None]] = {}
        self._interest: list[Callable[[str], bool]] = []
        self._lingering: set[str] = set()
        self._tasks = Tasks("cascade", log)

    def add_interest(self, wants: Callable[[str], bool]) -> None:
        """A reader of streams other than the relay's viewers (the live segments): a pull is
        kept while ``wants(stream)`` is true, as it is while the stream has viewers."""
        self._interest.append(wants)

    def wanted(self, stream: str) -> bool:
        found = self.streams.by_name.get(stream)
        if found is not None and found.viewers:
            return True
        return any(wants(stream) for wants in self._interest)

    async def upstream(self, stream: str, via: tuple[str, ...]) -> Upstream | None:
        """Where ``stream`` comes from: the node the directory names as its origin, else
        origin_url; None when neither knows (a publisher may yet come to this node)."""
        origin = self.origin_url
        if self.directory is not None:
            entry = await self.directory.lookup(stream)
            if entry is not None and entry[0] != self.node_id:
                origin = entry[1]
        if origin is None:
            return None
        url = whep_url(origin, stream)
        parts = urlsplit(url)
        return Upstream(
            whep_url=url, token=self.token, clock_url=f"{parts.scheme}://{parts.netloc}",
            via=(*via, self.node_id),
        )

    def check_loop(self, stream: str, via: tuple[str, ...]) -> None:
        if self.node_id in via:
            raise LoopDetected(
                f"stream {stream}: this node ({self.node_id}) is already on the request's path "
                f"({' -> '.join(via)}); the pulls form a loop, check origin_url on these nodes"
            )

    async def ensure(self, stream: str, via: tuple[str, ...] = ()) -> None:
        """Return once ``stream`` has a publisher here: its own, or a pull this call started
        or joined. Raises what the upstream answered (404, 503, 508) when the pull fails."""
        self.check_loop(stream, via)
        found = self.streams.by_name.get(stream)
        if (found is not None and found.publisher is not None
                and not found.publisher.closed.is_set()):
            return
        pending = self._pending.get(stream)
        if pending is None:
            pending = asyncio.ensure_future(self._start(stream, via))
            self._pending[stream] = pending
            pending.add_done_callback(lambda _: self._pending.pop(stream, None))
        await asyncio.shield(pending)

    async def _start(self, stream: str, via: tuple[str, ...]) -> PullSession | None:
        upstream = await self.upstream(stream, via)
        if upstream is None:
            return None
        return await self._pull(stream, upstream)

    # --- relay hooks ------------------------------------------------------------------------

    def publisher_closed(self, publisher: PublisherHandle) -> None:
        if not isinstance(publisher, PullSession):
            return
        if publisher.ended_reason in (ENDED_SHUTDOWN, ENDED_DELETED, ENDED_IDLE):
            return
        stream = publisher.stream_name
        log.info("pull of %s ended (%s); pulling again while it has viewers", stream,
                 publisher.ended_reason)
        with contextlib.suppress(RuntimeError):
            self._tasks.start(f"retry-{stream}", self._retry(stream, publisher.upstream.via))

    def viewer_closed(self, viewer: ViewerHandle) -> None:
        self._linger_if_unwanted(viewer.stream_name)

    def _linger_if_unwanted(self, stream: str) -> None:
        found = self.streams.by_name.get(stream)
        if (found is None or not isinstance(found.publisher, PullSession)
                or found.publisher.closed.is_set() or stream in self._lingering
                or self.wanted(stream)):
            return
        with contextlib.suppress(RuntimeError):
            self._lingering.add(stream)
            self._tasks.start(f"linger-{stream}", self._linger(stream))

    async def _retry(self, stream: str, via_with_us: tuple[str, ...]) -> None:
        via = via_with_us[:-1]  # the chain as this node was asked, without itself
        delay = RETRY_FIRST_S
        while True:
            await asyncio.sleep(delay)
            found = self.streams.by_name.get(stream)
            if found is None or not self.wanted(stream):
                return
            if found.publisher is not None and not found.publisher.closed.is_set():
                return
            try:
                await self.ensure(stream, via)
            except Exception as exc:
                if not is_refusal(exc):
                    log.warning("pull of %s refused for good: %s", stream, exc)
                    return
                log.info("pull of %s failed, again in %.1f s: %s", stream,
                         min(delay * 2, RETRY_MAX_S), exc)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            log.info("pull of %s running again", stream)
            return

    async def _linger(self, stream: str) -> None:
        try:
            await asyncio.sleep(self.linger_s)
        finally:
            self._lingering.discard(stream)
        found = self.streams.by_name.get(stream)
        if (found is None or self.wanted(stream)
                or not isinstance(found.publisher, PullSession)):
            return
        log.info("pull of %s: no viewers or readers for %.0f s, ending it", stream,
                 self.linger_s)
        await found.publisher.close(ENDED_IDLE)

    async def start(self) -> None:
        self._tasks.start("sweep", self._sweep())
        if self.directory is not None:
            self._tasks.start("watch", self._watch())

    async def _sweep(self) -> None:
        """Pulls whose last reader other than a viewer went away (the segments of a stream
        nobody reads any more) linger and end, as after the last viewer."""
        while True:
            await asyncio.sleep(SWEEP_S)
            for stream in list(self.streams.by_name):
                self._linger_if_unwanted(stream)

    async def _watch(self) -> None:
        """Viewers waiting on a stream nobody published here yet: pull it as soon as the
        directory lists it on another node."""
        while True:
            await asyncio.sleep(WATCH_S)
            for stream in list(self.streams.by_name.values()):
                if (stream.viewers and stream.publisher is None
                        and stream.name not in self._pending):
                    with contextlib.suppress(Exception):  # refusals are logged by the pull
                        await self.ensure(stream.name)

    async def stop(self) -> None:
        await self._tasks.stop()
