"""Headless Chromium publishes over WHIP, a second Chromium page views over WHEP, via the relay.

Run inside a network namespace that has only ``lo`` (see test_relay_chromium.py), so every ICE
candidate either side can use is loopback. Prints one JSON line with what the viewer page saw.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from typing import Any

from aiohttp import web

from sfu_sidecar.app import Components, build_app
from sfu_sidecar.config import load_settings
from sfu_sidecar.metrics import Metrics
from sfu_sidecar.relay import RelayService
from tests.conftest import IN_PROCESS, free_port
from tests.support import chromium

PUBLISH_JS = """
async (base) => {
  const media = await navigator.mediaDevices.getUserMedia(
      {video: {width: 320, height: 240, frameRate: 15}, audio: true});
  const pc = new RTCPeerConnection({bundlePolicy: 'max-bundle'});
  for (const track of media.getTracks()) pc.addTransceiver(track, {direction: 'sendonly'});
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((done) => {
    if (pc.iceGatheringState === 'complete') return done();
    pc.onicegatheringstatechange = () => pc.iceGatheringState === 'complete' && done();
    setTimeout(done, 3000);
  });
  const resp = await fetch(base + '/whip/e2e', {method: 'POST',
      headers: {'Content-Type': 'application/sdp'}, body: pc.localDescription.sdp});
  const answer = await resp.text();
  if (resp.status !== 201) return {status: resp.status, body: answer};
  await pc.setRemoteDescription({type: 'answer', sdp: answer});
  window.publisher = pc;
  return {status: resp.status};
}
"""

VIEW_JS = """
async (base) => {
  const pc = new RTCPeerConnection({bundlePolicy: 'max-bundle'});
  pc.addTransceiver('video', {direction: 'recvonly'});
  pc.addTransceiver('audio', {direction: 'recvonly'});
  const video = document.createElement('video');
  video.muted = true; video.autoplay = true; video.playsInline = true;
  document.body.appendChild(video);
  const stream = new MediaStream();
  pc.ontrack = (e) => { stream.addTrack(e.track); video.srcObject = stream; };
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((done) => {
    if (pc.iceGatheringState === 'complete') return done();
    pc.onicegatheringstatechange = () => pc.iceGatheringState === 'complete' && done();
    setTimeout(done, 3000);
  });
  const resp = await fetch(base + '/whep/e2e', {method: 'POST',
      headers: {'Content-Type': 'application/sdp'}, body: pc.localDescription.sdp});
  const answer = await resp.text();
  if (resp.status !== 201) return {status: resp.status, body: answer};
  await pc.setRemoteDescription({type: 'answer', sdp: answer});
  const seen = {status: resp.status, frames: 0, width: 0, height: 0, rtpTimestamps: []};
  await new Promise((done) => {
    const onFrame = (now, meta) => {
      seen.frames += 1; seen.width = meta.width; seen.height = meta.height;
      if (meta.rtpTimestamp !== undefined) seen.rtpTimestamps.push(meta.rtpTimestamp);
      if (seen.frames >= 30) return done();
      video.requestVideoFrameCallback(onFrame);
    };
    video.requestVideoFrameCallback(onFrame);
    setTimeout(done, 15000);
  });
  const stats = await pc.getStats();
  stats.forEach((s) => {
    if (s.type === 'inbound-rtp' && s.kind === 'audio') seen.audioPackets = s.packetsReceived;
    if (s.type === 'inbound-rtp' && s.kind === 'video') {
      seen.framesDecoded = s.framesDecoded; seen.codec = s.codecId;
    }
  });
  return seen;
}
"""


def _serve(port: int, ready: threading.Event, stop: list[Any], out: dict[str, Any]) -> None:
    async def main() -> None:
        settings = load_settings({**IN_PROCESS, "ice_addresses": "127.0.0.1"})
        metrics = Metrics()
        service = RelayService(settings, metrics)
        app = build_app(settings, Components(metrics, relay=service))
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        done = asyncio.Event()
        stop.append((asyncio.get_running_loop(), done))
        ready.set()
        await done.wait()
        stream = service.streams.by_name.get("e2e")
        out["status"] = stream.status() if stream is not None else None
        await runner.cleanup()

    asyncio.run(main())


def main() -> int:

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    ready = threading.Event()
    stop: list[Any] = []
    server_out: dict[str, Any] = {}
    thread = threading.Thread(target=_serve, args=(port, ready, stop, server_out), daemon=True)
    thread.start()
    if not ready.wait(15):
        print(json.dumps({"error": "relay did not start"}))
        return 1
    result: dict[str, Any] = {}
    with chromium.browser() as browser:
        publisher = browser.new_page()
        publisher.goto(base + "/healthz")  # same origin as the WHIP endpoint
        result["publish"] = publisher.evaluate(PUBLISH_JS, base)
        viewer = browser.new_page()
        viewer.goto(base + "/healthz")
        result["view"] = viewer.evaluate(VIEW_JS, base)
    loop, done = stop[0]
    loop.call_soon_threadsafe(done.set)
    thread.join(10)
    result["relay"] = server_out.get("status")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
