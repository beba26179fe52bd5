"""Sync metadata end to end: aiortc publisher -> relay -> aiortc viewer with a ``sync`` channel.

The publisher is the synthetic source, whose every frame has a known capture instant and carries
its frame number in its pixels; the viewer decodes frames, reads the number back, and checks the
capture time the relay's records give for the RTP timestamp it received.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from sfu_sidecar.app import SERVICES_KEY, build_app
from sfu_sidecar.client.whip import WhipSession, publish
from sfu_sidecar.config import load_settings
from sfu_sidecar.ntptime import ntp_to_unix_ns
from sfu_sidecar.relay import rtcp
from sfu_sidecar.relay.hooks import ABS_CAPTURE_TIME, SenderReport
from sfu_sidecar.sync.abscapture import AbsCaptureTime
from sfu_sidecar.sync.wire import (
    Cue,
    Epoch,
    Source,
)
from sfu_sidecar.syncchannel.service import SyncService
from sfu_sidecar.synthetic import BeepAudioTrack, FlashVideoTrack, Timeline, decode_frame_number
from tests.conftest import IN_PROCESS
from tests.relay.peers import LOOPBACK, Peer, view, wait_for
from tests.sync.records import ViewerRecords

MASK32 = 0xFFFFFFFF
TOLERANCE_NS = 1_000_000


@pytest.fixture
async def relay_base(tmp_path: Path) -> AsyncIterator[tuple[str, SyncService]]:
    settings = load_settings({"ice_addresses": "127.0.0.1", "data_dir": str(tmp_path),
                              **IN_PROCESS})
    app = build_app(settings)
    sync = app[SERVICES_KEY].components.sync
    assert sync is not None
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}", sync
    finally:
        await server.close()


async def start_publisher(base: str, stream: str, *, stamp: bool) -> tuple[
    WhipSession, FlashVideoTrack, Timeline
]:
    timeline = Timeline.starting_now(time.time_ns)
    video = FlashVideoTrack(timeline)
    session = await publish(
        f"{base}/whip/{stream}", [BeepAudioTrack(timeline), video],
        capture_start_ns=timeline.start_house_ns if stamp else None,
        ice_addresses=LOOPBACK,
    )
    return session, video, timeline


def collect(peer: Peer) -> ViewerRecords:
    records = ViewerRecords()
    peer.channel.on("message", records.feed)
    return records


async def decoded_frames(peer: Peer, count: int) -> list[tuple[int, int]]:
    """(frame number read from the pixels, RTP timestamp the viewer received) per frame."""
    track = peer.tracks["video"]
    video_pt = None
    out = []
    async with asyncio.timeout(20):
        while len(out) < count:
            frame = await track.recv()
            if video_pt is None:
                # aiortc's receiver reports pts relative to the first RTP timestamp it got.
                ssrc = _ssrc(peer, "video")
                first = next(p for p in peer.received if p.ssrc == ssrc)
                video_pt = first.timestamp
            luma = frame.to_ndarray(format="yuv420p")[: frame.height]
            out.append((decode_frame_number(luma), (frame.pts + video_pt) & MASK32))
    return out


def sender_reports(peer: Peer) -> list[tuple[int, SenderReport]]:
    out = []
    for data in peer.rtcp_received:
        for message in rtcp.parse_compound(data):
            if isinstance(message, rtcp.SenderReportPacket):
                out.append((message.ssrc, message.info))
    return out


def _section(peer: Peer, kind: str) -> list[str]:
    """Lines of the relay's answer in the ``kind`` m-section."""
    return peer.answer.split(f"m={kind}", 1)[1].split("m=", 1)[0].splitlines()


def _ssrc(peer: Peer, kind: str) -> int:
    line = next(x for x in _section(peer, kind) if x.startswith("a=ssrc:"))
    return int(line.split()[0].split(":")[1])

async def test_every_viewer_frame_maps_to_its_true_capture_time(
    relay_base: tuple[str, SyncService],
) -> None:
    base, sync = relay_base
    publisher, video, timeline = await start_publisher(base, "s", stamp=True)
    async with aiohttp.ClientSession() as http:
        viewer = await view(http, base, "s", data_channel="sync")
        records = collect(viewer)
        try:
            report = await publisher.joined()
            assert report is not None and abs(report.offset_ns) < 2_000_000  # same host clock
            frames = await decoded_frames(viewer, 60)
            video_track = records.track_for(_mid(viewer, "video"))
            # The last frame's record leaves in the next batch (within 200 ms).
            await wait_for(lambda: records.frame(video_track, frames[-1][1]) is not None, 3,
                           "the record of the last decoded frame")
            errors, estimated, unmapped = [], 0, 0
            for number, rtp_ts in frames:
                found = records.frame(video_track, rtp_ts)
                if found is None:
                    unmapped += 1
                    continue
                capture, source, is_estimated = found
                assert source == Source.ABS_CAPTURE_TIME
                if is_estimated:
                    # Before the publisher's clock join lands (~0.3 s) its offset is estimated
                    # from arrival times, and the records say so.
                    estimated += 1
                    continue
                errors.append(abs(capture - video.capture_log[number]))
            assert unmapped == 0
            assert estimated <= 15, estimated
            assert len(errors) >= 45 and max(errors) <= TOLERANCE_NS, sorted(errors)[-5:]

            # Audio is on the same timeline: each audio frame's capture time sits on the
            # source's 20 ms grid from the common start.
            audio_track = records.track_for(_mid(viewer, "audio"))
            audio = [c for (t, _), (c, _, est) in records.frames.items()
                     if t == audio_track and not est]
            assert len(audio) > 50
            for capture in audio:
                phase = (capture - timeline.start_house_ns) % 20_000_000
                assert min(phase, 20_000_000 - phase) <= TOLERANCE_NS

            # Every packet of a frame whose capture time is exact carries abs-capture-time in
            # house time, the same capture time as the records give it; a frame whose capture
            # time is estimated carries none (the extension cannot say "estimated", and the
            # publisher's own stamp, on its clock, is taken out).
            ext_id = _extension_id(viewer, "video", ABS_CAPTURE_TIME)
            stamped = withheld = 0
            for packet in viewer.received:
                if packet.ssrc != _ssrc(viewer, "video"):
                    continue
                value = dict(packet.extensions).get(ext_id)
                found = records.frame(video_track, packet.timestamp)
                if found is None:
                    continue
                if found[2]:
                    assert value is None, packet
                    withheld += 1
                    continue
                assert value is not None, packet
                stamped_ns = ntp_to_unix_ns(AbsCaptureTime.parse(value).capture_ntp)
                assert abs(stamped_ns - found[0]) <= 1_000  # NTP Q32.32 rounding
                stamped += 1
            assert stamped > 50
            print(f"\npackets with abs-capture-time: {stamped}; without (estimated): {withheld}")

            # Sender reports to the viewer are rebuilt from capture time: the NTP field is the
            # capture time of the RTP timestamp they carry, for audio and video alike.
            await wait_for(lambda: len(sender_reports(viewer)) >= 4, 5, "sender reports")
            by_ssrc = {_ssrc(viewer, "video"): video_track, _ssrc(viewer, "audio"): audio_track}
            for ssrc, report in sender_reports(viewer)[-4:]:
                anchor = records.current[by_ssrc[ssrc]]
                expected = anchor.capture_of(report.rtp_timestamp)
                assert abs(ntp_to_unix_ns(report.ntp_timestamp) - expected) <= TOLERANCE_NS

            # The epoch (first frame's capture time) reached the viewer as a control message.
            epochs = [c for c in records.controls if isinstance(c, Epoch)]
            assert epochs and abs(epochs[0].epoch_ns - timeline.start_house_ns) <= TOLERANCE_NS

            status = sync.viewers[next(iter(sync.viewers))].status(time.time_ns())
            print(f"\nsync traffic per viewer: {status['messages_per_s']} messages/s, "
                  f"{status['bytes_per_s']} bytes/s")
            assert status["messages_per_s"] <= 5.5
        finally:
            await viewer.close()
            await publisher.close()


async def test_without_capture_stamps_sender_reports_give_the_map(
    relay_base: tuple[str, SyncService],
) -> None:
    base, _ = relay_base
    publisher, video, _ = await start_publisher(base, "sr", stamp=False)
    async with aiohttp.ClientSession() as http:
        viewer = await view(http, base, "sr", data_channel="sync")
        records = collect(viewer)
        try:
            # aiortc sends its first SR about a second in; frames before it map by arrival.
            await wait_for(
                lambda: any(a.source == Source.SENDER_REPORT and not a.audio
                            for a in records.current.values()),
                8, "a video anchor built from sender reports",
            )
            track = records.track_for(_mid(viewer, "video"))
            errors: list[int] = []
            # The decoder still holds frames from before that anchor, mapped by arrival and
            # flagged so: decode on past them (up to 10 s of video) to 20 mapped from the
            # sender reports, which are what is judged here.
            for _ in range(10):
                frames = await decoded_frames(viewer, 30)
                await wait_for(lambda f=frames: records.frame(track, f[-1][1]) is not None, 3,
                               "the record of the last decoded frame")
                for n, ts in frames:
                    found = records.frame(track, ts)
                    assert found is not None
                    if found[1] == Source.SENDER_REPORT:
                        errors.append(abs(found[0] - video.capture_log[n]))
                if len(errors) >= 20:
                    break
            assert len(errors) >= 20, len(errors)
            # aiortc builds its SRs from the time it sends the report, after encoding (several
            # ms for VP8 here), so SR-derived capture times trail the true ones by that much.
            assert max(errors) <= 40_000_000, sorted(errors)[-5:]
        finally:
            await viewer.close()
            await publisher.close()


async def post_hello(http: aiohttp.ClientSession, base: str, stream: str,
                     timeline: Timeline) -> None:
    """Posts cue ``c1``, "hello", over [3 s, 4.5 s) of the publisher's timeline."""
    cue = {"id": "c1", "start": timeline.start_house_ns + 3_000_000_000,
           "end": timeline.start_house_ns + 4_500_000_000, "text": "hello"}
    async with http.post(f"{base}/api/streams/{stream}/captions",
                         json={"timebase": "house_ns", "lang": "en", "cues": [cue]}) as resp:
        assert resp.status in (200, 201), await resp.text()


@pytest.mark.parametrize("poll_loop", [True, False], ids=["polled", "poll-loop-stopped"])
async def test_captions_reach_viewers_on_the_channel(
    relay_base: tuple[str, SyncService], poll_loop: bool,
) -> None:
    """A posted cue reaches the viewer's channel; with the 50 ms poll loop stopped it still
    does, because the caption change itself sends it (what makes a barge-in's cut reach the
    screen within a frame or two)."""
    base, _ = relay_base
    publisher, _, timeline = await start_publisher(base, "cap", stamp=True)
    async with aiohttp.ClientSession() as http:
        viewer = await view(http, base, "cap", data_channel="sync")
        records = collect(viewer)
        try:
            # Media fixes the epoch (its first frame's capture time) once the publisher joined.
            await wait_for(lambda: any(isinstance(c, Epoch) for c in records.controls), 5,
                           "the stream epoch")
            if not poll_loop:
                (poll,) = [t for t in asyncio.all_tasks() if t.get_name() == "sync-poll"]
                poll.cancel()
            await post_hello(http, base, "cap", timeline)
            await wait_for(lambda: any(isinstance(c, Cue) for c in records.controls), 3,
                           "the cue on the sync channel")
            got = next(c for c in records.controls if isinstance(c, Cue))
            assert (got.id, got.text, got.start, got.end) == ("c1", "hello", 3.0, 4.5)
        finally:
            await viewer.close()
            await publisher.close()


def _extension_id(peer: Peer, kind: str, uri: str) -> int:
    line = next(x for x in _section(peer, kind) if x.startswith("a=extmap:") and uri in x)
    return int(line.split(":", 1)[1].split()[0].split("/")[0])


def _mid(peer: Peer, kind: str) -> str:
    return next(x.split(":", 1)[1] for x in _section(peer, kind) if x.startswith("a=mid:"))
