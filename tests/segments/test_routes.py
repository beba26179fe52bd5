"""The segment routes: JSON 404s with reasons, the view token, lazy start on the first request
and the idle stop; the HLS playlists of segments made from real H.264 and Opus, read back by
ffprobe over HTTP."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from sfu_sidecar.app import SERVICES_KEY, Components, build_app
from sfu_sidecar.config import load_settings
from sfu_sidecar.relay.sdp import CodecInfo
from sfu_sidecar.segments.depacketize import Frame
from sfu_sidecar.segments.segmenter import StreamSegmenter
from tests.conftest import IN_PROCESS
from tests.segments.test_segmenter import FPS, _h264_frame, _h264_frames, _opus_packets

Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def app_client(tmp_path: Path) -> AsyncIterator[tuple[Client, Components]]:
    settings = load_settings({"data_dir": str(tmp_path), "view_token": "v",
                              "segment_idle_s": "5", **IN_PROCESS})
    app = build_app(settings)
    components = app[SERVICES_KEY].components
    async with TestClient(TestServer(app)) as client:
        yield client, components


AUTH = {"Authorization": "Bearer v"}


async def test_unknown_stream_and_bad_names_are_json_404(
    app_client: tuple[Client, Components]
) -> None:
    client, components = app_client
    for path in ("/streams/nope/media/index.json", "/streams/nope/media/init.webm",
                 "/streams/nope/media/3.webm", "/streams/nope/media/x.webm",
                 "/streams/nope/media/1.mkv", "/streams/nope/media/99999999999999999.webm"):
        resp = await client.get(path, headers=AUTH)
        assert resp.status == 404, path
        assert "error" in await resp.json()
    assert components.segments is not None and not components.segments.live


async def test_view_token_required(app_client: tuple[Client, Components]) -> None:
    client, _ = app_client
    resp = await client.get("/streams/s/media/index.json")
    assert resp.status == 401
    assert "error" in await resp.json()


async def test_lazy_start_and_idle_stop(app_client: tuple[Client, Components]) -> None:
    client, components = app_client
    segments, relay = components.segments, components.relay
    assert segments is not None and relay is not None
    relay.streams.get_or_create("s")  # a stream the relay knows, with no media yet
    assert "s" not in segments.live
    resp = await client.get("/streams/s/media/index.json", headers=AUTH)
    assert resp.status == 200 and resp.headers["Cache-Control"] == "no-cache"
    body = await resp.json()
    assert body["segments"] == [] and body["init"] is None and body["container"] == "webm"
    assert "s" in segments.live
    for path, reason in (("init.webm", "no init segment yet"), ("0.webm", "no segment 0"),
                         ("init.mp4", "segmented as webm"), ("0.m4s", "segmented as webm")):
        resp = await client.get(f"/streams/s/media/{path}", headers=AUTH)
        assert resp.status == 404, path
        assert reason in (await resp.json())["error"], path
    segments.sweep()
    assert "s" in segments.live  # read just now
    segments.live["s"].last_read_ns -= 6_000_000_000
    segments.sweep()
    assert "s" not in segments.live


async def test_an_h264_stream_is_indexed_as_mp4_from_the_first_request(
    app_client: tuple[Client, Components]
) -> None:
    client, components = app_client
    assert components.relay is not None
    components.relay.streams.get_or_create("avc").forwarder(
        "video", CodecInfo(102, "h264", 90000, None, {}))
    body = await (await client.get("/streams/avc/media/index.json", headers=AUTH)).json()
    assert body["container"] == "mp4"
    resp = await client.get("/streams/avc/media/init.webm", headers=AUTH)
    assert resp.status == 404 and "init.mp4" in (await resp.json())["error"]


async def test_hls_playlists_wait_for_a_segment_and_refuse_vp8(
    app_client: tuple[Client, Components]
) -> None:
    client, components = app_client
    assert components.relay is not None
    components.relay.streams.get_or_create("s")  # no publisher: the codec is not known yet
    components.relay.streams.get_or_create("vp8").forwarder(
        "video", CodecInfo(96, "VP8", 90000, None, {}))
    assert components.segments is not None
    components.segments.first_segment_wait_s = 0.3
    loop = asyncio.get_running_loop()
    for name in ("master.m3u8", "media.m3u8"):
        started = loop.time()
        resp = await client.get(f"/streams/s/media/{name}", headers=AUTH)
        assert loop.time() - started >= 0.3  # waited for a first segment, then gave up
        assert resp.status == 404 and resp.headers["Retry-After"] == "1", name
        assert "no closed segment yet" in (await resp.json())["error"]
        resp = await client.get(f"/streams/vp8/media/{name}", headers=AUTH)
        assert resp.status == 404 and "Retry-After" not in resp.headers, name
        reason = (await resp.json())["error"]
        assert "HLS carries fragmented MP4" in reason and "index.json" in reason
        resp = await client.get(f"/streams/s/media/{name}")
        assert resp.status == 401 and "error" in await resp.json()


def _push_h264_with_a_break(seg: StreamSegmenter, start_us: int) -> None:
    """3 s of 320x240 H.264 at 30 fps with Opus, 1 s of nothing, 1 s more (a discontinuity)."""
    video, audio = _h264_frames(150, gop=15), _opus_packets(250)
    seg.add_audio_track("opus", 48000, 2)
    events = [(start_us + i * 1_000_000 // FPS + 137, "video", i) for i in range(90)]
    events += [(start_us + 4_000_000 + (i - 90) * 1_000_000 // FPS + 137, "video", i)
               for i in range(90, 150)]
    events += [(start_us + j * 20_000 + 11, "audio", j) for j in range(250)]
    for t, kind, i in sorted(events):
        if kind == "video":
            seg.push("video", _h264_frame(i, *video[i]), t)
        else:
            seg.push("audio", Frame(i, audio[i], True), t)


async def test_hls_playlists_of_an_h264_stream_read_by_ffprobe(
    app_client: tuple[Client, Components]
) -> None:
    client, components = app_client
    relay, segments, captions = components.relay, components.segments, components.captions
    assert relay is not None and segments is not None and captions is not None
    relay.streams.get_or_create("avc").forwarder("video", CodecInfo(102, "h264", 90000, None, {}))
    assert (await client.get("/streams/avc/media/index.json", headers=AUTH)).status == 200
    captions.fix_epoch("avc", components.now_ns()() - 60_000_000_000)
    resp = await client.post("/api/streams/avc/captions", json={
        "timebase": "stream_s", "lang": "en",
        "cues": [{"id": "c1", "start": 50.5, "end": 52.0, "text": "one"}]})
    assert resp.status == 200, await resp.text()
    seg = segments.live["avc"].segmenter
    _push_h264_with_a_break(seg, 50_000_000)
    listed = list(seg.segments)
    assert [(s.number, s.discontinuity) for s in listed] == [
        (50000, False), (51000, False), (52000, False), (54000, True)]

    resp = await client.get("/streams/avc/media/master.m3u8", headers=AUTH)
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "application/vnd.apple.mpegurl"
    assert resp.headers["Cache-Control"] == "no-cache"
    master = (await resp.text()).splitlines()
    assert master[3] == ('#EXT-X-MEDIA:TYPE=SUBTITLES,GROUP-ID="subs",NAME="en",LANGUAGE="en",'
                         'AUTOSELECT=YES,DEFAULT=YES,URI="subtitles-en.m3u8"')
    assert f'CODECS="{seg.codecs[0]},opus",RESOLUTION=320x240,SUBTITLES="subs"' in master[4]
    assert master[5] == "media.m3u8"

    resp = await client.get("/streams/avc/media/media.m3u8", headers=AUTH)
    assert resp.status == 200 and resp.headers["Cache-Control"] == "no-cache"
    media = (await resp.text()).splitlines()
    assert '#EXT-X-MAP:URI="init.mp4?v=1"' in media
    assert [line for line in media if not line.startswith("#")] == [
        "50000.m4s", "51000.m4s", "52000.m4s", "54000.m4s"]
    assert media[media.index("54000.m4s") - 3] == "#EXT-X-DISCONTINUITY"
    # The subtitle rendition is segmented as the media, its windows hold the cue.
    resp = await client.get("/streams/avc/media/subtitles-en.m3u8", headers=AUTH)
    assert resp.status == 200 and resp.headers["Cache-Control"] == "no-cache"
    subtitles = (await resp.text()).splitlines()
    windows = [line for line in subtitles if not line.startswith("#")]
    assert len(windows) == 4 and "#EXT-X-DISCONTINUITY" in subtitles
    assert subtitles[subtitles.index(windows[-1]) - 3] == "#EXT-X-DISCONTINUITY"
    # A window reaches back the caption grace (the cue, 50.5-52 s, is in the window of
    # 52000 too), but not across the break.
    for url, holds_cue in zip(windows, (True, True, True, False), strict=True):
        resp = await client.get(url)
        assert resp.status == 200, await resp.text()
        body = await resp.text()
        assert ("one" in body) is holds_cue, url
        # A window without cues is still a WebVTT document with the timestamp map.
        assert body.startswith("WEBVTT") and "X-TIMESTAMP-MAP=" in body, url
    resp = await client.get("/streams/avc/media/subtitles-fr.m3u8", headers=AUTH)
    assert resp.status == 404 and "fr" in (await resp.json())["error"]
    # The versioned init URL the playlist names is the init segment (the query is ignored).
    resp = await client.get("/streams/avc/media/init.mp4?v=1", headers=AUTH)
    assert resp.status == 200 and await resp.read() == seg.init

    # A third-party HLS client follows the master playlist to the media playlist, the init
    # segment and every segment, with the view token on each request. (This ffmpeg cannot
    # read WebVTT renditions: it names the subtitle playlist and skips it.)
    ffprobe = shutil.which("ffprobe")
    assert ffprobe is not None, "ffprobe is needed (apt-get install ffmpeg)"
    proc = await asyncio.create_subprocess_exec(
        ffprobe, "-v", "error", "-headers", "Authorization: Bearer v\r\n",
        # From the first listed segment; a live playlist never ends, so stop after reloads
        # that bring nothing new.
        "-live_start_index", "0", "-m3u8_hold_counters", "3",
        "-show_streams", "-show_packets", "-of", "json",
        str(client.make_url("/streams/avc/media/master.m3u8")),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    probe = json.loads(out)
    streams = {s["codec_type"]: s for s in probe["streams"]}
    assert streams["video"]["codec_name"] == "h264" and streams["audio"]["codec_name"] == "opus"
    assert (streams["video"]["width"], streams["video"]["height"]) == (320, 240)
    video = [p for p in probe["packets"] if p["codec_type"] == "video"]
    assert len(video) == 120  # 90 frames before the break, 30 in the closed segment after
    # Media time is stream time across the discontinuity: each segment opens on a keyframe at
    # its start, and nothing lies in the gap.
    keyframes = [round(float(p["pts_time"]) * 1e6) for p in video if "K" in p["flags"]]
    for s in listed:
        assert min(abs(t - s.start_us) for t in keyframes) <= 500, (s.start_us, keyframes)
    assert not [p for p in video if 53.0 <= float(p["pts_time"]) < 54.0]


async def test_playlists_wait_for_the_first_segment_and_list_it_at_once(
    app_client: tuple[Client, Components]
) -> None:
    """A viewer arriving with the broadcast: its request for the master playlist is the first
    read, which starts the segmenting. The playlist requests wait for the first segment, and
    the subtitle playlist then lists its window with the media playlist, not a grace later."""
    client, components = app_client
    relay, captions = components.relay, components.captions
    assert relay is not None and captions is not None and components.segments is not None
    relay.streams.get_or_create("avc").forwarder("video", CodecInfo(102, "h264", 90000, None, {}))
    captions.fix_epoch("avc", components.now_ns()() - 10_000_000_000)
    resp = await client.post("/api/streams/avc/captions", json={
        "timebase": "stream_s", "lang": "en",
        "cues": [{"id": "c1", "start": 0.5, "end": 0.9, "text": "first"}]})
    assert resp.status == 200, await resp.text()
    master = asyncio.ensure_future(client.get("/streams/avc/media/master.m3u8", headers=AUTH))
    for _ in range(100):
        if "avc" in components.segments.live:
            break
        await asyncio.sleep(0.01)
    seg = components.segments.live["avc"].segmenter  # started by the master's request
    pending = [master] + [
        asyncio.ensure_future(client.get(f"/streams/avc/media/{name}", headers=AUTH))
        for name in ("media.m3u8", "subtitles-en.m3u8")]
    await asyncio.sleep(0.2)
    assert not [p for p in pending if p.done()]  # waiting, not a 404
    _push_h264(seg, _h264_frames(31, gop=15), range(31))  # the keyframe at 1 s closes one
    assert [s.number for s in seg.segments] == [0]
    texts = []
    for resp in await asyncio.wait_for(asyncio.gather(*pending), 5):
        assert resp.status == 200, await resp.text()
        texts.append(await resp.text())
    assert 'URI="subtitles-en.m3u8"' in texts[0]
    media, subtitles = ([line for line in text.splitlines() if not line.startswith("#")]
                        for text in texts[1:])
    assert media == ["0.m4s"] and len(subtitles) == 1
    assert subtitles[0].startswith("/captions/avc/en.vtt?start=0.000&end=1.0")
    resp = await client.get(subtitles[0])
    assert resp.status == 200 and "first" in await resp.text()


async def _segmenting_h264(app_client: tuple[Client, Components]) -> tuple[Client, StreamSegmenter]:
    """An H.264 stream the relay knows, being segmented (its index read once)."""
    client, components = app_client
    relay, segments = components.relay, components.segments
    assert relay is not None and segments is not None
    relay.streams.get_or_create("avc").forwarder("video", CodecInfo(102, "h264", 90000, None, {}))
    assert (await client.get("/streams/avc/media/index.json", headers=AUTH)).status == 200
    return client, segments.live["avc"].segmenter


def _push_h264(seg: StreamSegmenter, video: list[tuple[bytes, bool]], frames: range) -> None:
    for i in frames:
        seg.push("video", _h264_frame(i, *video[i]), 137 + i * 1_000_000 // FPS)


async def _open_number(seg: StreamSegmenter) -> int:
    current = seg.open_segment()
    assert current is not None
    return current.number


async def test_the_open_segment_streams_part_by_part_to_the_closed_bytes(
    app_client: tuple[Client, Components]
) -> None:
    """A GET of the segment being made answers at once with its parts so far, then each part
    as it is made, and ends when the segment closes: the bytes are the closed segment's."""
    client, seg = await _segmenting_h264(app_client)
    video = _h264_frames(75, gop=30)

    def push(frames: range) -> None:
        for i in frames:
            seg.push("video", _h264_frame(i, *video[i]), 1_000_137 + i * 1_000_000 // FPS)

    push(range(12))  # 0.4 s into the first segment: two parts
    index = await (await client.get("/streams/avc/media/index.json", headers=AUTH)).json()
    assert index["segments"] == [] and index["open"]["url"] == "1000.m4s"
    assert index["open"]["parts"] == 1 and index["part_duration_s"] == 0.2
    head = await asyncio.wait_for(client.head("/streams/avc/media/1000.m4s", headers=AUTH), 5)
    assert head.status == 200 and head.headers["Content-Type"] == "video/mp4"
    resp = await client.get("/streams/avc/media/1000.m4s", headers=AUTH)
    assert resp.status == 200 and resp.headers["Transfer-Encoding"] == "chunked"
    assert resp.headers["Cache-Control"] == "public, max-age=31536000, immutable"
    first = await resp.content.readany()  # the part made before the request
    assert first and first[4:8] == b"moof"
    got = bytearray(first)
    for step in range(12, 30, 3):  # on towards the next keyframe (frame 30), part by part
        push(range(step, step + 3))
        await asyncio.sleep(0.05)
        got += resp.content.read_nowait()
        assert not resp.content.at_eof()
        current = seg.open_segment()
        assert current is not None and bytes(got) == b"".join(current.parts)
    assert len(current.parts) == 4  # cut at frames 6, 12, 18 and 24; the fifth at the close
    push(range(30, 40))  # the keyframe closes it
    got += await asyncio.wait_for(resp.content.read(), 5)
    closed = seg.find(1000)
    assert closed is not None and bytes(got) == closed.data
    assert await _open_number(seg) == 2000


async def test_an_open_segment_that_is_dropped_is_cut_off_not_completed(
    app_client: tuple[Client, Components], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, seg = await _segmenting_h264(app_client)
    video = _h264_frames(30, gop=300)
    _push_h264(seg, video, range(12))
    resp = await client.get(f"/streams/avc/media/{await _open_number(seg)}.m4s", headers=AUTH)
    assert resp.status == 200
    # No keyframe comes and the open segment outgrows the memory bound: it is dropped.
    monkeypatch.setattr("sfu_sidecar.segments.segmenter.MAX_OPEN_BYTES", 1)
    _push_h264(seg, video, range(12, 13))
    assert seg.open_segment() is None
    with pytest.raises(aiohttp.ClientPayloadError):
        await asyncio.wait_for(resp.read(), 5)


async def test_a_reader_leaving_an_open_segment_is_no_error(
    app_client: tuple[Client, Components], caplog: pytest.LogCaptureFixture
) -> None:
    client, seg = await _segmenting_h264(app_client)
    video = _h264_frames(60, gop=300)
    _push_h264(seg, video, range(12))
    resp = await client.get(f"/streams/avc/media/{await _open_number(seg)}.m4s", headers=AUTH)
    assert resp.status == 200 and await resp.content.readany()
    resp.close()
    for i in range(12, 60):  # parts made after the reader left
        _push_h264(seg, video, range(i, i + 1))
        await asyncio.sleep(0.005)
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")], caplog.text
