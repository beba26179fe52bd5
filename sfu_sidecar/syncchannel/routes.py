"""The sync channel's HTTP route: ``GET /api/sync``, every viewer's channel and every
publisher's capture-time sources."""

from __future__ import annotations

from aiohttp import web

from sfu_sidecar.httpapi import json_ok
from sfu_sidecar.syncchannel.service import SyncService


def add_routes(app: web.Application, service: SyncService) -> None:
    async def status(request: web.Request) -> web.Response:
        now = service.now_ns()
        return json_ok({
            "viewers": [v.status(now) for v in service.viewers.values()],
            "publishers": [p.status(s) for s, p in service.publishers.items()],
        })

    app.router.add_get("/api/sync", status)
