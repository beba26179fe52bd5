"""WHIP (RFC 9725) and WHEP HTTP resources, RTP taps, and the JSON status routes.

``POST /whip/{stream}`` / ``POST /whep/{stream}`` create a session resource
(``/whip/{stream}/{session}``) that takes ``PATCH`` (trickle ICE) and ``DELETE``.
``POST /api/taps`` creates a plain-RTP tap (``/api/taps/{tap}``), ``POST /api/feeds`` a
plain-RTP feed and ``POST /api/pushes`` a push of a stream to a WHIP endpoint; the three share
one set of create, list, get and delete routes (``resources.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, NoReturn
from urllib.parse import quote

from aiohttp import web

from sfu_sidecar.exceptions import AtCapacity, BadInput, NotFound, TooManyRequests
from sfu_sidecar.httpapi import (
    ingest_allowed,
    json_ok,
    read_body,
    read_json,
    require_bearer,
    require_content_type,
    require_publish,
)
from sfu_sidecar.limits import ClientSessions, client_key
from sfu_sidecar.relay import sdp as sdpmod
from sfu_sidecar.relay.feed import FeedSession, parse_feed_request
from sfu_sidecar.relay.offer_check import validate_offer
from sfu_sidecar.relay.peersessions import PublisherSession, ViewerSession
from sfu_sidecar.relay.pull import VIA_HEADER
from sfu_sidecar.relay.push import Push, parse_push_request
from sfu_sidecar.relay.resources import Resources
from sfu_sidecar.relay.resources import end_session as _end_session
from sfu_sidecar.relay.service import RelayService
from sfu_sidecar.relay.tap import TapSession
from sfu_sidecar.relay.taprequest import parse_tap_request, tap_request_from_sdp
from sfu_sidecar.settingvalues import NODE_ID, NODE_ID_RULE, IceServer
from sfu_sidecar.streamname import ROUTE_VARIABLE

SDP = "application/sdp"
TRICKLE = "application/trickle-ice-sdpfrag"
STREAM_PATTERN = ROUTE_VARIABLE
SESSION_PATTERN = r"{session:[0-9a-f]{32}}"

Session = PublisherSession | ViewerSession
# Sessions end when their peers leave, not on a schedule: a few seconds is a fair next try.
SESSION_RETRY_AFTER = "5"
MAX_VIA = 16  # deeper than any real tree of relays


def _link_value(server: IceServer) -> str:
    # RFC 9725 §4.6: one Link header per server, TURN credentials as link parameters.
    value = f'<{server.url}>; rel="ice-server"'
    if server.username is not None:
        value += (
            f'; username="{server.username}"; credential="{server.credential}"'
            '; credential-type="password"'
        )
    return value


def parse_via(request: web.Request) -> tuple[str, ...]:
    """The relays a pulled WHEP request came through (``Sidecar-Via``), checked."""
    raw = request.headers.get(VIA_HEADER, "").strip()
    if not raw:
        return ()
    nodes = tuple(n.strip() for n in raw.split(","))
    if len(nodes) > MAX_VIA or not all(NODE_ID.fullmatch(n) for n in nodes):
        raise BadInput(f"{VIA_HEADER} must list at most {MAX_VIA} node names of "
                       f"{NODE_ID_RULE}, comma-separated")
    return nodes


def add_routes(app: web.Application, service: RelayService) -> None:
    """The relay's routes on ``app``, as every component registers its own."""
    RelayRoutes(service).add(app)


class RelayRoutes:
    """The relay's HTTP resources: WHIP sessions, WHEP sessions and the stream status routes."""

    def __init__(self, service: RelayService) -> None:
        self.service = service
        self.settings = service.settings
        self.clients = ClientSessions()
        self._refused = service.metrics.requests_limited

    def add(self, app: web.Application) -> None:
        r = app.router
        for kind in ("whip", "whep"):
            r.add_post(f"/{kind}/{STREAM_PATTERN}", self.create)
            r.add_route("OPTIONS", f"/{kind}/{STREAM_PATTERN}", self.options)
            r.add_patch(f"/{kind}/{STREAM_PATTERN}/{SESSION_PATTERN}", self.patch)
            r.add_delete(f"/{kind}/{STREAM_PATTERN}/{SESSION_PATTERN}", self.delete)
            # Anything else under a resource: 404 with the JSON body, not a bare 405.
            r.add_route("*", f"/{kind}/{{stream}}/{{session}}", self.unknown)
        pushes = self.service.pushes
        for resources in (
            Resources("taps", "tap", "tapping", self.create_tap, self.service.find_tap,
                      self.service.taps, _end_session),
            Resources("feeds", "feed", "feeding", self.create_feed, self.service.find_feed,
                      self.service.feeds, _end_session),
            # Every push route asks for the publish token: a WHIP URL may hold a key.
            Resources("pushes", "push", "pushing", self.create_push, pushes.find, pushes.list,
                      self._end_push, private=True),
        ):
            resources.add(r, self.settings, self.unknown)
        r.add_get("/api/streams", self.list_streams)
        r.add_get(f"/api/streams/{STREAM_PATTERN}", self.get_stream)

    def _token(self, request: web.Request) -> tuple[str | None, str, bool]:
        publishing = request.path.startswith("/whip/")
        if publishing:
            return self.settings.publish_token, "publishing", True
        return self.settings.view_token, "viewing", False

    def _authorize(self, request: web.Request) -> tuple[str, bool]:
        token, what, publishing = self._token(request)
        if publishing:
            require_publish(request, self.settings, what)
        else:
            require_bearer(request, token, what)
        return what, publishing

    def _refuse(self, limit: str, error: type[TooManyRequests | AtCapacity],
                reason: str) -> NoReturn:
        self._refused.labels(limit).inc()
        raise error(reason, retry_after=SESSION_RETRY_AFTER)

    def _check_limits(self, name: str, client: str, publishing: bool) -> None:
        """Refuse a session over a limit before any work is spent on it.

        Nothing awaits between this check and the session taking its place in the stream
        (RelayService.view adds the viewer before it negotiates), so concurrent requests
        cannot all pass it.
        """
        s = self.settings
        if not publishing:
            streams = self.service.streams.by_name
            viewers = sum(len(stream.viewers) for stream in streams.values())
            if viewers >= s.max_viewers:
                self._refuse("max_viewers", AtCapacity,
                             f"this server has {viewers} viewers, its limit (setting "
                             "max_viewers); try again later or another server")
            percent = self.service.cpu.percent()
            if percent is not None and percent > s.max_cpu_percent:
                # Refused before anyone watching loses frames: past one core the relay's
                # loop falls behind for every viewer at once.
                self._refuse("max_cpu_percent", AtCapacity,
                             f"this server is using {percent:.0f}% of a core, over its limit "
                             f"of {s.max_cpu_percent:g}% (setting max_cpu_percent); try again "
                             "later or another server")
            stream = streams.get(name)
            if stream is not None and len(stream.viewers) >= s.max_viewers_per_stream:
                self._refuse("max_viewers_per_stream", TooManyRequests,
                             f"stream {name} has {len(stream.viewers)} viewers, its limit "
                             "(setting max_viewers_per_stream)")
        if self.clients.count(client) >= s.max_sessions_per_client:
            self._refuse("max_sessions_per_client", TooManyRequests,
                         f"your address has {s.max_sessions_per_client} sessions open, the "
                         "limit (setting max_sessions_per_client); end one first")

    def _links(self) -> list[str]:
        return [_link_value(s) for s in self.settings.ice_servers]

    async def options(self, request: web.Request) -> web.Response:
        token, what, publishing = self._token(request)
        headers = {"Accept-Post": SDP, "Allow": "OPTIONS, POST"}
        response = web.Response(status=204, headers=headers)
        # TURN credentials are secrets: hand them only to callers who may use the endpoint.
        if token is None and publishing and not ingest_allowed(request, self.settings):
            return response
        authorized = token is None or request.headers.get("Authorization") is not None
        if authorized:
            require_bearer(request, token, what)
            for link in self._links():
                response.headers.add("Link", link)
        return response

    async def _sdp_body(self, request: web.Request) -> bytes:
        """An offer or trickle fragment within max_sdp_bytes (and within max_body_bytes,
        which bounds every body)."""
        s = self.settings
        if s.max_sdp_bytes <= s.max_body_bytes:
            return await read_body(request, s.max_sdp_bytes, "max_sdp_bytes")
        return await read_body(request, s.max_body_bytes)

    async def create(self, request: web.Request) -> web.Response:
        _, publishing = self._authorize(request)
        name = request.match_info["stream"]
        client = client_key(request.remote)
        self._check_limits(name, client, publishing)
        require_content_type(request, SDP)
        body = await self._sdp_body(request)
        try:
            offer = body.decode("utf-8")
        except UnicodeDecodeError:
            raise BadInput("offer is not UTF-8 text") from None
        # Validate before touching any stream, so a bad offer takes no publisher slot.
        offer = validate_offer(offer, self.settings.max_sdp_lines)
        sdpmod.check_offer(sdpmod.parse(offer, what="offer"), publishing=publishing)
        # Checked again: the body took time to arrive, and others may have joined meanwhile.
        self._check_limits(name, client, publishing)
        session: Session
        self.clients.reserve(client)
        try:
            if publishing:
                session = await self.service.publish(name, offer)
            else:
                session = await self.service.view(name, offer, parse_via(request))
        except BaseException:
            self.clients.release(client)
            raise
        self.clients.bind(client, session.id, lambda: not session.closed.is_set())
        kind = "whip" if publishing else "whep"
        location = f"/{kind}/{quote(name)}/{session.id}"
        answer = session.peer.answer_sdp
        response = web.Response(
            status=201,
            body=answer.encode(),
            headers={
                "Content-Type": SDP,
                "Location": location,
                "ETag": f'"{session.peer.ice_ufrag or session.id}"',
            },
        )
        for link in self._links():
            response.headers.add("Link", link)
        return response

    def _session(self, request: web.Request) -> Session:
        stream_name = request.match_info["stream"]
        session_id = request.match_info["session"]
        session = self.service.find_session(stream_name, session_id)
        # A WHIP resource is a WebRTC publisher, a WHEP one a viewer; an RTP tap publishing
        # the stream is neither (it lives under /api/taps).
        wanted = PublisherSession if request.path.startswith("/whip/") else ViewerSession
        if not isinstance(session, wanted):
            raise NotFound(f"no session {session_id} on stream {stream_name}")
        return session

    async def patch(self, request: web.Request) -> web.Response:
        self._authorize(request)
        session = self._session(request)
        require_content_type(request, TRICKLE)
        text = (await self._sdp_body(request)).decode("utf-8", errors="replace")
        lines = len(text.splitlines())
        if lines > self.settings.max_sdp_lines:
            raise BadInput(f"trickle fragment has {lines} lines; at most "
                           f"{self.settings.max_sdp_lines} are accepted (setting max_sdp_lines)")
        trickle = sdpmod.parse_trickle(text)
        await session.peer.add_candidates(trickle)
        return web.Response(status=204)

    async def delete(self, request: web.Request) -> web.Response:
        self._authorize(request)
        session = self._session(request)
        await session.close()
        return web.Response(status=200)

    async def unknown(self, request: web.Request) -> web.Response:
        raise NotFound(f"no resource {request.method} {request.path}")

    # --- taps, feeds and pushes: made here, listed, read and ended by Resources ---------------

    async def create_tap(self, request: web.Request) -> tuple[str, dict[str, Any]]:
        client = client_key(request.remote)
        self._check_limits("", client, publishing=True)
        if require_content_type(request, "application/json", SDP) == SDP:
            # The SDP a plain-RTP sender writes; the stream (and a source) in the query.
            text = (await self._sdp_body(request)).decode("utf-8", "replace")
            tap_request = tap_request_from_sdp(
                text, request.query.get("stream"), request.query.get("source"),
                self.settings.max_sdp_lines, request.query.get("sender_clock"))
        else:
            tap_request = parse_tap_request(
                await read_json(request, self.settings.max_body_bytes))
        self._check_limits("", client, publishing=True)
        tap = await self._reserved(client, self.service.tap(tap_request))
        return tap.id, tap.description()

    async def create_feed(self, request: web.Request) -> tuple[str, dict[str, Any]]:
        # Sending media to an address of the caller's choosing is publishing's privilege, not
        # viewing's: whoever may do it can point a stream's bitrate at any host.
        client = client_key(request.remote)
        feed_request = parse_feed_request(
            await read_json(request, self.settings.max_body_bytes))
        # A feed is a viewer of its stream: the viewer limits apply to it.
        self._check_limits(feed_request.stream, client, publishing=False)
        feed = await self._reserved(client, self.service.feed(feed_request))
        return feed.id, feed.description()

    async def create_push(self, request: web.Request) -> tuple[str, dict[str, Any]]:
        # A connection to a URL of the caller's choosing carrying a stream: publishing's
        # privilege, as for feeds.
        stream, url, token = parse_push_request(
            await read_json(request, self.settings.max_body_bytes))
        # A push is a viewer of its stream: the viewer limits apply to it.
        self._check_limits(stream, client_key(request.remote), publishing=False)
        push = self.service.pushes.add(stream, url, token)
        return push.id, push.status()

    async def _reserved(self, client: str, make: Awaitable[TapSession | FeedSession]) -> (
        TapSession | FeedSession
    ):
        """A session counted against ``client``'s limit while it lives."""
        self.clients.reserve(client)
        try:
            session = await make
        except BaseException:
            self.clients.release(client)
            raise
        self.clients.bind(client, session.id, lambda: not session.closed.is_set())
        return session

    async def _end_push(self, push: Push) -> dict[str, Any]:
        return (await self.service.pushes.remove(push.id)).status()

    async def list_streams(self, request: web.Request) -> web.Response:
        return json_ok({"streams": [s.status() for s in self.service.streams.by_name.values()]})

    async def get_stream(self, request: web.Request) -> web.Response:
        stream = self.service.streams.get(request.match_info["stream"])
        return json_ok(stream.status())
