"""RTP feeds: a stream sent as plain RTP over UDP to an SFU's RTP input, or any RTP receiver.

A feed is a viewer of a stream (``ViewerSink``) whose outputs go to UDP ports instead of an
SRTP transport: a Janus Streaming "rtp" mountpoint, a mediasoup PlainTransport, GStreamer or
ffmpeg. Each media gets the same per-viewer rewrite a WHEP viewer gets (its own SSRC, payload
type, sequence numbers and timestamps from the stream's forwarder), starts at a keyframe that
the forwarder asks the publisher for, and gets an RTCP sender report about once a second whose
NTP time is the capture time of its RTP time on the house clock (the sync component rewrites
it as it does for WHEP viewers). With ``extensions`` every packet carries abs-capture-time in
house time, as one-byte header extension ``ABS_CAPTURE_TIME_ID``; without, packets carry no
header extension at all, for receivers that refuse them.

Per media one local UDP socket (in ``ice_port_range`` when set) sends RTP to ``rtp_port`` and
RTCP to ``rtcp_port`` (to ``rtp_port`` when none is given: RTCP multiplexed, RFC 5761, which
a mediasoup PlainTransport expects by default) and receives the receiver's RTCP: PLI/FIR ask
the publisher for a keyframe through the stream's throttle, NACKs are answered from the
forwarder's cache, receiver reports reach observers. A datagram from another host, one that
is not RTCP, or torn RTCP is dropped and counted.
"""

from __future__ import annotations

import asyncio
import errno
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sfu_sidecar import logs
from sfu_sidecar.config import Settings
from sfu_sidecar.exceptions import AtCapacity, BadInput
from sfu_sidecar.relay.forwarder import OutputConfig, TrackForwarder, ViewerOutput
from sfu_sidecar.relay.hooks import ABS_CAPTURE_TIME, RelayObserver
from sfu_sidecar.relay.rtcp import SenderReport
from sfu_sidecar.relay.sdp import FORWARDABLE, CodecInfo
from sfu_sidecar.relay.tap import RETRY_AFTER_S, Address, UdpEndpoint, is_rtcp
from sfu_sidecar.relay.taprequest import check_address, check_int, check_keys, check_stream
from sfu_sidecar.relay.viewersink import ViewerSink, ViewerSlot

log = logs.get("relay.feed")

# The one-byte header extension id abs-capture-time is written with (RFC 8285; receivers
# that read it are configured with this id).
ABS_CAPTURE_TIME_ID = 1


@dataclass(frozen=True)
class FeedMedia:
    """Where one media of a feed goes, and as what (None: the stream's payload type, and a
    random SSRC)."""

    kind: str
    rtp_port: int
    rtcp_port: int | None
    payload_type: int | None
    ssrc: int | None


@dataclass(frozen=True)
class FeedRequest:
    stream: str
    host: str
    media: tuple[FeedMedia, ...]
    extensions: bool


def _media(item: Any, i: int) -> FeedMedia:
    what = f"media[{i}]"
    if not isinstance(item, dict):
        raise BadInput(f"{what} must be an object")
    check_keys(item, ("kind", "rtp_port", "rtcp_port", "payload_type", "ssrc"), what)
    kind = item.get("kind")
    if kind not in FORWARDABLE:
        raise BadInput(f"{what}.kind must be audio or video")
    rtp_port = check_int(item.get("rtp_port"), f"{what}.rtp_port", 1, 65535)
    rtcp_port = None
    if item.get("rtcp_port") is not None:
        rtcp_port = check_int(item["rtcp_port"], f"{what}.rtcp_port", 1, 65535)
    payload_type = None
    if item.get("payload_type") is not None:
        # Dynamic payload types only, as for taps: 64-95 would read as RTCP on a multiplexed
        # port (RFC 5761 §4).
        payload_type = check_int(item["payload_type"], f"{what}.payload_type", 96, 127)
    ssrc = None
    if item.get("ssrc") is not None:
        ssrc = check_int(item["ssrc"], f"{what}.ssrc", 0, 0xFFFFFFFF)
    return FeedMedia(kind, rtp_port, rtcp_port, payload_type, ssrc)


def parse_feed_request(body: Any) -> FeedRequest:
    """A ``POST /api/feeds`` body, checked field by field; :class:`BadInput` says what is wrong.

    ``{"stream": NAME, "host": IP, "media": [{"kind", "rtp_port", "rtcp_port"?,
    "payload_type"?, "ssrc"?}], "extensions"?: bool}``, at most one media per kind.
    """
    if not isinstance(body, dict):
        raise BadInput("body must be a JSON object")
    check_keys(body, ("stream", "host", "media", "extensions"), "feed")
    stream = check_stream(body.get("stream"))
    host = body.get("host")
    if not isinstance(host, str):
        raise BadInput("host must be the receiver's IP address")
    address = check_address(host, "host")
    if address.is_unspecified or address.is_multicast:
        raise BadInput(f"host {host} is not a unicast address")
    items = body.get("media")
    if not isinstance(items, list) or not 1 <= len(items) <= len(FORWARDABLE):
        raise BadInput("media must be a list of one audio and/or one video destination")
    media = tuple(_media(item, i) for i, item in enumerate(items))
    kinds = [m.kind for m in media]
    if len(set(kinds)) != len(kinds):
        raise BadInput("media: at most one audio and one video")
    extensions = body.get("extensions", False)
    if not isinstance(extensions, bool):
        raise BadInput("extensions must be true or false")
    return FeedRequest(stream, str(address), media, extensions)


class FeedSession(ViewerSink):
    """A stream sent as plain RTP; see the module docstring."""

    def __init__(
        self,
        stream: ViewerSlot,
        settings: Settings,
        now_ns: Callable[[], int],
        observers: list[RelayObserver],
        request: FeedRequest,
    ) -> None:
        super().__init__("feed", stream, settings, now_ns, observers)
        self.request = request
        self.endpoints: dict[str, UdpEndpoint] = {}
        self.rtcp_received = 0  # RTCP compounds from the receiver (it may send none)
        self._rtcp_senders: dict[str, Callable[[bytes], None]] = {}
        ipv6 = ":" in request.host
        configured = settings.host or ""
        if ipv6 != (":" in configured) or configured in ("", "0.0.0.0", "::"):
            configured = "::" if ipv6 else "0.0.0.0"
        self.local_host = configured

    # --- set-up ---------------------------------------------------------------------------

    async def open(self, codecs: dict[str, CodecInfo]) -> None:
        """Bind the sockets and join the forwarders; ``codecs`` are the stream's, by kind.

        :class:`AtCapacity` when ``ice_port_range`` has no free port."""
        rng = random.SystemRandom()
        ids = {ABS_CAPTURE_TIME: ABS_CAPTURE_TIME_ID} if self.request.extensions else {}
        for media in self.request.media:
            codec = codecs[media.kind]
            endpoint = await self._bind_one()
            self.endpoints[media.kind] = endpoint
            config = OutputConfig(
                ssrc=media.ssrc if media.ssrc is not None else rng.getrandbits(32),
                payload_type=(media.payload_type if media.payload_type is not None
                              else codec.payload_type),
                extension_ids=ids,
                clock_rate=codec.clock_rate,
            )
            # Random starting points (RFC 3550 §5.1), as for WHEP viewers.
            output = ViewerOutput(self.id, media.kind, config,
                                  seq_base=rng.randrange(0x8000), ts_base=rng.getrandbits(32))
            output.transmit = self._sender(endpoint, media.rtp_port)
            self._rtcp_senders[media.kind] = self._sender(
                endpoint, media.rtcp_port if media.rtcp_port is not None else media.rtp_port)
            self.outputs[media.kind] = output
            self.stream.forwarder(media.kind, codec)
        self._start_outputs()  # connected: it sends
        log.info("feed %s of %s to %s: %s", self.id[:8], self.stream.name, self.request.host,
                 ", ".join(f"{m.kind} rtp {m.rtp_port} rtcp {m.rtcp_port or m.rtp_port}"
                           for m in self.request.media))

    def _sender(self, endpoint: UdpEndpoint, port: int) -> Callable[[bytes], None]:
        addr: Address = (self.request.host, port)

        def send(data: bytes) -> None:
            transport = endpoint.transport
            if transport is not None and not transport.is_closing():
                transport.sendto(data, addr)

        return send

    async def _bind(self, port: int) -> UdpEndpoint:
        loop = asyncio.get_running_loop()
        endpoint = UdpEndpoint(lambda _ep, data, addr: self._datagram(data, addr))
        transport, _ = await loop.create_datagram_endpoint(
            lambda: endpoint, local_addr=(self.local_host, port))
        endpoint.transport = transport  # event loops differ in when connection_made runs
        return endpoint

    async def _bind_one(self) -> UdpEndpoint:
        """A socket on any free port, or on one in ``ice_port_range`` (which a deployment
        publishes, so the receiver's RTCP can come back through it)."""
        ports = self.settings.ice_port_range
        if ports is None:
            return await self._bind(0)
        span = ports.high - ports.low + 1
        start = random.randrange(span)
        for i in range(span):
            try:
                return await self._bind(ports.low + (start + i) % span)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
        raise AtCapacity(f"no free UDP port for a feed in {ports} (setting ice_port_range)",
                         retry_after=RETRY_AFTER_S)

    # --- RTCP from the receiver -----------------------------------------------------------

    def _datagram(self, data: bytes, addr: Address) -> None:
        if self.closed.is_set():
            return
        host = str(addr[0])
        if host.startswith("::ffff:") and "." in host:
            host = host[7:]  # an IPv4 receiver on a dual-stack socket
        if host != self.request.host:
            self.counters.foreign_packets += 1
            return
        if not is_rtcp(data):
            self.counters.parse_errors += 1  # a feed is sent nothing but RTCP
            return
        self.rtcp_received += 1
        self._on_rtcp(data)

    # --- RTCP to the receiver -------------------------------------------------------------

    def _rtcp_sender(self, output: ViewerOutput) -> Callable[[bytes], None] | None:
        return self._rtcp_senders.get(output.kind)

    def _sender_report(self, forwarder: TrackForwarder, output: ViewerOutput) -> (
        SenderReport | None
    ):
        # A receiver of plain RTP has no other tie between RTP and wall-clock time: when the
        # publisher sends no SRs (a tap from an SFU), report the newest packet at its arrival,
        # which the sync component's rewriter turns into its capture time.
        report = forwarder.sender_report_for(output)
        return report if report is not None else forwarder.latest_report_for(output)

    # --- lifetime -------------------------------------------------------------------------

    async def _release(self) -> None:
        for endpoint in self.endpoints.values():
            endpoint.close()

    def description(self) -> dict[str, Any]:
        """Where it sends and as what, as the creating request is answered."""
        return {
            "id": self.id,
            "stream": self.stream.name,
            "host": self.request.host,
            "extensions": self.request.extensions,
            "media": [
                {
                    "kind": m.kind,
                    "codec": self.stream.codecs[m.kind].name
                    if m.kind in self.stream.codecs else None,
                    "clock_rate": self.outputs[m.kind].config.clock_rate,
                    "payload_type": self.outputs[m.kind].config.payload_type,
                    "ssrc": self.outputs[m.kind].config.ssrc,
                    "rtp_port": m.rtp_port,
                    "rtcp_port": m.rtcp_port if m.rtcp_port is not None else m.rtp_port,
                    "local_port": self.endpoints[m.kind].port,
                    **({"abs_capture_time_id": ABS_CAPTURE_TIME_ID}
                       if self.request.extensions else {}),
                }
                for m in self.request.media if m.kind in self.outputs
            ],
        }

    def status(self) -> dict[str, Any]:
        status = super().status()
        status["viewer_kind"] = "rtp_feed"
        status["feed"] = self.description()
        status["rtcp_received"] = self.rtcp_received
        status["rtcp_errors"] = self.counters.rtcp_errors
        status["not_rtcp"] = self.counters.parse_errors
        status["foreign_packets"] = self.counters.foreign_packets
        status["send_errors"] = self.counters.send_errors
        return status
