"""The caption store's file system full, and turned read-only, under a serving process.

Provoked for real in a private mount namespace: a 256 KiB tmpfs filled by a filler file, and
an ext4 image that the kernel turns read-only on an error (``errors=remount-ro``). Caption
ingest must answer 503 with a JSON reason and Retry-After (never a 500, never a crash), media
must keep flowing, and no acknowledged cue may be lost. A full disk recovers as soon as the
filler goes; a file system the kernel forced read-only cannot be made writable again while
files on it are open, so that one recovers through a restart on the repaired file system.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.captions.test_caption_durability import fetch_all
from tests.faults.procs import MountNamespace, PeerProcess, PrefixedServer
from tests.relay.peers import Peer, view, wait_for

pytestmark = [pytest.mark.needs("unshare", "nsenter", "mount"), pytest.mark.timeout(240)]

STREAM = "dur"  # the stream fetch_all (the durability tests' reader) reads back
TEXT = "x" * 400  # cues big enough that a few dozen fill what is left of the disk


@pytest.fixture
def namespace() -> Iterator[MountNamespace]:
    from tests.conftest import require

    require("unshare", "nsenter", root=True)
    ns = MountNamespace()
    try:
        yield ns
    finally:
        ns.close()


class Ledger:
    """Every cue the service acknowledged, with what it acknowledged."""

    def __init__(self) -> None:
        self.acked: dict[str, dict[str, Any]] = {}
        self.n = 0

    def batch(self, size: int) -> list[dict[str, Any]]:
        out = []
        for _ in range(size):
            self.n += 1
            out.append({"id": f"c{self.n}", "start": self.n * 0.5, "end": self.n * 0.5 + 0.4,
                        "text": f"{self.n} {TEXT}", "final": True})
        return out


async def post(http: aiohttp.ClientSession, base: str, ledger: Ledger,
               size: int = 5) -> tuple[int, dict[str, Any], dict[str, str]]:
    cues = ledger.batch(size)
    async with http.post(f"{base}/api/streams/{STREAM}/captions",
                         json={"timebase": "stream_s", "lang": "en", "cues": cues}) as resp:
        body = await resp.json()
        if resp.status == 200:
            for c in cues:
                ledger.acked[c["id"]] = c
        return resp.status, body, dict(resp.headers)


async def ingest_until_refused(http: aiohttp.ClientSession, base: str,
                               ledger: Ledger) -> tuple[dict[str, Any], dict[str, str]]:
    """Post until the store refuses; SQLite may still fit a few writes in pages it holds."""
    for _ in range(200):
        status, body, headers = await post(http, base, ledger)
        assert status in (200, 503), (status, body)
        if status == 503:
            return body, headers
    raise AssertionError("the store kept accepting cues on a full file system")


def assert_refusal(body: dict[str, Any], headers: dict[str, str]) -> None:
    assert "caption storage cannot write now" in body["error"], body
    assert int(headers["Retry-After"]) > 0


def assert_kept(ledger: Ledger, stored: dict[str, dict[str, Any]]) -> None:
    lost = [i for i in ledger.acked if i not in stored]
    assert not lost, f"{len(lost)} acknowledged cues lost, e.g. {lost[:5]}"
    for cue_id, cue in ledger.acked.items():
        assert stored[cue_id]["text"] == cue["text"]


@pytest.fixture
async def media(tmp_path: Path) -> AsyncIterator[Any]:
    """A publisher process and a viewer in this process, for a given server."""
    made: list[tuple[PeerProcess, Peer, aiohttp.ClientSession]] = []

    async def start(base: str) -> Peer:
        publisher = PeerProcess("publish", base, STREAM, tmp_path / "publisher.log")
        await publisher.wait_event("connected", 30)
        http = aiohttp.ClientSession()
        viewer = await view(http, base, STREAM, decode=False)
        made.append((publisher, viewer, http))
        await wait_for(lambda: len(viewer.received) > 50, 20, "media at the viewer")
        return viewer

    yield start
    for publisher, viewer, http in made:
        await viewer.close()
        await http.close()
        publisher.stop()


async def flowing(viewer: Peer) -> None:
    got = len(viewer.received)
    await wait_for(lambda: len(viewer.received) > got + 50, 10, "media still flowing")


def serve(ns: MountNamespace, data: Path, log: Path) -> PrefixedServer:
    server = PrefixedServer(
        ns.exec_prefix,
        ["--data-dir", str(data), "--ice-addresses", "127.0.0.1", "--log-level", "warning",
         "--max-cues-per-s", "100000"],
        log,
    )
    server.wait_ready(timeout=15)
    return server


async def test_full_disk_refuses_ingest_with_503_and_recovers_when_space_returns(
    namespace: MountNamespace, media: Any, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    namespace.run("mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(data))
    server = serve(namespace, data, tmp_path / "server.log")
    try:
        viewer = await media(server.base)
        ledger = Ledger()
        async with aiohttp.ClientSession() as http:
            for _ in range(5):
                assert (await post(http, server.base, ledger))[0] == 200
            # Fill what is left; dd ends with "No space left on device", as intended.
            filled = namespace.run("dd", "if=/dev/zero", f"of={data}/filler", "bs=4k",
                                   check=False)
            assert "No space left" in filled.stderr, filled.stderr
            body, headers = await ingest_until_refused(http, server.base, ledger)
            assert_refusal(body, headers)
            for _ in range(5):  # it stays refused, and says so the same way each time
                status, body, headers = await post(http, server.base, ledger)
                assert status == 503
                assert_refusal(body, headers)
            await flowing(viewer)
            assert server.proc.poll() is None
            async with http.get(f"{server.base}/healthz") as resp:
                assert resp.status == 200

            namespace.run("rm", f"{data}/filler")
            status, body, _ = await post(http, server.base, ledger)
            assert status == 200, body
            assert_kept(ledger, await fetch_all(server.base))
        # On disk, not only in memory: killed and restarted on the same file system.
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(timeout=10)
        again = serve(namespace, data, tmp_path / "server-again.log")
        try:
            assert_kept(ledger, await fetch_all(again.base))
        finally:
            again.stop()
        print(f"{len(ledger.acked)} cues acknowledged, all kept")
    finally:
        server.stop()


@pytest.mark.needs("mkfs.ext4", "e2fsck", "findmnt")
async def test_read_only_file_system_refuses_ingest_with_503_and_loses_nothing(
    namespace: MountNamespace, media: Any, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    image = tmp_path / "ext4.img"
    with image.open("wb") as f:
        f.truncate(16 * 1024 * 1024)
    namespace.run("mkfs.ext4", "-q", "-F", str(image))
    namespace.run("mount", "-o", "loop,errors=remount-ro", str(image), str(data))
    device = Path(namespace.run("findmnt", "-n", "-o", "SOURCE", str(data)).stdout.strip()).name
    server = serve(namespace, data, tmp_path / "server.log")
    try:
        viewer = await media(server.base)
        ledger = Ledger()
        async with aiohttp.ClientSession() as http:
            for _ in range(5):
                assert (await post(http, server.base, ledger))[0] == 200
            # What the kernel does on a failing disk: ext4 turns the mount read-only at once,
            # whatever files are open (a plain "remount,ro" is refused while they are).
            namespace.run("sh", "-c", f"echo fault test > /sys/fs/ext4/{device}/trigger_fs_error")
            mounts = namespace.run("findmnt", "-n", "-o", "OPTIONS", str(data)).stdout
            # Older kernels show "ro"; newer ones keep "rw" and add "emergency_ro".
            assert mounts.startswith("ro") or "emergency_ro" in mounts, mounts
            for _ in range(5):
                status, body, headers = await post(http, server.base, ledger)
                assert status == 503, body
                assert_refusal(body, headers)
            await flowing(viewer)
            assert server.proc.poll() is None
            assert_kept(ledger, await fetch_all(server.base))
        # The operator repairs the file system and restarts the service on it.
        assert server.stop() == 0, server.output()[-2000:]
        namespace.run("umount", str(data))
        namespace.run("e2fsck", "-f", "-y", str(image), check=False)
        namespace.run("mount", "-o", "loop", str(image), str(data))
        again = serve(namespace, data, tmp_path / "server-again.log")
        try:
            assert_kept(ledger, await fetch_all(again.base))
            async with aiohttp.ClientSession() as http:
                status, body, _ = await post(http, again.base, ledger)
                assert status == 200, body
        finally:
            again.stop()
        print(f"{len(ledger.acked)} cues acknowledged, all kept across the read-only fault")
    finally:
        server.stop()
