"""Janus, the C SFU the product runs beside: the one place the suite starts it.

Janus runs with the configuration the image ships (``deploy/janus``), its HTTP API moved to a
port of the test's choosing, as a child of the calling probe or test.
"""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "janus"
# In a probe's private namespace Janus gathers candidates on one veth only: without it, Janus
# offers loopback candidates that aiortc peers cannot pair with.
INTERFACE = "jtap0"
ADDRESS = "127.0.0.2"
HTTP_PORT = 18088  # in a private namespace no other process can hold it
ROOM = 1234  # the room deploy/janus/janus.plugin.videoroom.jcfg creates


def setup_namespace() -> None:
    """In a fresh namespace: loopback up, and Janus's interface with its own address."""
    for cmd in (
        "ip link set lo up",
        f"ip link add {INTERFACE} type veth peer name {INTERFACE}p",
        f"ip addr add {ADDRESS}/32 dev {INTERFACE}",
        f"ip link set {INTERFACE} up",
        f"ip link set {INTERFACE}p up",
    ):
        subprocess.run(cmd.split(), check=True, capture_output=True, timeout=10)


def write_config(folder: Path, http_port: int, *, interface: str | None = INTERFACE) -> None:
    """The image's configuration in ``folder``, the HTTP API on ``http_port`` and, with
    ``interface``, ICE limited to it."""
    for f in CONFIG.glob("*.jcfg"):
        text = f.read_text().replace("port = 8088", f"port = {http_port}")
        if interface is not None:
            text = text.replace('ice_ignore_list = "vmnet"', f'ice_enforce_list = "{interface}"')
        (folder / f.name).write_text(text)


def stop_process(proc: subprocess.Popen[bytes], signal_first: int | None = None) -> None:
    """SIGTERM (or ``signal_first``), then SIGKILL after 10 s."""
    if signal_first is None:
        proc.terminate()
    else:
        proc.send_signal(signal_first)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def running(folder: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Janus with the configuration written in ``folder``, logging to ``folder/janus.log``;
    stopped on exit. When the block fails, the end of Janus's log goes to stderr: its side of
    the story."""
    log = folder / "janus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["janus", f"--config={folder / 'janus.jcfg'}", f"--configs-folder={folder}"],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    except BaseException:
        print("--- janus.log (end)\n" + log.read_text(errors="replace")[-3000:], file=sys.stderr)
        raise
    finally:
        stop_process(proc)


def wait_info(port: int, proc: subprocess.Popen[bytes], limit_s: float = 30) -> dict[str, Any]:
    """Janus's ``/janus/info`` once its HTTP API answers (blocking)."""
    import json

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"Janus exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/janus/info", timeout=2) as resp:
                info: dict[str, Any] = json.loads(resp.read())
                return info
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("Janus never answered its HTTP API")


async def wait_http(http: aiohttp.ClientSession, url: str,
                    proc: subprocess.Popen[bytes]) -> None:
    """Until ``url`` answers 200, for up to 30 s, or the process exits."""
    for _ in range(150):
        if proc.poll() is not None:
            raise RuntimeError("Janus exited")
        try:
            async with http.get(url) as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError("Janus never answered its HTTP API")


class JanusHttp:
    """The few calls of Janus's HTTP API that a VideoRoom publisher and an operator make."""

    def __init__(self, http: aiohttp.ClientSession, base: str) -> None:
        self.http = http
        self.base = base
        self.session: int | None = None

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        body = {**body, "transaction": secrets.token_hex(6)}
        async with self.http.post(self.base + path, json=body) as resp:
            answer: dict[str, Any] = await resp.json(content_type=None)
        if answer.get("janus") not in ("success", "ack"):
            raise RuntimeError(f"Janus refused {body}: {answer}")
        return answer

    async def create(self) -> None:
        self.session = (await self._post("", {"janus": "create"}))["data"]["id"]

    async def attach(self, plugin: str) -> int:
        answer = await self._post(f"/{self.session}", {"janus": "attach", "plugin": plugin})
        return int(answer["data"]["id"])

    async def message(self, handle: int, body: dict[str, Any],
                      jsep: dict[str, Any] | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"janus": "message", "body": body}
        if jsep is not None:
            message["jsep"] = jsep
        return await self._post(f"/{self.session}/{handle}", message)

    async def event(self, limit_s: float = 30) -> dict[str, Any]:
        """The next plugin event (long poll); keepalives and media notices are skipped."""
        async with asyncio.timeout(limit_s):
            for _ in range(100):
                async with self.http.get(f"{self.base}/{self.session}?maxev=1") as resp:
                    event: dict[str, Any] = await resp.json(content_type=None)
                if event.get("janus") == "event":
                    return event
        raise RuntimeError("no event from Janus")


async def publish_in_videoroom(api: JanusHttp, pc: Any, room: int = ROOM) -> tuple[int, int, str]:
    """Join ``room`` as a publisher and send ``pc``'s offer, which the caller has given its
    tracks and ICE addresses; returns the plugin handle, the publisher's id and Janus's answer
    SDP."""
    await api.create()
    handle = await api.attach("janus.plugin.videoroom")
    await api.message(handle, {"request": "join", "ptype": "publisher", "room": room,
                               "display": "renderer"})
    publisher_id = int((await api.event())["plugindata"]["data"]["id"])
    await pc.setLocalDescription(await pc.createOffer())
    await api.message(handle, {"request": "configure", "audio": True, "video": True},
                      # Every candidate is in the offer: Janus need wait for none.
                      jsep={"type": "offer", "sdp": pc.localDescription.sdp, "trickle": False})
    answer = await api.event()
    return handle, publisher_id, str(answer["jsep"]["sdp"])
