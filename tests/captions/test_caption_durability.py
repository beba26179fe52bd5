"""Durability: concurrent ingest into a server process killed with SIGKILL, then restarted.

Every cue whose POST returned 2xx must be there after the restart, with exactly the content of
its last acknowledged version (or of a later version that was in flight at the kill), and the
database must pass SQLite's integrity check.
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sfu_sidecar.captions.webvtt import seconds_from_ms
from tests.conftest import ROOT, ServerProcess, free_port

TOKEN = "durable-token"
WORKERS = 8


class StandaloneServer:
    """The caption component alone in ``build_app``, as its own process."""

    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.captions.caption_server", "--port", str(self.port),
             "--data-dir", str(data_dir), "--token", TOKEN],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.base + "/healthz", timeout=0.5):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("caption server exited") from None
                time.sleep(0.05)
        raise TimeoutError("caption server did not start")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Ledger:
    """What each cue id may legitimately hold after the crash."""

    acked: dict[str, dict[str, Any]] = field(default_factory=dict)
    in_flight: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    count: int = 0
    target: int = 0
    enough: asyncio.Event = field(default_factory=asyncio.Event)


def content(cue_id: str, version: int, start_ms: int) -> dict[str, Any]:
    digest = hashlib.sha256(f"{cue_id}/{version}".encode()).hexdigest()[:24]
    return {"id": cue_id, "start": seconds_from_ms(start_ms),
            "end": seconds_from_ms(start_ms + 1500), "text": f"v{version} {digest}",
            "final": version >= 2}


async def worker(session: aiohttp.ClientSession, base: str, w: int, ledger: Ledger,
                 stop: asyncio.Event) -> None:
    i = 0
    headers = {"Authorization": f"Bearer {TOKEN}"}
    while not stop.is_set():
        # Each id is owned by one worker and gets three versions in three successive posts
        # (interim, interim, final): post i adds id i and updates ids i-1 and i-2.
        batch = [
            content(f"w{w}-{j}", i - j, j * 2000 + w * 100) for j in range(max(0, i - 2), i + 1)
        ]
        i += 1
        for c in batch:
            ledger.in_flight.setdefault(c["id"], []).append(c)
        try:
            async with session.post(
                f"{base}/api/streams/dur/captions", headers=headers,
                json={"timebase": "stream_s", "lang": "en", "cues": batch},
            ) as resp:
                if resp.status != 200:
                    raise AssertionError(f"ingest failed: {resp.status} {await resp.text()}")
                await resp.read()
        except (aiohttp.ClientError, ConnectionError):
            return  # the server was killed: what was in flight stays unacknowledged
        for c in batch:
            ledger.acked[c["id"]] = c
            pending = ledger.in_flight[c["id"]]
            pending.remove(c)
            # Earlier versions of this id are superseded by this acknowledged one.
            ledger.in_flight[c["id"]] = [p for p in pending if p["text"] > c["text"]]
            ledger.count += 1
        if ledger.count >= ledger.target:
            ledger.enough.set()


async def fetch_all(base: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    since = 0
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(f"{base}/api/streams/dur/captions?since={since}") as resp:
                assert resp.status == 200
                doc = await resp.json()
            for c in doc["cues"]:
                out[c["id"]] = c
            if not doc["cues"]:
                return out
            since = doc["next"]


async def load_and_kill(base: str, kill: Callable[[], None], min_acks: int) -> Ledger:
    ledger = Ledger(target=min_acks)
    stop = asyncio.Event()
    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.create_task(worker(session, base, w, ledger, stop))
                 for w in range(WORKERS)]
        await asyncio.wait_for(ledger.enough.wait(), 30)
        kill()  # mid-stream: every worker has a request in flight
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        stop.set()
    assert ledger.count >= min_acks
    return ledger


def verify(ledger: Ledger, stored: dict[str, dict[str, Any]], db: Path) -> None:
    for cue_id, acked in ledger.acked.items():
        assert cue_id in stored, f"acknowledged cue {cue_id} lost"
        got = stored[cue_id]
        allowed = [acked, *ledger.in_flight.get(cue_id, [])]
        view = {k: got[k] for k in ("id", "start", "end", "text", "final")}
        assert view in allowed, f"{cue_id}: stored {view}, allowed {allowed}"
    for cue_id, got in stored.items():  # nothing corrupted or invented
        version = int(got["text"][1])
        assert got == {**got, **content(cue_id, version, round(got["start"] * 1000))}
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


@pytest.mark.system
def test_sigkill_mid_stream_standalone(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = StandaloneServer(data)
    try:
        ledger = asyncio.run(load_and_kill(server.base, server.proc.kill, 300))
        server.proc.wait()
    finally:
        server.stop()
    again = StandaloneServer(data)
    try:
        stored = asyncio.run(fetch_all(again.base))
        verify(ledger, stored, data / "captions.sqlite3")
    finally:
        again.stop()


@pytest.fixture
def wired(server_factory: Callable[..., ServerProcess]) -> Iterator[Callable[[], ServerProcess]]:
    def start() -> ServerProcess:
        # warning level: the fixture never drains stdout, and per-request info lines could
        # fill the pipe and stall the server under this load.
        server = server_factory("--publish-token", TOKEN, "--log-level", "warning")
        # The caption routes must be part of the served application: a 404 here fails.
        req = urllib.request.Request(f"{server.base}/api/streams/dur/captions?since=0")
        urllib.request.urlopen(req, timeout=5).close()
        return server

    yield start


def test_sigkill_mid_stream_serve(wired: Callable[[], ServerProcess], tmp_path: Path) -> None:
    """The same through ``sfu-sidecar serve`` (the whole application)."""
    server = wired()
    ledger = asyncio.run(load_and_kill(server.base, server.proc.kill, 300))
    server.proc.wait()
    again = wired()
    stored = asyncio.run(fetch_all(again.base))
    verify(ledger, stored, tmp_path / "data" / "captions.sqlite3")
