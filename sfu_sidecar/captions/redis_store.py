"""Cue storage in Redis, shared by every sidecar node that names the same server.

Each write is one Lua script, so it is atomic and ordered: it checks and stores the epochs
(set-if-absent: the first node to fix a stream's epoch wins everywhere), assigns the cues' seqs
from one counter (one change-feed order for all nodes), stores the cues and frozen chunks, and
appends what changed to a Redis stream, the log. Every node reads the log (``XREAD``) and hands
the changes to its caption service, which applies them and pushes them to its live listeners
as it does for its own writes. After any lost connection the reader reloads the whole state
(``_SNAPSHOT``) before reading on, so whatever other nodes wrote meanwhile is caught up even if
the log was trimmed.

Durability: Redis answers a script only after appending it to its AOF; with ``appendfsync
always`` the AOF is fsynced before the answer is sent, so an acknowledged cue survives a Redis
crash or restart and a power loss. :meth:`RedisCueStore.open` checks that setting and refuses
to start without it unless the operator accepts the risk.

Keys, under ``sfu-sidecar:captions:``: ``epochs`` (hash stream -> [epoch_ns, source]), ``seq``
(counter), ``streams`` (set), ``cues:STREAM`` (hash "lang US id" -> cue), ``chunks:STREAM`` (hash
"lang US n" -> WebVTT body), ``log`` (stream, trimmed to about :data:`LOG_MAXLEN` entries).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from sfu_sidecar import logs
from sfu_sidecar.captions.model import GENERATED_ID_PREFIX, StoredCue
from sfu_sidecar.captions.store import Change, EpochConflict, Snapshot, WriteBatch
from sfu_sidecar.exceptions import ConfigError, StorageUnavailable

log = logs.get("captions.redis")

PREFIX = "sfu-sidecar:captions:"
LOG_MAXLEN = 100_000
# Short timeouts: while Redis is away an ingest answers 503 within about this, not after the
# client gave up.
SOCKET_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 1.0
READ_BLOCK_MS = 1000
# How long a write waits for the reader to pass its log entry, so that this node applies the
# changes in log order (a feed cursor never skips an earlier seq another node wrote).
CATCH_UP_S = 0.5
RETRY_DELAYS_S = (0.2, 0.5, 1.0, 2.0)
# What the client raises while Redis is out of reach. OSError: a socket it did not wrap;
# RuntimeError: uvloop refusing a write to a transport closed under the client (Redis dropped
# the connection while a command was being sent).
UNREACHABLE = (RedisError, OSError, RuntimeError)

# Epochs travel as strings: Lua numbers are doubles and house nanoseconds exceed 2**53.
_WRITE = """
local P = ARGV[1]
local req = cjson.decode(ARGV[2])
for _, e in ipairs(req.epochs) do
  local cur = redis.call('HGET', P .. 'epochs', e[1])
  if cur then
    local stored = cjson.decode(cur)[1]
    if stored ~= e[2] then return cjson.encode({conflict = {e[1], stored}}) end
  end
end
local fresh = {}
for _, e in ipairs(req.epochs) do
  if redis.call('HSETNX', P .. 'epochs', e[1], cjson.encode({e[2], e[3]})) == 1 then
    table.insert(fresh, {e[1], e[2]})
  end
end
local first = 0
local n = #req.cues
if n > 0 then
  first = redis.call('INCRBY', P .. 'seq', n) - n + 1
  for i, c in ipairs(req.cues) do
    c[8] = first + i - 1
    if c[11] == 1 then c[3] = req.prefix .. c[8] end
    c[11] = nil
    redis.call('SADD', P .. 'streams', c[1])
    redis.call('HSET', P .. 'cues:' .. c[1], c[2] .. '\\31' .. c[3], cjson.encode(c))
  end
end
for _, k in ipairs(req.chunks) do
  redis.call('HSETNX', P .. 'chunks:' .. k[1], k[2] .. '\\31' .. k[3], k[4])
end
for _, p in ipairs(req.purge) do
  local all = redis.call('HGETALL', P .. 'cues:' .. p[1])
  for i = 1, #all, 2 do
    if cjson.decode(all[i + 1])[5] < p[2] then redis.call('HDEL', P .. 'cues:' .. p[1], all[i]) end
  end
  local ch = redis.call('HKEYS', P .. 'chunks:' .. p[1])
  for _, f in ipairs(ch) do
    local num = tonumber(string.match(f, '\\31(%d+)$'))
    if num and num < p[3] then redis.call('HDEL', P .. 'chunks:' .. p[1], f) end
  end
end
local id = ''
if n > 0 or #fresh > 0 then
  id = redis.call('XADD', P .. 'log', 'MAXLEN', '~', ARGV[3], '*', 'd',
                  cjson.encode({epochs = fresh, cues = req.cues}))
end
return cjson.encode({first = first, id = id})
"""

_SNAPSHOT = """
local P = ARGV[1]
local out = {redis.call('GET', P .. 'seq') or '0', '0-0', redis.call('HGETALL', P .. 'epochs')}
local last = redis.call('XREVRANGE', P .. 'log', '+', '-', 'COUNT', 1)
if #last > 0 then out[2] = last[1][1] end
local cues = {}
for _, s in ipairs(redis.call('SMEMBERS', P .. 'streams')) do
  for _, v in ipairs(redis.call('HVALS', P .. 'cues:' .. s)) do table.insert(cues, v) end
end
out[4] = cues
return out
"""


def _cue_from(raw: Any) -> StoredCue:
    s, lang, cue_id, a, b, text, final, seq, settings, deleted = raw[:10]
    # Index 10 is the write's "id generated" flag; the alignment fields follow it (absent in
    # cues written before they existed: their author's, unmoved).
    fixed, shift = (raw[11], raw[12]) if len(raw) >= 13 else (0, 0)
    return StoredCue(s, lang, cue_id, int(a), int(b), text, bool(final), int(seq), settings,
                     bool(deleted), bool(fixed), int(shift))


def _list(value: Any) -> list[Any]:
    # Lua's cjson writes an empty table as {}: an empty list here.
    return value if isinstance(value, list) else []


def _entry_id(raw: str) -> tuple[int, int]:
    ms, _, seq = raw.partition("-")
    return int(ms), int(seq or 0)


def _where(url: str) -> str:
    """The server's address without the password, for messages and logs."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}"


class RedisCueStore:
    """CueStore on one Redis server (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        allow_unsafe_persistence: bool = False,
        on_commit: Callable[[int, float], None] | None = None,
    ) -> None:
        self.url = url
        self.where = _where(url)
        self._allow_unsafe = allow_unsafe_persistence
        self._on_commit = on_commit
        options: dict[str, Any] = {
            "decode_responses": True, "socket_timeout": SOCKET_TIMEOUT_S,
            "socket_connect_timeout": CONNECT_TIMEOUT_S,
            "health_check_interval": 5,
            # One retry on a fresh connection when the pooled one turns out dead (Redis was
            # restarted while it sat idle); none on a timeout, which would double the wait of
            # a producer that gets its 503 anyway. A script retried after its reply was lost
            # writes the same content again under a new seq: harmless.
            "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        }
        self._redis: aioredis.Redis = aioredis.Redis.from_url(url, **options)
        # XREAD BLOCK holds its connection: the reader gets its own client, whose read timeout
        # outlasts the block.
        reader_options = {**options, "socket_timeout": READ_BLOCK_MS / 1000 + SOCKET_TIMEOUT_S}
        self._reader_redis: aioredis.Redis = aioredis.Redis.from_url(url, **reader_options)
        self._write_script = self._redis.register_script(_WRITE)
        self._snapshot_script = self._redis.register_script(_SNAPSHOT)
        self._reader_snapshot = self._reader_redis.register_script(_SNAPSHOT)
        self._last_id = (0, 0)
        self._passed = asyncio.Condition()
        self._reader: asyncio.Task[None] | None = None
        self._on_change: Callable[[Change], None] | None = None
        self.connected = False

    # --- start-up ------------------------------------------------------------------------

    async def open(self) -> Snapshot:
        try:
            await self._check_persistence()
            seq, last, epochs_flat, raw_cues = await self._snapshot_script(args=[PREFIX])
        except RedisError as exc:
            raise StorageUnavailable(
                f"caption store: cannot reach Redis at {self.where} (setting redis_url): {exc}"
            ) from None
        self._last_id = _entry_id(last)
        self.connected = True
        epochs = {}
        for i in range(0, len(epochs_flat), 2):
            epoch, source = json.loads(epochs_flat[i + 1])
            epochs[epochs_flat[i]] = (int(epoch), str(source))
        cues = [_cue_from(json.loads(v)) for v in raw_cues]
        log.info("caption store: Redis at %s, %d cues", self.where, len(cues))
        return Snapshot(epochs, cues, int(seq))

    async def _check_persistence(self) -> None:
        """Refuse a server that would lose acknowledged cues, unless the operator accepts it."""
        try:
            appendonly = (await self._redis.config_get("appendonly")).get("appendonly")
            appendfsync = (await self._redis.config_get("appendfsync")).get("appendfsync")
        except ResponseError as exc:  # CONFIG renamed or forbidden (managed services)
            appendonly = appendfsync = f"unknown ({exc})"
        if appendonly == "yes" and appendfsync == "always":
            return
        risk = (
            f"Redis at {self.where} has appendonly {appendonly} and appendfsync {appendfsync}: "
            "a cue acknowledged to a producer could be lost when Redis crashes or restarts"
        )
        if self._allow_unsafe:
            log.warning("%s (accepted: redis_allow_unsafe_persistence is true)", risk)
            return
        raise ConfigError(
            f"{risk}. Set 'appendonly yes' and 'appendfsync always' in the Redis configuration "
            "(or CONFIG SET them and CONFIG REWRITE), or set redis_allow_unsafe_persistence "
            "to true to accept the loss"
        )

    # --- writes ------------------------------------------------------------------------

    async def write(self, batch: WriteBatch) -> list[StoredCue]:
        request = {
            "prefix": GENERATED_ID_PREFIX,
            "epochs": [[s, str(e), src] for s, e, src in batch.epochs],
            "cues": [
                [c.stream, c.lang, c.id, c.start_ms, c.end_ms, c.text, int(c.final), 0,
                 c.settings, int(c.deleted), int(c.id in batch.generated_ids), int(c.fixed),
                 c.shift_ms]
                for c in batch.cues
            ],
            "chunks": [[s, lang, n, body.decode()] for s, lang, n, body in batch.chunks],
            "purge": [list(p) for p in batch.purge],
        }
        started = time.perf_counter()
        try:
            body = json.dumps(request, ensure_ascii=False)
            reply = json.loads(await self._write_script(args=[PREFIX, body, LOG_MAXLEN]))
        except UNREACHABLE as exc:
            raise StorageUnavailable(
                f"caption storage (Redis at {self.where}) cannot write now ({exc}); nothing "
                "from this request was acknowledged, earlier acknowledged cues are kept; "
                "retry later",
                retry_after="2",
            ) from None
        if "conflict" in reply:
            stream, epoch = reply["conflict"]
            raise EpochConflict(stream, int(epoch))
        if self._on_commit is not None:
            self._on_commit(1, time.perf_counter() - started)
        first = int(reply["first"])
        stored = []
        for i, c in enumerate(batch.cues):
            seq = first + i
            cue_id = f"{GENERATED_ID_PREFIX}{seq}" if c.id in batch.generated_ids else c.id
            stored.append(StoredCue(c.stream, c.lang, cue_id, c.start_ms, c.end_ms, c.text,
                                    c.final, seq, c.settings, c.deleted, c.fixed, c.shift_ms))
        if reply["id"]:
            await self._wait_passed(_entry_id(reply["id"]))
        return stored

    async def _wait_passed(self, entry: tuple[int, int]) -> None:
        if self._reader is None or self._reader.done():
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CATCH_UP_S):
                async with self._passed:
                    await self._passed.wait_for(lambda: self._last_id >= entry)

    async def frozen_chunk(self, stream: str, lang: str, n: int) -> bytes | None:
        try:
            body: str | None = await self._redis.hget(  # type: ignore[misc]
                f"{PREFIX}chunks:{stream}", f"{lang}\x1f{n}"
            )
        except UNREACHABLE:
            # Without Redis the chunk is rendered from memory; storing it then fails with the
            # 503 the write path gives.
            return None
        return None if body is None else str(body).encode()

    # --- following other nodes ---------------------------------------------------------

    def follow(self, on_change: Callable[[Change], None]) -> None:
        self._on_change = on_change
        self._reader = asyncio.get_running_loop().create_task(
            self._follow(), name="captions-redis-reader"
        )

    async def _follow(self) -> None:
        failures = 0
        resync = False
        while True:
            try:
                if resync:
                    await self._resync()
                    resync = False
                reply = await self._reader_redis.xread(
                    {PREFIX + "log": "{}-{}".format(*self._last_id)}, count=500, block=READ_BLOCK_MS
                )
                if not self.connected:
                    log.info("caption store: Redis at %s reachable again", self.where)
                self.connected = True
                failures = 0
                for _stream, entries in reply or []:
                    for entry_id, fields in entries:
                        self._deliver(json.loads(fields["d"]))
                        await self._passed_to(_entry_id(entry_id))
            except asyncio.CancelledError:
                raise
            except UNREACHABLE as exc:
                if self.connected:
                    log.warning("caption store: lost Redis at %s: %s", self.where, exc)
            except Exception:
                # A log entry this code cannot read, or a fault in applying it: the reader
                # must outlive it, and a full reload (which skips past the entry) keeps this
                # node's state complete.
                log.exception("caption store: reading the Redis log failed; reloading")
            else:
                continue
            self.connected = False
            resync = True
            await asyncio.sleep(RETRY_DELAYS_S[min(failures, len(RETRY_DELAYS_S) - 1)])
            failures += 1

    async def _resync(self) -> None:
        """Everything stored, applied in seq order (what this node has is skipped by the
        service's seq check), then the log from where the snapshot was taken."""
        seq, last, epochs_flat, raw_cues = await self._reader_snapshot(args=[PREFIX])
        epochs = {
            epochs_flat[i]: int(json.loads(epochs_flat[i + 1])[0])
            for i in range(0, len(epochs_flat), 2)
        }
        cues = sorted((_cue_from(json.loads(v)) for v in raw_cues), key=lambda c: c.seq)
        if self._on_change is not None:
            self._on_change(Change(epochs, cues))
        await self._passed_to(max(self._last_id, _entry_id(last)))
        log.info("caption store: caught up from Redis at %s (seq %s)", self.where, seq)

    def _deliver(self, doc: dict[str, Any]) -> None:
        epochs = {str(s): int(e) for s, e in _list(doc.get("epochs"))}
        cues = [_cue_from(c) for c in _list(doc.get("cues"))]
        if self._on_change is not None:
            self._on_change(Change(epochs, cues))

    async def _passed_to(self, entry: tuple[int, int]) -> None:
        async with self._passed:
            self._last_id = max(self._last_id, entry)
            self._passed.notify_all()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None
        for client in (self._redis, self._reader_redis):
            with contextlib.suppress(*UNREACHABLE):
                await client.aclose()
