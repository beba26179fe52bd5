"""The relay's public seam: what other features see and change, per stream, viewer and track.

Sync metadata, the probe and every later feature attach the same way: an observer
(:class:`RelayObserver`) registered with the relay, handed small handles
(:class:`PublisherHandle`, :class:`ViewerHandle`, :class:`ViewerTrack`, :class:`DataChannel`)
and never a session object or anything of aiortc. Everything here is called on the event loop,
inline with forwarding, so callbacks must be quick and must not block (queue work elsewhere).

How to use it::

    class SyncFeed(RelayObserver):
        def publisher_sender_report(self, stream, kind, report):
            ...  # NTP<->RTP pair from the publisher's RTCP SR, as captured off the wire

        def viewer_connected(self, viewer):
            for kind, track in viewer.outputs.items():
                track.observers.append(lambda pkt, viewer_ts: ...)   # every forwarded packet
                track.sender_report_rewriter = rebuild_sr            # SRs this viewer receives

        def viewer_data_channel(self, viewer, channel):
            channel.on_message(lambda data: ...)                    # a channel the viewer opened

    relay.add_observer(SyncFeed())

Features also read the relay, never change it, through :class:`RelayView` (streams, their
publisher and traffic, keyframe requests, an edge's pulls). Only the app holds the relay's
service itself.

* :class:`PacketInfo` carries the publisher's original RTP timestamp, marker and keyframe flags,
  the payload as sent (the live segments rebuild frames from it), the arrival time (house time,
  from the relay's ``now_ns``) and every header extension the publisher sent, raw, keyed by URI
  (abs-capture-time arrives here when negotiated; the relay negotiates it with publishers and
  viewers by default, see ``RelayService``).
* A packet observer is called as ``observer(packet, viewer_timestamp)`` once per packet that
  viewer is sent; ``viewer_timestamp`` is the RTP timestamp that viewer receives.
* ``sender_report_rewriter(default)`` is called about once a second per viewer track with the
  SR the relay would send (the publisher's latest NTP/RTP pair moved into the viewer's RTP time,
  or None before the publisher sent one) and returns the SR to send, or None to send none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from sfu_sidecar.relay.rtcp import ReportBlock, SenderReport

# The extension's codec and URI are the sync package's (pure, no aiortc).
from sfu_sidecar.sync.abscapture import ABS_CAPTURE_TIME_URI

__all__ = [
    "ABS_CAPTURE_TIME",
    "ABS_SEND_TIME",
    "AUDIO_LEVEL",
    "SDES_MID",
    "DataChannel",
    "PacketInfo",
    "PacketObserver",
    "PacketWriter",
    "PublisherHandle",
    "PublisherView",
    "RelayObserver",
    "RelayView",
    "ReportBlock",
    "RequestKeyframe",
    "SenderReport",
    "SenderReportRewriter",
    "StreamView",
    "TrackTraffic",
    "ViewerHandle",
    "ViewerTrack",
]

SDES_MID = "urn:ietf:params:rtp-hdrext:sdes:mid"
ABS_SEND_TIME = "http://www.webrtc.org/experiments/rtp-hdrext/abs-send-time"
AUDIO_LEVEL = "urn:ietf:params:rtp-hdrext:ssrc-audio-level"
ABS_CAPTURE_TIME = ABS_CAPTURE_TIME_URI


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
    # The RTP payload as the publisher sent it (for observers that rebuild frames from it).
    payload: bytes = b""


PacketObserver = Callable[[PacketInfo, int], None]
# Publisher-level hook: may return header-extension values (by URI) to write into every copy.
PacketWriter = Callable[[PacketInfo], Mapping[str, bytes] | None]
SenderReportRewriter = Callable[[SenderReport | None], SenderReport | None]


# Asks the stream's publisher for a keyframe of its ``kind`` track (RTCP PLI).
RequestKeyframe = Callable[[str], None]


class DataChannel(Protocol):
    """A DataChannel a peer opened, as observers see it."""

    @property
    def label(self) -> str: ...

    @property
    def ready_state(self) -> str:
        """One of connecting, open, closing, closed (the W3C RTCDataChannelState)."""
        ...

    @property
    def buffered_amount(self) -> int:
        """Bytes queued for sending and not yet handed to the transport."""
        ...

    def send(self, data: bytes | str) -> None: ...

    def on_message(self, handler: Callable[[bytes | str], None]) -> None:
        """Call ``handler`` with every message from now on (earlier ones are lost)."""
        ...


class ViewerTrack(Protocol):
    """One viewer's copy of one track: who sees its packets and what its SRs say."""

    observers: list[PacketObserver]
    sender_report_rewriter: SenderReportRewriter | None

    @property
    def kind(self) -> str: ...

    @property
    def mid(self) -> str | None:
        """The media section's a=mid in the viewer's session."""
        ...

    @property
    def clock_rate(self) -> int | None:
        """The RTP clock rate of the codec the viewer negotiated for this track."""
        ...


class PublisherHandle(Protocol):
    """A stream's publisher, as observers see it."""

    @property
    def id(self) -> str: ...

    @property
    def stream_name(self) -> str: ...


class ViewerHandle(Protocol):
    """One viewer of a stream, as observers see it."""

    @property
    def id(self) -> str: ...

    @property
    def stream_name(self) -> str: ...

    @property
    def accepts_data_channel(self) -> bool:
        """The viewer's offer had an application m-line (it may open DataChannels)."""
        ...

    @property
    def outputs(self) -> Mapping[str, ViewerTrack]:
        """The viewer's tracks by kind."""
        ...


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
        negotiated) to write into the copies every viewer gets; an empty value takes that
        extension out of the copies."""
        return None

    def publisher_connected(self, publisher: PublisherHandle) -> None:
        """The publisher's transport is up."""

    def publisher_closed(self, publisher: PublisherHandle) -> None:
        """The publisher ended: DELETE, or dropped as gone (no media, transport lost, never
        connected). The stream and its viewers stay; another publisher may take over."""

    def publisher_state(self, publisher: PublisherHandle) -> None:
        """The publisher's source went idle or live again while its session stays (a pulled
        stream whose upstream lost or regained its own publisher): see ``upstream_live``."""

    def publisher_data_channel(self, publisher: PublisherHandle, channel: DataChannel) -> None:
        """The publisher opened a DataChannel (a ``sync`` channel carries its clock join).
        Attach message handlers here, not later: messages that arrive before a handler is
        attached are lost."""

    def viewer_data_channel(self, viewer: ViewerHandle, channel: DataChannel) -> None:
        """A viewer opened a DataChannel; as :meth:`publisher_data_channel`."""

    def viewer_connected(self, viewer: ViewerHandle) -> None:
        """The viewer's transport is up; its tracks start receiving at the next packet."""

    def viewer_closed(self, viewer: ViewerHandle) -> None:
        """The viewer left or failed; its tracks receive nothing more."""

    def viewer_receiver_report(
        self, viewer: ViewerHandle, kind: str, report: ReportBlock
    ) -> None:
        """A report block the viewer sent about its ``kind`` track (RTCP RR or SR, about once
        a second): loss and RFC 3550 interarrival jitter as the viewer measures them, the
        jitter in the track's clock units."""


@dataclass(frozen=True, slots=True)
class TrackTraffic:
    """One track of a stream, counted since the stream began (all its viewers together)."""

    octets_in: int
    octets_out: int
    nacks_received: int  # from viewers
    nacks_sent: int  # to the publisher
    keyframe_requests: int  # PLI/FIR from viewers


class PublisherView(PublisherHandle, Protocol):
    """A stream's publisher, read-only: what features show and decide on."""

    @property
    def state(self) -> str: ...

    @property
    def live(self) -> bool:
        """Connected at least once and not ended."""
        ...

    @property
    def upstream_live(self) -> bool:
        """False while the source says it has nothing to send (a pull whose upstream lost
        its publisher)."""
        ...

    @property
    def relayed(self) -> bool:
        """Capture times on a clock joined to this node's, the epoch from upstream (a pull)."""
        ...

    @property
    def sender_clock_is_house(self) -> bool:
        """The sender's reports are declared on the house clock (exact capture times)."""
        ...

    def bitrates_bps(self) -> Mapping[str, float]:
        """Each track's receive bitrate by kind."""
        ...


class StreamView(Protocol):
    """One stream the relay carries, read-only."""

    @property
    def name(self) -> str: ...

    @property
    def publisher(self) -> PublisherView | None: ...

    @property
    def viewer_count(self) -> int: ...

    def codec(self, kind: str) -> str | None:
        """The negotiated codec of the stream's ``kind`` track, lower case (``vp8``, ``opus``)."""
        ...

    def traffic(self) -> Mapping[str, TrackTraffic]:
        """Counts per track kind."""
        ...


class RelayView(Protocol):
    """The relay as features see it: observers, streams read-only, and the few requests a
    feature may make of it."""

    def add_observer(self, observer: RelayObserver) -> None: ...

    def stream(self, name: str) -> StreamView | None: ...

    def stream_names(self) -> Sequence[str]: ...

    def request_keyframe(self, stream: str, kind: str = "video") -> bool:
        """Ask the stream's publisher for a keyframe (throttled as viewers' requests are)."""
        ...

    @property
    def is_edge(self) -> bool:
        """Streams not published here are pulled from an origin."""
        ...

    async def ensure_stream(self, name: str) -> None:
        """On an edge, return once ``name`` is pulled here (raises the upstream's refusal)."""
        ...

    def add_interest(self, wants: Callable[[str], bool]) -> None:
        """On an edge, keep a stream's pull while ``wants(stream)`` is true, as while it has
        viewers (a reader other than the relay's viewers: the live segments)."""
        ...
