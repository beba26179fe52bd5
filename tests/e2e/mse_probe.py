"""The viewer page in MSE mode (``/?mode=mse``) in headless Chromium: live segments and caption
chunks over HTTP, no WebRTC in the browser.

Run inside a network namespace that has only ``lo`` (see test_mse_chromium.py). The service and
an aiortc publisher (VP8 or H.264, frames numbered in their pixels, capture times stamped) run
on an event loop in a thread. Cues are ingested up front: one every 2 s for the whole run, on
the house clock. Chromium plays the stream; for every presented frame the page records the
frame number read off the pixels, the frame's stream time as the player computes it (its media
time minus the SourceBuffer offset) and the cues active on the text track.

With ``--gap S`` the publisher leaves half-way and a new one (new RTP timestamp base, same
frame numbering and capture clock) comes back S seconds later: a discontinuity on the stream
timeline. With ``--drift S`` the page loads through a proxy that, from half-way on, lists every
new segment S seconds later in the index than the bytes' own timestamps say: media whose
timestamps have drifted off the caption timeline. Prints one JSON line: frames, the true
capture time of every frame number, the cues, the stream epoch and the player's stats.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import aiohttp
from aiohttp import web

from tests.conftest import free_port
from tests.e2e.harness import FRAME_NUMBER_JS, Broadcaster, LoopThread, serve_app
from tests.support import chromium

STREAM = "mse"
CUE_EVERY_S = 2.0
CUE_LENGTH_S = 1.2

# Records every presented frame, with the frame number read off its pixels.
RECORD_JS = """
() => {
  const video = document.getElementById('video');
  (""" + FRAME_NUMBER_JS.strip() + """)();
  window.probeFrames = [];
  const player = window.sfuViewer.player;
  player.frameListeners = [(record) => {
    const n = window.readFrameNumber(video);
    if (n === null) return;
    window.probeFrames.push({n, frameS: record.frameS, mediaTime: record.mediaTime,
                             currentTime: record.currentTime,
                             cues: record.cues, resyncs: player.stats.resyncs,
                             seeks: player.stats.seeks['live-edge'] + player.stats.seeks.hole,
                             wall: Date.now()});
  }];
}
"""


STATE_JS = """
() => {
  const v = document.getElementById('video');
  const b = window.sfuViewer.player.buffer;
  const r = b ? [...Array(b.buffered.length).keys()].map(
    i => [b.buffered.start(i), b.buffered.end(i)]) : null;
  return JSON.stringify({status: document.getElementById('status').textContent,
    stats: window.sidecarStats, currentTime: v.currentTime, readyState: v.readyState,
    paused: v.paused, error: v.error && v.error.message, buffered: r,
    appending: window.sfuViewer.player.appending ?? null});
}
"""


class FaultProxy:
    """A reverse proxy in front of the service; from ``drift_from_s`` (stream time) on, the
    segment index lists segments ``drift_s`` later than their bytes' timestamps; with
    ``corrupt_next`` set, the next media segment is served with its first bytes overwritten
    (a container no parser takes)."""

    def __init__(self, upstream: str, drift_s: float) -> None:
        self.upstream = upstream
        self.drift_s = drift_s
        self.drift_from_s: float | None = None
        self.corrupt_next = False
        self.corrupted: str | None = None
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.open: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self.forward)
        app.on_shutdown.append(self.close_open)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def close_open(self, _app: web.Application) -> None:
        """Ends the streams in flight (live captions), which would hold the shutdown up."""
        for task in list(self.open):
            task.cancel()

    async def forward(self, request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()
        assert task is not None
        self.open.add(task)
        try:
            async with aiohttp.ClientSession() as http:
                return await self._forward(http, request)
        finally:
            self.open.discard(task)

    async def _forward(self, http: aiohttp.ClientSession,
                       request: web.Request) -> web.StreamResponse:
        async with http.get(
            self.upstream + request.path_qs, headers={"Authorization":
                                                      request.headers.get("Authorization", "")}
        ) as resp:
            headers = {k: v for k, v in resp.headers.items()
                       if k in ("Content-Type", "Cache-Control")}
            if request.path.endswith("/media/index.json") and resp.status == 200:
                index = json.loads(await resp.read())
                listed = index["segments"] + ([index["open"]] if index.get("open") else [])
                for segment in listed:
                    if self.drift_from_s is not None and segment["start_s"] >= self.drift_from_s:
                        segment["start_s"] += self.drift_s
                return web.Response(status=resp.status, body=json.dumps(index).encode(),
                                    headers=headers)
            corrupt = (self.corrupt_next and resp.status == 200 and "/media/" in request.path
                       and request.path.rsplit("/", 1)[-1][0].isdigit())
            if corrupt:
                self.corrupt_next = False
                self.corrupted = request.path
            # Passed on as it comes, so a segment being made streams through part by part.
            out = web.StreamResponse(status=resp.status, headers=headers)
            await out.prepare(request)
            try:
                async for chunk in resp.content.iter_any():
                    if corrupt:
                        chunk, corrupt = b"\xff" * min(64, len(chunk)) + chunk[64:], False
                    await out.write(chunk)
                await out.write_eof()
            except ConnectionError:
                pass  # the page left
            except aiohttp.ClientError:
                # The service cut the response off (or the proxy is stopping): so does this.
                if request.transport is not None:
                    request.transport.close()
            return out


class Service(LoopThread):
    """The app and the publisher on their own event loop."""

    def __init__(self, codec: str) -> None:
        super().__init__()
        self.codec = codec
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.broadcaster = Broadcaster(f"{self.base}/whip/{STREAM}", codec)
        self.extra_runners: list[web.AppRunner] = []

    async def _start(self) -> None:
        self.runner = await serve_app(self.port)
        await self.broadcaster.publish()

    async def leave(self) -> None:
        await self.broadcaster.leave()

    async def come_back(self) -> None:
        await self.broadcaster.come_back()

    async def post_cues(self, start_ns: int, count: int) -> list[dict[str, Any]]:
        cues = [
            {"id": f"cue-{k}", "start": start_ns + int(k * CUE_EVERY_S * 1e9),
             "end": start_ns + int((k * CUE_EVERY_S + CUE_LENGTH_S) * 1e9), "text": f"cue {k}"}
            for k in range(count)
        ]
        body = {"timebase": "house_ns", "lang": "en", "cues": cues}
        async with aiohttp.ClientSession() as http, http.post(
            f"{self.base}/api/streams/{STREAM}/captions", json=body
        ) as resp:
            assert resp.status in (200, 201), await resp.text()
            return cues

    async def epoch(self) -> int | None:
        async with aiohttp.ClientSession() as http, http.get(
            f"{self.base}/api/streams/{STREAM}/captions"
        ) as resp:
            return (await resp.json())["epoch_ns"]  # type: ignore[no-any-return]

    async def _stop(self) -> None:
        for runner in self.extra_runners:
            await runner.cleanup()
        await self.broadcaster.close()
        await self.runner.cleanup()



def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--codec", choices=("vp8", "h264"), default="vp8")
    parser.add_argument("--watch", type=float, default=10.0)
    parser.add_argument("--gap", type=float, default=0.0)
    parser.add_argument("--drift", type=float, default=0.0)
    parser.add_argument("--corrupt", action="store_true",
                        help="half-way, serve one media segment corrupted")
    parser.add_argument("--latency", choices=("segments", "low"), default="segments",
                        help="the player's latency mode (low: segments streamed as made)")
    args = parser.parse_args()

    service = Service(args.codec)
    service.thread.start()
    if not service.ready.wait(30):
        raise SystemExit("service did not start")
    proxy = FaultProxy(service.base, args.drift)
    service.call(proxy.start())
    service.extra_runners.append(proxy.runner)
    total_s = args.watch * (2 if args.gap or args.drift or args.corrupt else 1) + args.gap + 10
    result: dict[str, Any] = {"codec": args.codec, "gap_s": args.gap, "drift_s": args.drift}
    with chromium.browser() as browser:
        # Cues from now on, once the browser is ours: a wait for the lock must not let the
        # times they are for pass before the page plays.
        result["cues"] = service.call(service.post_cues(time.time_ns() + 1_000_000_000,
                                                        int(total_s / CUE_EVERY_S) + 1))
        page = browser.new_page()
        page.on("console", lambda m: print("page:", m.text, file=sys.stderr))
        page.on("pageerror", lambda e: print("page error:", e, file=sys.stderr))
        page.goto(f"{proxy.base}/?stream={STREAM}&mode=mse&latency={args.latency}")
        page.wait_for_function("() => window.sfuViewer?.player !== undefined", timeout=10000)
        page.evaluate(RECORD_JS)
        try:
            page.wait_for_function("() => window.probeFrames.length > 0", timeout=30000)
        except Exception:
            print("no frame presented:", page.evaluate(STATE_JS), file=sys.stderr)
            raise
        started = page.evaluate("() => document.getElementById('video').currentTime")
        time.sleep(args.watch)
        if args.gap:
            result["before_gap"] = page.evaluate("() => window.sidecarStats")
            service.call(service.leave())
            time.sleep(args.gap)
            service.call(service.come_back())
            result["back_wall_ms"] = time.time_ns() // 1_000_000
            time.sleep(args.watch)
        if args.drift:
            result["before_drift"] = page.evaluate("() => window.sidecarStats")
            epoch = service.call(service.epoch())
            proxy.drift_from_s = (time.time_ns() - epoch) / 1e9 + 0.5
            result["drift_from_s"] = proxy.drift_from_s
            time.sleep(args.watch)
        if args.corrupt:
            result["before_corrupt"] = page.evaluate("() => window.sidecarStats")
            proxy.corrupt_next = True
            time.sleep(args.watch)
            result["corrupted"] = proxy.corrupted
        result["stats"] = page.evaluate("() => window.sidecarStats")
        result["current_time"] = [started, page.evaluate(
            "() => document.getElementById('video').currentTime")]
        result["frames"] = page.evaluate("() => window.probeFrames")
        result["panel"] = page.evaluate("() => document.getElementById('resyncs').textContent")
        result["tracks"] = page.evaluate(
            "() => [...document.getElementById('video').textTracks].map("
            "t => ({kind: t.kind, language: t.language, mode: t.mode, cues: t.cues.length}))")
    result["epoch_ns"] = service.call(service.epoch())
    capture_log = service.broadcaster.video.capture_log
    result["capture_log"] = {str(n): ns for n, ns in capture_log.items()}
    service.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
