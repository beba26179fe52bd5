"""Durable cue storage: an interface, and SQLite (WAL) behind a dedicated writer thread.

Durability choice: ``journal_mode=WAL`` with ``synchronous=FULL``. With NORMAL, SQLite syncs
the WAL only at checkpoints, so a committed transaction survives a process kill (the data is in
the OS page cache) but "might roll back following a power loss or system crash" (SQLite docs,
PRAGMA synchronous). Ingest acknowledges a cue only once it is on disk, so FULL: one fsync of
the WAL per commit. The cost is paid once per *group*: the writer thread drains every batch
queued while the previous fsync ran and commits them in one transaction (group commit), so
concurrent producers share fsyncs instead of queueing behind each other.

The event loop never touches SQLite: writes go through the writer thread and come back as
futures; reads of frozen chunks use one reader thread (WAL readers do not block the writer).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sfu_sidecar import logs
from sfu_sidecar.captions.model import StoredCue
from sfu_sidecar.exceptions import StorageUnavailable

log = logs.get("captions.store")

SCHEMA_VERSION = 2
# What each older schema needs to become the current one (version 2 added the alignment
# columns; their defaults are what every older cue was: its author's, unmoved).
_MIGRATIONS = {
    1: ("ALTER TABLE cues ADD COLUMN fixed INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE cues ADD COLUMN shift_ms INTEGER NOT NULL DEFAULT 0"),
}
# Most batches the writer folds into one transaction: bounds the latency one commit adds.
MAX_GROUP = 256

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS epochs (
    stream TEXT PRIMARY KEY, epoch_ns INTEGER NOT NULL, source TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cues (
    stream TEXT NOT NULL, lang TEXT NOT NULL, id TEXT NOT NULL,
    start_ms INTEGER NOT NULL, end_ms INTEGER NOT NULL, text TEXT NOT NULL,
    final INTEGER NOT NULL, seq INTEGER NOT NULL, settings TEXT NOT NULL,
    deleted INTEGER NOT NULL, fixed INTEGER NOT NULL DEFAULT 0,
    shift_ms INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (stream, lang, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS chunks (
    stream TEXT NOT NULL, lang TEXT NOT NULL, n INTEGER NOT NULL, body BLOB NOT NULL,
    PRIMARY KEY (stream, lang, n)) WITHOUT ROWID;
"""


@dataclass(slots=True)
class WriteBatch:
    """Everything one caller needs durable at once; applied in one transaction."""

    epochs: list[tuple[str, int, str]] = field(default_factory=list)  # stream, epoch_ns, source
    cues: list[StoredCue] = field(default_factory=list)  # upserts, retractions included
    chunks: list[tuple[str, str, int, bytes]] = field(default_factory=list)  # frozen bodies
    # (stream, drop cues ending before this ms, drop frozen chunks with n below this)
    purge: list[tuple[str, int, int]] = field(default_factory=list)


    # Ids of cues in ``cues`` that the service made up (GENERATED_ID_PREFIX): a shared store
    # renames them after the seq it assigns, so two nodes never make the same id.
    generated_ids: set[str] = field(default_factory=set)


@dataclass(slots=True)
class Snapshot:
    epochs: dict[str, tuple[int, str]]
    cues: list[StoredCue]
    max_seq: int


@dataclass(slots=True)
class Change:
    """What another node wrote to a shared store, in the store's commit order."""

    epochs: dict[str, int]
    cues: list[StoredCue]


class EpochConflict(StorageUnavailable):
    """Another node fixed the stream's epoch first; nothing of the batch was written.

    The service adopts the stored epoch and converts an ingest batch again; anywhere else it
    reaches a client as a 503 whose retry succeeds against the adopted epoch.
    """

    def __init__(self, stream: str, epoch_ns: int) -> None:
        super().__init__(
            f"stream {stream} got epoch {epoch_ns} from another node meanwhile; nothing was "
            "stored; retry", retry_after="1",
        )
        self.stream = stream
        self.epoch_ns = epoch_ns


class CueStore(Protocol):
    """What the caption service needs from storage. A networked store can implement it."""

    async def open(self) -> Snapshot: ...

    async def write(self, batch: WriteBatch) -> list[StoredCue]:
        """Return only once the batch is durable; raise if it is not.

        Returns the cues as stored: a shared store assigns their seqs (and generated ids)
        itself, so every node sees one order. Raises :class:`EpochConflict` when the batch
        carries an epoch other than the one already stored for its stream.
        """
        ...

    def follow(self, on_change: Callable[[Change], None]) -> None:
        """Call ``on_change`` with what other writers commit (a store only this process
        writes never calls it)."""
        ...

    async def frozen_chunk(self, stream: str, lang: str, n: int) -> bytes | None: ...

    async def close(self) -> None: ...


_STOP = object()


class SqliteCueStore:
    """SQLite file ``captions.sqlite3`` in ``data_dir``."""

    def __init__(self, data_dir: Path, *, on_commit: Callable[[int, float], None] | None = None):
        self.path = data_dir / "captions.sqlite3"
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="captions-read")
        self._read_conn: sqlite3.Connection | None = None
        self._on_commit = on_commit

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=5000")
        return conn

    async def open(self) -> Snapshot:
        loop = asyncio.get_running_loop()
        snapshot = await loop.run_in_executor(self._reader, self._open_sync)
        self._thread = threading.Thread(
            target=self._writer, args=(loop,), name="captions-writer", daemon=True
        )
        self._thread.start()
        return snapshot

    def _open_sync(self) -> Snapshot:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = self._connect()
        conn.executescript(_SCHEMA)
        row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if row is None:
            conn.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
        elif row[0] in _MIGRATIONS:
            conn.execute("BEGIN IMMEDIATE")
            for statement in _MIGRATIONS[row[0]]:
                conn.execute(statement)
            conn.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (SCHEMA_VERSION,))
            conn.execute("COMMIT")
        elif row[0] != SCHEMA_VERSION:
            raise RuntimeError(f"{self.path}: schema {row[0]}, expected {SCHEMA_VERSION}")
        epochs = {
            stream: (epoch, source)
            for stream, epoch, source in conn.execute("SELECT stream, epoch_ns, source FROM epochs")
        }
        # The highest seq ever handed out survives even when retention purged its cue, so
        # change-feed cursors held by clients never see a seq twice.
        (seq_row,) = conn.execute(
            "SELECT coalesce(max(value), 0) FROM meta WHERE key='seq'"
        ).fetchone()
        cues = [
            StoredCue(s, lang, i, a, b, text, bool(final), seq, settings, bool(deleted),
                      bool(fixed), shift)
            for s, lang, i, a, b, text, final, seq, settings, deleted, fixed, shift
            in conn.execute(
                "SELECT stream, lang, id, start_ms, end_ms, text, final, seq, settings, deleted,"
                " fixed, shift_ms FROM cues"
            )
        ]
        self._read_conn = conn
        return Snapshot(epochs, cues, max(seq_row, max((c.seq for c in cues), default=0)))

    async def write(self, batch: WriteBatch) -> list[StoredCue]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._queue.put((batch, future))
        await future
        return batch.cues

    def follow(self, on_change: Callable[[Change], None]) -> None:
        """Only this process writes the file: nothing to follow."""

    async def frozen_chunk(self, stream: str, lang: str, n: int) -> bytes | None:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reader, self._read_chunk, stream, lang, n)

    def _read_chunk(self, stream: str, lang: str, n: int) -> bytes | None:
        assert self._read_conn is not None
        row = self._read_conn.execute(
            "SELECT body FROM chunks WHERE stream=? AND lang=? AND n=?", (stream, lang, n)
        ).fetchone()
        return None if row is None else bytes(row[0])

    async def close(self) -> None:
        if self._thread is not None:
            self._queue.put(_STOP)
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 5.0)
            self._thread = None
        self._reader.shutdown(wait=True)
        if self._read_conn is not None:
            self._read_conn.close()
            self._read_conn = None

    # --- writer thread ---

    def _writer(self, loop: asyncio.AbstractEventLoop) -> None:
        conn = self._connect()
        try:
            stop = False
            while not stop:
                item = self._queue.get()
                if item is _STOP:
                    break
                group = [item]
                while len(group) < MAX_GROUP:
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if more is _STOP:
                        stop = True
                        break
                    group.append(more)
                self._commit_group(conn, loop, group)  # type: ignore[arg-type]
        finally:
            conn.close()

    def _commit_group(
        self,
        conn: sqlite3.Connection,
        loop: asyncio.AbstractEventLoop,
        group: list[tuple[WriteBatch, asyncio.Future[None]]],
    ) -> None:
        started = time.perf_counter()
        try:
            conn.execute("BEGIN IMMEDIATE")
            for batch, _ in group:
                _apply(conn, batch)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                # On a full or read-only disk the rollback can fail too; SQLite has then
                # rolled back itself. Raising here would end this thread, and every later
                # write would wait forever.
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            if len(group) > 1:
                # One bad batch must not fail its neighbours: retry them one by one.
                for one in group:
                    self._commit_group(conn, loop, [one])
                return
            log.error("caption store write failed: %s", exc)
            failure = _storage_error(exc)
            for _, future in group:
                loop.call_soon_threadsafe(_set_exception, future, failure)
            return
        if self._on_commit is not None:
            self._on_commit(len(group), time.perf_counter() - started)
        for _, future in group:
            loop.call_soon_threadsafe(_set_result, future)


def _storage_error(exc: sqlite3.Error) -> BaseException:
    """What a failed write tells the writer's caller. The file system refusing (full,
    read-only, I/O error, a file that cannot be opened or locked) is a passing condition the
    client can wait out: StorageUnavailable, a 503 with Retry-After. Anything else (a
    constraint, a misuse) is a fault of ours and stays as it is."""
    if isinstance(exc, sqlite3.OperationalError) or type(exc) is sqlite3.DatabaseError:
        name = getattr(exc, "sqlite_errorname", "") or "error"
        return StorageUnavailable(
            f"caption storage cannot write now ({name}: {exc}); nothing from this request "
            "was stored, earlier acknowledged cues are kept; retry later"
        )
    return exc


def _apply(conn: sqlite3.Connection, batch: WriteBatch) -> None:
    if batch.epochs:
        # The first epoch written for a stream wins, as in memory: it never moves.
        conn.executemany("INSERT OR IGNORE INTO epochs VALUES (?, ?, ?)", batch.epochs)
    if batch.cues:
        conn.executemany(
            "INSERT OR REPLACE INTO cues VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (c.stream, c.lang, c.id, c.start_ms, c.end_ms, c.text, int(c.final), c.seq,
                 c.settings, int(c.deleted), int(c.fixed), c.shift_ms)
                for c in batch.cues
            ],
        )
        conn.execute(
            "INSERT INTO meta VALUES ('seq', ?) ON CONFLICT (key) DO UPDATE SET "
            "value = max(value, excluded.value)",
            (max(c.seq for c in batch.cues),),
        )
    if batch.chunks:
        conn.executemany("INSERT OR IGNORE INTO chunks VALUES (?, ?, ?, ?)", batch.chunks)
    for stream, before_ms, before_n in batch.purge:
        conn.execute("DELETE FROM cues WHERE stream=? AND end_ms<?", (stream, before_ms))
        conn.execute("DELETE FROM chunks WHERE stream=? AND n<?", (stream, before_n))


def _set_result(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _set_exception(future: asyncio.Future[None], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
