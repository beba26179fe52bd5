"""Captions in Redis (setting redis_url): three ``sfu-sidecar serve`` nodes on one real
redis-server, on loopback.

A cue ingested at one node is served by the others (chunk, window, change feed) and pushed live
on a third node's sync DataChannel to a WHEP viewer; a node killed with SIGKILL loses nothing it
acknowledged; Redis killed and started again mid-ingest gives 503s with a reason and
Retry-After while it is down (media keeps flowing, reads keep answering), and afterwards every
node holds every acknowledged cue again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis

from sfu_sidecar.captions.webvtt import seconds_from_ms
from sfu_sidecar.client.whip import publish
from sfu_sidecar.sync.wire import Cue, Epoch
from sfu_sidecar.synthetic import BeepAudioTrack, FlashVideoTrack, Timeline
from tests.conftest import ServerProcess, free_port, sidecar_command
from tests.relay.peers import LOOPBACK, view, wait_for
from tests.sync.records import ViewerRecords

pytestmark = [pytest.mark.needs("redis-server"), pytest.mark.timeout(150)]

WORKERS = 4
HTTP_TIMEOUT = aiohttp.ClientTimeout(total=10)


class RedisServer:
    """A redis-server of the test's own on a free loopback port, persisting every write to an
    append-only file fsynced before each answer (what the sidecar demands by default)."""

    def __init__(self, folder: Path, *extra: str) -> None:
        self.port = free_port()
        self.folder = folder
        self.extra = extra
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        folder.mkdir(parents=True, exist_ok=True)
        self.start()

    def start(self) -> None:
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "yes", "--appendfsync", "always", *self.extra]
        self.proc = subprocess.Popen(
            ["redis-server", *args, "--dir", str(self.folder)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            for _ in range(200):  # 10 s; a restart answers LOADING while it replays the AOF
                try:
                    if client.ping():
                        return
                except redis.RedisError:
                    time.sleep(0.05)
            raise TimeoutError("redis-server did not answer PING")
        finally:
            client.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Node:
    """``sfu-sidecar serve`` on the Redis store; its output is drained (a full pipe would stall
    it) and kept for the failure message."""

    def __init__(self, folder: Path, redis_url: str, **env: str) -> None:
        self.server = ServerProcess(
            ["--data-dir", str(folder), "--ice-addresses", "127.0.0.1",
             "--max-cpu-percent", "1000", "--max-cues-per-s", "100000",
             "--log-level", "warning"],
            {"SFU_SIDECAR_REDIS_URL": redis_url, **env},
        )
        self.base = self.server.base
        self.lines: list[str] = []
        self._drain = threading.Thread(target=self._read, daemon=True)
        self._drain.start()

    def _read(self) -> None:
        out = self.server.proc.stdout
        assert out is not None
        for line in out:
            self.lines.append(line.decode(errors="replace"))

    def wait_ready(self) -> None:
        import urllib.request

        for _ in range(400):  # 20 s
            if self.server.proc.poll() is not None:
                self._drain.join(2)
                raise RuntimeError(f"node exited {self.server.proc.returncode}: {self.lines}")
            try:
                with urllib.request.urlopen(self.base + "/healthz", timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise TimeoutError("node did not answer /healthz")

    def kill(self) -> None:
        self.server.proc.kill()
        self.server.proc.wait()

    def stop(self) -> None:
        self.server.stop()


@dataclass
class Ledger:
    """What each cue id may hold afterwards: its last acknowledged version, or a later one
    that was sent and not answered (in flight at a kill, or refused while Redis was down)."""

    acked: dict[str, dict[str, Any]] = field(default_factory=dict)
    in_flight: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    count: int = 0
    refusals: list[tuple[int, str, str]] = field(default_factory=list)  # status, Retry-After, body


def content(cue_id: str, version: int, start_ms: int) -> dict[str, Any]:
    digest = hashlib.sha256(f"{cue_id}/{version}".encode()).hexdigest()[:24]
    return {"id": cue_id, "start": seconds_from_ms(start_ms),
            "end": seconds_from_ms(start_ms + 1500), "text": f"v{version} {digest}",
            "final": version >= 2}


async def worker(http: aiohttp.ClientSession, base: str, stream: str, w: int, ledger: Ledger,
                 stop: asyncio.Event) -> None:
    """Post i adds id i and updates ids i-1 and i-2 (interim, interim, final); a 503 is
    retried after its Retry-After (capped, so the test stays short); a dropped connection
    (the node killed) ends the worker."""
    i = 0
    while not stop.is_set():
        batch = [content(f"{stream}-{w}-{j}", i - j, j * 2000 + w * 100)
                 for j in range(max(0, i - 2), i + 1)]
        i += 1
        for c in batch:
            ledger.in_flight.setdefault(c["id"], []).append(c)
        for _attempt in range(200):
            if stop.is_set():
                return
            try:
                async with http.post(f"{base}/api/streams/{stream}/captions",
                                     json={"timebase": "stream_s", "lang": "en", "cues": batch},
                                     timeout=HTTP_TIMEOUT) as resp:
                    body = await resp.text()
                    status, retry = resp.status, resp.headers.get("Retry-After", "")
            except (aiohttp.ClientError, ConnectionError, TimeoutError):
                return
            if status == 200:
                break
            ledger.refusals.append((status, retry, body))
            assert status == 503, f"ingest answered {status}: {body}"
            await asyncio.sleep(min(float(retry or 1), 0.3))
        else:
            raise AssertionError("ingest refused 200 times in a row")
        for c in batch:
            ledger.acked[c["id"]] = c
            ledger.in_flight[c["id"]] = [
                p for p in ledger.in_flight[c["id"]] if p is not c and p["text"] > c["text"]
            ]
            ledger.count += 1


async def run_load(base: str, stream: str, ledger: Ledger, until: Callable[[], bool],
                   limit_s: float, during: Callable[[], Any] | None = None) -> None:
    """Workers ingest into ``base`` until ``until()`` holds (bounded by ``limit_s``); ``during``
    runs meanwhile once enough was acknowledged (a kill)."""
    stop = asyncio.Event()
    async with aiohttp.ClientSession() as http:
        tasks = [asyncio.create_task(worker(http, base, stream, w, ledger, stop))
                 for w in range(WORKERS)]
        try:
            if during is not None:
                await during()
            await wait_for(until, limit_s, f"load on {stream}")
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 30)


async def feed(base: str, stream: str) -> tuple[dict[str, dict[str, Any]], int | None]:
    """Every cue of the change feed by id, and the stream epoch the node serves."""
    out: dict[str, dict[str, Any]] = {}
    since, epoch = 0, None
    async with aiohttp.ClientSession() as http:
        for _ in range(1000):
            async with http.get(f"{base}/api/streams/{stream}/captions?since={since}",
                                timeout=HTTP_TIMEOUT) as resp:
                assert resp.status == 200, await resp.text()
                doc = await resp.json()
            epoch = doc["epoch_ns"]
            for c in doc["cues"]:
                out[c["id"]] = c
            if not doc["cues"]:
                return out, epoch
            since = doc["next"]
    raise AssertionError("change feed did not end")


def check(ledger: Ledger, stored: dict[str, dict[str, Any]]) -> list[str]:
    """Problems: an acknowledged cue missing or holding content it never had."""
    problems = []
    for cue_id, acked in ledger.acked.items():
        got = stored.get(cue_id)
        if got is None:
            problems.append(f"acknowledged cue {cue_id} lost")
            continue
        view_ = {k: got[k] for k in ("id", "start", "end", "text", "final")}
        if view_ not in [acked, *ledger.in_flight.get(cue_id, [])]:
            problems.append(f"{cue_id}: holds {view_}, acknowledged {acked}")
    return problems


async def all_hold(bases: list[str], stream: str, ledger: Ledger, limit_s: float) -> None:
    """Every node serves every acknowledged cue (waiting for catch-up, bounded)."""
    problems: list[str] = []
    for _ in range(int(limit_s / 0.25) + 1):
        problems = []
        epochs = set()
        for base in bases:
            stored, epoch = await feed(base, stream)
            epochs.add(epoch)
            problems += [f"{base}: {p}" for p in check(ledger, stored)]
        if len(epochs) != 1:
            problems.append(f"nodes serve different epochs {epochs}")
        if not problems:
            return
        await asyncio.sleep(0.25)
    raise AssertionError(f"{len(problems)} problems, first: {problems[:5]}")


async def get(base: str, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(base + path,
                                                        timeout=HTTP_TIMEOUT) as resp:
        return resp.status, await resp.text()


async def start_nodes(folder: Path, url: str, names: str) -> list[Node]:
    nodes = [Node(folder / name, url) for name in names]
    await asyncio.gather(*(asyncio.to_thread(n.wait_ready) for n in nodes))
    return nodes


async def test_three_nodes_share_captions_survive_a_node_kill_and_a_redis_restart(
    tmp_path: Path,
) -> None:
    store = RedisServer(tmp_path / "redis")
    nodes: list[Node] = []
    try:
        nodes = await start_nodes(tmp_path, store.url, "abc")
        a, b, c = nodes
        # Media and a viewer with the sync channel on C: C pushes captions to it live.
        timeline = Timeline.starting_now(time.time_ns)
        publisher = await publish(
            f"{c.base}/whip/live",
            [BeepAudioTrack(timeline), FlashVideoTrack(timeline, width=160, height=96)],
            capture_start_ns=timeline.start_house_ns, ice_addresses=LOOPBACK,
        )
        async with aiohttp.ClientSession() as http:
            viewer = await view(http, c.base, "live", data_channel="sync", decode=False)
        records = ViewerRecords()
        viewer.channel.on("message", records.feed)
        try:
            await wait_for(lambda: any(isinstance(m, Epoch) for m in records.controls), 20,
                           "the epoch on C's sync channel")

            # 1. Ingest at A: B serves it (feed, window, chunk), C pushes it live.
            cue = {"id": "from-a", "start": timeline.start_house_ns + 500_000_000,
                   "end": timeline.start_house_ns + 1_900_000_000, "text": "hello from A"}
            async with aiohttp.ClientSession() as http, http.post(
                f"{a.base}/api/streams/live/captions",
                json={"timebase": "house_ns", "lang": "en", "cues": [cue]},
            ) as resp:
                assert resp.status == 200, await resp.text()
                answer = await resp.json()
            seq = answer["cues"][0]["seq"]
            await wait_for(lambda: any(isinstance(m, Cue) and m.id == "from-a"
                                       for m in records.controls), 10,
                           "A's cue on C's sync channel")
            pushed = next(m for m in records.controls if isinstance(m, Cue))
            assert (pushed.text, pushed.start, pushed.end) == ("hello from A", 0.5, 1.9)
            stored_b, epoch_b = await feed(b.base, "live")
            assert stored_b["from-a"]["seq"] == seq
            assert epoch_b == answer["epoch_ns"]
            status, window = await get(b.base, "/captions/live/en.vtt?start=0&end=60")
            assert status == 200 and "hello from A" in window, window
            status, chunk = await get(b.base, "/captions/live/en/chunk-0.vtt")
            assert status == 200 and "hello from A" in chunk, chunk
            assert f"X-STREAM-EPOCH-NS={answer['epoch_ns']}" in chunk

            # 1b. The first cues of a new stream posted at all three nodes at once: one epoch
            # wins in Redis, and each node converts its house times against that one.
            # Each cue outlasts the latest start, so it is served whichever node's epoch wins
            # (a cue that ends before its stream's epoch is refused, on one node as on three).
            now = time.time_ns()
            starts = {n.base: now + k * 700_000_000 for k, n in enumerate(nodes)}

            async def first(node: Node) -> dict[str, Any]:
                start = starts[node.base]
                async with aiohttp.ClientSession() as http, http.post(
                    f"{node.base}/api/streams/race/captions",
                    json={"timebase": "house_ns", "lang": "en",
                          "cues": [{"id": node.base[-5:], "start": start,
                                    "end": start + 3_000_000_000, "text": "race"}]},
                ) as resp:
                    assert resp.status == 200, await resp.text()
                    answer: dict[str, Any] = await resp.json()
                    return answer

            answers = await asyncio.gather(*(first(n) for n in nodes))
            epoch = answers[0]["epoch_ns"]
            assert {x["epoch_ns"] for x in answers} == {epoch}
            assert epoch in starts.values()
            for node in nodes:
                stored, served = await feed(node.base, "race")
                assert served == epoch
                for n2 in nodes:
                    want_ms = max(0, round((starts[n2.base] - epoch) / 1e6))
                    assert round(stored[n2.base[-5:]]["start"] * 1000) == want_ms, stored

            # 2. B killed with SIGKILL mid-ingest: everything it acknowledged is served by A
            # and C, and by a new B.
            killed = Ledger()

            async def kill_b() -> None:
                await wait_for(lambda: killed.count >= 200, 30, "200 cues acknowledged by B")
                b.kill()

            await run_load(b.base, "dur", killed, lambda: True, 30, during=kill_b)
            assert killed.count >= 200
            b2 = (await start_nodes(tmp_path, store.url, "d"))[0]
            nodes.append(b2)
            await all_hold([a.base, c.base, b2.base], "dur", killed, 10)

            # 3. Redis killed and started again on the same port and folder mid-ingest at A.
            restarted = Ledger()
            down: dict[str, Any] = {}

            async def restart_redis() -> None:
                await wait_for(lambda: restarted.count >= 150, 30, "150 cues before the kill")
                packets = len(viewer.received)
                store.kill()
                down["refused_before"] = len(restarted.refusals)
                await wait_for(lambda: len(restarted.refusals) >= 3, 10,
                               "ingest refused while Redis is down")
                # Reads answer from memory, and the relay does not care.
                down["window"] = await get(c.base, "/captions/live/en.vtt?start=0&end=60")
                down["feed"] = await feed(b2.base, "dur")
                down["healthz"] = await get(a.base, "/healthz")
                await asyncio.sleep(1.0)
                down["packets"] = len(viewer.received) - packets
                down["acked_while_down"] = restarted.count
                await asyncio.to_thread(store.start)
                down["acked_at_restart"] = restarted.count

            await run_load(a.base, "dur2", restarted,
                           lambda: restarted.count >= down.get("acked_at_restart", 1e9) + 150,
                           40, during=restart_redis)
            refusals = restarted.refusals
            assert refusals, "no ingest was refused while Redis was down"
            for status, retry, body in refusals:
                assert status == 503 and int(retry) >= 1
                assert "Redis" in json.loads(body)["error"]
            assert down["window"][0] == 200 and "hello from A" in down["window"][1]
            assert down["healthz"][0] == 200
            assert len(down["feed"][0]) > 0
            assert down["packets"] > 20, f"{down['packets']} media packets in 1 s without Redis"
            await all_hold([a.base, c.base, b2.base], "dur2", restarted, 15)
            await all_hold([a.base, c.base, b2.base], "dur", killed, 5)

            # 4. After the restart the live push crosses nodes again (B resubscribed... here
            # the new B ingests and C pushes).
            async with aiohttp.ClientSession() as http, http.post(
                f"{b2.base}/api/streams/live/captions",
                json={"timebase": "house_ns", "lang": "en",
                      "cues": [{**cue, "id": "after-restart", "text": "back again"}]},
            ) as resp:
                assert resp.status == 200, await resp.text()
            await wait_for(lambda: any(isinstance(m, Cue) and m.id == "after-restart"
                                       for m in records.controls), 10,
                           "the new B's cue on C's sync channel after the Redis restart")
        finally:
            await viewer.close()
            await publisher.close()
    except BaseException:
        # What the nodes logged about the failure (an unhandled error's traceback above all).
        for node in nodes:
            faults = [line for line in node.lines if "unhandled" in line or line[:1] in " T"]
            print(f"--- node {node.base}: {''.join(faults[-60:])}")
        raise
    finally:
        for node in nodes:
            node.stop()
        store.kill()


def test_a_redis_that_could_lose_writes_is_refused_unless_accepted(tmp_path: Path) -> None:
    lax = RedisServer(tmp_path / "redis", "--appendfsync", "everysec")
    try:
        base = [*sidecar_command(), "serve", "--host", "127.0.0.1", "--port", str(free_port()),
                "--data-dir", str(tmp_path / "data"), "--redis-url", lax.url]
        refused = subprocess.run(base, capture_output=True, text=True, timeout=30)
        assert refused.returncode == 2, refused.stderr
        assert "appendfsync everysec" in refused.stderr
        assert "appendfsync always" in refused.stderr
        assert "redis_allow_unsafe_persistence" in refused.stderr
        accepted = Node(tmp_path / "ok", lax.url,
                        SFU_SIDECAR_REDIS_ALLOW_UNSAFE_PERSISTENCE="true")
        try:
            accepted.wait_ready()
        finally:
            accepted.stop()
    finally:
        lax.kill()
    gone = subprocess.run(
        [*sidecar_command(), "serve", "--host", "127.0.0.1", "--port", str(free_port()),
         "--data-dir", str(tmp_path / "data"), "--redis-url",
         f"redis://127.0.0.1:{free_port()}/0"],
        capture_output=True, text=True, timeout=30,
    )
    assert gone.returncode == 1, gone.stderr
    assert "cannot reach Redis" in gone.stderr and "redis_url" in gone.stderr
    wrong = subprocess.run(
        [*sidecar_command(), "serve", "--redis-url", "http://127.0.0.1:6379/0"],
        capture_output=True, text=True, timeout=30,
    )
    assert wrong.returncode == 2, wrong.stderr
    assert "--redis-url" in wrong.stderr and "redis://" in wrong.stderr


async def test_alignment_fields_round_trip_through_redis(tmp_path: Path) -> None:
    """A moved cue's shift and a fixed cue's mark are stored in Redis and read back, from the
    snapshot a new node opens with; cues written before the fields existed read as unmoved."""
    from sfu_sidecar.captions.model import StoredCue
    from sfu_sidecar.captions.redis_store import RedisCueStore
    from sfu_sidecar.captions.store import WriteBatch

    server = RedisServer(tmp_path / "redis")
    try:
        store = RedisCueStore(server.url)
        await store.open()
        written = await store.write(WriteBatch(cues=[
            StoredCue("s", "en", "moved", 1310, 2810, "a", True, 0, shift_ms=310),
            StoredCue("s", "en", "kept", 4000, 5000, "b", True, 0, fixed=True),
        ]))
        assert [(c.shift_ms, c.fixed) for c in written] == [(310, False), (0, True)]
        # A cue as an earlier version stored it: ten fields, no alignment.
        client = redis.Redis(port=server.port, decode_responses=True)
        key = next(k for k in client.keys("*cues:s"))
        client.hset(key, "en\x1fold", json.dumps(["s", "en", "old", 1, 2, "c", 1, 99, "", 0]))
        client.close()
        await store.close()
        again = RedisCueStore(server.url)
        by_id = {c.id: c for c in (await again.open()).cues}
        await again.close()
        assert (by_id["moved"].start_ms, by_id["moved"].shift_ms, by_id["moved"].fixed) == (
            1310, 310, False)
        assert (by_id["kept"].fixed, by_id["kept"].shift_ms) == (True, 0)
        assert (by_id["old"].fixed, by_id["old"].shift_ms) == (False, 0)
    finally:
        server.kill()
