"""Pull: a stream's publisher fed by another relay's WHEP output (the edge side of a cascade).

The edge is an ordinary WHEP client of its upstream: it offers to receive audio, video and a
``sync`` DataChannel, and what arrives goes through the same receive path as a WHIP publisher's
media (``PublisherSource``): the edge's forwarders, observers, NACKs and keyframe requests (a
keyframe request travels upstream as the edge's PLI, and the upstream passes it on to its own
publisher).

Between two sidecars the hop keeps capture times exactly. Before it offers, the edge joins the
upstream's house clock over ``/api/clock/ws`` with its own house clock as the client clock, so
it knows ``edge house - upstream house`` to the exchange's error. Every packet the upstream
sends carries abs-capture-time in upstream house time, and the edge hands that offset to its
observers as the clock join of this publisher (a ``ClockReport`` on a local ``sync`` channel,
the same message a WHIP publisher sends): the edge's mapping then gives each frame the
upstream's capture time on the edge's clock. The upstream's ``sync`` channel also brings the
stream's epoch and captions, which the edge passes on through the same local channel (the sync
component takes them from a relayed publisher only), and whether the upstream has a live
publisher, which observers hear through ``publisher_state``.

Against a WHEP server that is not a sidecar (no clock endpoint) the edge maps what that server
sends, as for any publisher: abs-capture-time if present, else its sender reports, else
arrival, every record flagged with its source.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
from aiortc import RTCSessionDescription
from aiortc.rtcdatachannel import RTCDataChannel
from websockets.exceptions import InvalidHandshake

from sfu_sidecar import logs
from sfu_sidecar.clock.exchange import ClockReport
from sfu_sidecar.clock.join import HouseClock, join_clock
from sfu_sidecar.config import Settings
from sfu_sidecar.exceptions import (
    AtCapacity,
    BadInput,
    LoopDetected,
    NotFound,
    SidecarError,
    UpstreamUnavailable,
)
from sfu_sidecar.limits import MessageLimiter
from sfu_sidecar.relay import aiortc_adapter as adapter
from sfu_sidecar.relay import remote
from sfu_sidecar.relay import sdp as sdpmod
from sfu_sidecar.relay.hooks import RelayObserver
from sfu_sidecar.relay.peer import ChannelHandle, PeerLink
from sfu_sidecar.relay.session import ENDED_DISCONNECTED, PublisherSlot, PublisherSource
from sfu_sidecar.relay.sessionstate import SessionState
from sfu_sidecar.sync.wire import (
    Batch,
    Control,
    ControlMessage,
    ControlRecord,
    Cue,
    CueRetract,
    Epoch,
    PublisherState,
    SyncWireError,
    parse_message,
)

log = logs.get("relay.pull")

# Names the nodes a WHEP request has come through, closest to the viewer first. A node that
# finds itself in it refuses (508): the request went round a loop of pulls.
VIA_HEADER = "Sidecar-Via"
CLOCK_REJOIN_S = 60.0
MAX_HELD = 1000  # the two oscillators drift apart by up to ~1 us/s at 1 ppm each


@dataclass(frozen=True, slots=True)
class Upstream:
    """Where a stream is pulled from."""

    whep_url: str  # the stream's WHEP endpoint
    token: str | None = None
    # Base URL whose /api/clock/ws the edge joins; None for a WHEP server that is not a sidecar.
    clock_url: str | None = None
    via: tuple[str, ...] = ()  # nodes the request has passed, this one last

    @property
    def origin(self) -> str:
        parts = urlsplit(self.whep_url)
        return f"{parts.scheme}://{parts.netloc}"


class LocalChannel:
    """A ``hooks.DataChannel`` that lives in this process: how the pull hands its clock join to
    the observers, through the seam a WHIP publisher's ``sync`` channel takes."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._handlers: list[Callable[[bytes | str], None]] = []

    @property
    def label(self) -> str:
        return self._label

    @property
    def ready_state(self) -> str:
        return "open"

    @property
    def buffered_amount(self) -> int:
        return 0

    def send(self, data: bytes | str) -> None:
        """Replies go nowhere: the upstream answered the clock join over HTTP already."""

    def on_message(self, handler: Callable[[bytes | str], None]) -> None:
        self._handlers.append(handler)

    def deliver(self, data: bytes) -> None:
        for handler in list(self._handlers):
            try:
                handler(data)
            except Exception:
                log.exception("local channel handler failed")


class PullSession(PublisherSource):
    """The publisher of a stream whose media comes from an upstream relay over WHEP."""

    def __init__(
        self,
        stream: PublisherSlot,
        settings: Settings,
        now_ns: Callable[[], int],
        observers: list[RelayObserver],
        upstream: Upstream,
        channel_limiter: MessageLimiter | None = None,
    ) -> None:
        super().__init__("pull", stream, settings, now_ns, observers)
        self.peer = PeerLink(f"pull {self.id[:8]} on {stream.name}", self._channel_opened,
                             self._peer_state, channel_limiter)
        self.pc = self.peer.pc
        self.upstream = upstream
        # Upstream controls that came before the observers had the local channel.
        self._held: list[bytes] | None = []
        self.location: str | None = None
        self.clock: HouseClock | None = None  # upstream house - edge house, when joined
        self._local = LocalChannel("sync")
        self._upstream_channel: RTCDataChannel | None = None

    @property
    def relayed(self) -> bool:
        # Capture times and the epoch are the upstream's only when its clock was joined.
        return self.clock is not None

    @property
    def edge_minus_upstream_ns(self) -> int | None:
        return -self.clock.offset_ns if self.clock is not None else None

    # --- negotiation ------------------------------------------------------------------------

    async def open(self) -> None:
        """Join the upstream's clock, offer, and take the answer's tracks as this stream's."""
        if self.upstream.clock_url is not None:
            self.clock = await self._join_clock()
        for kind in ("audio", "video"):
            self.pc.addTransceiver(kind, direction="recvonly")
        channel = self.pc.createDataChannel("sync", ordered=False, maxRetransmits=0)
        channel.on("message", self._upstream_message)
        self._upstream_channel = channel
        adapter.install_ice(self.pc, self.settings.ice_addresses, self.settings.ice_port_range)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        for dtls in adapter.dtls_transports(self.pc):
            adapter.on_rtp(dtls, self._on_rtp)
            adapter.on_rtcp(dtls, self._on_rtcp)
        answer_text = await self._post_offer(str(self.pc.localDescription.sdp))
        try:
            answer = sdpmod.parse(answer_text, what="upstream answer")
            await self.pc.setRemoteDescription(RTCSessionDescription(answer_text, "answer"))
        except (BadInput, ValueError) as exc:
            raise UpstreamUnavailable(
                f"upstream {self.upstream.whep_url} answered an unusable SDP: {exc}"
            ) from None
        self.receiver.rtcp_ssrc = adapter.rtcp_ssrc(self.pc)
        self.receiver.bitrate = adapter.RemoteBitrateEstimator()
        for m in answer.media:
            codec = m.primary
            if not codec.forwardable:
                raise UpstreamUnavailable(
                    f"upstream {self.upstream.whep_url} sends {m.kind} as {codec.name}, "
                    "which the relay does not forward")
            self._add_track(m, m)  # the answer is the sender's: its SSRCs are in it
        self.stream.codecs.update({t.kind: t.codec for t in self.tracks})
        self._tasks.start("tick", self._tick())
        self._tasks.start("connect-deadline", self._connect_deadline())
        if self.clock is not None:
            self._tasks.start("clock", self._rejoin_loop())
        log.info("pull %s of %s from %s: %s (clock %s)", self.id[:8], self.stream.name,
                 self.upstream.whep_url,
                 ", ".join(f"{t.kind} {t.codec.name}" for t in self.tracks),
                 f"joined, error {self.clock.error_ns} ns" if self.clock is not None
                 else "not a sidecar: capture times from what it sends")

    async def _join_clock(self) -> HouseClock | None:
        """The upstream's house clock against ours; None when the upstream is reachable but
        has no clock endpoint (a WHEP server that is not a sidecar)."""
        assert self.upstream.clock_url is not None
        try:
            return await join_clock(self.upstream.clock_url, clock_ns=self.now_ns)
        except InvalidHandshake as exc:  # an HTTP answer other than a WebSocket upgrade
            log.info("upstream %s has no house clock (%s): capture times from what it sends",
                     self.upstream.origin, exc)
            return None
        except Exception as exc:  # refused, unreachable, or answers that make no sense
            raise UpstreamUnavailable(
                f"upstream {self.upstream.origin} did not answer its house clock "
                f"({type(exc).__name__}: {exc}); nothing pulled", retry_after="2",
            ) from None

    async def _post_offer(self, offer: str) -> str:
        url = self.upstream.whep_url
        try:
            answer = await remote.post_offer(url, offer, self.upstream.token,
                                             {VIA_HEADER: ",".join(self.upstream.via)})
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise UpstreamUnavailable(
                f"upstream {url} unreachable ({type(exc).__name__}: {exc})", retry_after="2",
            ) from None
        status, body = answer.status, answer.body
        reason = body.strip()[:300]
        if status == 201 and answer.location:
            self.location = answer.location
            return body
        if status == 404:
            raise NotFound(f"upstream {url} has no such stream: {reason}")
        if status == 508:
            raise LoopDetected(f"pulling from {url} would loop: {reason}")
        if status in (429, 503):
            raise AtCapacity(f"upstream {url} is full: {reason}",
                             retry_after=answer.retry_after or "5")
        raise UpstreamUnavailable(f"upstream {url} answered {status}: {reason}")

    # --- transport --------------------------------------------------------------------------

    def _peer_state(self, state: SessionState | None) -> None:
        if self.follow_peer(state):
            dtls = adapter.dtls_transports(self.pc)[0]
            _, self._send_rtcp = adapter.rtp_sender(dtls)
            self._notify("publisher_connected", lambda o: o.publisher_connected(self))
            self._notify("publisher_data_channel",
                         lambda o: o.publisher_data_channel(self, self._local))
            self._announce_clock()

    def _announce_clock(self) -> None:
        if self.clock is None or not self.connected_once:
            return
        report = ClockReport(-self.clock.offset_ns, self.clock.error_ns, self.clock.rtt_ns)
        self._local.deliver(ControlMessage(report).serialize())
        held, self._held = self._held or [], None
        for raw in held:
            self._local.deliver(raw)

    async def _rejoin_loop(self) -> None:
        while not self.closed.is_set():
            await asyncio.sleep(CLOCK_REJOIN_S)
            try:
                clock = await self._join_clock()
            except UpstreamUnavailable as exc:
                log.warning("pull %s: clock join failed, keeping the last: %s", self.id[:8], exc)
                continue
            if clock is not None:
                self.clock = clock
                self._announce_clock()

    def _upstream_message(self, data: bytes | str) -> None:
        """The upstream's sync channel: controls (epoch, captions, publisher state) matter
        here; the frame records describe the upstream's RTP time, which the edge re-maps."""
        try:
            message = parse_message(data.encode() if isinstance(data, str) else data)
        except SyncWireError:
            self.counters.parse_errors += 1
            return
        controls: list[Control] = []
        if isinstance(message, ControlMessage):
            controls.append(message.message)
        elif isinstance(message, Batch):
            controls.extend(r.message for r in message.records if isinstance(r, ControlRecord))
        for control in controls:
            if isinstance(control, PublisherState):
                self._upstream_state(control.live)
            elif isinstance(control, Epoch | Cue | CueRetract) and self.clock is not None:
                # To the observers, as if this publisher had sent it on its sync channel;
                # held until they have that channel and the clock join that comes first.
                raw = ControlMessage(control).serialize()
                if self._held is None:
                    self._local.deliver(raw)
                elif len(self._held) < MAX_HELD:
                    self._held.append(raw)

    def _upstream_state(self, live: bool) -> None:
        if live == self.upstream_live:
            return
        self.upstream_live = live
        log.info("pull %s of %s: upstream publisher %s", self.id[:8], self.stream.name,
                 "live" if live else "gone")
        self._notify("publisher_state", lambda o: o.publisher_state(self))

    def _silence_counts(self) -> bool:
        # An upstream without a publisher sends nothing and says so; silence then is not loss.
        return self.upstream_live

    def _channel_opened(self, channel: ChannelHandle) -> None:
        """The upstream opens no channels of its own (ours is the offerer's)."""

    async def _release(self) -> None:
        if self.location is not None and self.ended_reason != ENDED_DISCONNECTED:
            # Free the upstream's viewer slot now rather than at its consent timeout.
            await remote.delete_resource(self.location, self.upstream.token)
        await self.peer.close()

    def status(self) -> dict[str, object]:
        out = super().status()
        out["upstream"] = self.upstream.whep_url
        out["upstream_live"] = self.upstream_live
        out["clock"] = (
            {"edge_minus_upstream_ns": self.edge_minus_upstream_ns,
             "error_ns": self.clock.error_ns} if self.clock is not None else None
        )
        return out


def is_refusal(exc: BaseException) -> bool:
    """Whether a failed pull is worth trying again later (the upstream was away or full)
    rather than an answer that will not change (loop, bad request)."""
    return isinstance(exc, UpstreamUnavailable | AtCapacity | OSError | TimeoutError) or (
        isinstance(exc, SidecarError) and exc.status >= 500 and exc.status != 508
    )
