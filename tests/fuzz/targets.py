"""What each fuzz target feeds the product, and what it must never do in return.

A target takes one input (bytes) and drives one entry point the network or an HTTP client can
reach. The contract is the product's: refuse bad input with its own error type (a subclass of
``BadInput``, which the HTTP layer turns into a 4xx and the UDP paths into a counter), never
with anything else, and never hang. Any other exception escaping a target is a finding.

Stateful paths take a sequence of datagrams: the input is cut into frames by a length byte each
(:func:`frames`), so one input is a whole exchange (announces, syncs and follow-ups; media and
reports) and the fuzzer can grow it one message at a time.

``seeds`` are valid inputs built with the product's own serializers: they start the fuzzer
inside the formats instead of outside them.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import msgpack

from sfu_sidecar.captions import model, webvtt
from sfu_sidecar.captions.routes import _decode_json, _decode_msgpack
from sfu_sidecar.clock import exchange, ntp, ptp, ptpmsg
from sfu_sidecar.exceptions import BadInput
from sfu_sidecar.ntptime import unix_ns_to_ntp
from sfu_sidecar.relay import rtcp, sdp
from sfu_sidecar.relay.forwarder import OutputConfig, TrackForwarder, ViewerOutput
from sfu_sidecar.relay.hooks import PacketInfo
from sfu_sidecar.relay.offer_check import validate_offer
from sfu_sidecar.relay.packet import RtpPacket
from sfu_sidecar.relay.receiver import PublisherReceiver, PublisherTrack, SessionCounters
from sfu_sidecar.relay.sdp import CodecInfo
from sfu_sidecar.relay.upstream import NackGenerator, ReceiveStatistics
from sfu_sidecar.sync import wire
from sfu_sidecar.sync.abscapture import ABS_CAPTURE_TIME_URI, AbsCaptureTime
from sfu_sidecar.sync.feed import PublisherSync
from tests.fuzz import http_targets

NS = 1_000_000_000
MS = 1_000_000
T0 = 1_800_000_000 * NS  # a house time in 2027: NTP-era arithmetic is exercised for real


@dataclass(frozen=True)
class Target:
    name: str
    run: Callable[[bytes], None]
    seeds: Callable[[], list[bytes]]
    what: str


def frames(data: bytes) -> Iterator[bytes]:
    """``data`` as datagrams: each is a length byte followed by that many bytes (fewer at the
    end). Short enough for a PTP or NTP packet, an RTP packet of a small frame, an RTCP
    compound."""
    pos = 0
    while pos < len(data):
        size = data[pos]
        yield data[pos + 1 : pos + 1 + size]
        pos += 1 + size


def framed(datagrams: list[bytes]) -> bytes:
    out = bytearray()
    for d in datagrams:
        d = d[:255]
        out += bytes([len(d)]) + d
    return bytes(out)


# --- PTP --------------------------------------------------------------------------------------

MASTER = ptpmsg.PortIdentity(bytes.fromhex("0011223344556677"), 1)


def _ptp_header(kind: ptpmsg.MessageType, seq: int, two_step: bool = False) -> ptpmsg.Header:
    flags = ptpmsg.Flag.TWO_STEP if two_step else ptpmsg.Flag(0)
    return ptpmsg.Header(kind, 0, flags, 0, MASTER, seq, 0)  # domain 0, no correction


def ptp_target(data: bytes) -> None:
    """A slave's event and general ports: every datagram, in order, one second apart."""
    slave = ptp.PtpSlave(bytes.fromhex("aabbccddeeff0011"))
    now = T0
    for i, datagram in enumerate(frames(data)):
        now += NS
        with contextlib.suppress(ptpmsg.PtpError):
            slave.receive(datagram, now if i % 3 != 2 else None, now)
        slave.poll(now)


def ptp_seeds() -> list[bytes]:
    announce = ptpmsg.Announce(
        _ptp_header(ptpmsg.MessageType.ANNOUNCE, 1), ptpmsg.Timestamp(0, 0), 37, 128,
        ptpmsg.ClockQuality(6, 0x21, 0x4E5D), 128, MASTER.clock_identity, 0, 0xA0)
    sync = ptpmsg.Sync(_ptp_header(ptpmsg.MessageType.SYNC, 1, True), ptpmsg.Timestamp(0, 0))
    follow = ptpmsg.FollowUp(_ptp_header(ptpmsg.MessageType.FOLLOW_UP, 1),
                          ptpmsg.Timestamp.from_ns(T0 + NS))
    return [framed([m.serialize() for m in (announce, announce, sync, follow)])]


# --- SNTP -------------------------------------------------------------------------------------


def sntp_target(data: bytes) -> None:
    """Replies to the client's requests, from a server or from anyone who saw the request (an
    on-path sender copies its transmit timestamp into the reply's origin)."""
    client = ntp.SntpClient()
    now = T0
    for datagram in frames(data):
        now += NS
        request = client.request(now)
        reply = bytearray(datagram)
        if len(reply) >= 48 and reply[0] & 0x80:
            reply[24:32] = request[40:48]
        with contextlib.suppress(ntp.NtpError):
            client.response(bytes(reply), now + 5 * MS)


def sntp_seeds() -> list[bytes]:
    reply = ntp.NtpPacket(0, 4, ntp.Mode.SERVER, 2, 4, -20, 0, 0, b"GPS\0",
                          unix_ns_to_ntp(T0), 0, unix_ns_to_ntp(T0), unix_ns_to_ntp(T0))
    data = bytearray(reply.serialize())
    data[0] |= 0x80  # marks "copy the origin": leap bits 2 = a leap second pending, still valid
    return [framed([bytes(data)] * 3)]


# --- RTP and RTCP from a publisher -------------------------------------------------------------

VP8 = CodecInfo(96, "vp8", 90000, None, {})
OPUS = CodecInfo(111, "opus", 48000, 2, {})
ACT_ID, VIDEO_SSRC, AUDIO_SSRC, RTX_SSRC = 3, 0x1111, 0x2222, 0x3333
VIEWER_SSRC = {"video": 5, "audio": 6}


def _publisher() -> tuple[PublisherReceiver, PublisherSync, list[ViewerOutput]]:
    sync = PublisherSync()

    def observe(info: PacketInfo) -> None:
        sync.on_packet(info.kind, info.ssrc, info.timestamp, info.arrival_ns, info.clock_rate,
                       info.extensions)

    rx = PublisherReceiver(0x9999, SessionCounters(), on_packet=observe)
    outputs = []
    for kind, codec, rtx in (("video", VP8, 97), ("audio", OPUS, None)):
        fw = TrackForwarder(kind, codec.name, codec.clock_rate)
        fw.set_source({ACT_ID: ABS_CAPTURE_TIME_URI}, codec.name, codec.clock_rate)
        output = ViewerOutput("v", kind, OutputConfig(ssrc=VIEWER_SSRC[kind], payload_type=100),
                              seq_base=0, ts_base=0)
        fw.add_output(output)
        outputs.append(output)
        rx.add_track(PublisherTrack(
            kind=kind, mid=kind, codec=codec, rtx_payload_type=rtx, forwarder=fw,
            stats=ReceiveStatistics(codec.clock_rate), nack=NackGenerator(),
            extensions={ABS_CAPTURE_TIME_URI: ACT_ID}, rtx_ssrcs={RTX_SSRC: VIDEO_SSRC}))
    return rx, sync, outputs


def rtp_target(data: bytes) -> None:
    """Datagrams 10 ms apart, demultiplexed as RFC 5761 says (payload types 192-223 are
    RTCP): RTP from a publisher through the receive path and the capture-time mapping of both
    tracks; RTCP alternately from the publisher (sender reports into the mapping) and from a
    viewer (NACKs answered from the forwarders' history)."""
    rx, sync, outputs = _publisher()
    now = T0
    rtcp_seen = 0
    for datagram in frames(data):
        now += 10 * MS
        if len(datagram) >= 2 and 192 <= datagram[1] <= 223:
            rtcp_seen += 1
            if rtcp_seen % 2:
                for track, report in rx.receive_rtcp(datagram, now):
                    sync.on_sender_report(track.kind, report.ntp_timestamp,
                                          report.rtp_timestamp, now, track.media_ssrc)
            else:
                _viewer_rtcp(rx, outputs, datagram, now)
        else:
            rx.receive_rtp(datagram, now, now // MS)
        rx.tick(now)
        rx.receiver_report(now)
        rx.data_to_send()


def _viewer_rtcp(rx: PublisherReceiver, outputs: list[ViewerOutput], datagram: bytes,
                 now: int) -> None:
    try:
        messages = rtcp.parse_compound(datagram, now)
    except ValueError:
        return  # the viewer session counts it (rtcp_errors)
    for msg in messages:
        if isinstance(msg, rtcp.Nack):
            for output, track in zip(outputs, rx.tracks, strict=True):
                if output.config.ssrc == msg.media_ssrc:
                    track.forwarder.retransmit(output, list(msg.lost), now)


def rtp_seeds() -> list[bytes]:
    act = AbsCaptureTime(unix_ns_to_ntp(T0), None).serialize()
    packets = []
    for i in range(4):
        key = bytes([0x10, 0x00, 0x9D, 0x01, 0x2A]) if i == 0 else bytes([0x10, 0x01, 0x00])
        packets.append(RtpPacket(96, 100 + i, 3000 * i, VIDEO_SSRC, True, key,
                                 ((ACT_ID, act),)).serialize())
        packets.append(RtpPacket(111, 200 + i, 960 * i, AUDIO_SSRC, True, b"\xfc\xff",
                                 ()).serialize())
    sr = rtcp.SenderReport(unix_ns_to_ntp(T0), 0, 4, 400)
    packets.append(rtcp.build_sr(VIDEO_SSRC, sr) + rtcp.build_sdes_cname(VIDEO_SSRC, "x"))
    packets.append(rtcp.build_nack(0x4444, VIEWER_SSRC["video"], [1, 2, 40]))
    return [framed(packets)]


# --- the sync DataChannel ---------------------------------------------------------------------


def sync_wire_target(data: bytes) -> None:
    """One message from a viewer or publisher. A control message that decodes must encode
    back to a message that decodes to the same value."""
    try:
        message = wire.parse_message(data)
    except wire.SyncWireError:
        return
    if isinstance(message, wire.ControlMessage):
        assert wire.parse_message(message.serialize()) == message, message


def sync_wire_seeds() -> list[bytes]:
    out = [wire.ControlMessage(c).serialize() for c in (
        exchange.ClockReq(t1=T0), exchange.ClockResp(t1=T0, t2=T0 + 5, t3=T0 + 9),
        exchange.ClockReport(offset_ns=-1234, error_ns=400, rtt_ns=90000),
    )]
    return out


# --- clock joins over the WebSocket ------------------------------------------------------------


def clock_join_target(data: bytes) -> None:
    """A clock-join message as text (JSON) or binary (msgpack) WebSocket frame."""
    try:
        if data[:1] == b"{":
            exchange.decode_json(data.decode("utf-8", "replace"))
        else:
            exchange.decode_msgpack(data)
    except exchange.ExchangeError:
        pass


def clock_join_seeds() -> list[bytes]:
    req = exchange.ClockReq(t1=T0)
    return [exchange.encode_json(req).encode(), exchange.encode_msgpack(req)]


# --- WebVTT -----------------------------------------------------------------------------------


def webvtt_target(data: bytes) -> None:
    """A whole file, and the same bytes fed in two pieces cut where the first byte says: the
    incremental parser must find the same cues either way, and the file the serializer writes
    from them must parse back to them."""
    try:
        whole = webvtt.parse(data)
    except webvtt.InvalidWebVTT:
        whole = None
    cut = data[0] % (len(data) + 1) if data else 0
    parser = webvtt.WebVTTParser()
    pieces = webvtt.ParseResult()
    try:
        pieces.add(parser.feed(data[:cut]))
        pieces.add(parser.feed(data[cut:]))
        pieces.add(parser.close())
    except webvtt.InvalidWebVTT:
        assert whole is None, "the pieces were refused, the whole file was not"
        return
    assert whole is not None, "the whole file was refused, its pieces were not"
    assert pieces.cues == whole.cues
    # What the service serves is serialized from parsed cues: it must read back as the same.
    again = webvtt.parse(webvtt.serialize(whole.cues, regions=whole.regions))
    assert again.cues == whole.cues, (again.cues, whole.cues)


def webvtt_seeds() -> list[bytes]:
    return [
        b"WEBVTT\n\nREGION\nid:r1 width:40% lines:3\n\n00:00:01.000 --> 00:00:02.500 "
        b"region:r1 align:start\nhello <b>there</b>\n\nid2\n00:01.000 --> 00:03.000\nsecond\n",
        "\ufeffWEBVTT - t\r\n\r\nNOTE x\r\n\r\n01:00:00.000 --> 01:00:01.000 line:0\r\n\u00e9\r\n"
        .encode(),
    ]


# --- caption ingest ---------------------------------------------------------------------------

def _ingest(decode: Callable[[bytes], object]) -> Callable[[bytes], None]:
    def run(data: bytes) -> None:
        with contextlib.suppress(BadInput):
            model.parse_json_batch(decode(data))
    return run


def caption_json_seeds() -> list[bytes]:
    doc = {"timebase": "house_ns", "lang": "en", "cues": [
        {"id": "a", "start": T0, "end": T0 + NS, "text": "hello"},
        {"start": T0 + NS, "end": T0 + 2 * NS, "text": "<b>hallo</b>", "final": False},
    ]}
    short = {"timebase": "stream_s", "lang": "de", "cues": [{"start": 1.5, "end": 2, "text": "x"}]}
    return [json.dumps(doc).encode(), json.dumps(short).encode()]


def caption_msgpack_seeds() -> list[bytes]:
    return [msgpack.packb(json.loads(s)) for s in caption_json_seeds()]


def caption_vtt_target(data: bytes) -> None:
    with contextlib.suppress(BadInput):
        model.parse_vtt_batch(data, "en")


# --- signalling -------------------------------------------------------------------------------

def sdp_target(data: bytes) -> None:
    """An offer as WHIP or WHEP read it: the shape checks, then the relay's reading of it
    (aiortc's parser, whose own exceptions it turns into a refusal), then what it can serve.
    Each step accepts or refuses with a reason."""
    text = data.decode("utf-8", "replace")
    with contextlib.suppress(BadInput):
        desc = sdp.parse(validate_offer(text), what="offer")
        sdp.check_offer(desc, publishing=data[-1:] in (b"\n", b"\r"))


def sdp_seeds() -> list[bytes]:
    from tests.fuzz.offers import OFFERS

    return [o.encode() for o in OFFERS]


def trickle_target(data: bytes) -> None:
    with contextlib.suppress(BadInput):
        sdp.parse_trickle(data.decode("utf-8", "replace"))


def trickle_seeds() -> list[bytes]:
    return [b"a=ice-ufrag:abcd\r\na=ice-pwd:0123456789abcdef012345\r\nm=audio 9 RTP/AVP 0\r\n"
            b"a=mid:0\r\na=candidate:1 1 udp 2130706431 127.0.0.1 40000 typ host\r\n"
            b"a=end-of-candidates\r\n"]


TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("ptp", ptp_target, ptp_seeds, "PTP messages into a slave port"),
    Target("sntp", sntp_target, sntp_seeds, "SNTP replies to the client"),
    Target("rtp-rtcp", rtp_target, rtp_seeds,
           "RTP and RTCP from a publisher (receive path, capture mapping) and RTCP from a viewer"),
    Target("sync-wire", sync_wire_target, sync_wire_seeds,
           "sync DataChannel messages (clock joins, reports, telemetry)"),
    Target("clock-join", clock_join_target, clock_join_seeds,
           "clock-join messages over the WebSocket (JSON and msgpack)"),
    Target("webvtt", webvtt_target, webvtt_seeds, "WebVTT, whole and in two pieces"),
    Target("caption-json", _ingest(_decode_json), caption_json_seeds, "caption ingest, JSON"),
    Target("caption-msgpack", _ingest(_decode_msgpack), caption_msgpack_seeds,
           "caption ingest, msgpack"),
    Target("caption-vtt", caption_vtt_target, webvtt_seeds, "caption ingest, text/vtt"),
    Target("sdp", sdp_target, sdp_seeds, "WHIP and WHEP offers, checked and parsed"),
    Target("trickle", trickle_target, trickle_seeds, "trickle ICE fragments (PATCH bodies)"),
    Target("http", http_targets.http_target, http_targets.http_seeds,
           "every route: methods, path segments, query parameters, headers, bodies"),
    Target("whip-whep", http_targets.offer_target, http_targets.offer_seeds,
           "offers POSTed to WHIP and WHEP, answered sessions deleted"),
)}
