"""A sidecar stream fed to a Janus Streaming RTP mountpoint, watched through Janus.

``python -m tests.relay.janus_feed_probe SECONDS`` runs, inside a network namespace of its own
(``unshare -n``, set up as ``tests.relay.janus_tap_probe`` does, whose Janus harness it uses):
Janus with the deployment image's configuration, the service in this process, an aiortc
publisher (WHIP) to the service, a Janus Streaming "rtp" mountpoint created over Janus's HTTP
API, a feed (``POST /api/feeds``, abs-capture-time on) from the service to the mountpoint, and
an aiortc viewer that watches the mountpoint through Janus ("watch", Janus's offer, the
viewer's answer, "start") for SECONDS. A WHEP viewer of the same stream reads the sidecar's
``sync`` channel: its capture times are what the Janus viewer's sender reports are held
against, frame by frame (the two viewers' copies of a publisher packet carry the same payload,
which ties their RTP times together). It prints one JSON line of figures.
"""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import aiohttp
from aiohttp.test_utils import TestServer
from aiortc import MediaStreamTrack, RTCSessionDescription

from sfu_sidecar.app import SERVICES_KEY, build_app
from sfu_sidecar.config import load_settings
from sfu_sidecar.ntptime import ntp_to_unix_ns
from sfu_sidecar.relay import aiortc_adapter, rtcp
from sfu_sidecar.relay.hooks import ABS_CAPTURE_TIME
from sfu_sidecar.relay.packet import RtpPacket
from sfu_sidecar.sync.wire import AnchorRecord
from tests.relay.janus_tap_probe import decode_for
from tests.relay.peers import (
    PatternVideo,
    ToneAudio,
    client_pc,
    mid_of,
    publish,
    received_ssrc,
    view,
    wait_for,
)
from tests.support import janus
from tests.sync.records import ViewerRecords

MOUNTPOINT = 4242
VIDEO_PT, AUDIO_PT = 100, 111
# The mountpoint's ports: the namespace is private, nothing else can hold them.
VIDEO_PORT, VIDEO_RTCP_PORT, AUDIO_PORT, AUDIO_RTCP_PORT = 15004, 15005, 15006, 15007
MASK32 = 0xFFFFFFFF
# The hop from the sidecar to Janus is made slower for video than for audio (a delay line in
# this process; the sandbox has no netem), so that sender reports Janus builds from its own
# clock and ones that carry the sidecar's capture times come apart, and so does lip sync.
HOP_DELAY_S = {"video": 0.150, "audio": 0.050}


def signed32(value: int) -> int:
    return ((value + 2**31) & MASK32) - 2**31


class _Socket(asyncio.DatagramProtocol):
    def __init__(self, on_datagram: Callable[[bytes, Any], None]) -> None:
        self.on_datagram = on_datagram
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.on_datagram(data, addr)

    def error_received(self, exc: Exception) -> None:
        pass  # a port not (yet) listening: the datagram is lost, as on a network

    @property
    def port(self) -> int:
        assert self.transport is not None
        return int(self.transport.get_extra_info("sockname")[1])

    def send(self, data: bytes, addr: Any) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(data, addr)


class DelayLine:
    """Datagrams to :attr:`port` reach ``127.0.0.1:target`` ``delay_s`` later, sent from a
    socket of its own; what comes back to that socket goes, undelayed, to whoever sent last
    (so Janus's RTCP feedback reaches the feed's socket)."""

    def __init__(self, target: int, delay_s: float) -> None:
        self.target = target
        self.delay_s = delay_s
        self.sender: Any = None
        self.returned: list[bytes] = []  # what came back from the target
        self.inbound = _Socket(self._forward)
        self.outbound = _Socket(self._back)

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        for sock in (self.inbound, self.outbound):
            await loop.create_datagram_endpoint(lambda s=sock: s,  # type: ignore[misc]
                                                local_addr=("127.0.0.1", 0))

    @property
    def port(self) -> int:
        return self.inbound.port

    def _forward(self, data: bytes, addr: Any) -> None:
        self.sender = addr
        asyncio.get_running_loop().call_later(
            self.delay_s, self.outbound.send, data, ("127.0.0.1", self.target))

    def _back(self, data: bytes, addr: Any) -> None:
        self.returned.append(data)
        if self.sender is not None:
            self.inbound.send(data, self.sender)

    def close(self) -> None:
        for sock in (self.inbound, self.outbound):
            if sock.transport is not None:
                sock.transport.close()


class JanusViewer:
    """An aiortc peer watching a Janus mountpoint; keeps every RTP packet and RTCP compound
    it receives with its arrival (house time is the host clock here: no PTP, no NTP)."""

    def __init__(self) -> None:
        self.pc = client_pc()
        self.tracks: dict[str, MediaStreamTrack] = {}
        self.rtp: list[tuple[RtpPacket, int]] = []
        self.rtcp: list[tuple[bytes, int]] = []

        @self.pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            self.tracks[track.kind] = track

    def record(self) -> None:
        def on_rtp(data: bytes, _arrival_ms: int) -> bool:
            self.rtp.append((RtpPacket.parse(data), time.time_ns()))
            return True

        for dtls in aiortc_adapter.dtls_transports(self.pc):
            aiortc_adapter.tap_received(
                dtls, rtp=on_rtp, rtcp=lambda data: self.rtcp.append((data, time.time_ns())))

    def sender_reports(self) -> list[tuple[rtcp.SenderReportPacket, int]]:
        out = []
        for data, at in self.rtcp:
            try:
                messages = rtcp.parse_compound(data)
            except ValueError:
                continue
            out += [(m, at) for m in messages if isinstance(m, rtcp.SenderReportPacket)]
        return out


def offer_section(sdp: str, kind: str) -> str:
    return sdp.split(f"m={kind}", 1)[1].split("\nm=", 1)[0]


def ts_delta(a: list[RtpPacket], b: list[RtpPacket]) -> tuple[int | None, int]:
    """RTP time of ``b`` minus that of ``a`` for copies of the same publisher packet (same
    payload, unique in ``b``), and how many packets agreed on it."""
    seen: dict[bytes, list[int]] = {}
    for p in b:
        seen.setdefault(p.payload, []).append(p.timestamp)
    deltas = Counter((ts[0] - p.timestamp) & MASK32 for p in a
                     if len(ts := seen.get(p.payload, [])) == 1)
    if not deltas:
        return None, 0
    delta, count = deltas.most_common(1)[0]
    return delta, count


def summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {"n": len(values), "min": round(min(values), 3), "median":
            round(statistics.median(values), 3), "max": round(max(values), 3)}


async def run(seconds: float, workdir: Path, janus_proc: subprocess.Popen[bytes],
              result: dict[str, Any]) -> None:
    settings = load_settings({"ice_addresses": "127.0.0.1", "host": "127.0.0.1",
                              "data_dir": str(workdir / "data")})
    app = build_app(settings)
    relay = app[SERVICES_KEY].components.relay
    assert relay is not None
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    base = f"http://127.0.0.1:{server.port}"
    watcher = JanusViewer()
    delay_lines: list[DelayLine] = []
    try:
        async with aiohttp.ClientSession() as http:
            janus_base = f"http://127.0.0.1:{janus.HTTP_PORT}/janus"
            await janus.wait_http(http, f"{janus_base}/info", janus_proc)
            publisher = await publish(http, base, "live", video=PatternVideo(),
                                      audio=ToneAudio())
            # The sidecar's own account of capture times: a WHEP viewer's sync channel.
            truth = await view(http, base, "live", data_channel="sync", decode=False)
            records = ViewerRecords()
            anchors: dict[int, list[tuple[int, AnchorRecord]]] = {}

            def on_message(data: bytes) -> None:
                records.feed(data)
                at = time.time_ns()
                for track, anchor in records.current.items():
                    seen = anchors.setdefault(track, [])
                    if not seen or seen[-1][1] is not anchor:
                        seen.append((at, anchor))

            truth.channel.on("message", on_message)
            await wait_for(lambda: set(relay.streams.get("live").codecs) == {"audio", "video"},
                           20, "the publisher's tracks")

            api = janus.JanusHttp(http, janus_base)
            await api.create()
            handle = await api.attach("janus.plugin.streaming")
            created = await api.message(handle, {
                "request": "create", "type": "rtp", "id": MOUNTPOINT, "name": "sidecar",
                "media": [
                    {"type": "video", "mid": "v", "port": VIDEO_PORT,
                     "rtcpport": VIDEO_RTCP_PORT, "pt": VIDEO_PT, "codec": "vp8"},
                    {"type": "audio", "mid": "a", "port": AUDIO_PORT,
                     "rtcpport": AUDIO_RTCP_PORT, "pt": AUDIO_PT, "codec": "opus"},
                ]})
            result["mountpoint"] = created["plugindata"]["data"]

            lines = {port: DelayLine(port, HOP_DELAY_S[kind]) for kind, port in (
                ("video", VIDEO_PORT), ("video", VIDEO_RTCP_PORT),
                ("audio", AUDIO_PORT), ("audio", AUDIO_RTCP_PORT))}
            for line in lines.values():
                await line.open()
            delay_lines.extend(lines.values())
            result["hop_delay_ms"] = {k: v * 1000 for k, v in HOP_DELAY_S.items()}
            async with http.post(f"{base}/api/feeds", json={
                "stream": "live", "host": "127.0.0.1", "extensions": True, "media": [
                    {"kind": "video", "rtp_port": lines[VIDEO_PORT].port,
                     "rtcp_port": lines[VIDEO_RTCP_PORT].port, "payload_type": VIDEO_PT},
                    {"kind": "audio", "rtp_port": lines[AUDIO_PORT].port,
                     "rtcp_port": lines[AUDIO_RTCP_PORT].port, "payload_type": AUDIO_PT},
                ]}) as resp:
                feed = await resp.json()
                assert resp.status == 201, feed

            await api.message(handle, {"request": "watch", "id": MOUNTPOINT})
            offer = await api.event()
            sdp = offer["jsep"]["sdp"]
            result["janus_candidates"] = sorted(
                set(re.findall(r"a=candidate:\S+ \d+ udp \d+ (\S+)", sdp)))
            result["janus_offer_extmaps"] = {
                kind: re.findall(r"a=extmap:(\S+) (\S+)", offer_section(sdp, kind))
                for kind in ("video", "audio")}
            await watcher.pc.setRemoteDescription(RTCSessionDescription(sdp, "offer"))
            # The viewer's candidate on Janus's address too: libnice pairs none of its
            # candidates with a remote one on another 127.x address.
            aiortc_adapter.install_ice(watcher.pc, (janus.ADDRESS,), None)
            await watcher.pc.setLocalDescription(await watcher.pc.createAnswer())
            watcher.record()
            await api.message(handle, {"request": "start"},
                              jsep={"type": "answer", "sdp": watcher.pc.localDescription.sdp,
                                    "trickle": False})
            result["viewer_connect_s"] = round(await wait_for(
                lambda: watcher.pc.connectionState == "connected", 30, "Janus connected"), 2)
            await wait_for(lambda: "video" in watcher.tracks and "audio" in watcher.tracks,
                           20, "the Janus viewer's tracks")
            audio_frames = 0

            async def count_audio(track: MediaStreamTrack) -> None:
                nonlocal audio_frames
                while True:
                    await track.recv()
                    audio_frames += 1

            audio_task = asyncio.create_task(count_audio(watcher.tracks["audio"]))
            try:
                result["frames_decoded"] = await decode_for(watcher.tracks["video"], seconds)
            finally:
                audio_task.cancel()
            result["audio_frames_decoded"] = audio_frames

            session = relay.find_feed(feed["id"])
            assert session is not None
            result["feed"] = session.status()
            # What Janus sent back towards the feed, by RTCP message (and whether a report
            # block was about the feed's SSRCs).
            feed_ssrcs = {m["ssrc"] for m in feed["media"]}
            seen: Counter[str] = Counter()
            for line in delay_lines:
                for data in line.returned:
                    try:
                        messages = rtcp.parse_compound(data)
                    except ValueError:
                        seen["unparsable"] += 1
                        continue
                    for m in messages:
                        name = type(m).__name__
                        blocks = getattr(m, "reports", ())
                        if any(b.ssrc in feed_ssrcs for b in blocks):
                            name += " about the feed"
                        seen[name] += 1
            result["janus_rtcp_to_feed"] = dict(seen)
            measure(result, watcher, truth, records, anchors, feed)
            async with http.delete(f"{base}{feed['location']}") as resp:
                result["delete_status"] = resp.status
            await truth.close()
            await publisher.close()
    finally:
        await watcher.pc.close()
        await server.close()
        for line in delay_lines:
            line.close()


def measure(result: dict[str, Any], watcher: JanusViewer, truth: Any, records: ViewerRecords,
            anchors: dict[int, list[tuple[int, AnchorRecord]]], feed: dict[str, Any]) -> None:
    """What of the sidecar's timing reached the viewer through Janus."""
    offer = watcher.pc.remoteDescription.sdp
    ssrcs = {kind: int(m.group(1)) for kind in ("video", "audio")
             if (m := re.search(r"a=ssrc:(\d+)", offer_section(offer, kind)))}
    result["janus_ssrcs"] = ssrcs
    reports = watcher.sender_reports()
    result["janus_sender_reports"] = {k: sum(sr.ssrc == s for sr, _ in reports)
                                      for k, s in ssrcs.items()}
    sr_offsets: dict[str, list[float]] = {}
    sr_send_lag: dict[str, list[float]] = {}
    extensions: dict[str, list[list[int]]] = {}
    matched: dict[str, int] = {}
    act_id = int(next((i for i, uri in result["janus_offer_extmaps"].get("video", [])
                       if uri == ABS_CAPTURE_TIME), 0) or 0)
    result["abs_capture_time_in_janus_offer"] = act_id != 0
    for kind, ssrc in ssrcs.items():
        got = [p for p, _ in watcher.rtp if p.ssrc == ssrc]
        pairs = sorted({(i, len(v)) for p in got for i, v in p.extensions})
        extensions[kind] = [list(x) for x in pairs]  # (id, value length) seen
        mine = [p for p in truth.received if p.ssrc == received_ssrc(truth, kind)]
        delta, count = ts_delta(got, mine)  # Janus viewer RTP time -> WHEP viewer RTP time
        matched[kind] = count
        if delta is None:
            continue
        track = records.track_for(mid_of(truth, kind))
        announced = anchors.get(track, [])
        for sr, sr_at in reports:
            if sr.ssrc != ssrc:
                continue
            # The anchor the sidecar announced last before the SR reached the viewer: the
            # sidecar's map of RTP time to capture time (it changes only slowly).
            before = [a for at, a in announced if at <= sr_at]
            if not before:
                continue
            capture = before[-1].capture_of((sr.info.rtp_timestamp + delta) & MASK32)
            ntp_ns = ntp_to_unix_ns(sr.info.ntp_timestamp)
            sr_offsets.setdefault(kind, []).append((ntp_ns - capture) / 1e6)
            sr_send_lag.setdefault(kind, []).append((sr_at - ntp_ns) / 1e6)
    result["payload_matches"] = matched
    result["extensions_seen"] = extensions
    # Does any packet carry a value that reads as an abs-capture-time (an NTP time within
    # 10 s of the packet's arrival), whatever id Janus gave it?
    result["abs_capture_time_seen"] = any(
        len(v) in (8, 16)
        and abs(ntp_to_unix_ns(int.from_bytes(v[:8], "big")) - at) < 10_000_000_000
        for p, at in watcher.rtp for _, v in p.extensions)
    result["sr_ntp_minus_capture_ms"] = {k: summary(v) for k, v in sr_offsets.items()}
    result["sr_arrival_minus_ntp_ms"] = {k: summary(v) for k, v in sr_send_lag.items()}
    if "video" in sr_offsets and "audio" in sr_offsets:
        result["sr_av_skew_ms"] = round(statistics.median(sr_offsets["video"])
                                        - statistics.median(sr_offsets["audio"]), 3)
    result["feed_answer"] = feed


def main() -> int:
    seconds = float(sys.argv[1])
    janus.setup_namespace()
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="janus-feed-") as tmp:
        workdir = Path(tmp)
        janus.write_config(workdir, janus.HTTP_PORT)
        with janus.running(workdir) as proc:
            asyncio.run(run(seconds, workdir, proc, result))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
