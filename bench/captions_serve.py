"""Caption delivery and durable ingest, product beside a naive baseline, server on one core.

    python bench/captions_serve.py [--rate 500] [--seconds 10]

A 2-hour stream (one 1.5 s cue every 2 s, 3600 cues, ingested in house time so the epoch is
two hours ago and every chunk is closed) is served by:

- product: the caption component (``CaptionService``) in ``build_app``, as its own process;
- baseline: the same aiohttp app shape whose chunk handler runs the SQL query for the chunk's
  interval (indexed on start time) and serializes with the same WebVTT serializer per request,
  on a copy of the same database.

Each server process is pinned to CPU 0; the load generator is not pinned (pinned to the other
core, it stalled whenever another process shared that core). Chunk GETs pick chunk
indices uniformly over the two hours. Open loop: requests are scheduled at ``--rate`` per second
and latency counts from the scheduled send time, so a stall delays every request behind it
(no coordinated omission), so it includes the client's own scheduling delays; the "srv" columns
are the server's own handling time from its request histogram (/metrics), which excludes them.
Closed loop: 32 connections back to back, for peak throughput.
The product's first request of a closed chunk freezes it (renders and stores it durably before
serving it as immutable); that cold pass is its own row.

Durable ingest: POSTs acknowledged only after SQLite (WAL, synchronous=FULL) committed them;
"batches/commit" is the group-commit factor read from /metrics.

Takes /tmp/sfu-sidecar-bench.lock for the whole run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BENCH_LOCK = Path("/tmp/sfu-sidecar-bench.lock")
TOKEN = "bench"
STREAM = "bench"
HOURS = 2
CUE_EVERY_MS = 2000
CUE_MS = 1500
SERVER_CPU = 0


# --- server processes ------------------------------------------------------------------------


def serve_product(port: int, data_dir: Path) -> None:
    from sfu_sidecar.app import Components, build_app
    from sfu_sidecar.captions.service import CaptionService
    from sfu_sidecar.config import Settings
    from sfu_sidecar.metrics import Metrics

    # The ingest phase measures the store, so the per-stream cue rate limit is lifted.
    settings = Settings(data_dir=data_dir, publish_token=TOKEN, port=port, log_level="warning",
                        max_cues_per_s=1e6)
    metrics = Metrics()
    app = build_app(settings, Components(metrics, captions=CaptionService(settings, metrics)))
    _run(app, port)


def serve_baseline(port: int, data_dir: Path) -> None:
    """Per request: SELECT the chunk's cues, build Cue objects, serialize."""
    from sfu_sidecar.captions import chunks, webvtt

    conn = sqlite3.connect(data_dir / "captions.sqlite3")
    conn.execute("CREATE INDEX IF NOT EXISTS bench_start ON cues (stream, lang, start_ms)")
    (epoch,) = conn.execute("SELECT epoch_ns FROM epochs WHERE stream=?", (STREAM,)).fetchone()
    chunk_ms = 2000

    async def chunk(request: web.Request) -> web.Response:
        n = int(request.match_info["n"])
        lo, hi = n * chunk_ms, (n + 1) * chunk_ms
        rows = conn.execute(
            "SELECT id, start_ms, end_ms, text FROM cues WHERE stream=? AND lang=? AND "
            "start_ms>=? AND start_ms<? AND end_ms>? AND deleted=0 ORDER BY start_ms, id",
            (request.match_info["stream"], request.match_info["lang"], lo - 3_600_000, hi, lo),
        ).fetchall()
        cues = [
            webvtt.VttCue(i, webvtt.seconds_from_ms(a), webvtt.seconds_from_ms(b), t)
            for i, a, b, t in rows
        ]
        body = webvtt.serialize(
            cues, header=[chunks.timestamp_map(lo), f"{chunks.EPOCH_HEADER}={epoch}"]
        ).encode()
        return web.Response(body=body, headers={"Content-Type": "text/vtt; charset=utf-8"})

    from sfu_sidecar.app import Components, build_app
    from sfu_sidecar.config import Settings
    from sfu_sidecar.metrics import Metrics

    # The same application shell (edge middleware, metrics, /healthz) around the naive handler.
    app = build_app(Settings(data_dir=data_dir, log_level="warning"), Components(Metrics()))
    app.router.add_get(r"/captions/{stream}/{lang}/chunk-{n:[0-9]{1,12}}.vtt", chunk)
    _run(app, port)


def _run(app: web.Application, port: int) -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


@contextlib.contextmanager
def server(kind: str, data_dir: Path) -> Iterator[str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, __file__, f"--serve-{kind}", str(port), str(data_dir)],
        preexec_fn=lambda: os.sched_setaffinity(0, {SERVER_CPU}),
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(base + "/healthz", timeout=0.5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{kind} server did not start") from None
                time.sleep(0.05)
        yield base
    finally:
        proc.terminate()
        proc.wait(10)


# --- load ------------------------------------------------------------------------------------


@dataclass
class Run:
    name: str
    offered: str
    done: int
    errors: int
    seconds: float
    latencies_ms: list[float]
    server_buckets: dict[float, float] | None = None

    def server_le(self, share: float) -> str:
        """Smallest histogram bound under which ``share`` of the server-side times fall."""
        if not self.server_buckets:
            return "-"
        total = self.server_buckets[float("inf")]
        for bound, count in sorted(self.server_buckets.items()):
            if total and count >= share * total:
                return f"<={bound * 1000:g}" if bound != float("inf") else ">1000"
        return "-"

    @property
    def rate(self) -> float:
        return self.done / self.seconds

    def pct(self, p: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        data = sorted(self.latencies_ms)
        return data[min(len(data) - 1, int(p / 100 * len(data)))]


def chunk_paths(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    last = HOURS * 3600 * 1000 // 2000 - 2
    return [f"/captions/{STREAM}/en/chunk-{rng.randrange(0, last)}.vtt" for _ in range(count)]


async def open_loop(base: str, name: str, rate: float, seconds: float) -> Run:
    import aiohttp

    paths = chunk_paths(int(rate * seconds), seed=1)
    latencies: list[float] = []
    errors = 0

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as session:

        async def one(path: str, due: float) -> None:
            nonlocal errors
            try:
                async with session.get(base + path) as resp:
                    await resp.read()
                    if resp.status != 200:
                        errors += 1
                        return
            except aiohttp.ClientError:
                errors += 1
                return
            latencies.append((time.perf_counter() - due) * 1000)

        tasks = []
        start = time.perf_counter() + 0.05
        for i, path in enumerate(paths):
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(path, due)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    return Run(name, f"{rate:.0f}/s", len(latencies), errors, elapsed, latencies)


async def closed_loop(
    base: str, name: str, paths: list[str], seconds: float, conns: int, *, once: bool = False
) -> Run:
    """``conns`` clients back to back for ``seconds`` (or until ``paths`` ran out, ``once``)."""
    import aiohttp

    latencies: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds
    queue = iter(paths if once else paths * 1000)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conns)) as session:

        async def loop() -> None:
            nonlocal errors
            while time.perf_counter() < stop:
                path = next(queue, None)
                if path is None:
                    return
                t0 = time.perf_counter()
                async with session.get(base + path) as resp:
                    await resp.read()
                    if resp.status != 200:
                        errors += 1
                        continue
                latencies.append((time.perf_counter() - t0) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*[loop() for _ in range(conns)])
        elapsed = time.perf_counter() - started
    return Run(name, f"{conns} conns", len(latencies), errors, elapsed, latencies)


async def seed(base: str) -> None:
    """3600 cues in house time: the first batch fixes the epoch two hours ago."""
    import aiohttp

    epoch = time.time_ns() - HOURS * 3600 * 10**9
    count = HOURS * 3600 * 1000 // CUE_EVERY_MS
    cues = [
        {"id": f"c{i}", "start": epoch + i * CUE_EVERY_MS * 10**6,
         "end": epoch + (i * CUE_EVERY_MS + CUE_MS) * 10**6, "text": f"Caption number {i}, "
         "about forty characters."}
        for i in range(count)
    ]
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as session:
        for i in range(0, count, 500):
            doc = {"timebase": "house_ns", "lang": "en", "cues": cues[i:i + 500]}
            async with session.post(f"{base}/api/streams/{STREAM}/captions", json=doc,
                                    headers=headers) as resp:
                assert resp.status == 200, await resp.text()


def chunk_histogram(base: str) -> dict[float, float]:
    out: dict[float, float] = {}
    with urllib.request.urlopen(base + "/metrics") as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("sfu_sidecar_http_request_duration_seconds_bucket{") and \
                    "chunk-" in line:
                bound = line.split('le="')[1].split('"')[0]
                out[float(bound)] = out.get(float(bound), 0.0) + float(line.split()[-1])
    return out


async def measured(base: str, run: Awaitable[Run]) -> Run:
    before = chunk_histogram(base)
    result = await run
    after = chunk_histogram(base)
    result.server_buckets = {k: v - before.get(k, 0.0) for k, v in after.items()}
    return result


def metric(base: str, name: str) -> float:
    with urllib.request.urlopen(base + "/metrics") as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


async def ingest(base: str, name: str, per_post: int, conns: int, seconds: float) -> tuple[
        Run, float]:
    import aiohttp

    headers = {"Authorization": f"Bearer {TOKEN}"}
    commits0 = metric(base, "sfu_sidecar_caption_store_commits_total")
    batches0 = metric(base, "sfu_sidecar_caption_store_batches_total")
    latencies: list[float] = []
    counter = iter(range(10**9))
    stop = time.perf_counter() + seconds

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conns)) as session:

        async def loop(w: int) -> None:
            while time.perf_counter() < stop:
                k = next(counter)
                cues = [{"id": f"i{w}-{k}-{j}", "start": k * 0.01 + j * 0.001,
                         "end": k * 0.01 + j * 0.001 + 1.0, "text": f"ingest {k} {j}"}
                        for j in range(per_post)]
                t0 = time.perf_counter()
                async with session.post(
                    f"{base}/api/streams/ing-{per_post}/captions", headers=headers,
                    json={"timebase": "stream_s", "lang": "en", "cues": cues},
                ) as resp:
                    await resp.read()
                    assert resp.status == 200
                latencies.append((time.perf_counter() - t0) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*[loop(w) for w in range(conns)])
        elapsed = time.perf_counter() - started
    commits = metric(base, "sfu_sidecar_caption_store_commits_total") - commits0
    batches = metric(base, "sfu_sidecar_caption_store_batches_total") - batches0
    run = Run(name, f"{conns} conns", len(latencies) * per_post, 0, elapsed, latencies)
    return run, batches / commits if commits else float("nan")


# --- main ------------------------------------------------------------------------------------


def row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(
        zip(cells, widths, strict=True)))


async def bench(args: argparse.Namespace, workdir: Path) -> None:
    product_dir = workdir / "product"
    baseline_dir = workdir / "baseline"
    runs: list[Run] = []
    ingest_rows: list[tuple[Run, float]] = []
    with server("product", product_dir) as base:
        await seed(base)
        every = [f"/captions/{STREAM}/en/chunk-{n}.vtt"
                 for n in range(HOURS * 3600 * 1000 // 2000 - 2)]
        random.Random(3).shuffle(every)
        runs.append(await measured(base, closed_loop(
            base, "product, cold (first touch freezes)", every[:600], 60, 8, once=True)))
        warm_all = await closed_loop(base, "warm-up", every, 120, 32, once=True)
        assert warm_all.errors == 0
        runs.append(await measured(base, open_loop(
            base, "product, cached", args.rate, args.seconds)))
        runs.append(await measured(base, closed_loop(
            base, "product, cached", chunk_paths(5000, 2), args.seconds / 2, 32)))
        for per_post, conns in ((1, 1), (1, 16), (100, 4)):
            ingest_rows.append(await ingest(
                base, f"{per_post} cue/POST", per_post, conns, args.seconds / 2))
    shutil.copytree(product_dir, baseline_dir)
    with server("baseline", baseline_dir) as base:
        runs.append(await measured(base, open_loop(
            base, "baseline, SQL+serialize", args.rate, args.seconds)))
        runs.append(await measured(base, closed_loop(
            base, "baseline, SQL+serialize", chunk_paths(5000, 2), args.seconds / 2, 32)))

    print(f"\nchunk GET, {HOURS} h stream ({HOURS * 1800} cues, one every 2 s), "
          f"server pinned to CPU {SERVER_CPU}; latency seen by the client, and server-side")
    widths = [36, 9, 7, 7, 7, 7, 8, 10, 10, 6]
    print(row(["path", "load", "req/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "srv p50 ms",
               "srv p99 ms", "errors"], widths))
    for r in runs:
        print(row([r.name, r.offered, f"{r.rate:.0f}", f"{r.pct(50):.2f}", f"{r.pct(90):.2f}",
                   f"{r.pct(99):.2f}", f"{max(r.latencies_ms):.2f}", r.server_le(0.5),
                   r.server_le(0.99), str(r.errors)], widths))
    product_open = runs[1]
    baseline_open = runs[3]
    print(f"p99 at {args.rate:.0f}/s: product {product_open.pct(99):.2f} ms, baseline "
          f"{baseline_open.pct(99):.2f} ms (target <= 5 ms); closed-loop throughput ratio "
          f"product/baseline = {runs[2].rate / runs[4].rate:.2f}")
    print("\ndurable ingest (WAL, synchronous=FULL; acknowledged after commit)")
    widths = [16, 10, 9, 8, 8, 14]
    print(row(["POST size", "load", "cues/s", "p50 ms", "p99 ms", "batches/commit"], widths))
    for r, factor in ingest_rows:
        print(row([r.name, r.offered, f"{r.rate:.0f}", f"{r.pct(50):.2f}", f"{r.pct(99):.2f}",
                   f"{factor:.2f}"], widths))


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1].startswith("--serve-"):
        kind, port, data = sys.argv[1][8:], int(sys.argv[2]), Path(sys.argv[3])
        (serve_product if kind == "product" else serve_baseline)(port, data)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=500.0, help="open-loop requests/s")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each run")
    args = parser.parse_args()
    BENCH_LOCK.touch(exist_ok=True)
    with BENCH_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with tempfile.TemporaryDirectory(prefix="captions-bench-") as tmp:
            asyncio.run(bench(args, Path(tmp)))


if __name__ == "__main__":
    main()
