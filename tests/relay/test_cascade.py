"""Cascade origin -> edge -> viewer with real ``sfu-sidecar serve`` processes on loopback.

The publisher (the synthetic source, every frame's capture instant known and its number in its
pixels) publishes to the origin; the viewer watches on the edge, which pulls the stream from
the origin over WHEP (setting origin_url). The viewer decodes frames, reads each number back
and checks the capture time the edge's sync records give for the RTP timestamp it received, and
where the edge puts the captions ingested at the origin.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import av
import pytest

from sfu_sidecar.client.whip import WhipSession
from sfu_sidecar.sync.wire import Cue, Epoch, PublisherState, Source
from sfu_sidecar.synthetic import FlashVideoTrack, Timeline, decode_frame_number
from tests.conftest import ServerProcess, free_port
from tests.relay.peers import Peer, view, wait_for
from tests.sync.records import ViewerRecords
from tests.syncchannel.test_service import _mid, collect, decoded_frames, start_publisher

pytestmark = pytest.mark.timeout(150)

TOLERANCE_NS = 1_000_000  # the bound for capture times across a hop
FRAME_NS = 1_000_000_000 // 30


class Node:
    """``sfu-sidecar serve`` on a fixed port (so it can be restarted where it was), its output
    drained and kept for failure messages."""

    def __init__(self, folder: Path, port: int | None = None, **env: str) -> None:
        self.folder = folder
        self.port = port or free_port()
        self.env = env
        self.lines: list[str] = []
        self.base = f"http://127.0.0.1:{self.port}"
        self.server: ServerProcess | None = None

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.server = ServerProcess(
            ["--port", str(self.port), "--data-dir", str(self.folder),
             "--ice-addresses", "127.0.0.1", "--max-cpu-percent", "1000",
             "--log-level", "info"],
            {f"SFU_SIDECAR_{k.upper()}": v for k, v in self.env.items()},
        )
        threading.Thread(target=self._drain, args=(self.server,), daemon=True).start()
        self.server.base = self.base
        self.server.wait_ready(20)

    def _drain(self, server: ServerProcess) -> None:
        out = server.proc.stdout
        assert out is not None
        for line in out:
            self.lines.append(line.decode(errors="replace"))

    def kill(self) -> None:
        assert self.server is not None
        self.server.proc.kill()
        self.server.proc.wait()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    def log(self) -> str:
        return "".join(self.lines[-60:])


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[Node, Node]]:
    origin = Node(tmp_path / "origin", node_id="origin")
    # A short publisher timeout: the edge notices a dead origin within 2 s.
    edge = Node(tmp_path / "edge", node_id="edge", origin_url=origin.base,
                publisher_timeout_s="2", cascade_linger_s="2")
    origin.start()
    edge.start()
    try:
        yield origin, edge
    finally:
        edge.stop()
        origin.stop()


async def post_cue(http: aiohttp.ClientSession, base: str, stream: str, cue_id: str,
                   start_ns: int, end_ns: int) -> None:
    body = {"timebase": "house_ns", "lang": "en",
            "cues": [{"id": cue_id, "start": start_ns, "end": end_ns, "text": cue_id}]}
    async with http.post(f"{base}/api/streams/{stream}/captions", json=body) as resp:
        assert resp.status in (200, 201), await resp.text()


PLACED_SETTINGS = "line:0 position:20%,line-left align:start"


def vtt_time(seconds: float) -> str:
    ms = round(seconds * 1000)
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}"


async def post_placed_cue(http: aiohttp.ClientSession, base: str, stream: str, epoch_ns: int,
                          after_ns: int) -> None:
    """A WebVTT cue with settings, 0.5 s after house time ``after_ns`` on the stream timeline."""
    start = (after_ns - epoch_ns) / 1e9 + 0.5
    body = f"WEBVTT\n\nplaced\n{vtt_time(start)} --> {vtt_time(start + 1)} {PLACED_SETTINGS}\n" \
        "top left\n"
    async with http.post(f"{base}/api/streams/{stream}/captions?lang=en", data=body.encode(),
                         headers={"Content-Type": "text/vtt"}) as resp:
        assert resp.status in (200, 201), await resp.text()


async def stream_status(http: aiohttp.ClientSession, base: str, stream: str) -> dict[str, Any]:
    async with http.get(f"{base}/api/streams/{stream}") as resp:
        assert resp.status == 200, await resp.text()
        doc: dict[str, Any] = await resp.json()
        return doc


def capture_errors(records: ViewerRecords, viewer: Peer, video: FlashVideoTrack,
                   frames: list[tuple[int, int]]) -> tuple[list[int], int, int]:
    """|mapped - true| capture time of every decoded frame; frames unmapped; estimated."""
    track = records.track_for(_mid(viewer, "video"))
    errors, unmapped, estimated = [], 0, 0
    for number, rtp_ts in frames:
        found = records.frame(track, rtp_ts)
        if found is None:
            unmapped += 1
            continue
        capture, source, is_estimated = found
        assert source == Source.ABS_CAPTURE_TIME
        if is_estimated:
            estimated += 1
            continue
        errors.append(abs(capture - video.capture_log[number]))
    return errors, unmapped, estimated


def caption_errors(cues: list[tuple[int, int]], edge_epoch: int,
                   edge_cues: dict[str, Cue], ids: list[str],
                   frames: list[tuple[int, int]]) -> list[int]:
    """Per cue: true capture time of the first frame the edge's cue (edge epoch + its stream
    start) puts on screen, minus the cue's true start. ``frames`` are (mapped, true) capture
    times of the viewer's frames, in order."""
    out = []
    for cue_id, (true_start, _end) in zip(ids, cues, strict=True):
        cue = edge_cues[cue_id]
        start_ns = edge_epoch + round(cue.start * 1e9)
        shown = [true for mapped, true in frames if mapped >= start_ns]
        if shown:
            out.append(shown[0] - true_start)
    return out


async def test_edge_viewer_gets_origin_capture_times_and_captions(
    nodes: tuple[Node, Node],
) -> None:
    origin, edge = nodes
    stream = "casc"
    publisher, video, _ = await start_publisher(origin.base, stream, stamp=True)
    async with aiohttp.ClientSession() as http:
        viewer = await view(http, edge.base, stream, data_channel="sync")
        records = collect(viewer)
        try:
            assert await publisher.joined() is not None
            frames = await decoded_frames(viewer, 90)
            track = records.track_for(_mid(viewer, "video"))
            await wait_for(lambda: records.frame(track, frames[-1][1]) is not None, 3,
                           "the record of the last decoded frame")
            errors, unmapped, estimated = capture_errors(records, viewer, video, frames)
            assert unmapped == 0, edge.log()
            # The edge joined the origin's clock before it offered: nothing is estimated.
            assert estimated == 0, estimated
            assert len(errors) == 90 and max(errors) <= TOLERANCE_NS, sorted(errors)[-5:]

            status = await stream_status(http, edge.base, stream)
            pull = status["publisher"]
            assert pull["upstream"] == f"{origin.base}/whep/{stream}"
            assert pull["clock"] is not None and pull["clock"]["error_ns"] < 5_000_000

            # Captions ingested at the origin: pushed to the edge viewer and served by the
            # edge, on the origin's stream time (one epoch for both nodes).
            ids, cues = [], []
            now = time.time_ns()
            for i in range(6):
                start = now + 300_000_000 + i * 400_000_000 + i * 7_000_000
                cues.append((start, start + 300_000_000))
                ids.append(f"c{i}")
                await post_cue(http, origin.base, stream, ids[-1], *cues[-1])
            await wait_for(lambda: {c.id for c in records.controls
                                    if isinstance(c, Cue)} >= set(ids), 5,
                           "every cue pushed to the edge viewer")
            epochs = [c.epoch_ns for c in records.controls if isinstance(c, Epoch)]
            assert epochs, "the edge viewer got the stream epoch"
            async with http.get(f"{origin.base}/api/streams/{stream}/captions") as resp:
                origin_doc = await resp.json()
            async with http.get(f"{edge.base}/api/streams/{stream}/captions") as resp:
                edge_doc = await resp.json()
            # Same host, so the two house clocks agree within the join's error.
            assert abs(edge_doc["epoch_ns"] - origin_doc["epoch_ns"]) < 2_000_000
            assert abs(epochs[-1] - origin_doc["epoch_ns"]) < 2_000_000
            origin_cues = {c["id"]: (c["start"], c["end"]) for c in origin_doc["cues"]}
            edge_cues_http = {c["id"]: (c["start"], c["end"]) for c in edge_doc["cues"]}
            assert edge_cues_http == origin_cues

            # A cue its producer placed (WebVTT cue settings) is placed the same on the edge:
            # pushed to the edge's viewer with its settings, stored and served with them.
            await post_placed_cue(http, origin.base, stream, origin_doc["epoch_ns"], cues[-1][1])
            await wait_for(lambda: any(isinstance(c, Cue) and c.id == "placed"
                                       for c in records.controls), 5, "the placed cue pushed")
            pushed = [c for c in records.controls if isinstance(c, Cue) and c.id == "placed"]
            assert pushed[-1].settings == PLACED_SETTINGS
            async with http.get(f"{edge.base}/api/streams/{stream}/captions") as resp:
                placed = [c for c in (await resp.json())["cues"] if c["id"] == "placed"]
            assert placed and placed[0]["settings"] == PLACED_SETTINGS
            # The cue lies in a chunk that has not closed yet; the window endpoint serves it now.
            window = f"start={placed[0]['start'] - 1}&end={placed[0]['end'] + 1}"
            async with http.get(f"{edge.base}/captions/{stream}/en.vtt?{window}") as resp:
                assert resp.status == 200, await resp.text()
                assert f" --> {vtt_time(placed[0]['end'])} {PLACED_SETTINGS}\n" \
                    in await resp.text()

            # Caption error on the edge viewer's frames: decode frames across the cues.
            more = await decoded_frames(viewer, 110)
            await wait_for(lambda: records.frame(track, more[-1][1]) is not None, 3,
                           "the record of the last decoded frame")
            pairs = []
            for number, rtp_ts in more:
                found = records.frame(track, rtp_ts)
                if found is not None:
                    pairs.append((found[0], video.capture_log[number]))
            edge_cues = {c.id: c for c in records.controls if isinstance(c, Cue)}
            errs = caption_errors(cues, epochs[-1], edge_cues, ids, pairs)
            assert len(errs) >= 5, (errs, len(pairs))
            p95 = sorted(errs)[max(0, round(0.95 * len(errs)) - 1)]
            print(f"cascade: capture error max {max(errors) / 1e3:.1f} us over {len(errors)} "
                  f"frames; caption error ms {[round(e / 1e6, 1) for e in errs]}")
            assert all(e >= -TOLERANCE_NS for e in errs), errs  # never before its start
            assert p95 <= FRAME_NS + TOLERANCE_NS, errs
            assert statistics.median(errs) <= FRAME_NS
        finally:
            await viewer.close()
            await publisher.close()


async def restart_publisher(base: str, stream: str) -> tuple[WhipSession, FlashVideoTrack,
                                                              Timeline]:
    for _ in range(40):
        try:
            return await start_publisher(base, stream, stamp=True)
        except (AssertionError, OSError, aiohttp.ClientError):
            await asyncio.sleep(0.25)
    raise AssertionError("could not publish to the restarted origin")


async def test_edge_survives_the_origin_restarting(nodes: tuple[Node, Node]) -> None:
    origin, edge = nodes
    stream = "restart"
    publisher, video, _ = await start_publisher(origin.base, stream, stamp=True)
    async with aiohttp.ClientSession() as http:
        viewer = await view(http, edge.base, stream, data_channel="sync")
        records = collect(viewer)
        second = None
        try:
            before = await decoded_frames(viewer, 30)
            track = records.track_for(_mid(viewer, "video"))
            await wait_for(lambda: records.frame(track, before[-1][1]) is not None, 3,
                           "records before the restart")
            epoch_before = next(c.epoch_ns for c in records.controls if isinstance(c, Epoch))
            last_before = records.frame(track, before[-1][1])
            assert last_before is not None

            origin.kill()
            await publisher.close()
            await wait_for(lambda: any(isinstance(c, PublisherState) and not c.live
                                       for c in records.controls), 10,
                           "the edge viewer told the publisher is gone")
            origin.start()
            second, video2, _ = await restart_publisher(origin.base, stream)

            # The same viewer session resumes: frames from the new publisher, mapped exactly,
            # later than every frame before, on the same epoch.
            after = await decoded_frames(viewer, 30)
            await wait_for(lambda: records.frame(track, after[-1][1]) is not None, 5,
                           "records after the restart")
            errors = []
            for number, rtp_ts in after[-15:]:
                found = records.frame(track, rtp_ts)
                assert found is not None
                assert found[0] > last_before[0]
                if not found[2]:
                    errors.append(abs(found[0] - video2.capture_log[number]))
            assert len(errors) >= 10 and max(errors) <= TOLERANCE_NS, sorted(errors)[-3:]
            epochs = [c.epoch_ns for c in records.controls if isinstance(c, Epoch)]
            assert all(abs(e - epoch_before) < 2_000_000 for e in epochs), epochs
            status = await stream_status(http, edge.base, stream)
            assert status["publisher"]["upstream_live"] is True
        finally:
            await viewer.close()
            if second is not None:
                await second.close()
            del video


async def test_loops_and_missing_origins_are_refused(tmp_path: Path) -> None:
    a_port, b_port, dead_port = free_port(), free_port(), free_port()
    a = Node(tmp_path / "a", a_port, node_id="a", origin_url=f"http://127.0.0.1:{b_port}")
    b = Node(tmp_path / "b", b_port, node_id="b", origin_url=f"http://127.0.0.1:{a_port}")
    lone = Node(tmp_path / "lone", node_id="lone", origin_url=f"http://127.0.0.1:{dead_port}")
    for node in (a, b, lone):
        node.start()
    try:
        async with aiohttp.ClientSession() as http:
            offer = await recvonly_offer()
            headers = {"Content-Type": "application/sdp"}
            started = time.monotonic()
            async with http.post(f"{a.base}/whep/s", data=offer, headers=headers) as resp:
                body = await resp.text()
                assert resp.status == 508, body
                assert "loop" in body and "a -> b" in body, body
            async with http.post(f"{lone.base}/whep/s", data=offer, headers=headers) as resp:
                body = await resp.text()
                assert resp.status == 503, body
                assert resp.headers.get("Retry-After"), resp.headers
                assert "unreachable" in body or "did not answer" in body, body
            assert time.monotonic() - started < 10
            # Nothing is left behind on any node.
            for node in (a, b, lone):
                async with http.get(f"{node.base}/api/streams") as resp:
                    doc = await resp.json()
                    assert doc["streams"] == [], (node.base, doc)
            # A Via header that is not a list of node names is refused as bad input.
            async with http.post(f"{a.base}/whep/s", data=offer,
                                 headers={**headers, "Sidecar-Via": "x y"}) as resp:
                assert resp.status == 400
    finally:
        for node in (a, b, lone):
            node.stop()


async def test_an_edge_serves_live_segments_of_a_stream_it_pulls(tmp_path: Path) -> None:
    """MSE and HLS players on an edge: the first segment request pulls the stream, the edge's
    segments carry the origin's capture times (each frame's pts is its true capture time less
    the one stream epoch), and the pull ends once nobody reads them."""
    origin = Node(tmp_path / "origin", node_id="origin")
    edge = Node(tmp_path / "edge", node_id="edge", origin_url=origin.base,
                segment_duration_s="1", segment_idle_s="2", cascade_linger_s="1")
    origin.start()
    edge.start()
    try:
        async with aiohttp.ClientSession() as http:
            session, video, _ = await start_publisher(origin.base, "seg", stamp=True)
            try:
                media = f"{edge.base}/streams/seg/media"
                started = time.monotonic()
                while True:
                    async with http.get(f"{media}/index.json") as resp:
                        assert resp.status == 200, await resp.text()
                        index = await resp.json()
                    if index["init"] is not None and len(index["segments"]) >= 3:
                        break
                    assert time.monotonic() - started < 30, index
                    await asyncio.sleep(0.2)
                # The edge pulls: it is one viewer of the origin's stream.
                at_origin = await stream_status(http, origin.base, "seg")
                assert len(at_origin["viewers"]) == 1, at_origin["viewers"]
                # One epoch: the origin's, moved onto the edge's clock by the clock join (same
                # host, so within the join's error).
                async with http.get(f"{origin.base}/streams/seg/media/index.json") as resp:
                    assert abs(index["epoch_ns"] - (await resp.json())["epoch_ns"]) < 2_000_000
                path = tmp_path / "edge.webm"
                with path.open("wb") as f:
                    async with http.get(f"{media}/{index['init']}") as resp:
                        assert resp.status == 200
                        f.write(await resp.read())
                    for entry in index["segments"][:3]:
                        async with http.get(f"{media}/{entry['number']}.webm") as resp:
                            assert resp.status == 200
                            f.write(await resp.read())
                errors = []
                with av.open(str(path)) as container:
                    for frame in container.decode(container.streams.video[0]):
                        assert frame.pts is not None and frame.time_base is not None
                        number = decode_frame_number(
                            frame.to_ndarray(format="yuv420p")[: frame.height])
                        pts_ns = int(frame.pts * frame.time_base * 1_000_000_000)
                        errors.append(abs(pts_ns - (video.capture_log[number]
                                                    - index["epoch_ns"])))
                assert len(errors) >= 3 * 25, len(errors)  # about 30 fps, 1 s segments
                assert max(errors) <= TOLERANCE_NS, sorted(errors)[-5:]
                print(f"\nedge segments: {len(errors)} frames, pts error max "
                      f"{max(errors) / 1e6:.3f} ms")

                # Nobody reads them any more: segmenting stops after segment_idle_s, the pull
                # lingers cascade_linger_s and ends, and the origin loses that viewer.
                left = time.monotonic()
                while (await stream_status(http, origin.base, "seg"))["viewers"]:
                    assert time.monotonic() - left < 20, edge.log()
                    await asyncio.sleep(0.2)
                assert time.monotonic() - left >= 2.0  # not before segment_idle_s
            finally:
                await session.close()
            # The origin gone: a segment request for a stream the edge lacks gets 503 with
            # Retry-After and the reason, at once, as a WHEP viewer's would.
            origin.stop()
            async with http.get(f"{edge.base}/streams/other/media/index.json") as resp:
                body = await resp.text()
                assert resp.status == 503 and resp.headers.get("Retry-After"), body
                assert "unreachable" in body or "did not answer" in body, body
    finally:
        edge.stop()
        origin.stop()


async def recvonly_offer() -> str:
    from tests.relay.peers import client_pc

    pc = client_pc()
    pc.addTransceiver("video", direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = str(pc.localDescription.sdp)
    await pc.close()
    return sdp
