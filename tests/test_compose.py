"""docker-compose.yml brought up for real with podman-compose: the sidecar beside Janus and
coturn, with the ptp-lab grandmaster.

The images are the compose file's own, built from this checkout (``tests/support/containers.py``;
coturn's is a stand-in from Debian's package). The services run on the project's bridge network
with their ports published as the file says; ``PUBLIC_IP`` is that network's gateway, an address
of this machine that the host and every container reach. Checked:

- every service comes up: the sidecar's ``/healthz``, Janus's HTTP API, coturn, the grandmaster;
- an aiortc publisher in Janus's VideoRoom, ``rtp_forward`` to a tap on the sidecar, and a
  viewer of the sidecar: every decoded frame's capture time within a frame of the publisher's
  true capture instant, and captions on the frames captured in their interval;
- coturn comes up with the credentials the sidecar hands its clients, and a viewer allowed
  relay candidates only (a network that lets nothing but TURN through) gets the media;
- the grandmaster locks the sidecar's house clock over PTP;
- ``down`` leaves no container, and the test removes the network and volume it made.

podman-compose is the test extra's pinned release (Debian's 1.0.3 cannot run a service with
``network_mode: host``, as coturn is); the test starts the ``ptp-lab`` profile too.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aioice import turn
from aiortc import (
    RTCConfiguration,
    RTCIceServer,
    RTCIceTransportPolicy,
    RTCSessionDescription,
)

from sfu_sidecar.relay import aiortc_adapter
from sfu_sidecar.sync.wire import Cue, Epoch
from sfu_sidecar.synthetic import BeepAudioTrack, FlashVideoTrack, Timeline
from tests.conftest import ROOT
from tests.relay.peers import client_pc, frames, view, wait_for
from tests.relay.test_cascade import caption_errors
from tests.support import containers
from tests.support.janus import JanusHttp, publish_in_videoroom
from tests.syncchannel.test_service import _mid, collect, decoded_frames

# One lane with the image tests and the coturn test of tests/test_deploy.py: the stack
# publishes the compose file's ICE and TURN relay port ranges on the host, where the image's
# container and that test's coturn bind in the same ranges.
pytestmark = [pytest.mark.needs("podman", "debootstrap", "runc"),
              pytest.mark.timeout(1200), pytest.mark.xdist_group("compose-file-host-ports")]

# The test extra's release, run by this interpreter (no PATH lookup).
PODMAN_COMPOSE = (sys.executable, "-m", "podman_compose")
TOKEN = "compose-publish-token"
ROOM = 1234
VIDEO_PT, AUDIO_PT = 100, 111
FRAME_NS = 1_000_000_000 // 30


@dataclass
class Stack:
    project: str
    gateway: str
    env: dict[str, str]
    turn_password: str
    sidecar = "http://127.0.0.1:8080"
    janus = "http://127.0.0.1:8088/janus"

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [*PODMAN_COMPOSE, "--in-pod", "false", "--profile", "ptp-lab", "-p", self.project,
             "-f", str(ROOT / "docker-compose.yml"), *args],
            capture_output=True, text=True, timeout=timeout, env=self.env, cwd=ROOT)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def address(self, service: str) -> str:
        networks = containers.inspect("container", self.container(service))[
            "NetworkSettings"]["Networks"]
        return str(next(iter(networks.values()))["IPAddress"])

    def left(self) -> list[str]:
        out = containers.podman("ps", "-a", "--format", "{{.Names}}", "--filter",
                                f"label=io.podman.compose.project={self.project}").stdout
        return out.split()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    started = time.monotonic()
    containers.ensure_compose_images(ROOT)
    images_s = time.monotonic() - started
    folder = tmp_path_factory.mktemp("compose")
    octet = random.randrange(100, 200)
    gateway = f"10.89.{octet}.1"
    password = secrets.token_hex(8)
    project = f"sfuc{secrets.token_hex(3)}"
    env = {**os.environ, "CONTAINERS_CONF": str(containers.engine_conf(folder)),
           "PUBLIC_IP": gateway, "TURN_PASSWORD": password,
           "SFU_SIDECAR_PUBLISH_TOKEN": TOKEN, "SFU_SIDECAR_PTP_INTERFACE": "eth0"}
    # The network podman-compose would make, made here with a known gateway for PUBLIC_IP.
    containers.podman("network", "create", "--subnet", f"10.89.{octet}.0/24", "--gateway",
                      gateway, "--label", f"io.podman.compose.project={project}",
                      f"{project}_default")
    s = Stack(project, gateway, env, password)
    try:
        s.compose("up", "-d", "--no-build")
        print(f"\nimages ready in {images_s:.0f} s, stack up in "
              f"{time.monotonic() - started - images_s:.0f} s")
        yield s
    finally:
        subprocess.run([*PODMAN_COMPOSE, "--in-pod", "false", "--profile", "ptp-lab", "-p",
                        project, "-f", str(ROOT / "docker-compose.yml"), "down"],
                       capture_output=True, timeout=300, env=env, cwd=ROOT)
        for name in s.left():
            containers.podman("rm", "-f", "-v", name, check=False, runtime=True)
        containers.podman("network", "rm", "-f", f"{project}_default", check=False)
        containers.podman("volume", "rm", "-f", f"{project}_sidecar-data", check=False)


async def get_json(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url) as resp:
        assert resp.status == 200, (url, resp.status)
        return await resp.json()


async def until_ok(http: aiohttp.ClientSession, url: str, limit_s: float = 60) -> float:
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        try:
            async with http.get(url) as resp:
                if resp.status == 200:
                    return time.monotonic() - started
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.25)
    raise AssertionError(f"{url} never answered")


async def test_every_service_comes_up(stack: Stack) -> None:
    async with aiohttp.ClientSession() as http:
        await until_ok(http, stack.sidecar + "/healthz")
        await until_ok(http, stack.janus + "/info")
    assert sorted(stack.left()) == sorted(
        stack.container(s) for s in ("sidecar", "janus", "coturn", "ptp4l"))
    states = {name: containers.inspect("container", name)["State"]["Status"]
              for name in stack.left()}
    assert set(states.values()) == {"running"}, states
    # coturn grants the credentials the sidecar hands its clients (Link headers, RFC 9725) a
    # relay on PUBLIC_IP, in the published relay range.
    async with aiohttp.ClientSession() as http, http.options(
            stack.sidecar + "/whep/anything") as resp:
        links = resp.headers.getall("Link", [])
    (link,) = [x for x in links if x.startswith("<turn:")]
    fields = dict(re.findall(r'(\w+)="([^"]*)"', link))
    url = link[1:link.index(">")]
    assert url == f"turn:{stack.gateway}:3478?transport=udp", link
    transport, _ = await asyncio.wait_for(turn.create_turn_endpoint(
        asyncio.DatagramProtocol, server_addr=(stack.gateway, 3478),
        username=fields["username"], password=fields["credential"]), 10)
    try:
        host, port = transport.get_extra_info("sockname")
    finally:
        transport.close()
    assert host == stack.gateway and 49160 <= port <= 49199, (host, port)
    assert containers.inspect("container", stack.container("sidecar"))["Config"]["User"] \
        == "sidecar"


async def test_janus_forwards_to_a_sidecar_tap_and_its_viewer_sees_captions_on_their_frames(
        stack: Stack) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    pc = client_pc()
    async with aiohttp.ClientSession() as http:
        await until_ok(http, stack.sidecar + "/healthz")
        await until_ok(http, stack.janus + "/info")
        api = JanusHttp(http, stack.janus)
        timeline = Timeline.starting_now(time.time_ns)
        video = FlashVideoTrack(timeline)
        pc.addTransceiver(BeepAudioTrack(timeline), direction="sendonly")
        pc.addTransceiver(video, direction="sendonly")
        aiortc_adapter.install_ice(pc, (stack.gateway,), None)
        try:
            handle, publisher_id, sdp = await publish_in_videoroom(api, pc, ROOM)
            await pc.setRemoteDescription(RTCSessionDescription(sdp, "answer"))
            await wait_for(lambda: pc.connectionState == "connected", 30, "Janus connected")

            async with http.post(stack.sidecar + "/api/taps", headers=auth, json={
                    "stream": "janus", "media": [
                        {"kind": "video", "codec": "vp8", "payload_type": VIDEO_PT},
                        {"kind": "audio", "codec": "opus", "payload_type": AUDIO_PT}]}) as resp:
                tap = await resp.json()
                assert resp.status == 201, tap
            tap_video, tap_audio = tap["media"]
            mids = {t.kind: t.mid for t in pc.getTransceivers()}
            # Janus reaches the tap at the sidecar's address on the compose network.
            forwarded = await api.message(handle, {
                "request": "rtp_forward", "room": ROOM, "publisher_id": publisher_id,
                "host": stack.address("sidecar"), "host_family": "ipv4", "streams": [
                    {"mid": mids["video"], "port": tap_video["rtp_port"], "pt": VIDEO_PT,
                     "rtcp_port": tap_video["rtcp_port"]},
                    {"mid": mids["audio"], "port": tap_audio["rtp_port"], "pt": AUDIO_PT}]})
            assert len(forwarded["plugindata"]["data"]["forwarders"]) == 2

            viewer = await view(http, stack.sidecar, "janus", data_channel="sync",
                                ice_addresses=(stack.gateway,))
            records = collect(viewer)
            try:
                await wait_for(lambda: "video" in viewer.tracks, 20, "the viewer's video")
                first = await decoded_frames(viewer, 15)
                track = records.track_for(_mid(viewer, "video"))
                await wait_for(lambda: records.frame(track, first[-1][1]) is not None, 5,
                               "the first frames' records")
                ids, cues = [], []
                now = time.time_ns()
                for i in range(4):
                    start = now + 500_000_000 + i * 600_000_000 + i * 7_000_000
                    cues.append((start, start + 400_000_000))
                    ids.append(f"c{i}")
                    async with http.post(
                            f"{stack.sidecar}/api/streams/janus/captions", headers=auth,
                            json={"timebase": "house_ns", "lang": "en", "cues": [
                                {"id": ids[-1], "start": start, "end": start + 400_000_000,
                                 "text": f"cue {i}"}]}) as resp:
                        assert resp.status == 200, await resp.text()
                # Frames past the last cue's end (2.7 s from the first cue's posting).
                frames = await decoded_frames(viewer, 120)
                await wait_for(lambda: records.frame(track, frames[-1][1]) is not None, 5,
                               "the last frame's record")
            finally:
                await viewer.close()
        finally:
            await pc.close()
    pairs = []
    for number, rtp_ts in first + frames:
        found = records.frame(track, rtp_ts)
        if found is not None:
            pairs.append((found[0], video.capture_log[number]))
    assert len(pairs) >= 0.9 * len(first + frames), (len(pairs), len(first + frames))
    # Janus sends no sender reports on a forward: capture times are estimated from arrival,
    # late by Janus's and the tap's delay.
    late = sorted(mapped - true for mapped, true in pairs)
    median, p95 = statistics.median(late), late[int(0.95 * (len(late) - 1))]
    epochs = [c.epoch_ns for c in records.controls if isinstance(c, Epoch)]
    pushed = {c.id: c for c in records.controls if isinstance(c, Cue)}
    assert epochs and set(ids) <= set(pushed), (epochs, sorted(pushed))
    errors = caption_errors(cues, epochs[-1], pushed, ids, [(m, t) for m, t in pairs[15:]])
    print(f"compose: {len(pairs)} frames, capture time late by median {median / 1e6:.1f} ms, "
          f"p95 {p95 / 1e6:.1f} ms; caption errors ms {[round(e / 1e6, 1) for e in errors]}")
    assert 0 <= median <= FRAME_NS / 2 and p95 <= FRAME_NS, (median, p95)
    # Each cue first shown on a frame truly captured within a frame of its start.
    assert len(errors) == len(ids) and all(-FRAME_NS <= e <= FRAME_NS for e in errors), errors


async def test_a_viewer_limited_to_coturn_relays_gets_the_media(stack: Stack) -> None:
    """A viewer whose network lets nothing through but TURN (relay candidates only) reaches the
    sidecar through the stack's coturn, with the credentials the sidecar hands out."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    timeline = Timeline.starting_now(time.time_ns)
    publisher = client_pc()
    publisher.addTransceiver(BeepAudioTrack(timeline), direction="sendonly")
    publisher.addTransceiver(FlashVideoTrack(timeline), direction="sendonly")
    aiortc_adapter.install_ice(publisher, (stack.gateway,), None)
    async with aiohttp.ClientSession() as http:
        await until_ok(http, stack.sidecar + "/healthz")
        try:
            await publisher.setLocalDescription(await publisher.createOffer())
            async with http.post(stack.sidecar + "/whip/turned",
                                 data=publisher.localDescription.sdp,
                                 headers={**auth, "Content-Type": "application/sdp"}) as resp:
                answer = await resp.text()
                assert resp.status == 201, answer
                links = resp.headers.getall("Link", [])
            await publisher.setRemoteDescription(RTCSessionDescription(answer, "answer"))
            (link,) = [x for x in links if x.startswith("<turn:")]
            fields = dict(re.findall(r'(\w+)="([^"]*)"', link))
            relay_only = RTCConfiguration(
                iceServers=[RTCIceServer(link[1:link.index(">")], fields["username"],
                                         fields["credential"])],
                iceTransportPolicy=RTCIceTransportPolicy.RELAY)
            viewer = await view(http, stack.sidecar, "turned", ice_addresses=None,
                                configuration=relay_only)
            try:
                await wait_for(lambda: "video" in viewer.tracks, 30, "the viewer's video")
                decoded = await frames(viewer.tracks["video"], 30, 20)
                pairs = aiortc_adapter.selected_candidates(viewer.pc)
            finally:
                await viewer.close()
        finally:
            await publisher.close()
    print(f"through coturn: {len(decoded)} frames decoded over {pairs}")
    assert len(decoded) == 30
    # One bundled transport, sending from a relay coturn allocated on PUBLIC_IP.
    assert [p[:2] for p in pairs] == [("relay", stack.gateway)], pairs


async def test_the_ptp_lab_grandmaster_locks_the_sidecars_house_clock(stack: Stack) -> None:
    async with aiohttp.ClientSession() as http:
        deadline = time.monotonic() + 90
        status: Any = None
        while time.monotonic() < deadline:
            status = await get_json(http, stack.sidecar + "/api/clock")
            if status.get("source") == "ptp" and status.get("state") == "locked":
                break
            await asyncio.sleep(1)
    assert status is not None and status.get("source") == "ptp" \
        and status.get("state") == "locked", status
    print(f"house clock: {status}")


def test_down_leaves_nothing_running(stack: Stack) -> None:
    stack.compose("down")
    assert stack.left() == []
