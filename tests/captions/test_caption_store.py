"""The SQLite store on its own: group commit, failure isolation, reopen."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

from sfu_sidecar.captions.model import StoredCue
from sfu_sidecar.captions.store import SqliteCueStore, WriteBatch


def cue(i: int, **kw: Any) -> StoredCue:
    fields: dict[str, Any] = dict(stream="s", lang="en", id=f"c{i}", start_ms=i * 10,
                                  end_ms=i * 10 + 5, text=f"t{i}", final=True, seq=i)
    fields.update(kw)
    return StoredCue(**fields)


async def test_concurrent_writes_share_commits_and_bad_batch_is_isolated(tmp_path: Path) -> None:
    groups: list[int] = []
    store = SqliteCueStore(tmp_path, on_commit=lambda n, _s: groups.append(n))
    snap = await store.open()
    assert snap.cues == [] and snap.max_seq == 0
    good = [store.write(WriteBatch(cues=[cue(i)])) for i in range(1, 41)]
    bad = store.write(WriteBatch(cues=[cue(99, text=None)]))  # NOT NULL violation
    results = await asyncio.gather(*good, bad, return_exceptions=True)
    # The file store keeps the seqs the service gave: each write answers its cues unchanged.
    assert results[:-1] == [[cue(i)] for i in range(1, 41)]
    assert isinstance(results[-1], sqlite3.IntegrityError)
    assert sum(groups) == 40
    await store.write(WriteBatch(epochs=[("s", 123, "media")], chunks=[("s", "en", 0, b"x")]))
    assert await store.frozen_chunk("s", "en", 0) == b"x"
    assert await store.frozen_chunk("s", "en", 1) is None
    await store.close()

    again = SqliteCueStore(tmp_path)
    snap = await again.open()
    assert sorted(c.id for c in snap.cues) == sorted(f"c{i}" for i in range(1, 41))
    assert snap.epochs == {"s": (123, "media")}
    assert snap.max_seq == 40
    # Purge keeps the seq high-water mark.
    await again.write(WriteBatch(purge=[("s", 10**9, 10**6)]))
    await again.close()
    third = SqliteCueStore(tmp_path)
    snap = await third.open()
    assert snap.cues == [] and snap.max_seq == 40
    assert await third.frozen_chunk("s", "en", 0) is None
    await third.close()


async def test_first_epoch_wins_on_disk(tmp_path: Path) -> None:
    store = SqliteCueStore(tmp_path)
    await store.open()
    await store.write(WriteBatch(epochs=[("s", 1, "first caption")]))
    await store.write(WriteBatch(epochs=[("s", 2, "media")]))
    await store.close()
    again = SqliteCueStore(tmp_path)
    assert (await again.open()).epochs == {"s": (1, "first caption")}
    await again.close()


def test_wal_and_full_sync(tmp_path: Path) -> None:
    async def check() -> tuple[Any, Any]:
        store = SqliteCueStore(tmp_path)
        await store.open()
        conn = store._connect()
        try:
            return (conn.execute("PRAGMA journal_mode").fetchone()[0],
                    conn.execute("PRAGMA synchronous").fetchone()[0])
        finally:
            conn.close()
            await store.close()

    assert asyncio.run(check()) == ("wal", 2)  # 2 = FULL


async def test_a_store_written_before_alignment_opens_with_its_cues_unmoved(
        tmp_path: Path) -> None:
    """A file of the first schema (no alignment columns) is migrated in place on open: its cues
    load as their authors' (not fixed, no shift), and moved or fixed cues then round-trip."""
    store = SqliteCueStore(tmp_path)
    path = store.path
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
        CREATE TABLE epochs (stream TEXT PRIMARY KEY, epoch_ns INTEGER NOT NULL,
                             source TEXT NOT NULL);
        CREATE TABLE cues (
            stream TEXT NOT NULL, lang TEXT NOT NULL, id TEXT NOT NULL,
            start_ms INTEGER NOT NULL, end_ms INTEGER NOT NULL, text TEXT NOT NULL,
            final INTEGER NOT NULL, seq INTEGER NOT NULL, settings TEXT NOT NULL,
            deleted INTEGER NOT NULL,
            PRIMARY KEY (stream, lang, id)) WITHOUT ROWID;
        CREATE TABLE chunks (stream TEXT NOT NULL, lang TEXT NOT NULL, n INTEGER NOT NULL,
                             body BLOB NOT NULL, PRIMARY KEY (stream, lang, n)) WITHOUT ROWID;
        INSERT INTO meta VALUES ('schema', 1);
        INSERT INTO cues VALUES ('s', 'en', 'old', 10, 20, 'before', 1, 1, '', 0);
    """)
    conn.close()
    snap = await store.open()
    assert snap.cues == [cue(1, id="old", text="before", start_ms=10, end_ms=20)]
    await store.write(WriteBatch(cues=[cue(2, shift_ms=-310), cue(3, fixed=True)]))
    await store.close()
    again = SqliteCueStore(tmp_path)
    by_id = {c.id: c for c in (await again.open()).cues}
    assert (by_id["c2"].shift_ms, by_id["c3"].fixed, by_id["old"].fixed) == (-310, True, False)
    await again.close()
