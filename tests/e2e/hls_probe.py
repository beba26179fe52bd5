"""hls.js in headless Chromium plays the HLS master playlist of an H.264 stream with captions.

The service and an aiortc publisher (H.264 and Opus, frames numbered in their pixels, capture
times stamped and joined to the house clock) run on an event loop in a thread. While the page
plays, a feeder ingests one 1.5 s cue every 2 s of stream time over the caption API, each a
little after it starts, as a live captioner would. hls.js (the pinned npm release, injected into
the page by the test, not served by the product) loads ``master.m3u8`` with the view token on
every request. The page records, for every presented frame, its media time and the frame number
read off the pixels; every cue hls.js puts on the subtitle text track; the fragments it plays;
its live latency. Prints one JSON line with those, the ingested cues and the true capture time
of each frame number.

With ``--gap S`` the publisher leaves half-way through and a new one (a new RTP timestamp base)
comes back S seconds later: the stream timeline breaks, and the playlists mark the
discontinuity.

``--join`` is when the player arrives: ``warm`` (the default) once a few segments are listed and
the first caption chunk has closed; ``start`` as a viewer at the start of a broadcast, whose
request for ``master.m3u8`` is the first read of the stream's segments (it starts the segmenting,
so the player joins as the first segment closes); ``late`` :data:`LATE_JOIN_S` after the first
segment closed. ``--package`` names the npm package of the hls.js build to inject (``hls.js``,
or ``hls.js-1.5`` for the 1.5 line), ``--watch`` how many seconds the page plays.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from sfu_sidecar.app import SERVICES_KEY, Components, build_app
from sfu_sidecar.config import load_settings
from tests.conftest import IN_PROCESS, ROOT, free_port
from tests.e2e.harness import FRAME_NUMBER_JS, Broadcaster, LoopThread
from tests.support import chromium

STREAM = "hls"
TOKEN = "e2e-view"
PACKAGES = ("hls.js", "hls.js-1.5")  # the newest pinned release and the 1.5 line


def hls_js(package: str) -> Path:
    return ROOT / "node_modules" / package / "dist" / "hls.min.js"


HLS_JS = hls_js(PACKAGES[0])
WATCH_S = 14.0
LATE_JOIN_S = 10.0
# Cue k lasts [2k + 1, 2k + 2.5) stream seconds: longer than a segment, so it comes in the
# caption windows of two or three segments and hls.js must show it once.
CUE_EVERY_S, CUE_LEN_S, CUE_AT_S = 2.0, 1.5, 1.0
CUE_LATE_S = 0.5  # a cue is ingested this long after it starts

PLAY_JS = """
({src, token}) => {
  const video = document.createElement('video');
  video.muted = true; video.autoplay = true; video.playsInline = true;
  document.body.appendChild(video);
  const probe = window.probe = {frames: [], frags: [], errors: [], cues: {}, samples: [],
                                subtitleTracks: null, mostCopies: 0, cueAdds: [],
                                subtitleFrags: [], initPts: [], playlists: []};
  // When each cue reached a text track (and the track's mode then), whatever added it.
  const addCue = TextTrack.prototype.addCue;
  TextTrack.prototype.addCue = function (cue) {
    probe.cueAdds.push({id: cue.id, text: cue.text, start: cue.startTime, end: cue.endTime,
                        mode: this.mode, wallMs: Date.now(), mediaTime: video.currentTime});
    return addCue.call(this, cue);
  };
  const hls = new Hls(
      {xhrSetup: (xhr) => xhr.setRequestHeader('Authorization', 'Bearer ' + token)});
  window.hls = hls;
  hls.on(Hls.Events.ERROR, (_, d) => probe.errors.push(
      {type: d.type, details: d.details, fatal: d.fatal,
       url: (d.frag && d.frag.url) || d.url || null,
       status: (d.response && d.response.code) || null}));
  // A page without a stream to play yet tries again, as a viewer reloading it would.
  hls.on(Hls.Events.ERROR, (_, d) => { if (d.fatal && d.details === 'manifestLoadError')
      setTimeout(() => hls.loadSource(src), 1000); });
  // Each caption window hls.js loaded and parsed, when, and the playhead then.
  hls.on(Hls.Events.SUBTITLE_FRAG_PROCESSED, (_, d) => probe.subtitleFrags.push(
      {sn: d.frag.sn, start: d.frag.start, url: d.frag.relurl, success: d.success,
       wallMs: Date.now(), mediaTime: video.currentTime}));
  // Each playlist hls.js parsed (main and subtitles), when: a subtitle playlist parsed before
  // the first main one is not used (hls.js 1.5 aligns it with the main playlist).
  for (const [event, type] of [[Hls.Events.LEVEL_LOADED, 'main'],
                               [Hls.Events.SUBTITLE_TRACK_LOADED, 'subtitles']]) {
    hls.on(event, (_, d) => probe.playlists.push(
        {type, wallMs: Date.now(), lastSn: d.details.endSN,
         edge: d.details.edge, mediaTime: video.currentTime}));
  }
  hls.on(Hls.Events.INIT_PTS_FOUND, (_, d) => probe.initPts.push(
      {id: d.id, cc: d.frag.cc, sn: d.frag.sn, initPTS: d.initPTS, timescale: d.timescale,
       wallMs: Date.now()}));
  hls.on(Hls.Events.FRAG_CHANGED, (_, d) => probe.frags.push(
      {sn: d.frag.sn, cc: d.frag.cc, start: d.frag.start, url: d.frag.relurl}));
  hls.on(Hls.Events.SUBTITLE_TRACKS_UPDATED, (_, d) => { probe.subtitleTracks =
      d.subtitleTracks.map((t) => ({lang: t.lang, name: t.name, default: t.default})); });
  hls.on(Hls.Events.MANIFEST_PARSED, () => { if (hls.subtitleTrack < 0) hls.subtitleTrack = 0; });
  (""" + FRAME_NUMBER_JS.strip() + """)();
  const onFrame = (now, meta) => {
    const active = [];
    for (const track of video.textTracks) {
      if (track.kind !== 'subtitles' && track.kind !== 'captions') continue;
      for (const cue of track.activeCues || []) active.push(cue.text);
    }
    probe.frames.push({n: window.readFrameNumber(video), mediaTime: meta.mediaTime,
                       wallMs: performance.timeOrigin + meta.expectedDisplayTime, active});
    video.requestVideoFrameCallback(onFrame);
  };
  video.requestVideoFrameCallback(onFrame);
  setInterval(() => {
    for (const track of video.textTracks) {
      if (track.kind !== 'subtitles' && track.kind !== 'captions') continue;
      if (track.mode === 'disabled') track.mode = 'hidden';  // cues load only when not disabled
      const texts = [...(track.cues || [])].map((cue) => cue.text);
      probe.mostCopies = Math.max(probe.mostCopies,
          ...texts.map((t) => texts.filter((x) => x === t).length));
      for (const cue of track.cues || []) {
        probe.cues[cue.text + '@' + cue.startTime] = {id: cue.id, text: cue.text,
            start: cue.startTime, end: cue.endTime, track: track.label, lang: track.language};
      }
    }
    probe.samples.push({currentTime: video.currentTime, latency: hls.latency,
                        targetLatency: hls.targetLatency, paused: video.paused});
  }, 250);
  performance.setResourceTimingBufferSize(5000);
  probe.loadedAtMs = Date.now();
  hls.loadSource(src);
  hls.attachMedia(video);
}
"""

# What the page fetched from the stream's playlists and caption windows: path, HTTP status and
# the wall times (ms) of the request and of the response's end.
RESOURCES_JS = """
() => performance.getEntriesByType('resource')
    .filter((e) => /[.](m3u8|vtt)([?]|$)/.test(e.name))
    .map((e) => ({path: new URL(e.name).pathname + new URL(e.name).search,
                  status: e.responseStatus, startMs: performance.timeOrigin + e.startTime,
                  endMs: performance.timeOrigin + e.responseEnd}))
"""


class Service(LoopThread):
    """The app, an H.264 publisher and the caption feeder on their own event loop."""

    def __init__(self) -> None:
        super().__init__()
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.broadcaster = Broadcaster(f"{self.base}/whip/{STREAM}", "h264")
        self.joined: Any = None
        self.epoch: int | None = None
        self.cues: list[dict[str, Any]] = []
        self.segments: dict[int, float] = {}  # number -> start_s, as the segmenter made them
        self.first_closed: float | None = None  # wall time (s) the first segment was seen

    async def _start(self) -> None:
        settings = load_settings({**IN_PROCESS, "ice_addresses": "127.0.0.1",
                                  "data_dir": tempfile.mkdtemp(prefix="sfu-sidecar-hls-"),
                                  "view_token": TOKEN})
        app = build_app(settings)
        self.components: Components = app[SERVICES_KEY].components
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        self.joined = await self.broadcaster.publish()
        self.http = aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"})
        captions = self.components.captions
        assert captions is not None
        for _ in range(200):
            self.epoch = captions.epoch(STREAM)
            if self.epoch is not None:
                break
            await asyncio.sleep(0.1)
        self.tasks = [asyncio.ensure_future(self._track()), asyncio.ensure_future(self._feed())]

    def stream_now_s(self) -> float:
        assert self.epoch is not None
        return (self.components.now_ns()() - self.epoch) / 1e9

    def segmenting(self) -> bool:
        segments = self.components.segments
        return segments is not None and STREAM in segments.live

    async def read_segments(self) -> None:
        """Reads index.json now (the first read starts segmenting) and every second after, so
        the stream is segmented however long the probe waits for the browser."""

        async def read() -> None:
            async with self.http.get(f"{self.base}/streams/{STREAM}/media/index.json") as r:
                assert r.status == 200, await r.text()

        async def keep_reading() -> None:
            while True:
                await asyncio.sleep(1.0)
                await read()

        await read()
        self.tasks.append(asyncio.ensure_future(keep_reading()))

    async def _track(self) -> None:
        """Keeps every segment's start as the segmenter closes it (reading its window in
        process, which is not a read of the stream: it starts nothing)."""
        segments = self.components.segments
        assert segments is not None
        while True:
            live = segments.live.get(STREAM)
            for s in live.segmenter.segments if live is not None else ():
                self.segments[s.number] = s.start_us / 1e6
            if self.segments and self.first_closed is None:
                self.first_closed = time.time()
            await asyncio.sleep(0.05)

    async def _feed(self) -> None:
        k = 1
        while True:
            start = k * CUE_EVERY_S + CUE_AT_S
            await asyncio.sleep(max(0.0, start + CUE_LATE_S - self.stream_now_s()))
            cue = {"id": f"c{k}", "start": start, "end": start + CUE_LEN_S, "text": f"cue {k}"}
            body = {"timebase": "stream_s", "lang": "en", "cues": [cue]}
            async with self.http.post(f"{self.base}/api/streams/{STREAM}/captions",
                                      json=body) as r:
                cue["status"] = r.status
            self.cues.append(cue)
            k += 1

    async def _stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await self.http.close()
        await self.broadcaster.close()
        await self.runner.cleanup()



def wait_available(url: str, timeout_s: float) -> float:
    """Seconds until ``url`` answered 200 (with the view token)."""
    started = time.monotonic()
    while True:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
        try:
            with urllib.request.urlopen(request, timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic() - started
        except urllib.error.HTTPError as e:
            if e.code != 404 or time.monotonic() - started > timeout_s:
                raise
        time.sleep(0.25)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gap", type=float, default=0.0)
    parser.add_argument("--join", choices=("warm", "start", "late"), default="warm")
    parser.add_argument("--package", choices=PACKAGES, default=PACKAGES[0])
    parser.add_argument("--watch", type=float, default=WATCH_S)
    args = parser.parse_args()
    gap, watch_s = args.gap, args.watch
    service = Service()
    service.thread.start()
    if not service.ready.wait(30):
        raise SystemExit("service did not start")
    result: dict[str, Any] = {"joined": service.joined is not None, "epoch": service.epoch,
                              "join": args.join, "package": args.package}
    media = f"{service.base}/streams/{STREAM}/media"
    if args.join == "warm":
        service.call(service.read_segments())
        # hls.js starts 3 target durations behind the newest segment: a few must be listed
        # first, and the first caption chunk closed (chunk end + 3 s grace).
        result["waited_s"] = {
            "segments": wait_available(f"{media}/media.m3u8", 30),
            "captions": wait_available(f"{service.base}/captions/{STREAM}/en/live.m3u8", 30),
        }
        while len(service.segments) < 4:
            time.sleep(0.25)
    elif args.join == "late":
        service.call(service.read_segments())

    with chromium.browser() as browser:
        page = browser.new_page()
        page.goto(f"{service.base}/healthz")  # an origin for the page; any would do
        page.add_script_tag(path=str(hls_js(args.package)))
        result["hls_version"] = page.evaluate("() => Hls.version")
        if args.join == "start":
            # Captions have begun (the master names the languages it has cues in);
            # the viewer's request for the master playlist is the stream's first read.
            while not service.cues:
                time.sleep(0.05)
            assert not service.segmenting(), "segmenting started before the player"
        elif args.join == "late":
            while service.first_closed is None:
                time.sleep(0.05)
            time.sleep(max(0.0, service.first_closed + LATE_JOIN_S - time.time()))
        page.evaluate(PLAY_JS, {"src": f"{media}/master.m3u8", "token": TOKEN})
        if gap:
            time.sleep(watch_s / 2)
            service.call(service.broadcaster.leave())
            time.sleep(gap)
            service.call(service.broadcaster.come_back())
            # hls.js plays a target latency behind: the break must reach the screen.
            time.sleep(watch_s)
        else:
            time.sleep(watch_s)
        result["page"] = page.evaluate(
            "() => ({...window.probe, cues: Object.values(window.probe.cues)})")
        result["resources"] = page.evaluate(RESOURCES_JS)
    capture_log = service.broadcaster.video.capture_log
    result["capture_log"] = {str(n): ns for n, ns in capture_log.items()}
    result["ingested"] = service.cues
    result["segments"] = {str(n): s for n, s in service.segments.items()}
    result["first_segment_wall_s"] = service.first_closed
    service.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
