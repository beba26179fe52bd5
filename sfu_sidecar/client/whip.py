"""A WHIP (RFC 9725) publishing client on aiortc, for the demo, tests and Python publishers.

Beyond plain WHIP it can (1) stamp every packet with abs-capture-time from a known capture start
(see ``capture_stamp.py``) and (2) join the house clock over the ``sync`` DataChannel and report
its offset, so the relay maps those stamps to house time exactly instead of estimating the
publisher's clock from arrival times.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urljoin

import aiohttp
from aiortc import RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack
from aiortc.rtcdatachannel import RTCDataChannel

from sfu_sidecar import logs
from sfu_sidecar.client.capture_stamp import CaptureStamper
from sfu_sidecar.exceptions import RemoteError
from sfu_sidecar.relay import aiortc_adapter as adapter
from sfu_sidecar.relay.hooks import ABS_CAPTURE_TIME
from sfu_sidecar.sync.channel_join import join_over_channel
from sfu_sidecar.sync.wire import (
    ClockReport,
)

log = logs.get("client.whip")

CLOCK_RATES = {"audio": 48000, "video": 90000}  # Opus and every video codec we forward
# Eight rounds 20 ms apart: the minimum-RTT sample of eight is close to the floor on any
# sane path, and the join is done a fraction of a second after the channel opens.


@dataclass
class WhipSession:
    pc: RTCPeerConnection
    resource_url: str
    token: str | None
    channel: RTCDataChannel | None = None
    stamper: CaptureStamper | None = None
    clock_report: ClockReport | None = None
    _join: asyncio.Task[None] | None = field(default=None, repr=False)

    async def joined(self) -> ClockReport | None:
        """Wait for the clock join to finish; its report, or None if there was none."""
        if self._join is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._join
        return self.clock_report

    async def close(self) -> None:
        """DELETE the session resource (RFC 9725 section 4.2), then close the peer connection."""
        if self._join is not None:
            self._join.cancel()
        try:
            async with aiohttp.ClientSession() as http, http.delete(
                self.resource_url, headers=_auth(self.token)
            ):
                pass
        except aiohttp.ClientError:
            pass  # the server may be gone already; the peer connection still closes
        await self.pc.close()


def _auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def extension_id(sdp: str, uri: str) -> int | None:
    """The id an SDP gives a header extension (``a=extmap:<id>[/dir] <uri>``)."""
    match = re.search(rf"^a=extmap:(\d+)(?:/\w+)? {re.escape(uri)}\s*$", sdp, re.M)
    return int(match.group(1)) if match else None


async def _join_clock(
    session: WhipSession, channel: RTCDataChannel, clock_ns: Callable[[], int]
) -> None:
    """Join the relay's house clock and report the offset (see :func:`join_over_channel`)."""
    report = await join_over_channel(channel, clock_ns)
    if report is None:
        log.warning("clock join got no answer; the relay will estimate this publisher's clock")
        return
    session.clock_report = report


async def publish(
    endpoint: str,
    tracks: list[MediaStreamTrack],
    *,
    token: str | None = None,
    capture_start_ns: int | None = None,
    join_clock: bool = True,
    clock_ns: Callable[[], int] = time.time_ns,
    ice_addresses: tuple[str, ...] = (),
    video_codec: str | None = None,
) -> WhipSession:
    """Offer ``tracks`` to a WHIP endpoint and return the established session.

    ``capture_start_ns`` (on ``clock_ns``'s clock): the capture instant of pts 0 of every track;
    when given, packets carry abs-capture-time. ``join_clock`` opens the ``sync`` channel and
    joins the house clock with ``clock_ns`` as this publisher's clock. ``ice_addresses``: host
    addresses to gather on besides aioice's own (it skips loopback). ``video_codec`` (e.g.
    ``h264``): offer only that video codec (and RTX) instead of aiortc's preference order.
    """
    if capture_start_ns is not None:
        for kind in ("audio", "video"):
            adapter.negotiate_header_extension(kind, ABS_CAPTURE_TIME)
    pc = RTCPeerConnection()
    senders = []
    for track in tracks:
        transceiver = pc.addTransceiver(track, direction="sendonly")
        if track.kind == "video" and video_codec is not None:
            wanted = (f"video/{video_codec.lower()}", "video/rtx")
            transceiver.setCodecPreferences([
                c for c in RTCRtpSender.getCapabilities("video").codecs
                if c.mimeType.lower() in wanted
            ])
        senders.append((track.kind, transceiver.sender))
    channel = pc.createDataChannel("sync", ordered=False, maxRetransmits=0) if join_clock else None
    if ice_addresses:
        adapter.install_ice(pc, ice_addresses, None)
    await pc.setLocalDescription(await pc.createOffer())  # aiortc gathers before returning
    headers = {"Content-Type": "application/sdp", **_auth(token)}
    try:
        async with aiohttp.ClientSession() as http, http.post(
            endpoint, data=pc.localDescription.sdp, headers=headers
        ) as resp:
            body = await resp.text()
            if resp.status != 201:
                raise RemoteError(f"WHIP {endpoint} answered {resp.status}: {body.strip()}")
            location = resp.headers.get("Location")
            if not location:
                raise RemoteError(f"WHIP {endpoint} answered 201 without a Location")
        await pc.setRemoteDescription(RTCSessionDescription(sdp=body, type="answer"))
    except BaseException:
        await pc.close()
        raise
    session = WhipSession(pc, urljoin(endpoint, location), token, channel)
    if capture_start_ns is not None:
        ext = extension_id(body, ABS_CAPTURE_TIME)
        if ext is None:
            log.warning("the relay did not accept abs-capture-time; capture times will be "
                        "taken from sender reports")
        else:
            rates = {adapter.sender_ssrcs(sender)[0]: CLOCK_RATES[kind]
                     for kind, sender in senders}
            session.stamper = CaptureStamper(capture_start_ns, ext, rates)
            for dtls in adapter.dtls_transports(pc):
                adapter.filter_sent(dtls, session.stamper)
    if channel is not None:
        session._join = asyncio.create_task(_join_clock(session, channel, clock_ns))
    return session
