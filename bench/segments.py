"""Live segments: remux CPU against per-viewer forwarding, and segment serving against a static
file server, each side by side in the same run.

    flock /tmp/sfu-sidecar-bench.lock .venv/bin/python bench/segments.py

The server under test is the real ``sfu-sidecar serve`` process (view and publish tokens set,
default log level, so one log line per request as deployed), pinned to CPU 0; publisher and
clients run on the other CPU. For each codec (VP8 + Opus in WebM, H.264 + Opus in fragmented
MP4) a publisher process sends the synthetic broadcaster's numbered 640x360 30 fps frames with
a band of noise (so the encoder spends its whole bitrate; the encoder is pinned at 1.5 Mbit/s)
plus its beeps as Opus, over WHIP with capture stamps and the clock join, as
``tests/segments/test_live.py`` does.

CPU (part ``cpu``): the server's CPU time (see :func:`cpu_seconds`) over fixed windows in three
conditions:

- P: publisher only (nobody reads segments, so the stream is not segmented);
- R: publisher + one segment reader, polling ``index.json`` every 0.5 s and fetching each new
  segment once, as a player does;
- V: publisher + one WHEP viewer (aiortc, counting RTP without decoding).

Windows run in the order P R P V P R P V ... P, ``--rounds`` each of R and V. Remux cost is an
R window less the mean of the P windows either side of it; per-viewer cost likewise for V;
the table gives medians (and the range). A reader makes the segmenter ask for a keyframe every
``segment_duration_s`` (1 s), which is part of what reading segments costs. The achieved
bitrate is printed twice: from the segments (bytes over their stated durations) and from the
RTP payload the viewer received.

Serving (part ``serve``): after the CPU windows a reader waits for a few closed segments and
goes on polling the index; the publisher is stopped, so the server's window no longer moves,
and the reader's requests keep the segmenter alive. The same segments are written to a
temporary folder and served by a plain aiohttp static file server (``web.static``: sendfile),
also pinned to CPU 0. The same client (``--conns`` keep-alive connections back to back, see
:class:`_Connection`) GETs the segments round robin from each server in turn,
``--serve-rounds`` times; req/s, p50/p99 latency and the server's CPU per request are medians
over the rounds.

Each part is run per codec by :func:`bench_codec` while the server (and for ``cpu`` the
publisher) is up, and gives its rows of the one table; another measurement of the segment path
(glass-to-glass latency, say) fits in as one more part.

Takes /tmp/sfu-sidecar-bench.lock for the whole run (unless ``flock`` already holds it for
this process, as in the command above).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.httpload import ServeRun, closed_loop  # noqa: E402  (after the path insert)
from bench.processes import (  # noqa: E402
    BENCH_LOCK,
    CPUS,
    Server,
    cpu_seconds,
    free_port,
    holds_bench_lock,
    spawn,
    wait_healthy,
)
from bench.segmentload import (  # noqa: E402
    BITRATE,
    STREAM,
    TOKEN,
    Reader,
    Viewer,
    _auth,
    run_publisher,
)

SERVER_CPU = 0
# Stop a stream's segmenting one to two seconds after its reader stops (the sweep runs every
# second), so a publisher-only window can follow a reader window within a round.
SEGMENT_IDLE_S = 1.0
CODECS = {"vp8": ("VP8 + Opus, WebM", "webm"), "h264": ("H.264 + Opus, fMP4", "m4s")}


# --- static baseline server process -----------------------------------------------------------


def run_static(port: int, folder: Path) -> None:
    from aiohttp import web

    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    app = web.Application()
    app.router.add_static(f"/streams/{STREAM}/media", folder)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# --- processes --------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def sidecar(workdir: Path) -> AsyncIterator[Server]:
    """``sfu-sidecar serve`` (the console script's entry point, from this checkout: a copy of
    the tree at another commit benchmarks that commit's code) with the benchmark's settings."""
    port = free_port()
    log = workdir / "sidecar.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SFU_SIDECAR_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    with log.open("wb") as out:
        proc = spawn(
            [sys.executable, "-m", "sfu_sidecar", "serve", "--host", "127.0.0.1",
             "--port", str(port), "--data-dir", str(workdir / "data"), "--view-token", TOKEN,
             "--publish-token", TOKEN, "--ice-addresses", "127.0.0.1",
             "--segment-idle-s", str(SEGMENT_IDLE_S)],
            "server", env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    server = Server(proc, f"http://127.0.0.1:{port}", log)
    try:
        await wait_healthy(server, "/healthz", "sfu-sidecar serve")
        yield server
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def static_server(folder: Path) -> AsyncIterator[Server]:
    port = free_port()
    proc = spawn([sys.executable, __file__, "static", str(port), str(folder)], "server",
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = Server(proc, f"http://127.0.0.1:{port}")
    try:
        await wait_healthy(server, "/", "static server")
        yield server
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def publisher(base: str, codec: str) -> AsyncIterator[None]:
    proc = spawn([sys.executable, __file__, "publisher", f"{base}/whip/{STREAM}", codec],
                  "load", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = await asyncio.get_running_loop().run_in_executor(None, proc.stdout.readline)
        if line.strip() != b"ready":
            raise RuntimeError(f"publisher did not start ({line!r})")
        yield
    finally:
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- load: segment reader and WHEP viewer -----------------------------------------------------


CONDITIONS = ("publisher only", "+ segment reader", "+ WHEP viewer")
PUBLISHER_ONLY, READER, VIEWER = CONDITIONS
SERVE_SEGMENTS = 4  # closed segments a reader waits for after the CPU windows, to be served


@dataclass
class CpuResult:
    codec: str
    windows: list[tuple[str, float]] = field(default_factory=list)  # in the order measured
    segment_mbps: float = float("nan")
    rtp_mbps: float = float("nan")
    segment_count: int = 0
    fps: list[float] = field(default_factory=list)

    def publisher_only(self) -> float:
        return statistics.median(c for name, c in self.windows if name == PUBLISHER_ONLY)

    def rows(self) -> list[str]:
        name = CODECS[self.codec][0]
        remux, viewer = self.added(READER), self.added(VIEWER)
        return [
            f"| {name} | bitrate, Mbit/s: from the segments / RTP payload at the viewer "
            f"| {self.segment_mbps:.2f} | {self.rtp_mbps:.2f} | |",
            f"| {name} | server CPU with the publisher only, % of a core "
            f"| {self.publisher_only():.2f} | | |",
            f"| {name} | CPU added, % of a core (min to max): one segment reader (remux) / one "
            f"WHEP viewer | {_spread(remux)} | {_spread(viewer)} "
            f"| {statistics.median(remux) / statistics.median(viewer):.1f}x |",
        ]

    def notes(self) -> list[str]:
        fps = min(self.fps) if self.fps else float("nan")
        out = [f"{self.codec}: {self.segment_count} segments read, viewer fps min {fps:.1f}"]
        if self.segment_mbps < 0.9 * BITRATE / 1e6:
            out.append(f"{self.codec}: the stream reached {self.segment_mbps:.2f} Mbit/s, short "
                       f"of the {BITRATE / 1e6:.1f} Mbit/s aimed at")
        return out

    def added(self, condition: str) -> list[float]:
        """Each ``condition`` window less the mean of the publisher-only windows just before
        and after it: the CPU of a 2-core shared machine drifts over a run, and a linear drift
        cancels out this way."""
        out = []
        for i, (name, cpu) in enumerate(self.windows):
            if name == condition:
                before, after = self.windows[i - 1], self.windows[i + 1]
                assert before[0] == after[0] == PUBLISHER_ONLY
                out.append(cpu - (before[1] + after[1]) / 2)
        return out


async def _window(pid: int, seconds: float) -> float:
    """The process's CPU over the next ``seconds``, in % of one core."""
    cpu0, wall0 = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(seconds)
    return 100 * (cpu_seconds(pid) - cpu0) / (time.monotonic() - wall0)


async def _wait_for(check: Callable[[], Awaitable[bool]], limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while not await check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def measure_cpu(
    server: Server, codec: str, reader: Reader, rounds: int, seconds: float
) -> CpuResult:
    """Windows in the order P R P V P R P V ... P (P: publisher only, R: + reader, V: + viewer),
    ``rounds`` of each of R and V."""
    pid = server.proc.pid
    result = CpuResult(codec)
    rtp_bytes = rtp_s = 0.0

    async def segmenting_stopped() -> bool:
        return server.log_count("live segments stopped") >= server.log_count(
            "live segments started")

    order = [PUBLISHER_ONLY, *[PUBLISHER_ONLY if i % 2 else (READER, VIEWER)[i // 2 % 2]
                               for i in range(4 * rounds)]]
    for condition in order:
        await _wait_for(segmenting_stopped, 10, "segmenting to stop")
        if condition == PUBLISHER_ONLY:
            await asyncio.sleep(0.3)
            cpu = await _window(pid, seconds)
        elif condition == READER:
            reader.start()
            # The window opens once the first segment closed: the segmenter is then in its
            # steady state (keyframe asked for, init segment made).
            await _wait_for(lambda: reader.has_segments(1), 15, "the first segment")
            cpu = await _window(pid, seconds)
            await reader.stop()
        else:
            viewer = await Viewer.open(server.base)
            await _wait_for(viewer.receiving, 15, "the viewer's first frames")
            await asyncio.sleep(0.5)  # past the keyframe that answered its PLI
            bytes0, frames0 = viewer.payload_bytes, viewer.video_frames
            wall0 = time.monotonic()
            cpu = await _window(pid, seconds)
            elapsed = time.monotonic() - wall0
            rtp_bytes += viewer.payload_bytes - bytes0
            rtp_s += elapsed
            result.fps.append((viewer.video_frames - frames0) / elapsed)
            await viewer.close()
            await asyncio.sleep(0.5)  # the session's teardown is not in the next window
        result.windows.append((condition, cpu))
        print(f"  {codec}: {condition:<16} {cpu:6.2f} % of a core", file=sys.stderr, flush=True)
    result.segment_mbps = reader.segment_bytes * 8 / reader.segment_s / 1e6
    result.segment_count = len(reader.seen)
    result.rtp_mbps = rtp_bytes * 8 / rtp_s / 1e6 if rtp_s else float("nan")
    return result


# --- part: segment serving against a static file server ---------------------------------------


@dataclass
class ServeResult:
    codec: str
    conns: int
    segments: int
    mean_bytes: float
    product: list[ServeRun] = field(default_factory=list)
    static: list[ServeRun] = field(default_factory=list)

    def rows(self) -> list[str]:
        name = CODECS[self.codec][0]

        def both(attr: str, digits: int) -> tuple[str, str, float]:
            p, s = _median(self.product, attr), _median(self.static, attr)
            return f"{p:.{digits}f}", f"{s:.{digits}f}", p / s

        rate = both("rate", 0)
        p50, p99 = both("p50_ms", 2), both("p99_ms", 2)
        cpu, busy = both("cpu_us_per_request", 0), both("server_cpu_pct", 0)
        return [
            f"| {name} | segment GET, {self.conns} connections, req/s: product / static files "
            f"| {rate[0]} | {rate[1]} | {rate[2]:.2f}x |",
            f"| {name} | segment GET latency p50 / p99, ms "
            f"| {p50[0]} / {p99[0]} | {p50[1]} / {p99[1]} | |",
            f"| {name} | server CPU per GET, µs (server busy, % of a core) "
            f"| {cpu[0]} ({busy[0]} %) | {cpu[1]} ({busy[1]} %) | {cpu[2]:.2f}x |",
        ]

    def notes(self) -> list[str]:
        errors = sum(r.errors for r in self.product + self.static)
        return [f"{self.codec}: {self.segments} segments served, {self.mean_bytes / 1e3:.0f} kB "
                f"each, errors {errors}"]


async def measure_serving(
    product: Server, reader: Reader, codec: str, workdir: Path, rounds: int, conns: int,
    seconds: float,
) -> ServeResult:
    """GETs of the segments in the product's window, then of copies of them as static files,
    ``rounds`` times in turn.

    ``reader`` is still polling the index (2 requests/s, during both servers' runs alike): it
    keeps the product's segmenter from its idle stop."""
    import aiohttp

    ext = CODECS[codec][1]
    folder = workdir / f"static-{codec}"
    folder.mkdir()
    paths: list[str] = []
    sizes: dict[str, int] = {}
    async with aiohttp.ClientSession(headers=_auth()) as http:
        # The window as it is now that the publisher is gone: it no longer moves.
        async with http.get(f"{reader.media}/index.json") as resp:
            assert resp.status == 200, await resp.text()
            listed = (await resp.json())["segments"]
        for entry in listed:
            path = f"/streams/{STREAM}/media/{entry['number']}.{ext}"
            async with http.get(product.base + path) as resp:
                assert resp.status == 200, await resp.text()
                data = await resp.read()
            (folder / f"{entry['number']}.{ext}").write_bytes(data)
            paths.append(path)
            sizes[path] = len(data)
    result = ServeResult(codec, conns, len(paths), statistics.mean(sizes.values()))
    async with static_server(folder) as static:
        for r in range(rounds):
            for name, server, runs in (("product", product, result.product),
                                       ("static", static, result.static)):
                run = await closed_loop(server, paths, sizes, conns, seconds, TOKEN)
                runs.append(run)
                print(f"  {codec} serve round {r + 1}: {name:<7} {run.rate:7.0f} req/s, p50 "
                      f"{run.p50_ms:.2f} ms, p99 {run.p99_ms:.2f} ms, server "
                      f"{run.server_cpu_pct:.0f} % of a core, {run.cpu_us_per_request:.0f} µs "
                      f"CPU/request, errors {run.errors}", file=sys.stderr, flush=True)
    return result


# --- orchestration ----------------------------------------------------------------------------


class PartResult(Protocol):
    def rows(self) -> list[str]: ...

    def notes(self) -> list[str]: ...


async def bench_codec(args: argparse.Namespace, codec: str, workdir: Path) -> list[PartResult]:
    folder = workdir / codec
    folder.mkdir()
    results: list[PartResult] = []
    async with sidecar(folder) as server:
        reader = Reader(f"{server.base}/streams/{STREAM}/media", CODECS[codec][1])
        serving = "serve" in args.parts
        try:
            async with publisher(server.base, codec):
                await asyncio.sleep(1.0)  # first keyframe, rate control settled
                results.append(
                    await measure_cpu(server, codec, reader, args.rounds, args.seconds))
                if serving:
                    # A reader again, left running: the segments it waits for stay in the
                    # server's window once the publisher is gone, kept by its index requests.
                    reader.start()
                    await _wait_for(lambda: reader.has_segments(SERVE_SEGMENTS), 30,
                                    "segments to serve")
            if serving:
                results.append(await measure_serving(
                    server, reader, codec, workdir, args.serve_rounds, args.conns,
                    args.serve_seconds))
        finally:
            await reader.stop()
    return results


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f} to {max(values):.2f})"


def _median(runs: list[ServeRun], attr: str) -> float:
    return float(statistics.median(getattr(r, attr) for r in runs))


async def bench(args: argparse.Namespace) -> None:
    started = time.monotonic()
    results: list[PartResult] = []
    with tempfile.TemporaryDirectory(prefix="sfu-sidecar-segments-bench-") as tmp:
        for codec in args.codecs.split(","):
            results += await bench_codec(args, codec, Path(tmp))
    pinned = f"server pinned to CPU {SERVER_CPU}" if CPUS else "nothing pinned (1 CPU)"
    serving = (f"; serving: medians of {args.serve_rounds} runs of {args.serve_seconds:g} s "
               "each" if "serve" in args.parts else "")
    print(f"\nsegments: {os.cpu_count()} CPUs, {time.monotonic() - started:.0f} s, {pinned}; "
          f"source 640x360 30 fps, encoder at {BITRATE / 1e6:.1f} Mbit/s, + Opus; view token "
          f"on; CPU windows {args.seconds:g} s, {args.rounds} of each condition between "
          f"publisher-only ones{serving}")
    for result in results:
        print("\n".join(result.notes()))
    print()
    print("| stream | measure | sfu-sidecar | baseline | ratio |")
    print("|--------|---------|------------:|---------:|------:|")
    for result in results:
        print("\n".join(result.rows()))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--codecs", default="vp8,h264", help="comma-separated: vp8, h264")
    parser.add_argument("--parts", default="cpu,serve",
                        help="cpu always runs (it makes the segments); serve is optional")
    parser.add_argument("--rounds", type=int, default=3,
                        help="reader and viewer windows, each between publisher-only ones")
    parser.add_argument("--seconds", type=float, default=4.0,
                        help="CPU window per condition (whole seconds: the server's periodic "
                             "tasks run every 0.25, 1 and 2 s, so each window holds as many)")
    parser.add_argument("--serve-rounds", type=int, default=3)
    parser.add_argument("--serve-seconds", type=float, default=2.0)
    parser.add_argument("--conns", type=int, default=32)
    args = parser.parse_args(argv)
    if any(c not in CODECS for c in args.codecs.split(",")):
        parser.error(f"--codecs: choose from {', '.join(CODECS)}")
    return args


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "publisher":
        run_publisher(sys.argv[2], sys.argv[3])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "static":
        run_static(int(sys.argv[2]), Path(sys.argv[3]))
        return 0
    args = parse_args()
    if (os.cpu_count() or 1) > 1:
        CPUS["server"] = {SERVER_CPU}
        CPUS["load"] = set(range(os.cpu_count() or 2)) - {SERVER_CPU}
        os.sched_setaffinity(0, CPUS["load"])  # this process is the reader, viewer and client
    with contextlib.ExitStack() as stack:
        if not holds_bench_lock():
            BENCH_LOCK.touch(exist_ok=True)
            lock = stack.enter_context(BENCH_LOCK.open("w"))
            fcntl.flock(lock, fcntl.LOCK_EX)
        with contextlib.suppress(ImportError):
            import uvloop

            uvloop.install()  # for the serving client's sake (see _Connection)
        asyncio.run(bench(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
