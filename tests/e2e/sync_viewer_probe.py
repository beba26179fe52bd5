"""The product's viewer page in headless Chromium, fed by the synthetic publisher through the relay.

Run inside a network namespace that has only ``lo`` (see test_sync_viewer_chromium.py). The
service and the publisher run on an event loop in a thread; Chromium opens ``/?stream=e2e`` and,
for every presented frame (``requestVideoFrameCallback``), records the RTP timestamp, the capture
time the page mapped it to from the ``sync`` records, and the frame number read off the pixels.
Prints one JSON line: the frames, and the publisher's true capture time of each frame number.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request
from typing import Any

from aiohttp import web

from sfu_sidecar.client.whip import publish
from sfu_sidecar.synthetic import BeepAudioTrack, FlashVideoTrack, Timeline
from tests.conftest import free_port
from tests.e2e.harness import FRAME_NUMBER_JS, LoopThread, serve_app
from tests.support import chromium

WATCH_S = 6.0
CUE_TEXT = "caption on capture time"
CUE_SETTINGS = "line:0 align:start"  # top of the picture, text to the start side

# Records every presented frame, with the frame number read off its pixels.
RECORD_JS = """
() => {
  const video = document.getElementById('video');
  (""" + FRAME_NUMBER_JS.strip() + """)();
  window.probeFrames = [];
  // The text of the cues the browser shows on the <video> (its showing caption track).
  window.shownCaption = () => {
    const track = [...video.textTracks].find((t) => t.mode === 'showing');
    return track ? [...(track.activeCues ?? [])].map((c) => c.text).join('\\n') : '';
  };
  const shownCaption = window.shownCaption;
  // Where the shown cues sit: the VTTCue attributes their settings set.
  const shownPlacement = () => {
    const track = [...video.textTracks].find((t) => t.mode === 'showing');
    return [...(track?.activeCues ?? [])].map(
      (c) => ({ line: c.line, snapToLines: c.snapToLines, align: c.align }));
  };
  window.probeSources = [];
  window.sfuViewer.frameListeners.push((record, meta) => {
    const n = window.readFrameNumber(video);
    if (n === null) return;
    const track = [...window.sfuViewer.sync.current.entries()].find(([, a]) => !a.audio);
    window.probeFrames.push({
      n, rtp: meta.rtpTimestamp,
      capture: record.captureNs === null ? null : String(record.captureNs),
      estimated: track ? Boolean(track[1].estimated) : null,
      caption: shownCaption(),
      placement: shownPlacement(),
    });
    // abs-capture-time as Chromium reports it for the last played frame.
    const receiver = window.sfuViewer.session?.pc.getReceivers()
      .find((r) => r.track.kind === 'video');
    const src = receiver?.getSynchronizationSources()[0];
    if (src && src.captureTimestamp !== undefined) {
      window.probeSources.push({rtp: src.rtpTimestamp, captureTimestamp: src.captureTimestamp,
        mapped: track ? String(window.sfuViewer.sync.captureOf(track[0], src.rtpTimestamp))
                      : null});
    }
  });
}
"""


class Service(LoopThread):
    """The app and the synthetic publisher on their own event loop."""

    def __init__(self, cascade: bool = False) -> None:
        super().__init__()
        self.port = free_port()  # where the page is served and views
        # With ``cascade`` the publisher and the captions go to an origin, and the page views
        # on an edge (origin_url) that pulls the stream from it.
        self.origin_port = free_port() if cascade else self.port
        self.video: FlashVideoTrack | None = None
        self.joined: Any = None
        self.runners: list[web.AppRunner] = []

    async def _app(self, port: int, **extra: str) -> None:
        self.runners.append(await serve_app(port, **extra))

    async def _start(self) -> None:
        await self._app(self.origin_port)
        if self.origin_port != self.port:
            await self._app(self.port, origin_url=f"http://127.0.0.1:{self.origin_port}")
        timeline = Timeline.starting_now(time.time_ns)
        self.video = FlashVideoTrack(timeline)
        self.session = await publish(
            f"http://127.0.0.1:{self.origin_port}/whip/e2e",
            [BeepAudioTrack(timeline), self.video],
            capture_start_ns=timeline.start_house_ns, ice_addresses=("127.0.0.1",),
        )
        self.joined = await self.session.joined()

    async def post_cue(self, start_ns: int, end_ns: int, text: str) -> int:
        import aiohttp

        body = {"timebase": "house_ns", "lang": "en",
                "cues": [{"id": "probe", "start": start_ns, "end": end_ns, "text": text,
                          "settings": CUE_SETTINGS}]}
        async with aiohttp.ClientSession() as http, http.post(
            f"http://127.0.0.1:{self.origin_port}/api/streams/e2e/captions", json=body
        ) as resp:
            return resp.status

    async def _stop(self) -> None:
        await self.session.close()
        for runner in reversed(self.runners):
            await runner.cleanup()



def main() -> None:
    service = Service(cascade="--cascade" in sys.argv)
    service.thread.start()
    if not service.ready.wait(20):
        raise SystemExit("service did not start")

    result: dict[str, Any] = {"joined": service.joined is not None}
    with chromium.browser() as browser:
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{service.port}/?stream=e2e")
        page.wait_for_function("() => window.sfuViewer !== undefined", timeout=10000)
        page.evaluate(RECORD_JS)
        # A cue for the frames captured 1.5 s to 3 s from now: the page must show it
        # exactly while those frames are on screen.
        now = time.time_ns()
        cue = (now + 1_500_000_000, now + 3_000_000_000)
        status = asyncio.run_coroutine_threadsafe(
            service.post_cue(*cue, CUE_TEXT), service.loop).result(timeout=10)
        result["cue"] = {"status": status, "start": cue[0], "end": cue[1]}
        time.sleep(WATCH_S)
        result["frames"] = page.evaluate("() => window.probeFrames")
        result["stats"] = page.evaluate("() => window.sfuViewer.stats")
        result["sources"] = page.evaluate("() => window.probeSources")
        page.evaluate("() => window.sfuViewer.sendTelemetry()")
        time.sleep(0.5)
        with urllib.request.urlopen(f"http://127.0.0.1:{service.port}/api/sync") as resp:
            result["sync_status"] = json.loads(resp.read())
        result["caption"] = page.evaluate("() => window.shownCaption()")
    assert service.video is not None
    result["capture_log"] = {str(n): ns for n, ns in service.video.capture_log.items()}
    service.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
