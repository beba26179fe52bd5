"""WHIP (RFC 9725) and WHEP HTTP resources, and the JSON status routes.

``POST /whip/{stream}`` / ``POST /whep/{stream}`` create a session resource
(``/whip/{stream}/{session}``) that takes ``PATCH`` (trickle ICE) and ``DELETE``.
"""

from __future__ import annotations

from urllib.parse import quote

from aiohttp import web

from sfu_sidecar.config import IceServer
from sfu_sidecar.exceptions import NotFound
from sfu_sidecar.httpapi import json_ok, read_body, require_bearer, require_content_type
from sfu_sidecar.relay import sdp as sdpmod
from sfu_sidecar.relay.offer_check import validate_offer
from sfu_sidecar.relay.service import RelayService
from sfu_sidecar.relay.session import PublisherSession, ViewerSession

SDP = "application/sdp"
TRICKLE = "application/trickle-ice-sdpfrag"
STREAM_PATTERN = r"{stream:[A-Za-z0-9_.~-]{1,128}}"
SESSION_PATTERN = r"{session:[0-9a-f]{32}}"

Session = PublisherSession | ViewerSession


def _link_value(server: IceServer) -> str:
    # RFC 9725 §4.6: one Link header per server, TURN credentials as link parameters.
    value = f'<{server.url}>; rel="ice-server"'
    if server.username is not None:
        value += (
            f'; username="{server.username}"; credential="{server.credential}"'
            '; credential-type="password"'
        )
    return value


class RelayRoutes:
    """The relay's HTTP resources: WHIP sessions, WHEP sessions and the stream status routes."""

    def __init__(self, service: RelayService) -> None:
        self.service = service
        self.settings = service.settings

    def add(self, app: web.Application) -> None:
        r = app.router
        for kind in ("whip", "whep"):
            r.add_post(f"/{kind}/{STREAM_PATTERN}", self.create)
            r.add_route("OPTIONS", f"/{kind}/{STREAM_PATTERN}", self.options)
            r.add_patch(f"/{kind}/{STREAM_PATTERN}/{SESSION_PATTERN}", self.patch)
            r.add_delete(f"/{kind}/{STREAM_PATTERN}/{SESSION_PATTERN}", self.delete)
            # Anything else under a resource: 404 with the JSON body, not a bare 405.
            r.add_route("*", f"/{kind}/{{stream}}/{{session}}", self.unknown)
        r.add_get("/api/streams", self.list_streams)
        r.add_get(f"/api/streams/{STREAM_PATTERN}", self.get_stream)

    def _token(self, request: web.Request) -> tuple[str | None, str, bool]:
        publishing = request.path.startswith("/whip/")
        if publishing:
            return self.settings.publish_token, "publishing", True
        return self.settings.view_token, "viewing", False

    def _links(self) -> list[str]:
        return [_link_value(s) for s in self.settings.ice_servers]

    async def options(self, request: web.Request) -> web.Response:
        token, what, _ = self._token(request)
        headers = {"Accept-Post": SDP, "Allow": "OPTIONS, POST"}
        response = web.Response(status=204, headers=headers)
        # TURN credentials are secrets: hand them only to callers who may use the endpoint.
        authorized = token is None or request.headers.get("Authorization") is not None
        if authorized:
            require_bearer(request, token, what)
            for link in self._links():
                response.headers.add("Link", link)
        return response

    async def create(self, request: web.Request) -> web.Response:
        token, what, publishing = self._token(request)
        require_bearer(request, token, what)
        require_content_type(request, SDP)
        body = await read_body(request, self.settings.max_body_bytes)
        try:
            offer = body.decode("utf-8")
        except UnicodeDecodeError:
            from sfu_sidecar.exceptions import BadInput

            raise BadInput("offer is not UTF-8 text") from None
        # Validate before touching any stream, so a bad offer takes no publisher slot.
        validate_offer(offer)
        sdpmod.check_offer(sdpmod.parse(offer, what="offer"), publishing=publishing)
        name = request.match_info["stream"]
        session: Session
        if publishing:
            session = await self.service.publish(name, offer)
        else:
            session = await self.service.view(name, offer)
        kind = "whip" if publishing else "whep"
        location = f"/{kind}/{quote(name)}/{session.id}"
        answer = session.answer_sdp
        response = web.Response(
            status=201,
            body=answer.encode(),
            headers={
                "Content-Type": SDP,
                "Location": location,
                "ETag": f'"{session.ice_ufrag or session.id}"',
            },
        )
        for link in self._links():
            response.headers.add("Link", link)
        return response

    def _session(self, request: web.Request) -> Session:
        stream_name = request.match_info["stream"]
        session_id = request.match_info["session"]
        session = self.service.find_session(stream_name, session_id)
        if session is None or request.path.startswith("/whip/") != isinstance(
            session, PublisherSession
        ):
            raise NotFound(f"no session {session_id} on stream {stream_name}")
        return session

    async def patch(self, request: web.Request) -> web.Response:
        token, what, _ = self._token(request)
        require_bearer(request, token, what)
        session = self._session(request)
        require_content_type(request, TRICKLE)
        body = await read_body(request, self.settings.max_body_bytes)
        trickle = sdpmod.parse_trickle(body.decode("utf-8", errors="replace"))
        await session.add_candidates(trickle)
        return web.Response(status=204)

    async def delete(self, request: web.Request) -> web.Response:
        token, what, _ = self._token(request)
        require_bearer(request, token, what)
        session = self._session(request)
        await session.close()
        return web.Response(status=200)

    async def unknown(self, request: web.Request) -> web.Response:
        raise NotFound(f"no resource {request.method} {request.path}")

    async def list_streams(self, request: web.Request) -> web.Response:
        return json_ok({"streams": [s.status() for s in self.service.streams.by_name.values()]})

    async def get_stream(self, request: web.Request) -> web.Response:
        stream = self.service.streams.get(request.match_info["stream"])
        return json_ok(stream.status())
