"""aiortc glue: one publisher or viewer peer connection, wired to the stream's forwarders.

All packet work happens in the callbacks aiortc_adapter installs: publisher RTP arrives, is
parsed once, pushed through the track's forwarder, and the per-viewer copies are handed to each
viewer's socket right away (UDP ``sendto`` never waits, so no viewer can hold up another).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol

from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCPeerConnection,
    RTCRtpReceiver,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc.rtcconfiguration import RTCBundlePolicy
from aiortc.rtcdatachannel import RTCDataChannel
from aiortc.rtcrtpparameters import RTCRtpCodecCapability

from sfu_sidecar import logs
from sfu_sidecar.config import Settings
from sfu_sidecar.exceptions import BadInput, NotAcceptable
from sfu_sidecar.limits import Admission, MessageLimiter
from sfu_sidecar.relay import aiortc_adapter as adapter
from sfu_sidecar.relay import rtcp
from sfu_sidecar.relay import sdp as sdpmod
from sfu_sidecar.relay.forwarder import OutputConfig, TrackForwarder, ViewerOutput
from sfu_sidecar.relay.hooks import (
    ABS_CAPTURE_TIME,
    PacketInfo,
    RelayObserver,
    SenderReport,
)
from sfu_sidecar.relay.receiver import PublisherReceiver, PublisherTrack, SessionCounters
from sfu_sidecar.relay.upstream import NackGenerator, ReceiveStatistics
from sfu_sidecar.tasks import Tasks

log = logs.get("relay.session")

TICK_S = 0.05  # NACK retries and keyframe requests are decided this often
RTCP_INTERVAL_NS = 1_000_000_000  # RR/SR about once a second (RFC 3550 §6.2 minimum is 5 s;
# WebRTC stacks report every second, and lip sync in browsers waits for the first SR)


_closing = Tasks("session", log)  # closes started from aiortc callbacks, which cannot await

# Why a session ended, as counted in ``relay_sessions_ended``.
ENDED_DELETED = "deleted"  # the client's DELETE (the default for a plain ``close()``)
ENDED_CONNECT_TIMEOUT = "connect_timeout"  # ICE/DTLS not up within session_connect_timeout_s
ENDED_DISCONNECTED = "disconnected"  # the transport failed or closed: consent lost, DTLS down
ENDED_NO_MEDIA = "no_media"  # a publisher silent for publisher_timeout_s
ENDED_REFUSED = "refused"  # negotiation failed
ENDED_SHUTDOWN = "shutdown"


class StreamSlot(Protocol):
    """What a session needs of the stream it belongs to (``streams.Stream`` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def codecs(self) -> dict[str, sdpmod.CodecInfo]: ...

    @property
    def forwarders(self) -> Mapping[str, TrackForwarder]: ...

    def forwarder(self, kind: str, codec: sdpmod.CodecInfo) -> TrackForwarder: ...

    def publisher_closed(self, session: PublisherSource) -> None: ...

    def viewer_connected(self, session: ViewerSink) -> None: ...

    def viewer_closed(self, session: ViewerSink) -> None: ...

    def keyframe_requested(self, output: ViewerOutput, now_ns: int) -> None: ...


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


def _later(coro: Coroutine[Any, Any, None]) -> None:
    # Closing from inside an aiortc callback must not await there; keep the task referenced.
    _closing.start("close", coro)


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


class _SessionBase:
    """What every session shares, WebRTC or not: identity, state, lifetime, observer calls."""

    def __init__(
        self,
        role: str,
        stream: StreamSlot,
        settings: Settings,
        now_ns: Callable[[], int],
        observers: list[RelayObserver],
    ) -> None:
        self.id = uuid.uuid4().hex
        self.stream = stream
        self.settings = settings
        self.now_ns = now_ns
        self.observers = observers
        self.counters = SessionCounters()
        self.state = "new"
        self.created_ns = now_ns()
        self.closed = asyncio.Event()
        self.ended_reason: str | None = None
        self.connected_once = False
        self._send_rtcp: Callable[[bytes], None] | None = None
        self._tasks = Tasks(f"{role}-{self.id[:8]}", log)

    @property
    def stream_name(self) -> str:
        return self.stream.name

    async def _connect_deadline(self) -> None:
        """Drop the session if it never connects: a client that POSTed and vanished leaves no
        ICE pair for consent checks to fail on, and aioice waits for remote candidates that a
        trickling client may never send."""
        timeout_s = self.settings.session_connect_timeout_s
        await asyncio.sleep(timeout_s)
        if not self.connected_once and not self.closed.is_set():
            log.info("%s on %s: not connected after %.0f s, dropping", self.id[:8],
                     self.stream.name, timeout_s)
            _later(self.close(ENDED_CONNECT_TIMEOUT))

    async def close(self, reason: str = ENDED_DELETED) -> None:
        raise NotImplementedError

    def _notify(self, hook: str, call: Callable[[RelayObserver], None]) -> None:
        """``call`` every observer's ``hook``; one that raises is logged, the rest still run."""
        for observer in self.observers:
            try:
                call(observer)
            except Exception:
                log.exception("observer failed on %s", hook)

    def _parse_rtcp(self, data: bytes, now_ns: int) -> list[rtcp.RtcpMessage]:
        """A compound packet's messages; a torn one is counted and yields none."""
        try:
            return rtcp.parse_compound(data, now_ns)
        except ValueError:
            self.counters.rtcp_errors += 1
            return []


class _PeerSession(_SessionBase):
    """What WebRTC sessions (publisher and viewer) share: the peer connection, trickle ICE,
    data channels."""

    def __init__(
        self,
        role: str,
        stream: StreamSlot,
        settings: Settings,
        now_ns: Callable[[], int],
        observers: list[RelayObserver],
        channel_limiter: MessageLimiter | None = None,
    ) -> None:
        super().__init__(role, stream, settings, now_ns, observers)
        self.pc = RTCPeerConnection(rtc_configuration())
        self.answer_sdp = ""  # what the WHIP or WHEP response carries (set by negotiate)
        self.data_channels: dict[str, ChannelHandle] = {}
        self.ice_ufrag: str | None = None
        self.ice_pwd: str | None = None
        # One rate for all of this peer's channels: a second channel buys it nothing.
        self._admit_message = (
            channel_limiter.gate(f"{role} {self.id[:8]} on {stream.name}")
            if channel_limiter is not None else None
        )

    def _transport_lost(self) -> None:
        _later(self.close(ENDED_DISCONNECTED))

    async def add_candidates(self, trickle: sdpmod.Trickle) -> None:
        sdpmod.check_no_restart(trickle, self.ice_ufrag, self.ice_pwd)
        for cand in trickle.candidates:
            await self.pc.addIceCandidate(cand)

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        handle = ChannelHandle(channel, self._admit_message)
        self.data_channels[handle.label] = handle
        self._channel_opened(handle)

    def _channel_opened(self, channel: ChannelHandle) -> None:
        raise NotImplementedError


class PublisherSource(_SessionBase):
    """What feeds a stream as its publisher: the receive path every kind of publisher shares.

    A WHIP session (:class:`PublisherSession`) and a plain-RTP tap (``relay/tap.py``) differ
    only in how packets arrive and where feedback goes: each calls :meth:`_init_publisher`
    once, hands plaintext RTP to :meth:`_on_rtp` and RTCP to :meth:`_on_rtcp`, sets
    ``_send_rtcp`` once it can reach the sender, and releases its transport in
    :meth:`_release`. Everything else (forwarding, observers, NACK and keyframe requests,
    receiver reports, the no-media timeout, status) happens here once.
    """

    receiver: PublisherReceiver

    def _init_publisher(self) -> None:
        self._last_packet_mono = time.monotonic()
        # False while the source says it has nothing to send (a pulled stream whose upstream
        # lost its publisher); observers hear of changes through ``publisher_state``.
        self.upstream_live = True
        # Only observers that override publisher_packet cost anything per packet.
        self._packet_observers = [
            o for o in self.observers
            if type(o).publisher_packet is not RelayObserver.publisher_packet
        ]
        # The receive logic; until the tracks are added, it forwards nothing.
        self.receiver = PublisherReceiver(
            0, self.counters,
            on_packet=self._publisher_packet if self._packet_observers else None,
        )

    @property
    def tracks(self) -> list[PublisherTrack]:
        return self.receiver.tracks

    @property
    def live(self) -> bool:
        return self.connected_once and not self.closed.is_set()

    def bitrates_bps(self) -> dict[str, float]:
        return {t.kind: t.bitrate_bps for t in self.tracks}

    @property
    def relayed(self) -> bool:
        """Whether capture times arrive on a clock joined to this node's and the stream's
        epoch comes from upstream (a pull from another sidecar), not from this node."""
        return False

    @property
    def sender_clock_is_house(self) -> bool:
        """Whether the sender's RTCP sender reports are declared to be on the house clock (a
        tap whose sender's host keeps house time): its capture times are then exact."""
        return False

    # --- packet path ----------------------------------------------------------------------

    def _add_track(self, m: sdpmod.MediaInfo, sender: sdpmod.MediaInfo) -> PublisherTrack:
        """Receive the negotiated media section ``m`` as one of this stream's tracks;
        ``sender`` is the sender's own description of it (its SSRCs and RTX SSRCs)."""
        codec = m.primary
        forwarder = self.stream.forwarder(m.kind, codec)
        track = PublisherTrack(
            kind=m.kind,
            mid=m.mid,
            codec=codec,
            rtx_payload_type=m.rtx_for(codec.payload_type),
            forwarder=forwarder,
            stats=ReceiveStatistics(codec.clock_rate),
            nack=NackGenerator() if m.kind == "video" else None,
            extensions=m.extensions,
            rtx_ssrcs=sender.rtx_ssrcs,
        )
        ssrcs = [s for s in sender.ssrcs if s not in sender.rtx_ssrcs]
        track.media_ssrc = ssrcs[0] if ssrcs else None
        forwarder.set_source({i: u for u, i in m.extensions.items()}, codec.name,
                             codec.clock_rate)
        self.receiver.add_track(track)
        return track

    def _on_rtp(self, data: bytes, arrival_ms: int) -> None:
        self._receive_media(data, arrival_ms)

    def _receive_media(self, data: bytes, arrival_ms: int) -> bool:
        """One plaintext RTP packet; whether it was media of one of the tracks."""
        started = time.perf_counter_ns()
        received = self.receiver.receive_rtp(data, self.now_ns(), arrival_ms)
        self._flush_rtcp()  # a NACK for a gap this packet revealed goes first
        if received is None:
            return False
        # Only media keeps a publisher alive: on a port anyone can reach (a tap), garbage
        # must not hold the stream open.
        self._last_packet_mono = time.monotonic()
        copies, observations = received
        for output, out in copies:
            transmit = output.transmit
            if transmit is None:
                continue
            try:
                transmit(out)
            except Exception:  # a broken viewer loses its packet, nobody else does
                self.counters.send_errors += 1
                output.send_errors += 1
        self.counters.latency_ns.append(time.perf_counter_ns() - started)
        if observations is not None:
            observations.deliver()  # after every copy left: observers add no latency
        for track, report in self.receiver.reports_due():
            self._sender_report_out(track.kind, report)
        return True

    def _publisher_packet(self, info: PacketInfo) -> Mapping[str, bytes] | None:
        written: dict[str, bytes] = {}
        for observer in self._packet_observers:
            try:
                values = observer.publisher_packet(self.stream.name, self.id, info)
            except Exception:  # a broken observer must not stop forwarding
                self.counters.observer_errors += 1
                continue
            if values:
                written.update(values)
        return written

    def _on_rtcp(self, data: bytes) -> None:
        for track, report in self.receiver.receive_rtcp(data, self.now_ns()):
            self._sender_report_out(track.kind, report)

    def _sender_report_out(self, kind: str, report: SenderReport) -> None:
        for observer in self.observers:
            try:
                observer.publisher_sender_report(self.stream.name, kind, report)
            except Exception:
                log.exception("observer failed on a sender report")

    def _flush_rtcp(self) -> None:
        for data in self.receiver.data_to_send():
            if self._send_rtcp is None:
                continue  # no transport yet: the feedback is dropped
            with contextlib.suppress(ConnectionError):
                self._send_rtcp(data)

    def request_keyframe(self, kind: str) -> None:
        """A keyframe of the ``kind`` track, for the stream (a ``hooks.RequestKeyframe``)."""
        self.receiver.request_keyframe(kind)
        self._flush_rtcp()

    # --- periodic -------------------------------------------------------------------------

    def _silence_counts(self) -> bool:
        """Whether time without media counts towards publisher_timeout_s now."""
        return True

    async def _tick(self) -> None:
        next_report = 0
        timeout_s = self.settings.publisher_timeout_s
        while not self.closed.is_set():
            await asyncio.sleep(TICK_S)
            now = self.now_ns()
            self.receiver.tick(now)
            mono = time.monotonic_ns()
            if mono >= next_report:
                next_report = mono + int(RTCP_INTERVAL_NS * (0.5 + random.random()))
                self.receiver.receiver_report(now)
            self._flush_rtcp()
            if (self._silence_counts()
                    and time.monotonic() - self._last_packet_mono > timeout_s):
                log.info("publisher %s on %s: no media for %.0f s, dropping", self.id[:8],
                         self.stream.name, timeout_s)
                _later(self.close(ENDED_NO_MEDIA))
                return

    async def close(self, reason: str = ENDED_DELETED) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        self.state = "closed"
        self.ended_reason = reason
        await self._tasks.stop()
        self.stream.publisher_closed(self)
        self._notify("publisher_closed", lambda o: o.publisher_closed(self))
        await self._release()

    async def _release(self) -> None:
        """Free the transport (peer connection, sockets) once the session has ended."""

    def status(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "tracks": [
                {
                    "kind": t.kind,
                    "codec": t.codec.name,
                    "payload_type": t.codec.payload_type,
                    "ssrc": t.media_ssrc,
                    "packets": t.stats.packets_received,
                    "rtx_packets": t.rtx_packets,
                    "bitrate_bps": round(t.bitrate_bps),
                    "nacks_sent": t.nack.nacked if t.nack is not None else 0,
                    "keyframe_requests_sent": t.forwarder.keyframe_requests_sent,
                }
                for t in self.tracks
            ],
            "parse_errors": self.counters.parse_errors,
        }


class PublisherSession(PublisherSource, _PeerSession):
    """A WHIP publisher: receives SRTP over ICE/DTLS, feeds the stream's forwarders."""

    def __init__(
        self,
        stream: StreamSlot,
        settings: Settings,
        now_ns: Callable[[], int],
        observers: list[RelayObserver],
        channel_limiter: MessageLimiter | None = None,
    ) -> None:
        super().__init__("publisher", stream, settings, now_ns, observers, channel_limiter)
        self._init_publisher()

    async def negotiate(self, offer_text: str) -> str:
        offer = sdpmod.parse(offer_text, what="offer")
        sdpmod.check_offer(offer, publishing=True)
        self.ice_ufrag, self.ice_pwd = offer.ice_ufrag, offer.ice_pwd
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
        self.pc.on("connectionstatechange", self._on_state)
        self.pc.on("datachannel", self._on_datachannel)
        self._tasks.start("tick", self._tick())
        self._tasks.start("connect-deadline", self._connect_deadline())
        log.info("publisher %s on %s: %s (%d mDNS candidates dropped)", self.id[:8],
                 self.stream.name, ", ".join(f"{t.kind} {t.codec.name}" for t in self.tracks),
                 dropped)
        self.answer_sdp = str(answer_text)
        return self.answer_sdp

    def _on_state(self) -> None:
        state = self.pc.connectionState
        self.state = state
        if state == "connected":
            self.connected_once = True
            dtls = adapter.dtls_transports(self.pc)[0]
            _, self._send_rtcp = adapter.rtp_sender(dtls)
            self._notify("publisher_connected", lambda o: o.publisher_connected(self))
        elif state in ("failed", "closed"):
            self._transport_lost()

    def _channel_opened(self, channel: ChannelHandle) -> None:
        self._notify("publisher_data_channel",
                     lambda o: o.publisher_data_channel(self, channel))

    async def _release(self) -> None:
        await adapter.close_peer(self.pc)


class ViewerSink(_SessionBase):
    """What receives a stream as a viewer: the part every kind of viewer shares.

    A WHEP session (:class:`ViewerSession`) and a plain-RTP feed (``relay/feed.py``) differ
    only in how packets leave and where RTCP comes from: each calls :meth:`_init_viewer` once,
    fills :attr:`outputs` (one :class:`ViewerOutput` per kind), calls :meth:`_start_outputs`
    once it can send (with each output's ``transmit`` set), hands RTCP from the receiver to
    :meth:`_on_rtcp`, and releases its transport in :meth:`_release`. The rest (joining the
    forwarders, NACK answers, keyframe requests, receiver reports, sender reports built by the
    observers' rewriters, status) happens here once.

    Observers see it as a ``hooks.ViewerHandle``: :attr:`outputs` (kind ->
    :class:`ViewerOutput`, with ``observers`` and ``sender_report_rewriter``),
    :attr:`accepts_data_channel`.
    """

    def _init_viewer(self) -> None:
        self.outputs: dict[str, ViewerOutput] = {}
        self.accepts_data_channel = False
        self.cname = "sfu-sidecar"

    def _add_output(self, m: sdpmod.MediaInfo, codec: sdpmod.CodecInfo,
                    sender: RTCRtpSender) -> ViewerOutput:
        """Send this stream's ``m.kind`` track as ``codec`` on the negotiated section ``m``,
        from the SSRCs of the silenced aiortc ``sender`` that holds its place in the SDP."""
        ssrc, rtx_ssrc = adapter.sender_ssrcs(sender)
        rtx_pt = m.rtx_for(codec.payload_type)
        config = OutputConfig(
            ssrc=ssrc,
            payload_type=codec.payload_type,
            extension_ids=m.extensions,
            mid=m.mid,
            rtx_payload_type=rtx_pt,
            rtx_ssrc=rtx_ssrc if rtx_pt is not None else None,
            clock_rate=codec.clock_rate,
        )
        # Random starting points (RFC 3550 §5.1), below 2^15 like aiortc's own senders to keep
        # early SRTP rollover guesses simple.
        rng = random.SystemRandom()
        output = ViewerOutput(self.id, m.kind, config, seq_base=rng.randrange(0x8000),
                              ts_base=rng.getrandbits(32))
        self.outputs[m.kind] = output
        return output

    def _start_outputs(self) -> None:
        """The outputs can send: join the forwarders, start sender reports, tell observers."""
        self.connected_once = True
        self.stream.viewer_connected(self)
        self._tasks.start("rtcp", self._rtcp_loop())
        self._notify("viewer_connected", lambda o: o.viewer_connected(self))

    # --- feedback from the receiver -----------------------------------------------------------

    def _on_rtcp(self, data: bytes) -> None:
        now = self.now_ns()
        for msg in self._parse_rtcp(data, now):
            if isinstance(msg, rtcp.Nack):
                output = self._output_for(msg.media_ssrc)
                if output is None:
                    continue
                forwarder = self.stream.forwarders.get(output.kind)
                if forwarder is None:
                    continue
                for packet in forwarder.retransmit(output, list(msg.lost), now):
                    self._send(output.transmit, packet)
            elif isinstance(msg, rtcp.KeyframeRequest):
                for media_ssrc in msg.media_ssrcs:
                    output = self._output_for(media_ssrc)
                    if output is not None:
                        self.stream.keyframe_requested(output, now)
            elif isinstance(msg, (rtcp.ReceiverReportPacket, rtcp.SenderReportPacket)):
                for block in msg.reports:
                    output = self._output_for(block.ssrc)
                    if output is not None:
                        output.last_report = block
                        self._receiver_report_in(output.kind, block)

    def _receiver_report_in(self, kind: str, block: rtcp.ReportBlock) -> None:
        self._notify("viewer_receiver_report",
                     lambda o: o.viewer_receiver_report(self, kind, block))

    def _output_for(self, ssrc: int) -> ViewerOutput | None:
        for output in self.outputs.values():
            if output.config.ssrc == ssrc:
                return output
        return None

    # --- sending ------------------------------------------------------------------------------

    def _send(self, send: Callable[[bytes], None] | None, data: bytes) -> None:
        # Before the transport is up there is nowhere to send; a failing send is counted and
        # costs only this packet.
        if send is None:
            return
        try:
            send(data)
        except Exception:
            self.counters.send_errors += 1

    def _rtcp_sender(self, output: ViewerOutput) -> Callable[[bytes], None] | None:
        """Where ``output``'s RTCP goes (one transport for every kind, unless overridden)."""
        return self._send_rtcp

    def _sender_report(self, forwarder: TrackForwarder, output: ViewerOutput) -> (
        rtcp.SenderReport | None
    ):
        """The SR handed to the output's rewriter: the publisher's latest, moved into this
        output's RTP time (None until the publisher sent one)."""
        return forwarder.sender_report_for(output)

    async def _rtcp_loop(self) -> None:
        while not self.closed.is_set():
            await asyncio.sleep(RTCP_INTERVAL_NS / 1e9 * (0.5 + random.random()))
            for output in list(self.outputs.values()):
                forwarder = self.stream.forwarders.get(output.kind)
                if forwarder is None or not output.started:
                    continue
                report = self._sender_report(forwarder, output)
                if output.sender_report_rewriter is not None:
                    try:
                        report = output.sender_report_rewriter(report)
                    except Exception:
                        log.exception("sender report rewriter failed")
                        report = None
                if report is None:
                    continue
                self._send(
                    self._rtcp_sender(output),
                    rtcp.build_sr(output.config.ssrc, report)
                    + rtcp.build_sdes_cname(output.config.ssrc, self.cname),
                )

    # --- lifetime -----------------------------------------------------------------------------

    async def close(self, reason: str = ENDED_DELETED) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        self.state = "closed"
        self.ended_reason = reason
        for output in self.outputs.values():
            output.transmit = None
        await self._tasks.stop()
        self.stream.viewer_closed(self)
        self._notify("viewer_closed", lambda o: o.viewer_closed(self))
        await self._release()

    async def _release(self) -> None:
        """Free the transport (peer connection, sockets) once the session has ended."""

    def status(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "data_channel": self.accepts_data_channel,
            "tracks": [
                {
                    "kind": o.kind,
                    "ssrc": o.config.ssrc,
                    "payload_type": o.config.payload_type,
                    # Whether the far end negotiated abs-capture-time: without it, its only
                    # timing is the sender reports (a WHIP server that is an SFU may rewrite
                    # those for its own viewers).
                    "abs_capture_time": ABS_CAPTURE_TIME in o.config.extension_ids,
                    "started": o.started,
                    "packets_sent": o.packets_sent,
                    "nacks_received": o.nacks_received,
                    "retransmitted": o.retransmitted,
                    "plis_forwarded": o.keyframe_requests,
                    "send_errors": o.send_errors,
                    "fraction_lost": (
                        o.last_report.fraction_lost / 256 if o.last_report is not None else None
                    ),
                }
                for o in self.outputs.values()
            ],
        }


class ViewerSession(ViewerSink, _PeerSession):
    """A WHEP viewer: silenced aiortc senders whose packets the relay writes itself.

    Channels the viewer opens reach observers through ``RelayObserver.viewer_data_channel``
    (and stay in :attr:`data_channels`, by label).
    """

    def __init__(
        self,
        stream: StreamSlot,
        settings: Settings,
        now_ns: Callable[[], int],
        observers: list[RelayObserver],
        *,
        media_clock: Callable[[int], list[str]] | None = None,
        channel_limiter: MessageLimiter | None = None,
    ) -> None:
        super().__init__("viewer", stream, settings, now_ns, observers, channel_limiter)
        self._init_viewer()
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
        self.ice_ufrag, self.ice_pwd = offer.ice_ufrag, offer.ice_pwd
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
        self.pc.on("connectionstatechange", self._on_state)
        self.pc.on("datachannel", self._on_datachannel)
        self._tasks.start("connect-deadline", self._connect_deadline())
        self.answer_sdp = answer_text
        return answer_text

    def _on_state(self) -> None:
        state = self.pc.connectionState
        self.state = state
        if state == "connected" and not self.connected_once:
            dtls = adapter.dtls_transports(self.pc)[0]
            self._send_rtp, self._send_rtcp = adapter.rtp_sender(dtls)
            for output in self.outputs.values():
                output.transmit = self._send_rtp
            self._start_outputs()
        elif state in ("failed", "closed"):
            self._transport_lost()

    async def _release(self) -> None:
        await adapter.close_peer(self.pc)
