"""Packet-level WebRTC relay: WHIP ingest, WHEP egress, RTP forwarded without transcoding."""

from __future__ import annotations

from sfu_sidecar.relay.hooks import (
    ABS_CAPTURE_TIME,
    PacketInfo,
    PacketObserver,
    RelayObserver,
    SenderReport,
    SenderReportRewriter,
)
from sfu_sidecar.relay.service import RelayService

__all__ = [
    "ABS_CAPTURE_TIME",
    "PacketInfo",
    "PacketObserver",
    "RelayObserver",
    "RelayService",
    "SenderReport",
    "SenderReportRewriter",
]
