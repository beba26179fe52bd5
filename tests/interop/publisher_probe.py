"""Capture timeline of one kind of publisher, seen by an aiortc viewer through the product.

``python -m tests.interop.publisher_probe KIND SECONDS`` runs ``sfu-sidecar serve``, a publisher
of KIND, and a WHEP viewer with the ``sync`` channel for SECONDS, then prints one JSON line of
figures. Run it inside a namespace that has only ``lo`` (``unshare -n``), so every ICE pair is
loopback. The publishers:

- ``gstreamer``: GStreamer ``webrtcbin`` (sender reports only; ``gst_publisher.py``).
- ``chromium`` / ``chromium-act``: headless Chromium publishing its fake camera and microphone
  (``--use-fake-device-for-media-stream``); ``-act`` negotiates abs-capture-time.
- ``chromium-canvas``: Chromium publishing a canvas whose every frame carries the instant it was
  drawn in its pixels, plus the fake microphone (sender reports only).
- ``aiortc``: aiortc with the synthetic source, sender reports only (no join, no extension);
  every packet it sends is recorded, so the capture instant of every RTP timestamp is known.
- ``aiortc-join``: the product's own client: abs-capture-time and a clock join.

Figures, per track: frames seen, how many mapped capture times went backwards against the
previous frame, the rate of capture time against the viewer's arrival clock (ppm from 1 s/s),
the error against the true capture instant where it is known (median, p95, max), and for
publishers whose audio and video are known to be in step, the A/V skew of the mapping.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from sfu_sidecar.client.whip import publish as whip_publish
from sfu_sidecar.synthetic import (
    BeepAudioTrack,
    FlashVideoTrack,
    Timeline,
    decode_frame_number,
)
from tests.conftest import free_port, sidecar_command
from tests.relay import peers
from tests.support import chromium
from tests.sync.records import ViewerRecords

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MASK32 = 0xFFFFFFFF
NS = 1_000_000_000
STREAM = "probe"
# Longest a packet may take from the publisher through the relay to the viewer here (loopback).
RELAY_WINDOW_NS = 300_000_000
KINDS = ("gstreamer", "chromium", "chromium-act", "chromium-canvas", "aiortc", "aiortc-join")
# Chromium canvas frames carry (capture instant - page base) in units of 0.1 ms in the 20-bit
# block code of the synthetic source: 104 s of range.
CANVAS_UNIT_NS = 100_000

CANVAS_PUBLISH_JS = """
async ([base, act, camera]) => {
  const W = 640, H = 360, BITS = 20, ROWS = 24, UNIT_MS = 0.1;
  const canvas = document.createElement('canvas');
  canvas.width = W; canvas.height = H;
  document.body.appendChild(canvas);
  const g = canvas.getContext('2d');
  const video = canvas.captureStream(0).getVideoTracks()[0];
  // Wall-clock origin from Date.now(): performance.timeOrigin can sit milliseconds off it.
  const origin = Date.now(), start = performance.now();
  let n = 0;
  const draw = () => {
    const code = Math.round((performance.now() - start) / UNIT_MS);
    g.fillStyle = 'rgb(60,60,60)'; g.fillRect(0, 0, W, H);
    g.fillStyle = 'rgb(128,128,128)'; g.fillRect((n * 8) % W, ROWS + 8, 16, H);
    const block = W / BITS;
    for (let bit = 0; bit < BITS; bit++) {
      const on = (code >> (BITS - 1 - bit)) & 1;
      g.fillStyle = on ? 'rgb(255,255,255)' : 'rgb(0,0,0)';
      g.fillRect(bit * block, 0, block, ROWS);
    }
    video.requestFrame();
    n++;
  };
  setInterval(draw, 1000 / 30);
  const media = await navigator.mediaDevices.getUserMedia(
      {audio: true, video: camera ? {width: 640, height: 360, frameRate: 30} : false});
  const mic = media.getAudioTracks()[0];
  const sent = camera ? media.getVideoTracks()[0] : video;
  const pc = new RTCPeerConnection({bundlePolicy: 'max-bundle'});
  const uri = 'http://www.webrtc.org/experiments/rtp-hdrext/abs-capture-time';
  for (const track of [mic, sent]) {
    const t = pc.addTransceiver(track, {direction: 'sendonly'});
    if (act) {
      const exts = t.getHeaderExtensionsToNegotiate();
      t.setHeaderExtensionsToNegotiate(
          exts.map((e) => (e.uri === uri ? {uri, direction: 'sendonly'} : e)));
    }
  }
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((done) => {
    if (pc.iceGatheringState === 'complete') return done();
    pc.onicegatheringstatechange = () => pc.iceGatheringState === 'complete' && done();
    setTimeout(done, 3000);
  });
  const resp = await fetch(base + '/whip/probe', {method: 'POST',
      headers: {'Content-Type': 'application/sdp'}, body: pc.localDescription.sdp});
  const answer = await resp.text();
  if (resp.status !== 201) return {status: resp.status, body: answer};
  await pc.setRemoteDescription({type: 'answer', sdp: answer});
  window.publisher = pc;
  return {status: resp.status, origin_ms: origin,
          act: answer.includes(uri)};
}
"""


# The product's viewer page: every presented frame's capture time as the page mapped it.
PAGE_RECORD_JS = """
() => {
  window.probeFrames = [];
  window.sfuViewer.frameListeners.push((record, meta) => {
    if (record.captureNs === null) return;
    // receiveTime: when the frame's last packet arrived, free of the playout delay Chromium
    // adapts while it plays (tens of ms over a minute).
    window.probeFrames.push([meta.receiveTime ?? performance.now(), performance.now(),
                             Number(record.captureNs), record.streamS]);
  });
}
"""


class Server:
    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = data_dir / "server.log"
        self.proc = subprocess.Popen(
            [*sidecar_command(), "serve", "--host", "127.0.0.1", "--port", str(self.port),
             "--ice-addresses", "127.0.0.1", "--data-dir", str(data_dir),
             "--log-level", "warning"],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(self.base + "/healthz", timeout=0.5).close()
                return
            time.sleep(0.05)
        raise RuntimeError("server did not start: " + self.log.read_text()[-2000:])

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Truth:
    """True capture instant of a viewer RTP timestamp, per kind, where it is known."""

    def __init__(self) -> None:
        self.by_viewer_ts: dict[str, dict[int, int]] = {"audio": {}, "video": {}}
        # (base ns, clock rate, upstream RTP base) per kind for publishers whose sent packets
        # are recorded: any upstream timestamp's capture instant follows.
        self.rtp_lines: dict[str, tuple[int, int, int]] = {}
        # Per kind: payload -> (RTP timestamp, send time) of every packet sent with it.
        self.sent_payloads: dict[str, dict[bytes, list[tuple[int, int]]]] = {
            "audio": {}, "video": {}}
        # Per kind, sorted: how long after its capture each frame's first packet was sent. A
        # sender that stamps its reports at send time is late by this, and no receiver can
        # map its frames closer to capture than the least of it.
        self.send_lags: dict[str, list[int]] = {}

    def send_lag_ms(self) -> dict[str, dict[str, float]]:
        out = {}
        for kind, lags in self.send_lags.items():
            if lags:
                out[kind] = {f"p{q}": lags[q * (len(lags) - 1) // 100] / 1e6
                             for q in (10, 50, 95)}
        return out

    def of(self, kind: str, viewer_ts: int, offsets: dict[str, int]) -> int | None:
        known = self.by_viewer_ts[kind].get(viewer_ts)
        if known is not None:
            return known
        line = self.rtp_lines.get(kind)
        offset = offsets.get(kind)
        if line is None or offset is None:
            return None
        start_ns, rate, base = line
        upstream = (viewer_ts - offset) & MASK32
        return start_ns + ((upstream - base) & MASK32) * NS // rate


async def start_publisher(kind: str, base: str, seconds: float, truth: Truth,
                          stack: contextlib.AsyncExitStack) -> dict[str, Any]:
    if kind == "gstreamer":
        # GStreamer 1.22's webrtcbin now and then dies before it offers (a crash in its own
        # start-up, before any byte reaches the service): one more try, said on stderr.
        for attempt in range(2):
            log = Path(tempfile.mkstemp(prefix="gst", suffix=".log")[1])
            err = log.open("wb")  # noqa: ASYNC230 - set-up, before any media flows
            proc = subprocess.Popen(  # noqa: ASYNC220 - a long-lived child, started once
                ["/usr/bin/python3", str(HERE / "gst_publisher.py"), f"{base}/whip/{STREAM}",
                 str(seconds + 15)], stdout=subprocess.PIPE, stderr=err, text=True)
            stack.callback(err.close)
            stack.callback(lambda p=proc: (p.terminate(), p.wait(10)))  # type: ignore[misc]
            assert proc.stdout is not None
            line = await asyncio.to_thread(proc.stdout.readline)
            if line:
                result: dict[str, Any] = json.loads(line)
                return result
            print(f"gstreamer publisher attempt {attempt + 1} exited with {proc.wait(10)}: "
                  f"{log.read_text(errors='replace')[-800:]}",  # noqa: ASYNC240
                  file=sys.stderr)
        return {"status": None}
    if kind.startswith("chromium"):
        return await _chromium(base, kind == "chromium-act", kind != "chromium-canvas", stack)
    timeline = Timeline.starting_now(time.time_ns)
    # 320x240 keeps aiortc's VP8 encode, by which its send-time reports are late, to ~1 ms.
    video = FlashVideoTrack(timeline, width=320, height=240)
    audio = BeepAudioTrack(timeline)
    if kind == "aiortc-join":
        session = await whip_publish(
            f"{base}/whip/{STREAM}", [audio, video], capture_start_ns=timeline.start_house_ns,
            ice_addresses=peers.LOOPBACK)
        stack.push_async_callback(session.close)
        report = await session.joined()
        return {"status": 201, "joined": report is not None,
                "video_log": video.capture_log}
    http = await stack.enter_async_context(aiohttp.ClientSession())
    peer = await peers.publish(http, base, STREAM, video=video, audio=audio)
    stack.push_async_callback(peer.close)
    return {"status": 201, "peer": peer, "timeline": timeline}


async def _chromium(base: str, act: bool, camera: bool,
                    stack: contextlib.AsyncExitStack) -> dict[str, Any]:
    browser = await stack.enter_async_context(chromium.async_browser())
    page = await browser.new_page()
    await page.goto(base + "/healthz")
    result: dict[str, Any] = await page.evaluate(CANVAS_PUBLISH_JS, [base, act, camera])
    return result


def learn_rtp_lines(pub: dict[str, Any], truth: Truth) -> None:
    """aiortc publisher: the first packet sent per track carries pts 0 (the timeline start)."""
    peer, timeline = pub.get("peer"), pub.get("timeline")
    if peer is None or timeline is None:
        return
    for kind, rate in (("audio", 48_000), ("video", 90_000)):
        ssrc = peers.sent_ssrc(peer, kind)
        mine = [(p, at) for p, at in zip(peer.sent, peer.sent_ns, strict=True) if p.ssrc == ssrc]
        if not mine:
            continue
        # The first sent, not the lowest sequence number: aiortc starts at a random one, and
        # a run that wraps past 65535 would take a packet from after the wrap for the first.
        first = mine[0][0]
        truth.rtp_lines[kind] = (timeline.start_house_ns, rate, first.timestamp)
        sent: dict[bytes, list[tuple[int, int]]] = {}
        lags: dict[int, int] = {}
        for p, at in mine:
            sent.setdefault(p.payload, []).append((p.timestamp, at))
            if p.timestamp not in lags:
                capture = timeline.start_house_ns + (
                    (p.timestamp - first.timestamp) & MASK32) * NS // rate
                lags[p.timestamp] = at - capture
        truth.sent_payloads[kind] = sent
        truth.send_lags[kind] = sorted(lags.values())


def rewrite_offsets(viewer: peers.Peer, truth: Truth) -> dict[str, int]:
    """The relay's per-viewer timestamp rewrite: every received packet votes for the offsets to
    the packets sent with its payload shortly before it arrived; the true offset gets every
    vote, while a payload sent more than once (silence) scatters its others. Only packets sent
    within RELAY_WINDOW_NS of the arrival count: the beep repeats each second, and its
    packets, byte for byte the same every second, would give offsets 1 s apart equal votes."""
    offsets: dict[str, int] = {}
    for kind in ("audio", "video"):
        ssrc = peers.received_ssrc(viewer, kind)
        votes: collections.Counter[int] = collections.Counter()
        for p, arrived in zip(viewer.received, viewer.received_ns, strict=True):
            candidates = truth.sent_payloads[kind].get(p.payload, []) if p.ssrc == ssrc else []
            for upstream, sent in candidates:
                if 0 <= arrived - sent <= RELAY_WINDOW_NS:
                    votes[(p.timestamp - upstream) & MASK32] += 1
        if votes:
            offsets[kind] = votes.most_common(1)[0][0]
    return offsets


def path_delay_ms(viewer: peers.Peer, truth: Truth,
                  offsets: dict[str, int]) -> dict[str, dict[str, float]]:
    """Per kind, percentiles of how long packets took from the publisher's send to the
    viewer (through the product, on this machine's loaded loop): the product's estimate of the
    publisher's clock offset is late by the least of this delay on the reports' way in."""
    out = {}
    for kind, offset in offsets.items():
        ssrc = peers.received_ssrc(viewer, kind)
        delays = []
        for p, arrived in zip(viewer.received, viewer.received_ns, strict=True):
            if p.ssrc != ssrc:
                continue
            upstream = (p.timestamp - offset) & MASK32
            sent = [at for ts, at in truth.sent_payloads[kind].get(p.payload, [])
                    if ts == upstream and 0 <= arrived - at <= RELAY_WINDOW_NS]
            if sent:
                delays.append(arrived - max(sent))
        delays.sort()
        if delays:
            out[kind] = {f"p{q}": delays[q * (len(delays) - 1) // 100] / 1e6
                         for q in (10, 50, 95)}
    return out


async def decode_video(viewer: peers.Peer, pub: dict[str, Any], kind: str, truth: Truth,
                       stop: asyncio.Event) -> None:
    """Read the capture instant (or frame number) out of every decoded frame's pixels."""
    track = viewer.tracks.get("video")
    if track is None:
        return
    first_ts: int | None = None
    origin_ns = round(float(pub.get("origin_ms", 0)) * 1e6)
    log: dict[int, int] = pub.get("video_log", {})
    while not stop.is_set():
        try:
            frame = await asyncio.wait_for(track.recv(), 1.0)
        except TimeoutError:
            continue
        except Exception:  # the track ends when the viewer closes
            return
        if first_ts is None:
            ssrc = peers.received_ssrc(viewer, "video")
            first_ts = next(p.timestamp for p in viewer.received if p.ssrc == ssrc)
        viewer_ts = (frame.pts + first_ts) & MASK32
        luma = frame.to_ndarray(format="yuv420p")[: frame.height]
        code = decode_frame_number(luma)
        if kind == "chromium-canvas":
            truth.by_viewer_ts["video"][viewer_ts] = origin_ns + code * CANVAS_UNIT_NS
        elif code in log:
            truth.by_viewer_ts["video"][viewer_ts] = log[code]


def figures(kind: str, viewer: peers.Peer, records: ViewerRecords, truth: Truth,
            offsets: dict[str, int], settle_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    errors_by_kind: dict[str, list[int]] = {}
    for media in ("video", "audio"):
        mid = peers.mid_of(viewer, media)
        try:
            track = records.track_for(mid)
        except StopIteration:
            out[media] = {"frames": 0}
            continue
        ssrc = peers.received_ssrc(viewer, media)
        # Arrival of each frame's first packet at the viewer, in RTP order.
        arrivals: dict[int, int] = {}
        for p, at in zip(viewer.received, viewer.received_ns, strict=True):
            if p.ssrc == ssrc and p.timestamp not in arrivals:
                arrivals[p.timestamp] = at
        t0 = min(arrivals.values()) + int(settle_s * NS) if arrivals else 0
        rows = []
        for ts, at in arrivals.items():
            found = records.frame(track, ts)
            if found is not None and at >= t0:
                rows.append((at, ts, found[0], found[1].name.lower(), found[2]))
        rows.sort()
        backwards = sum(1 for a, b in itertools.pairwise(rows) if b[2] <= a[2])
        rate_ppm = None
        # The rate of the steady timeline: from the last change of source on (a switch from
        # arrival to sender reports is one step, checked by ``backwards``, not a rate).
        last_switch = max((i for i in range(1, len(rows)) if rows[i][3] != rows[i - 1][3]),
                          default=0)
        steady = rows[last_switch:]
        if len(steady) > 10:
            xs = [r[0] / NS for r in steady]
            ys = [r[2] / NS for r in steady]
            rate_ppm = (statistics.linear_regression(xs, ys).slope - 1.0) * 1e6
        errors = []
        for _, ts, capture, _, _ in rows:
            true = truth.of(media, ts, offsets)
            if true is not None:
                errors.append(capture - true)
        errors_by_kind[media] = errors
        sources: dict[str, int] = {}
        for r in rows:
            sources[r[3]] = sources.get(r[3], 0) + 1
        entry: dict[str, Any] = {
            "frames": len(rows), "backwards": backwards, "rate_ppm": rate_ppm,
            "sources": sources, "estimated": sum(1 for r in rows if r[4]),
            "span_s": (rows[-1][0] - rows[0][0]) / NS if rows else 0.0,
        }
        if errors:
            absolute = sorted(abs(e) for e in errors)
            entry.update(
                truth_n=len(errors), err_median_ms=statistics.median(errors) / 1e6,
                abs_err_p95_ms=absolute[int(0.95 * (len(absolute) - 1))] / 1e6,
                abs_err_max_ms=absolute[-1] / 1e6)
            middle = statistics.median(errors)
            spread = sorted(abs(e - middle) for e in errors)
            entry["err_spread_p95_ms"] = spread[int(0.95 * (len(spread) - 1))] / 1e6
        out[media] = entry
    if errors_by_kind.get("audio") and errors_by_kind.get("video"):
        out["av_skew_ms"] = (statistics.median(errors_by_kind["audio"])
                             - statistics.median(errors_by_kind["video"])) / 1e6
    return out


async def page_viewer(base: str, seconds: float, settle_s: float,
                      stack: contextlib.AsyncExitStack) -> dict[str, Any]:
    """The product's viewer page in Chromium: presented frames' capture times, in order."""
    browser = await stack.enter_async_context(chromium.async_browser())
    page = await browser.new_page()
    await page.goto(f"{base}/?stream={STREAM}")
    await page.wait_for_function("() => window.sfuViewer !== undefined", timeout=15_000)
    await page.evaluate(PAGE_RECORD_JS)
    await asyncio.sleep(seconds)
    frames: list[list[float]] = await page.evaluate("() => window.probeFrames")
    stats: dict[str, Any] = await page.evaluate("() => window.sfuViewer.stats")
    rows = [f for f in frames if f[1] - frames[0][1] >= settle_s * 1000] if frames else []
    backwards = sum(1 for a, b in itertools.pairwise(rows) if b[2] < a[2])
    rate_ppm = None
    if len(rows) > 10:
        # Capture time of presented frames against the time they were received (ms).
        fit = statistics.linear_regression([r[0] / 1e3 for r in rows], [r[2] / NS for r in rows])
        rate_ppm = (fit.slope - 1.0) * 1e6
    repeats = sum(1 for a, b in itertools.pairwise(rows) if b[2] == a[2])
    return {"frames": len(rows), "backwards": backwards, "repeated": repeats,
            "rate_ppm": rate_ppm, "stream_s_first": rows[0][3] if rows else None,
            "stream_s_last": rows[-1][3] if rows else None, "stats": stats}


async def run(kind: str, seconds: float, settle_s: float,
              viewer_kind: str = "aiortc") -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pubprobe") as tmp:
        server = Server(Path(tmp))
        try:
            async with contextlib.AsyncExitStack() as stack:
                truth = Truth()
                pub = await start_publisher(kind, server.base, seconds, truth, stack)
                if pub.get("status") != 201:
                    return {"kind": kind, "error": f"publish failed: {pub}"}
                if viewer_kind == "chromium":
                    page = await page_viewer(server.base, seconds, settle_s, stack)
                    return {"kind": kind, "viewer": "chromium", "seconds": seconds,
                            "page": page}
                http = await stack.enter_async_context(aiohttp.ClientSession())
                # Pixels are truth only for these kinds; elsewhere decoding would only take CPU
                # from a publisher that may share this process.
                pixels = kind in ("chromium-canvas", "aiortc-join")
                viewer = await peers.view(http, server.base, STREAM, data_channel="sync",
                                          decode=pixels)
                stack.push_async_callback(viewer.close)
                records = ViewerRecords()
                viewer.channel.on("message", records.feed)
                stop = asyncio.Event()
                decoder = asyncio.create_task(
                    decode_video(viewer, pub, kind, truth, stop) if pixels else stop.wait())
                await asyncio.sleep(seconds)
                stop.set()
                await decoder
                learn_rtp_lines(pub, truth)
                offsets = rewrite_offsets(viewer, truth)
                async with http.get(f"{server.base}/api/sync") as resp:
                    status = await resp.json()
                result = {"kind": kind, "seconds": seconds, "settle_s": settle_s,
                          **figures(kind, viewer, records, truth, offsets, settle_s),
                          "publishers": status.get("publishers"),
                          "send_lag_ms": truth.send_lag_ms(),
                          "path_ms": path_delay_ms(viewer, truth, offsets),
                          "publish": {k: v for k, v in pub.items()
                                      if k in ("status", "act", "joined")}}
                return result
        finally:
            server.close()


async def _with_timeout(coro: Awaitable[dict[str, Any]], limit: float) -> dict[str, Any]:
    return await asyncio.wait_for(coro, limit)


def main(argv: list[str]) -> int:
    kind, seconds = argv[0], float(argv[1])
    settle_s = float(argv[2]) if len(argv) > 2 else 5.0
    viewer_kind = argv[3] if len(argv) > 3 else "aiortc"
    if kind not in KINDS or viewer_kind not in ("aiortc", "chromium"):
        print(f"usage: KIND SECONDS [SETTLE_S] [aiortc|chromium]; KIND one of {', '.join(KINDS)}",
              file=sys.stderr)
        return 2
    runner: Callable[[], Awaitable[dict[str, Any]]] = lambda: _with_timeout(  # noqa: E731
        run(kind, seconds, settle_s, viewer_kind), seconds + 90)
    result = asyncio.run(runner())
    print(json.dumps(result))
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
