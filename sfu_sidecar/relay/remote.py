"""The HTTP half of a WHIP or WHEP session this relay opens on another server (pull, push).

An offer is POSTed and the answer comes with the session's resource (``Location``); the
resource is DELETEd when the session ends. A caller cancelled while its POST is in flight (a
push removed, a shutdown) must not leave a session behind on the remote: the exchange runs to
its end regardless, and a session the remote made for it is deleted at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from urllib.parse import urljoin

import aiohttp

from sfu_sidecar import logs
from sfu_sidecar.tasks import Tasks

log = logs.get("relay.remote")

HTTP_TIMEOUT_S = 10.0
DELETE_TIMEOUT_S = 2.0

_abandoned = Tasks("remote", log)  # DELETEs of sessions whose offer was cancelled


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: str
    location: str | None  # absolute URL of the session resource, when the remote gave one
    retry_after: str | None


def _auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


async def _exchange(url: str, offer: str, headers: dict[str, str]) -> Answer:
    timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as http, \
            http.post(url, data=offer, headers=headers) as resp:
        body = await resp.text()
        location = resp.headers.get("Location")
        return Answer(resp.status, body, urljoin(url, location) if location else None,
                      resp.headers.get("Retry-After"))


async def post_offer(url: str, offer: str, token: str | None,
                     extra_headers: dict[str, str] | None = None) -> Answer:
    """POST ``offer`` (application/sdp); raises what aiohttp raises for an unreachable URL."""
    headers = {"Content-Type": "application/sdp", **_auth(token), **(extra_headers or {})}
    exchange = asyncio.ensure_future(_exchange(url, offer, headers))
    try:
        return await asyncio.shield(exchange)
    except asyncio.CancelledError:
        exchange.add_done_callback(lambda done: _drop_abandoned(done, token))
        raise


def _drop_abandoned(done: asyncio.Future[Answer], token: str | None) -> None:
    if done.cancelled() or done.exception() is not None:
        return
    answer = done.result()
    if answer.status == 201 and answer.location is not None:
        with contextlib.suppress(RuntimeError):  # no loop any more: nothing to clean up with
            _abandoned.start("delete", delete_resource(answer.location, token))


async def delete_resource(location: str, token: str | None) -> None:
    """End a session on the remote; a remote that is gone has nothing left to end."""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=DELETE_TIMEOUT_S)
        ) as http, http.delete(location, headers=_auth(token)):
            pass
