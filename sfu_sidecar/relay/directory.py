"""Stream directories: where the cascade finds the node a stream is published on.

Two kinds answer :class:`Directory`: the Redis one shared by the nodes of a deployment
(``relay/redis_directory.py``, settings ``redis_url`` and ``advertise_url``), and the HTTP one a
``serve --workers`` supervisor keeps for its workers (:class:`HttpDirectory`, setting
``directory_url``). A worker of a machine that is one node of a deployment asks both, in that
order (:class:`MachineThenShared`).
"""

from __future__ import annotations

from typing import Protocol
from urllib.parse import quote

import aiohttp

from sfu_sidecar import logs

log = logs.get("relay.directory")

TIMEOUT_S = 1.0


class Directory(Protocol):
    """Where streams are published: what the cascade asks before it pulls."""

    async def lookup(self, stream: str) -> tuple[str, str] | None:
        """(node id, base URL) of ``stream``'s origin, or None when unknown."""
        ...


class HttpDirectory:
    """The directory a ``serve --workers`` supervisor keeps for its workers: ``GET
    <url>/streams/<stream>`` names the worker the stream belongs to."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    async def lookup(self, stream: str) -> tuple[str, str] | None:
        try:
            async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)
            ) as http, http.get(f"{self.url}/streams/{quote(stream, safe='')}") as resp:
                if resp.status != 200:
                    return None
                entry = await resp.json()
                return str(entry["node"]), str(entry["url"])
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError,
                TypeError) as exc:
            log.warning("directory %s: lookup of %s failed: %s", self.url, stream, exc)
            return None


class MachineThenShared:
    """A worker's directory when its machine is one node of a deployment: the supervisor names
    the stream's home worker on this machine; the home worker itself (no publisher here, or it
    would not ask) looks in the shared directory for the machine that has one."""

    def __init__(self, machine: Directory, shared: Directory, node_id: str) -> None:
        self.machine = machine
        self.shared = shared
        self.node_id = node_id

    async def lookup(self, stream: str) -> tuple[str, str] | None:
        entry = await self.machine.lookup(stream)
        if entry is not None and entry[0] != self.node_id:
            return entry
        return await self.shared.lookup(stream)
