"""The viewer's side of a session: what every kind of viewer shares (WHEP, an RTP feed, a
push), over whatever transport it holds."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any, Protocol

from aiortc import RTCRtpSender

from sfu_sidecar import logs
from sfu_sidecar.config import Settings
from sfu_sidecar.relay import aiortc_adapter as adapter
from sfu_sidecar.relay import rtcp
from sfu_sidecar.relay import sdp as sdpmod
from sfu_sidecar.relay.forwarder import OutputConfig, TrackForwarder, ViewerOutput
from sfu_sidecar.relay.hooks import ABS_CAPTURE_TIME, RelayObserver
from sfu_sidecar.relay.session import ENDED_DELETED, RTCP_INTERVAL_NS, SessionBase, StreamSlot
from sfu_sidecar.relay.sessionstate import SessionState

log = logs.get("relay.session")


class ViewerSlot(StreamSlot, Protocol):
    """What a viewer needs of its stream besides that: joining, leaving, keyframe requests."""

    def viewer_connected(self, session: ViewerSink) -> None: ...

    def viewer_closed(self, session: ViewerSink) -> None: ...

    def keyframe_requested(self, output: ViewerOutput, now_ns: int) -> None: ...


class ViewerSink(SessionBase):
    """What receives a stream as a viewer: the part every kind of viewer shares.

    A WHEP session (``peersessions.ViewerSession``), a plain-RTP feed (``relay/feed.py``) and a
    push (``relay/push.py``) differ only in the transport they hold, so in how packets leave and
    where RTCP comes from: each fills :attr:`outputs` (one :class:`ViewerOutput` per kind),
    calls :meth:`_start_outputs` once it can send (with each output's ``transmit`` set), hands
    RTCP from the receiver to :meth:`_on_rtcp`, and releases its transport in :meth:`_release`.
    The rest (joining the forwarders, NACK answers, keyframe requests, receiver reports,
    sender reports built by the observers' rewriters, status) happens here once.

    Observers see it as a ``hooks.ViewerHandle``: :attr:`outputs` (kind ->
    :class:`ViewerOutput`, with ``observers`` and ``sender_report_rewriter``),
    :attr:`accepts_data_channel`.
    """

    stream: ViewerSlot

    def __init__(
        self,
        role: str,
        stream: ViewerSlot,
        settings: Settings,
        now_ns: Callable[[], int],
        observers: list[RelayObserver],
    ) -> None:
        super().__init__(role, stream, settings, now_ns, observers)
        self.outputs: dict[str, ViewerOutput] = {}
        self.accepts_data_channel = False
        self.cname = "sfu-sidecar"

    def _add_output(self, m: sdpmod.MediaInfo, codec: sdpmod.CodecInfo,
                    sender: RTCRtpSender) -> ViewerOutput:
        """Send this stream's ``m.kind`` track as ``codec`` on the negotiated section ``m``,
        from the SSRCs of the silenced aiortc ``sender`` that holds its place in the SDP."""
        ssrc, rtx_ssrc = adapter.sender_ssrcs(sender)
        rtx_pt = m.rtx_for(codec.payload_type)
        config = OutputConfig(
            ssrc=ssrc,
            payload_type=codec.payload_type,
            extension_ids=m.extensions,
            mid=m.mid,
            rtx_payload_type=rtx_pt,
            rtx_ssrc=rtx_ssrc if rtx_pt is not None else None,
            clock_rate=codec.clock_rate,
        )
        # Random starting points (RFC 3550 §5.1), below 2^15 like aiortc's own senders to keep
        # early SRTP rollover guesses simple.
        rng = random.SystemRandom()
        output = ViewerOutput(self.id, m.kind, config, seq_base=rng.randrange(0x8000),
                              ts_base=rng.getrandbits(32))
        self.outputs[m.kind] = output
        return output

    def _start_outputs(self) -> None:
        """The outputs can send: join the forwarders, start sender reports, tell observers."""
        self.life.move(SessionState.CONNECTED)
        self.stream.viewer_connected(self)
        self._tasks.start("rtcp", self._rtcp_loop())
        self._notify("viewer_connected", lambda o: o.viewer_connected(self))

    # --- feedback from the receiver -----------------------------------------------------------

    def _on_rtcp(self, data: bytes) -> None:
        now = self.now_ns()
        for msg in self._parse_rtcp(data, now):
            if isinstance(msg, rtcp.Nack):
                output = self._output_for(msg.media_ssrc)
                if output is None:
                    continue
                forwarder = self.stream.forwarders.get(output.kind)
                if forwarder is None:
                    continue
                for packet in forwarder.retransmit(output, list(msg.lost), now):
                    self._send(output.transmit, packet)
            elif isinstance(msg, rtcp.KeyframeRequest):
                for media_ssrc in msg.media_ssrcs:
                    output = self._output_for(media_ssrc)
                    if output is not None:
                        self.stream.keyframe_requested(output, now)
            elif isinstance(msg, (rtcp.ReceiverReportPacket, rtcp.SenderReportPacket)):
                for block in msg.reports:
                    output = self._output_for(block.ssrc)
                    if output is not None:
                        output.last_report = block
                        self._receiver_report_in(output.kind, block)

    def _receiver_report_in(self, kind: str, block: rtcp.ReportBlock) -> None:
        self._notify("viewer_receiver_report",
                     lambda o: o.viewer_receiver_report(self, kind, block))

    def _output_for(self, ssrc: int) -> ViewerOutput | None:
        for output in self.outputs.values():
            if output.config.ssrc == ssrc:
                return output
        return None

    # --- sending ------------------------------------------------------------------------------

    def _send(self, send: Callable[[bytes], None] | None, data: bytes) -> None:
        # Before the transport is up there is nowhere to send; a failing send is counted and
        # costs only this packet.
        if send is None:
            return
        try:
            send(data)
        except Exception:
            self.counters.send_errors += 1

    def _rtcp_sender(self, output: ViewerOutput) -> Callable[[bytes], None] | None:
        """Where ``output``'s RTCP goes (one transport for every kind, unless overridden)."""
        return self._send_rtcp

    def _sender_report(self, forwarder: TrackForwarder, output: ViewerOutput) -> (
        rtcp.SenderReport | None
    ):
        """The SR handed to the output's rewriter: the publisher's latest, moved into this
        output's RTP time (None until the publisher sent one)."""
        return forwarder.sender_report_for(output)

    async def _rtcp_loop(self) -> None:
        while not self.closed.is_set():
            await asyncio.sleep(RTCP_INTERVAL_NS / 1e9 * (0.5 + random.random()))
            for output in list(self.outputs.values()):
                forwarder = self.stream.forwarders.get(output.kind)
                if forwarder is None or not output.started:
                    continue
                report = self._sender_report(forwarder, output)
                if output.sender_report_rewriter is not None:
                    try:
                        report = output.sender_report_rewriter(report)
                    except Exception:
                        log.exception("sender report rewriter failed")
                        report = None
                if report is None:
                    continue
                self._send(
                    self._rtcp_sender(output),
                    rtcp.build_sr(output.config.ssrc, report)
                    + rtcp.build_sdes_cname(output.config.ssrc, self.cname),
                )

    # --- lifetime -----------------------------------------------------------------------------

    async def close(self, reason: str = ENDED_DELETED) -> None:
        if not self.life.end(reason):
            return
        for output in self.outputs.values():
            output.transmit = None
        await self._tasks.stop()
        self.stream.viewer_closed(self)
        self._notify("viewer_closed", lambda o: o.viewer_closed(self))
        await self._release()

    def status(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state.value,
            "data_channel": self.accepts_data_channel,
            "tracks": [
                {
                    "kind": o.kind,
                    "ssrc": o.config.ssrc,
                    "payload_type": o.config.payload_type,
                    # Whether the far end negotiated abs-capture-time: without it, its only
                    # timing is the sender reports (a WHIP server that is an SFU may rewrite
                    # those for its own viewers).
                    "abs_capture_time": ABS_CAPTURE_TIME in o.config.extension_ids,
                    "started": o.started,
                    "packets_sent": o.packets_sent,
                    "nacks_received": o.nacks_received,
                    "retransmitted": o.retransmitted,
                    "plis_forwarded": o.keyframe_requests,
                    "send_errors": o.send_errors,
                    "fraction_lost": (
                        o.last_report.fraction_lost / 256 if o.last_report is not None else None
                    ),
                }
                for o in self.outputs.values()
            ],
        }
