"""Per-track fan-out: one publisher track to many viewers, rewritten per viewer, no media decoding.

Pure: the caller passes packets, arrival and current times in, and sends the bytes that come out.

Timelines:
* publisher space: the sequence numbers/timestamps the current publisher sends;
* track space: publisher space shifted so that it stays continuous when the publisher reconnects
  (a new publisher session starts at random seq/ts; viewers must see no jump backwards);
* viewer space: track space plus a per-viewer random offset fixed when the viewer starts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sfu_sidecar.ntptime import unix_ns_to_ntp
from sfu_sidecar.relay.hooks import (
    ABS_CAPTURE_TIME,
    ABS_SEND_TIME,
    SDES_MID,
    PacketInfo,
    PacketObserver,
    PacketWriter,
    SenderReport,
    SenderReportRewriter,
)
from sfu_sidecar.relay.packet import (
    RtpExtensions,
    RtpPacket,
    build_extensions,
    build_rtp_with_block,
    is_keyframe_start,
    seq_newer,
    wrap_rtx,
)
from sfu_sidecar.relay.rtcp import ReportBlock

# Packets kept per track for NACK repair: ~6 s of 1.5 Mbit/s VP8 (~150 packets/s), far beyond
# any round trip a NACK can still help with.
CACHE_SIZE = 1024
# One keyframe request upstream per track per 500 ms at most: an encoder asked more often just
# produces keyframes back to back (and aiortc's encoder honours every request).
KEYFRAME_INTERVAL_NS = 500_000_000
# Header extensions a publisher-level hook may write into every copy (the sync feature writes
# abs-capture-time in house time), with the pseudo-id used when the publisher lacks them.
RELAY_WRITTEN = {ABS_CAPTURE_TIME: 256}


@dataclass(frozen=True, slots=True)
class OutputConfig:
    """What one viewer negotiated for one track."""

    ssrc: int
    payload_type: int
    extension_ids: Mapping[str, int] = field(default_factory=dict)
    mid: str | None = None
    rtx_payload_type: int | None = None
    rtx_ssrc: int | None = None
    clock_rate: int | None = None  # of the negotiated codec


@dataclass(slots=True)
class CachedPacket:
    seq: int  # track space
    timestamp: int  # track space
    publisher_timestamp: int
    marker: bool
    keyframe: bool
    payload: bytes
    extensions: RtpExtensions  # ids as the publisher of ``epoch`` negotiated them
    csrcs: tuple[int, ...]
    epoch: int
    arrival_ns: int


class ViewerOutput:
    """One viewer's copy of one track: its SSRC, payload type, offsets, extension ids, counters.

    Hook points (see ``hooks.py``): :attr:`observers`, :attr:`sender_report_rewriter`.
    """

    def __init__(
        self, viewer_id: str, kind: str, config: OutputConfig, *, seq_base: int, ts_base: int
    ) -> None:
        self.viewer_id = viewer_id
        self.kind = kind
        self.config = config
        self.started = False
        self.seq_offset = 0
        self.ts_offset = 0
        self._seq_base = seq_base & 0xFFFF
        self._ts_base = ts_base & 0xFFFFFFFF
        self.rtx_seq = (seq_base + 0x4000) & 0xFFFF
        self.packets_sent = 0
        self.octets_sent = 0
        self.nacks_received = 0
        self.retransmitted = 0
        self.nack_misses = 0
        self.keyframe_requests = 0
        self.observer_errors = 0
        self.last_observer_error: BaseException | None = None
        self.send_errors = 0
        self.last_report: ReportBlock | None = None  # the viewer's latest RR block for us
        # Set by the session once the viewer's transport is up: hands one packet to its socket.
        self.transmit: Callable[[bytes], None] | None = None
        self.observers: list[PacketObserver] = []
        self.sender_report_rewriter: SenderReportRewriter | None = None
        # Set when the answer announced a=mediaclk:direct=0 (house clock locked to PTP).
        self.media_clock_rate: int | None = None
        self._xlate_epoch = -1
        self._xlate: dict[int, int] = {}
        self._ext_signature: object = None
        ids = config.extension_ids
        self._abs_send_id = ids.get(ABS_SEND_TIME)
        mid_id = ids.get(SDES_MID)
        self._mid_ext: tuple[int, bytes] | None = (
            (mid_id, config.mid.encode()) if mid_id and config.mid else None
        )

    @property
    def ssrc(self) -> int:
        return self.config.ssrc

    @property
    def mid(self) -> str | None:
        return self.config.mid

    @property
    def clock_rate(self) -> int | None:
        return self.config.clock_rate

    def _start(self, seq: int, timestamp: int, now_ns: int) -> None:
        if self.media_clock_rate is not None:
            # RFC 7273 "direct" media clock: the viewer's RTP time is the reference clock's
            # time in clock-rate units (offset 0), from this packet on.
            self._ts_base = now_ns * self.media_clock_rate // 1_000_000_000
        self.seq_offset = (self._seq_base - seq) & 0xFFFF
        self.ts_offset = (self._ts_base - timestamp) & 0xFFFFFFFF
        self.started = True

    def viewer_timestamp(self, track_timestamp: int) -> int:
        return (track_timestamp + self.ts_offset) & 0xFFFFFFFF

    def _refresh(self, pkt: CachedPacket, uris: Mapping[int, str]) -> None:
        ids = self.config.extension_ids
        self._xlate = {
            pid: ids[uri]
            for pid, uri in uris.items()
            if uri not in (SDES_MID, ABS_SEND_TIME) and uri in ids
        }
        self._xlate_epoch = pkt.epoch
        # Viewers that negotiated the same ids and mid get byte-identical extension blocks:
        # the signature lets one packet's fan-out build each distinct block once.
        self._ext_signature = (
            tuple(sorted(self._xlate.items())), self._mid_ext, self._abs_send_id
        )

    def _extension_block(
        self, pkt: CachedPacket, uris: Mapping[int, str], now_ns: int,
        blocks: dict[object, bytes] | None,
    ) -> bytes:
        if self._xlate_epoch != pkt.epoch:
            self._refresh(pkt, uris)
        if blocks is not None:
            cached = blocks.get(self._ext_signature)
            if cached is not None:
                return cached
        xlate = self._xlate
        out = [(xlate[i], v) for i, v in pkt.extensions if i in xlate]
        if self._mid_ext is not None:
            out.insert(0, self._mid_ext)
        if self._abs_send_id is not None:
            # abs-send-time is the sender's clock (6.18 fixed-point seconds, 24 bits): the
            # viewer's bandwidth estimator must see the relay's send times, not the publisher's.
            value = (now_ns * (1 << 18) // 1_000_000_000) & 0xFFFFFF
            out.append((self._abs_send_id, value.to_bytes(3, "big")))
        block = build_extensions(tuple(out))
        if blocks is not None:
            blocks[self._ext_signature] = block
        return block

    def render(
        self, pkt: CachedPacket, uris: Mapping[int, str], now_ns: int,
        blocks: dict[object, bytes] | None = None,
    ) -> bytes:
        """This viewer's copy of ``pkt``; ``blocks`` caches extension blocks across viewers."""
        cfg = self.config
        return build_rtp_with_block(
            cfg.payload_type,
            (pkt.seq + self.seq_offset) & 0xFFFF,
            (pkt.timestamp + self.ts_offset) & 0xFFFFFFFF,
            cfg.ssrc,
            pkt.marker,
            pkt.payload,
            self._extension_block(pkt, uris, now_ns, blocks),
            pkt.csrcs,
        )

    def render_rtx(self, pkt: CachedPacket, uris: Mapping[int, str], now_ns: int) -> bytes:
        cfg = self.config
        assert cfg.rtx_payload_type is not None and cfg.rtx_ssrc is not None
        seq = self.rtx_seq
        self.rtx_seq = (seq + 1) & 0xFFFF
        return build_rtp_with_block(
            cfg.rtx_payload_type,
            seq,
            (pkt.timestamp + self.ts_offset) & 0xFFFFFFFF,
            cfg.rtx_ssrc,
            pkt.marker,
            wrap_rtx((pkt.seq + self.seq_offset) & 0xFFFF, pkt.payload),
            self._extension_block(pkt, uris, now_ns, None),
            pkt.csrcs,
        )


@dataclass(slots=True)
class Observations:
    """The viewers' packet observers still to run for one pushed packet.

    Returned by :meth:`TrackForwarder.push` rather than run there, so the caller sends every
    copy first: observer work (sync records) then adds nothing to any viewer's forwarding
    latency.
    """

    info: PacketInfo
    due: list[tuple[ViewerOutput, int]]  # (output, the RTP timestamp that viewer received)

    def deliver(self) -> None:
        info = self.info
        for output, viewer_ts in self.due:
            for observer in output.observers:
                try:
                    observer(info, viewer_ts)
                except Exception as exc:  # one broken observer must not stop fan-out
                    output.observer_errors += 1
                    output.last_observer_error = exc


Copies = list[tuple[ViewerOutput, bytes]]


class TrackForwarder:
    """Fan-out of one track of one stream, kept across publisher reconnects."""

    def __init__(self, kind: str, codec: str, clock_rate: int) -> None:
        self.kind = kind
        self.codec = codec.lower()
        self.clock_rate = clock_rate
        self.outputs: list[ViewerOutput] = []
        self.packets_in = 0
        self.octets_in = 0
        self.keyframes_in = 0
        self.keyframe_requests_sent = 0
        # What viewers that left were sent, so the totals in /metrics never go down.
        self.packets_sent_gone = 0
        self.retransmitted_gone = 0
        self.foreign_packets = 0
        self._cache: list[CachedPacket | None] = [None] * CACHE_SIZE
        self._epoch = 0
        self._uris: dict[int, dict[int, str]] = {0: {}}
        self._source_ssrc: int | None = None
        self._awaiting_source = True
        self._seq_delta = 0
        self._ts_delta = 0
        self._last_seq: int | None = None  # highest track-space seq seen
        self._last_ts = 0
        self._last_arrival_ns = 0
        self._keyframe_pending = False
        self._last_keyframe_request_ns: int | None = None
        self.last_sender_report: SenderReport | None = None
        self._ids: dict[int, dict[str, int]] = {}  # epoch -> uri -> publisher (or pseudo) id

    # --- publisher side -------------------------------------------------------------------

    def set_source(self, extension_uris: Mapping[int, str], codec: str, clock_rate: int) -> None:
        """A (new) publisher session feeds this track: its first packet continues the track."""
        self._epoch += 1
        uris = dict(extension_uris)
        # Extensions the relay itself may write (hooks.PacketWriter) get a pseudo-id when the
        # publisher did not negotiate them: above 255, never a wire id, only a key here.
        for uri, pseudo in RELAY_WRITTEN.items():
            if uri not in uris.values():
                uris[pseudo] = uri
        self._uris[self._epoch] = uris
        self._ids[self._epoch] = {uri: pid for pid, uri in uris.items()}
        # Keep only the maps cached packets can still refer to.
        live = {p.epoch for p in self._cache if p is not None} | {self._epoch}
        self._uris = {e: u for e, u in self._uris.items() if e in live}
        self._ids = {e: u for e, u in self._ids.items() if e in live}
        self.codec = codec.lower()
        self.clock_rate = clock_rate
        self._awaiting_source = True
        self.last_sender_report = None

    @property
    def source_ssrc(self) -> int | None:
        return self._source_ssrc

    def _rebase(self, pkt: RtpPacket, arrival_ns: int) -> None:
        if self._last_seq is None:
            self._seq_delta = self._ts_delta = 0
        else:
            # Continue one past the last sequence number, and advance the timestamp by the
            # wall time that passed, so players keep their clocks (RFC 3550 §5.1 semantics).
            gap_ns = max(arrival_ns - self._last_arrival_ns, 1_000_000)
            next_ts = self._last_ts + gap_ns * self.clock_rate // 1_000_000_000
            self._seq_delta = (self._last_seq + 1 - pkt.sequence_number) & 0xFFFF
            self._ts_delta = (next_ts - pkt.timestamp) & 0xFFFFFFFF
        self._source_ssrc = pkt.ssrc
        self._awaiting_source = False

    def push(
        self, pkt: RtpPacket, arrival_ns: int, now_ns: int,
        on_packet: PacketWriter | None = None,
    ) -> tuple[Copies, Observations | None]:
        """Cache one publisher packet; return what each started viewer must be sent, and the
        viewers' observers to run once it is sent (None when no viewer has one).

        ``on_packet`` sees the packet once, before any viewer's observers do (publisher-level
        state such as the capture-time mapping is then current for all of them); header
        extension values it returns (by URI) replace or join the publisher's in every copy.
        """
        if pkt.ssrc != self._source_ssrc:
            if not self._awaiting_source:
                self.foreign_packets += 1
                return [], None
            self._rebase(pkt, arrival_ns)
        seq = (pkt.sequence_number + self._seq_delta) & 0xFFFF
        ts = (pkt.timestamp + self._ts_delta) & 0xFFFFFFFF
        keyframe = self.kind == "video" and is_keyframe_start(self.codec, pkt.payload)
        uris = self._uris[self._epoch]
        info: PacketInfo | None = None
        extensions = pkt.extensions
        if on_packet is not None:
            info = self._info(pkt, keyframe, arrival_ns, uris)
            written = on_packet(info)
            if written:
                extensions = self._write_extensions(extensions, written)
        entry = CachedPacket(
            seq, ts, pkt.timestamp, pkt.marker, keyframe, pkt.payload, extensions,
            pkt.csrcs, self._epoch, arrival_ns,
        )
        self._cache[seq % CACHE_SIZE] = entry
        self.packets_in += 1
        self.octets_in += len(pkt.payload)
        if keyframe:
            self.keyframes_in += 1
        if self._last_seq is None or seq_newer(seq, self._last_seq):
            self._last_seq = seq
            self._last_ts = ts
            self._last_arrival_ns = arrival_ns
        blocks: dict[object, bytes] = {}
        out: Copies = []
        observed: list[tuple[ViewerOutput, int]] = []
        for output in self.outputs:
            if not output.started:
                if self.kind == "video" and not keyframe:
                    continue  # nothing before a keyframe is decodable for a new viewer
                output._start(seq, ts, now_ns)
            out.append((output, output.render(entry, uris, now_ns, blocks)))
            output.packets_sent += 1
            output.octets_sent += len(entry.payload)
            if output.observers:
                if info is None:
                    info = self._info(pkt, keyframe, arrival_ns, uris)
                observed.append((output, (ts + output.ts_offset) & 0xFFFFFFFF))
        if not observed:
            return out, None
        assert info is not None
        return out, Observations(info, observed)

    def _write_extensions(
        self, extensions: RtpExtensions, written: Mapping[str, bytes]
    ) -> RtpExtensions:
        ids = self._ids[self._epoch]
        replaced = {ids[uri]: value for uri, value in written.items() if uri in ids}
        kept = tuple((i, v) for i, v in extensions if i not in replaced)
        return kept + tuple((i, v) for i, v in replaced.items() if v)  # empty: taken out

    def _info(
        self, pkt: RtpPacket, keyframe: bool, arrival_ns: int, uris: Mapping[int, str]
    ) -> PacketInfo:
        return PacketInfo(
            self.kind, pkt.ssrc, pkt.sequence_number, pkt.timestamp, pkt.marker,
            keyframe, arrival_ns, self.clock_rate,
            {uris[i]: v for i, v in pkt.extensions if i in uris}, pkt.payload,
        )

    # --- viewer feedback ------------------------------------------------------------------

    def retransmit(self, output: ViewerOutput, lost: list[int], now_ns: int) -> list[bytes]:
        """Packets answering a viewer's NACK (viewer-space sequence numbers), RTX if negotiated."""
        output.nacks_received += 1
        if not output.started:
            return []
        use_rtx = output.config.rtx_payload_type is not None and output.config.rtx_ssrc is not None
        out = []
        for viewer_seq in lost:
            seq = (viewer_seq - output.seq_offset) & 0xFFFF
            entry = self._cache[seq % CACHE_SIZE]
            if entry is None or entry.seq != seq:
                output.nack_misses += 1
                continue
            uris = self._uris.get(entry.epoch, {})
            data = (
                output.render_rtx(entry, uris, now_ns) if use_rtx
                else output.render(entry, uris, now_ns)
            )
            output.retransmitted += 1
            out.append(data)
        return out

    def request_keyframe(self, now_ns: int, output: ViewerOutput | None = None) -> bool:
        """A viewer sent PLI/FIR; True when a request should go upstream now."""
        if output is not None:
            output.keyframe_requests += 1
        self._keyframe_pending = True
        return self.keyframe_due(now_ns)

    def keyframe_due(self, now_ns: int) -> bool:
        """True (once per interval) while a request is pending or a new viewer awaits a keyframe."""
        if self.kind != "video":
            return False
        wanted = self._keyframe_pending or any(not o.started for o in self.outputs)
        last = self._last_keyframe_request_ns
        if not wanted or (last is not None and now_ns - last < KEYFRAME_INTERVAL_NS):
            return False
        self._last_keyframe_request_ns = now_ns
        self._keyframe_pending = False
        self.keyframe_requests_sent += 1
        return True

    # --- viewers ------------------------------------------------------------------------

    def add_output(self, output: ViewerOutput) -> None:
        self.outputs.append(output)

    def remove_output(self, output: ViewerOutput) -> None:
        if output in self.outputs:
            self.outputs.remove(output)
            self.packets_sent_gone += output.packets_sent
            self.retransmitted_gone += output.retransmitted

    def packets_sent(self) -> int:
        """Packets sent to every viewer this track ever had (retransmissions not counted)."""
        return self.packets_sent_gone + sum(o.packets_sent for o in self.outputs)

    def retransmitted(self) -> int:
        return self.retransmitted_gone + sum(o.retransmitted for o in self.outputs)

    # --- RTCP sender reports ---------------------------------------------------------------

    def note_sender_report(self, ssrc: int, report: SenderReport) -> None:
        if ssrc == self._source_ssrc:
            self.last_sender_report = report

    def sender_report_for(self, output: ViewerOutput) -> SenderReport | None:
        """The publisher's latest NTP/RTP pair in this viewer's RTP time, with its counts."""
        sr = self.last_sender_report
        if sr is None or not output.started:
            return None
        rtp = (sr.rtp_timestamp + self._ts_delta + output.ts_offset) & 0xFFFFFFFF
        return SenderReport(
            sr.ntp_timestamp, rtp, output.packets_sent & 0xFFFFFFFF,
            output.octets_sent & 0xFFFFFFFF,
        )

    def latest_report_for(self, output: ViewerOutput) -> SenderReport | None:
        """An SR pairing the newest packet's RTP time (in this viewer's time) with the house
        time it arrived; for receivers that must get SRs though the publisher sends none (an
        observer's rewriter replaces the NTP field with capture time)."""
        if not output.started or self._last_seq is None:
            return None
        return SenderReport(
            unix_ns_to_ntp(self._last_arrival_ns),
            (self._last_ts + output.ts_offset) & 0xFFFFFFFF,
            output.packets_sent & 0xFFFFFFFF,
            output.octets_sent & 0xFFFFFFFF,
        )
