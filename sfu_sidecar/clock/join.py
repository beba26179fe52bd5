"""Join a service's house clock over ``/api/clock/ws`` (proto/clock.md): from a publisher, or
from an edge joining its origin's clock.

::

    clock = await join_clock("ws://host:8080")
    cue_start_ns = clock.now_ns()          # house time, to stamp captions with

The estimate comes from the least-RTT exchange of the window and is good to ``error_ns``; call
:func:`join_clock` again from time to time (the local oscillator drifts, ~1 us/s at 1 ppm).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass

import msgpack
import websockets

from sfu_sidecar.clock import exchange, local


@dataclass(frozen=True)
class HouseClock:
    """House time as seen from this host: local CLOCK_REALTIME + ``offset_ns``."""

    offset_ns: int
    error_ns: int
    rtt_ns: int
    samples: int

    def now_ns(self) -> int:
        return local.realtime_ns() + self.offset_ns


def clock_ws_url(base: str) -> str:
    """``http(s)://host:port`` or ``ws(s)://host:port`` -> the clock WebSocket URL."""
    base = base.rstrip("/")
    if base.startswith("http"):
        base = "ws" + base[4:]
    return base if base.endswith("/api/clock/ws") else base + "/api/clock/ws"


async def join_clock(base_url: str, *, samples: int = 16, interval_s: float = 0.02,
                     encoding: str = "msgpack", timeout_s: float = 5.0,
                     clock_ns: Callable[[], int] = local.realtime_ns) -> HouseClock:
    """Run ``samples`` exchanges, send the report, return the estimate.

    ``clock_ns`` is the clock joined to the server's (this host's CLOCK_REALTIME by default;
    a relay pulling a stream passes its own house clock): the offset is server - it.

    Raises :class:`exchange.ExchangeError` when the server's answers are unusable and
    ``TimeoutError`` when it does not answer within ``timeout_s`` per exchange.
    """
    if encoding not in ("msgpack", "json"):
        raise ValueError("encoding is 'msgpack' or 'json'")
    join = exchange.ClockJoin(samples)
    async with websockets.connect(clock_ws_url(base_url), max_size=4096) as ws:
        for _ in range(samples):
            req = join.request(clock_ns())
            if encoding == "msgpack":
                await ws.send(exchange.encode_msgpack(req))
            else:
                await ws.send(exchange.encode_json(req))
            raw = await asyncio.wait_for(ws.recv(), timeout_s)
            t4 = clock_ns()
            resp = (exchange.decode_msgpack(raw) if isinstance(raw, bytes)
                    else exchange.decode_json(raw))
            if not isinstance(resp, exchange.ClockResp) or resp.t1 != req.t1:
                raise exchange.ExchangeError("clock_resp does not answer our clock_req")
            join.response(resp, t4)
            if interval_s > 0:
                await asyncio.sleep(interval_s)
        report = join.report()
        if report is None:
            raise exchange.ExchangeError("no usable exchange (every answer was impossible)")
        if encoding == "msgpack":
            await ws.send(msgpack.packb(report.to_map(), use_bin_type=True))
        else:
            await ws.send(json.dumps(report.to_map()))
    return HouseClock(report.offset_ns, report.error_ns, report.rtt_ns, len(join.samples))
