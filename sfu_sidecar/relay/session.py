"""Sessions: what every publisher and every viewer of a stream shares, whatever carries it.

A session is a role over a transport. :class:`PublisherSource` is the receive path of every
kind of publisher (WHIP, an RTP tap, an edge's pull) and :class:`ViewerSink` the send path of
every kind of viewer (WHEP, an RTP feed, a push); each concrete session holds its transport
(a ``peer.PeerLink``, or UDP sockets) and hands it packets. All packet work happens in the
callbacks the transport calls: publisher RTP arrives, is parsed once, pushed through the
track's forwarder, and the per-viewer copies are handed to each viewer's socket right away
(UDP ``sendto`` never waits, so no viewer can hold up another).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol

from sfu_sidecar import logs
from sfu_sidecar.config import Settings
from sfu_sidecar.relay import rtcp
from sfu_sidecar.relay import sdp as sdpmod
from sfu_sidecar.relay.forwarder import TrackForwarder
from sfu_sidecar.relay.hooks import (
    PacketInfo,
    RelayObserver,
    SenderReport,
)
from sfu_sidecar.relay.receiver import PublisherReceiver, PublisherTrack, SessionCounters
from sfu_sidecar.relay.sessionstate import Lifecycle, SessionState
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


class PublisherSlot(StreamSlot, Protocol):
    """What a publisher needs of its stream besides that: to be let go."""

    def publisher_closed(self, session: PublisherSource) -> None: ...


def later(coro: Coroutine[Any, Any, None]) -> None:
    # Closing from inside an aiortc callback must not await there; keep the task referenced.
    _closing.start("close", coro)


class SessionBase:
    """What every session shares, WebRTC or not: identity, state (one :class:`Lifecycle`),
    lifetime, observer calls. A session is a role (:class:`PublisherSource` or
    :class:`ViewerSink`) over a transport it holds: a peer connection (``peer.PeerLink``) or
    UDP sockets."""

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
        self.life = Lifecycle()
        self.created_ns = now_ns()
        self._send_rtcp: Callable[[bytes], None] | None = None
        self._tasks = Tasks(f"{role}-{self.id[:8]}", log)

    @property
    def stream_name(self) -> str:
        return self.stream.name

    @property
    def state(self) -> SessionState:
        return self.life.state

    @property
    def closed(self) -> asyncio.Event:
        return self.life.closed

    @property
    def connected_once(self) -> bool:
        return self.life.connected_once

    @property
    def ended_reason(self) -> str | None:
        return self.life.ended_reason

    async def _connect_deadline(self) -> None:
        """Drop the session if it never connects: a client that POSTed and vanished leaves no
        ICE pair for consent checks to fail on, and aioice waits for remote candidates that a
        trickling client may never send."""
        timeout_s = self.settings.session_connect_timeout_s
        await asyncio.sleep(timeout_s)
        if not self.connected_once and not self.closed.is_set():
            log.info("%s on %s: not connected after %.0f s, dropping", self.id[:8],
                     self.stream.name, timeout_s)
            later(self.close(ENDED_CONNECT_TIMEOUT))

    async def close(self, reason: str = ENDED_DELETED) -> None:
        raise NotImplementedError

    async def _release(self) -> None:
        """Free the transport (peer connection, sockets) once the session has ended."""

    def follow_peer(self, state: SessionState | None) -> bool:
        """Take a peer connection's new state (``peer.PeerLink``) as the session's; whether the
        session has just connected for the first time. A failed or closed transport ends it."""
        if state is None:
            later(self.close(ENDED_DISCONNECTED))
            return False
        first = state is SessionState.CONNECTED and not self.connected_once
        return self.life.move(state) and first

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


class PublisherSource(SessionBase):
    """What feeds a stream as its publisher: the receive path every kind of publisher shares.

    A WHIP session (``peersessions.PublisherSession``), a plain-RTP tap (``relay/tap.py``) and
    an edge's pull (``relay/pull.py``) differ only in the transport they hold, so in how packets
    arrive and where feedback goes: each hands plaintext RTP to :meth:`_on_rtp` and RTCP to
    :meth:`_on_rtcp`, sets
    ``_send_rtcp`` once it can reach the sender, and releases its transport in
    :meth:`_release`. Everything else (forwarding, observers, NACK and keyframe requests,
    receiver reports, the no-media timeout, status) happens here once.
    """

    stream: PublisherSlot

    def __init__(
        self,
        role: str,
        stream: PublisherSlot,
        settings: Settings,
        now_ns: Callable[[], int],
        observers: list[RelayObserver],
    ) -> None:
        super().__init__(role, stream, settings, now_ns, observers)
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
                later(self.close(ENDED_NO_MEDIA))
                return

    async def close(self, reason: str = ENDED_DELETED) -> None:
        if not self.life.end(reason):
            return
        await self._tasks.stop()
        self.stream.publisher_closed(self)
        self._notify("publisher_closed", lambda o: o.publisher_closed(self))
        await self._release()

    def status(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state.value,
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
