"""The load a segment benchmark puts on the service: its publisher (a process of its own), a
reader of the live segments (polling the index, fetching each new segment) and a WHEP viewer
that receives the stream without decoding it."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from bench.processes import LOOPBACK

POLL_S = 0.5
BITRATE = 1_500_000
TOKEN = "bench"
STREAM = "bench"


def _pin_encoder_bitrates() -> None:
    # aiortc's encoders start low (VP8 500 kbit/s, H.264 1 Mbit/s) and follow the receiver's
    # bandwidth estimate; pinning their bounds keeps the stream at the benchmark's 1.5 Mbit/s.
    from aiortc.codecs import h264, vpx

    for module in (vpx, h264):
        for name in ("DEFAULT_BITRATE", "MIN_BITRATE", "MAX_BITRATE"):
            setattr(module, name, BITRATE)


def run_publisher(endpoint: str, codec: str) -> None:
    import numpy as np
    from av import VideoFrame

    from sfu_sidecar.client.whip import publish
    from sfu_sidecar.synthetic import CODE_ROWS, BeepAudioTrack, FlashVideoTrack, Timeline

    _pin_encoder_bitrates()

    class NoisyVideoTrack(FlashVideoTrack):
        """The synthetic broadcaster's frames with a band of fresh noise in each, so the
        encoder has detail enough to spend its whole bitrate on (the benchmark prints what
        the stream reached)."""

        def __init__(self, timeline: Timeline) -> None:
            super().__init__(timeline)
            self.rng = np.random.default_rng(1)

        async def recv(self) -> VideoFrame:
            frame = await super().recv()
            plane = frame.planes[0]
            luma = np.frombuffer(memoryview(plane), np.uint8).reshape(self.height, plane.line_size)
            top = CODE_ROWS + 40
            luma[top:top + 40, : self.width] = self.rng.integers(
                16, 235, (40, self.width), dtype=np.uint8
            )
            return frame

    async def main() -> None:
        timeline = Timeline.starting_now(time.time_ns)
        session = await publish(
            endpoint, [BeepAudioTrack(timeline), NoisyVideoTrack(timeline)], token=TOKEN,
            capture_start_ns=timeline.start_house_ns, ice_addresses=LOOPBACK, video_codec=codec,
        )
        await session.joined()
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await session.close()

    asyncio.run(main())


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


async def whep_offer(base: str) -> tuple[Any, str, str]:
    """A recvonly audio + video aiortc peer that viewed the benchmark stream over WHEP on
    loopback: (the peer, the relay's answer, the session's resource URL)."""
    from urllib.parse import urljoin

    import aiohttp
    from aiortc import RTCPeerConnection, RTCSessionDescription

    from sfu_sidecar.relay import aiortc_adapter
    from sfu_sidecar.relay.peer import rtc_configuration

    pc = RTCPeerConnection(rtc_configuration())
    pc.addTransceiver("audio", direction="recvonly")
    pc.addTransceiver("video", direction="recvonly")
    aiortc_adapter.install_ice(pc, LOOPBACK, None)
    await pc.setLocalDescription(await pc.createOffer())
    url = f"{base}/whep/{STREAM}"
    async with aiohttp.ClientSession() as http, http.post(
        url, data=pc.localDescription.sdp,
        headers={"Content-Type": "application/sdp", **_auth()},
    ) as resp:
        assert resp.status == 201, await resp.text()
        answer = await resp.text()
        location = resp.headers["Location"]
    await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
    return pc, answer, urljoin(url, location)


@dataclass
class Reader:
    """A player's requests: the index every POLL_S, each new segment once."""

    media: str
    ext: str
    seen: set[int] = field(default_factory=set)
    segment_bytes: int = 0
    segment_s: float = 0.0
    latest: list[dict[str, Any]] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    async def poll(self, http: Any) -> None:
        async with http.get(f"{self.media}/index.json") as resp:
            assert resp.status == 200, await resp.text()
            index = await resp.json()
        self.latest = index["segments"]
        for entry in self.latest:
            if entry["number"] in self.seen:
                continue
            async with http.get(f"{self.media}/{entry['number']}.{self.ext}") as resp:
                assert resp.status == 200, await resp.text()
                self.segment_bytes += len(await resp.read())
            self.segment_s += entry["duration_s"]
            self.seen.add(entry["number"])

    async def _run(self) -> None:
        import aiohttp

        async with aiohttp.ClientSession(headers=_auth()) as http:
            while not self._stop.is_set():
                await self.poll(http)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), POLL_S)

    def start(self) -> None:
        self.latest = []
        self._stop.clear()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
            self._task = None

    async def has_segments(self, count: int) -> bool:
        if self._task is not None and self._task.done():
            self._task.result()  # a failed poll ends the wait with its error
        return len(self.latest) >= count


@dataclass
class Viewer:
    """A WHEP viewer that counts what arrives from the RTP headers, never decoding (its CPU
    is not what is measured, but it shares a core with the publisher's encoder)."""

    pc: Any
    resource: str
    audio_types: set[int]
    payload_bytes: int = 0
    video_frames: int = 0

    @classmethod
    async def open(cls, base: str) -> Viewer:
        from sfu_sidecar.relay import aiortc_adapter, sdp

        pc, answer, location = await whep_offer(base)
        audio_types = {m.primary.payload_type for m in sdp.parse(answer, what="a").media
                       if m.kind == "audio"}
        viewer = cls(pc, location, audio_types)
        for dtls in aiortc_adapter.dtls_transports(pc):
            aiortc_adapter.on_rtp(dtls, viewer.count)
        return viewer

    def count(self, data: bytes, arrival_time_ms: int) -> None:
        header = 12 + 4 * (data[0] & 0x0F)
        if data[0] & 0x10:  # header extensions
            header += 4 + 4 * int.from_bytes(data[header + 2:header + 4], "big")
        self.payload_bytes += len(data) - header
        if (data[1] & 0x7F) not in self.audio_types and data[1] & 0x80:
            self.video_frames += 1  # the marker bit ends a video frame

    async def receiving(self) -> bool:
        return self.video_frames > 0

    async def close(self) -> None:
        import aiohttp

        with contextlib.suppress(aiohttp.ClientError):
            async with aiohttp.ClientSession() as http, http.delete(
                self.resource, headers=_auth()
            ):
                pass
        await self.pc.close()


# --- part: remux CPU against per-viewer forwarding --------------------------------------------
