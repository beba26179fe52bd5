"""The operator dashboard in headless Chromium, watching a live demo stream with injected jitter.

Run inside a network namespace that has only ``lo`` (see test_dashboard_chromium.py). The
service, a synthetic publisher joined to the house clock and the demo's caption script run on an
event loop in a thread; Chromium opens the viewer page (so viewers report playout) and
``/dashboard``. The publisher's video then stalls and bursts, as a renderer under GPU memory
pressure does, until the frame jitter alert is raised, and runs smoothly again until it clears.
Prints one JSON line: what the dashboard showed, when, and where its screenshots are.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request
from fractions import Fraction
from pathlib import Path
from typing import Any

import aiohttp
from av import VideoFrame

from sfu_sidecar.client.whip import WhipSession, publish
from sfu_sidecar.demo import LANG, STREAM, caption_for_second
from sfu_sidecar.synthetic import BeepAudioTrack, FlashVideoTrack, Timeline
from tests.conftest import free_port
from tests.e2e.harness import LoopThread, serve_app
from tests.support import chromium

# While stalling, frames are held and let go a second's worth at a time: the frame-interval
# RMS then sits far above the 112 ms alert line.
STALL_FRAMES = 30
WARM_UP_S = 60.0
ALERT_WAIT_S = 40.0
CLEAR_WAIT_S = 40.0

# What the dashboard holds, read from its own objects and DOM.
STATE_JS = """
(stream) => {
  const d = window.sfuDashboard;
  const count = (key) => {
    const u = d.plots.get(key);
    if (!u) return {};
    const out = {};
    u.series.slice(1).forEach((s, i) => {
      out[s.label] = u.data[i + 1].filter((v) => v !== null && v !== undefined).length;
    });
    return out;
  };
  const entry = d.model.streams.get(stream);
  return {
    messages: d.messages,
    ticks: d.model.ticks,
    link: document.getElementById('link').textContent,
    alerts: [...document.querySelectorAll('#alerts li')].map((li) => li.dataset.alert),
    events: [...document.querySelectorAll('#events li')].map(
      (li) => [li.dataset.alert, li.dataset.state]),
    points: entry ? entry.table.length : 0,
    plots: Object.fromEntries(['jitter', 'skew', 'drift', 'bursts'].map(
      (p) => [p, count(`${stream}/${p}`)])),
    clock: count('clock'),
    canvases: document.querySelectorAll('canvas').length,
    captionBars: [...document.querySelectorAll(
      `section[data-stream="${stream}"] .bar .count`)].map((x) => Number(x.textContent)),
    figures: document.querySelector(`section[data-stream="${stream}"] [data-field="figures"]`)
      ?.textContent ?? null,
  };
}
"""


class StallingVideoTrack(FlashVideoTrack):
    """The flash source, except that while ``stall_frames`` is set it holds each group of
    that many frames back and releases them together when the group's last one is due."""

    stall_frames = 0

    async def recv(self) -> VideoFrame:
        frame = await super().recv()
        n = self.frame_index - 1
        k = self.stall_frames
        if k:
            await self.timeline.sleep_until(Fraction((n // k + 1) * k - 1, self.fps))
        return frame


class Service(LoopThread):
    """The app, the publisher and the caption script on their own event loop."""

    stop_timeout_s = 15.0

    def __init__(self) -> None:
        super().__init__()
        self.port = free_port()
        self.video: StallingVideoTrack | None = None
        self.session: WhipSession | None = None
        self.captions: asyncio.Task[None] | None = None

    async def _start(self) -> None:
        self.runner = await serve_app(self.port)
        timeline = Timeline.starting_now(time.time_ns)
        self.video = StallingVideoTrack(timeline)
        self.session = await publish(
            f"http://127.0.0.1:{self.port}/whip/{STREAM}", [BeepAudioTrack(timeline), self.video],
            capture_start_ns=timeline.start_house_ns, ice_addresses=("127.0.0.1",),
        )
        await self.session.joined()
        self.captions = asyncio.create_task(self._caption_script(timeline))

    async def _caption_script(self, timeline: Timeline) -> None:
        # The demo's captions: one per second, posted two seconds ahead of its flash.
        async with aiohttp.ClientSession() as http:
            second = 0
            while True:
                await timeline.sleep_until(Fraction(max(second - 2, 0)))
                body = {"timebase": "house_ns", "lang": LANG,
                        "cues": [caption_for_second(timeline, second)]}
                async with http.post(f"http://127.0.0.1:{self.port}/api/streams/{STREAM}"
                                     "/captions", json=body) as resp:
                    await resp.read()
                second += 1

    def stall(self, frames: int) -> None:
        def apply() -> None:
            assert self.video is not None
            self.video.stall_frames = frames
        self.loop.call_soon_threadsafe(apply)

    async def _stop(self) -> None:
        if self.captions is not None:
            self.captions.cancel()
        if self.session is not None:
            await self.session.close()
        await self.runner.cleanup()



def wait(page: Any, what: str, predicate: str, arg: Any, limit_s: float) -> float:
    """Seconds until ``predicate(state)`` holds in the page, polled every 250 ms."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        if page.evaluate(f"(stream) => {{ const s = ({STATE_JS})(stream); return {predicate}; }}",
                         arg):
            return time.monotonic() - started
        time.sleep(0.25)
    state = page.evaluate(STATE_JS, arg)
    raise SystemExit(f"timed out after {limit_s} s waiting for {what}: {json.dumps(state)}")


def main() -> None:
    out_dir = Path(sys.argv[1])
    service = Service()
    service.thread.start()
    if not service.ready.wait(30):
        raise SystemExit("service did not start")
    base = f"http://127.0.0.1:{service.port}"

    result: dict[str, Any] = {}
    with chromium.browser() as browser:
        viewer = browser.new_page()
        viewer.goto(f"{base}/?stream={STREAM}")
        dashboard = browser.new_page(viewport={"width": 1440, "height": 900})
        dashboard.goto(f"{base}/dashboard")
        # Live plots: the publisher's figures, and the viewer's playout reports.
        result["warm_up_s"] = wait(
            dashboard, "plots with data",
            "s.points >= 8 && s.plots.jitter['frame interval (RMS)'] >= 5"
            " && s.plots.skew['viewers (median)'] >= 2 && s.plots.drift.video >= 3"
            " && s.captionBars.reduce((a, b) => a + b, 0) >= 1",
            STREAM, WARM_UP_S)
        result["before"] = dashboard.evaluate(STATE_JS, STREAM)
        service.stall(STALL_FRAMES)
        result["raised_after_s"] = wait(
            dashboard, "the frame jitter alert",
            "s.alerts.includes('frame_jitter')", STREAM, ALERT_WAIT_S)
        time.sleep(2.5)  # let the plots show the episode
        shot = out_dir / "dashboard-alert.png"
        dashboard.screenshot(path=str(shot), full_page=True)
        result["screenshot_alert"] = str(shot)
        result["during"] = dashboard.evaluate(STATE_JS, STREAM)
        service.stall(0)
        result["cleared_after_s"] = wait(
            dashboard, "the frame jitter alert to clear",
            "!s.alerts.includes('frame_jitter') && s.events.some("
            "([a, st]) => a === 'frame_jitter' && st === 'cleared')",
            STREAM, CLEAR_WAIT_S)
        shot = out_dir / "dashboard-cleared.png"
        dashboard.screenshot(path=str(shot), full_page=True)
        result["screenshot_cleared"] = str(shot)
        result["after"] = dashboard.evaluate(STATE_JS, STREAM)
        with urllib.request.urlopen(f"{base}/api/alerts") as resp:
            result["api_alerts"] = json.loads(resp.read())
    service.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
