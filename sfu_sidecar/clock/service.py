"""The house clock as a component: PTP and NTP adapters feeding :class:`FusedClock`.

Other components take ``ClockService.now_ns`` for every timestamp they store or send, and the
relay adds ``sdp_attributes()`` (RFC 7273) to its answers. Routes: ``GET /api/clock`` (status
JSON) and ``GET /api/clock/ws`` (clock join, proto/clock.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from typing import Any

from aiohttp import web

from sfu_sidecar import logs
from sfu_sidecar.clock import exchange, local
from sfu_sidecar.clock.fused import (
    DEFAULT_TIMEOUTS_NS,
    LOCKED,
    NS_PER_S,
    NTP,
    PTP,
    SLEWING,
    Change,
    FusedClock,
)
from sfu_sidecar.clock.net import PtpSockets
from sfu_sidecar.clock.ntp import NtpError, SntpClient
from sfu_sidecar.clock.ptp import MasterSelected, Measurement, PtpSlave, SendDelayReq
from sfu_sidecar.clock.ptpmsg import PtpError, format_identity
from sfu_sidecar.config import Settings
from sfu_sidecar.limits import MessageLimiter
from sfu_sidecar.metrics import Metrics
from sfu_sidecar.settingvalues import HostPort
from sfu_sidecar.tasks import Tasks

log = logs.get("clock")

STATES = ("acquiring", "locked", "slewing", "holdover", "freerun")
SOURCES = ("ptp", "ntp", "system")
TICK_S = 0.25
# RFC 5905 §7.3 MINPOLL is 16 s; these are the operator's own servers, and a short first burst
# (like ntpd's iburst) gets a lock within seconds of start.
DEFAULT_NTP_POLL_S = 16.0
NTP_BURST = 4
NTP_BURST_GAP_S = 1.0
WS_MAX_MSG = 4096  # a join message is under 200 bytes; ws_max_message_bytes may lower it


def _clock_identity() -> bytes:
    """An EUI-64-style clockIdentity for our port (7.5.2.2.2): random, locally administered."""
    raw = bytearray(os.urandom(8))
    raw[0] = (raw[0] | 0x02) & 0xFE
    return bytes(raw)


class _NtpProtocol(asyncio.DatagramProtocol):
    def __init__(self, service: ClockService, server: HostPort) -> None:
        self.service = service
        self.server = server

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.service._on_ntp(self.server, data, local.realtime_ns())


class ClockService:
    """The fused house clock with its PTP and NTP adapters (a :class:`Component`)."""

    name = "clock"

    def __init__(self, settings: Settings, metrics: Metrics, *, holdover_s: float = 10.0,
                 ntp_poll_s: float = DEFAULT_NTP_POLL_S) -> None:
        self.settings = settings
        self.ntp_poll_s = ntp_poll_s
        sources: list[str] = []
        if settings.ptp_interface:
            sources.append(PTP)
        if settings.ntp_servers:
            sources.append(NTP)
        timeouts = dict(DEFAULT_TIMEOUTS_NS)
        timeouts[NTP] = int(max(3 * ntp_poll_s, 4.0) * NS_PER_S)
        self.fused = FusedClock(tuple(sources), settings.clock_max_slew_ppm, local.monotonic_ns(),
                                holdover_ns=int(holdover_s * NS_PER_S), timeouts_ns=timeouts)
        self.slave = PtpSlave(_clock_identity(), settings.ptp_domain) if PTP in sources else None
        self._ptp_socks: PtpSockets | None = None
        self._ntp: dict[HostPort, SntpClient] = {s: SntpClient() for s in settings.ntp_servers}
        self._ntp_transports: dict[HostPort, asyncio.DatagramTransport] = {}
        self._ntp_used: HostPort | None = None
        self._ntp_polls = 0  # polls since the last burst began
        self._ntp_wake = asyncio.Event()
        self._tasks = Tasks("clock", log)
        self.joins: set[web.WebSocketResponse] = set()
        self.reports: dict[str, dict[str, int]] = {}
        self._g_offset = metrics.gauge("clock_offset_seconds",
                                       "House time minus host CLOCK_REALTIME")
        self._g_freq = metrics.gauge("clock_freq_ppb", "House clock rate against the host clock")
        self._g_error = metrics.gauge("clock_error_seconds",
                                      "Estimated house time uncertainty")
        self._g_state = metrics.gauge("clock_state", "1 for the current clock state", ("state",))
        self._g_source = metrics.gauge("clock_source", "1 for the current source", ("source",))
        self.bad_packets = metrics.counter("clock_bad_packets", "Unreadable clock packets",
                                      ("protocol",))
        self._g_joins = metrics.gauge("clock_join_peers", "Peers connected to /api/clock/ws")
        self.ws_limiter = MessageLimiter("clock_ws", settings.ws_messages_per_s,
                                         metrics.messages_dropped, log)
        self._update_gauges()

    # -- public API ---------------------------------------------------------------------------

    def now_ns(self) -> int:
        """House time: Unix-epoch ns, never decreasing."""
        return self.fused.now(local.realtime_ns())

    def status(self) -> dict[str, Any]:
        mono = local.monotonic_ns()
        out = self.fused.status(local.realtime_ns(), mono)
        out["ptp"] = self._ptp_status()
        out["ntp"] = self._ntp_status()
        out["sdp"] = self.sdp_attributes()
        return out

    def sdp_attributes(self, mediaclk_offset: int = 0) -> list[str]:
        """RFC 7273 media-level lines while PTP-locked, else ``[]``.

        ``a=ts-refclk:ptp=IEEE1588-2008:<grandmaster identity>:<domain>`` (§4.8) names the
        clock; ``a=mediaclk:direct=<offset>`` (§5.2) says the stream's RTP clock is tied to it,
        with ``mediaclk_offset`` the RTP timestamp at the reference epoch (the relay's own).
        Lines are returned without the trailing CRLF. The domain is written bare, as in the
        RFC's own examples and in AES67 / SMPTE ST 2110-10 (its ABNF also allows a
        ``domain-nmbr=`` prefix, which receivers in that world do not expect).
        """
        parent = self.slave.parent if self.slave is not None else None
        if self.fused.state != LOCKED or self.fused.source != PTP or parent is None:
            return []
        gm = format_identity(parent.grandmaster)
        return [f"a=ts-refclk:ptp=IEEE1588-2008:{gm}:{self.settings.ptp_domain}",
                f"a=mediaclk:direct={mediaclk_offset}"]

    def handle_join(self, msg: exchange.ClockMessage, t2: int) -> exchange.ClockMessage | None:
        """One clock-join message from any transport (WebSocket, DataChannel).

        ``t2`` is house time when it arrived. Returns the reply to send, if any; for a request
        the reply's t3 is stamped here, so send it at once.
        """
        if isinstance(msg, exchange.ClockReq):
            return exchange.respond(msg, t2, self.now_ns())
        if isinstance(msg, exchange.ClockReport):
            return None
        raise exchange.ExchangeError(f"{type(msg).__name__} is not sent to the server")

    # -- component ----------------------------------------------------------------------------

    async def start(self) -> None:
        if self.slave is not None and self.settings.ptp_interface:
            self._ptp_socks = PtpSockets(self.settings.ptp_interface, self._on_ptp)
            await self._ptp_socks.start()
        loop = asyncio.get_running_loop()
        for server in self._ntp:
            try:
                transport, _ = await loop.create_datagram_endpoint(
                    lambda server=server: _NtpProtocol(self, server),  # type: ignore[misc]
                    remote_addr=(server.host, server.port), family=socket.AF_INET,
                )
            except OSError as exc:
                log.warning("NTP server %s unusable: %s", server, exc)
                continue
            self._ntp_transports[server] = transport
        if self._ntp_transports:
            self._tasks.start("ntp", self._ntp_loop())
        self._tasks.start("tick", self._tick_loop())
        log.info("house clock started: sources %s", ", ".join(self.fused.sources) or "none",
                 extra={"state": self.fused.state, "source": self.fused.source})

    async def stop(self) -> None:
        await self._tasks.stop()
        for ws in list(self.joins):
            await ws.close()
        if self._ptp_socks is not None:
            self._ptp_socks.close()
        for transport in self._ntp_transports.values():
            transport.close()
        self._ntp_transports.clear()

    # -- PTP ----------------------------------------------------------------------------------

    def _on_ptp(self, data: bytes, rx_ns: int | None, is_event: bool) -> None:
        assert self.slave is not None
        try:
            events = self.slave.receive(data, rx_ns, local.monotonic_ns())
        except PtpError as exc:
            self.bad_packets.labels("ptp").inc()
            log.debug("bad PTP datagram: %s", exc.reason)
            return
        self._ptp_events(events)

    def _ptp_events(self, events: list[Any]) -> None:
        for ev in events:
            if isinstance(ev, Measurement):
                # E2E with software stamps: the unknown asymmetry is the error floor; the
                # loop's residual RMS (added by the fused clock) covers the stamp noise.
                self._changes(self.fused.sample(PTP, ev.local_ns, local.monotonic_ns(),
                                                ev.master_minus_local_ns, 0))
            elif isinstance(ev, SendDelayReq):
                self._tasks.start("delay-req", self._send_delay_req(ev))
            elif isinstance(ev, MasterSelected):
                if ev.announce is None:
                    log.warning("PTP master lost (announce timeout)")
                    self._changes(self.fused.lost(PTP, local.monotonic_ns(),
                                                  local.realtime_ns()))
                else:
                    log.info("PTP master %s selected", ev.announce.header.source,
                             extra={"grandmaster": format_identity(ev.announce.grandmaster)})

    async def _send_delay_req(self, ev: SendDelayReq) -> None:
        if ev.delay_ns > 0:
            await asyncio.sleep(ev.delay_ns / 1e9)
        socks = self._ptp_socks
        if socks is None or self.slave is None:
            return
        try:
            tx = await socks.send_event(ev.data)
        except OSError as exc:  # the network, not a fault here: the next exchange retries
            log.warning("Delay_Req failed: %s", exc)
            return
        if tx is not None:
            self.slave.delay_req_sent(ev.sequence_id, tx)

    def _ptp_status(self) -> dict[str, Any] | None:
        if self.slave is None:
            return None
        parent = self.slave.parent
        st = self.fused.source_state(PTP)
        return {
            "interface": self.settings.ptp_interface,
            "grandmaster": format_identity(parent.grandmaster) if parent else None,
            "master_port": str(parent.header.source) if parent else None,
            "domain": self.settings.ptp_domain,
            "mean_path_delay_ns": self.slave.path_delay_ns,
            # offsetFromMaster (IEEE 1588 11.2): local clock minus master, last sample.
            "offset_from_master_ns": self.slave.last_offset_ns,
            "samples": self.slave.samples,
            "delay_samples": self.slave.delay_samples,
            "timestamping": self._ptp_socks.mode if self._ptp_socks else None,
            "tx_timestamp_misses": self._ptp_socks.tx_stamp_misses if self._ptp_socks else 0,
            "alive": bool(st and st.alive(local.monotonic_ns(), self.fused.timeouts_ns[PTP])),
        }

    # -- NTP ----------------------------------------------------------------------------------

    async def _ntp_loop(self) -> None:
        while True:  # cancelled by stop()
            for server, transport in self._ntp_transports.items():
                with contextlib.suppress(OSError):
                    transport.sendto(self._ntp[server].request(local.realtime_ns()))
            self._ntp_polls += 1
            # A burst at start and on every switch to NTP, and quick polls for as long as house
            # time slews toward NTP: each sample re-aims the slew, so it neither waits a whole
            # poll interval to start nor runs past the target between two polls.
            converging = self.fused.state == SLEWING and self.fused.source == NTP
            fast = self._ntp_polls < NTP_BURST or converging
            self._ntp_wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ntp_wake.wait(),
                                       NTP_BURST_GAP_S if fast else self.ntp_poll_s)

    def _ntp_burst(self) -> None:
        self._ntp_polls = 0
        self._ntp_wake.set()

    def _on_ntp(self, server: HostPort, data: bytes, rx_ns: int) -> None:
        client = self._ntp[server]
        try:
            client.response(data, rx_ns)
        except NtpError as exc:
            self.bad_packets.labels("ntp").inc()
            log.debug("NTP reply from %s refused: %s", server, exc.reason)
            return
        # Servers in the configured order: use the first one still answering.
        fresh_after = rx_ns - self.fused.timeouts_ns[NTP]
        preferred = next((s for s, c in self._ntp.items()
                          if c.samples and c.samples[-1].local_ns >= fresh_after), server)
        if server != preferred:
            return
        if self._ntp_used != server:
            log.info("NTP server %s in use", server)
            self._ntp_used = server
        best = client.best(rx_ns)
        if best is None:
            return
        # Every reply is a measurement now: the filtered offset (server minus local clock, which
        # an older sample still tells within its aged error bound) compared with house time at
        # this instant. Feeding only new least-delay samples left the servo without input for
        # minutes after a failover.
        self._changes(self.fused.sample(NTP, rx_ns, local.monotonic_ns(), best.offset_ns,
                                        best.error_ns(rx_ns)))

    def _ntp_status(self) -> dict[str, Any] | None:
        if not self._ntp:
            return None
        server = self._ntp_used
        best = self._ntp[server].best(local.realtime_ns()) if server else None
        return {
            "server": str(server) if server else None,
            "offset_ns": best.offset_ns if best else None,
            "delay_ns": best.delay_ns if best else None,
            "stratum": best.stratum if best else None,
            "error_ns": best.error_ns(local.realtime_ns()) if best else None,
            "samples": sum(len(c.samples) for c in self._ntp.values()),
        }

    # -- state, metrics, logs -----------------------------------------------------------------

    async def _tick_loop(self) -> None:
        while True:  # cancelled by stop()
            mono = local.monotonic_ns()
            if self.slave is not None:
                self._ptp_events(self.slave.poll(mono))
            self._changes(self.fused.update(mono, local.realtime_ns()))
            self._update_gauges()
            await asyncio.sleep(TICK_S)

    def _changes(self, changes: list[Change]) -> None:
        for c in changes:
            if c.new_source == NTP and c.old_source != NTP and self._ntp_transports:
                self._ntp_burst()
            log.info("house clock %s/%s -> %s/%s (%s)", c.old_state, c.old_source, c.new_state,
                     c.new_source, c.reason,
                     extra={"state": c.new_state, "source": c.new_source})
        if changes:
            self._update_gauges()

    def _update_gauges(self) -> None:
        now_local = local.realtime_ns()
        # Prometheus base units (seconds); the JSON status keeps exact integer ns.
        self._g_offset.set((self.fused.peek(now_local) - now_local) / 1e9)
        self._g_freq.set(self.fused.freq_ppb)
        error = self.fused.error_ns(local.monotonic_ns())
        self._g_error.set(float("nan") if error is None else error / 1e9)
        for s in STATES:
            self._g_state.labels(s).set(1 if s == self.fused.state else 0)
        for s in SOURCES:
            self._g_source.labels(s).set(1 if s == self.fused.source else 0)
        self._g_joins.set(len(self.joins))

def status_line(status: dict[str, Any]) -> str:
    """One human line for ``sfu-sidecar clock``."""
    from datetime import UTC, datetime

    now = status["now_ns"]
    stamp = datetime.fromtimestamp(now // NS_PER_S, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    parts = [
        f"{stamp}.{now % NS_PER_S:09d}Z",
        f"{status['source']}/{status['state']}",
        f"offset={status['offset_ns']:+d}ns",
        f"freq={status['freq_ppb']:+.1f}ppb",
        f"error={status['error_ns']}ns" if status["error_ns"] is not None else "error=?",
    ]
    if status.get("converge_s") is not None:
        parts.append(f"remaining={status['remaining_ns']:+d}ns converge={status['converge_s']}s")
    ptp = status.get("ptp")
    if ptp:
        parts.append(f"gm={ptp['grandmaster'] or '-'}")
        if ptp["mean_path_delay_ns"] is not None:
            parts.append(f"delay={ptp['mean_path_delay_ns']}ns")
        parts.append(f"ts={ptp['timestamping']}")
    ntp = status.get("ntp")
    if ntp and ntp["server"]:
        parts.append(f"ntp={ntp['server']} ntp_offset={ntp['offset_ns']}ns")
    return " ".join(parts)


def status_json(status: dict[str, Any]) -> str:
    return json.dumps(status, separators=(",", ":"))
