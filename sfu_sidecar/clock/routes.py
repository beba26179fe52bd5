"""The house clock's HTTP routes: its status, and the clock join over a WebSocket
(proto/clock.md), answered with the receive time read as soon as each frame is read."""

from __future__ import annotations

from aiohttp import WSMsgType, web

from sfu_sidecar.clock import exchange
from sfu_sidecar.clock.service import WS_MAX_MSG, ClockService
from sfu_sidecar.httpapi import json_ok
from sfu_sidecar.limits import Verdict


def add_routes(app: web.Application, service: ClockService) -> None:
    api = ClockApi(service)
    app.router.add_get("/api/clock", api.get_status)
    app.router.add_get("/api/clock/ws", api.websocket)


class ClockApi:
    """The handlers, over the component's state."""

    def __init__(self, service: ClockService) -> None:
        self.service = service

    async def get_status(self, request: web.Request) -> web.Response:
        return json_ok(self.service.status())

    async def websocket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(
            max_msg_size=min(WS_MAX_MSG, self.service.settings.ws_max_message_bytes), heartbeat=30.0
        )
        await ws.prepare(request)
        self.service.joins.add(ws)
        peer = f"{request.remote}:{id(ws):x}"
        admit = self.service.ws_limiter.gate(peer)
        try:
            async for msg in ws:
                t2 = self.service.now_ns()  # as early as possible after the frame was read
                admission = admit()
                if admission.verdict is Verdict.CLOSE:
                    # 1008: policy violation (RFC 6455 7.4.1); the reason names the setting.
                    await ws.close(code=1008, message=b"over ws_messages_per_s")
                    break
                if not admission.accepted:
                    continue  # dropped unanswered: the joining client times that exchange out
                try:
                    if msg.type == WSMsgType.TEXT:
                        decoded = exchange.decode_json(msg.data)
                    elif msg.type == WSMsgType.BINARY:
                        decoded = exchange.decode_msgpack(msg.data)
                    else:
                        break
                    reply = self.service.handle_join(decoded, t2)
                except exchange.ExchangeError as exc:
                    self.service.bad_packets.labels("clock_join").inc()
                    # 1007: payload data inconsistent with the message type (RFC 6455 §7.4.1).
                    await ws.close(code=1007, message=exc.reason[:120].encode())
                    break
                if isinstance(decoded, exchange.ClockReport):
                    self.service.reports[peer] = {k: v for k, v in decoded.to_map().items()
                                          if k != "type"}
                if reply is not None:
                    if msg.type == WSMsgType.TEXT:
                        await ws.send_str(exchange.encode_json(reply))
                    else:
                        await ws.send_bytes(exchange.encode_msgpack(reply))
        finally:
            self.service.joins.discard(ws)
            self.service.reports.pop(peer, None)
        return ws
