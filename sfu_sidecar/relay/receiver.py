"""A publisher's receive path without I/O: RTP and RTCP bytes in, with their arrival times;
copies for viewers, observations, RTCP for the publisher and sender reports out.

The shape of a sans-I/O protocol object: the session (aiortc glue) feeds it
:meth:`PublisherReceiver.receive_rtp`, :meth:`~PublisherReceiver.receive_rtcp` and
:meth:`~PublisherReceiver.tick`, sends the copies each packet returns, then takes what is due
for the publisher from :meth:`~PublisherReceiver.data_to_send` (NACK, PLI, REMB, RR). It reads
no clock, owns no socket and starts no task, so another ingest (plain RTP) can feed it the same
way.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sfu_sidecar.ntptime import middle32
from sfu_sidecar.relay import rtcp
from sfu_sidecar.relay.forwarder import Copies, Observations, TrackForwarder
from sfu_sidecar.relay.hooks import ABS_SEND_TIME, PacketInfo, SenderReport
from sfu_sidecar.relay.packet import RtpPacket, RtpParseError, unwrap_rtx
from sfu_sidecar.relay.sdp import CodecInfo
from sfu_sidecar.relay.upstream import NackGenerator, ReceiveStatistics

LATENCY_SAMPLES = 8192
BITRATE_WINDOW_NS = 1_000_000_000
# SSRCs whose early sender reports are kept (see PublisherReceiver._early_reports): a tap's
# port takes datagrams from anyone, so the store is bounded.
EARLY_REPORT_SSRCS = 4


class BitrateEstimator(Protocol):
    """Receiver-side bandwidth estimation from abs-send-time (aiortc's REMB estimator is one)."""

    def add(self, arrival_time_ms: int, abs_send_time: int, payload_size: int,
            ssrc: int) -> tuple[int, list[int]] | None: ...


@dataclass
class SessionCounters:
    """Plain counters of one session, read when metrics are scraped."""

    parse_errors: int = 0
    unknown_payload: int = 0
    send_errors: int = 0
    rtcp_errors: int = 0
    observer_errors: int = 0
    # Packets from a source the session was told not to accept (an RTP tap's source or SSRC).
    foreign_packets: int = 0
    oversize_packets: int = 0  # RTP too large to reach viewers (an RTP tap's limit)
    latency_ns: deque[int] = field(default_factory=lambda: deque(maxlen=LATENCY_SAMPLES))


@dataclass(eq=False)
class PublisherTrack:
    """One incoming track of a publisher session."""

    kind: str
    mid: str | None
    codec: CodecInfo
    rtx_payload_type: int | None
    forwarder: TrackForwarder
    stats: ReceiveStatistics
    nack: NackGenerator | None
    extensions: Mapping[str, int]
    rtx_ssrcs: Mapping[int, int]
    media_ssrc: int | None = None
    rtx_packets: int = 0
    last_sr: SenderReport | None = None
    last_sr_arrival_ns: int = 0
    bitrate_bps: float = 0.0
    _window_octets: int = 0
    _window_start_ns: int = 0


class PublisherReceiver:
    """Everything a publisher's packets cause, decided without I/O.

    ``rtcp_ssrc`` is the SSRC the relay's feedback to the publisher is sent from;
    ``on_packet`` sees every media packet once before the forwarder copies it (see
    ``TrackForwarder.push``); ``bitrate`` turns abs-send-time into REMB messages.
    """

    def __init__(
        self,
        rtcp_ssrc: int,
        counters: SessionCounters,
        *,
        on_packet: Callable[[PacketInfo], Mapping[str, bytes] | None] | None = None,
        bitrate: BitrateEstimator | None = None,
    ) -> None:
        self.rtcp_ssrc = rtcp_ssrc
        self.counters = counters
        self.tracks: list[PublisherTrack] = []
        self._on_packet = on_packet
        self.bitrate = bitrate
        self._routes: dict[int, tuple[PublisherTrack, bool]] = {}  # payload type -> (track, rtx)
        self._outbox: list[bytes] = []
        # Sender reports from SSRCs no track has yet: a sender may report before its first
        # packet (ffmpeg sends its first report with it, on another socket). Dropping that
        # report costs the capture-time mapping a whole report interval (5 s for ffmpeg) of
        # guessing from arrivals. The newest per SSRC, for a few SSRCs.
        self._early_reports: dict[int, SenderReport] = {}
        self._due_reports: list[tuple[PublisherTrack, SenderReport]] = []

    def add_track(self, track: PublisherTrack) -> None:
        self.tracks.append(track)
        self._routes[track.codec.payload_type] = (track, False)
        if track.rtx_payload_type is not None:
            self._routes[track.rtx_payload_type] = (track, True)

    def data_to_send(self) -> Sequence[bytes]:
        """RTCP compounds for the publisher, in order; each is returned once."""
        if not self._outbox:
            return ()  # the common case, once per packet: no list built for it
        out, self._outbox = self._outbox, []
        return out

    # --- input ----------------------------------------------------------------------------

    def receive_rtp(
        self, data: bytes, arrival_ns: int, arrival_ms: int
    ) -> tuple[Copies, Observations | None] | None:
        """One plaintext RTP packet: the copies to send now and the observations due after
        them, or None when nothing is forwarded (unparsable, unknown payload type, padding).
        ``arrival_ns`` is house time; ``arrival_ms`` the transport's clock, for REMB."""
        try:
            pkt = RtpPacket.parse(data)
        except RtpParseError:
            self.counters.parse_errors += 1
            return None
        route = self._routes.get(pkt.payload_type)
        if route is None:
            self.counters.unknown_payload += 1
            return None
        track, is_rtx = route
        if is_rtx:
            media_ssrc = track.rtx_ssrcs.get(pkt.ssrc, track.media_ssrc)
            if media_ssrc is None or not pkt.payload:
                return None  # padding-only RTX (bandwidth probes) carries nothing to forward
            try:
                osn, payload = unwrap_rtx(pkt.payload)
            except RtpParseError:
                self.counters.parse_errors += 1
                return None
            track.rtx_packets += 1
            pkt = RtpPacket(track.codec.payload_type, osn, pkt.timestamp, media_ssrc,
                            pkt.marker, payload, pkt.extensions, pkt.csrcs)
            if track.nack is not None:
                track.nack.add(osn, arrival_ns)
        else:
            if not track.stats.started:
                # The first media packet decides (offers need not signal SSRCs, RFC 8843).
                track.media_ssrc = pkt.ssrc
                early = self._early_reports.pop(pkt.ssrc, None)
                if early is not None:
                    self._sender_report_in(track, pkt.ssrc, early)
                    self._due_reports.append((track, early))
            track.stats.add(pkt.sequence_number, pkt.timestamp, arrival_ns)
            if track.nack is not None:
                lost = track.nack.add(pkt.sequence_number, arrival_ns)
                if lost:
                    self._outbox.append(rtcp.build_nack(self.rtcp_ssrc, pkt.ssrc, lost))
            self._estimate_bitrate(track, pkt, arrival_ms)
            track._window_octets += len(data)
            if arrival_ns - track._window_start_ns >= BITRATE_WINDOW_NS:
                if track._window_start_ns:
                    span = arrival_ns - track._window_start_ns
                    track.bitrate_bps = track._window_octets * 8e9 / span
                track._window_start_ns = arrival_ns
                track._window_octets = 0
        return track.forwarder.push(pkt, arrival_ns, arrival_ns, self._on_packet)

    def _estimate_bitrate(self, track: PublisherTrack, pkt: RtpPacket, arrival_ms: int) -> None:
        ext_id = track.extensions.get(ABS_SEND_TIME)
        if ext_id is None or self.bitrate is None:
            return
        for i, value in pkt.extensions:
            if i == ext_id and len(value) == 3:
                remb = self.bitrate.add(
                    arrival_time_ms=arrival_ms,
                    abs_send_time=int.from_bytes(value, "big"),
                    payload_size=len(pkt.payload),
                    ssrc=pkt.ssrc,
                )
                if remb is not None:
                    bitrate, ssrcs = remb
                    self._outbox.append(rtcp.build_remb(self.rtcp_ssrc, int(bitrate),
                                                        list(ssrcs)))
                return

    def receive_rtcp(
        self, data: bytes, arrival_ns: int
    ) -> list[tuple[PublisherTrack, SenderReport]]:
        """One plaintext RTCP compound: the sender reports in it, by the track they are about
        (for observers). A torn compound is counted and yields none."""
        try:
            messages = rtcp.parse_compound(data, arrival_ns)
        except ValueError:
            self.counters.rtcp_errors += 1
            return []
        reports = []
        for msg in messages:
            if isinstance(msg, rtcp.SenderReportPacket):
                named = [track for track in self.tracks if track.media_ssrc == msg.ssrc
                         and track.stats.started]
                for track in named:
                    self._sender_report_in(track, msg.ssrc, msg.info)
                    reports.append((track, msg.info))
                if not named and any(not t.stats.started for t in self.tracks):
                    self._early_reports.pop(msg.ssrc, None)
                    self._early_reports[msg.ssrc] = msg.info
                    while len(self._early_reports) > EARLY_REPORT_SSRCS:
                        del self._early_reports[next(iter(self._early_reports))]
        return reports

    def reports_due(self) -> list[tuple[PublisherTrack, SenderReport]]:
        """Sender reports that came before their track's first packet, now that the packet
        named the track: for observers, after that packet's own observations."""
        if not self._due_reports:
            return []
        due, self._due_reports = self._due_reports, []
        return due

    @staticmethod
    def _sender_report_in(track: PublisherTrack, ssrc: int, report: SenderReport) -> None:
        track.last_sr = report
        track.last_sr_arrival_ns = report.arrival_ns or 0
        track.forwarder.note_sender_report(ssrc, report)

    def request_keyframe(self, kind: str) -> None:
        """Ask for a keyframe of the ``kind`` track (RTCP PLI)."""
        for track in self.tracks:
            if track.kind == kind:
                self._keyframe(track)

    def _keyframe(self, track: PublisherTrack) -> None:
        if track.media_ssrc is not None:
            self._outbox.append(rtcp.build_pli(self.rtcp_ssrc, track.media_ssrc))

    # --- time -----------------------------------------------------------------------------

    def tick(self, now_ns: int) -> None:
        """Retry NACKs that are due and ask for keyframes viewers wait for."""
        for track in self.tracks:
            if track.nack is not None and track.media_ssrc is not None:
                due = track.nack.due(now_ns)
                if due:
                    self._outbox.append(rtcp.build_nack(self.rtcp_ssrc, track.media_ssrc, due))
            if track.forwarder.keyframe_due(now_ns):
                self._keyframe(track)

    def receiver_report(self, now_ns: int) -> None:
        """Queue an RR (RFC 3550 §6.4.2) about every track that has received media."""
        blocks = []
        for track in self.tracks:
            if track.media_ssrc is None or not track.stats.started:
                continue
            lsr = dlsr = 0
            if track.last_sr is not None:
                lsr = middle32(track.last_sr.ntp_timestamp)
                dlsr = max(0, (now_ns - track.last_sr_arrival_ns) * 65536 // 1_000_000_000)
            blocks.append((track.media_ssrc, track.stats.report(), lsr, dlsr & 0xFFFFFFFF))
        if blocks:
            self._outbox.append(rtcp.build_rr(self.rtcp_ssrc, blocks))
