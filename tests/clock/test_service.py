"""ClockService in an in-process app: /api/clock, the clock-join WebSocket, gauges.

Each test runs its own event loop in a worker thread: the session's Playwright browser (sync
API) marks a loop as running in the main thread, and these tests may run after it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import msgpack
import pytest
from aiohttp.test_utils import TestClient, TestServer

from sfu_sidecar.app import Components, build_app
from sfu_sidecar.clock import local
from sfu_sidecar.clock.service import ClockService, status_line
from sfu_sidecar.config import load_settings
from sfu_sidecar.metrics import Metrics

Body = Callable[[Any, ClockService, Metrics], Awaitable[None]]


def run(body: Body, **flags: str) -> None:
    async def main() -> None:
        settings = load_settings(flags)
        metrics = Metrics()
        clock = ClockService(settings, metrics)
        app = build_app(settings, Components(metrics, clock=clock))
        async with TestClient(TestServer(app)) as client:
            await body(client, clock, metrics)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, main()).result(timeout=30)


@pytest.mark.integration
def test_status_without_sources() -> None:
    async def body(c: Any, clock: ClockService, metrics: Metrics) -> None:
        before = local.realtime_ns()
        resp = await c.get("/api/clock")
        assert resp.status == 200
        st = await resp.json()
        after = local.realtime_ns()
        assert (st["source"], st["state"]) == ("system", "freerun")
        assert before <= st["now_ns"] <= after
        assert st["offset_ns"] == 0 and st["error_ns"] is None
        assert st["ptp"] is None and st["ntp"] is None and st["sdp"] == []
        assert clock.sdp_attributes() == []
        assert "offset=+0ns" in status_line(st) and "system/freerun" in status_line(st)
        text = metrics.render().decode()
        assert 'sfu_sidecar_clock_state{state="freerun"} 1.0' in text
        assert 'sfu_sidecar_clock_source{source="system"} 1.0' in text

    run(body)


@pytest.mark.integration
def test_now_is_monotonic() -> None:
    async def body(c: Any, clock: ClockService, metrics: Metrics) -> None:
        values = [clock.now_ns() for _ in range(1000)]
        assert values == sorted(values)

    run(body)


@pytest.mark.integration
def test_websocket_json_and_msgpack() -> None:
    async def body(c: Any, clock: ClockService, metrics: Metrics) -> None:
        async with c.ws_connect("/api/clock/ws") as ws:
            t1 = local.realtime_ns()
            await ws.send_str(json.dumps({"type": "clock_req", "t1": t1}))
            resp = json.loads(await ws.receive_str())
            t4 = local.realtime_ns()
            assert resp["type"] == "clock_resp" and resp["t1"] == t1
            assert t1 <= resp["t2"] <= resp["t3"] <= t4  # house = host here (no source)
            await ws.send_bytes(msgpack.packb({"type": "clock_req", "t1": 42}))
            got = msgpack.unpackb(await ws.receive_bytes())
            assert got["type"] == "clock_resp" and got["t1"] == 42
            await ws.send_str(json.dumps({"type": "clock_report", "offset_ns": 5,
                                          "error_ns": 9, "rtt_ns": 18}))
            await ws.send_str(json.dumps({"type": "clock_req", "t1": 1}))
            assert json.loads(await ws.receive_str())["t1"] == 1
            assert list(clock.reports.values()) == [{"offset_ns": 5, "error_ns": 9,
                                                     "rtt_ns": 18}]

    run(body)


@pytest.mark.integration
def test_websocket_over_its_rate_is_dropped_then_closed_1008() -> None:
    async def body(c: Any, clock: ClockService, metrics: Metrics) -> None:
        async with c.ws_connect("/api/clock/ws") as ws:
            await ws.send_str(json.dumps({"type": "clock_req", "t1": 1}))
            assert json.loads(await ws.receive_str())["t1"] == 1
            for t1 in range(2, 8):  # one message a hundred seconds: all of these are over
                await ws.send_str(json.dumps({"type": "clock_req", "t1": t1}))
            # The five dropped are not answered; the sixth in a row ends the connection.
            msg = await ws.receive()
            assert msg.type == aiohttp.WSMsgType.CLOSE
            assert ws.close_code == 1008
        assert 'sfu_sidecar_messages_dropped_total{channel="clock_ws"} 6.0' in (
            metrics.render().decode())

    run(body, ws_messages_per_s="0.01")


@pytest.mark.parametrize("bad", ['{"type":"clock_req"}', "nope",
                                 '{"type":"clock_resp","t1":1,"t2":2,"t3":3}'])
@pytest.mark.integration
def test_websocket_bad_message_closes_1007(bad: str) -> None:
    async def body(c: Any, clock: ClockService, metrics: Metrics) -> None:
        async with c.ws_connect("/api/clock/ws") as ws:
            await ws.send_str(bad)
            msg = await ws.receive()
            assert msg.type == aiohttp.WSMsgType.CLOSE
            assert ws.close_code == 1007
        assert 'sfu_sidecar_clock_bad_packets_total{protocol="clock_join"} 1.0' in (
            metrics.render().decode())

    run(body)
