"""A push to a WHIP server nobody here wrote: Debian's simple-whip-server, in front of Janus.

``python -m tests.relay.whip_server_push_probe SECONDS`` runs, inside a network namespace of
its own (``unshare -n``, set up as ``tests.relay.janus_tap_probe`` does, whose Janus harness
it uses): Janus with the deployment image's configuration plus its WebSocket transport (which
simple-whip-server drives), simple-whip-server with one endpoint mapped to the VideoRoom, the
service in this process, an aiortc publisher (WHIP) to the service, and a push (``POST
/api/pushes``) of that stream to the endpoint. An aiortc subscriber of the VideoRoom watches
what the push delivers through Janus for SECONDS; then simple-whip-server is SIGKILLed, Janus
drops the publisher it made, the server comes back, and the push must reconnect by itself for
a second subscriber to watch again; last the push is deleted, which must end the session on
the server. It prints one JSON line of figures.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer
from aiortc import MediaStreamTrack, RTCSessionDescription

from sfu_sidecar.app import build_app
from sfu_sidecar.config import load_settings
from sfu_sidecar.relay import aiortc_adapter
from tests.conftest import IN_PROCESS, ROOT, SIMPLE_WHIP_SERVER
from tests.relay.janus_tap_probe import decode_for
from tests.relay.peers import PatternVideo, ToneAudio, client_pc, publish, wait_for
from tests.support import janus

WHIP_PORT = 17080  # the namespace is private: no other process can hold it
JANUS_WS_PORT = 18188
WHIP_BASE = f"http://127.0.0.1:{WHIP_PORT}/whip"
ENDPOINT = "sidecar"
TOKEN = "push-secret"
STREAM = "pushed"

WEBSOCKETS_CONFIG = f"""general: {{
	ws = true
	ws_port = {JANUS_WS_PORT}
	ws_ip = "127.0.0.1"
	wss = false
}}
admin: {{
	admin_ws = false
	admin_wss = false
}}
"""

SERVER_CONFIG = f"""module.exports = {{
	janus: {{ address: 'ws://127.0.0.1:{JANUS_WS_PORT}' }},
	port: {WHIP_PORT},
	rest: '/whip',
	allowTrickle: true,
	strictETags: false,
	iceServers: []
}};
"""


def configure(workdir: Path) -> Path:
    """Janus's configuration with the WebSocket transport on; simple-whip-server's sources
    beside a configuration of their own. Returns the server's folder."""
    janus.write_config(workdir, janus.HTTP_PORT)
    main = workdir / "janus.jcfg"
    main.write_text(main.read_text().replace(",libjanus_websockets.so", ""))
    (workdir / "janus.transport.websockets.jcfg").write_text(WEBSOCKETS_CONFIG)
    server = workdir / "whip-server"
    server.mkdir()
    for name in ("server.js", "whip-janus.js"):
        shutil.copy(SIMPLE_WHIP_SERVER.parent / name, server / name)
    (server / "config.js").write_text(SERVER_CONFIG)
    return server


def start_server(folder: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "NODE_PATH": str(ROOT / "node_modules")}  # its pinned modules
    with log.open("ab") as out:
        return subprocess.Popen(["node", "server.js"], cwd=folder, env=env, stdout=out,
                                stderr=subprocess.STDOUT)


async def wait_server(http: aiohttp.ClientSession, proc: subprocess.Popen[bytes]) -> None:
    """Until simple-whip-server answers (it listens once it is connected to Janus)."""
    for _ in range(150):
        if proc.poll() is not None:
            raise RuntimeError("simple-whip-server exited")
        try:
            async with http.get(f"{WHIP_BASE}/endpoints") as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError("simple-whip-server never answered")


async def create_endpoint(http: aiohttp.ClientSession) -> int:
    async with http.post(f"{WHIP_BASE}/create", json={
            "id": ENDPOINT, "room": janus.ROOM, "token": TOKEN, "label": "sidecar push"}) as resp:
        return resp.status


async def endpoint_enabled(http: aiohttp.ClientSession) -> bool:
    async with http.get(f"{WHIP_BASE}/endpoints") as resp:
        endpoints = await resp.json(content_type=None)
    return any(e["id"] == ENDPOINT and e["enabled"] for e in endpoints)


async def push_status(http: aiohttp.ClientSession, base: str, push_id: str) -> dict[str, Any]:
    async with http.get(f"{base}/api/pushes/{push_id}") as resp:
        status: dict[str, Any] = await resp.json()
    return status


async def watch_room(http: aiohttp.ClientSession, seconds: float) -> dict[str, Any]:
    """Subscribe to the room's publisher over Janus's HTTP API and decode its video."""
    api = janus.JanusHttp(http, f"http://127.0.0.1:{janus.HTTP_PORT}/janus")
    await api.create()
    handle = await api.attach("janus.plugin.videoroom")
    listed = await api.message(handle, {"request": "listparticipants", "room": janus.ROOM})
    publishers = [p for p in listed["plugindata"]["data"]["participants"] if p.get("publisher")]
    assert len(publishers) == 1, publishers
    await api.message(handle, {"request": "join", "ptype": "subscriber", "room": janus.ROOM,
                               "streams": [{"feed": publishers[0]["id"]}]})
    offer = await api.event()
    pc = client_pc()
    tracks: dict[str, MediaStreamTrack] = {}

    @pc.on("track")
    def on_track(track: MediaStreamTrack) -> None:
        tracks[track.kind] = track

    aiortc_adapter.install_ice(pc, (janus.ADDRESS,), None)
    await pc.setRemoteDescription(RTCSessionDescription(offer["jsep"]["sdp"], "offer"))
    await pc.setLocalDescription(await pc.createAnswer())
    await api.message(handle, {"request": "start"},
                      jsep={"type": "answer", "sdp": pc.localDescription.sdp, "trickle": False})
    try:
        await wait_for(lambda: "video" in tracks, 20, "the subscriber's video track")
        offered = offer["jsep"]["sdp"]
        return {
            "display": publishers[0].get("display"),
            "extensions": sorted(set(re.findall(r"a=extmap:\d+ (\S+)", offered))),
            "frames_decoded": await decode_for(tracks["video"], seconds),
        }
    finally:
        await pc.close()


async def run(seconds: float, workdir: Path, server_folder: Path,
              janus_proc: subprocess.Popen[bytes], result: dict[str, Any]) -> None:
    settings = load_settings({**IN_PROCESS, "host": "127.0.0.1",
                              # a candidate on Janus's address too (see janus_tap_probe)
                              "ice_addresses": f"127.0.0.1,{janus.ADDRESS}",
                              "data_dir": str(workdir / "data")})
    app = build_app(settings)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    base = f"http://127.0.0.1:{server.port}"
    log = workdir / "whip-server.log"
    whip = start_server(server_folder, log)
    publisher = None
    try:
        async with aiohttp.ClientSession() as http:
            await janus.wait_http(http, f"http://127.0.0.1:{janus.HTTP_PORT}/janus/info",
                                  janus_proc)
            await wait_server(http, whip)
            result["create_status"] = await create_endpoint(http)
            publisher = await publish(http, base, STREAM, video=PatternVideo(),
                                      audio=ToneAudio())
            await wait_for(lambda: publisher is not None
                           and publisher.pc.connectionState == "connected", 20, "publisher")
            async with http.post(f"{base}/api/pushes", json={
                    "stream": STREAM, "url": f"{WHIP_BASE}/endpoint/{ENDPOINT}",
                    "token": TOKEN}) as resp:
                result["push_post_status"] = resp.status
                push = await resp.json()
            started = time.monotonic()
            while (status := await push_status(http, base, push["id"]))["state"] != "connected":
                assert time.monotonic() - started < 30, status
                await asyncio.sleep(0.1)
            result["push_connect_s"] = round(time.monotonic() - started, 2)
            result["push_connected"] = status
            result["endpoint_enabled"] = await endpoint_enabled(http)
            result["first_watch"] = await watch_room(http, seconds)
            # A sidecar push has no clock to join on this server.
            result["push_after_watch"] = await push_status(http, base, push["id"])

            # The server dies: Janus drops the publisher it made for the push, whose session
            # ends; the push retries until the server is back with its endpoint.
            whip.send_signal(signal.SIGKILL)
            whip.wait()
            killed = time.monotonic()
            states: list[str] = []
            while (state := (await push_status(http, base, push["id"]))["state"]) == "connected":
                assert time.monotonic() - killed < 60, "the push never noticed"
                await asyncio.sleep(0.1)
            result["push_noticed_s"] = round(time.monotonic() - killed, 2)
            states.append(state)
            await asyncio.sleep(1.0)
            whip = start_server(server_folder, log)
            await wait_server(http, whip)
            result["recreate_status"] = await create_endpoint(http)
            back = time.monotonic()
            while (status := await push_status(http, base, push["id"]))["state"] != "connected":
                if status["state"] not in states:
                    states.append(status["state"])
                assert time.monotonic() - back < 45, status
                await asyncio.sleep(0.1)
            result["push_reconnect_s"] = round(time.monotonic() - back, 2)
            result["push_states_while_away"] = states
            result["push_reconnected"] = status
            result["second_watch"] = await watch_room(http, seconds)

            async with http.delete(f"{base}/api/pushes/{push['id']}") as resp:
                result["push_delete_status"] = resp.status
            deleted = time.monotonic()
            while await endpoint_enabled(http):
                assert time.monotonic() - deleted < 10, "the server still has the session"
                await asyncio.sleep(0.05)
            result["endpoint_released_s"] = round(time.monotonic() - deleted, 2)
    finally:
        if publisher is not None:
            await publisher.pc.close()
        await server.close()
        janus.stop_process(whip)
        if "endpoint_released_s" not in result:  # it failed: the servers' side of the story
            print(log.read_text()[-3000:], file=sys.stderr)


def main() -> int:
    seconds = float(sys.argv[1])
    janus.setup_namespace()
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="whip-push-") as tmp:
        workdir = Path(tmp)
        server_folder = configure(workdir)
        with janus.running(workdir) as proc:
            asyncio.run(run(seconds, workdir, server_folder, proc, result))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
