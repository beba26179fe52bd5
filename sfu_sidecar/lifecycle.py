"""Components: the units the application starts in order and stops in reverse."""

from __future__ import annotations

from typing import Protocol

from aiohttp import web


class Component(Protocol):
    """Something with routes and a lifetime: clock, relay, caption store, sync channel...

    ``start`` runs before the server accepts requests; ``stop`` runs after it stopped
    accepting them, in reverse start order, and must finish promptly (the whole shutdown
    has a 5 s budget).
    """

    name: str

    def add_routes(self, app: web.Application) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...
