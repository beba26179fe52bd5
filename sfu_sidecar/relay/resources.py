"""The relay's resources made over the API (RTP taps, RTP feeds, pushes): one set of routes for
each kind, the same for all. ``POST /api/<kind>`` makes one (``201`` with its ``Location``),
``GET /api/<kind>`` lists them, ``GET`` and ``DELETE /api/<kind>/<id>`` read and end one;
anything else under a resource is a ``404`` with a JSON body.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from sfu_sidecar.config import Settings
from sfu_sidecar.exceptions import NotFound
from sfu_sidecar.httpapi import json_ok, require_publish

ID_PATTERN = "[0-9a-f]{32}"


class Resource(Protocol):
    @property
    def id(self) -> str: ...

    def status(self) -> dict[str, Any]: ...


class EndedSession(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def ended_reason(self) -> str | None: ...

    async def close(self) -> None: ...


async def end_session(session: EndedSession) -> dict[str, Any]:
    """End a tap or feed (their sessions): what it was and why it ended."""
    await session.close()
    return {"id": session.id, "state": session.state, "ended": session.ended_reason}


@dataclass(frozen=True)
class Resources:
    """One kind of resource: where it lives, what the publish token allows on it, and how one
    is made, found, listed and ended."""

    plural: str  # the path (/api/<plural>) and the key of the list
    singular: str  # the route variable, and the name in a 404 ("no tap <id>")
    what: str  # what the publish token is asked for here ("tapping")
    create: Callable[[web.Request], Awaitable[tuple[str, dict[str, Any]]]]  # -> (id, body)
    find: Callable[[str], Any]  # a Resource, or None
    items: Callable[[], Iterable[Resource]]
    end: Callable[[Any], Awaitable[dict[str, Any]]]
    private: bool = False  # reading and listing need the publish token too

    def add(self, r: web.UrlDispatcher, settings: Settings,
            unknown: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> None:
        base = f"/api/{self.plural}"
        one = f"{base}/{{{self.singular}:{ID_PATTERN}}}"

        def allowed(request: web.Request, reading: bool) -> None:
            if self.private or not reading:
                require_publish(request, settings, self.what)

        def found(request: web.Request) -> Any:
            key = request.match_info[self.singular]
            resource = self.find(key)
            if resource is None:
                raise NotFound(f"no {self.singular} {key}")
            return resource

        async def create(request: web.Request) -> web.Response:
            allowed(request, reading=False)
            ident, body = await self.create(request)
            location = f"{base}/{ident}"
            return json_ok({**body, "location": location}, status=201,
                           headers={"Location": location})

        async def listing(request: web.Request) -> web.Response:
            allowed(request, reading=True)
            return json_ok({self.plural: [x.status() for x in self.items()]})

        async def get(request: web.Request) -> web.Response:
            allowed(request, reading=True)
            return json_ok(found(request).status())

        async def delete(request: web.Request) -> web.Response:
            allowed(request, reading=False)
            return json_ok(await self.end(found(request)))

        r.add_post(base, create)
        r.add_get(base, listing)
        r.add_get(one, get)
        r.add_delete(one, delete)
        r.add_route("*", f"{base}/{{{self.singular}}}", unknown)
