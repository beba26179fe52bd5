"""Limits on what one client may ask of the service: rates, message gates, session counts.

The cores here (:class:`TokenBucket`, :class:`MessageGate`, :func:`client_key`) take time as an
argument and never read a clock. :class:`MessageLimiter` is their adapter for sockets: it reads
the monotonic clock, counts what it drops in ``/metrics`` and logs each peer's drops at most
once a minute, so a flood cannot flood the log too.

Limits are about the work this host does, so they run on the host's monotonic clock, never on
house time (which may slew or step while a source is acquired).
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Counter

# A peer "persists" when it has had more messages dropped, without a one-second pause, than
# its rate allows in this many seconds: a burst over the rate is forgiven, a flood is not.
PERSIST_S = 5.0
QUIET_S = 1.0
# One log line per peer per minute at most, however hard it floods.
LOG_EVERY_S = 60.0
# Buckets of streams that went quiet are dropped past this many, so names cannot pile up.
MAX_BUCKETS = 4096


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` held; starts full."""

    __slots__ = ("burst", "rate", "tokens", "updated")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.updated = now

    def _refill(self, now: float) -> None:
        if now > self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
            self.updated = now

    def take(self, now: float, n: float = 1.0) -> bool:
        """Take ``n`` tokens if all are there; otherwise take none."""
        self._refill(now)
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False

    def wait_s(self, now: float, n: float = 1.0) -> float:
        """Seconds until ``n`` tokens are there (inf when ``n`` exceeds the burst)."""
        self._refill(now)
        if n > self.burst:
            return math.inf
        return max(0.0, (n - self.tokens) / self.rate)

    def full(self, now: float) -> bool:
        self._refill(now)
        return self.tokens >= self.burst


def retry_after(seconds: float) -> str:
    """A ``Retry-After`` value: whole seconds, at least one (RFC 9110 10.2.3)."""
    if not math.isfinite(seconds):
        return "3600"
    return str(max(1, math.ceil(seconds)))


class RateLimits:
    """One token bucket per key (a stream), created full on first use."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self._buckets: dict[str, TokenBucket] = {}

    def take(self, key: str, n: float, now: float) -> float:
        """Take ``n`` tokens for ``key``: 0.0 when taken, else the seconds to wait."""
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= MAX_BUCKETS:
                self._buckets = {k: b for k, b in self._buckets.items() if not b.full(now)}
            bucket = self._buckets[key] = TokenBucket(self.rate, self.burst, now)
        if bucket.take(now, n):
            return 0.0
        return max(bucket.wait_s(now, n), 1e-3)


class Verdict(enum.Enum):
    ACCEPT = "accept"
    DROP = "drop"
    CLOSE = "close"  # dropped, and the peer has persisted: end its connection


@dataclass
class Admission:
    verdict: Verdict
    # Drops since the last logged line, when this one should be logged; else 0.
    log_drops: int = 0

    @property
    def accepted(self) -> bool:
        return self.verdict is Verdict.ACCEPT


class MessageGate:
    """Messages from one peer: ``rate`` a second on average, bursts up to twice that.

    Over the rate a message is dropped. A peer whose drops run on without a pause of
    :data:`QUIET_S` until they exceed what :data:`PERSIST_S` seconds of its rate allow gets
    :attr:`Verdict.CLOSE` (at least 5 drops, so a very low rate still tolerates a slip).
    """

    def __init__(self, rate: float, now: float) -> None:
        self.bucket = TokenBucket(rate, max(2.0 * rate, 1.0), now)
        self.dropped = 0
        self._streak = 0
        self._last_drop: float | None = None
        self._last_log: float | None = None
        self._unlogged = 0
        self._persist = max(PERSIST_S * rate, 5.0)

    def admit(self, now: float) -> Admission:
        if self.bucket.take(now):
            return Admission(Verdict.ACCEPT)
        self.dropped += 1
        self._unlogged += 1
        if self._last_drop is None or now - self._last_drop >= QUIET_S:
            self._streak = 0
        self._streak += 1
        self._last_drop = now
        log_drops = 0
        if self._last_log is None or now - self._last_log >= LOG_EVERY_S:
            self._last_log = now
            log_drops, self._unlogged = self._unlogged, 0
        verdict = Verdict.CLOSE if self._streak > self._persist else Verdict.DROP
        return Admission(verdict, log_drops)


class MessageLimiter:
    """Gates for the peers of one kind of socket (``channel``), with their shared accounting."""

    def __init__(
        self,
        channel: str,
        rate: float,
        dropped: Counter,
        log: logging.Logger,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.channel = channel
        self.rate = rate
        self._dropped = dropped.labels(channel)
        self._log = log
        self._clock = clock

    def gate(self, peer: str) -> Callable[[], Admission]:
        """The admission check for one peer's messages, called once per message."""
        gate = MessageGate(self.rate, self._clock())

        def admit() -> Admission:
            admission = gate.admit(self._clock())
            if not admission.accepted:
                self._dropped.inc()
                if admission.log_drops:
                    self._log.warning(
                        "%s: %s over %g messages/s, %d dropped (logged once a minute)",
                        self.channel, peer, self.rate, admission.log_drops,
                    )
            return admission

        return admit


def client_key(remote: str | None) -> str:
    """The address a per-client limit counts by: IPv6 by its /64, which one subscriber
    usually holds whole (RFC 6177), so rotating addresses inside it gains nothing."""
    if not remote:
        return "unknown"
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:
        return remote
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def is_loopback(remote: str | None) -> bool:
    """Whether ``remote`` (an address or a host name to bind) is this host's loopback."""
    if not remote:
        return False
    if remote.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


class ClientSessions:
    """Live sessions by client (a :func:`client_key`), counted while they negotiate too.

    A session is held from :meth:`reserve` until :meth:`bind` hands over a check of whether
    it is still alive (or :meth:`release` gives the slot back); sessions that ended are
    forgotten the next time anyone counts, so nothing has to report a session's end.
    """

    def __init__(self) -> None:
        self._pending: dict[str, int] = {}
        self._live: dict[str, tuple[str, Callable[[], bool]]] = {}

    def count(self, client: str) -> int:
        self._prune()
        return self._pending.get(client, 0) + sum(
            1 for owner, _ in self._live.values() if owner == client
        )

    def reserve(self, client: str) -> None:
        self._pending[client] = self._pending.get(client, 0) + 1

    def release(self, client: str) -> None:
        left = self._pending.get(client, 0) - 1
        if left > 0:
            self._pending[client] = left
        else:
            self._pending.pop(client, None)

    def bind(self, client: str, session_id: str, alive: Callable[[], bool]) -> None:
        self.release(client)
        self._live[session_id] = (client, alive)

    def _prune(self) -> None:
        dead = [sid for sid, (_, alive) in self._live.items() if not alive()]
        for sid in dead:
            del self._live[sid]


class CpuLoad:
    """The share of one core this process used lately, from samples of its CPU time.

    The relay forwards every packet on one event loop, so one core is its capacity: past it,
    packets queue and every viewer's frames arrive late. The share is smoothed with a time
    constant of ``window_s`` so a keyframe burst does not count as load, a sustained climb does.
    Samples (process CPU seconds, monotonic seconds) are passed in; nothing here reads a clock.
    """

    def __init__(self, window_s: float = 2.0) -> None:
        self.window_s = window_s
        self.share: float | None = None  # None until two samples have been seen
        self._last: tuple[float, float] | None = None

    def observe(self, cpu_s: float, now_s: float) -> float | None:
        last, self._last = self._last, (cpu_s, now_s)
        if last is None or now_s <= last[1]:
            return self.share
        elapsed = now_s - last[1]
        share = max(0.0, cpu_s - last[0]) / elapsed
        if self.share is None:
            self.share = share
        else:
            self.share += (1.0 - math.exp(-elapsed / self.window_s)) * (share - self.share)
        return self.share


class CpuMonitor:
    """:class:`CpuLoad` fed from this process's CPU clock every ``interval_s`` seconds."""

    def __init__(self, interval_s: float = 0.25, window_s: float = 2.0) -> None:
        self.interval_s = interval_s
        self.load = CpuLoad(window_s)

    def sample(self) -> float | None:
        return self.load.observe(time.process_time(), time.monotonic())

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval_s)

    def percent(self) -> float | None:
        share = self.load.share
        return None if share is None else 100.0 * share
