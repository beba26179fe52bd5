"""Relay fan-out benchmark: packet-level relay vs aiortc's MediaRelay, in the same run.

One publisher process sends synthetic 640x360 30 fps VP8 (pinned at 1.5 Mbit/s) + Opus over
WHIP; N viewers (N = 1, 2, 4, 8, 16, 32) connect over WHEP from separate processes and count
what arrives at the RTP level (no decoding, so viewers cost little). The server under test runs
in its own process and reports its CPU time; the table gives relay CPU (% of one core),
delivered video fps and audio packets/s per viewer, loss, and the relay's added latency
(packet received -> last viewer's copy handed to the socket, in-process) p50/p99.

    flock /tmp/sfu-sidecar-bench.lock .venv/bin/python bench/relay_fanout.py

The baseline decodes once and re-encodes per viewer, so it saturates early; it runs up to
``--baseline-max`` viewers (8 by default) and the per-viewer CPU ratio is taken from the
slopes of CPU against N over the points both ran.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.processes import free_port  # noqa: E402  (after the path insert)
from bench.rtpload import (  # noqa: E402
    BITRATE,
    count_window,
    pin_vp8_bitrate,
    source_pc,
    whep_view,
    whip_publish,
)

LOOPBACK = ("127.0.0.1",)


# --- publisher --------------------------------------------------------------------------------


def run_publisher(url: str) -> None:
    async def main() -> None:
        import aiohttp

        pc = source_pc(LOOPBACK)
        async with aiohttp.ClientSession() as http:
            await whip_publish(http, url, pc)
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await pc.close()

    asyncio.run(main())


# --- viewers ----------------------------------------------------------------------------------


def run_viewers(url: str, count: int, start_at: float, seconds: float) -> None:
    async def main() -> None:
        import aiohttp

        async with aiohttp.ClientSession() as http:
            peers = [await whep_view(http, url, LOOPBACK) for _ in range(count)]
            out = await count_window([c for _, c in peers], start_at, seconds)
            print(json.dumps(out), flush=True)
            await asyncio.gather(*(pc.close() for pc, _ in peers))

    asyncio.run(main())


# --- servers ----------------------------------------------------------------------------------


def run_server(mode: str, port: int) -> None:
    import tempfile

    from aiohttp import web

    from sfu_sidecar.config import load_settings

    settings = load_settings({"ice_addresses": "127.0.0.1", "publisher_timeout_s": "600",
                              "data_dir": tempfile.mkdtemp(prefix="sfu-sidecar-bench-")})
    cpu_mark = [time.process_time(), time.monotonic()]

    async def stats(request: web.Request) -> web.Response:
        now_cpu, now_wall = time.process_time(), time.monotonic()
        cpu = (now_cpu - cpu_mark[0]) / max(now_wall - cpu_mark[1], 1e-9)
        body: dict[str, Any] = {"cpu": cpu}
        if relay is not None:
            samples = relay.latency_samples_ns()
            if samples:
                q = statistics.quantiles(samples, n=100)
                body["p50_us"], body["p99_us"] = q[49] / 1e3, q[98] / 1e3
            for stream in relay.streams.by_name.values():
                if stream.publisher is not None:
                    stream.publisher.counters.latency_ns.clear()
        cpu_mark[:] = [now_cpu, now_wall]
        return web.json_response(body)

    relay = None
    if mode == "relay":
        from sfu_sidecar.app import SERVICES_KEY, build_app

        # The whole product (house clock, captions, sync metadata per viewer), not the relay
        # alone: what a deployment pays per viewer.
        app = build_app(settings)
        relay = app[SERVICES_KEY].components.relay
    else:
        app = _mediarelay_app()
    app.router.add_get("/bench/stats", stats)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _mediarelay_app() -> Any:
    """The baseline: aiortc's own MediaRelay (decode once, re-encode per viewer)."""
    from aiohttp import web
    from aiortc import RTCPeerConnection, RTCSessionDescription
    from aiortc.contrib.media import MediaRelay

    from sfu_sidecar.relay import aiortc_adapter
    from sfu_sidecar.relay.peer import rtc_configuration

    pin_vp8_bitrate()
    media = MediaRelay()
    sources: dict[str, Any] = {}
    pcs: list[Any] = []

    async def answer(request: web.Request, setup: Callable[[Any], None]) -> web.Response:
        pc = RTCPeerConnection(rtc_configuration())
        pcs.append(pc)
        setup(pc)
        await pc.setRemoteDescription(RTCSessionDescription(await request.text(), "offer"))
        aiortc_adapter.install_ice(pc, LOOPBACK, None)
        await pc.setLocalDescription(await pc.createAnswer())
        return web.Response(status=201, text=pc.localDescription.sdp,
                            headers={"Content-Type": "application/sdp", "Location": "/x"})

    async def whip(request: web.Request) -> web.Response:
        def setup(pc: Any) -> None:
            @pc.on("track")
            def on_track(track: Any) -> None:
                sources[track.kind] = track

        return await answer(request, setup)

    async def whep(request: web.Request) -> web.Response:
        def setup(pc: Any) -> None:
            for kind in ("audio", "video"):
                pc.addTrack(media.subscribe(sources[kind], buffered=False))

        return await answer(request, setup)

    app = web.Application()
    app.router.add_post("/whip/{stream}", whip)
    app.router.add_post("/whep/{stream}", whep)
    return app


# --- orchestration ----------------------------------------------------------------------------


PIN: dict[str, set[int]] = {}


def _sub(*args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    cpus = PIN.get("server" if args[0] == "server" else "load")

    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    return subprocess.Popen(
        [sys.executable, __file__, *args], cwd=ROOT, text=True,
        stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, preexec_fn=pin,
    )


def _get(url: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        data: dict[str, Any] = json.load(resp)
        return data


def measure(mode: str, counts: list[int], seconds: float) -> list[dict[str, Any]]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = _sub("server", mode, str(port))
    rows = []
    publisher = None
    try:
        for _ in range(100):
            try:
                _get(base + "/bench/stats")
                break
            except OSError:
                time.sleep(0.1)
        publisher = _sub("publisher", base + "/whip/bench", stdin=subprocess.PIPE)
        assert publisher.stdout is not None
        assert publisher.stdout.readline().strip() == "ready"
        time.sleep(2.0)  # first keyframe, bitrate settled
        for n in counts:
            procs_n = min(n, 4)
            share = [n // procs_n + (i < n % procs_n) for i in range(procs_n)]
            start_at = time.time() + 4.0 + 0.4 * n
            viewers = [
                _sub("viewers", base + "/whep/bench", str(k), str(start_at), str(seconds))
                for k in share
            ]
            time.sleep(max(0.0, start_at - time.time()))
            _get(base + "/bench/stats")  # opens the CPU/latency window
            time.sleep(seconds)
            server_stats = _get(base + "/bench/stats")
            per_viewer: list[dict[str, Any]] = []
            for v in viewers:
                out, _ = v.communicate(timeout=60 + n)
                per_viewer.extend(json.loads(out.strip().splitlines()[-1]))
            lost = sum(v["lost"] for v in per_viewer)
            expected = sum(v["expected"] for v in per_viewer)
            rows.append({
                "mode": mode, "n": n,
                "cpu_pct": server_stats["cpu"] * 100,
                "fps": statistics.mean(v["fps"] for v in per_viewer),
                "fps_min": min(v["fps"] for v in per_viewer),
                "audio_pps": statistics.mean(v["audio_pps"] for v in per_viewer),
                "loss_pct": 100 * lost / expected if expected else 100.0,
                "p50_us": server_stats.get("p50_us"), "p99_us": server_stats.get("p99_us"),
            })
            print(_fmt(rows[-1]), file=sys.stderr, flush=True)
            time.sleep(1.0)
    finally:
        if publisher is not None and publisher.stdin is not None:
            publisher.stdin.close()
            try:
                publisher.wait(5)
            except subprocess.TimeoutExpired:
                publisher.kill()
        server.terminate()
        try:
            server.wait(5)
        except subprocess.TimeoutExpired:
            server.kill()
    return rows


def _fmt(r: dict[str, Any]) -> str:
    lat = (
        f"{r['p50_us']:8.0f} {r['p99_us']:8.0f}" if r.get("p50_us") is not None
        else f"{'n/a':>8} {'n/a':>8}"
    )
    return (
        f"| {r['mode']:<10} | {r['n']:>3} | {r['cpu_pct']:7.1f} | {r['fps']:5.1f} "
        f"({r['fps_min']:4.1f}) | {r['audio_pps']:5.1f} | {r['loss_pct']:6.2f} | {lat} |"
    )


def _slope(rows: list[dict[str, Any]]) -> float:
    xs = [r["n"] for r in rows]
    ys = [r["cpu_pct"] for r in rows]
    if len(xs) < 2:
        return float("nan")
    mx, my = statistics.mean(xs), statistics.mean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", nargs="?", default="run")
    parser.add_argument("args", nargs="*")
    parser.add_argument("--counts", default="1,2,4,8,16,32")
    parser.add_argument("--baseline-max", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument(
        "--pin", action="store_true",
        help="server on CPU 0, publisher and viewers on the other CPUs (latency without the "
             "load generators preempting the server; the baseline's encoder threads then "
             "share one core)",
    )
    ns = parser.parse_args()
    if ns.pin and (os.cpu_count() or 1) > 1:
        PIN["server"] = {0}
        PIN["load"] = set(range(1, os.cpu_count() or 2))
    if ns.role == "publisher":
        run_publisher(ns.args[0])
        return 0
    if ns.role == "viewers":
        run_viewers(ns.args[0], int(ns.args[1]), float(ns.args[2]), float(ns.args[3]))
        return 0
    if ns.role == "server":
        run_server(ns.args[0], int(ns.args[1]))
        return 0
    counts = [int(c) for c in ns.counts.split(",")]
    started = time.monotonic()
    relay_rows = measure("relay", counts, ns.seconds)
    base_rows = measure("mediarelay", [c for c in counts if c <= ns.baseline_max], ns.seconds)
    print(f"relay_fanout: {os.cpu_count()} CPUs, {time.monotonic() - started:.0f} s, "
          f"source 640x360 30 fps VP8 @ {BITRATE / 1e6:.1f} Mbit/s + Opus, "
          f"{ns.seconds:.0f} s per point" + (", server pinned to CPU 0" if PIN else ""))
    print("| server     |   N |  CPU %  | fps (min)    | aud/s | loss % | p50 µs   p99 µs |")
    print("|------------|-----|---------|--------------|-------|--------|-----------------|")
    for r in relay_rows + base_rows:
        print(_fmt(r))
    relay_slope = _slope(relay_rows)
    base_slope = _slope(base_rows)
    common = [r for r in relay_rows if r["n"] <= ns.baseline_max]
    common_slope = _slope(common)
    # Slopes of CPU against N (least squares): the fixed cost of the publisher leg drops out.
    line = f"per-viewer CPU (% of a core): relay {relay_slope:.2f} over N={counts[0]}..{counts[-1]}"
    if len(base_rows) >= 2:  # a baseline slope needs two points (--baseline-max 0 runs none)
        line += (f", {common_slope:.2f} over N <= {ns.baseline_max}; MediaRelay "
                 f"{base_slope:.2f}; ratio {base_slope / max(relay_slope, 1e-6):.0f}x "
                 f"({base_slope / max(common_slope, 1e-6):.0f}x on the common points)")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
