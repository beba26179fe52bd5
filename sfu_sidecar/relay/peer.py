"""A session's WebRTC peer connection, held by the session (composition): the
aiortc ``RTCPeerConnection``, its trickle ICE, the DataChannels the far end opens, and how
its connection state reads as the session's.

Every WebRTC session (WHIP publisher, WHEP viewer, an edge's pull, a push) has one
:class:`PeerLink`; what it receives or sends is the session's role (``PublisherSource`` or
``ViewerSink``), not the link's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCPeerConnection,
    RTCRtpReceiver,
)
from aiortc.rtcconfiguration import RTCBundlePolicy
from aiortc.rtcdatachannel import RTCDataChannel
from aiortc.rtcrtpparameters import RTCRtpCodecCapability

from sfu_sidecar import logs
from sfu_sidecar.limits import Admission, MessageLimiter
from sfu_sidecar.relay import aiortc_adapter as adapter
from sfu_sidecar.relay import sdp as sdpmod
from sfu_sidecar.relay.sessionstate import SessionState, peer_state

log = logs.get("relay.session")


class ChannelHandle:
    """A peer's DataChannel as observers see it (``hooks.DataChannel``), over aiortc's.

    Each message the peer sends passes ``admit`` once (the peer's rate limit) and then goes
    to every handler; a message over the rate reaches none of them.
    """

    __slots__ = ("_admit", "_channel", "_handlers")

    def __init__(
        self, channel: RTCDataChannel, admit: Callable[[], Admission] | None = None
    ) -> None:
        self._channel = channel
        self._handlers: list[Callable[[bytes | str], None]] = []
        self._admit = admit
        channel.on("message", self._dispatch)

    def _dispatch(self, data: bytes | str) -> None:
        if self._admit is not None and not self._admit().accepted:
            return
        for handler in list(self._handlers):
            try:
                handler(data)
            except Exception:  # one observer's fault must not keep the message from the rest
                log.exception("data channel handler failed")

    @property
    def label(self) -> str:
        return str(self._channel.label)

    @property
    def ready_state(self) -> str:
        return str(self._channel.readyState)

    @property
    def buffered_amount(self) -> int:
        return int(self._channel.bufferedAmount)

    def send(self, data: bytes | str) -> None:
        self._channel.send(data)

    def on_message(self, handler: Callable[[bytes | str], None]) -> None:
        self._handlers.append(handler)


def rtc_configuration() -> RTCConfiguration:
    # No STUN/TURN on the relay's side: it announces its configured addresses. aiortc would
    # otherwise default to a public Google STUN server.
    return RTCConfiguration(iceServers=[], bundlePolicy=RTCBundlePolicy.MAX_BUNDLE)


def codec_capabilities(kind: str, codec: sdpmod.CodecInfo) -> list[RTCRtpCodecCapability]:
    """aiortc's capability for exactly ``codec`` plus RTX, to pin what an answer may contain."""
    caps = RTCRtpReceiver.getCapabilities(kind)
    assert caps is not None
    matches = [
        cap for cap in caps.codecs
        if cap.mimeType.split("/")[1].lower() == codec.name
        and (codec.name != "h264" or str(cap.parameters.get("packetization-mode")) == "1")
    ]
    if codec.name == "h264":
        want = str(codec.parameters.get("profile-level-id", "")).lower()
        exact = [c for c in matches if str(c.parameters.get("profile-level-id")).lower() == want]
        matches = exact or matches
    chosen = matches[:1]
    rtx = [c for c in caps.codecs if c.mimeType.lower().endswith("/rtx")]
    return chosen + rtx[:1] if kind == "video" else chosen


class IdleTrack(MediaStreamTrack):
    """Gives a relay sender a track for its SDP; the sender is silenced, so it is never read."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    async def recv(self) -> Any:
        await asyncio.Event().wait()


class PeerLink:
    """One peer connection and what the session needs of it.

    ``on_channel`` is called with every DataChannel the far end opens; ``on_state`` with the
    session state each connection state change means, or None when the transport failed or
    closed (the session then ends).
    """

    def __init__(
        self,
        label: str,
        on_channel: Callable[[ChannelHandle], None],
        on_state: Callable[[SessionState | None], None],
        channel_limiter: MessageLimiter | None = None,
    ) -> None:
        self.pc = RTCPeerConnection(rtc_configuration())
        self.answer_sdp = ""  # what the WHIP or WHEP response carries (set by negotiate)
        self.data_channels: dict[str, ChannelHandle] = {}
        self.ice_ufrag: str | None = None
        self.ice_pwd: str | None = None
        self._on_channel = on_channel
        self._on_state = on_state
        # One rate for all of this peer's channels: a second channel buys it nothing.
        self._admit = channel_limiter.gate(label) if channel_limiter is not None else None
        self.pc.on("datachannel", self._datachannel)
        self.pc.on("connectionstatechange", self._state_changed)

    @property
    def connection_state(self) -> str:
        return str(self.pc.connectionState)

    def remember_ice(self, description: sdpmod.Description) -> None:
        """The far end's ICE credentials, which a trickle PATCH must repeat (no restarts)."""
        self.ice_ufrag, self.ice_pwd = description.ice_ufrag, description.ice_pwd

    async def add_candidates(self, trickle: sdpmod.Trickle) -> None:
        sdpmod.check_no_restart(trickle, self.ice_ufrag, self.ice_pwd)
        for cand in trickle.candidates:
            await self.pc.addIceCandidate(cand)

    def _datachannel(self, channel: RTCDataChannel) -> None:
        handle = ChannelHandle(channel, self._admit)
        self.data_channels[handle.label] = handle
        self._on_channel(handle)

    def _state_changed(self) -> None:
        self._on_state(peer_state(self.connection_state))

    async def close(self) -> None:
        await adapter.close_peer(self.pc)
