"""The media load the fan-out benchmarks share: a synthetic publisher's tracks (640x360 30 fps
VP8 pinned at 1.5 Mbit/s, and Opus), aiortc peers on the benchmark's addresses publishing over
WHIP and viewing over WHEP, and viewers that count what arrives at the RTP level without
decoding (so that they stay cheap: on 2 cores their CPU competes with the server's) and report
rate and loss over a window.

Each benchmark stays one runnable file; this module is imported after the repository root is
put on the path.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from dataclasses import dataclass, field
from typing import Any

BITRATE = 1_500_000


def client_pc() -> Any:
    from aiortc import RTCPeerConnection

    from sfu_sidecar.relay.peer import rtc_configuration

    return RTCPeerConnection(rtc_configuration())


def pin_vp8_bitrate() -> None:
    """aiortc's VP8 encoder starts at 500 kbit/s and follows REMB; pinned, the source (and any
    per-viewer encoder) runs at the benchmark's 1.5 Mbit/s throughout, whatever the server
    under test estimates."""
    from aiortc.codecs import vpx

    vpx.DEFAULT_BITRATE = vpx.MIN_BITRATE = vpx.MAX_BITRATE = BITRATE


def source_tracks() -> tuple[Any, Any]:
    """(audio, video): a 440 Hz tone and a moving gradient with a noisy band (which keeps the
    encoder busy enough to use its bitrate), paced on the monotonic clock."""
    import numpy as np
    from aiortc import MediaStreamTrack
    from av import AudioFrame, VideoFrame

    class Video(MediaStreamTrack):
        kind = "video"

        def __init__(self) -> None:
            super().__init__()
            self.n = 0
            self.t0 = time.monotonic()
            self.rng = np.random.default_rng(1)
            self.base = np.add.outer(np.arange(360), np.arange(640)).astype(np.uint8)

        async def recv(self) -> VideoFrame:
            delay = self.t0 + self.n / 30 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            y = self.base + np.uint8(self.n * 3 % 256)
            y[170:190] = self.rng.integers(0, 255, (20, 640), dtype=np.uint8)
            yuv = np.concatenate([y, np.full((180, 640), 128, dtype=np.uint8)])
            frame = VideoFrame.from_ndarray(yuv, format="yuv420p")
            frame.pts, frame.time_base = self.n * 3000, fractions.Fraction(1, 90000)
            self.n += 1
            return frame

    class Audio(MediaStreamTrack):
        kind = "audio"

        def __init__(self) -> None:
            super().__init__()
            self.n = 0
            self.t0 = time.monotonic()

        async def recv(self) -> AudioFrame:
            delay = self.t0 + self.n * 0.02 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            t = (np.arange(960) + self.n * 960) / 48000
            pcm = (np.sin(2 * np.pi * 440 * t) * 6000).astype(np.int16).reshape(1, -1)
            frame = AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
            frame.sample_rate, frame.pts = 48000, self.n * 960
            frame.time_base = fractions.Fraction(1, 48000)
            self.n += 1
            return frame

    return Audio(), Video()


def media_kinds(sdp_text: str) -> dict[int, str]:
    """Payload type -> "audio"/"video" of the media sections of an offer or answer."""
    from sfu_sidecar.relay import sdp

    return {m.primary.payload_type: m.kind for m in sdp.parse(sdp_text, what="SDP").media}


@dataclass
class Counter:
    """What one viewer received while ``active``: frames (marker bits), audio packets, and the
    sequence numbers of every SSRC (for loss)."""

    video_frames: int = 0
    audio_packets: int = 0
    seqs: dict[int, list[int]] = field(default_factory=dict)
    active: bool = False

    def figures(self, seconds: float) -> dict[str, Any]:
        expected = received = 0
        for seqs in self.seqs.values():
            ext = [seqs[0]]
            for s in seqs[1:]:
                d = (s - ext[-1]) & 0xFFFF
                ext.append(ext[-1] + (d if d < 0x8000 else d - 0x10000))
            expected += max(ext) - min(ext) + 1
            received += len(set(ext))
        return {"fps": self.video_frames / seconds, "audio_pps": self.audio_packets / seconds,
                "lost": max(0, expected - received), "expected": expected}


def count_rtp(pc: Any, kinds: dict[int, str]) -> Counter:
    """Counts ``pc``'s incoming RTP from the fixed header only; nothing is decoded."""
    from sfu_sidecar.relay import aiortc_adapter

    counter = Counter()

    def handle(data: bytes, arrival_time_ms: int) -> None:
        if not counter.active:
            return
        kind = kinds.get(data[1] & 0x7F)
        if kind is None:
            return
        ssrc = int.from_bytes(data[8:12], "big")
        counter.seqs.setdefault(ssrc, []).append(int.from_bytes(data[2:4], "big"))
        if kind == "video":
            counter.video_frames += data[1] >> 7
        else:
            counter.audio_packets += 1

    for dtls in aiortc_adapter.dtls_transports(pc):
        aiortc_adapter.on_rtp(dtls, handle)
    return counter


async def count_window(
    counters: list[Counter], start_at: float, seconds: float,
) -> list[dict[str, Any]]:
    """Every counter counts from wall-clock ``start_at`` for ``seconds``; their figures."""
    await asyncio.sleep(max(0.0, start_at - time.time()))
    for c in counters:
        c.active = True
    await asyncio.sleep(seconds)
    for c in counters:
        c.active = False
    return [c.figures(seconds) for c in counters]


def source_pc(addresses: tuple[str, ...]) -> Any:
    """A publisher's peer: the source tracks, send-only, ICE on ``addresses``."""
    from sfu_sidecar.relay import aiortc_adapter

    pin_vp8_bitrate()
    pc = client_pc()
    for track in source_tracks():
        pc.addTransceiver(track, direction="sendonly")
    aiortc_adapter.install_ice(pc, addresses, None)
    return pc


async def post_sdp(http: Any, url: str, offer: str) -> str:
    """The answer to ``offer`` POSTed to a WHIP or WHEP endpoint (201, else RuntimeError)."""
    async with http.post(url, data=offer, headers={"Content-Type": "application/sdp"}) as resp:
        if resp.status != 201:
            raise RuntimeError(f"{url}: {resp.status} {await resp.text()}")
        return str(await resp.text())


async def whip_publish(http: Any, url: str, pc: Any) -> None:
    """``pc`` publishes over WHIP at ``url``."""
    from aiortc import RTCSessionDescription

    await pc.setLocalDescription(await pc.createOffer())
    answer = await post_sdp(http, url, pc.localDescription.sdp)
    await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))


async def whep_view(http: Any, url: str, addresses: tuple[str, ...]) -> tuple[Any, Counter]:
    """A WHEP viewer of ``url`` (audio and video, ICE on ``addresses``) and its counter."""
    from aiortc import RTCSessionDescription

    from sfu_sidecar.relay import aiortc_adapter

    pc = client_pc()
    pc.addTransceiver("audio", direction="recvonly")
    pc.addTransceiver("video", direction="recvonly")
    aiortc_adapter.install_ice(pc, addresses, None)
    await pc.setLocalDescription(await pc.createOffer())
    answer = await post_sdp(http, url, pc.localDescription.sdp)
    await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
    return pc, count_rtp(pc, media_kinds(answer))
