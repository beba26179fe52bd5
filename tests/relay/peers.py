"""Real aiortc peers for relay tests: a WHIP publisher and WHEP viewers over loopback.

The peers are ordinary aiortc peer connections; the only instrumentation is a per-instance
wrapper on their DTLS transport that records the plaintext RTP each one sends or receives, so
tests can compare payload bytes end to end.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc.rtcconfiguration import RTCBundlePolicy
from av import AudioFrame, VideoFrame

from sfu_sidecar.relay import aiortc_adapter
from sfu_sidecar.relay.packet import RtpPacket

LOOPBACK = ("127.0.0.1",)


class PatternVideo(MediaStreamTrack):
    """A moving gradient at ``fps``: every frame differs, so payloads are not trivially equal."""

    kind = "video"

    def __init__(self, width: int = 320, height: int = 240, fps: int = 30) -> None:
        super().__init__()
        self.width, self.height, self.fps = width, height, fps
        self.count = 0
        self._start: float | None = None
        ramp = np.arange(width, dtype=np.uint8)
        self._base = np.broadcast_to(ramp, (height, width))

    async def recv(self) -> VideoFrame:
        if self._start is None:
            self._start = time.monotonic()
        due = self._start + self.count / self.fps
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        y = ((self._base.astype(np.uint16) + self.count * 4) % 256).astype(np.uint8)
        yuv = np.concatenate(
            [y, np.full((self.height // 2, self.width), 128, dtype=np.uint8)], axis=0
        )
        frame = VideoFrame.from_ndarray(yuv, format="yuv420p")
        frame.pts = self.count * (90000 // self.fps)
        frame.time_base = fractions.Fraction(1, 90000)
        self.count += 1
        return frame


class ToneAudio(MediaStreamTrack):
    """20 ms frames of a 440 Hz tone with a faint dither, 48 kHz mono. The dither differs per
    frame (seeded by its number): a pure tone repeats every 100 ms and, once the Opus encoder
    settles on it, so do its packets, and tests that find a packet's copies by its payload
    would find none unique."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self._start: float | None = None

    async def recv(self) -> AudioFrame:
        if self._start is None:
            self._start = time.monotonic()
        due = self._start + self.count * 0.02
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        n = 960
        t = (np.arange(n) + self.count * n) / 48000
        dither = np.random.default_rng(self.count).integers(-64, 65, n)
        samples = (np.sin(2 * np.pi * 440 * t) * 8000 + dither).astype(np.int16).reshape(1, -1)
        frame = AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = 48000
        frame.pts = self.count * n
        frame.time_base = fractions.Fraction(1, 48000)
        self.count += 1
        return frame


@dataclass
class Peer:
    pc: RTCPeerConnection
    location: str
    answer: str
    sent: list[RtpPacket] = field(default_factory=list)
    sent_ns: list[int] = field(default_factory=list)  # wall-clock send time of each sent
    received: list[RtpPacket] = field(default_factory=list)
    received_ns: list[int] = field(default_factory=list)  # wall-clock arrival of each received
    rtcp_received: list[bytes] = field(default_factory=list)
    tracks: dict[str, MediaStreamTrack] = field(default_factory=dict)
    drop: Callable[[RtpPacket], bool] | None = None
    dropped: list[RtpPacket] = field(default_factory=list)
    channel: Any = None  # the RTCDataChannel the viewer offered, if any
    decode: bool = True  # False: received media is recorded but never handed to aiortc

    async def close(self) -> None:
        await self.pc.close()


def client_pc() -> RTCPeerConnection:
    return RTCPeerConnection(
        RTCConfiguration(iceServers=[], bundlePolicy=RTCBundlePolicy.MAX_BUNDLE)
    )


def _record_sent(peer: Peer) -> None:
    def observe(data: bytes) -> bytes | None:
        if 192 <= data[1] <= 223:
            return data  # RTCP
        pkt = RtpPacket.parse(data)
        if peer.drop is not None and peer.drop(pkt):
            peer.dropped.append(pkt)
            return None  # lost on the way to the relay
        peer.sent.append(pkt)
        peer.sent_ns.append(time.time_ns())
        return data

    for dtls in aiortc_adapter.dtls_transports(peer.pc):
        aiortc_adapter.filter_sent(dtls, observe)


def _record_rtcp(peer: Peer) -> None:
    for dtls in aiortc_adapter.dtls_transports(peer.pc):
        aiortc_adapter.tap_received(dtls, rtcp=peer.rtcp_received.append)


def _record_received(peer: Peer) -> None:
    def observe(data: bytes, arrival_time_ms: int) -> bool:
        pkt = RtpPacket.parse(data)
        if peer.drop is not None and peer.drop(pkt):
            peer.dropped.append(pkt)
            return False
        peer.received.append(pkt)
        peer.received_ns.append(time.time_ns())
        return peer.decode

    for dtls in aiortc_adapter.dtls_transports(peer.pc):
        aiortc_adapter.tap_received(dtls, rtp=observe, rtcp=peer.rtcp_received.append)


async def _post(
    http: aiohttp.ClientSession, url: str, offer: str, token: str | None
) -> tuple[str, str]:
    headers = {"Content-Type": "application/sdp"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    async with http.post(url, data=offer, headers=headers) as resp:
        body = await resp.text()
        assert resp.status == 201, (resp.status, body)
        return resp.headers["Location"], body


async def publish(
    http: aiohttp.ClientSession,
    base: str,
    stream: str,
    *,
    token: str | None = None,
    video: MediaStreamTrack | None = None,
    audio: MediaStreamTrack | None = None,
    video_codec: str | None = None,
    drop: Callable[[RtpPacket], bool] | None = None,
) -> Peer:
    pc = client_pc()
    tracks: dict[str, MediaStreamTrack] = {}
    if audio is not None:
        pc.addTransceiver(audio, direction="sendonly")
        tracks["audio"] = audio
    if video is not None:
        transceiver = pc.addTransceiver(video, direction="sendonly")
        if video_codec is not None:
            caps = RTCRtpSender.getCapabilities("video").codecs
            transceiver.setCodecPreferences(
                [c for c in caps if c.mimeType.lower() in (f"video/{video_codec}", "video/rtx")]
            )
        tracks["video"] = video
    aiortc_adapter.install_ice(pc, LOOPBACK, None)
    await pc.setLocalDescription(await pc.createOffer())
    location, answer = await _post(http, f"{base}/whip/{stream}", pc.localDescription.sdp, token)
    peer = Peer(pc, location, answer, tracks=tracks, drop=drop)
    _record_sent(peer)
    _record_rtcp(peer)
    await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
    return peer


async def view(
    http: aiohttp.ClientSession,
    base: str,
    stream: str,
    *,
    token: str | None = None,
    kinds: tuple[str, ...] = ("audio", "video"),
    data_channel: bool | str = False,
    decode: bool = True,
    reliable: bool = False,
    ice_addresses: tuple[str, ...] | None = LOOPBACK,
    configuration: RTCConfiguration | None = None,
) -> Peer:
    """A WHEP viewer; ``data_channel`` offers a channel (a str names it: ``"sync"`` is opened
    unordered without retransmissions, as proto/sync.md asks of viewers, unless ``reliable``
    says to open it ordered and reliable as a client that ignores that advice would).
    ``decode=False`` records every packet but spares the CPU of decoding it. Host candidates
    are gathered on ``ice_addresses`` only; with None, aiortc gathers as it would (STUN and
    TURN of ``configuration`` included)."""
    pc = client_pc() if configuration is None else RTCPeerConnection(configuration)
    tracks: dict[str, MediaStreamTrack] = {}

    @pc.on("track")
    def on_track(track: MediaStreamTrack) -> None:
        tracks[track.kind] = track

    for kind in kinds:
        pc.addTransceiver(kind, direction="recvonly")
    channel = None
    if data_channel == "sync" and not reliable:
        channel = pc.createDataChannel("sync", ordered=False, maxRetransmits=0)
    elif data_channel:
        channel = pc.createDataChannel(data_channel if isinstance(data_channel, str) else "hello")
    if ice_addresses is not None:
        aiortc_adapter.install_ice(pc, ice_addresses, None)
    await pc.setLocalDescription(await pc.createOffer())
    location, answer = await _post(http, f"{base}/whep/{stream}", pc.localDescription.sdp, token)
    peer = Peer(pc, location, answer, tracks=tracks, channel=channel, decode=decode)
    await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
    _record_received(peer)
    return peer


async def wait_for(predicate: Callable[[], bool], limit_s: float, what: str) -> float:
    """Poll every 20 ms; returns the seconds it took, fails the test past ``limit_s``."""
    started = time.monotonic()
    for _ in range(int(limit_s / 0.02) + 1):
        if predicate():
            return time.monotonic() - started
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out after {limit_s} s waiting for {what}")


async def frames(track: MediaStreamTrack, count: int, limit_s: float) -> list[Any]:
    out = []
    async with asyncio.timeout(limit_s):
        for _ in range(count):
            out.append(await track.recv())
    return out


def _section(sdp: str, kind: str) -> list[str]:
    return sdp.split(f"m={kind}", 1)[1].split("m=", 1)[0].splitlines()


def _ssrc_in(sdp: str, kind: str) -> int:
    line = next(x for x in _section(sdp, kind) if x.startswith("a=ssrc:"))
    return int(line.split()[0].split(":")[1])


def received_ssrc(peer: Peer, kind: str) -> int:
    """SSRC of the relay's ``kind`` stream to a viewer (from the relay's answer)."""
    return _ssrc_in(peer.answer, kind)


def sent_ssrc(peer: Peer, kind: str) -> int:
    """SSRC a publisher sends ``kind`` with (from its own offer)."""
    return _ssrc_in(peer.pc.localDescription.sdp, kind)


def mid_of(peer: Peer, kind: str) -> str:
    line = next(x for x in _section(peer.answer, kind) if x.startswith("a=mid:"))
    return line.split(":", 1)[1].strip()
