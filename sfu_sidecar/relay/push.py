"""Push: one of this node's streams forwarded to a WHIP endpoint (the relay as a WHIP client).

A push is a viewer of its stream (``ViewerSink``) whose transport is a WebRTC peer connection
that this node offers: one sendonly m-line per track the stream has, pinned to the stream's
codec (the relay never transcodes), and a ``sync`` DataChannel. The offer goes to the remote's
WHIP endpoint (another sidecar, a media server's WHIP ingest); its answer fixes the payload
types and header extension ids, and from then on the push gets the same per-viewer copies a
WHEP viewer gets: its own SSRCs, sequence numbers and timestamps, NACKs answered from the
forwarder's cache, PLIs passed to the stream's publisher, abs-capture-time in this node's house
time (when the remote accepts the extension) and sender reports whose NTP time is capture time
(the sync component treats a push as one more viewer).

When the remote is a sidecar, the push joins its house clock over the ``sync`` channel as a
WHIP publisher does (``client/whip.py``), with this node's house clock as the client clock, and
sends the ClockReport: the remote then maps the pushed capture stamps exactly. A remote that
never answers the join (no sidecar) still gets the media; the join is skipped.

:class:`Pushes` keeps the configured pushes running: a push waits until its stream has a
publisher, and a session that ends for any reason other than DELETE or shutdown is started
again with backoff (0.5 s doubling to 30 s) for as long as the push is configured. A push whose
stream loses its publisher keeps its session (viewers survive publisher changes).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiortc import RTCSessionDescription
from aiortc.rtcdatachannel import RTCDataChannel

from sfu_sidecar import logs
from sfu_sidecar.config import Settings
from sfu_sidecar.exceptions import BadInput, Conflict, NotFound, Unprocessable
from sfu_sidecar.relay import aiortc_adapter as adapter
from sfu_sidecar.relay import remote
from sfu_sidecar.relay import sdp as sdpmod
from sfu_sidecar.relay.hooks import RelayObserver
from sfu_sidecar.relay.peer import ChannelHandle, IdleTrack, PeerLink, codec_capabilities
from sfu_sidecar.relay.session import ENDED_DELETED, ENDED_DISCONNECTED, ENDED_SHUTDOWN
from sfu_sidecar.relay.sessionstate import SessionState
from sfu_sidecar.relay.streams import Streams
from sfu_sidecar.relay.taprequest import check_keys, check_stream
from sfu_sidecar.relay.viewersink import ViewerSink, ViewerSlot
from sfu_sidecar.sync.channel_join import join_over_channel
from sfu_sidecar.sync.wire import ClockReport
from sfu_sidecar.tasks import Tasks

log = logs.get("relay.push")

CLOCK_REJOIN_S = 60.0  # the two house clocks drift apart slowly; the remote gets a new offset
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0
WAIT_POLL_S = 0.5  # how often a push waiting for its stream's publisher looks again
MAX_URL = 2048
TOKEN = re.compile(r"[\x21-\x7e]{1,4096}")  # visible ASCII: it goes into a header

# A push's state, as its status shows it.
WAITING = "waiting"  # for its stream to have a publisher
CONNECTING = "connecting"  # offer sent or ICE/DTLS under way
CONNECTED = "connected"
RETRYING = "retrying"  # the last session failed or ended; the next starts after a backoff
STOPPED = "stopped"


class PushError(Exception):
    """The remote refused the push or answered something unusable."""


def origin_of(url: str) -> str:
    """scheme://host[:port] of ``url``: what logs name (a WHIP URL's path may hold a key)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class PushSession(ViewerSink):
    """One WHIP session to the remote: this node offers, the remote answers."""

    def __init__(
        self,
        stream: ViewerSlot,
        settings: Settings,
        now_ns: Callable[[], int],
        observers: list[RelayObserver],
        *,
        url: str,
        token: str | None,
    ) -> None:
        super().__init__("push", stream, settings, now_ns, observers)
        self.peer = PeerLink(f"push {self.id[:8]} of {stream.name}", self._channel_opened,
                             self._peer_state)
        self.pc = self.peer.pc
        self.url = url
        self.token = token
        self.location: str | None = None  # the remote's session resource
        self.clock_report: ClockReport | None = None  # remote house - ours, once joined
        self.clock_answered: bool | None = None  # None until the first join ended
        self._channel: RTCDataChannel | None = None

    # --- negotiation ------------------------------------------------------------------------

    async def open(self) -> None:
        """Offer the stream's tracks to the WHIP endpoint and set up one output per track."""
        codecs = dict(self.stream.codecs)
        if not codecs:
            raise PushError(f"stream {self.stream.name} has no tracks yet")
        senders = {}
        for kind in ("audio", "video"):
            codec = codecs.get(kind)
            if codec is None:
                continue
            transceiver = self.pc.addTransceiver(IdleTrack(kind), direction="sendonly")
            transceiver.setCodecPreferences(codec_capabilities(kind, codec))
            adapter.silence_sender(transceiver.sender)
            senders[kind] = transceiver.sender
        self._channel = self.pc.createDataChannel("sync", ordered=False, maxRetransmits=0)
        adapter.install_ice(self.pc, self.settings.ice_addresses, self.settings.ice_port_range)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        for dtls in adapter.dtls_transports(self.pc):
            adapter.on_rtcp(dtls, self._on_rtcp)
        offer_text = str(self.pc.localDescription.sdp)
        offer = sdpmod.parse(offer_text, what="offer")
        answer_text = await self._post_offer(offer_text)
        try:
            answer = sdpmod.parse(answer_text, what="answer")
            await self.pc.setRemoteDescription(RTCSessionDescription(answer_text, "answer"))
        except Exception as exc:  # aiortc raises assorted types for answers it cannot take
            raise PushError(f"{origin_of(self.url)} answered an unusable SDP: {exc}") from None
        self.cname = next((m.cname for m in offer.media if m.cname), self.cname)
        for m in answer.media:
            if m.kind not in senders:
                continue
            wanted = codecs[m.kind]
            codec = next((c for c in m.codecs if c.name == wanted.name), None)
            if codec is None:
                raise PushError(
                    f"{origin_of(self.url)} does not take {m.kind} as {wanted.name} "
                    f"(answered {', '.join(c.name for c in m.codecs) or 'nothing'}); the relay "
                    "never transcodes")
            self._add_output(m, codec, senders[m.kind])
            self.stream.forwarder(m.kind, wanted)
        if not self.outputs:
            raise PushError(f"{origin_of(self.url)} accepted none of the stream's tracks")
        self._tasks.start("connect-deadline", self._connect_deadline())
        log.info("push %s of %s to %s: %s", self.id[:8], self.stream.name,
                 origin_of(self.url),
                 ", ".join(f"{k} {codecs[k].name}" for k in self.outputs))

    async def _post_offer(self, offer: str) -> str:
        where = origin_of(self.url)
        try:
            answer = await remote.post_offer(self.url, offer, self.token)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise PushError(f"{where} unreachable ({type(exc).__name__}: {exc})") from None
        if answer.status != 201:
            raise PushError(f"{where} answered {answer.status}: {answer.body.strip()[:300]}")
        if not answer.location:
            raise PushError(f"{where} answered 201 without a Location")
        self.location = answer.location
        return answer.body

    # --- transport --------------------------------------------------------------------------

    def _peer_state(self, state: SessionState | None) -> None:
        if self.follow_peer(state):
            dtls = adapter.dtls_transports(self.pc)[0]
            send_rtp, self._send_rtcp = adapter.rtp_sender(dtls)
            for output in self.outputs.values():
                output.transmit = send_rtp
            self._start_outputs()
            self._tasks.start("clock", self._clock_loop())

    async def _clock_loop(self) -> None:
        """Join the remote's house clock now and every CLOCK_REJOIN_S while it answers."""
        assert self._channel is not None
        while not self.closed.is_set():
            try:
                report = await join_over_channel(self._channel, self.now_ns)
            except TimeoutError:
                report = None  # the remote never opened the channel
            if report is None:
                if self.clock_answered is None:
                    log.info("push %s: %s did not answer the clock join (not a sidecar?); "
                             "it gets the media and abs-capture-time in our house time",
                             self.id[:8], origin_of(self.url))
                    self.clock_answered = False
                    return
                log.warning("push %s: clock rejoin got no answer, the remote keeps the last",
                            self.id[:8])
            else:
                if self.clock_answered is None:
                    log.info("push %s: joined the house clock of %s, offset %d ns, error %d ns",
                             self.id[:8], origin_of(self.url), report.offset_ns,
                             report.error_ns)
                self.clock_answered = True
                self.clock_report = report
            await asyncio.sleep(CLOCK_REJOIN_S)

    def _channel_opened(self, channel: ChannelHandle) -> None:
        """The remote opens no channels of its own (ours is the offerer's)."""

    async def _release(self) -> None:
        if self.location is not None and self.ended_reason != ENDED_DISCONNECTED:
            # Free the remote's publisher slot now rather than at its consent timeout.
            await remote.delete_resource(self.location, self.token)
        await self.peer.close()

    def status(self) -> dict[str, Any]:
        out = super().status()
        out["clock"] = (
            {"remote_minus_local_ns": self.clock_report.offset_ns,
             "error_ns": self.clock_report.error_ns}
            if self.clock_report is not None else None
        )
        return out


# --- the pushes a node keeps running ---------------------------------------------------------


OpenPush = Callable[[str, str, str | None], Awaitable[PushSession]]


class Push:
    """One configured push: its target, and the session now running for it (if any)."""

    def __init__(self, stream: str, url: str, token: str | None, source: str) -> None:
        self.id = uuid.uuid4().hex
        self.stream = stream
        self.url = url
        self.token = token
        self.source = source  # "api" or "settings"
        self.phase = WAITING
        self.attempts = 0
        self.last_error: str | None = None
        self.session: PushSession | None = None
        self.created_ns = time.time_ns()
        self.retry_at: float | None = None  # monotonic time of the next attempt, if waiting
        self.task: asyncio.Task[None] | None = None

    @property
    def state(self) -> str:
        session = self.session
        if self.phase == CONNECTING and session is not None and not session.closed.is_set():
            return CONNECTED if session.connected_once else CONNECTING
        return self.phase

    def status(self) -> dict[str, Any]:
        retry_in = (max(0.0, self.retry_at - time.monotonic())
                    if self.retry_at is not None and self.phase == RETRYING else None)
        session = self.session
        return {
            "id": self.id,
            "stream": self.stream,
            "url": self.url,
            "token": "***" if self.token else None,
            "source": self.source,
            "state": self.state,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "retry_in_s": round(retry_in, 2) if retry_in is not None else None,
            "session": (session.status() if session is not None and not session.closed.is_set()
                        else None),
        }


def parse_push_request(body: Any) -> tuple[str, str, str | None]:
    """A ``POST /api/pushes`` body, checked: ``{"stream", "url", "token"?}``."""
    if not isinstance(body, dict):
        raise BadInput("body must be a JSON object")
    check_keys(body, ("stream", "url", "token"), "push")
    stream = check_stream(body.get("stream"))
    url = body.get("url")
    if not isinstance(url, str) or not url:
        raise BadInput("url must be the WHIP endpoint's URL, a string")
    if len(url) > MAX_URL:
        raise Unprocessable(f"url is longer than {MAX_URL} characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Unprocessable(f"url {url[:80]!r} is not an http(s) URL with a host")
    token = body.get("token")
    if token is not None and (not isinstance(token, str) or TOKEN.fullmatch(token) is None):
        raise BadInput("token must be a string of 1-4096 visible ASCII characters (sent as "
                       "Authorization: Bearer to the WHIP endpoint)")
    return stream, url, token


class Pushes:
    """The pushes of one node: started from settings or the API, each kept running by its own
    task until it is deleted or the node stops."""

    def __init__(
        self, streams: Streams, open_push: OpenPush,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.streams = streams
        self._open = open_push
        self._sleep = sleep  # every wait of the retry loop (a test replaces it)
        self.by_id: dict[str, Push] = {}
        self._tasks = Tasks("pushes", log)
        self._stopping = False

    def list(self) -> list[Push]:
        return list(self.by_id.values())

    def find(self, push_id: str) -> Push | None:
        return self.by_id.get(push_id)

    def get(self, push_id: str) -> Push:
        push = self.by_id.get(push_id)
        if push is None:
            raise NotFound(f"no push {push_id}")
        return push

    def add(self, stream: str, url: str, token: str | None, *, source: str = "api",
            require_stream: bool = True) -> Push:
        """Start pushing ``stream`` to ``url``. NotFound for a stream that does not exist
        (``require_stream``), Conflict when that push is running already."""
        if require_stream and stream not in self.streams.by_name:
            raise NotFound(f"no stream {stream}; a push sends a stream that exists (publish "
                           "it first)")
        for other in self.by_id.values():
            if other.stream == stream and other.url == url:
                raise Conflict(f"stream {stream} is pushed to that URL already (push "
                               f"{other.id})")
        push = Push(stream, url, token, source)
        self.by_id[push.id] = push
        push.task = self._tasks.start(f"push-{push.id[:8]}", self._run(push))
        log.info("push %s: %s to %s (%s)", push.id[:8], stream, origin_of(url), source)
        return push

    async def remove(self, push_id: str) -> Push:
        """End a push: its session is closed (the remote's resource deleted) and not retried."""
        push = self.get(push_id)
        del self.by_id[push_id]
        push.phase = STOPPED
        if push.task is not None and push.task is not asyncio.current_task():
            push.task.cancel()  # an offer under way is refused and its session closed
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await push.task
        session = push.session
        if session is not None:
            await session.close(ENDED_DELETED)
        return push

    def _ready(self, stream: str) -> bool:
        found = self.streams.by_name.get(stream)
        return (found is not None and bool(found.codecs) and found.publisher is not None
                and not found.publisher.closed.is_set())

    async def _run(self, push: Push) -> None:
        delay = RETRY_FIRST_S
        while push.phase != STOPPED and not self._stopping:
            if not self._ready(push.stream):
                push.phase = WAITING
                await self._sleep(WAIT_POLL_S)
                continue
            push.phase = CONNECTING
            push.attempts += 1
            try:
                session = await self._open(push.stream, push.url, push.token)
            except Exception as exc:
                push.last_error = str(exc) or type(exc).__name__
                log.warning("push %s of %s to %s failed (attempt %d), again in %.1f s: %s",
                            push.id[:8], push.stream, origin_of(push.url), push.attempts,
                            delay, push.last_error)
            else:
                push.session = session
                await session.closed.wait()
                if push.phase == STOPPED or self._stopping or session.ended_reason in (
                    ENDED_DELETED, ENDED_SHUTDOWN
                ):
                    return
                push.last_error = f"session ended: {session.ended_reason}"
                if session.connected_once:
                    delay = RETRY_FIRST_S  # it ran: the next failure starts the backoff over
                log.info("push %s of %s to %s ended (%s), again in %.1f s", push.id[:8],
                         push.stream, origin_of(push.url), session.ended_reason, delay)
            push.phase = RETRYING
            push.retry_at = time.monotonic() + delay
            await self._sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys((WAITING, CONNECTING, CONNECTED, RETRYING), 0)
        for push in self.by_id.values():
            out[push.state] = out.get(push.state, 0) + 1
        return out

    async def stop(self) -> None:
        self._stopping = True
        await self._tasks.stop()
        sessions = [p.session for p in self.by_id.values() if p.session is not None]
        for push in self.by_id.values():
            push.phase = STOPPED
        await asyncio.gather(*(s.close(ENDED_SHUTDOWN) for s in sessions),
                             return_exceptions=True)
