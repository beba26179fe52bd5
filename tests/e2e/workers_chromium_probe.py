"""The product's viewer page in headless Chromium through ``serve --workers 2``, and the worker
serving it killed.

The synthetic publisher publishes through the supervisor's one port (its stream's home worker
takes it); the page's offer lands on the other worker, which pulls the stream over loopback.
Once the page maps frames, the publisher's video stops for a while (the page must stay on its
session), then that worker is SIGKILLed. The supervisor starts it again; the page
must notice the lost connection by itself, connect again and map frames to their true capture
times as before, with a caption posted after the reconnection on exactly its frames. Prints one
JSON line: the frames the page presented (with the wall-clock ms of each), when the worker was
killed, the workers before and after, and the publisher's true capture time of each frame number.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

from aiortc import MediaStreamTrack

from sfu_sidecar.client.whip import publish
from sfu_sidecar.synthetic import BeepAudioTrack, FlashVideoTrack, Timeline
from sfu_sidecar.workers import home_index
from tests.conftest import ServerProcess
from tests.e2e.harness import LoopThread
from tests.e2e.sync_viewer_probe import CUE_SETTINGS, RECORD_JS
from tests.support import chromium

# A stream whose home is worker 1: the supervisor gives the first viewer's offer to worker 0,
# so the page is served by the worker that pulls, and killing it leaves the publisher alone.
STREAM = next(f"wk-{i}" for i in range(100) if home_index(f"wk-{i}", 2) == 1)
CUE_TEXT = "after the reconnection"
FRAMES_AFTER = 60  # mapped frames captured after the kill, before the caption is posted
PAUSE_S = 4.0  # the publisher's video stops this long (longer than the page's stall check)


class GatedVideo(MediaStreamTrack):
    """The publisher's video with a gate: while closed, frames are made (and logged) but not
    sent, as when a publisher's camera stops while its session stays up."""

    kind = "video"

    def __init__(self, inner: FlashVideoTrack) -> None:
        super().__init__()
        self.inner = inner
        self.paused_until_ns = 0

    async def recv(self) -> Any:
        frame = await self.inner.recv()
        while time.time_ns() < self.paused_until_ns:
            frame = await self.inner.recv()
        return frame


class Publisher(LoopThread):
    """The synthetic publisher (audio and numbered video, capture-stamped) on its own loop."""

    def __init__(self, base: str) -> None:
        super().__init__()
        self.base = base
        self.video: FlashVideoTrack | None = None
        self.gate: GatedVideo | None = None
        self.joined: Any = None

    async def _start(self) -> None:
        timeline = Timeline.starting_now(time.time_ns)
        self.video = FlashVideoTrack(timeline)
        self.gate = GatedVideo(self.video)
        self.session = await publish(
            f"{self.base}/whip/{STREAM}", [BeepAudioTrack(timeline), self.gate],
            capture_start_ns=timeline.start_house_ns, ice_addresses=("127.0.0.1",),
        )
        self.joined = await self.session.joined()

    async def post_cue(self, start_ns: int, end_ns: int) -> int:
        import aiohttp

        body = {"timebase": "house_ns", "lang": "en",
                "cues": [{"id": "after", "start": start_ns, "end": end_ns, "text": CUE_TEXT,
                          "settings": CUE_SETTINGS}]}
        async with aiohttp.ClientSession() as http, http.post(
            f"{self.base}/api/streams/{STREAM}/captions", json=body
        ) as resp:
            return resp.status

    async def _stop(self) -> None:
        await self.session.close()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def page_worker(base: str, resource: str) -> int | None:
    """The worker whose status lists the page's WHEP session (the last part of its URL)."""
    session_id = resource.rstrip("/").rsplit("/", 1)[-1]
    for index in range(2):
        doc = get_json(f"{base}/workers/{index}/api/streams/{STREAM}")
        if any(v.get("id") == session_id for v in doc.get("viewers") or []):
            return index
    return None


def main() -> None:
    data_dir = tempfile.mkdtemp(prefix="sfu-sidecar-workers-")
    server = ServerProcess(["--workers", "2", "--data-dir", data_dir,
                            "--ice-addresses", "127.0.0.1", "--max-cpu-percent", "1000",
                            "--log-level", "warning"])
    log: list[str] = []

    def drain() -> None:
        assert server.proc.stdout is not None
        for line in server.proc.stdout:
            log.append(line.decode(errors="replace"))

    threading.Thread(target=drain, daemon=True).start()
    result: dict[str, Any] = {"stream": STREAM, "home": home_index(STREAM, 2)}
    publisher: Publisher | None = None
    try:
        server.wait_ready(30)
        publisher = Publisher(server.base)
        publisher.thread.start()
        if not publisher.ready.wait(20):
            raise SystemExit("the publisher did not start")
        result["joined"] = publisher.joined is not None

        mapped_js = "(after) => window.probeFrames.filter((f) => f.capture !== null " \
                    "&& BigInt(f.capture) > BigInt(after)).length"
        with chromium.browser() as browser:
            page = browser.new_page()
            page.goto(f"{server.base}/?stream={STREAM}")
            page.wait_for_function("() => window.sfuViewer !== undefined", timeout=10000)
            # Recorder and wall-clock stamp start in one evaluate: a frame presented between
            # two calls would be recorded without its wall time.
            page.evaluate("() => { (" + RECORD_JS.strip() + ")();"
                          " window.sfuViewer.frameListeners.push(() => {"
                          " const f = window.probeFrames.at(-1);"
                          " if (f && f.wall_ms === undefined) f.wall_ms = Date.now(); }); }")
            page.wait_for_function(f"() => ({mapped_js})('0') >= 30", timeout=20000)
            resource = page.evaluate("() => window.sfuViewer.session.resourceUrl")
            result["page_worker"] = page_worker(server.base, resource)
            result["page_resource"] = resource
            # The publisher's video stops for PAUSE_S (audio and session go on): the page
            # asks whether its session is still there and, told it is, stays on it.
            assert publisher.gate is not None
            paused_ns = time.time_ns()
            publisher.gate.paused_until_ns = paused_ns + int(PAUSE_S * 1e9)
            page.wait_for_function(f"() => ({mapped_js})('{paused_ns}') >= 20",
                                   timeout=20000, polling=200)
            result["pause"] = {"start_ns": paused_ns, "seconds": PAUSE_S,
                               "stats": page.evaluate("() => ({...window.sfuViewer.stats})"),
                               "resource": page.evaluate(
                                   "() => window.sfuViewer.session.resourceUrl")}
            result["workers_before"] = get_json(f"{server.base}/api/workers")["workers"]
            killed = result["workers_before"][result["page_worker"] or 0]
            result["kill_ns"] = kill_ns = time.time_ns()
            os.kill(killed["pid"], signal.SIGKILL)
            page.wait_for_function(f"() => ({mapped_js})('{kill_ns}') >= {FRAMES_AFTER}",
                                   timeout=45000, polling=200)
            # A caption for frames captured from 1 s to 2.5 s from now, all after the
            # reconnection: shown on exactly those frames, where its settings put it.
            now = time.time_ns()
            cue = (now + 1_000_000_000, now + 2_500_000_000)
            status = publisher.call(publisher.post_cue(*cue))
            result["cue"] = {"status": status, "start": cue[0], "end": cue[1]}
            time.sleep(3.5)
            result["frames"] = page.evaluate("() => window.probeFrames")
            result["stats"] = page.evaluate("() => window.sfuViewer.stats")
            result["status_text"] = page.text_content("#status")
            result["workers_after"] = get_json(f"{server.base}/api/workers")["workers"]
        assert publisher.video is not None
        result["capture_log"] = {str(n): ns for n, ns in publisher.video.capture_log.items()}
    finally:
        if publisher is not None and publisher.ready.is_set():
            publisher.stop()
        server.stop()
        result["log_tail"] = "".join(log[-40:])
        sys.stderr.write(result["log_tail"])
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
