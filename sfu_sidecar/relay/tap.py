"""RTP taps: a stream's publisher fed by plain RTP over UDP, from an SFU or any RTP sender.

An SFU (Janus's ``rtp_forward``, a mediasoup PlainTransport) or a plain sender
(GStreamer, ffmpeg) sends unencrypted RTP to the ports a tap listens on; the tap is the stream's
publisher like a WHIP session is, through the same receive path (``PublisherSource``): the same
forwarders, the same observer hooks (so sync maps capture time per track from the sender's RTCP
sender reports, or from arrival time, which every record flags as its source), the same
keyframe requests.

Per media a tap binds an RTP port and an RTCP port (adjacent when they can be, RFC 3550 §11),
inside ``ice_port_range`` when that is set; RTCP multiplexed onto the RTP port (RFC 5761) is
accepted too. Feedback (PLI, NACK, receiver reports) goes to the address the sender's RTCP came
from (or where a bare RTP header sent to the RTCP port came from, which is how Janus names
its feedback port), once that host has also sent the tap media: a tap never sends to an address
that only ever sent it RTCP, so it cannot be used to reflect traffic elsewhere.

Plain RTP is unauthenticated: whoever reaches the port can inject media. ``source`` (one IP
address) and per-media ``ssrc`` drop everything else; the rest is the network's to restrict.
"""

from __future__ import annotations

import asyncio
import errno
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from sfu_sidecar import logs
from sfu_sidecar.config import Settings
from sfu_sidecar.exceptions import AtCapacity
from sfu_sidecar.relay import rtcp
from sfu_sidecar.relay.hooks import RelayObserver
from sfu_sidecar.relay.receiver import PublisherTrack
from sfu_sidecar.relay.session import PublisherSlot, PublisherSource
from sfu_sidecar.relay.sessionstate import SessionState
from sfu_sidecar.relay.taprequest import TapRequest
from sfu_sidecar.relay.upstream import NackGenerator, ReceiveStatistics
from sfu_sidecar.settingvalues import PortRange

log = logs.get("relay.tap")

# The largest RTP payload a tap forwards. Copies to viewers go out as SRTP through a 1500-byte
# buffer that keeps 144 bytes for the trailer (pylibsrtp), and each copy carries the header
# extensions the relay writes in place of the sender's: a larger payload could reach no viewer,
# so it is dropped and counted here. 1300 bytes is what WebRTC stacks send (aiortc's VP8
# packetizer, browsers' 1200-1300); plain senders are told to keep to it (docs/deployment.md).
MAX_PAYLOAD_BYTES = 1300
PAIR_ATTEMPTS = 16  # adjacent port pairs tried outside a configured range before any two
RETRY_AFTER_S = "5"

Address = tuple[Any, ...]  # (host, port) or (host, port, flowinfo, scope_id)


def is_rtcp(data: bytes) -> bool:
    """RTCP on a multiplexed port: packet types 192-223 sit where RTP's marker bit and
    payload type are (RFC 5761 §4)."""
    return len(data) >= 2 and 192 <= data[1] <= 223


def is_keepalive(data: bytes) -> bool:
    """A bare RTP header with no payload: what some SFUs (Janus's rtp_forward) send from their
    feedback socket to open the path for RTCP coming back."""
    return len(data) == 12 and data[0] >> 6 == 2 and not is_rtcp(data)


def _payload_size(data: bytes) -> int:
    """Bytes after the RTP header, its CSRCs and its extension block (an upper bound when the
    header is torn: the receive path refuses those anyway)."""
    if len(data) < 12:
        return 0
    size = len(data) - 12 - 4 * (data[0] & 0x0F)
    if data[0] & 0x10 and size >= 4:
        at = len(data) - size
        size -= 4 + 4 * int.from_bytes(data[at + 2:at + 4], "big")
    return size


class UdpEndpoint(asyncio.DatagramProtocol):
    """One bound UDP socket of a tap; datagrams go to the tap with the socket they came on."""

    def __init__(self, on_datagram: Callable[[UdpEndpoint, bytes, Address], None]) -> None:
        self.on_datagram = on_datagram
        self.transport: asyncio.DatagramTransport | None = None
        # Set once the socket is really closed: asyncio closes it a loop turn after close().
        self.lost = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: Address) -> None:
        self.on_datagram(self, data, addr)

    def error_received(self, exc: Exception) -> None:
        # ICMP port unreachable from a feedback address that went away: nothing to do.
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set()

    @property
    def port(self) -> int:
        assert self.transport is not None
        return int(self.transport.get_extra_info("sockname")[1])

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


@dataclass
class _MediaPorts:
    rtp: UdpEndpoint
    rtcp: UdpEndpoint
    # Where the sender's RTCP came from, and the socket to answer it on.
    feedback: tuple[UdpEndpoint, Address] | None = None
    # The latest RTCP source from a host that had sent no media yet (a sender announces its
    # feedback port before its first packet): it becomes ``feedback`` once that host has.
    pending: tuple[UdpEndpoint, Address, str] | None = None


class TapSession(PublisherSource):
    """A stream's publisher fed by plain RTP; see the module docstring."""

    def __init__(
        self,
        stream: PublisherSlot,
        settings: Settings,
        now_ns: Callable[[], int],
        observers: list[RelayObserver],
        request: TapRequest,
    ) -> None:
        super().__init__("tap", stream, settings, now_ns, observers)
        self.request = request
        self.media_ports: list[_MediaPorts] = []
        self.host = settings.host or "0.0.0.0"
        self._media_hosts: set[str] = set()  # hosts that sent media that reached a track

    # --- set-up ---------------------------------------------------------------------------

    async def open(self) -> None:
        """Bind the ports and start receiving; :class:`AtCapacity` when the range is full."""
        self.receiver.rtcp_ssrc = random.getrandbits(32)
        for i, media in enumerate(self.request.media):
            rtp, rtcp_ep = await self._bind_pair(i)
            self.media_ports.append(_MediaPorts(rtp, rtcp_ep))
            forwarder = self.stream.forwarder(media.kind, media.codec)
            forwarder.set_source({}, media.codec.name, media.codec.clock_rate)
            self.receiver.add_track(PublisherTrack(
                kind=media.kind,
                mid=None,
                codec=media.codec,
                rtx_payload_type=None,
                forwarder=forwarder,
                stats=ReceiveStatistics(media.codec.clock_rate),
                nack=NackGenerator() if media.kind == "video" else None,
                extensions={},
                rtx_ssrcs={},
                media_ssrc=media.ssrc,
            ))
        self.stream.codecs.update({t.kind: t.codec for t in self.tracks})
        self._send_rtcp = self._feedback  # new (waiting) until media reaches a track
        self._tasks.start("tick", self._tick())
        self._tasks.start("connect-deadline", self._connect_deadline())
        log.info("tap %s on %s: %s on %s", self.id[:8], self.stream.name,
                 ", ".join(f"{m.kind} {m.codec.name} rtp {p.rtp.port} rtcp {p.rtcp.port}"
                           for m, p in zip(self.request.media, self.media_ports, strict=True)),
                 self.host)

    async def _bind(self, index: int, port: int) -> UdpEndpoint:
        loop = asyncio.get_running_loop()
        endpoint = UdpEndpoint(lambda ep, data, addr: self._datagram(index, ep, data, addr))
        transport, _ = await loop.create_datagram_endpoint(
            lambda: endpoint, local_addr=(self.host, port))
        # Set here too: event loops differ in whether connection_made has run by now.
        endpoint.transport = transport
        return endpoint

    async def _bind_pair(self, index: int) -> tuple[UdpEndpoint, UdpEndpoint]:
        """An RTP and an RTCP socket: RTP on an even port and RTCP on the next when possible
        (senders that are given one port send RTCP to the next, RFC 3550 §11), any two free
        ports otherwise."""
        ports = self.settings.ice_port_range
        if ports is None:
            for _ in range(PAIR_ATTEMPTS):
                rtp = await self._bind(index, 0)
                if rtp.port % 2 == 0 and rtp.port < 65535:
                    try:
                        return rtp, await self._bind(index, rtp.port + 1)
                    except OSError as exc:
                        if exc.errno != errno.EADDRINUSE:
                            rtp.close()
                            raise
                rtp.close()
            rtp = await self._bind(index, 0)
            try:
                return rtp, await self._bind(index, 0)
            except BaseException:
                rtp.close()
                raise
        return await self._bind_in_range(index, ports)

    async def _bind_in_range(self, index: int, ports: PortRange) -> tuple[UdpEndpoint, UdpEndpoint]:
        span = ports.high - ports.low + 1
        start = random.randrange(span)
        order = [ports.low + (start + i) % span for i in range(span)]
        for port in order:  # adjacent pairs first
            if port % 2 or port + 1 > ports.high:
                continue
            try:
                rtp = await self._bind(index, port)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    continue
                raise  # the host setting names no local address: the server's fault
            try:
                return rtp, await self._bind(index, port + 1)
            except OSError:
                rtp.close()
        bound: list[UdpEndpoint] = []
        for port in order:
            try:
                bound.append(await self._bind(index, port))
            except OSError:
                continue
            if len(bound) == 2:
                return bound[0], bound[1]
        for endpoint in bound:
            endpoint.close()
        raise AtCapacity(f"no free UDP ports for a tap in {ports} (setting ice_port_range)",
                         retry_after=RETRY_AFTER_S)

    # --- packets --------------------------------------------------------------------------

    def _datagram(self, index: int, endpoint: UdpEndpoint, data: bytes, addr: Address) -> None:
        if self.closed.is_set():
            return
        host = str(addr[0])
        if host.startswith("::ffff:") and "." in host:
            host = host[7:]  # an IPv4 sender on a dual-stack socket
        if self.request.source is not None and host != self.request.source:
            self.counters.foreign_packets += 1
            return
        ports = self.media_ports[index]
        if endpoint is ports.rtcp or is_rtcp(data):
            self._rtcp_in(ports, endpoint, data, addr, host)
            return
        if _payload_size(data) > MAX_PAYLOAD_BYTES:
            self.counters.oversize_packets += 1
            return
        expected = self.request.media[index].ssrc
        if expected is not None and len(data) >= 12 and (
            int.from_bytes(data[8:12], "big") != expected
        ):
            self.counters.foreign_packets += 1
            return
        if self._receive_media(data, 0):
            self._media_hosts.add(host)
            if self.life.move(SessionState.CONNECTED):
                self._notify("publisher_connected", lambda o: o.publisher_connected(self))

    def _rtcp_in(self, ports: _MediaPorts, endpoint: UdpEndpoint, data: bytes,
                 addr: Address, host: str) -> None:
        if endpoint is ports.rtcp and is_keepalive(data):
            pass  # not RTCP, but it names the sender's feedback address all the same
        else:
            errors = self.counters.rtcp_errors
            self._on_rtcp(data)
            if self.counters.rtcp_errors != errors:
                return
        if host in self._media_hosts:
            ports.feedback = (endpoint, addr)
        else:
            ports.pending = (endpoint, addr, host)

    def _feedback_address(self, ports: _MediaPorts) -> tuple[UdpEndpoint, Address] | None:
        if ports.pending is not None and ports.pending[2] in self._media_hosts:
            ports.feedback = ports.pending[:2]
            ports.pending = None
        return ports.feedback

    def _feedback(self, data: bytes) -> None:
        """One RTCP compound for the sender: to the media whose SSRC it names (PLI, NACK),
        or to every media that has a feedback address (receiver reports)."""
        try:
            messages = rtcp.parse_compound(data)
        except ValueError:
            return
        named: set[int] = set()
        for msg in messages:
            if isinstance(msg, rtcp.Nack):
                named.add(msg.media_ssrc)
            elif isinstance(msg, rtcp.KeyframeRequest):
                named.update(msg.media_ssrcs)
        for track, ports in zip(self.tracks, self.media_ports, strict=True):
            feedback = self._feedback_address(ports)
            if feedback is None or (named and track.media_ssrc not in named):
                continue
            endpoint, addr = feedback
            if endpoint.transport is not None:
                endpoint.transport.sendto(data, addr)

    # --- lifetime -------------------------------------------------------------------------

    def _silence_counts(self) -> bool:
        # Until the first packet the connect deadline applies (session_connect_timeout_s): an
        # SFU may be told to forward only after the tap exists.
        return self.connected_once

    async def _release(self) -> None:
        endpoints = [e for ports in self.media_ports for e in (ports.rtp, ports.rtcp)]
        for endpoint in endpoints:
            endpoint.close()
        # The ports are free when this returns, so a DELETE's answer means they can be reused.
        await asyncio.gather(*(e.lost.wait() for e in endpoints if e.transport is not None))

    @property
    def sender_clock_is_house(self) -> bool:
        return self.request.sender_clock == "house"

    def description(self) -> dict[str, Any]:
        """Where to send: the ports per media, as the creating request is answered."""
        return {
            "id": self.id,
            "stream": self.stream.name,
            "host": self.host,
            "source": self.request.source,
            "sender_clock": self.request.sender_clock,
            "media": [
                {
                    "kind": m.kind,
                    "codec": m.codec.name,
                    "payload_type": m.codec.payload_type,
                    "clock_rate": m.codec.clock_rate,
                    "ssrc": m.ssrc,
                    "rtp_port": p.rtp.port,
                    "rtcp_port": p.rtcp.port,
                }
                for m, p in zip(self.request.media, self.media_ports, strict=True)
            ],
        }

    def status(self) -> dict[str, Any]:
        status = super().status()
        status["source_kind"] = "rtp_tap"
        status["tap"] = self.description()
        status["rtcp_errors"] = self.counters.rtcp_errors
        status["unknown_payload"] = self.counters.unknown_payload
        status["foreign_packets"] = self.counters.foreign_packets
        status["oversize_packets"] = self.counters.oversize_packets
        addresses = [self._feedback_address(p) for p in self.media_ports]
        status["feedback_to"] = [
            f"{a[1][0]}:{a[1][1]}" if a is not None else None for a in addresses
        ]
        return status
