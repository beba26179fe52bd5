"""The segmenter and WebM muxer on real VP8 and Opus bitstreams (from libvpx and libopus via
PyAV), read back with ffprobe: segments start on keyframes, timestamps are the stream times
given, the init segment is shared, memory is bounded by the window."""

from __future__ import annotations

import fractions
import io
import logging
import random
from pathlib import Path

import av
import pytest

from sfu_sidecar.segments.depacketize import Frame, nal_units, sps_dimensions
from sfu_sidecar.segments.mux import CLUSTER_ID
from sfu_sidecar.segments.segmenter import StreamSegmenter
from tests.segments.media import (
    cluster_block_times,
    ffprobe,
    first_video_packet_per_range,
    packets_by_kind,
)

FPS = 30
log = logging.getLogger("test.segments")


def _vp8_frames(count: int, gop: int) -> list[tuple[bytes, bool]]:
    enc = av.CodecContext.create("libvpx", "w")
    enc.width, enc.height, enc.pix_fmt = 320, 240, "yuv420p"
    enc.time_base = fractions.Fraction(1, FPS)
    enc.options = {"deadline": "realtime", "g": str(gop), "keyint_min": str(gop)}
    out = []
    for i in range(count):
        frame = av.VideoFrame(320, 240, "yuv420p")
        rng = random.Random(i)
        for plane in frame.planes:
            plane.update(rng.randbytes(64) * (plane.buffer_size // 64))
        frame.pts = i
        out.extend((bytes(p), bool(p.is_keyframe)) for p in enc.encode(frame))  # type: ignore[arg-type]
    out.extend((bytes(p), bool(p.is_keyframe)) for p in enc.encode(None))  # type: ignore[arg-type]
    return out


def _opus_packets(count: int) -> list[bytes]:
    enc = av.CodecContext.create("libopus", "w")
    enc.sample_rate, enc.layout, enc.format = 48000, "stereo", "s16"  # type: ignore[attr-defined]
    out = []
    for i in range(count):
        frame = av.AudioFrame(format="s16", layout="stereo", samples=960)
        frame.sample_rate = 48000
        frame.pts = i * 960
        for plane in frame.planes:
            plane.update(bytes(plane.buffer_size))
        out.extend(bytes(p) for p in enc.encode(frame))  # type: ignore[arg-type]
    return out


def _vp8_dims(data: bytes) -> tuple[int, int]:
    return (int.from_bytes(data[6:8], "little") & 0x3FFF,
            int.from_bytes(data[8:10], "little") & 0x3FFF)


def _segmenter(window: int = 100, asked: list[int] | None = None,
               part_us: int | None = None) -> StreamSegmenter:
    return StreamSegmenter(
        "s", target_us=1_000_000, window=window,
        request_keyframe=(lambda: asked.append(1)) if asked is not None else (lambda: None),
        log=log, part_us=part_us,
    )


# Each segment muxed whole, and in parts of 0.2 s (the service's default) or of one frame.
PARTS = pytest.mark.parametrize("part_us", [None, 200_000, 1])


def _run(seg: StreamSegmenter, video: list[tuple[bytes, bool]], start_us: int,
         audio: list[bytes] | None = None) -> dict[int, int]:
    """Push video at FPS and audio every 20 ms from ``start_us``, in time order; returns
    video stream time (µs) by frame index."""
    events: list[tuple[int, str, int]] = []
    times = {}
    for i in range(len(video)):
        # Capture times with sub-millisecond parts, as real ones have.
        t = start_us + i * 1_000_000 // FPS + 137
        times[i] = t
        events.append((t, "video", i))
    for j in range(len(audio or [])):
        events.append((start_us + j * 20_000 + 11, "audio", j))
    if audio:
        seg.add_audio_track("opus", 48000, 2)
    for t, kind, i in sorted(events):
        if kind == "video":
            data, key = video[i]
            w, h = _vp8_dims(data) if key else (0, 0)
            seg.push("video", Frame(i, data, key, w, h), t)
        else:
            assert audio is not None
            seg.push("audio", Frame(i, audio[i], True), t)
    return times


def _write(seg: StreamSegmenter, path: Path) -> list[tuple[int, int]]:
    """Init and segments concatenated into ``path``; each segment's byte range. A WebM
    segment is one or more clusters, so it starts with the Cluster ID."""
    assert seg.init is not None
    ranges = []
    with path.open("wb") as f:
        f.write(seg.init)
        pos = len(seg.init)
        for s in seg.segments:
            assert seg.container != "webm" or s.data.startswith(CLUSTER_ID)
            f.write(s.data)
            ranges.append((pos, pos + len(s.data)))
            pos += len(s.data)
    return ranges


@PARTS
@pytest.mark.system
def test_segments_start_on_keyframes_with_stream_time_pts(tmp_path: Path,
                                                          part_us: int | None) -> None:
    video = _vp8_frames(150, gop=10)  # a keyframe every 1/3 s, 5 s of video
    audio = _opus_packets(250)
    seg = _segmenter(part_us=part_us)
    times = _run(seg, video, 2_000_000, audio)
    assert len(seg.segments) == 4  # 5 s at 1 s each; the last one stays open
    for s in seg.segments:
        assert s.duration_us >= 1_000_000 and s.keyframe
    path = tmp_path / "all.webm"
    ranges = _write(seg, path)
    probe = ffprobe(path)
    streams = {s["codec_type"]: s for s in probe["streams"]}
    assert streams["video"]["codec_name"] == "vp8"
    assert (streams["video"]["width"], streams["video"]["height"]) == (320, 240)
    assert streams["audio"]["codec_name"] == "opus"
    for first in first_video_packet_per_range(probe, ranges):
        assert first is not None and "K" in first["flags"]
    starts = [s.start_us for s in seg.segments]
    for first, start in zip(first_video_packet_per_range(probe, ranges), starts, strict=True):
        assert first is not None and abs(float(first["pts_time"]) * 1e6 - start) <= 500
    got = [float(p["pts_time"]) * 1e6 for p in packets_by_kind(probe, "video")]
    want = [times[i] for i in range(len(got))]
    assert max(abs(g - w) for g, w in zip(got, want, strict=True)) <= 500
    audio_pts = [float(p["pts_time"]) for p in packets_by_kind(probe, "audio")]
    assert audio_pts == sorted(audio_pts) and len(audio_pts) >= 150
    index = seg.index()
    assert index["codecs"] == ["vp8", "opus"]
    # Numbered by start in stream ms: 2 s + 137 µs, then a keyframe every 10 frames.
    assert [s["number"] for s in index["segments"]] == [2000, 3000, 4000, 5000]


def test_window_bounds_memory_and_numbers_keep_rising() -> None:
    seg = _segmenter(window=3)
    _run(seg, _vp8_frames(240, gop=15), 0)  # 8 s: seven closed segments, three kept
    assert [s.number for s in seg.segments] == [4000, 5000, 6000]
    assert seg.find(1000) is None and seg.find(5000) is not None


def test_keyframe_asked_when_the_target_passes_without_one() -> None:
    asked: list[int] = []
    seg = _segmenter(asked=asked)
    _run(seg, _vp8_frames(90, gop=1000), 0)  # one keyframe only, 3 s
    # From 1 s on, every 0.5 s while none comes: at 1.0, 1.5, 2.0 and 2.5 s.
    assert len(asked) == 4
    assert len(seg.segments) == 0


def test_resolution_change_starts_over_with_a_new_init() -> None:
    seg = _segmenter()
    _run(seg, _vp8_frames(90, gop=15), 0)
    first_init = seg.init
    assert first_init is not None and len(seg.segments) == 2
    enc = av.CodecContext.create("libvpx", "w")
    enc.width, enc.height, enc.pix_fmt = 160, 120, "yuv420p"
    enc.time_base = fractions.Fraction(1, FPS)
    enc.options = {"deadline": "realtime", "g": "30", "keyint_min": "30"}
    frames = []
    for i in range(40):
        frame = av.VideoFrame(160, 120, "yuv420p")
        frame.pts = i
        frames.extend((bytes(p), bool(p.is_keyframe))
                      for p in enc.encode(frame))  # type: ignore[arg-type]
    assert [k for _, k in frames[:31]].count(True) == 2
    for i, (data, key) in enumerate(frames[:31]):
        w, h = _vp8_dims(data) if key else (0, 0)
        seg.push("video", Frame(i, data, key, w, h), 3_000_000 + i * 1_000_000 // FPS)
    assert seg.video is not None and (seg.video.width, seg.video.height) == (160, 120)
    assert seg.init is not None and seg.init != first_init
    assert [s.number for s in seg.segments] == [3000]  # the old window went with the old init


@PARTS
@pytest.mark.system
def test_audio_that_overtakes_a_keyframe_goes_to_the_segment_it_was_captured_in(
    tmp_path: Path, part_us: int | None,
) -> None:
    """Audio captured just after a keyframe often arrives before it: it must go to the
    keyframe's segment, and every cluster's stored block timecodes must rise (MSE refuses a
    cluster whose blocks go back)."""
    seg = _segmenter(part_us=part_us)
    video = _vp8_frames(120, gop=15)
    audio = _opus_packets(200)
    seg.add_audio_track("opus", 48000, 2)
    a = 0
    for i, (data, key) in enumerate(video):
        # Every third frame 3 ms after an audio frame: stored 6.5 ms later, that audio
        # frame's block would come after the video frame's.
        t = 1_003_137 + i * 1_000_000 // FPS
        while 1_000_000 + a * 20_000 < t + 10_000:  # audio up to 10 ms past the frame first
            seg.push("audio", Frame(a, audio[a], True), 1_000_000 + a * 20_000)
            a += 1
        w, h = _vp8_dims(data) if key else (0, 0)
        seg.push("video", Frame(i, data, key, w, h), t)
    assert len(seg.segments) == 3
    for s in seg.segments:
        path = tmp_path / f"{s.number}.webm"
        assert seg.init is not None
        path.write_bytes(seg.init + s.data)
        pts = [int(p["pts"]) for p in sorted(ffprobe(path)["packets"], key=lambda p: int(p["pos"]))]
        assert min(pts) * 1000 >= s.start_us - 500
        assert max(pts) * 1000 < s.start_us + s.duration_us
        # Stored timecodes too: Opus blocks are stored later by the declared codec delay,
        # and an MSE parser refuses a cluster whose stored timecodes go back.
        for times in cluster_block_times(s.data):
            assert times == sorted(times), times
    path = tmp_path / "all.webm"
    _write(seg, path)
    packets = sorted(ffprobe(path)["packets"], key=lambda p: int(p["pos"]))
    for kind in (0, 1):  # each track's timestamps rise through the file
        pts = [int(p["pts"]) for p in packets if p["stream_index"] == kind]
        assert pts == sorted(pts) and len(set(pts)) == len(pts)


@PARTS
@pytest.mark.system
def test_a_gap_in_capture_times_is_one_discontinuity(tmp_path: Path, part_us: int | None) -> None:
    asked: list[int] = []
    seg = _segmenter(asked=asked, part_us=part_us)
    video = _vp8_frames(150, gop=15)
    _run(seg, video[:75], 0)  # 2.5 s; then the publisher is gone for 1 s
    before = list(seg.segments)
    assert [s.discontinuity for s in before] == [False, False]
    # It comes back mid-GOP (no keyframe first): frames wait for one, which is asked for.
    asked.clear()
    for i, (data, key) in enumerate(video[80:], start=80):
        w, h = _vp8_dims(data) if key else (0, 0)
        seg.push("video", Frame(i, data, key, w, h), 3_500_000 + (i - 75) * 1_000_000 // FPS)
    assert asked, "no keyframe asked for after the break"
    after = list(seg.segments)
    # The segment open at the break closed one frame after its last frame, not at the gap's end.
    closed = after[2]
    assert closed.start_us == 2_000_137 and not closed.discontinuity
    last_frame_us = 74 * 1_000_000 // FPS + 137
    assert abs(closed.start_us + closed.duration_us - (last_frame_us + 1_000_000 // FPS)) <= 1
    resumed = after[3]
    assert resumed.discontinuity and resumed.start_us >= 3_500_000
    assert [s.discontinuity for s in after].count(True) == 1
    assert [s.sequence for s in after] == list(range(len(after)))
    assert [s.discontinuity_sequence for s in after] == [0, 0, 0] + [1] * (len(after) - 3)
    assert {s.init for s in after} == {1}  # same parameters: the one init segment serves on
    index = seg.index()
    assert [s["discontinuity"] for s in index["segments"]] == [s.discontinuity for s in after]
    # Both sides of the break on one timeline: each frame's pts is the time it was pushed.
    path = tmp_path / "all.webm"
    _write(seg, path)
    pts = [round(float(p["pts_time"]) * 1e6) for p in packets_by_kind(ffprobe(path), "video")]
    assert any(p < 2_500_000 for p in pts) and any(p > 3_500_000 for p in pts)
    assert not [p for p in pts if 2_500_000 < p < 3_500_000]


@PARTS
def test_new_codec_parameters_make_a_new_init_and_a_discontinuity(part_us: int | None) -> None:
    seg = _segmenter(part_us=part_us)
    seg.video_codec = "h264"
    first = _h264_frames(60, gop=15)
    for i, (data, key) in enumerate(first):
        seg.push("video", _h264_frame(i, data, key), 137 + i * 1_000_000 // FPS)
    assert seg.inits == 1 and len(seg.segments) == 1
    # Another encoder at the same size (a new publisher): other parameter sets, same tracks.
    second = _h264_frames(60, gop=15, profile="main")
    for i, (data, key) in enumerate(second):
        seg.push("video", _h264_frame(i, data, key), 2_000_137 + i * 1_000_000 // FPS)
    assert seg.inits == 2
    assert [(s.init, s.discontinuity) for s in seg.segments] == [(2, True)]
    assert seg.index()["init"] == "init.mp4?v=2"


@pytest.mark.parametrize("bad_us", [-5, 100])
def test_frames_before_the_epoch_or_out_of_order_are_dropped(bad_us: int) -> None:
    seg = _segmenter()
    frames = _vp8_frames(2, gop=10)
    key, inter = frames[0], frames[1]
    seg.push("video", Frame(0, key[0], True, *_vp8_dims(key[0])), 100)
    seg.push("video", Frame(1, inter[0], False), bad_us)
    assert seg.dropped == 1


def _h264_frames(count: int, gop: int, profile: str = "baseline") -> list[tuple[bytes, bool]]:
    """libx264 access units, length-prefixed as the H.264 depacketizer gives them."""
    enc = av.CodecContext.create("libx264", "w")
    enc.width, enc.height, enc.pix_fmt = 320, 240, "yuv420p"
    enc.time_base = fractions.Fraction(1, FPS)
    enc.options = {"tune": "zerolatency", "g": str(gop), "keyint_min": str(gop), "bf": "0",
                   "sc_threshold": "0", "profile": profile}
    out = []
    for i in range(count):
        frame = av.VideoFrame(320, 240, "yuv420p")
        rng = random.Random(i % 3)
        for plane in frame.planes:
            plane.update(rng.randbytes(64) * (plane.buffer_size // 64))
        frame.pts = i
        for p in enc.encode(frame):  # type: ignore[arg-type]
            nals = [n for n in bytes(p).replace(b"\0\0\0\1", b"\0\0\1").split(b"\0\0\1") if n]
            data = b"".join(len(n).to_bytes(4, "big") + n for n in nals)
            out.append((data, bool(p.is_keyframe)))
    return out


def _h264_frame(i: int, data: bytes, key: bool) -> Frame:
    sps = next(n for n in nal_units(data) if n[0] & 0x1F == 7) if key else b""
    w, h = sps_dimensions(sps) if key else (0, 0)
    return Frame(i, data, key, w, h)


@PARTS
@pytest.mark.system
def test_h264_opus_in_fragmented_mp4(tmp_path: Path, part_us: int | None) -> None:
    video = _h264_frames(120, gop=15)
    assert [k for _, k in video].count(True) == 8
    seg = _segmenter(part_us=part_us)
    seg.video_codec = "h264"
    seg.add_audio_track("opus", 48000, 2)
    times = {}
    for i, (data, key) in enumerate(video):
        times[i] = 3_000_000 + i * 1_000_000 // FPS + 211
        sps = next(n for n in nal_units(data) if n[0] & 0x1F == 7) if key else b""
        w, h = sps_dimensions(sps) if key else (0, 0)
        seg.push("video", Frame(i, data, key, w, h), times[i])
    assert len(seg.segments) == 3 and seg.init is not None
    assert seg.index()["codecs"][0].startswith("avc1.")
    assert seg.extensions == ("mp4", "m4s")
    path = tmp_path / "all.mp4"
    ranges = _write(seg, path)
    probe = ffprobe(path)
    streams = {s["codec_type"]: s for s in probe["streams"]}
    assert streams["video"]["codec_name"] == "h264"
    assert (streams["video"]["width"], streams["video"]["height"]) == (320, 240)
    for first, s in zip(first_video_packet_per_range(probe, ranges), seg.segments, strict=True):
        assert first is not None and "K" in first["flags"]
        assert abs(float(first["pts_time"]) * 1e6 - s.start_us) <= 500
    got = [float(p["pts_time"]) * 1e6 for p in packets_by_kind(probe, "video")]
    assert max(abs(g - times[i]) for i, g in enumerate(got)) <= 500
    assert len(got) == 90


def _decoded_pts_us(data: bytes) -> list[int]:
    """Every video frame of ``data`` decoded (not only demuxed), as pts in µs."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        assert stream.time_base is not None
        return [round(float(f.pts * stream.time_base) * 1e6)  # type: ignore[operator]
                for packet in container.demux(stream) for f in packet.decode()]


def _close_to(got: list[int], want: list[int]) -> None:
    assert len(got) == len(want)
    assert max(abs(g - w) for g, w in zip(got, want, strict=True)) <= 500


@pytest.mark.parametrize("codec", ["vp8", "h264"])
def test_the_open_segment_grows_by_parts_that_become_the_closed_segment(codec: str) -> None:
    """What a reader of the open segment gets part by part is a prefix of the closed
    segment's bytes, playable as it stands, and all of them when it closes."""
    video = _vp8_frames(75, gop=30) if codec == "vp8" else _h264_frames(75, gop=30)
    audio = _opus_packets(125)
    seg = _segmenter(part_us=200_000)
    seg.video_codec = codec
    changes: list[int] = []
    seg.on_change = lambda: changes.append(len(seg.segments))
    seg.add_audio_track("opus", 48000, 2)
    events = sorted([(i * 1_000_000 // FPS + 137, "video", i) for i in range(len(video))]
                    + [(j * 20_000 + 11, "audio", j) for j in range(len(audio))])
    seen: list[tuple[int, bytes]] = []  # (number, parts so far) after every push
    times: list[int] = []
    for t, kind, i in events:
        if kind == "video":
            data, key = video[i]
            frame = (_h264_frame(i, data, key) if codec == "h264"
                     else Frame(i, data, key, *(_vp8_dims(data) if key else (0, 0))))
            seg.push("video", frame, t)
            times.append(t)
        else:
            seg.push("audio", Frame(i, audio[i], True), t)
        current = seg.open_segment()
        if current is not None:
            seen.append((current.number, b"".join(current.parts)))
    # Keyframes at 0, 1 and 2 s: two closed segments, and the one from 2 s still open.
    assert [s.number for s in seg.segments] == [0, 1000]
    assert seg.init is not None
    for closed in seg.segments:
        prefixes = [p for n, p in seen if n == closed.number]
        # A part every 0.2 s of the 1 s segment, and the last one when it closes.
        assert len({len(p) for p in prefixes}) >= 4
        assert all(closed.data.startswith(p) for p in prefixes)
        # Up to the last cut, at 0.8 s; WebM stores milliseconds.
        _close_to(_decoded_pts_us(seg.init + prefixes[-1]),
                  [t for t in times if closed.start_us <= t < closed.start_us + 800_000])
        _close_to(_decoded_pts_us(seg.init + closed.data),
                  [t for t in times if closed.start_us <= t < closed.start_us + closed.duration_us])
    index = seg.index()
    assert index["part_duration_s"] == 0.2
    assert index["open"] is not None and index["open"]["number"] == 2000
    assert index["open"]["url"] == f"2000.{seg.extensions[1]}"
    assert index["open"]["init"] == 1 and index["open"]["parts"] >= 1
    # Told of every part and of each close, and of the segment count at the moment.
    assert changes.count(0) >= 5 and changes.count(1) >= 5 and 2 in changes


@PARTS
@pytest.mark.system
def test_a_pause_in_the_audio_keeps_the_init_segment_and_the_window(
    tmp_path: Path, part_us: int | None,
) -> None:
    """The MP4 muxer leaves out the sample entry of a track without samples: a part or
    segment with no audio (the audio paused) must not make an init segment without Opus."""
    video, audio = _h264_frames(120, gop=15), _opus_packets(50)
    seg = _segmenter(part_us=part_us)
    seg.video_codec = "h264"
    seg.add_audio_track("opus", 48000, 2)
    events = sorted([(i * 1_000_000 // FPS + 137, "video", i) for i in range(len(video))]
                    + [(j * 20_000 + 11, "audio", j) for j in range(len(audio))])  # 1 s
    for t, kind, i in events:
        if kind == "video":
            seg.push("video", _h264_frame(i, *video[i]), t)
        else:
            seg.push("audio", Frame(i, audio[i], True), t)
    assert seg.inits == 1 and seg.discontinuities == 0
    assert [s.number for s in seg.segments] == [0, 1000, 2000]
    path = tmp_path / "all.mp4"
    _write(seg, path)
    probe = ffprobe(path)
    assert {s["codec_type"]: s["codec_name"] for s in probe["streams"]} == {
        "video": "h264", "audio": "opus"}
    assert len(packets_by_kind(probe, "audio")) >= 45


@pytest.mark.system
def test_audio_that_joins_after_the_first_keyframe_starts_the_segments_over(
    tmp_path: Path,
) -> None:
    """The segmenter learns of the audio track from its first packet; when that comes after
    the first keyframe, the init segment (and the open segment) have video only: they are
    made again with both tracks, marked as a discontinuity (the tracks changed)."""
    seg = _segmenter(part_us=200_000)
    video, audio = _vp8_frames(90, gop=15), _opus_packets(150)
    for i in range(5):  # video only at first
        data, key = video[i]
        seg.push("video", Frame(i, data, key, *(_vp8_dims(data) if key else (0, 0))),
                 i * 1_000_000 // FPS + 137)
    assert seg.init is not None and seg.codecs == ["vp8"]
    seg.add_audio_track("opus", 48000, 2)
    assert seg.init is None and seg.open_segment() is None
    times = _run(seg, video[5:], 5 * 1_000_000 // FPS, audio[10:])
    assert seg.codecs == ["vp8", "opus"] and seg.inits == 2
    assert seg.segments[0].discontinuity and seg.segments[0].init == 2
    path = tmp_path / "all.webm"
    _write(seg, path)
    probe = ffprobe(path)
    assert {s["codec_type"] for s in probe["streams"]} == {"video", "audio"}
    assert len(packets_by_kind(probe, "audio")) >= 50 and times
