"""The stream directory in Redis: which node is the origin of which stream.

A node that has a stream's publisher (WHIP or an RTP tap; not a pull) writes
``sfu-sidecar:streams:<stream>`` = ``{"node": node_id, "url": advertise_url}`` with an expiry
of :data:`TTL_S`, and refreshes it every :data:`HEARTBEAT_S` while the publisher lasts; it
deletes the entry when the publisher ends (only if the entry is still its own). A node that
crashes stops refreshing, and its entries are gone within :data:`TTL_S`. Any node that is asked
for a stream it does not have looks it up and pulls it from the node named there
(``relay/cascade.py``), so a viewer may join on any node.

The stream epoch needs no entry here: with ``redis_url`` set the caption store keeps it, set
once for all nodes (``captions/redis_store.py``), and a pull carries it too.

Redis away: lookups answer "unknown" (the viewer waits for a publisher, as on a single node, or
the static ``origin_url`` is used), registrations are retried at the next heartbeat; media
never waits on Redis. Needs the ``redis`` extra, like the Redis caption store.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import redis.asyncio as aioredis

from sfu_sidecar import logs
from sfu_sidecar.captions.redis_store import UNREACHABLE
from sfu_sidecar.relay.hooks import PublisherHandle, RelayObserver
from sfu_sidecar.tasks import Tasks

log = logs.get("relay.directory")

PREFIX = "sfu-sidecar:streams:"
HEARTBEAT_S = 2.0
TTL_S = 6.0  # three heartbeats: one lost refresh does not unlist a live stream
TIMEOUT_S = 1.0

# Delete only our own entry: another node may have taken the stream over meanwhile.
_RELEASE = """
local v = redis.call('GET', KEYS[1])
if v and cjson.decode(v)['node'] == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class StreamDirectory(RelayObserver):
    """Registers this node's published streams and finds other nodes' (see module doc)."""

    def __init__(self, url: str, node_id: str, advertise_url: str,
                 is_origin: Callable[[PublisherHandle], bool]) -> None:
        self.node_id = node_id
        self.advertise_url = advertise_url.rstrip("/")
        self._is_origin = is_origin
        self._redis: aioredis.Redis = aioredis.Redis.from_url(
            url, decode_responses=True, socket_timeout=TIMEOUT_S,
            socket_connect_timeout=TIMEOUT_S,
        )
        self._release = self._redis.register_script(_RELEASE)
        self.owned: set[str] = set()
        self._tasks = Tasks("directory", log)
        self._failing = False

    def _value(self) -> str:
        return json.dumps({"node": self.node_id, "url": self.advertise_url})

    async def start(self) -> None:
        self._tasks.start("heartbeat", self._heartbeat())

    async def stop(self) -> None:
        await self._tasks.stop()
        for stream in list(self.owned):
            await self._unlist(stream)
        await self._redis.aclose()

    # --- lookups ----------------------------------------------------------------------------

    async def lookup(self, stream: str) -> tuple[str, str] | None:
        """(node id, base URL) of ``stream``'s origin, or None (unknown, or Redis away)."""
        try:
            raw = await self._redis.get(PREFIX + stream)
        except UNREACHABLE as exc:
            self._failed("lookup", exc)
            return None
        if raw is None:
            return None
        try:
            entry = json.loads(raw)
            return str(entry["node"]), str(entry["url"])
        except (ValueError, KeyError, TypeError):
            log.warning("directory entry of %s unreadable: %r", stream, raw[:200])
            return None

    # --- registration -----------------------------------------------------------------------

    def publisher_connected(self, publisher: PublisherHandle) -> None:
        if self._is_origin(publisher):
            self.owned.add(publisher.stream_name)
            self._tasks.start("list", self._list(publisher.stream_name))

    def publisher_closed(self, publisher: PublisherHandle) -> None:
        stream = publisher.stream_name
        if stream in self.owned and self._is_origin(publisher):
            self.owned.discard(stream)
            self._tasks.start("unlist", self._unlist(stream))

    async def _list(self, stream: str) -> None:
        try:
            await self._redis.set(PREFIX + stream, self._value(), px=int(TTL_S * 1000))
            self._recovered()
        except UNREACHABLE as exc:
            self._failed(f"listing {stream}", exc)

    async def _unlist(self, stream: str) -> None:
        try:
            await self._release(keys=[PREFIX + stream], args=[self.node_id])
        except UNREACHABLE as exc:
            self._failed(f"unlisting {stream} (it expires in {TTL_S:.0f} s)", exc)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            for stream in list(self.owned):
                await self._list(stream)

    def _failed(self, what: str, exc: BaseException) -> None:
        if not self._failing:  # one line per outage, not one per heartbeat
            log.warning("stream directory: %s failed (%s: %s); retrying", what,
                        type(exc).__name__, exc)
        self._failing = True

    def _recovered(self) -> None:
        if self._failing:
            log.info("stream directory: Redis answers again")
        self._failing = False
