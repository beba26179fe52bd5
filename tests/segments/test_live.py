"""Live segments end to end: an aiortc publisher (VP8 or H.264, and Opus; capture times
stamped with abs-capture-time and joined to the house clock) publishes over WHIP; the test
reads the segments over HTTP, concatenates init + segments into a file and checks it with
ffprobe, and decodes it to read each frame's number from its pixels: every frame's pts is its
capture time minus the stream epoch, within 1 ms."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import av
import pytest
from aiohttp.test_utils import TestServer

from sfu_sidecar.app import SERVICES_KEY, build_app
from sfu_sidecar.captions.service import CaptionService
from sfu_sidecar.client.whip import publish
from sfu_sidecar.config import load_settings
from sfu_sidecar.synthetic import BeepAudioTrack, FlashVideoTrack, Timeline, decode_frame_number
from tests.conftest import IN_PROCESS
from tests.relay.peers import LOOPBACK, wait_for
from tests.segments.media import ffprobe, first_video_packet_per_range

TOLERANCE_NS = 1_000_000
SEGMENTS = 4


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[str, CaptionService]]:
    settings = load_settings({"ice_addresses": "127.0.0.1", "data_dir": str(tmp_path),
                              "segment_duration_s": "1", **IN_PROCESS})
    app = build_app(settings)
    captions = app[SERVICES_KEY].components.captions
    assert captions is not None
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server()
    try:
        yield f"http://127.0.0.1:{srv.port}", captions
    finally:
        await srv.close()


async def _json(http: aiohttp.ClientSession, url: str, status: int = 200) -> Any:
    async with http.get(url) as r:
        assert r.status == status, await r.text()
        assert r.content_type == "application/json"
        return await r.json()


async def _bytes(http: aiohttp.ClientSession, url: str) -> tuple[bytes, str]:
    async with http.get(url) as r:
        assert r.status == 200, await r.text()
        return await r.read(), r.headers.get("Cache-Control", "")


@pytest.mark.parametrize(("codec", "container", "init_ext", "media_ext"),
                         [("vp8", "webm", "webm", "webm"), ("h264", "mp4", "mp4", "m4s")])
async def test_segments_on_the_stream_timeline(
    server: tuple[str, CaptionService], tmp_path: Path,
    codec: str, container: str, init_ext: str, media_ext: str,
) -> None:
    base, captions = server
    timeline = Timeline.starting_now(time.time_ns)
    video = FlashVideoTrack(timeline)
    publisher = await publish(
        f"{base}/whip/seg", [BeepAudioTrack(timeline), video],
        capture_start_ns=timeline.start_house_ns, ice_addresses=LOOPBACK, video_codec=codec,
    )
    media = f"{base}/streams/seg/media"
    try:
        assert await publisher.joined() is not None
        await wait_for(lambda: captions.epoch("seg") is not None, 20, "the stream epoch")
        async with aiohttp.ClientSession() as http:
            missing = await _json(http, f"{base}/streams/nope/media/index.json", 404)
            assert "nope" in missing["error"]
            index = await _json(http, f"{media}/index.json")  # starts segmenting
            started = time.monotonic()
            while len(index["segments"]) < SEGMENTS:
                assert time.monotonic() - started < 60, index
                await asyncio.sleep(0.5)
                index = await _json(http, f"{media}/index.json")
            video_string = "vp8" if codec == "vp8" else index["codecs"][0]
            assert video_string.startswith("vp8" if codec == "vp8" else "avc1.")
            assert index["codecs"] == [video_string, "opus"]
            assert index["container"] == container
            assert index["epoch_ns"] == captions.epoch("seg")
            assert index["caption_chunk_s"] > 0 and index["languages"] == []
            assert index["init"] == f"init.{init_ext}?v=1"
            assert [s["sequence"] for s in index["segments"]] == list(
                range(len(index["segments"])))
            init, init_cache = await _bytes(http, f"{media}/init.{init_ext}")
            assert init_cache == "no-cache"
            listed = index["segments"][:SEGMENTS]
            numbers = [s["number"] for s in listed]
            # A segment's number is its start in stream ms; each follows the one before.
            for entry, following in itertools.pairwise(listed):
                assert 0 <= entry["start_s"] * 1000 - entry["number"] < 1
                assert abs(entry["start_s"] + entry["duration_s"] - following["start_s"]) < 1e-6
            path = tmp_path / f"live.{container}"
            ranges = []
            with path.open("wb") as f:
                f.write(init)
                pos = len(init)
                for entry in listed:
                    data, cache = await _bytes(http,
                                               f"{media}/{entry['number']}.{media_ext}")
                    assert cache == "public, max-age=31536000, immutable"
                    f.write(data)
                    ranges.append((pos, pos + len(data)))
                    pos += len(data)
            gone = await _json(http, f"{media}/{numbers[-1] + 1000}.{media_ext}", 404)
            assert "segment" in gone["error"]
            other = "webm" if init_ext == "mp4" else "mp4"
            await _json(http, f"{media}/init.{other}", 404)
    finally:
        await publisher.close()

    probe = ffprobe(path)
    streams = {s["codec_type"]: s for s in probe["streams"]}
    assert streams["video"]["codec_name"] == codec
    assert (streams["video"]["width"], streams["video"]["height"]) == (video.width, video.height)
    assert streams["audio"]["codec_name"] == "opus"
    firsts = first_video_packet_per_range(probe, ranges)
    for first, entry in zip(firsts, listed, strict=True):
        assert first is not None and "K" in first["flags"], first
        assert abs(float(first["pts_time"]) - entry["start_s"]) <= 0.001
        assert entry["keyframe"] is True and entry["duration_s"] >= 1.0

    epoch = captions.epoch("seg")
    assert epoch is not None
    errors = []
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        for frame in container.decode(stream):
            assert frame.pts is not None and frame.time_base is not None
            luma = frame.to_ndarray(format="yuv420p")[: frame.height]
            number = decode_frame_number(luma)
            pts_ns = int(frame.pts * frame.time_base * 1_000_000_000)
            errors.append(abs(pts_ns - (video.capture_log[number] - epoch)))
    assert len(errors) >= SEGMENTS * 25  # about 30 fps, every frame of the segments
    assert max(errors) <= TOLERANCE_NS, sorted(errors)[-5:]
    print(f"\n{codec}: frames {len(errors)}, pts error max {max(errors) / 1e6:.3f} ms, "
          f"segment durations {[e['duration_s'] for e in listed]}")
