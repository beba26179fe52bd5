"""The one module that reaches into aiortc's and aioice's private internals.

The relay forwards RTP without decoding it, which aiortc has no public API for. Everything it
needs from the inside lives here, is listed in :data:`REQUIRED`, and is checked by :func:`check`
when the relay starts, so an aiortc upgrade fails at start-up with a clear message instead of
in the middle of a call. Written against aiortc 1.16.0 and aioice 0.13.0 (pinned in pyproject).

What is used, and why:
* ``RTCDtlsTransport._handle_rtp_data`` / ``_handle_rtcp_data`` are replaced per instance: they
  receive plaintext RTP/RTCP after SRTP; the publisher's packets go to the forwarder instead of
  aiortc's jitter buffer and decoder, and viewers' RTCP (NACK, PLI, RR) comes to the relay.
* ``RTCDtlsTransport._tx_srtp`` + the nominated aioice pair's datagram transport give a
  synchronous send: SRTP-protect, then ``sendto``. aiortc's ``_send_rtp`` is a coroutine; going
  through it per packet per viewer would cost a task switch each and let one viewer's await
  hold up the others.
* ``RTCRtpSender.send`` is replaced per instance with a no-op so aiortc never starts its own
  RTP/RTCP loops for relay viewers (they would send SRs with a zero NTP time); the sender's
  ``_ssrc``/``_rtx_ssrc`` are the SSRCs announced in the answer, which the relay writes.
* ``aioice.Connection.gather_candidates`` is replaced per instance to bind the configured
  addresses and port range: aioice skips 127.0.0.1 and has no port-range option.
* ``aiortc.codecs.HEADER_EXTENSIONS`` is extended to negotiate extra header extensions, and
  ``aiortc.codecs.CODECS`` to negotiate VP9, which aiortc can neither encode nor decode: the
  relay forwards its packets and never hands them to aiortc's codecs.
* ``aioice.ice.CONSENT_INTERVAL`` sets how often a connected pair's consent is checked (RFC
  7675); aioice closes the connection after ``CONSENT_FAILURES`` checks in a row go unanswered,
  which is how the relay learns that a peer vanished without a DELETE.
"""

from __future__ import annotations

import asyncio
import errno
import random
import socket
from collections.abc import Callable, Iterable
from typing import Any

import aioice
import aioice.ice
import aiortc
from aioice.candidate import Candidate, candidate_foundation, candidate_priority
from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpSender
from aiortc.codecs import CODECS, HEADER_EXTENSIONS
from aiortc.rate import RemoteBitrateEstimator
from aiortc.rtcdtlstransport import RTCDtlsTransport
from aiortc.rtcrtpparameters import (
    RTCRtcpFeedback,
    RTCRtpCodecParameters,
    RTCRtpHeaderExtensionParameters,
)

from sfu_sidecar import logs
from sfu_sidecar.exceptions import ConfigError
from sfu_sidecar.settingvalues import PortRange

log = logs.get("relay.adapter")

AIORTC_VERSION = "1.16.0"
_pending: set[asyncio.Future[None]] = set()
AIOICE_VERSION = "0.13.0"

__all__ = [
    "REQUIRED",
    "RemoteBitrateEstimator",
    "check",
    "close_peer",
    "filter_sent",
    "install_ice",
    "negotiate_header_extension",
    "negotiate_video_codec",
    "on_rtcp",
    "on_rtp",
    "rtp_sender",
    "selected_candidates",
    "sender_ssrcs",
    "set_consent_timeout",
    "silence_sender",
    "tap_received",
]

# (owner, attribute) for everything checked at class level; instance fields are checked by
# :func:`check` on a throwaway peer connection.
REQUIRED: tuple[tuple[object, str], ...] = (
    (RTCDtlsTransport, "_handle_rtp_data"),
    (RTCDtlsTransport, "_handle_rtcp_data"),
    (RTCDtlsTransport, "_send_rtp"),
    (RTCRtpSender, "send"),
    (aioice.ice.Connection, "gather_candidates"),
    (aioice.ice.StunProtocol, "send_data"),
    (aioice.ice, "get_host_addresses"),
    (aioice.ice, "CONSENT_INTERVAL"),
    (aioice.ice, "CONSENT_FAILURES"),
    (RemoteBitrateEstimator, "add"),
)
_INSTANCE_FIELDS = {
    "sender": ("_ssrc", "_rtx_ssrc"),
    "dtls": ("_tx_srtp",),
    "ice": ("_connection",),
    "gatherer": ("_connection",),
    "connection": (
        "_local_candidates", "_local_candidates_start", "_local_candidates_end",
        "_protocols", "_components", "_nominated", "_use_ipv4", "_use_ipv6",
    ),
}


def _fail(what: str) -> ConfigError:
    return ConfigError(
        f"the relay needs aiortc {AIORTC_VERSION} / aioice {AIOICE_VERSION} internals "
        f"({what} is missing); installed: aiortc {aiortc.__version__}, "
        f"aioice {getattr(aioice, '__version__', '?')}"
    )


async def check() -> None:
    """Raise ConfigError naming the versions needed unless every internal used is present."""
    for owner, name in REQUIRED:
        if not hasattr(owner, name):
            raise _fail(f"{getattr(owner, '__name__', owner)}.{name}")
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        transceiver = pc.addTransceiver("video", direction="sendonly")
        sender = transceiver.sender
        dtls = sender.transport
        gatherer = dtls.transport.iceGatherer
        for obj, kind in ((sender, "sender"), (dtls, "dtls"), (dtls.transport, "ice"),
                          (gatherer, "gatherer")):
            for name in _INSTANCE_FIELDS[kind]:
                if not hasattr(obj, name):
                    raise _fail(f"{type(obj).__name__}.{name}")
        for name in _INSTANCE_FIELDS["connection"]:
            if not hasattr(gatherer._connection, name):
                raise _fail(f"aioice Connection.{name}")
    finally:
        await pc.close()


async def close_peer(pc: RTCPeerConnection) -> None:
    """Close a peer connection whatever state negotiation left it in: aiortc's ``close`` can
    raise when a session failed before its transports were built, and a session's teardown
    must never fail (it runs in another session's request or in a reaper task)."""
    try:
        await pc.close()
    except Exception as exc:  # aiortc internals, half built
        log.warning("closing a peer connection failed inside aiortc: %r", exc)


def set_consent_timeout(timeout_s: float) -> None:
    """Make every aioice connection in this process give up on its peer after ``timeout_s``
    of unanswered consent checks (process-wide, like the header extensions).

    aioice checks every ``CONSENT_INTERVAL`` (randomised 0.8-1.2x) and closes the connection
    after ``CONSENT_FAILURES`` failures in a row: 6 x 5 s, RFC 7675's 30 s. The count is kept
    and the interval scaled, so a peer is still given six chances.
    """
    # setattr: aioice declares the interval an int; a float is what its sleep takes anyway.
    setattr(aioice.ice, "CONSENT_INTERVAL", timeout_s / aioice.ice.CONSENT_FAILURES)  # noqa: B010


def negotiate_header_extension(kind: str, uri: str) -> None:
    """Make every aiortc peer connection in this process offer/accept ``uri`` for ``kind``.

    Process-wide (aiortc keeps one table). Ids only matter when aiortc makes the offer; BUNDLE
    shares one id space, so a URI gets the same id in audio and video.
    """
    table = HEADER_EXTENSIONS[kind]
    if any(e.uri == uri for e in table):
        return
    used = {e.id for k in HEADER_EXTENSIONS.values() for e in k}
    same_uri = [e.id for k in HEADER_EXTENSIONS.values() for e in k if e.uri == uri]
    ext_id = same_uri[0] if same_uri else min(i for i in range(1, 15) if i not in used)
    table.append(RTCRtpHeaderExtensionParameters(id=ext_id, uri=uri))


def negotiate_video_codec(mime_type: str, parameters: dict[str, str | int | None]) -> None:
    """Make every aiortc peer connection in this process offer/accept the video codec
    ``mime_type`` (e.g. ``video/VP9``) with ``parameters`` (its fmtp in answers) and RTX, NACK,
    PLI and REMB, as aiortc's own video codecs have. Process-wide, after aiortc's codecs, so
    aiortc's own offers still prefer those. Only for codecs the relay forwards and nothing in
    this process encodes or decodes: an aiortc peer that ends up sending or receiving it fails
    in aiortc's media task (the relay's sessions never hand it a frame or a packet)."""
    table = CODECS["video"]
    if any(c.mimeType.lower() == mime_type.lower() for c in table):
        return
    used = {c.payloadType for k in CODECS.values() for c in k}
    pt = next(p for p in range(96, 127) if p not in used and p + 1 not in used)
    table += [
        RTCRtpCodecParameters(
            mimeType=mime_type, clockRate=90000, payloadType=pt, parameters=dict(parameters),
            rtcpFeedback=[RTCRtcpFeedback(type="nack"),
                          RTCRtcpFeedback(type="nack", parameter="pli"),
                          RTCRtcpFeedback(type="goog-remb")],
        ),
        RTCRtpCodecParameters(mimeType="video/rtx", clockRate=90000, payloadType=pt + 1,
                              parameters={"apt": pt}),
    ]


# --- receive side ---------------------------------------------------------------------------


def dtls_transports(pc: RTCPeerConnection) -> list[RTCDtlsTransport]:
    """The distinct DTLS transports carrying this connection's media (one when bundled)."""
    seen: list[RTCDtlsTransport] = []
    for t in pc.getTransceivers():
        dtls = t.receiver.transport
        if dtls not in seen:
            seen.append(dtls)
    return seen


def on_rtp(dtls: RTCDtlsTransport, handler: Callable[[bytes, int], None]) -> None:
    """Route plaintext RTP (with aiortc's arrival time in ms) to ``handler``, bypassing aiortc."""

    async def handle_rtp_data(data: bytes, arrival_time_ms: int) -> None:
        handler(data, arrival_time_ms)

    dtls._handle_rtp_data = handle_rtp_data  # type: ignore[method-assign]


def on_rtcp(dtls: RTCDtlsTransport, handler: Callable[[bytes], None]) -> None:
    """Route plaintext RTCP to ``handler`` instead of aiortc's senders/receivers."""

    async def handle_rtcp_data(data: bytes) -> None:
        handler(data)

    dtls._handle_rtcp_data = handle_rtcp_data  # type: ignore[method-assign]


def tap_received(dtls: RTCDtlsTransport, rtp: Callable[[bytes, int], bool] | None = None,
                 rtcp: Callable[[bytes], None] | None = None) -> None:
    """Show every plaintext RTP packet (with aiortc's arrival time in ms) and RTCP compound a
    peer receives to the given callables before aiortc handles it; ``rtp`` returning False
    drops the packet (a simulated loss). For clients and tests that keep aiortc's receivers."""
    if rtp is not None:
        original_rtp = dtls._handle_rtp_data

        async def handle_rtp_data(data: bytes, arrival_time_ms: int) -> None:
            if rtp(data, arrival_time_ms):
                await original_rtp(data, arrival_time_ms)

        dtls._handle_rtp_data = handle_rtp_data  # type: ignore[method-assign]
    if rtcp is not None:
        original_rtcp = dtls._handle_rtcp_data

        async def handle_rtcp_data(data: bytes) -> None:
            rtcp(data)
            await original_rtcp(data)

        dtls._handle_rtcp_data = handle_rtcp_data  # type: ignore[method-assign]


# --- send side ------------------------------------------------------------------------------


def rtp_sender(dtls: RTCDtlsTransport) -> tuple[Callable[[bytes], None], Callable[[bytes], None]]:
    """(send_rtp, send_rtcp): protect and hand to the kernel now; ConnectionError when down.

    Only valid once the DTLS transport is connected (the SRTP session exists from then on).
    """
    connection = dtls.transport._connection
    srtp = dtls._tx_srtp

    def _out(data: bytes) -> None:
        pair = connection._nominated.get(1)
        if pair is None or dtls.state != "connected":
            raise ConnectionError("transport is not connected")
        transport = pair.protocol.transport
        if transport is None:
            raise ConnectionError("socket closed")
        if isinstance(pair.protocol, aioice.ice.StunProtocol):
            transport.sendto(data, pair.remote_addr)
        else:  # a TURN allocation: aioice wraps the datagram itself
            task = asyncio.ensure_future(pair.protocol.send_data(data, pair.remote_addr))
            _pending.add(task)
            task.add_done_callback(_pending.discard)

    def send_rtp(data: bytes) -> None:
        _out(srtp.protect(data))

    def send_rtcp(data: bytes) -> None:
        _out(srtp.protect_rtcp(data))

    return send_rtp, send_rtcp


def filter_sent(dtls: RTCDtlsTransport, transform: Callable[[bytes], bytes | None]) -> None:
    """Pass every plaintext RTP packet and RTCP compound an aiortc peer sends through
    ``transform`` before SRTP: it returns what to send (the same bytes, or rewritten ones, such
    as a publishing client stamping abs-capture-time, which aiortc cannot write) or None to
    drop the packet (a simulated loss)."""
    original = dtls._send_rtp

    async def send_rtp(data: bytes) -> None:
        out = transform(data)
        if out is not None:
            await original(out)

    dtls._send_rtp = send_rtp  # type: ignore[method-assign]


def silence_sender(sender: RTCRtpSender) -> None:
    """Stop aiortc from ever starting this sender's own RTP/RTCP loops; the relay writes."""

    async def send(parameters: Any) -> None:
        return None

    sender.send = send  # type: ignore[method-assign]


def sender_ssrcs(sender: RTCRtpSender) -> tuple[int, int]:
    """(media SSRC, RTX SSRC) aiortc announced for this sender in its SDP."""
    return int(sender._ssrc), int(sender._rtx_ssrc)


def rtcp_ssrc(pc: RTCPeerConnection) -> int:
    """An SSRC of ours to send receiver-side RTCP from (aiortc uses the first sender's)."""
    return int(pc.getTransceivers()[0].sender._ssrc)


# --- ICE ------------------------------------------------------------------------------------


def _is_local(address: str) -> bool:
    """Whether a socket can be bound to ``address`` on this host (any free port)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((address, 0))
    except OSError as exc:
        # Only "not an address of this host" means bind elsewhere; any other refusal (no IPv6
        # here) is for the bind itself to report.
        return exc.errno != errno.EADDRNOTAVAIL
    return True


def _port_taken(host: str, port: int, family6: bool) -> bool:
    """Whether ``port`` is in use on ``host``: the one bind failure worth trying another port
    of the range for."""
    try:
        with socket.socket(socket.AF_INET6 if family6 else socket.AF_INET,
                           socket.SOCK_DGRAM) as probe:
            probe.bind((host, port))
    except OSError as exc:
        return exc.errno == errno.EADDRINUSE
    return False


async def _bind(
    connection: Any, address: str, ports: PortRange | None
) -> tuple[asyncio.DatagramTransport, Any] | None:
    loop = asyncio.get_running_loop()
    family6 = ":" in address
    candidates: Iterable[int]
    if ports is None:
        candidates = (0,)
    else:
        span = ports.high - ports.low + 1
        start = random.randrange(span)
        candidates = (ports.low + (start + i) % span for i in range(span))
    # Announced but not local (1:1 NAT, a container's published ports): listen on every
    # address and announce this one. Asked of the kernel directly, because uvloop's bind error
    # carries no errno to tell "not local" from "in use".
    bind_host = address if _is_local(address) else ("::" if family6 else "0.0.0.0")

    async def bind(host: str, port: int) -> tuple[Any, Any]:
        return await loop.create_datagram_endpoint(
            lambda: aioice.ice.StunProtocol(connection),
            local_addr=(host, port),
            family=socket.AF_INET6 if family6 else socket.AF_INET,
        )

    for port in candidates:
        try:
            return await bind(bind_host, port)
        except OSError as exc:
            if ports is not None and _port_taken(bind_host, port, family6):
                continue
            if ports is not None:
                try:  # freed since it was refused: once more, or the refusal is not the port
                    return await bind(bind_host, port)
                except OSError:
                    pass
            log.warning("cannot bind ICE socket on %s: %s", address, exc)
            return None
    log.warning("no free UDP port for ICE on %s in %s", address, ports)
    return None


def ice_socknames(pc: RTCPeerConnection) -> list[tuple[str, int]]:
    """Where the connection's ICE sockets are bound (host, port): what gathering chose."""
    out = []
    for dtls in dtls_transports(pc):
        for protocol in dtls.transport.iceGatherer._connection._protocols:
            out.append(tuple(protocol.transport.get_extra_info("sockname")[:2]))
    return out


def selected_candidates(pc: RTCPeerConnection) -> list[tuple[str, str, int, str, str, int]]:
    """The candidate pair each transport sends on (local type, host, port, then the remote's):
    what RTCIceTransport.getSelectedCandidatePair() would give, which aiortc does not have."""
    out = []
    for dtls in dtls_transports(pc):
        pair = dtls.transport._connection._nominated.get(1)
        if pair is not None:
            local, remote = pair.local_candidate, pair.remote_candidate
            out.append((local.type, local.host, local.port, remote.type, remote.host,
                        remote.port))
    return out


def install_ice(
    pc: RTCPeerConnection, addresses: tuple[str, ...], ports: PortRange | None
) -> None:
    """Gather host candidates on ``addresses`` (all non-loopback ones when empty) in ``ports``.

    Call after setRemoteDescription (the transports exist) and before setLocalDescription
    (which gathers).
    """
    for dtls in dtls_transports(pc):
        connection = dtls.transport.iceGatherer._connection
        _replace_gather(connection, addresses, ports)
    sctp = pc.sctp
    if sctp is not None:
        _replace_gather(sctp.transport.transport.iceGatherer._connection, addresses, ports)


def _replace_gather(
    connection: Any, addresses: tuple[str, ...], ports: PortRange | None
) -> None:
    async def gather_candidates() -> None:
        if connection._local_candidates_start:
            return
        connection._local_candidates_start = True
        hosts = list(addresses) or aioice.ice.get_host_addresses(
            use_ipv4=connection._use_ipv4, use_ipv6=connection._use_ipv6
        )
        for component in sorted(connection._components):
            for host in hosts:
                bound = await _bind(connection, host, ports)
                if bound is None:
                    continue
                transport, protocol = bound
                port = transport.get_extra_info("sockname")[1]
                protocol.local_candidate = Candidate(
                    foundation=candidate_foundation("host", "udp", host),
                    component=component,
                    transport="udp",
                    priority=candidate_priority(component, "host"),
                    host=host,
                    port=port,
                    type="host",
                )
                connection._protocols.append(protocol)
                connection._local_candidates.append(protocol.local_candidate)
        connection._local_candidates_end = True

    connection.gather_candidates = gather_candidates

