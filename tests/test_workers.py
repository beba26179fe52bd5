"""``sfu-sidecar serve --workers 2``: one port, two relay processes, a real supervisor.

A publisher lands on its stream's home worker; viewers are spread over both workers, the other
worker pulling the stream over loopback, and every viewer's frames map to their true capture
times. Captions ingested through the one port reach viewers on both workers. A worker killed
is started again; the client's address reaches the workers only through the supervisor.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509
from prometheus_client.parser import text_string_to_metric_families

from sfu_sidecar.sync.wire import Cue
from sfu_sidecar.workers import home_index
from tests.conftest import ServerProcess
from tests.relay.peers import view, wait_for
from tests.relay.test_cascade import capture_errors, post_cue
from tests.syncchannel.test_service import _mid, collect, decoded_frames, start_publisher

pytestmark = pytest.mark.timeout(150)


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(["--workers", "2", "--data-dir", str(tmp_path),
                            "--ice-addresses", "127.0.0.1", "--max-cpu-percent", "1000",
                            "--log-level", "warning"])
    lines: list[str] = []

    def drain() -> None:
        assert server.proc.stdout is not None
        for line in server.proc.stdout:
            lines.append(line.decode(errors="replace"))

    threading.Thread(target=drain, daemon=True).start()
    try:
        server.wait_ready(30)
        yield server
    finally:
        server.stop()


async def get_json(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def test_viewers_spread_over_workers_with_exact_capture_times_and_captions(
    supervisor: ServerProcess,
) -> None:
    base = supervisor.base
    stream = "spread"
    publisher, video, _ = await start_publisher(base, stream, stamp=True)
    async with aiohttp.ClientSession() as http:
        viewers, records = [], []
        for _ in range(4):  # each channel's handler attached before its first message
            # As a browser's WHEP client does: OPTIONS first, which must not count as a viewer.
            async with http.options(f"{base}/whep/{stream}") as resp:
                assert resp.status in (200, 204), await resp.text()
            viewers.append(await view(http, base, stream, data_channel="sync"))
            records.append(collect(viewers[-1]))
        try:
            assert await publisher.joined() is not None
            workers = (await get_json(http, f"{base}/api/workers"))["workers"]
            home = home_index(stream, 2)
            # Two viewers each; the home worker also serves the other worker's pull.
            counts = {w["index"]: w["viewers"] for w in workers}
            assert counts == {home: 3, 1 - home: 2}, workers
            doc = await get_json(http, f"{base}/workers/{1 - home}/api/streams/{stream}")
            assert doc["publisher"]["upstream"] == \
                f"http://127.0.0.1:{workers[home]['port']}/whep/{stream}"
            for viewer, rec in zip(viewers, records, strict=True):
                frames = await decoded_frames(viewer, 40)
                track = rec.track_for(_mid(viewer, "video"))
                await wait_for(lambda r=rec, t=track, f=frames: r.frame(t, f[-1][1]) is not None,
                               3, "the record of the last decoded frame")
                # Frames queued before the viewer's sync channel opened have no records, and
                # those before the publisher's clock join landed are flagged estimated (the
                # four viewers connect one after another, the first decoding from the start);
                # every frame from the first exact one on must map exactly. The join lands
                # within a second of frames (a loaded fresh-clone run needed 21).
                first = next(i for i, (_, ts) in enumerate(frames)
                             if (found := rec.frame(track, ts)) is not None and not found[2])
                assert first <= 30, first
                errors, unmapped, estimated = capture_errors(rec, viewer, video, frames[first:])
                assert unmapped == 0 and estimated == 0, (unmapped, estimated)
                assert max(errors) <= 1_000_000, sorted(errors)[-3:]

            now = time.time_ns()
            await post_cue(http, base, stream, "w1", now + 200_000_000, now + 900_000_000)
            await wait_for(lambda: all(any(isinstance(c, Cue) and c.id == "w1"
                                           for c in r.controls) for r in records),
                           5, "the cue pushed to viewers on both workers")
        finally:
            for viewer in viewers:
                await viewer.close()
            await publisher.close()


async def test_a_killed_worker_is_started_again(supervisor: ServerProcess) -> None:
    base = supervisor.base
    async with aiohttp.ClientSession() as http:
        workers = (await get_json(http, f"{base}/api/workers"))["workers"]
        os.kill(workers[1]["pid"], signal.SIGKILL)

        async def restarted() -> bool:
            now = (await get_json(http, f"{base}/api/workers"))["workers"][1]
            return bool(now["alive"] and now["restarts"] == 1 and now["pid"] != workers[1]["pid"])

        for _ in range(100):
            if await restarted():
                break
            await asyncio.sleep(0.1)
        assert await restarted()
        async with http.get(f"{base}/healthz") as resp:
            assert resp.status == 200
        # Both workers take viewers again.
        viewers = [await view(http, base, "after", kinds=("video",)) for _ in range(2)]
        try:
            counts = [w["viewers"] for w in (await get_json(http, f"{base}/api/workers"))
                      ["workers"]]
            home = home_index("after", 2)
            assert counts[1 - home] == 1 and counts[home] == 2, counts  # + the sibling's pull
        finally:
            for viewer in viewers:
                await viewer.close()


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def _proxy_key(pid: int) -> str:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return next(e.split(b"=", 1)[1].decode() for e in environ
                if e.startswith(b"SFU_SIDECAR_PROXY_KEY="))


async def test_workers_see_the_client_address_only_from_the_supervisor(
    supervisor: ServerProcess,
) -> None:
    base = supervisor.base
    async with aiohttp.ClientSession() as http:
        worker = (await get_json(http, f"{base}/api/workers"))["workers"][0]
        direct = f"http://127.0.0.1:{worker['port']}"
        body = {"timebase": "house_ns", "lang": "en",
                "cues": [{"id": "x", "start": time.time_ns(), "end": time.time_ns() + 10**9,
                          "text": "x"}]}
        forged = {"Sidecar-Client": "203.0.113.9"}
        # A client cannot pose as another address: the supervisor replaces the header, and a
        # worker ignores it without the supervisor's key.
        async with http.post(f"{base}/api/streams/a/captions", json=body,
                             headers=forged) as resp:
            assert resp.status == 200, await resp.text()
        async with http.post(f"{direct}/api/streams/a/captions", json=body,
                             headers={**forged, "Sidecar-Proxy-Key": "wrong"}) as resp:
            assert resp.status == 200, await resp.text()
        # With the key, the named client is the one the rules see: ingest without a token is
        # for this host only, and 203.0.113.9 is not it.
        key = _proxy_key(worker["pid"])
        async with http.post(f"{direct}/api/streams/a/captions", json=body,
                             headers={**forged, "Sidecar-Proxy-Key": key}) as resp:
            assert resp.status == 403, await resp.text()


def test_workers_get_the_serve_arguments_without_workers() -> None:
    from sfu_sidecar.cli import without_workers

    assert without_workers(["--workers", "2", "--port", "80", "--workers=3", "--log-level",
                            "info"]) == ["--port", "80", "--log-level", "info"]


def test_workers_with_ptp_or_none_are_refused_with_a_reason() -> None:
    from sfu_sidecar.cli import main

    assert main(["serve", "--workers", "2", "--ptp-interface", "eth0"], env={}) == 2
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--workers", "0"], env={})
    assert exited.value.code == 2


def test_streams_have_one_home_spread_over_the_workers() -> None:
    homes = [home_index(f"stream-{i}", 4) for i in range(400)]
    assert homes == [home_index(f"stream-{i}", 4) for i in range(400)]
    assert all(60 <= homes.count(w) <= 140 for w in range(4)), [homes.count(w) for w in range(4)]


async def test_the_supervisor_refuses_what_a_worker_would(supervisor: ServerProcess) -> None:
    base = supervisor.base
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/whep/x", data=b"v" * 300_000,
                             headers={"Content-Type": "application/sdp"}) as resp:
            assert resp.status == 413, await resp.text()
        async with http.delete(f"{base}/whep/x/{'0' * 32}") as resp:
            assert resp.status == 404 and "no resource" in await resp.text()
        async with http.get(f"{base}/workers/7/healthz") as resp:
            assert resp.status == 404
        async with http.post(f"{base}/whep/x", data="v=0",
                             headers={"Content-Type": "application/sdp"}) as resp:
            assert resp.status == 400  # the worker's own reason, passed on


async def test_websockets_pass_through_the_supervisor(supervisor: ServerProcess) -> None:
    """The house clock's and the caption producer's WebSockets, with the clients' own
    handshake (permessage-deflate offered), reach the workers through the one port: an edge or
    a machine pulling from this one joins its clock this way."""
    from sfu_sidecar.client.captions import CaptionPublisher
    from sfu_sidecar.client.clock import join_clock

    for encoding in ("msgpack", "json"):
        clock = await join_clock(supervisor.base, encoding=encoding)
        # Supervisor and workers read this host's clock: the true offset is 0.
        assert abs(clock.offset_ns) <= clock.error_ns, clock
    stream = "wsthrough"
    async with CaptionPublisher(supervisor.base, stream) as pub:
        assert await pub.send("en", [{"id": "c1", "start": 0.0, "end": 1.0,
                                      "text": "through"}]) == ["c1"]
    async with aiohttp.ClientSession() as http:
        doc = await get_json(http, f"{supervisor.base}/api/streams/{stream}/captions")
    assert [c["text"] for c in doc["cues"]] == ["through"]


async def test_workers_as_an_edge_pull_through_their_home_worker(tmp_path: Path) -> None:
    from tests.relay.test_cascade import Node

    origin = Node(tmp_path / "origin", node_id="origin")
    origin.start()
    edge = ServerProcess(["--workers", "2", "--data-dir", str(tmp_path / "edge"),
                          "--ice-addresses", "127.0.0.1", "--max-cpu-percent", "1000",
                          "--origin-url", origin.base, "--log-level", "warning"])
    publisher = None
    try:
        edge.wait_ready(30)
        publisher, video, _ = await start_publisher(origin.base, "far", stamp=True)
        async with aiohttp.ClientSession() as http:
            viewers, all_records = [], []
            for _ in range(2):
                viewers.append(await view(http, edge.base, "far", data_channel="sync"))
                all_records.append(collect(viewers[-1]))
            try:
                for viewer, records in zip(viewers, all_records, strict=True):
                    frames = await decoded_frames(viewer, 40)
                    track = records.track_for(_mid(viewer, "video"))
                    await wait_for(lambda r=records, t=track, f=frames:
                                   r.frame(t, f[-1][1]) is not None, 3, "records")
                    mapped = [(n, ts) for n, ts in frames if records.frame(track, ts)]
                    errors, _, estimated = capture_errors(records, viewer, video, mapped)
                    assert len(errors) >= 20 and estimated == 0, (len(errors), estimated)
                    assert max(errors) <= 1_000_000, sorted(errors)[-3:]
                home = home_index("far", 2)
                doc = await get_json(http, f"{edge.base}/workers/{home}/api/streams/far")
                assert doc["publisher"]["upstream"] == f"{origin.base}/whep/far"
            finally:
                for viewer in viewers:
                    await viewer.close()
    finally:
        if publisher is not None:
            await publisher.close()
        edge.stop()
        origin.stop()


@pytest.mark.needs("redis-server")
async def test_two_worker_machines_share_their_streams_through_redis(tmp_path: Path) -> None:
    """Two ``serve --workers 2`` machines on one Redis: a stream published on machine A is
    listed under A's address by its home worker; both of B's workers serve it, B's home worker
    pulling from A (found in Redis) and its sibling from B's home worker, all exact."""
    from tests.captions.test_caption_redis import RedisServer
    from tests.conftest import free_port
    from tests.relay.test_directory import entry

    redis_server = RedisServer(tmp_path / "redis")
    machines = []
    for name in ("a", "b"):
        port = free_port()
        machines.append(ServerProcess(
            ["--workers", "2", "--data-dir", str(tmp_path / name), "--node-id", name,
             "--redis-url", redis_server.url, "--advertise-url", f"http://127.0.0.1:{port}",
             "--ice-addresses", "127.0.0.1", "--max-cpu-percent", "1000",
             "--log-level", "warning"], port=port))
    a, b = machines
    stream = "wide"
    home = home_index(stream, 2)
    publisher = None
    try:
        for machine in machines:
            machine.wait_ready(30)
        publisher, video, _ = await start_publisher(a.base, stream, stamp=True)
        await wait_for(lambda: entry(redis_server, stream) is not None, 5, "A listing it")
        assert entry(redis_server, stream) == {"node": f"a-worker-{home}", "url": a.base}
        async with aiohttp.ClientSession() as http:
            viewers, all_records = [], []
            for _ in range(2):  # one on each of B's workers
                viewers.append(await view(http, b.base, stream, data_channel="sync"))
                all_records.append(collect(viewers[-1]))
            try:
                workers = (await get_json(http, f"{b.base}/api/workers"))["workers"]
                # Each of B's workers has a viewer; the home one also its sibling's pull.
                counts = {w["index"]: w["viewers"] for w in workers}
                assert counts == {home: 2, 1 - home: 1}, workers
                for viewer, records in zip(viewers, all_records, strict=True):
                    frames = await decoded_frames(viewer, 40)
                    track = records.track_for(_mid(viewer, "video"))
                    await wait_for(lambda r=records, t=track, f=frames:
                                   r.frame(t, f[-1][1]) is not None, 3, "records")
                    mapped = [(n, ts) for n, ts in frames if records.frame(track, ts)]
                    errors, _, estimated = capture_errors(records, viewer, video, mapped)
                    assert len(errors) >= 20 and estimated == 0, (len(errors), estimated)
                    assert max(errors) <= 1_000_000, sorted(errors)[-3:]
                doc = await get_json(http, f"{b.base}/workers/{home}/api/streams/{stream}")
                assert doc["publisher"]["upstream"] == f"{a.base}/whep/{stream}"
                # B pulls; it lists nothing of its own.
                assert entry(redis_server, stream) == {"node": f"a-worker-{home}",
                                                       "url": a.base}
            finally:
                for viewer in viewers:
                    await viewer.close()
    finally:
        if publisher is not None:
            await publisher.close()
        for machine in machines:
            machine.stop()
        redis_server.kill()



async def test_live_captions_and_a_segment_being_made_stream_through_the_supervisor(
    supervisor: ServerProcess,
) -> None:
    """Answers without a length pass through the one port as they come: the live caption
    push gets a cue as it is ingested, and the segment being made arrives part by part and
    ends in the closed segment's bytes."""
    base = supervisor.base
    stream = "streamed"
    publisher, _, _ = await start_publisher(base, stream, stamp=True)
    async with aiohttp.ClientSession() as http:
        try:
            assert await publisher.joined() is not None
            live = await http.get(f"{base}/captions/{stream}/live")
            assert live.status == 200 and live.headers["Content-Type"] == "text/event-stream"
            now = time.time_ns()
            await post_cue(http, base, stream, "sse", now + 100_000_000, now + 900_000_000)
            seen = b""
            while b'"id":"sse"' not in seen:
                seen += await asyncio.wait_for(live.content.readany(), 5)
            live.close()

            media = f"{base}/streams/{stream}/media"
            index: dict[str, Any] = {}
            for _ in range(100):
                index = await get_json(http, f"{media}/index.json")
                if index["open"] is not None and index["open"]["parts"] == 0:
                    break  # just opened: the whole segment is still to be made
                await asyncio.sleep(0.05)
            number = index["open"]["number"]
            resp = await http.get(f"{media}/{index['open']['url']}")
            assert resp.status == 200 and resp.headers["Transfer-Encoding"] == "chunked"
            pieces = [await asyncio.wait_for(resp.content.readany(), 5)]
            # The first part comes while the segment is still open (it closes a target
            # duration after its keyframe, 1 s).
            doc = await get_json(http, f"{media}/index.json")
            assert doc["open"] is not None and doc["open"]["number"] == number
            pieces.append(await asyncio.wait_for(resp.read(), 10))
            async with http.get(f"{media}/{index['open']['url']}") as closed:
                assert closed.status == 200 and "Transfer-Encoding" not in closed.headers
                assert b"".join(pieces) == await closed.read()
        finally:
            await publisher.close()

        # A stream still open does not hold the shutdown up: the supervisor ends it, stops its
        # workers and exits by itself, well within the 8 s before it would be killed.
        pids = [w["pid"] for w in (await get_json(http, f"{base}/api/workers"))["workers"]]
        listening = await http.get(f"{base}/captions/{stream}/live")
        assert listening.status == 200
        started = time.monotonic()
        assert await asyncio.get_running_loop().run_in_executor(None, supervisor.stop) == 0
        assert time.monotonic() - started < 8
        listening.close()
        assert not [pid for pid in pids if _running(pid)], pids


@pytest.mark.system
@pytest.mark.needs("promtool")
def test_the_supervisor_serves_https_and_its_workers_stay_on_loopback_http(
        tmp_path: Path) -> None:
    """With a certificate, the one port speaks HTTPS (here beside plain HTTP on another): the
    supervisor terminates TLS and sends HSTS; its workers get neither and answer through it.
    Its /metrics has the certificate's expiry beside every worker's series."""
    import ssl
    import urllib.request

    from tests.conftest import free_port
    from tests.support.certs import TestCA

    ca = TestCA()
    issued = ca.issue("127.0.0.1")
    cert, key = issued.write(tmp_path)
    https_port = free_port()
    server = ServerProcess(["--workers", "2", "--data-dir", str(tmp_path / "data"),
                            "--ice-addresses", "127.0.0.1", "--tls-cert", str(cert),
                            "--tls-key", str(key), "--https-port", str(https_port),
                            "--hsts-max-age-s", "300", "--log-level", "warning"])
    try:
        server.wait_ready(30)
        context = ssl.create_default_context(cadata=ca.pem.decode())
        with urllib.request.urlopen(f"https://127.0.0.1:{https_port}/api/workers",
                                    context=context, timeout=5) as resp:
            assert resp.headers["Strict-Transport-Security"] == "max-age=300"
            workers = json.loads(resp.read())["workers"]
        assert len(workers) == 2 and all(w["alive"] for w in workers), workers
        # /metrics: the certificate's metrics, which only the supervisor has, beside every
        # worker's series labelled with its index.
        with urllib.request.urlopen(f"https://127.0.0.1:{https_port}/metrics",
                                    context=context, timeout=5) as resp:
            exposition = resp.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(exposition)}
        (expiry,) = families["sfu_sidecar_tls_certificate_expiry_timestamp_seconds"].samples
        not_after = x509.load_pem_x509_certificate(issued.cert_pem).not_valid_after_utc
        assert expiry.value == not_after.timestamp(), expiry
        assert families["sfu_sidecar_workers_alive"].samples[0].value == 2
        uptime = families["sfu_sidecar_uptime_seconds"].samples
        assert sorted(s.labels["worker"] for s in uptime) == ["0", "1"], uptime
        proc = subprocess.run(["promtool", "check", "metrics"], input=exposition,
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc
        # Each worker listens in plain HTTP on loopback, where the supervisor reaches it.
        for worker in workers:
            with urllib.request.urlopen(f"http://127.0.0.1:{worker['port']}/healthz",
                                        timeout=5) as resp:
                assert resp.status == 200
                assert "Strict-Transport-Security" not in resp.headers
    finally:
        assert server.stop() == 0
