"""web/js/attach.js in headless Chromium on a connection the page made itself.

Run inside a network namespace that has only ``lo`` (see test_attach_chromium.py). The service
and the synthetic publisher (frames numbered in their pixels, stamped with abs-capture-time,
joined to the house clock) run on an event loop in a thread. A test page makes a plain
``RTCPeerConnection`` to the sidecar's WHEP endpoint, standing in for a foreign SFU's player
(no ``sync`` DataChannel), negotiating abs-capture-time or not (``--no-abs``), then calls
``attach({video, receiver, ...})``. Cues with capture-time intervals are ingested before and
while the page watches. For every presented frame the page records the frame number read off
the pixels and the ids of the TextTrack's active cues. Prints one JSON line: the frames, the
cues, the library's stats, and the publisher's true capture time of each frame number.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import aiohttp

from tests.e2e.harness import FRAME_NUMBER_JS
from tests.e2e.sync_viewer_probe import Service
from tests.support import chromium

CUE_S = 0.4
GAP_S = 0.25
CUES = 20  # enough for a 95th percentile that is not simply the worst cue
CUES_BEFORE = CUES // 2  # ingested before attach(): loaded from the feed; the rest while the
# page watches: followed live
FRAME_S = 1 / 30  # the synthetic publisher's frame interval
LEAD_S = 5.0  # first cue starts this far after now: the page connects meanwhile, even when slow

PAGE_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><link rel="icon" href="data:,"></head>
<body><video id="video" muted autoplay playsinline width="640" height="360"></video>
<script type="module">
import { attach } from "/js/attach.js";
const ABS = "http://www.webrtc.org/experiments/rtp-hdrext/abs-capture-time";

// The player a foreign SFU's SDK would make: one recvonly video and audio, no DataChannel.
window.startProbe = async (withAbs) => {
  const video = document.getElementById("video");
  const pc = new RTCPeerConnection({bundlePolicy: "max-bundle"});
  for (const kind of ["video", "audio"]) {
    const t = pc.addTransceiver(kind, {direction: "recvonly"});
    if (withAbs) {
      // Chromium offers abs-capture-time only when asked (it is "stopped" by default).
      t.setHeaderExtensionsToNegotiate(t.getHeaderExtensionsToNegotiate().map(
          (e) => (e.uri === ABS ? {uri: e.uri, direction: "recvonly"} : e)));
    }
  }
  const media = new MediaStream();
  video.srcObject = media;
  pc.ontrack = (e) => media.addTrack(e.track);
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((done) => {
    if (pc.iceGatheringState === "complete") return done();
    pc.onicegatheringstatechange = () => pc.iceGatheringState === "complete" && done();
    setTimeout(done, 3000);
  });
  const resp = await fetch("/whep/e2e", {method: "POST",
      headers: {"Content-Type": "application/sdp"}, body: pc.localDescription.sdp});
  const answer = await resp.text();
  if (resp.status !== 201) return {status: resp.status, body: answer};
  await pc.setRemoteDescription({type: "answer", sdp: answer});
  const receiver = pc.getReceivers().find((r) => r.track.kind === "video");
  const handle = attach({video, receiver, sidecarUrl: location.origin, stream: "e2e", lang: "en"});
  window.probe = {pc, handle, frames: []};

  // Per presented frame: its number from the pixels and the cues showing on it. Registered
  // after attach(), so the library has placed cues for this frame when this runs.
  (""" + FRAME_NUMBER_JS.strip() + """)();
  const onFrame = (now, meta) => {
    video.requestVideoFrameCallback(onFrame);
    const n = window.readFrameNumber(video);
    if (n === null) return;
    window.probe.frames.push({
      n, mediaTime: meta.mediaTime, currentTime: video.currentTime,
      active: [...(handle.track.activeCues ?? [])].map((c) => c.id),
      source: handle.stats.source, rtp: meta.rtpTimestamp,
    });
  };
  video.requestVideoFrameCallback(onFrame);
  return {status: resp.status,
          negotiated: receiver.getParameters().headerExtensions.map((e) => e.uri)};
};
</script></body></html>
"""

STATS_JS = """() => JSON.parse(JSON.stringify(window.probe.handle.stats,
    (k, v) => (typeof v === "bigint" ? String(v) : v)))"""


async def post_cues(port: int, cues: list[dict[str, Any]]) -> int:
    body = {"timebase": "house_ns", "lang": "en", "cues": cues}
    async with aiohttp.ClientSession() as http, http.post(
        f"http://127.0.0.1:{port}/api/streams/e2e/captions", json=body
    ) as resp:
        return resp.status


def make_cues(first_ns: int, start: int, count: int, prefix: str) -> list[dict[str, Any]]:
    """Cues ``start`` to ``start + count - 1`` of the probe. Each starts a further 1/CUES of a
    frame interval later against the frame grid, so the starts fall at every phase of it."""
    step = CUE_S + GAP_S
    cues = []
    for i in range(start, start + count):
        begin = first_ns + round((i * step + i * FRAME_S / CUES) * 1e9)
        cues.append({"id": f"{prefix}{i}", "start": begin, "end": begin + round(CUE_S * 1e9),
                     "text": f"cue {prefix}{i}"})
    return cues


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-abs", action="store_true",
                        help="the page does not negotiate abs-capture-time")
    args = parser.parse_args()
    service = Service()
    service.thread.start()
    if not service.ready.wait(20):
        raise SystemExit("service did not start")

    base = f"http://127.0.0.1:{service.port}"
    run = lambda coro: asyncio.run_coroutine_threadsafe(coro, service.loop).result(timeout=10)  # noqa: E731
    result: dict[str, Any] = {"joined": service.joined is not None}
    with chromium.browser() as browser:
        page = browser.new_page()
        # The page's own errors go to stderr, where the test shows them on failure.
        page.on("console", lambda m: print("page:", m.type, m.text, file=sys.stderr))
        page.on("pageerror", lambda e: print("page error:", e, file=sys.stderr))
        # The test page lives on the sidecar's origin, loaded from it (/healthz) and then
        # rewritten: Chromium's local network access checks refuse the clock WebSocket to a
        # document that did not come from the loopback address itself.
        page.goto(base + "/healthz")
        page.set_content(PAGE_HTML)
        page.wait_for_function("() => window.startProbe !== undefined", timeout=20000)
        # Cue times are taken now, once the browser is ours (another user of the lock may
        # have kept us waiting).
        first = time.time_ns() + round(LEAD_S * 1e9)
        before = make_cues(first, 0, CUES_BEFORE, "a")
        after = make_cues(first, CUES_BEFORE, CUES - CUES_BEFORE, "b")
        result["ingest"] = [run(post_cues(service.port, before))]
        result["start"] = page.evaluate("(abs) => window.startProbe(abs)", not args.no_abs)
        page.wait_for_function("() => window.probe.frames.length >= 5", timeout=30000)
        # These cues reach the page only through its live follow of the feed (polled since
        # attach(), which came before the frames).
        result["ingest"].append(run(post_cues(service.port, after)))
        end_s = (after[-1]["end"] - time.time_ns()) / 1e9 + 1.0
        time.sleep(max(end_s, 0.0))
        result["frames"] = page.evaluate("() => window.probe.frames")
        result["stats"] = page.evaluate(STATS_JS)
        result["track_mode"] = page.evaluate("() => window.probe.handle.track.mode")
        page.evaluate("() => window.probe.handle.detach()")
        # A disabled track lists no cues at all: read its mode, then count what detach() left.
        result["after_detach"] = page.evaluate(
            "() => { const t = window.probe.handle.track; const mode = t.mode;"
            " t.mode = 'hidden'; return {mode, cues: t.cues.length}; }")
    assert service.video is not None
    result["cues"] = before + after
    result["capture_log"] = {str(n): ns for n, ns in service.video.capture_log.items()}
    service.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
