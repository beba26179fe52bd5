"""Probe: the publisher page over HTTPS from a browser on another address, and a certificate
rotated while it publishes.

Runs in a network namespace of its own (``tests/e2e/test_https_chromium.py``). The service
listens on 10.88.0.1, an address of a veth interface: not loopback, so Chromium grants camera
and microphone only because the page is served over HTTPS by a certificate it trusts. That trust
is a test CA made here and added to the NSS database of a home folder made here; nothing else is
trusted. The service runs as the CLI runs it (``sfu-sidecar serve --tls-cert ... --tls-key``).

Prints one JSON object: what the publisher and viewer pages saw before and after the certificate
files were replaced, and the certificate served to new connections.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.conftest import sidecar_command
from tests.support import chromium
from tests.support.certs import TestCA

ADDRESS = "10.88.0.1"
PORT = 8443  # the namespace is private: no other process can hold it
STREAM = "over-https"
TOKEN = "https-probe-token"
BASE = f"https://{ADDRESS}:{PORT}"
PAGE_TIMEOUT_MS = 30_000


def setup_namespace() -> None:
    # No IPv6 here: link-local addresses appearing a moment after the link comes up make
    # Chromium's network-change notifier abort the page's loads (ERR_NETWORK_CHANGED).
    for conf in ("all", "default"):
        Path(f"/proc/sys/net/ipv6/conf/{conf}/disable_ipv6").write_text("1")
    # A veth pair (this kernel has no dummy interfaces): the address lives on one end.
    for cmd in ("ip link add https0 type veth peer name https0p",
                f"ip addr add {ADDRESS}/24 dev https0", "ip link set https0 up",
                "ip link set https0p up"):
        subprocess.run(cmd.split(), check=True, capture_output=True, timeout=10)
    # Up with a carrier before anything starts: no change left for Chromium to notice.
    wait("the veth link up", lambda: "state UP" in subprocess.run(
        ["ip", "-o", "link", "show", "https0"], capture_output=True, text=True,
        timeout=5).stdout, 10)
    time.sleep(0.5)


def trust(home: Path, ca: TestCA) -> None:
    """A user NSS database in ``home`` that trusts the test CA for servers (as Chromium on
    Linux reads it), and nothing else added."""
    db = home / ".pki" / "nssdb"
    db.mkdir(parents=True)
    ca_file = home / "ca.pem"
    ca_file.write_bytes(ca.pem)
    for cmd in (["certutil", "-d", f"sql:{db}", "-N", "--empty-password"],
                ["certutil", "-d", f"sql:{db}", "-A", "-t", "C,,", "-n", "sfu-sidecar test CA",
                 "-i", str(ca_file)]):
        subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def served_sha256(ca: TestCA) -> str:
    context = ssl.create_default_context(cadata=ca.pem.decode())
    with socket.create_connection((ADDRESS, PORT), timeout=5) as sock, \
            context.wrap_socket(sock, server_hostname=ADDRESS) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return hashlib.sha256(der).hexdigest()


def get_json(path: str, ca: TestCA) -> Any:
    context = ssl.create_default_context(cadata=ca.pem.decode())
    with urllib.request.urlopen(BASE + path, context=context, timeout=5) as resp:
        return json.loads(resp.read())


def wait(what: str, check: Any, limit_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        try:
            if check():
                return round(time.monotonic() - started, 2)
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"timed out after {limit_s} s waiting for {what}")


def publisher_of(ca: TestCA) -> dict[str, Any] | None:
    """The stream's publisher once connected with both kinds of media arriving."""
    publisher: dict[str, Any] | None = get_json(f"/api/streams/{STREAM}", ca)["publisher"]
    if publisher is None or publisher["state"] != "connected":
        return None
    tracks = {t["kind"]: t for t in publisher.get("tracks", [])}
    if any(tracks.get(k, {}).get("packets", 0) < 10 for k in ("video", "audio")):
        return None
    return publisher


PAGE_JS = """() => ({protocol: location.protocol, secure: window.isSecureContext,
  frames: document.querySelector('video')?.getVideoPlaybackQuality().totalVideoFrames ?? null})"""


def publisher_state(page: Any) -> dict[str, Any]:
    state: dict[str, Any] = page.evaluate(
        "() => ({state: window.sfuPublisher.state, error: window.sfuPublisher.error ?? null,"
        " clock: window.sfuPublisher.clock.state, secure: window.isSecureContext,"
        " protocol: location.protocol})")
    return state


def viewer_frames(page: Any) -> int:
    frames: int = page.evaluate(
        "() => document.querySelector('video').getVideoPlaybackQuality().totalVideoFrames")
    return frames


def open_viewer(browser: Any) -> Any:
    page = browser.new_context().new_page()
    chromium.forward_console(page)
    page.goto(f"{BASE}/?stream={STREAM}")
    page.wait_for_function("() => window.sfuViewer?.controls.snapshot().state === 'live'",
                           timeout=PAGE_TIMEOUT_MS)
    page.wait_for_function(
        "() => document.querySelector('video').getVideoPlaybackQuality().totalVideoFrames > 10",
        timeout=PAGE_TIMEOUT_MS)
    return page


def main() -> int:
    setup_namespace()
    ca = TestCA()
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="https-probe-") as tmp:
        folder = Path(tmp)
        home = folder / "home"
        trust(home, ca)
        first, second = ca.issue(ADDRESS), ca.issue(ADDRESS)
        cert, key = first.write(folder)
        log = (folder / "service.log").open("wb")
        service = subprocess.Popen(
            [*sidecar_command(), "serve", "--host", ADDRESS, "--port", str(PORT),
             "--tls-cert", str(cert), "--tls-key", str(key), "--ice-addresses", ADDRESS,
             "--publish-token", TOKEN, "--data-dir", str(folder / "data"),
             "--max-cpu-percent", "1000"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            wait("the service over HTTPS", lambda: get_json("/healthz", ca) is not None, 30)
            result["served_first"] = served_sha256(ca) == first.sha256
            with chromium.browser(env={**os.environ, "HOME": str(home)}) as browser:
                publisher = browser.new_context().new_page()
                chromium.forward_console(publisher)
                publisher.goto(f"{BASE}/publish?stream={STREAM}&token={TOKEN}")
                # The clock join runs over wss: joined means the WebSocket came up over TLS.
                publisher.wait_for_function(
                    "() => window.sfuPublisher?.clock.state === 'joined'",
                    timeout=PAGE_TIMEOUT_MS)
                publisher.click("#start")
                publisher.wait_for_function(
                    "() => window.sfuPublisher.state === 'publishing' || window.sfuPublisher.error",
                    timeout=PAGE_TIMEOUT_MS)
                result["publisher_before"] = publisher_state(publisher)
                wait("the stream live", lambda: publisher_of(ca) is not None, 15)
                result["stream_before"] = publisher_of(ca)
                viewer = open_viewer(browser)
                result["viewer_before"] = viewer.evaluate(PAGE_JS)

                # Rotation: the new pair replaces the old files (key first, then certificate,
                # as a renewal client writes them; in between the pair does not match).
                key.write_bytes(second.key_pem)
                time.sleep(0.5)
                cert.write_bytes(second.cert_pem)
                rotated = time.monotonic()
                result["rotated_after_s"] = wait(
                    "the new certificate served", lambda: served_sha256(ca) == second.sha256, 15)
                frames_at_rotation = viewer_frames(viewer)
                time.sleep(3)
                result["viewer_frames_3s_after_rotation"] = viewer_frames(viewer) - \
                    frames_at_rotation
                result["publisher_after"] = publisher_state(publisher)
                result["stream_after"] = publisher_of(ca)
                # A viewer that arrives now gets the new certificate, and trusts it.
                late = open_viewer(browser)
                result["late_viewer"] = late.evaluate(PAGE_JS)
                result["seconds_since_rotation"] = round(time.monotonic() - rotated, 1)
                metrics = urllib.request.urlopen(
                    BASE + "/metrics", context=ssl.create_default_context(cadata=ca.pem.decode()),
                    timeout=5).read().decode()
                result["metrics"] = [line for line in metrics.splitlines()
                                     if line.startswith("sfu_sidecar_tls_")]
        finally:
            service.terminate()
            try:
                result["service_exit"] = service.wait(15)
            except subprocess.TimeoutExpired:
                service.kill()
                result["service_exit"] = service.wait()
            log.close()
            service_log = (folder / "service.log").read_text(errors="replace")
            result["service_log"] = [line for line in service_log.splitlines()
                                     if "certificate" in line or "Traceback" in line
                                     or "ERROR" in line][:20]
            if "late_viewer" not in result:
                print(service_log[-3000:], file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
