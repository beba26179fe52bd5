"""What the relay lets other features see and change, per stream, viewer and track.

The sync-metadata feature is the main user; everything here is called on the event loop, inline
with forwarding, so callbacks must be quick and must not block (queue work elsewhere).

How to use it::

    class SyncFeed(RelayObserver):
        def publisher_sender_report(self, stream, kind, report):
            ...  # NTP<->RTP pair from the publisher's RTCP SR, as captured off the wire

        def viewer_connected(self, viewer):
            for kind, track in viewer.outputs.items():
                track.observers.append(lambda pkt, viewer_ts: ...)   # every forwarded packet
                track.sender_report_rewriter = rebuild_sr            # SRs this viewer receives
            if viewer.accepts_data_channel:
                channel = viewer.pc.createDataChannel("sync")          # aiortc RTCDataChannel

    relay.add_observer(SyncFeed())

* :class:`PacketInfo` carries the publisher's original RTP timestamp, marker and keyframe flags,
  the arrival time (house time, from the relay's ``now_ns``) and every header extension the
  publisher sent, raw, keyed by URI (abs-capture-time arrives here when negotiated; the relay
  negotiates it with publishers and viewers by default, see ``RelayService``).
* A packet observer is called as ``observer(packet, viewer_timestamp)`` once per packet that
  viewer is sent; ``viewer_timestamp`` is the RTP timestamp that viewer receives.
* ``sender_report_rewriter(default)`` is called about once a second per viewer track with the
  SR the relay would send (the publisher's latest NTP/RTP pair moved into the viewer's RTP time,
  or None before the publisher sent one) and returns the SR to send, or None to send none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

# The extension's codec and URI live with the capture-time mapping (pure, no aiortc).
from sfu_sidecar.sync.mapping import ABS_CAPTURE_TIME_URI

if TYPE_CHECKING:
    from aiortc.rtcdatachannel import RTCDataChannel

    from sfu_sidecar.relay.rtcp import ReportBlock
    from sfu_sidecar.relay.session import PublisherSession, ViewerSession

SDES_MID = "urn:ietf:params:rtp-hdrext:sdes:mid"
ABS_SEND_TIME = "http://www.webrtc.org/experiments/rtp-hdrext/abs-send-time"
AUDIO_LEVEL = "urn:ietf:params:rtp-hdrext:ssrc-audio-level"
ABS_CAPTURE_TIME = ABS_CAPTURE_TIME_URI


@dataclass(frozen=True, slots=True)
class SenderReport:
    """The sender-info half of an RTCP SR (RFC 3550 §6.4.1).

    ``ntp_timestamp`` is the 64-bit NTP timestamp (32.32 fixed point). ``arrival_ns`` is the
    house time the relay received it (None for reports the relay builds).
    """

    ntp_timestamp: int
    rtp_timestamp: int
    packet_count: int
    octet_count: int
    arrival_ns: int | None = None


@dataclass(frozen=True, slots=True)
class PacketInfo:
    """One publisher RTP packet as the relay received it (after RTX unwrapping)."""

    kind: str
    ssrc: int
    sequence_number: int
    timestamp: int
    marker: bool
    keyframe: bool
    arrival_ns: int
    clock_rate: int
    extensions: Mapping[str, bytes]


PacketObserver = Callable[[PacketInfo, int], None]
# Publisher-level hook: may return header-extension values (by URI) to write into every copy.
PacketWriter = Callable[[PacketInfo], Mapping[str, bytes] | None]
SenderReportRewriter = Callable[[SenderReport | None], SenderReport | None]


class RelayObserver:
    """Subclass and override what you need; every method defaults to doing nothing."""

    def publisher_sender_report(self, stream: str, kind: str, report: SenderReport) -> None:
        """An RTCP SR from the publisher of ``stream`` for its ``kind`` track."""

    def publisher_packet(
        self, stream: str, publisher_id: str, packet: PacketInfo
    ) -> Mapping[str, bytes] | None:
        """One RTP packet of ``stream``'s publisher (RTX unwrapped), before any viewer's
        observers see it. Called only for observers that override it. May return header
        extension values by URI (only those in forwarder.RELAY_WRITTEN, or ones the publisher
        negotiated) to write into the copies every viewer gets."""
        return None

    def publisher_connected(self, publisher: PublisherSession) -> None:
        """The publisher's transport is up. Channels it opened appear in
        ``publisher.data_channels`` (a ``sync`` channel carries its clock join)."""

    def data_channel(
        self, session: PublisherSession | ViewerSession, channel: RTCDataChannel
    ) -> None:
        """A peer opened a DataChannel. Attach message handlers here, not later: messages
        that arrive before a handler is attached are lost."""

    def viewer_connected(self, viewer: ViewerSession) -> None:
        """The viewer's transport is up; its tracks start receiving at the next packet."""

    def viewer_closed(self, viewer: ViewerSession) -> None:
        """The viewer left or failed; its tracks receive nothing more."""

    def viewer_receiver_report(
        self, viewer: ViewerSession, kind: str, report: ReportBlock
    ) -> None:
        """A report block the viewer sent about its ``kind`` track (RTCP RR or SR, about once
        a second): loss and RFC 3550 interarrival jitter as the viewer measures them, the
        jitter in the track's clock units."""
