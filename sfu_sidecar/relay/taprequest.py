"""What a tap is asked for: a JSON request (``POST /api/taps``) or an SDP description,
checked field by field into a :class:`TapRequest` (pure; a bad field is a 400 naming it).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from sfu_sidecar import streamname
from sfu_sidecar.exceptions import BadInput
from sfu_sidecar.relay.sdp import FORWARDABLE, CodecInfo
from sfu_sidecar.streamname import is_stream_name

CLOCK_RATES = {"opus": 48000, "vp8": 90000, "vp9": 90000, "h264": 90000}
# What an H.264 tap may say about its stream: the profile viewers negotiate, and the one
# packetization mode the relay forwards.
H264_PARAMETERS = ("profile-level-id", "packetization-mode", "level-asymmetry-allowed")
DEFAULT_H264_PROFILE = "42e01f"


@dataclass(frozen=True)
class TapMedia:
    """One media a tap receives: its kind, codec and payload type, and the SSRC if known."""

    kind: str
    codec: CodecInfo
    ssrc: int | None


@dataclass(frozen=True)
class TapRequest:
    stream: str
    media: tuple[TapMedia, ...]
    source: str | None
    # "house": the sender's RTCP sender reports are on the house clock (its host keeps that
    # time, e.g. by PTP or NTP from the same source), so capture times are exact; "own" (the
    # default): an unknown clock, whose offset is estimated from arrivals and flagged.
    sender_clock: str = "own"


def check_int(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(f"{what} must be an integer")
    if not low <= value <= high:
        raise BadInput(f"{what} must be between {low} and {high}")
    return value


def check_stream(value: Any) -> str:
    if not is_stream_name(value):
        raise BadInput(f"stream must be {streamname.RULE}")
    return value


def check_address(value: str, what: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An IP address, never a name (resolving one would block the event loop, and its answer
    may change). An IPv4 peer of a dual-stack socket shows as ::ffff:a.b.c.d: it is returned
    as the IPv4 address, so the two forms compare equal."""
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        raise BadInput(f"{what} {value[:64]!r} is not an IP address") from None
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return mapped or address


def check_keys(item: dict[str, Any], allowed: tuple[str, ...], what: str) -> None:
    unknown = sorted(set(item) - set(allowed))
    if unknown:
        raise BadInput(f"{what}: unknown field(s) {', '.join(unknown)}; "
                       f"accepted: {', '.join(allowed)}")


def _media(item: Any, i: int) -> TapMedia:
    what = f"media[{i}]"
    if not isinstance(item, dict):
        raise BadInput(f"{what} must be an object")
    check_keys(item, ("kind", "codec", "payload_type", "clock_rate", "channels", "ssrc",
                 "parameters"), what)
    kind = item.get("kind")
    if kind not in FORWARDABLE:
        raise BadInput(f"{what}.kind must be audio or video")
    name = item.get("codec")
    if not isinstance(name, str) or name.lower() not in FORWARDABLE[kind]:
        raise BadInput(f"{what}.codec must be one of {', '.join(FORWARDABLE[kind])} for {kind} "
                       "(the relay never transcodes)")
    name = name.lower()
    # Dynamic payload types only: the static ones name codecs the relay does not forward, and
    # 64-95 would be taken for RTCP on a multiplexed port (RFC 5761 §4).
    pt = check_int(item.get("payload_type"), f"{what}.payload_type", 96, 127)
    rate = CLOCK_RATES[name]
    if "clock_rate" in item and check_int(item["clock_rate"], f"{what}.clock_rate", 1,
                                     1_000_000) != rate:
        raise BadInput(f"{what}.clock_rate: {name} is clocked at {rate} Hz")
    channels = 2 if name == "opus" else None
    if "channels" in item and check_int(item["channels"], f"{what}.channels", 1, 8) != channels:
        raise BadInput(f"{what}.channels: {name} has {channels or 'no'} channels in RTP")
    ssrc = None
    if item.get("ssrc") is not None:
        ssrc = check_int(item["ssrc"], f"{what}.ssrc", 0, 0xFFFFFFFF)
    parameters: dict[str, object] = {}
    given = item.get("parameters", {})
    if not isinstance(given, dict):
        raise BadInput(f"{what}.parameters must be an object")
    if given and name != "h264":
        raise BadInput(f"{what}.parameters: only h264 takes parameters")
    if name == "h264":
        check_keys(given, H264_PARAMETERS, f"{what}.parameters")
        profile = given.get("profile-level-id", DEFAULT_H264_PROFILE)
        if not isinstance(profile, str) or re.fullmatch(r"[0-9A-Fa-f]{6}", profile) is None:
            raise BadInput(f"{what}.parameters.profile-level-id must be 6 hex digits")
        if str(given.get("packetization-mode", 1)) != "1":
            raise BadInput(f"{what}.parameters.packetization-mode: only 1 is forwarded")
        parameters = {"profile-level-id": profile.lower(), "packetization-mode": 1,
                      "level-asymmetry-allowed": 1}
    return TapMedia(kind, CodecInfo(pt, name, rate, channels, parameters), ssrc)


def parse_tap_request(body: Any) -> TapRequest:
    """A ``POST /api/taps`` body, checked field by field; :class:`BadInput` says what is wrong.

    ``{"stream": NAME, "media": [{"kind", "codec", "payload_type", "clock_rate"?,
    "channels"?, "ssrc"?, "parameters"?}], "source"?: IP, "sender_clock"?: "house"|"own"}``,
    at most one media per kind.
    """
    if not isinstance(body, dict):
        raise BadInput("body must be a JSON object")
    check_keys(body, ("stream", "media", "source", "sender_clock"), "tap")
    stream = check_stream(body.get("stream"))
    items = body.get("media")
    if not isinstance(items, list) or not 1 <= len(items) <= len(FORWARDABLE):
        raise BadInput("media must be a list of one audio and/or one video description")
    media = tuple(_media(item, i) for i, item in enumerate(items))
    kinds = [m.kind for m in media]
    if len(set(kinds)) != len(kinds):
        raise BadInput("media: at most one audio and one video")
    pts = [m.codec.payload_type for m in media]
    if len(set(pts)) != len(pts):
        raise BadInput("media: each needs its own payload_type (packets are routed by it)")
    source = body.get("source")
    if source is not None:
        if not isinstance(source, str):
            raise BadInput("source must be an IP address")
        source = str(check_address(source, "source"))
    sender_clock = body.get("sender_clock", "own")
    if sender_clock not in SENDER_CLOCKS:
        raise BadInput(f"sender_clock must be one of {', '.join(SENDER_CLOCKS)}: house when the "
                       "sender's RTCP sender reports are on the house clock")
    return TapRequest(stream, media, source, sender_clock)


SENDER_CLOCKS = ("own", "house")

_SDP_RTPMAP = re.compile(r"a=rtpmap:([0-9]{1,3}) ([^/\s]+)/([0-9]{1,9})(?:/([0-9]{1,2}))?")
_SDP_FMTP = re.compile(r"a=fmtp:([0-9]{1,3}) (\S.*)")
_SDP_SSRC = re.compile(r"a=ssrc:([0-9]{1,10})(?: .*)?")


def tap_request_from_sdp(text: str, stream: str | None, source: str | None,
                         max_lines: int, sender_clock: str | None = None) -> TapRequest:
    """A tap described by the SDP a plain-RTP sender writes (``ffmpeg -sdp_file``, GStreamer,
    an SFU's PlainTransport): per audio or video m-line, the first payload type whose codec
    the relay forwards, with its ``a=fmtp`` parameters and ``a=ssrc`` when given. The ports
    and addresses in it are the sender's view and are not used; the answer names the tap's.
    The same checks as the JSON form apply to what is taken from it."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines or lines[0] != "v=0":
        raise BadInput("body is not an SDP (must start with v=0)")
    if len(lines) > max_lines:
        raise BadInput(f"SDP has {len(lines)} lines; at most {max_lines} (setting max_sdp_lines)")
    sections: list[list[str]] = []
    for line in lines:
        if line.startswith("m="):
            sections.append([line])
        elif sections:
            sections[-1].append(line)
    media: list[dict[str, Any]] = []
    for index, section in enumerate(sections):
        head = section[0][2:].split()
        if len(head) < 4 or head[0] not in FORWARDABLE:
            continue  # application and other m-lines carry nothing a tap receives
        kind, formats = head[0], head[3:]
        rtpmap = {m.group(1): m for m in map(_SDP_RTPMAP.fullmatch, section) if m is not None}
        fmtp = {m.group(1): m.group(2) for m in map(_SDP_FMTP.fullmatch, section) if m is not None}
        ssrcs = {m.group(1) for m in map(_SDP_SSRC.fullmatch, section) if m is not None}
        chosen = next((pt for pt in formats if pt in rtpmap
                       and rtpmap[pt].group(2).lower() in FORWARDABLE[kind]), None)
        if chosen is None:
            offered = ", ".join(rtpmap[pt].group(2) for pt in formats if pt in rtpmap) or "none"
            raise BadInput(f"m-line {index} ({kind}) offers no codec the relay forwards "
                           f"(offered: {offered}; forwarded: {', '.join(FORWARDABLE[kind])})")
        m = rtpmap[chosen]
        item: dict[str, Any] = {"kind": kind, "codec": m.group(2).lower(),
                                "payload_type": int(chosen), "clock_rate": int(m.group(3))}
        if m.group(4) is not None:
            item["channels"] = int(m.group(4))
        if len(ssrcs) == 1:
            item["ssrc"] = int(ssrcs.pop())
        if item["codec"] == "h264" and chosen in fmtp:
            params = dict(p.strip().partition("=")[::2] for p in fmtp[chosen].split(";"))
            item["parameters"] = {k: v for k, v in params.items() if k in H264_PARAMETERS}
        media.append(item)
    if stream is None:
        raise BadInput("an SDP tap needs its stream in the query: /api/taps?stream=NAME")
    body: dict[str, Any] = {"stream": stream, "media": media}
    if source is not None:
        body["source"] = source
    if sender_clock is not None:
        body["sender_clock"] = sender_clock
    return parse_tap_request(body)
