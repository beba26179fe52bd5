"""The RTCP the relay reads and writes (RFC 3550 §6.4, RFC 4585 §6, draft-alvestrand-rmcat-remb).

Pure. Written here rather than taken from aiortc because aiortc's NACK packing and parsing do not
wrap sequence numbers at 2^16, and the relay needs the SR's RTP half, which aiortc drops.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from sfu_sidecar.relay.packet import build_nack_fci, parse_nack_fci
from sfu_sidecar.relay.upstream import ReceptionReport

# Common header: V(2) P(1) RC/FMT(5) | PT(8) | length in 32-bit words minus one (16)
HEADER = struct.Struct("!BBH")
# SR sender info after the sender SSRC: NTP (64) | RTP ts (32) | packets (32) | octets (32)
SENDER_INFO = struct.Struct("!QIII")
# Report block: SSRC | fraction lost (8) + cumulative lost (24) | ext. highest seq | jitter |
# LSR | DLSR
REPORT_BLOCK = struct.Struct("!IIIIII")
FEEDBACK = struct.Struct("!II")  # sender SSRC | media SSRC

SR, RR, SDES, BYE, RTPFB, PSFB = 200, 201, 202, 203, 205, 206
FMT_NACK = 1
FMT_PLI, FMT_FIR, FMT_APP = 1, 4, 15


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
class ReportBlock:
    ssrc: int
    fraction_lost: int
    packets_lost: int
    highest_sequence: int
    jitter: int
    lsr: int
    dlsr: int


@dataclass(frozen=True, slots=True)
class SenderReportPacket:
    ssrc: int
    info: SenderReport
    reports: tuple[ReportBlock, ...]


@dataclass(frozen=True, slots=True)
class ReceiverReportPacket:
    ssrc: int
    reports: tuple[ReportBlock, ...]


@dataclass(frozen=True, slots=True)
class Nack:
    ssrc: int
    media_ssrc: int
    lost: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class KeyframeRequest:
    """PLI, or FIR for each SSRC its FCI names."""

    ssrc: int
    media_ssrcs: tuple[int, ...]
    fir: bool


@dataclass(frozen=True, slots=True)
class Remb:
    ssrc: int
    bitrate: int
    media_ssrcs: tuple[int, ...]


RtcpMessage = SenderReportPacket | ReceiverReportPacket | Nack | KeyframeRequest | Remb


def _report_blocks(data: bytes, pos: int, count: int) -> tuple[ReportBlock, ...]:
    out = []
    for _ in range(count):
        if pos + 24 > len(data):
            break
        ssrc, lost_word, high, jitter, lsr, dlsr = REPORT_BLOCK.unpack_from(data, pos)
        lost = lost_word & 0xFFFFFF
        if lost & 0x800000:
            lost -= 1 << 24
        out.append(ReportBlock(ssrc, lost_word >> 24, lost, high, jitter, lsr, dlsr))
        pos += 24
    return tuple(out)


def parse_compound(data: bytes, arrival_ns: int | None = None) -> list[RtcpMessage]:
    """The messages the relay acts on; others (SDES, BYE, XR...) are skipped. ValueError if torn."""
    out: list[RtcpMessage] = []
    pos = 0
    while pos + 4 <= len(data):
        b0, pt, words = HEADER.unpack_from(data, pos)
        if b0 >> 6 != 2:
            raise ValueError("RTCP version is not 2")
        end = pos + 4 * (words + 1)
        if end > len(data):
            raise ValueError("RTCP packet longer than the datagram")
        body = data[pos + 4 : end]
        count = b0 & 0x1F
        if pt == SR and len(body) >= 24:
            ssrc = struct.unpack_from("!I", body)[0]
            ntp, rtp, packets, octets = SENDER_INFO.unpack_from(body, 4)
            out.append(
                SenderReportPacket(
                    ssrc, SenderReport(ntp, rtp, packets, octets, arrival_ns),
                    _report_blocks(body, 24, count),
                )
            )
        elif pt == RR and len(body) >= 4:
            ssrc = struct.unpack_from("!I", body)[0]
            out.append(ReceiverReportPacket(ssrc, _report_blocks(body, 4, count)))
        elif pt == RTPFB and count == FMT_NACK and len(body) >= 8:
            ssrc, media = FEEDBACK.unpack_from(body)
            out.append(Nack(ssrc, media, tuple(parse_nack_fci(body[8:]))))
        elif pt == PSFB and len(body) >= 8:
            ssrc, media = FEEDBACK.unpack_from(body)
            if count == FMT_PLI:
                out.append(KeyframeRequest(ssrc, (media,), fir=False))
            elif count == FMT_FIR:
                fir_ssrcs = tuple(
                    struct.unpack_from("!I", body, p)[0] for p in range(8, len(body) - 7, 8)
                )
                out.append(KeyframeRequest(ssrc, fir_ssrcs, fir=True))
            elif count == FMT_APP and body[8:12] == b"REMB" and len(body) >= 16:
                n = body[12]
                exp, mantissa = body[13] >> 2, ((body[13] & 3) << 16) | (body[14] << 8) | body[15]
                ssrcs = tuple(
                    struct.unpack_from("!I", body, 16 + 4 * i)[0]
                    for i in range(n) if 16 + 4 * i + 4 <= len(body)
                )
                out.append(Remb(ssrc, mantissa << exp, ssrcs))
        pos = end
    return out


def _packet(pt: int, count: int, body: bytes) -> bytes:
    body += b"\x00" * (-len(body) % 4)
    return HEADER.pack(0x80 | count, pt, len(body) // 4) + body


def _block(ssrc: int, r: ReceptionReport, lsr: int, dlsr: int) -> bytes:
    return REPORT_BLOCK.pack(
        ssrc, (r.fraction_lost << 24) | (r.packets_lost & 0xFFFFFF), r.highest_sequence,
        r.jitter, lsr, dlsr,
    )


def build_rr(ssrc: int, blocks: list[tuple[int, ReceptionReport, int, int]]) -> bytes:
    """RR from (media ssrc, report, lsr, dlsr) tuples; at most 31 blocks."""
    body = struct.pack("!I", ssrc) + b"".join(_block(*b) for b in blocks[:31])
    return _packet(RR, min(len(blocks), 31), body)


def build_sr(ssrc: int, info: SenderReport) -> bytes:
    body = struct.pack("!I", ssrc) + SENDER_INFO.pack(
        info.ntp_timestamp & 0xFFFFFFFFFFFFFFFF, info.rtp_timestamp & 0xFFFFFFFF,
        info.packet_count & 0xFFFFFFFF, info.octet_count & 0xFFFFFFFF,
    )
    return _packet(SR, 0, body)


def build_sdes_cname(ssrc: int, cname: str) -> bytes:
    text = cname.encode()[:255]
    chunk = struct.pack("!IBB", ssrc, 1, len(text)) + text + b"\x00"
    chunk += b"\x00" * (-len(chunk) % 4)
    return _packet(SDES, 1, chunk)


def build_nack(ssrc: int, media_ssrc: int, lost: list[int]) -> bytes:
    return _packet(RTPFB, FMT_NACK, FEEDBACK.pack(ssrc, media_ssrc) + build_nack_fci(lost))


def build_pli(ssrc: int, media_ssrc: int) -> bytes:
    return _packet(PSFB, FMT_PLI, FEEDBACK.pack(ssrc, media_ssrc))


def build_remb(ssrc: int, bitrate: int, media_ssrcs: list[int]) -> bytes:
    exp = 0
    while bitrate >> exp > 0x3FFFF:
        exp += 1
    mantissa = bitrate >> exp
    body = FEEDBACK.pack(ssrc, 0) + b"REMB" + bytes(
        [len(media_ssrcs), (exp << 2) | (mantissa >> 16), (mantissa >> 8) & 0xFF, mantissa & 0xFF]
    ) + b"".join(struct.pack("!I", s) for s in media_ssrcs)
    return _packet(PSFB, FMT_APP, body)
