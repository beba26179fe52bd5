"""The probe's HTTP routes: a stream's timing figures, alerts, GPU telemetry and renderers'
reports, the dashboard page and its WebSocket."""

from __future__ import annotations

from aiohttp import web

from sfu_sidecar.exceptions import BadInput, NotFound
from sfu_sidecar.httpapi import json_ok, read_json, require_publish
from sfu_sidecar.probe.service import ProbeService
from sfu_sidecar.streamname import ROUTE_VARIABLE as STREAM_PATTERN
from sfu_sidecar.webfiles import WEB_DIR


def add_routes(app: web.Application, service: ProbeService) -> None:
    api = ProbeApi(service)
    r = app.router
    r.add_get(f"/api/streams/{STREAM_PATTERN}/sync", api.stream_route)
    r.add_get("/api/alerts", api.alerts_route)
    r.add_get("/api/gpu", api.gpu_route)
    r.add_post("/api/gpu/report", api.gpu_report_route)
    r.add_get("/api/dashboard/ws", service.hub.handle)
    r.add_get("/dashboard", api.dashboard_page)


class ProbeApi:
    """The handlers, over the component's state."""

    def __init__(self, service: ProbeService) -> None:
        self.service = service

    async def stream_route(self, request: web.Request) -> web.Response:
        name = request.match_info["stream"]
        if name not in self.service.streams and self.service.relay.stream(name) is None:
            raise NotFound(f"no stream {name}")
        return json_ok(self.service.stream_status(name, self.service.now_ns()))

    async def alerts_route(self, request: web.Request) -> web.Response:
        return json_ok({
            "active": self.service.alerts.active(),
            "recent": [e.as_dict() for e in self.service.alerts.recent],
            "rules": self.service.alerts.catalogue(),
        })

    async def gpu_route(self, request: web.Request) -> web.Response:
        return json_ok({"nvml": self.service.gpu_sample.as_dict(),
                        "renderers": [s.as_dict() for s in self.service.renderers]})

    async def gpu_report_route(self, request: web.Request) -> web.Response:
        require_publish(request, self.service.settings, "GPU reports")
        try:
            obj = await read_json(request, self.service.settings.max_body_bytes)
        except BadInput:
            self.service.bad_input("gpu_report")  # counted as every refused report is
            raise
        return json_ok(self.service.gpu_report(obj))

    async def dashboard_page(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(WEB_DIR / "dashboard.html")
