"""The segment component on the relay's publisher hook, without WebRTC: RTP packets from
aiortc's VP8 packetizer go through the sync component (capture times) and then the segment
component, as the relay calls them; the segments read back carry, per frame, the capture time
the sync component mapped, minus the stream epoch."""

from __future__ import annotations

import fractions
import random
from collections.abc import AsyncIterator
from pathlib import Path

import av
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiortc.codecs.vpx import Vp8Encoder

from sfu_sidecar.app import SERVICES_KEY, Components, build_app
from sfu_sidecar.config import load_settings
from sfu_sidecar.relay.hooks import PacketInfo
from sfu_sidecar.relay.sdp import CodecInfo
from tests.conftest import IN_PROCESS
from tests.segments.media import ffprobe, first_video_packet_per_range, packets_by_kind

Client = TestClient[web.Request, web.Application]
VP8 = CodecInfo(96, "vp8", 90000, None, {})
FPS = 30


@pytest.fixture
async def app_client(tmp_path: Path) -> AsyncIterator[tuple[Client, Components]]:
    settings = load_settings({"data_dir": str(tmp_path), **IN_PROCESS})
    app = build_app(settings)
    async with TestClient(TestServer(app)) as client:
        yield client, app[SERVICES_KEY].components


def _vp8_packets(count: int) -> list[tuple[int, list[bytes]]]:
    enc = av.CodecContext.create("libvpx", "w")
    enc.width, enc.height, enc.pix_fmt = 320, 240, "yuv420p"
    enc.time_base = fractions.Fraction(1, FPS)
    enc.bit_rate = 2_000_000
    enc.options = {"deadline": "realtime", "g": "15", "keyint_min": "15"}
    packer = Vp8Encoder()
    out = []
    for i in range(count):
        frame = av.VideoFrame(320, 240, "yuv420p")
        rng = random.Random(i)
        for plane in frame.planes:
            plane.update(rng.randbytes(plane.buffer_size))
        frame.pts = i
        for p in enc.encode(frame):  # type: ignore[arg-type]
            out.append(packer.pack(p))
    return [(ts, payloads) for payloads, ts in out]


async def test_packets_through_sync_and_segments(
    app_client: tuple[Client, Components], tmp_path: Path
) -> None:
    client, components = app_client
    relay, sync, captions, segments = (components.relay, components.sync, components.captions,
                                       components.segments)
    assert relay and sync and captions and segments
    relay.streams.get_or_create("s").forwarder("video", VP8)
    resp = await client.get("/streams/s/media/index.json")
    assert resp.status == 200
    start_ns = 1_700_000_000_000_000_000
    epoch = captions.fix_epoch("s", start_ns)
    captures: list[int] = []
    seq = 65000  # wraps inside the run
    for n, (ts, payloads) in enumerate(_vp8_packets(150)):
        arrival = start_ns + n * 1_000_000_000 // FPS + 5_000_000
        for i, payload in enumerate(payloads):
            info = PacketInfo("video", 1234, seq & 0xFFFF, (ts + 1000) & 0xFFFFFFFF,
                              i == len(payloads) - 1, i == 0 and not payload[4] & 1, arrival,
                              90000, {}, payload)
            sync.publisher_packet("s", "pub", info)
            capture = sync.capture_time("s", info)
            assert capture is not None
            segments.publisher_packet("s", "pub", info)
            seq += 1
        captures.append(capture.capture_ns - epoch)
    index = await (await client.get("/streams/s/media/index.json")).json()
    assert index["codecs"] == ["vp8"] and len(index["segments"]) == 4
    init = await (await client.get("/streams/s/media/init.webm")).read()
    path = tmp_path / "s.webm"
    ranges = []
    with path.open("wb") as f:
        f.write(init)
        pos = len(init)
        for entry in index["segments"]:
            data = await (await client.get(f"/streams/s/media/{entry['number']}.webm")).read()
            f.write(data)
            ranges.append((pos, pos + len(data)))
            pos += len(data)
    probe = ffprobe(path)
    for first in first_video_packet_per_range(probe, ranges):
        assert first is not None and "K" in first["flags"]
    got = [round(float(p["pts_time"]) * 1e9) for p in packets_by_kind(probe, "video")]
    assert len(got) == 120  # four whole segments of 30 frames; the fifth is open
    assert max(abs(g - c) for g, c in zip(got, captures, strict=False)) <= 500_000
