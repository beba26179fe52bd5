"""Packet-level WebRTC relay: WHIP ingest, WHEP egress, RTP forwarded without transcoding.

Modules, pure cores first:

* ``packet``  RTP wire view (raw header extensions), RTX, VP8/H.264 keyframe detection
* ``rtcp``    the RTCP the relay reads and writes (SR with both clock halves, RR, NACK, PLI...)
* ``forwarder`` per-track fan-out: per-viewer rewrite, NACK cache, keyframe throttle
* ``upstream`` receiver statistics and NACK decisions towards the publisher
* ``receiver`` a publisher's receive path without I/O: RTP/RTCP bytes in; copies, observations
  and RTCP for the publisher out
* ``sdp``     offer checks, negotiated-media summaries, trickle fragments
* ``hooks``   the public seam: observer hooks and the handles they get (publisher, viewer,
  viewer track, data channel, keyframe request), packets, sender reports
* ``aiortc_adapter`` the only module touching aiortc/aioice internals (checked at start-up)
* ``session`` aiortc glue for one publisher or viewer; ``streams`` streams by name
* ``tap``     plain RTP from an SFU as a stream's publisher; ``feed`` a stream sent as plain
  RTP to an SFU, as one more viewer
* ``service`` :class:`RelayService`, the application component
* ``routes``  its HTTP routes (WHIP, WHEP, taps, feeds, /api/streams), registered by the
  application

Wiring (``app.build_components``)::

    relay = RelayService(settings, metrics, now_ns=clock.now_ns)
    Components(metrics, clock=clock, relay=relay, ...)
    relay.add_observer(sync_feature)        # a hooks.RelayObserver
"""

from __future__ import annotations

from sfu_sidecar.relay.hooks import (
    ABS_CAPTURE_TIME,
    DataChannel,
    PacketInfo,
    PacketObserver,
    PublisherHandle,
    RelayObserver,
    RequestKeyframe,
    SenderReport,
    SenderReportRewriter,
    ViewerHandle,
    ViewerTrack,
)
from sfu_sidecar.relay.service import RelayService

__all__ = [
    "ABS_CAPTURE_TIME",
    "DataChannel",
    "PacketInfo",
    "PacketObserver",
    "PublisherHandle",
    "RelayObserver",
    "RelayService",
    "RequestKeyframe",
    "SenderReport",
    "SenderReportRewriter",
    "ViewerHandle",
    "ViewerTrack",
]
