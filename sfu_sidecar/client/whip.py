"""A WHIP (RFC 9725) publishing client on aiortc, for the demo and for tests."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urljoin

import aiohttp
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from sfu_sidecar.exceptions import RemoteError


@dataclass
class WhipSession:
    pc: RTCPeerConnection
    resource_url: str
    token: str | None

    async def close(self) -> None:
        """DELETE the session resource (RFC 9725 section 4.2), then close the peer connection."""
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


async def publish(
    endpoint: str, tracks: list[MediaStreamTrack], *, token: str | None = None
) -> WhipSession:
    """Offer ``tracks`` to a WHIP endpoint and return the established session."""
    pc = RTCPeerConnection()
    for track in tracks:
        pc.addTransceiver(track, direction="sendonly")
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
    return WhipSession(pc, urljoin(endpoint, location), token)
