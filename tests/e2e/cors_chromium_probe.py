"""Chromium publishes and views with the ``whip-whep`` npm clients from a page on another origin.

Run inside a network namespace that has only ``lo`` (see test_cors_chromium.py). Two real
``sfu-sidecar serve`` processes (one open to the page's origin, one that also wants tokens) and
two static page servers on other ports: one origin listed in ``--cors-origins``, one not. The
pages import the clients' own ES module files, unchanged. Prints one JSON line.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import sys
import tempfile
import threading
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.conftest import (
    ROOT,
    ServerProcess,
    free_port,
)
from tests.support import chromium

CLIENTS = ROOT / "node_modules" / "whip-whep"
PUBLISH_TOKEN = "pub-5ecret"
VIEW_TOKEN = "view-5ecret"

# Publish the fake camera and microphone, view it back, count decoded frames, stop both.
# Every request to the sidecar is cross-origin; the page only calls the clients' public API.
RUN_JS = """
async ({base, stream, token, viewToken, wrongToken}) => {
  const {WHIPClient} = await import('/whip-whep/whip.js');
  const {WHEPClient} = await import('/whip-whep/whep.js');
  const out = {};
  const media = await navigator.mediaDevices.getUserMedia(
      {video: {width: 320, height: 240, frameRate: 15}, audio: true});
  if (wrongToken !== undefined) {
    // Refused by the service, not by the browser: the client can read the status.
    const pc = new RTCPeerConnection({bundlePolicy: 'max-bundle'});
    for (const t of media.getTracks()) pc.addTransceiver(t, {direction: 'sendonly'});
    try { await new WHIPClient().publish(pc, base + '/whip/' + stream, wrongToken); }
    catch (e) { out.wrongToken = {name: e.name, message: e.message}; }
    pc.close();
  }
  const publisherPc = new RTCPeerConnection({bundlePolicy: 'max-bundle'});
  for (const t of media.getTracks()) publisherPc.addTransceiver(t, {direction: 'sendonly'});
  const whip = new WHIPClient();
  try {
    await whip.publish(publisherPc, base + '/whip/' + stream, token);
  } catch (e) {
    out.publishError = {name: e.name, message: e.message};
    return out;
  }
  out.published = true;
  const viewerPc = new RTCPeerConnection({bundlePolicy: 'max-bundle'});
  viewerPc.addTransceiver('video', {direction: 'recvonly'});
  viewerPc.addTransceiver('audio', {direction: 'recvonly'});
  const video = document.createElement('video');
  video.muted = true; video.autoplay = true; video.playsInline = true;
  document.body.appendChild(video);
  const remote = new MediaStream();
  viewerPc.ontrack = (e) => { remote.addTrack(e.track); video.srcObject = remote; };
  const whep = new WHEPClient();
  await whep.view(viewerPc, base + '/whep/' + stream, viewToken);
  out.frames = 0;
  await new Promise((done) => {
    const onFrame = (now, meta) => {
      out.frames += 1; out.width = meta.width; out.height = meta.height;
      if (out.frames >= 30) return done();
      video.requestVideoFrameCallback(onFrame);
    };
    video.requestVideoFrameCallback(onFrame);
    setTimeout(done, 20000);
  });
  (await viewerPc.getStats()).forEach((s) => {
    if (s.type === 'inbound-rtp' && s.kind === 'video') out.framesDecoded = s.framesDecoded;
    if (s.type === 'inbound-rtp' && s.kind === 'audio') out.audioPackets = s.packetsReceived;
  });
  // Status is a cross-origin read: open to every page.
  out.during = await (await fetch(base + '/api/streams/' + stream)).json();
  await whep.stop();
  await whip.stop();
  out.stopped = true;
  return out;
}
"""

PAGE = "<!doctype html><meta charset=utf-8><title>another origin</title><body></body>\n"


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def _page_server(root: Path) -> tuple[ThreadingHTTPServer, str]:
    port = free_port()
    handler = functools.partial(_Quiet, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{port}"


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _requests(server: ServerProcess) -> list[str]:
    """``METHOD path status`` of every request the stopped server logged, sessions elided."""
    out = []
    for line in server.output().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "status" in record and "duration_ms" in record:
            method, path, status = str(record["msg"]).split()[:3]
            out.append(f"{method} {re.sub('[0-9a-f]{32}', '{session}', path)} {status}")
    return out


def _refused_preflights(base: str) -> float:
    """How many WHIP requests the service answered 403 (preflights it refused)."""
    with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith('sfu_sidecar_http_requests_total{route="/whip/{stream') and (
            'status="403"' in line
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def main() -> int:

    work = Path(tempfile.mkdtemp(prefix="cors-probe-"))
    (work / "site" / "whip-whep").mkdir(parents=True)
    (work / "site" / "index.html").write_text(PAGE)
    for name in ("whip.js", "whep.js"):
        shutil.copy(CLIENTS / name, work / "site" / "whip-whep" / name)
    page_servers = [_page_server(work / "site") for _ in range(2)]
    (_, allowed), (_, refused) = page_servers
    common = ["--ice-addresses", "127.0.0.1", "--cors-origins", allowed, "--log-format", "json"]
    open_server = ServerProcess(["--data-dir", str(work / "open"), *common])
    token_server = ServerProcess([
        "--data-dir", str(work / "token"), *common,
        "--publish-token", PUBLISH_TOKEN, "--view-token", VIEW_TOKEN,
    ])
    servers = [open_server, token_server]
    result: dict[str, Any] = {"allowed": allowed, "refused": refused}
    try:
        for server in servers:
            server.wait_ready()
        with chromium.browser() as browser:
            runs = {
                "open": (allowed, open_server, {}),
                "token": (allowed, token_server, {
                    "token": PUBLISH_TOKEN, "viewToken": VIEW_TOKEN,
                    "wrongToken": "wrong"}),
                "refused": (refused, open_server, {}),
            }
            for name, (origin, server, tokens) in runs.items():
                page = browser.new_page()
                try:
                    page.goto(origin + "/index.html")
                    args = {"base": server.base, "stream": f"cors-{name}", **tokens}
                    seen = page.evaluate(RUN_JS, args)
                finally:
                    page.close()
                seen["after"] = _get_json(server.base + "/api/streams")
                seen["refused_preflights"] = _refused_preflights(server.base)
                result[name] = seen
    finally:
        for server in servers:
            server.stop()
        result["requests"] = {"open": _requests(open_server), "token": _requests(token_server)}
        for server, _ in page_servers:
            server.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
