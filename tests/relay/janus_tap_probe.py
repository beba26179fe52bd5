"""A Janus VideoRoom forwarding into an RTP tap, watched by a WHEP viewer.

``python -m tests.relay.janus_tap_probe SECONDS [aiortc|chromium]`` runs, inside a network
namespace of its own (``unshare -n``): Janus with the deployment image's configuration
(deploy/janus/), the service in this process, an aiortc publisher that joins the VideoRoom over
Janus's HTTP API, a tap that Janus ``rtp_forward``s the publisher's audio and video to, and a
viewer for SECONDS: an aiortc WHEP viewer that decodes the video, or the product's viewer page
in Chromium with captions posted on the house clock, recording every presented frame (its
frame number read off the pixels, the capture time the page mapped it to, the caption shown).
It prints one JSON line of figures.

Janus gathers ICE candidates on no loopback interface, so the namespace gets a veth interface
carrying 127.0.0.2 for Janus to use: every packet stays on 127.0.0.0/8, in a namespace that
has nothing else.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer
from aiortc import RTCSessionDescription
from playwright.async_api import TimeoutError as PlaywrightTimeout

from sfu_sidecar.app import SERVICES_KEY, build_app
from sfu_sidecar.config import load_settings
from sfu_sidecar.relay import aiortc_adapter
from sfu_sidecar.synthetic import BeepAudioTrack, FlashVideoTrack, Timeline
from tests.conftest import IN_PROCESS
from tests.e2e.sync_viewer_probe import RECORD_JS
from tests.relay.peers import client_pc, view, wait_for
from tests.support import chromium, janus

ROOT = Path(__file__).resolve().parents[2]
VIDEO_PT, AUDIO_PT = 100, 111
CUE_EVERY_NS = 3_000_000_000  # one cue every 3 s, each 1.5 s long
CUE_NS = 1_500_000_000

# Chromium's receive statistics for the page's connection, per kind.
STATS_JS = """
async () => {
  const out = {};
  const stats = await window.sfuViewer.session.pc.getStats();
  stats.forEach((s) => {
    if (s.type === 'inbound-rtp') {
      out[s.kind] = {received: s.packetsReceived, lost: s.packetsLost,
                     decoded: s.framesDecoded ?? null};
    }
  });
  return out;
}
"""


async def decode_for(track: Any, seconds: float) -> int:
    count = 0
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            async with asyncio.timeout(left):
                await track.recv()
        except TimeoutError:
            break
        count += 1
    return count


async def watch_in_chromium(base: str, seconds: float, result: dict[str, Any]) -> None:
    """The product's viewer page on the tapped stream, captions posted on the house clock for
    frames still to be captured, every presented frame recorded."""
    async with chromium.async_browser() as browser, aiohttp.ClientSession() as http:
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda err: errors.append(f"pageerror: {err}"))
        page.on("console", lambda msg: errors.append(f"console {msg.type}: {msg.text}")
                if msg.type == "error" else None)
        page.on("requestfailed", lambda req: errors.append(
            f"request failed: {req.url} {req.failure}"))
        await page.goto(f"{base}/?stream=janus")
        # The page's modules load before it names itself. Twice in fifteen suite runs it did
        # not within 30 s (the cause not yet known): the page's errors are kept, and it is
        # loaded once more, which the test reports.
        result["page_loads"] = 1
        try:
            await page.wait_for_function("() => window.sfuViewer !== undefined", timeout=20000)
        except PlaywrightTimeout:
            result["page_errors_first_load"] = errors[-20:]
            result["page_loads"] = 2
            await page.reload()
            await page.wait_for_function("() => window.sfuViewer !== undefined",
                                         timeout=20000)
        await page.evaluate(RECORD_JS)
        # Cues for frames captured from 2 s on, every 3 s while the page watches.
        first = time.time_ns() + 2 * 1_000_000_000
        cues = [{"id": f"c{i}", "start": first + i * CUE_EVERY_NS,
                 "end": first + i * CUE_EVERY_NS + CUE_NS, "text": f"cue {i}"}
                for i in range(int((seconds - 3) * 1e9 // CUE_EVERY_NS))]
        async with http.post(f"{base}/api/streams/janus/captions", json={
                "timebase": "house_ns", "lang": "en", "cues": cues}) as resp:
            result["cue_status"] = resp.status
        result["cues"] = cues
        await asyncio.sleep(seconds)
        result["frames"] = await page.evaluate("() => window.probeFrames")
        result["page_stats"] = await page.evaluate("() => window.sfuViewer.stats")
        result["rtp_stats"] = await page.evaluate(STATS_JS)


async def run(seconds: float, workdir: Path, proc: subprocess.Popen[bytes],
              result: dict[str, Any], viewer_kind: str = "aiortc") -> None:
    settings = load_settings({**IN_PROCESS, "ice_addresses": "127.0.0.1", "host": "127.0.0.1",
                              "data_dir": str(workdir / "data")})
    app = build_app(settings)
    relay = app[SERVICES_KEY].components.relay
    assert relay is not None
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    base = f"http://127.0.0.1:{server.port}"
    pc = client_pc()
    try:
        async with aiohttp.ClientSession() as http:
            janus_base = f"http://127.0.0.1:{janus.HTTP_PORT}/janus"
            await janus.wait_http(http, f"{janus_base}/info", proc)
            api = janus.JanusHttp(http, janus_base)
            timeline = Timeline.starting_now(time.time_ns)
            video_track = FlashVideoTrack(timeline)
            pc.addTransceiver(BeepAudioTrack(timeline), direction="sendonly")
            pc.addTransceiver(video_track, direction="sendonly")
            # The publisher's candidate on Janus's address too: libnice pairs none of its
            # candidates with a remote one on another 127.x address.
            aiortc_adapter.install_ice(pc, (janus.ADDRESS,), None)
            handle, publisher_id, sdp = await janus.publish_in_videoroom(api, pc)
            result["janus_candidates"] = sorted(
                set(re.findall(r"a=candidate:\S+ \d+ udp \d+ (\S+)", sdp)))
            await pc.setRemoteDescription(RTCSessionDescription(sdp, "answer"))
            result["publisher_connect_s"] = round(await wait_for(
                lambda: pc.connectionState == "connected", 30, "Janus connected"), 2)

            async with http.post(f"{base}/api/taps", json={"stream": "janus", "media": [
                {"kind": "video", "codec": "vp8", "payload_type": VIDEO_PT},
                {"kind": "audio", "codec": "opus", "payload_type": AUDIO_PT},
            ]}) as resp:
                tap = await resp.json()
                assert resp.status == 201, tap
            video, audio = tap["media"]
            mids = {t.kind: t.mid for t in pc.getTransceivers()}
            forwarded = await api.message(handle, {
                "request": "rtp_forward", "room": janus.ROOM, "publisher_id": publisher_id,
                "host": "127.0.0.1", "host_family": "ipv4", "streams": [
                    {"mid": mids["video"], "port": video["rtp_port"], "pt": VIDEO_PT,
                     "rtcp_port": video["rtcp_port"]},
                    {"mid": mids["audio"], "port": audio["rtp_port"], "pt": AUDIO_PT},
                ]})
            result["rtp_forward"] = forwarded["plugindata"]["data"]

            if viewer_kind == "chromium":
                await watch_in_chromium(base, seconds, result)
                # The publisher's true capture instant of every frame number it drew.
                result["capture_log"] = {str(n): ns for n, ns in video_track.capture_log.items()}
            else:
                viewer = await view(http, base, "janus", kinds=("audio", "video"))
                try:
                    await wait_for(lambda: "video" in viewer.tracks, 20,
                                   "the viewer's video track")
                    result["frames_decoded"] = await decode_for(viewer.tracks["video"], seconds)
                finally:
                    await viewer.close()
            session = relay.find_tap(tap["id"])
            assert session is not None
            result["tap"] = session.status()
            async with http.get(f"{base}/api/sync") as resp:
                sync = await resp.json()
            result["sync"] = next(p for p in sync["publishers"] if p["stream"] == "janus")
            async with http.delete(f"{base}{tap['location']}") as resp:
                result["delete_status"] = resp.status
    finally:
        await pc.close()
        await server.close()


def main() -> int:
    seconds = float(sys.argv[1])
    viewer_kind = sys.argv[2] if len(sys.argv) > 2 else "aiortc"
    janus.setup_namespace()
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="janus-tap-") as tmp:
        workdir = Path(tmp)
        janus.write_config(workdir, janus.HTTP_PORT)
        with janus.running(workdir) as proc:
            asyncio.run(run(seconds, workdir, proc, result, viewer_kind))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
