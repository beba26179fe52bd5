"""WHIP and WHEP sessions: a publisher and a viewer over a WebRTC peer connection.

Each is its role (``session.PublisherSource``, ``session.ViewerSink``) over a
``peer.PeerLink`` it holds: the link negotiates and reports its state, the role moves media.
"""

from __future__ import annotations

from collections.abc import Callable

from aiortc import RTCSessionDescription

from sfu_sidecar import logs
from sfu_sidecar.config import Settings
from sfu_sidecar.exceptions import BadInput, NotAcceptable
from sfu_sidecar.limits import MessageLimiter
from sfu_sidecar.relay import aiortc_adapter as adapter
from sfu_sidecar.relay import sdp as sdpmod
from sfu_sidecar.relay.hooks import RelayObserver
from sfu_sidecar.relay.peer import ChannelHandle, IdleTrack, PeerLink, codec_capabilities
from sfu_sidecar.relay.session import PublisherSlot, PublisherSource
from sfu_sidecar.relay.sessionstate import SessionState
from sfu_sidecar.relay.viewersink import ViewerSink, ViewerSlot

log = logs.get("relay.session")


class PublisherSession(PublisherSource):
    """A WHIP publisher: receives SRTP over ICE/DTLS, feeds the stream's forwarders."""

    def __init__(
        self,
        stream: PublisherSlot,
        settings: Settings,
        now_ns: Callable[[], int],
        observers: list[RelayObserver],
        channel_limiter: MessageLimiter | None = None,
    ) -> None:
        super().__init__("publisher", stream, settings, now_ns, observers)
        self.peer = PeerLink(f"publisher {self.id[:8]} on {stream.name}", self._channel_opened,
                             self._peer_state, channel_limiter)
        self.pc = self.peer.pc

    async def negotiate(self, offer_text: str) -> str:
        offer = sdpmod.parse(offer_text, what="offer")
        sdpmod.check_offer(offer, publishing=True)
        self.peer.remember_ice(offer)
        text, dropped = sdpmod.strip_mdns_candidates(offer_text)
        for m in offer.media:
            usable = [c for c in m.codecs if c.forwardable]
            # Keep the codec the stream already has (viewers negotiated it) when offered.
            current = self.stream.codecs.get(m.kind)
            codec = next((c for c in usable if current and c.name == current.name), usable[0])
            transceiver = self.pc.addTransceiver(m.kind, direction="recvonly")
            transceiver.setCodecPreferences(codec_capabilities(m.kind, codec))
        try:
            await self.pc.setRemoteDescription(RTCSessionDescription(text, "offer"))
        except Exception as exc:  # aiortc raises assorted types for offers it cannot take
            raise BadInput(f"offer refused: {exc}") from None
        adapter.install_ice(self.pc, self.settings.ice_addresses, self.settings.ice_port_range)
        for dtls in adapter.dtls_transports(self.pc):
            adapter.on_rtp(dtls, self._on_rtp)
            adapter.on_rtcp(dtls, self._on_rtcp)
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        answer_text = self.pc.localDescription.sdp
        answer = sdpmod.parse(answer_text, what="answer")
        self.receiver.rtcp_ssrc = adapter.rtcp_ssrc(self.pc)
        self.receiver.bitrate = adapter.RemoteBitrateEstimator()
        for m_offer, m in zip(offer.media, answer.media, strict=True):
            self._add_track(m, m_offer)
        self.stream.codecs.update({t.kind: t.codec for t in self.tracks})
        self._tasks.start("tick", self._tick())
        self._tasks.start("connect-deadline", self._connect_deadline())
        log.info("publisher %s on %s: %s (%d mDNS candidates dropped)", self.id[:8],
                 self.stream.name, ", ".join(f"{t.kind} {t.codec.name}" for t in self.tracks),
                 dropped)
        self.peer.answer_sdp = str(answer_text)
        return self.peer.answer_sdp

    def _peer_state(self, state: SessionState | None) -> None:
        was = self.state
        self.follow_peer(state)
        # Each time it becomes connected, the first time and after an interruption alike.
        if self.state is SessionState.CONNECTED and was is not SessionState.CONNECTED:
            dtls = adapter.dtls_transports(self.pc)[0]
            _, self._send_rtcp = adapter.rtp_sender(dtls)
            self._notify("publisher_connected", lambda o: o.publisher_connected(self))

    def _channel_opened(self, channel: ChannelHandle) -> None:
        self._notify("publisher_data_channel",
                     lambda o: o.publisher_data_channel(self, channel))

    async def _release(self) -> None:
        await self.peer.close()


class ViewerSession(ViewerSink):
    """A WHEP viewer: silenced aiortc senders whose packets the relay writes itself.

    Channels the viewer opens reach observers through ``RelayObserver.viewer_data_channel``
    (and stay in the peer's ``data_channels``, by label).
    """

    def __init__(
        self,
        stream: ViewerSlot,
        settings: Settings,
        now_ns: Callable[[], int],
        observers: list[RelayObserver],
        *,
        media_clock: Callable[[int], list[str]] | None = None,
        channel_limiter: MessageLimiter | None = None,
    ) -> None:
        super().__init__("viewer", stream, settings, now_ns, observers)
        self.peer = PeerLink(f"viewer {self.id[:8]} on {stream.name}", self._channel_opened,
                             self._peer_state, channel_limiter)
        self.pc = self.peer.pc
        self.media_clock = media_clock
        self._send_rtp: Callable[[bytes], None] | None = None

    def _channel_opened(self, channel: ChannelHandle) -> None:
        self._notify("viewer_data_channel", lambda o: o.viewer_data_channel(self, channel))

    def _pick_codec(self, m: sdpmod.MediaInfo) -> sdpmod.CodecInfo:
        current = self.stream.codecs.get(m.kind)
        usable = [c for c in m.codecs if c.forwardable]
        if current is not None:
            for c in usable:
                if c.name == current.name:
                    return current
            offered = ", ".join(sorted({c.name for c in usable})) or "none usable"
            raise NotAcceptable(
                f"stream {self.stream.name} sends {m.kind} as {current.name}; "
                f"the offer has {offered} and the relay never transcodes"
            )
        return usable[0]

    async def negotiate(self, offer_text: str) -> str:
        offer = sdpmod.parse(offer_text, what="offer")
        sdpmod.check_offer(offer, publishing=False)
        self.peer.remember_ice(offer)
        self.accepts_data_channel = offer.has_application
        text, _ = sdpmod.strip_mdns_candidates(offer_text)
        senders = {}
        codecs = {}
        for m in offer.media:
            codec = self._pick_codec(m)
            codecs[m.kind] = codec
            transceiver = self.pc.addTransceiver(IdleTrack(m.kind), direction="sendonly")
            transceiver.setCodecPreferences(codec_capabilities(m.kind, codec))
            adapter.silence_sender(transceiver.sender)
            senders[m.kind] = transceiver.sender
        try:
            await self.pc.setRemoteDescription(RTCSessionDescription(text, "offer"))
        except Exception as exc:
            raise BadInput(f"offer refused: {exc}") from None
        adapter.install_ice(self.pc, self.settings.ice_addresses, self.settings.ice_port_range)
        for dtls in adapter.dtls_transports(self.pc):
            adapter.on_rtcp(dtls, self._on_rtcp)
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        answer_text = str(self.pc.localDescription.sdp)
        answer = sdpmod.parse(answer_text, what="answer")
        for m in answer.media:
            self.cname = m.cname or self.cname
            self._add_output(m, m.primary, senders[m.kind])
            self.stream.forwarder(m.kind, codecs[m.kind])
        clock_lines = self.media_clock(0) if self.media_clock is not None else []
        if clock_lines:
            for m in answer.media:
                self.outputs[m.kind].media_clock_rate = m.primary.clock_rate
            answer_text = sdpmod.add_media_attributes(answer_text, clock_lines)
        self._tasks.start("connect-deadline", self._connect_deadline())
        self.peer.answer_sdp = answer_text
        return answer_text

    def _peer_state(self, state: SessionState | None) -> None:
        if self.follow_peer(state):
            dtls = adapter.dtls_transports(self.pc)[0]
            self._send_rtp, self._send_rtcp = adapter.rtp_sender(dtls)
            for output in self.outputs.values():
                output.transmit = self._send_rtp
            self._start_outputs()

    async def _release(self) -> None:
        await self.peer.close()
