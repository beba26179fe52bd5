"""The product's publisher page (/publish) in headless Chromium, checked from the server side.

Run inside a network namespace that has only ``lo`` (see test_publish_chromium.py). The whole
service (clock, captions, relay, sync) runs with a publish token on an event loop in a thread.
Chromium opens ``/publish`` with its fake camera and microphone and:

1. starts with a wrong token: the page must show the service's 401 reason, nothing published;
2. for each codec (VP8, VP9, then H.264, each on its own stream): starts with the right token,
   a WHEP viewer decodes what the relay forwards (aiortc; for VP9, which aiortc lacks, the
   viewer records the packets and libvpx and libopus decode them), the stream's first live
   segment is decoded with PyAV, a caption typed into the page's box is sent (the test reads
   house time just before and after the click), then Stop.

Prints one JSON line: what the page showed, and what the service saw at each step.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from sfu_sidecar.app import build_app, build_components
from sfu_sidecar.config import load_settings
from sfu_sidecar.metrics import Metrics
from sfu_sidecar.segments.vp9 import Vp9Depacketizer
from tests.conftest import IN_PROCESS, free_port
from tests.e2e.harness import LoopThread
from tests.relay.peers import frames, view, wait_for
from tests.support import chromium

TOKEN = "page-probe-token"
CODECS = ("vp8", "vp9", "h264")
VIEW_FRAMES = 30  # a second of the fake camera's 30 fps
AUDIO_FRAMES = 25  # half a second of 20 ms Opus frames
PAGE_TIMEOUT_MS = 20_000

T = TypeVar("T")


class Service(LoopThread):
    """The full service on its own event loop; the test reads house time off its clock."""

    def __init__(self, data_dir: str) -> None:
        super().__init__()
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        settings = load_settings({**IN_PROCESS, "ice_addresses": "127.0.0.1",
                                  "data_dir": data_dir, "publish_token": TOKEN})
        self.settings = settings
        self.components = build_components(settings, Metrics())
        assert self.components.clock is not None and self.components.relay is not None
        self.clock = self.components.clock
        self.relay = self.components.relay

    async def _start(self) -> None:
        self.runner = web.AppRunner(build_app(self.settings, self.components))
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    def house_ns(self) -> int:
        # Read from the browser-driving thread: a clock read plus a never-decreasing guard,
        # with the service's loop thread the only other reader.
        return self.clock.now_ns()

    def get(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(self.base + path, timeout=5) as resp:
                body = resp.read()
                ctype = resp.headers.get("Content-Type", "")
                return resp.status, json.loads(body) if "json" in ctype else body.decode()
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def ended(self) -> dict[str, int]:
        return {f"{role}:{reason}": n for (role, reason), n in self.relay.streams.ended.items()}

    async def _stop(self) -> None:
        await self.runner.cleanup()


def poll(check: Callable[[], T | None], limit_s: float, what: str) -> T:
    deadline = time.monotonic() + limit_s
    while True:
        value = check()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {limit_s} s waiting for {what}")
        time.sleep(0.1)


def publisher_sync(service: Service, stream: str, limit_s: float) -> dict[str, Any]:
    """The stream's capture-time sources in /api/sync, once both kinds have one (or as they
    stand after ``limit_s``: the test then says what is missing)."""
    deadline = time.monotonic() + limit_s
    while True:
        publishers = service.get("/api/sync")[1]["publishers"]
        tracks: dict[str, Any] = next(
            (p["tracks"] for p in publishers if p["stream"] == stream), {})
        done = all(tracks.get(k, {}).get("source") == "abs_capture_time"
                   for k in ("audio", "video"))
        if done or time.monotonic() > deadline:
            return dict(tracks)
        time.sleep(0.1)


async def watch(base: str, stream: str, codec: str) -> tuple[dict[str, Any], Any]:
    """A WHEP viewer: decodes frames of each kind; returns what it saw and the peer."""
    async with aiohttp.ClientSession() as http:
        peer = await view(http, base, stream, decode=codec != "vp9")
    if codec == "vp9":
        video, audio = await decode_recorded(peer)
    else:
        video = await frames(peer.tracks["video"], VIEW_FRAMES, 15)
        audio = await frames(peer.tracks["audio"], AUDIO_FRAMES, 15)
    out: dict[str, Any] = {
        "video_frames": len(video), "width": video[-1].width, "height": video[-1].height,
        "audio_frames": len(audio), "audio_rate": audio[-1].sample_rate,
    }
    for kind in ("video", "audio"):
        pt, codec = answered_codec(peer.answer, kind)
        out[f"{kind}_codec"] = codec
        out[f"{kind}_packets"] = sum(1 for p in peer.received if p.payload_type == pt)
    return out, peer


async def decode_recorded(peer: Any) -> tuple[list[Any], list[Any]]:
    """VP9 and Opus frames decoded by libvpx and libopus (PyAV) from the packets the viewer
    received: aiortc has no VP9 decoder."""
    import av

    video_pt = answered_codec(peer.answer, "video")[0]
    audio_pt = answered_codec(peer.answer, "audio")[0]

    def decoded() -> tuple[list[Any], list[Any]]:
        vp9 = av.CodecContext.create("libvpx-vp9", "r")
        opus = av.CodecContext.create("libopus", "r")
        dep = Vp9Depacketizer()
        video, audio = [], []
        for p in list(peer.received):  # in arrival order, as a receiver takes them
            if p.payload_type == video_pt:
                frame = dep.push(p.sequence_number, p.timestamp, p.marker, p.payload)
                if frame is not None:
                    video += vp9.decode(av.Packet(frame.data))
            elif p.payload_type == audio_pt:
                audio += opus.decode(av.Packet(p.payload))
        return video, audio

    got: tuple[list[Any], list[Any]] = ([], [])

    def enough() -> bool:
        nonlocal got
        got = decoded()
        return len(got[0]) >= VIEW_FRAMES and len(got[1]) >= AUDIO_FRAMES

    await wait_for(enough, 15, "VP9 and Opus frames decoded from the packets received")
    return got[0][:VIEW_FRAMES], got[1][:AUDIO_FRAMES]


def first_segment(service: Service, stream: str) -> dict[str, Any]:
    """The stream's init and first closed live segment, decoded by PyAV (FFmpeg's demuxers and
    libvpx / libavcodec's H.264): codec, size and frame count."""
    import io

    import av

    def listed() -> dict[str, Any] | None:
        status, index = service.get(f"/streams/{stream}/media/index.json")
        return dict(index) if status == 200 and index.get("segments") else None

    index = poll(listed, 15, "a closed live segment")
    base = f"{service.base}/streams/{stream}/media/"
    with urllib.request.urlopen(base + index["init"], timeout=5) as resp:
        data = resp.read()
    with urllib.request.urlopen(base + index["segments"][0]["url"], timeout=5) as resp:
        data += resp.read()
    with av.open(io.BytesIO(data)) as container:
        stream_info = container.streams.video[0]
        pictures = list(container.decode(video=0))
    return {"codecs": index["codecs"], "container": index["container"],
            "codec": stream_info.codec_context.name, "frames": len(pictures),
            "size": [pictures[0].width, pictures[0].height] if pictures else None}


def answered_codec(sdp: str, kind: str) -> tuple[int, str]:
    """The payload type and codec name the relay's answer sends ``kind`` with (its first)."""
    section = sdp.split(f"m={kind} ", 1)[1].split("\nm=", 1)[0]
    pt = section.split(None, 3)[2]
    for line in section.splitlines():
        if line.startswith(f"a=rtpmap:{pt} "):
            return int(pt), line.split()[1].split("/")[0].lower()
    raise SystemExit(f"no rtpmap for {kind} payload type {pt} in the answer")


def page_state(page: Any) -> dict[str, Any]:
    state: dict[str, Any] = page.evaluate("() => JSON.parse(JSON.stringify(window.sfuPublisher,"
                                          " (k, v) => typeof v === 'bigint' ? String(v) : v))")
    state["status_text"] = page.text_content("#status")
    state["state_text"] = page.text_content("#state")
    return state


def wrong_token(page: Any, service: Service) -> dict[str, Any]:
    stream = "page-wrong"
    page.goto(f"{service.base}/publish?stream={stream}&token=not-the-token")
    page.click("#start")
    page.wait_for_function("() => ['failed', 'publishing'].includes(window.sfuPublisher.state)",
                           timeout=PAGE_TIMEOUT_MS)
    out: dict[str, Any] = {"page": page_state(page)}
    out["stream_status"] = service.get(f"/api/streams/{stream}")[0]
    out["streams"] = service.get("/api/streams")[1]
    return out


def publish_one(page: Any, service: Service, codec: str) -> dict[str, Any]:
    stream = f"page-{codec}"
    out: dict[str, Any] = {"stream": stream}
    page.goto(f"{service.base}/publish?stream={stream}&token={TOKEN}")
    page.wait_for_function("() => window.sfuPublisher?.clock.state === 'joined'",
                           timeout=PAGE_TIMEOUT_MS)
    page.select_option("#codec", codec)
    started = time.monotonic()
    page.click("#start")
    page.wait_for_function(
        "() => window.sfuPublisher.connection === 'connected' || window.sfuPublisher.error",
        timeout=PAGE_TIMEOUT_MS)
    out["connect_s"] = round(time.monotonic() - started, 2)
    out["page_connected"] = page_state(page)

    # Server side: the stream is live and media of both kinds flows in with the chosen codec.
    def flowing() -> dict[str, Any] | None:
        status, body = service.get(f"/api/streams/{stream}")
        if status != 200 or body["publisher"] is None:
            return None
        tracks = body["tracks"]
        if any(tracks.get(k, {}).get("packets", 0) < 50 for k in ("video", "audio")):
            return None
        return dict(body)

    out["stream_live"] = poll(flowing, 15, "video and audio packets at the relay")
    out["viewer"], peer = service.call(watch(service.base, stream, codec))
    out["segment"] = first_segment(service, stream)
    out["stream_viewed"] = service.get(f"/api/streams/{stream}")[1]
    out["sync"] = publisher_sync(service, stream, 5)
    page.wait_for_function("() => window.sfuPublisher.bitrate.video > 0", timeout=PAGE_TIMEOUT_MS)
    out["page_publishing"] = page_state(page)
    out["page_bitrate_text"] = page.text_content("#video-bitrate")

    # A caption, sent the way a person would; house time read either side of the click.
    text = f"caption on the {codec} stream"
    page.fill("#caption-text", text)
    before = service.house_ns()
    page.click("#caption-send")
    after = service.house_ns()
    page.wait_for_function("() => window.sfuPublisher.lastReply !== null", timeout=PAGE_TIMEOUT_MS)
    out["caption"] = {"text": text, "before_ns": before, "after_ns": after,
                      "page": page_state(page), "reply_text": page.text_content("#caption-reply")}
    status, feed = service.get(f"/api/streams/{stream}/captions?lang=en")
    out["caption"]["feed"] = feed
    cue = next((c for c in feed["cues"] if c["text"] == text), None) if status == 200 else None
    if cue is not None:
        chunk = int(cue["start"] // service.settings.caption_chunk_s)
        out["caption"]["chunk"] = service.get(f"/captions/{stream}/en/chunk-{chunk}.vtt")

    # Stop: the page DELETEs its WHIP resource; the viewer stays, so the stream stays listed.
    ended_before = service.ended()
    page.click("#stop")
    page.wait_for_function("() => ['stopped', 'failed'].includes(window.sfuPublisher.state)",
                           timeout=PAGE_TIMEOUT_MS)
    out["page_stopped"] = page_state(page)

    def unpublished() -> dict[str, Any] | None:
        status, body = service.get(f"/api/streams/{stream}")
        return dict(body) if status == 200 and body["publisher"] is None else None

    out["stream_stopped"] = poll(unpublished, 10, "the publisher to leave")
    out["ended"] = {k: v - ended_before.get(k, 0) for k, v in service.ended().items()
                    if v != ended_before.get(k, 0)}
    service.call(peer.close())
    return out


# The UDP drop: a routing rule in the probe's own network namespace that blackholes every UDP
# datagram (sending one fails at once, as on a network that went down), so the media path and
# ICE between Chromium and the relay break while HTTP (TCP) to the service still works, as on
# a lost Wi-Fi or mobile path that the page's WHIP requests then find again. Only rules of this
# namespace are touched: the probe refuses to run where it is not alone with ``lo``.
UDP_DROP_PREF = "10"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def own_namespace() -> None:
    links = subprocess.run(["ip", "-o", "link"], check=True, capture_output=True, text=True)
    names = [line.split(":")[1].strip() for line in links.stdout.splitlines()]
    if names != ["lo"]:
        raise SystemExit(f"the network drop needs a namespace of its own with only lo, not {names}")
    # The local table is looked up first by default: the drop rule must come before it.
    ip("rule", "del", "pref", "0")
    ip("rule", "add", "pref", "100", "lookup", "local")


def udp_drop(on: bool) -> None:
    if on:
        ip("rule", "add", "pref", UDP_DROP_PREF, "ipproto", "udp", "blackhole")
    else:
        ip("rule", "del", "pref", UDP_DROP_PREF)


# Samples the page's microphone level every 50 ms for `ms` in one evaluate.
LEVEL_SAMPLES_JS = """
async (ms) => {
  const out = [];
  for (const end = performance.now() + ms; performance.now() < end;) {
    out.push(window.sfuPublisher.micLevel);
    await new Promise((r) => setTimeout(r, 50));
  }
  return out;
}
"""

WIDTH_JS = """
() => ({scroll: document.documentElement.scrollWidth, client: document.documentElement.clientWidth})
"""

OPTIONS_JS = """
(id) => [...document.getElementById(id).options]
  .map((o) => ({value: o.value, label: o.textContent}))
"""

# The video sender's encoding ceiling and the encoder's target, read from the page's session.
SENDER_JS = """
async () => {
  const p = window.sfuPublisher;
  return {applied: p.appliedMaxBitrate, target: p.video.targetBitrate, bitrate: p.bitrate.video};
}
"""


def broadcaster(page: Any, service: Service) -> dict[str, Any]:
    """The broadcaster's controls on a phone-sized page: device selects and the level meter
    before publishing, a microphone switch and a bitrate ceiling while live, then a network
    drop and the relay ending the session, each followed by the page publishing again."""
    own_namespace()
    stream = "page-broadcaster"
    out: dict[str, Any] = {"stream": stream}
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{service.base}/publish?stream={stream}&token={TOKEN}")
    page.wait_for_function("() => window.sfuPublisher?.clock.state === 'joined'",
                           timeout=PAGE_TIMEOUT_MS)
    out["width"] = [page.evaluate(WIDTH_JS)]

    # Before publishing: the preview lists the fake devices by name and the meter follows
    # the fake microphone's beep.
    page.click("#preview-button")
    page.wait_for_function("() => window.sfuPublisher.state === 'previewing'"
                           " || window.sfuPublisher.error", timeout=PAGE_TIMEOUT_MS)
    out["preview"] = page_state(page)
    out["cameras"] = page.evaluate(OPTIONS_JS, "camera")
    out["microphones"] = page.evaluate(OPTIONS_JS, "microphone")
    out["levels_before"] = page.evaluate(LEVEL_SAMPLES_JS, 1500)
    out["meter_label"] = page.evaluate(
        "() => document.getElementById('mic-level').labels[0]?.textContent")

    # Live: the server sees the stream; another microphone goes on the same session.
    page.click("#start")
    page.wait_for_function("() => window.sfuPublisher.state === 'publishing'"
                           " || window.sfuPublisher.error", timeout=PAGE_TIMEOUT_MS)
    first = poll(lambda: live_publisher(service, stream, None), 15, "the stream live")
    out["live"] = first
    out["width"].append(page.evaluate(WIDTH_JS))
    out["levels_live"] = page.evaluate(LEVEL_SAMPLES_JS, 1500)
    mics = out["microphones"]
    if len(mics) > 1:
        current = page.evaluate("() => document.getElementById('microphone').value")
        other = next(m["value"] for m in mics if m["value"] != current)
        page.select_option("#microphone", other)
        page.wait_for_function(
            "(id) => { const p = window.sfuPublisher;"
            " return p.sentTrackIds.audio && p.sentTrackIds.audio === p.trackIds.audio"
            " && p.sentTrackIds.audio !== id; }",
            arg=out["preview"]["trackIds"]["audio"], timeout=PAGE_TIMEOUT_MS)
        out["switched"] = page_state(page)
        out["switched_live"] = service.get(f"/api/streams/{stream}")[1]

    # A bitrate ceiling while live: on the sender's encoding, and the encoder's target under it.
    page.wait_for_function("() => window.sfuPublisher.video.targetBitrate > 300000",
                           timeout=PAGE_TIMEOUT_MS)
    out["bitrate_before"] = page.evaluate(SENDER_JS)
    page.select_option("#bitrate", "250000")
    changed = time.monotonic()
    page.wait_for_function("() => window.sfuPublisher.video.targetBitrate <= 250000",
                           timeout=PAGE_TIMEOUT_MS)
    out["bitrate_after"] = page.evaluate(SENDER_JS)
    out["bitrate_after"]["applied_s"] = round(time.monotonic() - changed, 2)
    out["bitrate_encodings"] = page.evaluate("() => window.sfuPublisher.appliedMaxBitrate")

    # The network drops: UDP is blackholed until the page says it is reconnecting, then back.
    before = page_state(page)
    dropped = time.monotonic()
    udp_drop(True)
    try:
        page.wait_for_function("() => window.sfuPublisher.state === 'reconnecting'",
                               timeout=PAGE_TIMEOUT_MS)
        out["drop_noticed_s"] = round(time.monotonic() - dropped, 2)
    finally:
        udp_drop(False)
    restored = time.monotonic()
    again = poll(lambda: live_publisher(service, stream, first["publisher"]["id"]), 15,
                 "the stream live again after the network drop")
    out["drop_resumed_s"] = round(time.monotonic() - restored, 2)
    page.wait_for_function("() => window.sfuPublisher.state === 'publishing'",
                           timeout=PAGE_TIMEOUT_MS)
    out["after_drop"] = {"before": before, "page": page_state(page), "stream": again}

    # The relay ends the session (as an operator's DELETE, or its media timeout would): the
    # page sees its DTLS closed and publishes again.
    url = page.evaluate("() => window.sfuPublisher.sessionUrl")
    ended = time.monotonic()
    req = urllib.request.Request(url, method="DELETE",
                                 headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        out["ended_status"] = resp.status
    third = poll(lambda: live_publisher(service, stream, again["publisher"]["id"]), 15,
                 "the stream live again after the relay ended the session")
    out["end_resumed_s"] = round(time.monotonic() - ended, 2)
    page.wait_for_function("() => window.sfuPublisher.state === 'publishing'",
                           timeout=PAGE_TIMEOUT_MS)
    out["after_end"] = {"page": page_state(page), "stream": third}

    page.click("#stop")
    page.wait_for_function("() => window.sfuPublisher.state === 'stopped'", timeout=PAGE_TIMEOUT_MS)
    out["stopped"] = page_state(page)
    return out


def live_publisher(service: Service, stream: str, not_id: str | None) -> dict[str, Any] | None:
    """The stream's status once a publisher other than ``not_id`` is connected and both kinds
    of its media arrive (packets counted since it came)."""
    status, body = service.get(f"/api/streams/{stream}")
    if status != 200 or body["publisher"] is None:
        return None
    publisher = body["publisher"]
    if publisher["id"] == not_id or publisher["state"] != "connected":
        return None
    tracks = {t["kind"]: t for t in publisher.get("tracks", [])}
    if any(tracks.get(k, {}).get("packets", 0) < 10 for k in ("video", "audio")):
        return None
    return dict(body)


def token_refused(page: Any, service: Service) -> dict[str, Any]:
    """No token at all where the service asks for one: the page's own message, not retried."""
    stream = "page-no-token"
    page.goto(f"{service.base}/publish?stream={stream}")
    page.click("#start")
    page.wait_for_function("() => ['failed', 'publishing'].includes(window.sfuPublisher.state)",
                           timeout=PAGE_TIMEOUT_MS)
    page.wait_for_timeout(1500)  # long enough for a retry, had there been one
    out: dict[str, Any] = {"page": page_state(page)}
    out["streams"] = service.get("/api/streams")[1]
    out["status_role"] = page.evaluate(
        "() => [document.getElementById('status').getAttribute('role'),"
        " document.getElementById('status').getAttribute('aria-live')]")
    return out


STEPS = ("wrong_token", *CODECS, "token_refused", "broadcaster")


def main() -> None:

    # Steps named on the command line run alone (to repeat one); by default all of them.
    steps = sys.argv[1:] or list(STEPS)
    unknown = set(steps) - set(STEPS)
    if unknown:
        raise SystemExit(f"unknown steps {sorted(unknown)}; the steps are {STEPS}")
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sfu-sidecar-publish-") as data_dir:
        service = Service(data_dir)
        service.thread.start()
        if not service.ready.wait(20):
            raise SystemExit("service did not start")
        launch = chromium.Launch()
        with chromium.browser(launch=launch) as browser:
            began = time.monotonic()
            result["lock_wait_s"] = launch.lock_wait_s
            page = browser.new_page()
            chromium.forward_console(page)
            for step in steps:
                if step == "wrong_token":
                    result[step] = wrong_token(page, service)
                elif step in CODECS:
                    result[step] = publish_one(page, service, step)
                elif step == "token_refused":
                    result[step] = token_refused(page, service)
                else:
                    result[step] = broadcaster(page, service)
        result["browser_s"] = round(time.monotonic() - began, 1)
        service.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
