"""RTP taps: plain RTP from real senders (GStreamer, ffmpeg, a socket) into a stream that WHEP
viewers watch with sync records.

Every sender, socket and viewer is on 127.0.0.0/8; timing limits are generous because the
machine is shared.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sfu_sidecar.relay import RelayService, rtcp
from sfu_sidecar.relay.tap import TapSession, is_rtcp
from sfu_sidecar.relay.taprequest import parse_tap_request
from sfu_sidecar.sync.wire import PublisherState, Source
from tests.relay.conftest import Relay
from tests.relay.peers import mid_of, view, wait_for
from tests.sync.records import ViewerRecords

VIDEO_AUDIO = [
    {"kind": "video", "codec": "vp8", "payload_type": 96},
    {"kind": "audio", "codec": "opus", "payload_type": 111},
]


async def create_tap(http: aiohttp.ClientSession, base: str, body: Any,
                     token: str | None = None) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with http.post(f"{base}/api/taps", json=body, headers=headers) as resp:
        return resp.status, await resp.json()


@contextmanager
def running(cmd: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def gstreamer_sender(video: dict[str, Any], audio: dict[str, Any]) -> list[str]:
    """VP8 + Opus test sources through rtpbin (RTCP sender reports) to the tap's ports."""
    pipeline = (
        "rtpbin name=rb "
        "videotestsrc is-live=true pattern=ball ! video/x-raw,width=320,height=240,"
        "framerate=30/1 ! vp8enc deadline=1 target-bitrate=600000 keyframe-max-dist=30 "
        "! rtpvp8pay pt=96 mtu=1200 ! rb.send_rtp_sink_0 "
        f"rb.send_rtp_src_0 ! udpsink host=127.0.0.1 port={video['rtp_port']} "
        f"rb.send_rtcp_src_0 ! udpsink host=127.0.0.1 port={video['rtcp_port']} "
        "sync=false async=false "
        "audiotestsrc is-live=true wave=sine ! audioconvert ! audioresample ! opusenc "
        "! rtpopuspay pt=111 mtu=1200 ! rb.send_rtp_sink_1 "
        f"rb.send_rtp_src_1 ! udpsink host=127.0.0.1 port={audio['rtp_port']} "
        f"rb.send_rtcp_src_1 ! udpsink host=127.0.0.1 port={audio['rtcp_port']} "
        "sync=false async=false"
    )
    return ["gst-launch-1.0", "-q", *pipeline.split()]


async def decode_for(track: Any, seconds: float) -> list[Any]:
    """Every frame the viewer decodes in ``seconds``."""
    out: list[Any] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            async with asyncio.timeout(left):
                out.append(await track.recv())
        except TimeoutError:
            break
    return out


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


# --- the API ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ([], "JSON object"),
        ({"media": VIDEO_AUDIO}, "stream"),
        ({"stream": "a/b", "media": VIDEO_AUDIO}, "stream"),
        ({"stream": "s", "media": []}, "media"),
        ({"stream": "s", "media": VIDEO_AUDIO, "extra": 1}, "unknown field"),
        ({"stream": "s", "media": [{"kind": "data", "codec": "vp8", "payload_type": 96}]},
         "kind"),
        ({"stream": "s", "media": [{"kind": "video", "codec": "av1", "payload_type": 96}]},
         "never transcodes"),
        ({"stream": "s", "media": [{"kind": "video", "codec": "vp8", "payload_type": 72}]},
         "between 96 and 127"),
        ({"stream": "s", "media": [{"kind": "video", "codec": "vp8", "payload_type": "96"}]},
         "integer"),
        ({"stream": "s", "media": [{"kind": "video", "codec": "vp8", "payload_type": 96,
                                    "clock_rate": 8000}]}, "90000"),
        ({"stream": "s", "media": [{"kind": "audio", "codec": "opus", "payload_type": 96,
                                    "ssrc": 2**32}]}, "ssrc"),
        ({"stream": "s", "media": [VIDEO_AUDIO[0], VIDEO_AUDIO[0]]}, "one audio"),
        ({"stream": "s", "media": [VIDEO_AUDIO[0], {**VIDEO_AUDIO[1], "payload_type": 96}]},
         "own payload_type"),
        ({"stream": "s", "media": VIDEO_AUDIO, "source": "example.com"}, "IP address"),
        ({"stream": "s", "media": VIDEO_AUDIO, "sender_clock": "ptp"}, "sender_clock"),
        ({"stream": "s", "media": VIDEO_AUDIO, "sender_clock": True}, "sender_clock"),
        ({"stream": "s", "media": [{"kind": "video", "codec": "h264", "payload_type": 102,
                                    "parameters": {"packetization-mode": 0}}]},
         "packetization-mode"),
    ],
)
async def test_bad_tap_requests_get_400_with_the_reason(
    relay: Relay, body: Any, reason: str
) -> None:
    status, answer = await create_tap(relay.http, relay.base, body)
    assert status == 400, answer
    assert reason in answer["error"]
    assert relay.service.streams.by_name == {}  # nothing was created


async def test_tap_api_errors_and_conflicts(relay_factory: Any) -> None:
    relay = await relay_factory(host="127.0.0.1", publish_token="pub")
    http, base = relay.http, relay.base
    body = {"stream": "s", "media": VIDEO_AUDIO}
    status, answer = await create_tap(http, base, body)
    assert status == 401 and "Bearer" in answer["error"]
    status, answer = await create_tap(http, base, body, token="wrong")
    assert status == 401
    async with http.post(f"{base}/api/taps", data=b"{",
                         headers={"Authorization": "Bearer pub",
                                  "Content-Type": "application/json"}) as resp:
        assert resp.status == 400 and "JSON" in (await resp.json())["error"]
    async with http.post(f"{base}/api/taps", data=b"{}",
                         headers={"Authorization": "Bearer pub",
                                  "Content-Type": "text/plain"}) as resp:
        assert resp.status == 415
    status, tap = await create_tap(http, base, body, token="pub")
    assert status == 201, tap
    # One publisher per stream: a second tap, or a WHIP publisher, is refused.
    status, answer = await create_tap(http, base, body, token="pub")
    assert status == 409 and "already has a publisher" in answer["error"]
    async with http.get(f"{base}/api/taps/{'0' * 32}") as resp:
        assert resp.status == 404 and "no tap" in (await resp.json())["error"]
    async with http.delete(f"{base}{tap['location']}") as resp:
        assert resp.status == 401  # ending a tap needs the token too
    async with http.get(f"{base}/api/taps") as resp:
        listing = await resp.json()
    assert [t["id"] for t in listing["taps"]] == [tap["id"]]
    # The tap is not a WHIP or WHEP resource.
    async with http.delete(f"{base}/whip/s/{tap['id']}",
                           headers={"Authorization": "Bearer pub"}) as resp:
        assert resp.status == 404
    async with http.delete(f"{base}/whep/s/{tap['id']}") as resp:
        assert resp.status == 404
    async with http.delete(f"{base}{tap['location']}",
                           headers={"Authorization": "Bearer pub"}) as resp:
        assert resp.status == 200
        assert (await resp.json())["ended"] == "deleted"
    async with http.get(f"{base}{tap['location']}") as resp:
        assert resp.status == 404
    assert relay.service.streams.by_name == {}


async def test_tap_ports_come_from_the_ice_port_range_in_rtp_rtcp_pairs(
    relay_factory: Any,
) -> None:
    # 20 ports nobody holds right now (the machine is shared): tried window by window.
    low = next((p for p in range(46200, 47800, 40)
                if all(port_free(q) for q in range(p, p + 20))), None)
    assert low is not None, "no free window of 20 UDP ports"
    relay = await relay_factory(host="127.0.0.1", ice_port_range=f"{low}-{low + 19}")
    taps = []
    for n in range(5):  # 5 taps x 2 media x 2 ports fill the 20 ports
        status, tap = await create_tap(relay.http, relay.base,
                                       {"stream": f"s{n}", "media": VIDEO_AUDIO})
        assert status == 201, tap
        taps.append(tap)
    ports = []
    for tap in taps:
        for media in tap["media"]:
            assert media["rtp_port"] % 2 == 0 and media["rtcp_port"] == media["rtp_port"] + 1
            ports += [media["rtp_port"], media["rtcp_port"]]
    assert sorted(ports) == list(range(low, low + 20))
    async with relay.http.post(f"{relay.base}/api/taps",
                               json={"stream": "full", "media": VIDEO_AUDIO}) as resp:
        assert resp.status == 503
        assert resp.headers["Retry-After"]
        assert "ice_port_range" in (await resp.json())["error"]
    assert "full" not in relay.service.streams.by_name
    async with relay.http.delete(f"{relay.base}{taps[0]['location']}") as resp:
        assert resp.status == 200
    freed = [m["rtp_port"] for m in taps[0]["media"]] + [m["rtcp_port"] for m in taps[0]["media"]]
    assert all(port_free(p) for p in freed)
    status, again = await create_tap(relay.http, relay.base,
                                     {"stream": "again", "media": VIDEO_AUDIO})
    assert status == 201
    assert {m["rtp_port"] for m in again["media"]} <= set(freed)


# --- real senders -------------------------------------------------------------------------


@pytest.mark.needs("gst-launch-1.0")
async def test_gstreamer_sender_through_a_tap_reaches_whep_viewers_with_capture_times(
    app_base: tuple[str, RelayService], tmp_path: Path,
) -> None:
    base, relay = app_base
    async with aiohttp.ClientSession() as http:
        status, tap = await create_tap(http, base, {"stream": "gst", "media": VIDEO_AUDIO})
        assert status == 201, tap
        video, audio = tap["media"]
        session = relay.find_tap(tap["id"])
        assert isinstance(session, TapSession)
        with running(gstreamer_sender(video, audio), tmp_path / "gst.log") as sender:
            viewer = await view(http, base, "gst", data_channel="sync")
            started = time.monotonic()
            records = ViewerRecords()
            viewer.channel.on("message", records.feed)
            try:
                await wait_for(lambda: "video" in viewer.tracks, 20, "the viewer's video track")
                decoded = await decode_for(viewer.tracks["video"], 10)
                assert sender.poll() is None, (tmp_path / "gst.log").read_text()
                # 30 fps for 10 s; a loaded machine may lose some, never most.
                assert len(decoded) >= 150, len(decoded)
                assert {(f.width, f.height) for f in decoded} == {(320, 240)}

                # Capture times come from the sender's RTCP sender reports (rtpbin sends one
                # every few seconds), estimated since the sender never joined the house clock.
                async def sync_tracks() -> dict[str, Any]:
                    async with http.get(f"{base}/api/sync") as resp:
                        body = await resp.json()
                    pub = next(p for p in body["publishers"] if p["stream"] == "gst")
                    return dict(pub["tracks"])

                for _ in range(40):  # up to 20 s
                    tracks = await sync_tracks()
                    if all(tracks.get(k, {}).get("source") == "sender_report"
                           for k in ("audio", "video")):
                        break
                    await asyncio.sleep(0.5)
                print(f"gstreamer tap: {len(decoded)} frames decoded in 10 s; capture times "
                      f"from {tracks['video']['source']} {time.monotonic() - started:.1f} s "
                      "after the viewer joined")
                assert tracks["video"]["source"] == "sender_report", tracks
                assert tracks["audio"]["source"] == "sender_report", tracks
                assert any(isinstance(c, PublisherState) and c.live for c in records.controls)
                assert tracks["video"]["estimated"] is True
                assert tracks["video"]["sender_reports_refused"] == 0
                # ...and reach the viewer as sync records for the frames it is sent.
                track = records.track_for(mid_of(viewer, "video"))
                await wait_for(
                    lambda: any(src == Source.SENDER_REPORT and est
                                for (t, _), (_, src, est) in records.frames.items()
                                if t == track),
                    10, "frame records mapped from sender reports",
                )
                # RTCP feedback goes where the sender's RTCP came from (rtpbin's udpsinks).
                status_body = session.status()
                assert all(a is not None and a.startswith("127.0.0.1:")
                           for a in status_body["feedback_to"]), status_body

                # Garbage to both ports is counted; media keeps flowing.
                errors = (session.counters.parse_errors, session.counters.rtcp_errors)
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as junk:
                    for _ in range(5):
                        junk.sendto(b"\x00garbage", ("127.0.0.1", video["rtp_port"]))
                        junk.sendto(b"\x80\xc8\x00\x09", ("127.0.0.1", video["rtcp_port"]))
                        junk.sendto(b"", ("127.0.0.1", audio["rtp_port"]))
                await wait_for(
                    lambda: (session.counters.parse_errors - errors[0],
                             session.counters.rtcp_errors - errors[1]) == (10, 5),
                    5, "the garbage counted",
                )
                packets = session.tracks[0].stats.packets_received
                await wait_for(lambda: session.tracks[0].stats.packets_received > packets + 30,
                               10, "media after the garbage")
                async with http.get(f"{base}/metrics") as resp:
                    metrics = await resp.text()
                assert 'sfu_sidecar_relay_bad_packets_total{reason="rtp",stream="gst"} 10.0' \
                    in metrics

                # DELETE ends the tap: ports closed, the stream left without a publisher, the
                # viewer still connected and told so on its sync channel.
                async with http.delete(f"{base}{tap['location']}") as resp:
                    assert resp.status == 200
                assert relay.streams.get("gst").publisher is None
                assert all(port_free(m[p]) for m in tap["media"]
                           for p in ("rtp_port", "rtcp_port"))
                await wait_for(
                    lambda: any(isinstance(c, PublisherState) and not c.live
                                for c in records.controls),
                    5, "the viewer told the publisher left",
                )
                assert viewer.pc.connectionState == "connected"
            finally:
                await viewer.close()


@pytest.mark.needs("ffmpeg")
async def test_ffmpeg_rtp_output_through_a_tap(
    app_base: tuple[str, RelayService], tmp_path: Path,
) -> None:
    base, relay = app_base
    ssrc = 0x5EEDF00D
    async with aiohttp.ClientSession() as http:
        body = {"stream": "ff", "source": "127.0.0.1",
                "media": [{"kind": "video", "codec": "vp8", "payload_type": 97, "ssrc": ssrc}]}
        status, tap = await create_tap(http, base, body)
        assert status == 201, tap
        port, rtcp_port = tap["media"][0]["rtp_port"], tap["media"][0]["rtcp_port"]
        session = relay.find_tap(tap["id"])
        assert session is not None
        # The clip is encoded beforehand: ffmpeg's sender reports count time from its first
        # packet, so an encoder start-up of 50-100 ms on a loaded machine would put every
        # report's capture time after the media's arrival (rightly refused by the relay).
        clip = tmp_path / "clip.webm"
        await asyncio.to_thread(
            subprocess.run,
            ["ffmpeg", "-nostdin", "-loglevel", "error", "-f", "lavfi",
             "-i", "testsrc=size=320x240:rate=30", "-t", "40", "-c:v", "libvpx",
             "-deadline", "realtime", "-cpu-used", "8", "-b:v", "600k", "-g", "30", str(clip)],
            check=True, timeout=60,
        )
        cmd = ["ffmpeg", "-nostdin", "-loglevel", "error", "-re", "-i", str(clip), "-c", "copy",
               "-payload_type", "97", "-ssrc", str(ssrc), "-f", "rtp",
               # ffmpeg's default of 1472-byte packets is over what a tap forwards.
               f"rtp://127.0.0.1:{port}?rtcpport={rtcp_port}&pkt_size=1200"]
        with running(cmd, tmp_path / "ffmpeg.log"):
            viewer = await view(http, base, "ff", kinds=("video",))
            try:
                await wait_for(lambda: "video" in viewer.tracks, 20, "the viewer's video track")
                decoded = await decode_for(viewer.tracks["video"], 8)
                assert len(decoded) >= 120, (len(decoded), (tmp_path / "ffmpeg.log").read_text())
                assert {(f.width, f.height) for f in decoded} == {(320, 240)}
                assert session.tracks[0].media_ssrc == ssrc
                # A packet with another SSRC, or from another address, is not the sender's.
                forged = bytes.fromhex("80e10001000000010000beef") + b"\x90\x80\x00\x00"
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:
                    other.bind(("127.0.0.2", 0))
                    other.sendto(bytes.fromhex("80610001000000015eedf00d") + b"x",
                                 ("127.0.0.1", port))
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as same:
                    same.sendto(forged, ("127.0.0.1", port))
                await wait_for(lambda: session.counters.foreign_packets == 2, 5,
                               "both forged packets dropped")
                # ffmpeg sends a sender report every 5 s.
                async def source() -> Any:
                    async with http.get(f"{base}/api/sync") as resp:
                        body = await resp.json()
                    pub = next(p for p in body["publishers"] if p["stream"] == "ff")
                    return pub["tracks"]["video"]["source"]

                for _ in range(40):  # up to 20 s
                    if await source() == "sender_report":
                        break
                    await asyncio.sleep(0.5)
                assert await source() == "sender_report"
                print(f"ffmpeg tap: {len(decoded)} frames decoded in 8 s")
            finally:
                await viewer.close()


async def test_keyframe_requests_go_to_where_the_senders_rtcp_came_from(
    relay_factory: Any,
) -> None:
    """A hand-made sender: VP8 delta frames (so the viewer keeps waiting for a keyframe) from
    one socket and RTCP from another; PLIs arrive at the RTCP socket, never at a host that
    sent only RTCP."""
    relay = await relay_factory(host="127.0.0.1")
    ssrc = 0x01020304
    status, tap = await create_tap(relay.http, relay.base, {
        "stream": "pli", "media": [{"kind": "video", "codec": "vp8", "payload_type": 96}]})
    assert status == 201
    port, rtcp_port = tap["media"][0]["rtp_port"], tap["media"][0]["rtcp_port"]
    media = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    feedback = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    feedback.bind(("127.0.0.1", 0))
    stranger.bind(("127.0.0.2", 0))
    for s in (media, feedback, stranger):
        s.setblocking(False)
    viewer = await view(relay.http, relay.base, "pli", kinds=("video",), decode=False)
    try:
        sr = rtcp.build_sr(ssrc, rtcp.SenderReport(ntp_timestamp=0x1_0000_0000,
                                                   rtp_timestamp=0, packet_count=1,
                                                   octet_count=1))
        stranger.sendto(sr, ("127.0.0.1", rtcp_port))  # before any media: not a sender
        received: list[bytes] = []
        for seq in range(200):  # about 8 s at 25 packets/s, bounded
            # A VP8 payload descriptor with S=1 and a delta frame (P bit set): no keyframe.
            header = struct.pack("!BBHII", 0x80, 0x80 | 96, seq, seq * 3000, ssrc)
            media.sendto(header + b"\x10\x01" + bytes(40), ("127.0.0.1", port))
            if seq % 10 == 0:
                feedback.sendto(sr, ("127.0.0.1", rtcp_port))
                stranger.sendto(sr, ("127.0.0.1", rtcp_port))
            await asyncio.sleep(0.04)
            try:
                while True:
                    received.append(feedback.recv(2048))
            except BlockingIOError:
                pass
            if any(isinstance(m, rtcp.KeyframeRequest)
                   for data in received for m in rtcp.parse_compound(data)):
                break
        plis = [m for data in received for m in rtcp.parse_compound(data)
                if isinstance(m, rtcp.KeyframeRequest)]
        assert plis and plis[0].media_ssrcs == (ssrc,) and not plis[0].fir
        with pytest.raises(BlockingIOError):
            stranger.recv(2048)
        session = relay.service.find_tap(tap["id"])
        assert session is not None
        assert session.status()["feedback_to"] == [f"127.0.0.1:{feedback.getsockname()[1]}"]
    finally:
        await viewer.close()
        for s in (media, feedback, stranger):
            s.close()


async def test_rtcp_multiplexed_on_the_rtp_port_is_taken_as_rtcp_and_big_packets_counted(
    relay_factory: Any,
) -> None:
    relay = await relay_factory(host="127.0.0.1")
    ssrc = 0x0A0B0C0D
    status, tap = await create_tap(relay.http, relay.base, {
        "stream": "mux",
        "media": [{"kind": "audio", "codec": "opus", "payload_type": 111, "ssrc": ssrc}]})
    assert status == 201
    port = tap["media"][0]["rtp_port"]
    session = relay.service.find_tap(tap["id"])
    assert session is not None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for seq in range(5):
            s.sendto(struct.pack("!BBHII", 0x80, 111, seq, seq * 960, ssrc) + b"\xfc" * 20,
                     ("127.0.0.1", port))
        sr = rtcp.build_sr(ssrc, rtcp.SenderReport(ntp_timestamp=0x1_0000_0000,
                                                   rtp_timestamp=4800, packet_count=5,
                                                   octet_count=100))
        assert is_rtcp(sr)
        s.sendto(sr, ("127.0.0.1", port))
        # A payload larger than any viewer could be sent (MAX_PAYLOAD_BYTES): counted, not
        # forwarded; one at the limit, behind a header extension, is forwarded.
        s.sendto(struct.pack("!BBHII", 0x80, 111, 5, 5 * 960, ssrc) + bytes(1301),
                 ("127.0.0.1", port))
        s.sendto(struct.pack("!BBHIIHH", 0x90, 111, 6, 6 * 960, ssrc, 0xBEDE, 2) + bytes(8)
                 + bytes(1300), ("127.0.0.1", port))
        await wait_for(lambda: session.tracks[0].last_sr is not None, 5, "the SR taken")
        await wait_for(lambda: session.counters.oversize_packets == 1, 5, "the big one counted")
    assert session.tracks[0].stats.packets_received == 6
    assert session.counters.parse_errors == 0 and session.counters.unknown_payload == 0
    assert session.status()["feedback_to"][0] is not None  # answered on the RTP port


async def test_a_tap_that_never_receives_media_is_dropped_at_the_connect_deadline(
    relay_factory: Any,
) -> None:
    relay = await relay_factory(host="127.0.0.1", session_connect_timeout_s="1",
                                publisher_timeout_s="1")
    status, tap = await create_tap(relay.http, relay.base, {
        "stream": "idle", "media": [VIDEO_AUDIO[1]]})
    assert status == 201
    session = relay.service.find_tap(tap["id"])
    assert session is not None
    await wait_for(lambda: session.closed.is_set(), 10, "the idle tap dropped")
    assert session.ended_reason == "connect_timeout"
    # The session is marked closed before its sockets are released.
    await wait_for(lambda: port_free(tap["media"][0]["rtp_port"]), 5, "the tap's port freed")


def test_parse_tap_request_fills_in_codec_details() -> None:
    request = parse_tap_request({
        "stream": "s", "source": "::ffff:127.0.0.1",
        "media": [{"kind": "video", "codec": "H264", "payload_type": 102,
                   "parameters": {"profile-level-id": "42E01F"}},
                  {"kind": "audio", "codec": "opus", "payload_type": 111, "clock_rate": 48000,
                   "channels": 2, "ssrc": 7}],
    })
    video, audio = request.media
    assert (video.codec.name, video.codec.clock_rate, video.codec.parameters["profile-level-id"],
            video.codec.parameters["packetization-mode"]) == ("h264", 90000, "42e01f", 1)
    assert (audio.codec.name, audio.codec.clock_rate, audio.codec.channels, audio.ssrc) == (
        "opus", 48000, 2, 7)
    assert video.codec.forwardable and audio.codec.forwardable
    assert request.source == "127.0.0.1"  # compared with IPv4 senders' addresses as such


def ffmpeg_av(seconds: float) -> list[str]:
    """ffmpeg with a test picture and a tone, both ending after ``seconds``."""
    return ["ffmpeg", "-nostdin", "-loglevel", "error", "-re",
            "-t", str(seconds), "-f", "lavfi", "-i", "testsrc=size=320x240:rate=30",
            "-t", str(seconds), "-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000"]


def ffmpeg_av_outputs(video_port: int, audio_port: int, rtcp: dict[int, int]) -> list[str]:
    def url(port: int) -> str:
        extra = f"&rtcpport={rtcp[port]}" if port in rtcp else ""
        return f"rtp://127.0.0.1:{port}?pkt_size=1200{extra}"

    return ["-map", "0:v", "-c:v", "libvpx", "-deadline", "realtime", "-cpu-used", "8",
            "-b:v", "600k", "-g", "30", "-payload_type", "97", "-f", "rtp", url(video_port),
            "-map", "1:a", "-c:a", "libopus", "-payload_type", "111", "-f", "rtp",
            url(audio_port)]


@pytest.mark.needs("ffmpeg")
async def test_a_tap_described_by_the_sdp_ffmpeg_writes(
    app_base: tuple[str, RelayService], tmp_path: Path,
) -> None:
    """The SDP ffmpeg writes for its RTP outputs (``-sdp_file``) creates the tap as is: its
    codecs and payload types, the stream named in the query; then ffmpeg's VP8 and Opus reach
    a WHEP viewer through it."""
    base, _ = app_base
    sdp_file = tmp_path / "sender.sdp"
    # A short run to nowhere (the discard port) only to have ffmpeg write its SDP.
    dry = await asyncio.create_subprocess_exec(
        *ffmpeg_av(0.2), *ffmpeg_av_outputs(9, 11, {}), "-sdp_file", str(sdp_file),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    await asyncio.wait_for(dry.wait(), 60)
    sdp = sdp_file.read_text()
    assert "a=rtpmap:97 VP8/90000" in sdp and "a=rtpmap:111 opus/48000/2" in sdp, sdp
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/api/taps?stream=ffsdp&source=127.0.0.1", data=sdp,
                             headers={"Content-Type": "application/sdp"}) as resp:
            tap = await resp.json()
            assert resp.status == 201, tap
        kinds = {m["kind"]: m for m in tap["media"]}
        assert (kinds["video"]["codec"], kinds["video"]["payload_type"]) == ("vp8", 97)
        assert (kinds["audio"]["codec"], kinds["audio"]["payload_type"]) == ("opus", 111)
        video, audio = kinds["video"], kinds["audio"]
        cmd = [*ffmpeg_av(40), *ffmpeg_av_outputs(
            video["rtp_port"], audio["rtp_port"],
            {video["rtp_port"]: video["rtcp_port"], audio["rtp_port"]: audio["rtcp_port"]})]
        with running(cmd, tmp_path / "ffmpeg.log"):
            viewer = await view(http, base, "ffsdp", kinds=("audio", "video"))
            try:
                await wait_for(lambda: {"audio", "video"} <= set(viewer.tracks), 20,
                               "the viewer's tracks")
                decoded = await decode_for(viewer.tracks["video"], 6)
                assert len(decoded) >= 90, (len(decoded), (tmp_path / "ffmpeg.log").read_text())
                sound = await decode_for(viewer.tracks["audio"], 2)
                assert len(sound) >= 50  # 20 ms Opus frames
            finally:
                await viewer.close()


@pytest.mark.parametrize(("query", "sdp", "reason"), [
    ("stream=s", "m=video 9 RTP/AVP 97\r\n", "must start with v=0"),
    ("", "v=0\r\nm=video 9 RTP/AVP 97\r\na=rtpmap:97 VP8/90000\r\n", "stream in the query"),
    ("stream=s", "v=0\r\nm=video 9 RTP/AVP 34\r\na=rtpmap:34 H263/90000\r\n",
     "offered: H263"),
    ("stream=s", "v=0\r\nm=video 9 RTP/AVP 97\r\na=rtpmap:97 VP8/48000\r\n",
     "vp8 is clocked at 90000 Hz"),
    ("stream=s", "v=0\r\nm=audio 9 RTP/AVP 20\r\na=rtpmap:20 opus/48000/2\r\n",
     "payload_type must be between 96 and 127"),
    ("stream=s", "v=0\r\ns=-\r\n", "media must be a list"),
])
async def test_a_tap_sdp_that_cannot_be_served_is_refused_with_the_reason(
    app_base: tuple[str, RelayService], query: str, sdp: str, reason: str,
) -> None:
    base, _ = app_base
    async with aiohttp.ClientSession() as http, http.post(
        f"{base}/api/taps?{query}", data=sdp, headers={"Content-Type": "application/sdp"},
    ) as resp:
        body = await resp.json()
        assert resp.status == 400 and reason in body["error"], body
