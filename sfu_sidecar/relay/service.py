"""The relay as an application component: sessions, metrics, lifetime."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from sfu_sidecar import logs
from sfu_sidecar.config import Settings
from sfu_sidecar.exceptions import Conflict, NotFound
from sfu_sidecar.limits import CpuMonitor, MessageLimiter
from sfu_sidecar.metrics import NAMESPACE, Metrics
from sfu_sidecar.relay import aiortc_adapter as adapter
from sfu_sidecar.relay.cascade import Cascade
from sfu_sidecar.relay.directory import Directory, HttpDirectory, MachineThenShared
from sfu_sidecar.relay.feed import FeedRequest, FeedSession
from sfu_sidecar.relay.hooks import ABS_CAPTURE_TIME, RelayObserver
from sfu_sidecar.relay.peersessions import PublisherSession, ViewerSession
from sfu_sidecar.relay.pull import PullSession, Upstream
from sfu_sidecar.relay.push import Pushes, PushSession
from sfu_sidecar.relay.session import ENDED_REFUSED, ENDED_SHUTDOWN, PublisherSource
from sfu_sidecar.relay.streams import Stream, Streams
from sfu_sidecar.relay.tap import TapSession
from sfu_sidecar.relay.taprequest import TapRequest
from sfu_sidecar.relay.viewersink import ViewerSink

if TYPE_CHECKING:
    from sfu_sidecar.relay.redis_directory import StreamDirectory

log = logs.get("relay")

P = TypeVar("P", bound=PublisherSource)

DEFAULT_HEADER_EXTENSIONS: tuple[tuple[str, str], ...] = (
    ("audio", ABS_CAPTURE_TIME),
    ("video", ABS_CAPTURE_TIME),
)


class RelayService:
    """WHIP in, WHEP out, RTP forwarded packet by packet.

    ``now_ns`` is the house clock (Unix-epoch ns); arrival times handed to observers and the
    times the pure cores work with come from it. ``header_extensions`` are (kind, URI) pairs
    negotiated with publishers and viewers on top of aiortc's own (process-wide, see
    ``aiortc_adapter.negotiate_header_extension``); the publisher's values are forwarded to
    every viewer that negotiated the same URI. ``observers``: see ``relay/hooks.py``.
    """

    name = "relay"

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        *,
        now_ns: Callable[[], int] = time.time_ns,
        header_extensions: Sequence[tuple[str, str]] = DEFAULT_HEADER_EXTENSIONS,
        observers: Iterable[RelayObserver] = (),
        media_clock: Callable[[int], list[str]] | None = None,
    ) -> None:
        self.settings = settings
        # RFC 7273 lines for viewer answers (ClockService.sdp_attributes): non-empty only while
        # the house clock is locked to PTP; viewers' RTP time then follows the house clock.
        self.media_clock = media_clock
        self.metrics = metrics
        self.now_ns = now_ns
        self.header_extensions = tuple(header_extensions)
        self.observers: list[RelayObserver] = list(observers)
        self.streams = Streams()
        self._accepted = {"publishers": 0, "viewers": 0, "taps": 0, "feeds": 0, "pulls": 0,
                          "pushes": 0}
        self.channel_limiter = MessageLimiter(
            "data_channel", settings.channel_messages_per_s, metrics.messages_dropped, log
        )
        # The load new viewers are admitted against (setting max_cpu_percent).
        self.cpu = CpuMonitor()
        self._cpu_task: asyncio.Task[None] | None = None
        self.node_id = settings.node_id or uuid.uuid4().hex[:12]
        # Pulls streams that have no publisher here from origin_url (None: not an edge).
        self.cascade: Cascade | None = None
        # Which node publishes which stream, shared in Redis (redis_url and advertise_url).
        self.directory: StreamDirectory | None = None
        if settings.redis_url is not None and settings.advertise_url is not None:
            from sfu_sidecar.relay.redis_directory import StreamDirectory  # the redis extra

            self.directory = StreamDirectory(
                settings.redis_url, self.node_id, settings.advertise_url,
                is_origin=lambda p: not isinstance(p, PullSession),
            )
            self.observers.append(self.directory)
        lookup: Directory | None = self.directory
        if settings.directory_url is not None:  # a worker of serve --workers
            machine = HttpDirectory(settings.directory_url)
            lookup = machine if self.directory is None \
                else MachineThenShared(machine, self.directory, self.node_id)
        if settings.origin_url is not None or lookup is not None:
            self.cascade = Cascade(
                node_id=self.node_id, origin_url=settings.origin_url,
                token=settings.origin_token, linger_s=settings.cascade_linger_s,
                streams=self.streams, pull=self.pull, directory=lookup,
            )
            self.observers.append(self.cascade)
        # Streams forwarded to WHIP endpoints (setting push_targets, and POST /api/pushes).
        self.pushes = Pushes(self.streams, self.push)
        metrics.registry.register(_RelayCollector(self))

    def add_observer(self, observer: RelayObserver) -> None:
        self.observers.append(observer)

    # --- RelayView (relay/hooks.py): what features read and ask ------------------------------

    def stream(self, name: str) -> Stream | None:
        return self.streams.by_name.get(name)

    def stream_names(self) -> list[str]:
        return list(self.streams.by_name)

    @property
    def is_edge(self) -> bool:
        return self.cascade is not None

    async def ensure_stream(self, name: str) -> None:
        if self.cascade is not None:
            await self.cascade.ensure(name)

    def add_interest(self, wants: Callable[[str], bool]) -> None:
        if self.cascade is not None:
            self.cascade.add_interest(wants)

    def request_keyframe(self, stream: str, kind: str = "video") -> bool:
        """Ask ``stream``'s publisher for a keyframe (throttled per track, as viewers' PLIs).
        True when a request went out; False for an unknown stream or while throttled."""
        found = self.streams.by_name.get(stream)
        return found is not None and found.keyframe_wanted(kind, self.now_ns())

    async def start(self) -> None:
        await adapter.check()
        adapter.set_consent_timeout(self.settings.ice_consent_timeout_s)
        for kind, uri in self.header_extensions:
            adapter.negotiate_header_extension(kind, uri)
        # Forwarded as is (aiortc has no VP9), in profile 0: relay/sdp.py accepts no other.
        adapter.negotiate_video_codec("video/VP9", {"profile-id": 0})
        self._cpu_task = asyncio.create_task(self.cpu.run(), name="relay-cpu")
        if self.directory is not None:
            await self.directory.start()
        if self.cascade is not None:
            await self.cascade.start()
        for target in self.settings.push_targets:
            self.pushes.add(target.stream, target.url, self.settings.push_token,
                            source="settings", require_stream=False)

    async def stop(self) -> None:
        if self._cpu_task is not None:
            self._cpu_task.cancel()
        if self.cascade is not None:
            await self.cascade.stop()
        await self.pushes.stop()
        sessions: list[PublisherSource | ViewerSink] = []
        for stream in list(self.streams.by_name.values()):
            if stream.publisher is not None:
                sessions.append(stream.publisher)
            sessions.extend(stream.viewers.values())
        await asyncio.gather(*(s.close(ENDED_SHUTDOWN) for s in sessions),
                             return_exceptions=True)
        if self.directory is not None:
            await self.directory.stop()

    async def _start_publisher(self, stream: Stream, session: P, role: str,
                               opening: Callable[[], Awaitable[object]]) -> P:
        """``session`` takes ``stream``'s publisher slot, then opens; refused, it leaves."""
        stream.claim_publisher(session, session.request_keyframe)
        try:
            await opening()
        except BaseException:
            await session.close(ENDED_REFUSED)
            raise
        self._accepted[role] += 1
        return session

    async def publish(self, name: str, offer: str) -> PublisherSession:
        stream = self.streams.get_or_create(name)
        session = PublisherSession(stream, self.settings, self.now_ns, self.observers,
                                   self.channel_limiter)
        return await self._start_publisher(stream, session, "publishers",
                                           lambda: session.negotiate(offer))

    async def tap(self, request: TapRequest) -> TapSession:
        """A plain-RTP tap publishing ``request.stream`` (``relay/tap.py``)."""
        stream = self.streams.get_or_create(request.stream)
        session = TapSession(stream, self.settings, self.now_ns, self.observers, request)
        return await self._start_publisher(stream, session, "taps", session.open)

    async def pull(self, name: str, upstream: Upstream) -> PullSession:
        """``name``'s publisher, pulled over WHEP from ``upstream`` (``relay/pull.py``)."""
        stream = self.streams.get_or_create(name)
        session = PullSession(stream, self.settings, self.now_ns, self.observers, upstream,
                              self.channel_limiter)
        return await self._start_publisher(stream, session, "pulls", session.open)

    def taps(self) -> list[TapSession]:
        return [s.publisher for s in self.streams.by_name.values()
                if isinstance(s.publisher, TapSession)]

    def find_tap(self, tap_id: str) -> TapSession | None:
        return next((t for t in self.taps() if t.id == tap_id), None)

    async def feed(self, request: FeedRequest) -> FeedSession:
        """Plain RTP of ``request.stream`` to a receiver (``relay/feed.py``), a viewer of it."""
        stream = self.streams.by_name.get(request.stream)
        if stream is None:
            raise NotFound(f"no stream {request.stream}; a feed sends a stream that exists "
                           "(publish it, or create a tap, first)")
        missing = [m.kind for m in request.media if m.kind not in stream.codecs]
        if missing:
            raise Conflict(f"stream {request.stream} has no {' or '.join(missing)} track")
        session = FeedSession(stream, self.settings, self.now_ns, self.observers, request)
        stream.viewer_added(session)
        try:
            await session.open(dict(stream.codecs))
        except BaseException:
            await session.close(ENDED_REFUSED)
            raise
        self._accepted["feeds"] += 1
        return session

    async def push(self, name: str, url: str, token: str | None) -> PushSession:
        """``name`` forwarded to the WHIP endpoint ``url`` (``relay/push.py``), a viewer of it.
        :class:`Pushes` calls this for every attempt."""
        stream = self.streams.by_name.get(name)
        if stream is None:
            raise NotFound(f"no stream {name}")
        session = PushSession(stream, self.settings, self.now_ns, self.observers,
                              url=url, token=token)
        stream.viewer_added(session)
        try:
            await session.open()
        except BaseException:
            await session.close(ENDED_REFUSED)
            raise
        self._accepted["pushes"] += 1
        return session

    def feeds(self) -> list[FeedSession]:
        return [v for s in self.streams.by_name.values() for v in s.viewers.values()
                if isinstance(v, FeedSession)]

    def find_feed(self, feed_id: str) -> FeedSession | None:
        return next((f for f in self.feeds() if f.id == feed_id), None)

    async def view(self, name: str, offer: str, via: tuple[str, ...] = ()) -> ViewerSession:
        """A WHEP viewer of ``name``. ``via``: the relays a pulled request came through (an
        edge pulls the stream from its upstream first when it has no publisher for it)."""
        if self.cascade is not None:
            await self.cascade.ensure(name, via)
        stream = self.streams.get_or_create(name)
        session = ViewerSession(stream, self.settings, self.now_ns, self.observers,
                                media_clock=self.media_clock,
                                channel_limiter=self.channel_limiter)
        stream.viewer_added(session)
        try:
            await session.negotiate(offer)
        except BaseException:
            await session.close(ENDED_REFUSED)
            raise
        self._accepted["viewers"] += 1
        return session

    def find_session(self, stream_name: str, session_id: str) -> (
        PublisherSource | ViewerSink | None
    ):
        stream = self.streams.by_name.get(stream_name)
        if stream is None:
            return None
        if stream.publisher is not None and stream.publisher.id == session_id:
            return stream.publisher
        return stream.viewers.get(session_id)

    def latency_samples_ns(self) -> list[int]:
        """Receive-to-forwarded times of recent publisher packets, across streams."""
        out: list[int] = []
        for stream in self.streams.by_name.values():
            if stream.publisher is not None:
                out.extend(stream.publisher.counters.latency_ns)
        return out


class _RelayCollector(Collector):
    """Relay counters read at scrape time: the packet path only bumps plain integers."""

    def __init__(self, service: RelayService) -> None:
        self.service = service

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        s = self.service
        packets_in = CounterMetricFamily(
            f"{NAMESPACE}_relay_packets_received", "RTP packets received from publishers",
            labels=["stream", "kind"],
        )
        packets_out = CounterMetricFamily(
            f"{NAMESPACE}_relay_packets_forwarded", "RTP packets sent to viewers",
            labels=["stream", "kind"],
        )
        nacks = CounterMetricFamily(
            f"{NAMESPACE}_relay_retransmissions", "packets re-sent to viewers on NACK",
            labels=["stream", "kind"],
        )
        plis = CounterMetricFamily(
            f"{NAMESPACE}_relay_keyframe_requests", "keyframe requests sent to publishers",
            labels=["stream", "kind"],
        )
        viewers = GaugeMetricFamily(
            f"{NAMESPACE}_relay_viewers", "viewer sessions", labels=["stream"]
        )
        publishers = GaugeMetricFamily(
            f"{NAMESPACE}_relay_publishers", "live publisher sessions"
        )
        bad = CounterMetricFamily(
            f"{NAMESPACE}_relay_bad_packets",
            "publisher packets dropped: unparsable RTP/RTCP, unknown payload type, or (RTP "
            "taps) from a source address or SSRC the tap does not accept, or too large",
            labels=["stream", "reason"],
        )
        feed_bad = CounterMetricFamily(
            f"{NAMESPACE}_relay_feed_bad_packets",
            "datagrams RTP feeds dropped: from a host other than the receiver, not RTCP, "
            "or unparsable RTCP", labels=["stream", "reason"],
        )
        sessions = CounterMetricFamily(
            f"{NAMESPACE}_relay_sessions", "sessions accepted", labels=["role"]
        )
        ended = CounterMetricFamily(
            f"{NAMESPACE}_relay_sessions_ended",
            "sessions ended, by why: deleted, connect_timeout, disconnected (ICE consent or "
            "DTLS lost), no_media, refused, shutdown", labels=["role", "reason"],
        )
        for (role, reason), count in sorted(s.streams.ended.items()):
            ended.add_metric([role, reason], count)
        live = 0
        for stream in list(s.streams.by_name.values()):
            live += stream.publisher is not None
            viewers.add_metric([stream.name], len(stream.viewers))
            if stream.publisher is not None:
                c = stream.publisher.counters
                bad.add_metric([stream.name, "rtp"], c.parse_errors)
                bad.add_metric([stream.name, "rtcp"], c.rtcp_errors)
                bad.add_metric([stream.name, "payload_type"], c.unknown_payload)
                bad.add_metric([stream.name, "source"], c.foreign_packets)
                bad.add_metric([stream.name, "size"], c.oversize_packets)
            feeds = [v for v in stream.viewers.values() if isinstance(v, FeedSession)]
            if feeds:
                for reason, count in (
                    ("source", sum(f.counters.foreign_packets for f in feeds)),
                    ("not_rtcp", sum(f.counters.parse_errors for f in feeds)),
                    ("rtcp", sum(f.counters.rtcp_errors for f in feeds)),
                ):
                    feed_bad.add_metric([stream.name, reason], count)
            for kind, fw in stream.forwarders.items():
                packets_in.add_metric([stream.name, kind], fw.packets_in)
                packets_out.add_metric([stream.name, kind], fw.packets_sent())
                nacks.add_metric([stream.name, kind], fw.retransmitted())
                plis.add_metric([stream.name, kind], fw.keyframe_requests_sent)
        publishers.add_metric([], live)
        sessions.add_metric(["publisher"], s._accepted["publishers"])
        sessions.add_metric(["viewer"], s._accepted["viewers"])
        sessions.add_metric(["tap"], s._accepted["taps"])
        sessions.add_metric(["feed"], s._accepted["feeds"])
        sessions.add_metric(["pull"], s._accepted["pulls"])
        sessions.add_metric(["push"], s._accepted["pushes"])
        pushes = GaugeMetricFamily(
            f"{NAMESPACE}_relay_pushes",
            "pushes to WHIP endpoints, by state: waiting (for a publisher), connecting, "
            "connected, retrying", labels=["state"],
        )
        for state, count in s.pushes.counts().items():
            pushes.add_metric([state], count)
        cpu = GaugeMetricFamily(
            f"{NAMESPACE}_relay_cpu_percent",
            "share of one core this process used, smoothed over 2 s (new viewers are refused "
            "above max_cpu_percent)",
        )
        percent = s.cpu.percent()
        if percent is not None:
            cpu.add_metric([], percent)
        yield from (packets_in, packets_out, nacks, plis, viewers, publishers, bad, feed_bad,
                    sessions, ended, pushes, cpu)
