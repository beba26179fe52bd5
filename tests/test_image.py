"""The image the Dockerfile builds, built from this checkout and run with podman.

The container runs with host networking on a free port, as a deployment with
``--network host`` does. Checked: the user it runs as, its pages and metrics, a WHIP publisher
and two WHEP viewers through it (the viewers get the publisher's payloads byte for byte, and
the sync channel), captions kept on the volume for a new container, SIGTERM, and the
``HEALTHCHECK`` command.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from tests.conftest import ROOT, free_port
from tests.relay.peers import PatternVideo, ToneAudio, publish, view, wait_for
from tests.support import containers

# In the compose stack's lane (tests/test_compose.py): its sidecar publishes the ICE port range
# on the host, the range this image's container binds in.
pytestmark = [pytest.mark.needs("podman", "debootstrap", "runc"), pytest.mark.timeout(1200),
              pytest.mark.xdist_group("compose-file-host-ports")]

IMAGE = "localhost/sfu-sidecar:test"
TOKEN = "image-test-token"


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    started = time.monotonic()
    containers.ensure_base_images()
    base_s = time.monotonic() - started
    containers.build(ROOT, IMAGE)
    size = containers.inspect("image", IMAGE)["Size"]
    base = containers.inspect("image", containers.PYTHON)["Size"]
    # The stand-in Python base is Debian's python3 (larger than the official slim image): the
    # product's own layers are the difference.
    print(f"\nbase images {base_s:.0f} s, product image built in "
          f"{time.monotonic() - started - base_s:.0f} s: {size / 1e6:.0f} MB, of which "
          f"{(size - base) / 1e6:.0f} MB over its Python base")
    yield IMAGE


def settings_env(port: int, **extra: str) -> list[str]:
    env = {"SFU_SIDECAR_PORT": str(port), "SFU_SIDECAR_ICE_ADDRESSES": "127.0.0.1",
           "SFU_SIDECAR_PUBLISH_TOKEN": TOKEN, "SFU_SIDECAR_MAX_CPU_PERCENT": "1000", **extra}
    return [arg for k, v in env.items() for arg in ("-e", f"{k}={v}")]


async def healthy(base: str, limit_s: float = 30) -> None:
    async with aiohttp.ClientSession() as http:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            try:
                async with http.get(base + "/healthz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise AssertionError(f"{base} never became healthy")


def test_the_image_runs_the_installed_package_as_its_own_user(image: str) -> None:
    config = containers.inspect("image", image)["Config"]
    assert config["User"] == "sidecar"
    assert config["Entrypoint"] == ["sfu-sidecar"]
    name = f"sidecar-user-{secrets.token_hex(3)}"
    with containers.running(image, name, *settings_env(free_port())):
        uid = containers.podman("exec", name, "id", "-u", runtime=True).stdout.strip()
        assert uid == "10001", uid
        # No source tree: the package is the installed wheel, its pages inside it.
        where = containers.podman("exec", name, "python", "-c",
                                  "import sfu_sidecar.webfiles as w; print(w.WEB_DIR)",
                                  runtime=True).stdout.strip()
        assert "/site-packages/sfu_sidecar/web" in where, where


async def test_pages_metrics_and_a_publisher_to_two_viewers_through_the_container(
        image: str) -> None:
    port = free_port()
    name = f"sidecar-relay-{secrets.token_hex(3)}"
    base = f"http://127.0.0.1:{port}"
    with containers.running(image, name, *settings_env(port)):
        await healthy(base)
        async with aiohttp.ClientSession() as http:
            for path in ("/", "/publish", "/dashboard"):
                async with http.get(base + path) as resp:
                    assert resp.status == 200 and resp.content_type == "text/html", path
            async with http.get(base + "/metrics") as resp:
                assert resp.status == 200
                assert "sfu_sidecar_http_requests_total" in await resp.text()

            publisher = await publish(http, base, "through-image", video=PatternVideo(),
                                      audio=ToneAudio(), token=TOKEN)
            viewers = [await view(http, base, "through-image", data_channel="sync")
                       for _ in range(2)]
            messages = [0, 0]
            for i, v in enumerate(viewers):
                v.channel.on("message", lambda _m, i=i: messages.__setitem__(i, messages[i] + 1))
            try:
                await wait_for(lambda: all(len(v.received) >= 150 for v in viewers), 30,
                               "media at both viewers")
                await asyncio.sleep(1.0)
                sent = {bytes(p.payload) for p in publisher.sent}
                for v in viewers:
                    payloads = [bytes(p.payload) for p in v.received]
                    # The relay forwards payloads untouched: every one a viewer got was sent.
                    assert sum(p in sent for p in payloads) == len(payloads)
                # The sync channel: records for the frames, several a second.
                assert all(m >= 5 for m in messages), messages
            finally:
                for peer in (*viewers, publisher):
                    await peer.close()


async def test_captions_outlive_the_container_on_its_volume_and_sigterm_stops_it_cleanly(
        image: str) -> None:
    port = free_port()
    name = f"sidecar-volume-{secrets.token_hex(3)}"
    volume = f"sidecar-data-{secrets.token_hex(3)}"
    base = f"http://127.0.0.1:{port}"
    cue = {"timebase": "house_ns", "lang": "en",
           "cues": [{"id": "kept", "start": time.time_ns(), "end": time.time_ns() + 10**9,
                     "text": "still here after a restart"}]}
    try:
        with containers.running(image, name, "-v", f"{volume}:/data", *settings_env(port)):
            await healthy(base)
            async with aiohttp.ClientSession() as http, http.post(
                    base + "/api/streams/kept/captions", json=cue,
                    headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
                assert resp.status == 200, await resp.text()
            stopped = time.monotonic()
            await asyncio.to_thread(containers.podman, "stop", "-t", "20", name, runtime=True)
            stop_s = time.monotonic() - stopped
            state = containers.inspect("container", name)["State"]
            # SIGTERM, not the SIGKILL that follows the grace period: exit 0, well within it.
            assert state["ExitCode"] == 0, state
            assert stop_s < 15, stop_s

        # A new container on the same volume: only what the volume kept can be served.
        with containers.running(image, f"{name}-2", "-v", f"{volume}:/data",
                                *settings_env(port)):
            await healthy(base)
            async with aiohttp.ClientSession() as http, http.get(
                    base + "/api/streams/kept/captions?since=0") as resp:
                text = await resp.text()
            assert resp.status == 200 and "still here after a restart" in text, text

            # The HEALTHCHECK command, as the engine runs it, inside the container.
            check: Any = containers.inspect("image", image)["Healthcheck"]["Test"]
            assert check[0] == "CMD", check
            proc = await asyncio.to_thread(containers.podman, "exec", f"{name}-2", *check[1:],
                                           check=False, runtime=True)
            assert proc.returncode == 0, proc.stderr
    finally:
        containers.podman("volume", "rm", "-f", volume, check=False)
    print(f"\nSIGTERM to exit 0 in {stop_s:.1f} s")
