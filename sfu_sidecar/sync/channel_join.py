"""The clock join over a ``sync`` DataChannel, from the side that joins (proto/clock.md).

A publisher joins the relay's house clock this way, and a relay pushing a stream joins the
remote's. Kept apart from the clients and the relay so both can use it: it needs only the
channel, a clock and the wire format.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiortc.rtcdatachannel import RTCDataChannel

from sfu_sidecar.clock import exchange
from sfu_sidecar.sync.wire import (
    ClockReport,
    ClockResp,
    ControlMessage,
    SyncWireError,
    parse_message,
)

JOIN_ROUNDS = 8
JOIN_SPACING_S = 0.02
REPLY_TIMEOUT_S = 0.5
OPEN_TIMEOUT_S = 10.0


async def join_over_channel(
    channel: RTCDataChannel, clock_ns: Callable[[], int]
) -> ClockReport | None:
    """Join the far side's house clock over a ``sync`` DataChannel with ``clock_ns`` as this
    side's clock: the four-timestamp exchange (proto/clock.md), then the ClockReport sent to
    it. The report, or None when no reply came (the peer is no sidecar); TimeoutError when
    the channel does not open within OPEN_TIMEOUT_S."""
    join = exchange.ClockJoin()
    replies: asyncio.Queue[tuple[ClockResp, int]] = asyncio.Queue()

    def on_message(data: bytes | str) -> None:
        t4 = clock_ns()
        try:
            message = parse_message(data.encode() if isinstance(data, str) else data)
        except SyncWireError:
            return
        if isinstance(message, ControlMessage) and isinstance(message.message, ClockResp):
            replies.put_nowait((message.message, t4))

    channel.on("message", on_message)
    if channel.readyState != "open":
        opened = asyncio.Event()
        channel.on("open", opened.set)
        await asyncio.wait_for(opened.wait(), OPEN_TIMEOUT_S)
    for _ in range(JOIN_ROUNDS):
        channel.send(ControlMessage(join.request(clock_ns())).serialize())
        try:
            resp, t4 = await asyncio.wait_for(replies.get(), REPLY_TIMEOUT_S)
        except TimeoutError:
            continue
        join.response(resp, t4)
        await asyncio.sleep(JOIN_SPACING_S)
    channel.remove_listener("message", on_message)
    report = join.report()
    if report is not None:
        channel.send(ControlMessage(report).serialize())
    return report
