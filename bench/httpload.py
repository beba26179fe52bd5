"""A closed-loop HTTP load for a server's static-like answers: keep-alive connections, each
GETting the next path as soon as the last answer is read, counting bodies without keeping them;
throughput, latency percentiles and the server's CPU per request."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from dataclasses import dataclass
from typing import cast

from bench.processes import Server, cpu_seconds


@dataclass
class ServeRun:
    rate: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_request: float
    server_cpu_pct: float
    errors: int


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection that reads a response's length and counts its body
    without keeping it. aiohttp's client tops out near 4000 GETs/s of 200 kB on one core of
    this machine, below what the servers serve; this one, on uvloop, about three times that,
    so the servers are what is measured."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.head = bytearray()
        self.left = -1  # body bytes still to come; -1 while reading the head
        self.status = 0
        self.length = 0
        self.done: asyncio.Future[tuple[int, int]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport; they write all the same.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.left < 0:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = bytes(self.head[:end]).decode("latin-1").split("\r\n")
            self.status = int(lines[0].split()[1])
            fields = dict(line.lower().split(":", 1) for line in lines[1:])
            # Both servers answer with a length, never chunked; a response without one fails.
            self.length = int(fields["content-length"])
            self.left = self.length - (len(self.head) - end - 4)
            self.head.clear()
        else:
            self.left -= len(data)
        if self.left == 0 and self.done is not None:
            self.left = -1
            self.done.set_result((self.status, self.length))
            self.done = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None:
            self.done.set_exception(ConnectionError("the server closed the connection"))

    async def get(self, request: bytes) -> tuple[int, int]:
        assert self.transport is not None
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return await self.done


async def closed_loop(
    server: Server, paths: list[str], sizes: dict[str, int], conns: int, seconds: float,
    token: str,
) -> ServeRun:
    """``conns`` connections, each GETting the next path as soon as its last answer is read
    (with ``token`` as a Bearer token)."""
    from urllib.parse import urlsplit

    url = urlsplit(server.base)
    loop = asyncio.get_running_loop()
    requests = [
        (f"GET {path} HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {token}\r\n"
         "\r\n".encode(), sizes[path])
        for path in paths
    ]
    queue = itertools.cycle(requests)
    latencies: list[float] = []
    errors = 0
    # Connections opened before the clock starts: steady state, not TCP handshakes.
    connections = [
        (await loop.create_connection(Connection, url.hostname or "", url.port or 80))[1]
        for _ in range(conns)
    ]

    async def get(connection: Connection, request: bytes, size: int) -> None:
        nonlocal errors
        t0 = time.perf_counter()
        status, length = await connection.get(request)
        if status != 200 or length != size:
            errors += 1
        else:
            latencies.append((time.perf_counter() - t0) * 1000)

    async def run(connection: Connection) -> None:
        while time.perf_counter() < stop:
            await get(connection, *next(queue))

    await asyncio.gather(*(get(c, *requests[0]) for c in connections))
    latencies.clear()
    cpu0 = cpu_seconds(server.proc.pid)
    started = time.perf_counter()
    stop = started + seconds
    await asyncio.gather(*(run(c) for c in connections))
    elapsed = time.perf_counter() - started
    cpu = cpu_seconds(server.proc.pid) - cpu0
    for c in connections:
        assert c.transport is not None
        c.transport.close()
    q = statistics.quantiles(latencies, n=100)
    return ServeRun(len(latencies) / elapsed, q[49], q[98],
                    cpu / max(1, len(latencies) + errors) * 1e6, 100 * cpu / elapsed, errors)
