"""Chromium's WebRTC stack at the far end of a push and of a pull: peers the relay did not write.

A small HTTP bridge turns a headless Chromium page into a WHIP endpoint and a WHEP server: an
offer POSTed to the bridge goes to the page, which answers it with its own RTCPeerConnection,
and the answer comes back as the ``201``. The pages run on this (the main) thread with
Playwright; the relay, the synthetic publisher and the bridge on a loop thread.

``push``: the relay pushes stream ``e2e`` (the synthetic publisher, every frame's capture time
known, its number in its pixels) to the page's WHIP endpoint. The page records, per presented
frame, the number it reads off the pixels and what ``getSynchronizationSources()`` says of
abs-capture-time for that frame's RTP timestamp; then the push is DELETEd.

``pull``: an edge (``origin_url`` = the bridge's WHEP URL) serves stream ``cam`` that the page
sends from its fake camera; an aiortc viewer on the edge counts decoded frames and records.

Run inside a network namespace with only ``lo`` (see test_cascade_chromium.py). Prints one JSON
line.
"""

from __future__ import annotations

import asyncio
import json
import queue
import sys
import tempfile
import time
from typing import Any

import aiohttp
from aiohttp import web

from sfu_sidecar.app import build_app
from sfu_sidecar.client.whip import publish
from sfu_sidecar.config import load_settings
from sfu_sidecar.synthetic import BeepAudioTrack, FlashVideoTrack, Timeline
from tests.conftest import IN_PROCESS, free_port
from tests.e2e.harness import FRAME_NUMBER_JS, LoopThread
from tests.support import chromium

# The page answers an offer: as a WHIP endpoint it receives (and shows the video), as a WHEP
# server it sends its fake camera.
ANSWER_JS = """
async ([offer, sending]) => {
  const pc = new RTCPeerConnection({bundlePolicy: 'max-bundle'});
  window.pcs = (window.pcs || []).concat([pc]);
  if (sending) {
    const media = await navigator.mediaDevices.getUserMedia(
        {video: {width: 320, height: 240, frameRate: 30}, audio: true});
    await pc.setRemoteDescription({type: 'offer', sdp: offer});
    for (const t of pc.getTransceivers()) {
      const track = media.getTracks().find((m) => m.kind === t.receiver.track.kind);
      if (track) { t.direction = 'sendonly'; await t.sender.replaceTrack(track); }
    }
  } else {
    const video = document.createElement('video');
    video.muted = true; video.autoplay = true; video.playsInline = true;
    document.body.appendChild(video);
    const stream = new MediaStream();
    pc.ontrack = (e) => { stream.addTrack(e.track); video.srcObject = stream; };
    window.probeFrames = [];
    const onFrame = (now, meta) => {
      const n = window.readFrameNumber(video);
      const receiver = pc.getReceivers().find((r) => r.track.kind === 'video');
      const src = receiver?.getSynchronizationSources()[0];
      if (n !== null) {
        window.probeFrames.push({n, rtp: meta.rtpTimestamp,
          srcRtp: src ? src.rtpTimestamp : null,
          captureTimestamp: src && src.captureTimestamp !== undefined
              ? src.captureTimestamp : null});
      }
      video.requestVideoFrameCallback(onFrame);
    };
    video.requestVideoFrameCallback(onFrame);
    pc.ondatachannel = (e) => { window.channelLabel = e.channel.label; };
    await pc.setRemoteDescription({type: 'offer', sdp: offer});
  }
  await pc.setLocalDescription(await pc.createAnswer());
  await new Promise((done) => {
    if (pc.iceGatheringState === 'complete') return done();
    pc.onicegatheringstatechange = () => pc.iceGatheringState === 'complete' && done();
    setTimeout(done, 3000);
  });
  return pc.localDescription.sdp;
}
"""

STATS_JS = """
async () => {
  const out = {};
  for (const pc of window.pcs || []) {
    (await pc.getStats()).forEach((s) => {
      if (s.type === 'inbound-rtp') out['in_' + s.kind] = s.packetsReceived;
      if (s.type === 'outbound-rtp') out['out_' + s.kind] = s.packetsSent;
    });
  }
  out.channel = window.channelLabel || null;
  return out;
}
"""


class Service(LoopThread):
    """The relay (and for ``pull`` an edge), the synthetic publisher and the bridge."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.port = free_port()  # the relay: the origin of a push, the edge of a pull
        self.bridge_port = free_port()
        self.offers: queue.Queue[tuple[str, asyncio.Future[str]]] = queue.Queue()
        self.deletes = 0
        self.video: FlashVideoTrack | None = None
        self.runners: list[web.AppRunner] = []

    async def _site(self, app: web.Application, port: int) -> None:
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        self.runners.append(runner)

    async def _start(self) -> None:
        bridge = web.Application()
        bridge.router.add_post("/{kind:whip|whep}/{stream}", self._offer)
        bridge.router.add_delete("/{kind:whip|whep}/{stream}/1", self._delete)
        await self._site(bridge, self.bridge_port)
        extra = {} if self.mode == "push" else {
            "origin_url": f"http://127.0.0.1:{self.bridge_port}/whep/{{stream}}"}
        settings = load_settings({**IN_PROCESS, "ice_addresses": "127.0.0.1",
                                  "data_dir": tempfile.mkdtemp(prefix="sfu-sidecar-e2e-"),
                                  **extra})
        await self._site(build_app(settings), self.port)
        if self.mode == "push":
            timeline = Timeline.starting_now(time.time_ns)
            self.video = FlashVideoTrack(timeline)
            self.session = await publish(
                f"http://127.0.0.1:{self.port}/whip/e2e", [BeepAudioTrack(timeline), self.video],
                capture_start_ns=timeline.start_house_ns, ice_addresses=("127.0.0.1",),
            )
            await self.session.joined()

    async def _offer(self, request: web.Request) -> web.Response:
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.offers.put((await request.text(), answer))
        sdp = await asyncio.wait_for(answer, 20)
        path = f"/{request.match_info['kind']}/{request.match_info['stream']}/1"
        return web.Response(status=201, text=sdp, content_type="application/sdp",
                            headers={"Location": path})

    async def _delete(self, request: web.Request) -> web.Response:
        self.deletes += 1
        return web.Response(status=200)

    async def _stop(self) -> None:
        if self.mode == "push":
            await self.session.close()
        for runner in reversed(self.runners):
            await runner.cleanup()

    async def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as http, http.request(
            method, f"http://127.0.0.1:{self.port}{path}", json=body
        ) as resp:
            return resp.status, await resp.json()


def answer_offers(service: Service, page: Any, sending: bool, until: float) -> str | None:
    """Answer the first offer that reaches the bridge with the page; the offer's SDP."""
    while time.monotonic() < until:
        try:
            offer, future = service.offers.get(timeout=0.2)
        except queue.Empty:
            continue
        sdp = page.evaluate(ANSWER_JS, [offer, sending])
        service.loop.call_soon_threadsafe(future.set_result, sdp)
        return str(offer)
    return None


def run_push(service: Service, page: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    body = {"stream": "e2e", "url": f"http://127.0.0.1:{service.bridge_port}/whip/e2e"}
    status, push = service.call(service.api("POST", "/api/pushes", body))
    out["create"] = status
    offer = answer_offers(service, page, False, time.monotonic() + 20)
    out["offer_has_abs_capture_time"] = offer is not None and "abs-capture-time" in offer
    time.sleep(6)
    out["frames"] = page.evaluate("() => window.probeFrames")
    out["stats"] = page.evaluate(STATS_JS)
    _, out["push"] = service.call(service.api("GET", f"/api/pushes/{push['id']}"))
    out["delete"], _ = service.call(service.api("DELETE", f"/api/pushes/{push['id']}"))
    time.sleep(0.5)
    out["bridge_deletes"] = service.deletes
    assert service.video is not None
    out["capture_log"] = {str(n): ns for n, ns in service.video.capture_log.items()}
    return out


async def view_on_edge(port: int) -> dict[str, Any]:
    """An aiortc viewer with a sync channel on the edge: decoded frames and record sources."""
    from tests.relay.peers import view
    from tests.syncchannel.test_service import collect

    async with aiohttp.ClientSession() as http:
        viewer = await view(http, f"http://127.0.0.1:{port}", "cam", data_channel="sync")
        records = collect(viewer)
        try:
            sizes = []
            async with asyncio.timeout(20):
                while len(sizes) < 30:
                    frame = await viewer.tracks["video"].recv()
                    sizes.append((frame.width, frame.height))
            await asyncio.sleep(1)
            async with http.get(f"http://127.0.0.1:{port}/api/streams/cam") as resp:
                status = await resp.json()
            async with http.get(f"http://127.0.0.1:{port}/api/sync") as resp:
                sync = await resp.json()
        finally:
            await viewer.close()
    anchors = [{"source": int(a.source), "estimated": a.estimated, "audio": a.audio}
               for a in records.current.values()]
    return {"sizes": sorted(set(sizes)), "frames": len(sizes), "anchors": anchors,
            "records": len(records.frames), "publisher": status["publisher"],
            "sync": sync["publishers"]}


def run_pull(service: Service, page: Any) -> dict[str, Any]:
    viewing = asyncio.run_coroutine_threadsafe(view_on_edge(service.port), service.loop)
    offer = answer_offers(service, page, True, time.monotonic() + 20)
    out: dict[str, Any] = {"offer": offer is not None}
    out.update(viewing.result(timeout=40))
    out["stats"] = page.evaluate(STATS_JS)
    return out


def main() -> int:
    mode = sys.argv[1]
    service = Service(mode)
    service.thread.start()
    if not service.ready.wait(20):
        raise SystemExit("service did not start")

    with chromium.browser() as browser:
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{service.port}/healthz")
        page.evaluate(FRAME_NUMBER_JS)
        result = run_push(service, page) if mode == "push" else run_pull(service, page)
    service.stop()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
