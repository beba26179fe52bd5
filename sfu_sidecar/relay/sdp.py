"""SDP as WHIP/WHEP see it: validate offers, summarise what was negotiated, trickle fragments.

Built on ``aiortc.sdp`` (the parser aiortc itself applies), so what we check is what aiortc will do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiortc import RTCIceCandidate
from aiortc import sdp as aiosdp

from sfu_sidecar.exceptions import BadInput, NotAcceptable, Unprocessable
from sfu_sidecar.relay.offer_check import check_ice_chars

# The codecs the relay forwards; anything else would need transcoding, which it never does.
FORWARDABLE: dict[str, tuple[str, ...]] = {"audio": ("opus",), "video": ("vp8", "vp9", "h264")}
ACCEPTED_TEXT = "VP8, VP9 (profile 0), H.264 (packetization-mode=1) and Opus"


@dataclass(frozen=True, slots=True)
class CodecInfo:
    payload_type: int
    name: str  # lower case: "vp8", "h264", "opus", "rtx", ...
    clock_rate: int
    channels: int | None
    parameters: dict[str, object]

    @property
    def forwardable(self) -> bool:
        if self.name == "h264":
            return str(self.parameters.get("packetization-mode", "0")) == "1"
        if self.name == "vp9":
            # Profile 0 (8-bit 4:2:0), the one every VP9 decoder has (RFC 9628 §6): the relay
            # answers for one profile, and a viewer must decode what the publisher sends.
            return str(self.parameters.get("profile-id", "0")) == "0"
        return self.name in ("opus", "vp8")


@dataclass(frozen=True, slots=True)
class MediaInfo:
    """One audio/video m-line."""

    index: int
    kind: str
    mid: str | None
    direction: str
    codecs: tuple[CodecInfo, ...]
    extensions: dict[str, int]  # uri -> id
    ssrcs: tuple[int, ...] = ()
    rtx_ssrcs: dict[int, int] = field(default_factory=dict)  # rtx ssrc -> media ssrc
    cname: str | None = None

    @property
    def primary(self) -> CodecInfo:
        """The first non-RTX codec: what flows on this m-line after negotiation."""
        return next(c for c in self.codecs if c.name not in ("rtx", "red", "ulpfec"))

    def rtx_for(self, payload_type: int) -> int | None:
        for c in self.codecs:
            if c.name == "rtx" and c.parameters.get("apt") == payload_type:
                return c.payload_type
        return None


@dataclass(frozen=True, slots=True)
class Description:
    parsed: aiosdp.SessionDescription
    media: tuple[MediaInfo, ...]
    has_application: bool
    ice_ufrag: str | None
    ice_pwd: str | None


def parse(text: str, *, what: str) -> Description:
    """Parse and sanity-check an SDP; BadInput (400) when it is not one."""
    if not text.lstrip().startswith("v=0"):
        raise BadInput(f"{what} is not an SDP (must start with v=0)")
    try:
        parsed = aiosdp.SessionDescription.parse(text)
    except (ValueError, IndexError, KeyError, StopIteration, TypeError, AttributeError,
            AssertionError) as exc:
        # aiortc's parser signals bad input with whatever its code happens to hit.
        raise BadInput(f"{what} does not parse as SDP: {exc}") from None
    media: list[MediaInfo] = []
    has_application = False
    ufrag = pwd = None
    for index, m in enumerate(parsed.media):
        if m.ice is not None:
            ufrag, pwd = m.ice.usernameFragment, m.ice.password
            # An offer's ufrag is echoed in the answer's ETag header; checked here on what
            # aiortc parsed as well, for offers that reach parse without the line checks.
            # Answers from upstream servers are taken as they come: they reach no header.
            if what == "offer":
                for name, value in (("ice-ufrag", ufrag), ("ice-pwd", pwd)):
                    if value:
                        check_ice_chars(f"{what} m-line {index}", name, value)
        if m.kind == "application":
            has_application = True
            continue
        if m.kind not in ("audio", "video"):
            continue
        if m.ice is None or not m.ice.usernameFragment or m.dtls is None:
            raise BadInput(f"{what}: m-line {index} lacks ICE credentials or a DTLS fingerprint")
        codecs = tuple(
            CodecInfo(
                c.payloadType, c.name.lower(), c.clockRate, c.channels, dict(c.parameters)
            )
            for c in m.rtp.codecs
            if c.payloadType is not None
        )
        extensions = {e.uri: e.id for e in m.rtp.headerExtensions}
        rtx_ssrcs: dict[int, int] = {}
        for group in m.ssrc_group:
            if group.semantic == "FID" and len(group.items) == 2:
                rtx_ssrcs[int(group.items[1])] = int(group.items[0])
        media.append(
            MediaInfo(
                index, m.kind, m.rtp.muxId or None, m.direction or "sendrecv", codecs,
                extensions, tuple(s.ssrc for s in m.ssrc), rtx_ssrcs,
                next((s.cname for s in m.ssrc if s.cname), None),
            )
        )
    if not media:
        raise BadInput(f"{what} has no audio or video m-line")
    return Description(parsed, tuple(media), has_application, ufrag, pwd)


def check_offer(desc: Description, *, publishing: bool) -> None:
    """Refuse offers the relay cannot serve: wrong direction, too many tracks, no usable codec."""
    seen: set[str] = set()
    for m in desc.media:
        if m.kind in seen:
            raise BadInput(f"offer has more than one {m.kind} m-line; one of each is supported")
        seen.add(m.kind)
        wanted = ("sendonly", "sendrecv") if publishing else ("recvonly", "sendrecv")
        if m.direction not in wanted:
            raise BadInput(
                f"{m.kind} m-line is {m.direction}; "
                f"{'a publisher must send' if publishing else 'a viewer must receive'}"
            )
        if not any(c.forwardable for c in m.codecs):
            offered = ", ".join(sorted({c.name for c in m.codecs})) or "none"
            raise NotAcceptable(
                f"no forwardable {m.kind} codec offered ({offered}); accepted: {ACCEPTED_TEXT}"
            )


def add_media_attributes(text: str, lines: list[str]) -> str:
    """``lines`` (``a=...``, no CRLF) appended to every audio and video m-section."""
    out: list[str] = []
    in_media = False
    for line in text.splitlines():
        if line.startswith("m="):
            if in_media:
                out.extend(lines)
            in_media = line.startswith(("m=audio", "m=video"))
        out.append(line)
    if in_media:
        out.extend(lines)
    return "\r\n".join(out) + "\r\n"


def strip_mdns_candidates(text: str) -> tuple[str, int]:
    """Drop ``a=candidate`` lines with ``.local`` hosts: we never resolve mDNS by multicast."""
    kept = []
    dropped = 0
    for line in text.splitlines(keepends=True):
        if line.startswith("a=candidate:"):
            parts = line.split()
            if len(parts) > 4 and parts[4].lower().endswith(".local"):
                dropped += 1
                continue
        kept.append(line)
    return "".join(kept), dropped


@dataclass(frozen=True, slots=True)
class Trickle:
    """A trickle-ice-sdpfrag (RFC 8840 §4.4) as sent in a WHIP/WHEP PATCH."""

    ufrag: str | None
    pwd: str | None
    candidates: tuple[RTCIceCandidate, ...]
    end_of_candidates: bool
    mdns_dropped: int


def parse_trickle(text: str) -> Trickle:
    ufrag = pwd = None
    mid: str | None = None
    index = 0
    candidates: list[RTCIceCandidate] = []
    end = False
    dropped = 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("a=ice-ufrag:"):
            ufrag = line[12:]
        elif line.startswith("a=ice-pwd:"):
            pwd = line[10:]
        elif line.startswith("m="):
            index += 1
            mid = None
        elif line.startswith("a=mid:"):
            mid = line[6:]
        elif line.startswith("a=end-of-candidates"):
            end = True
        elif line.startswith("a=candidate:"):
            try:
                cand = aiosdp.candidate_from_sdp(line[12:])
            except (ValueError, IndexError, AssertionError) as exc:
                raise BadInput(f"bad candidate line {line!r}: {exc}") from None
            if cand.ip.lower().endswith(".local"):
                dropped += 1
                continue
            cand.sdpMid = mid
            cand.sdpMLineIndex = max(index - 1, 0)
            candidates.append(cand)
        elif line.startswith(("a=group:", "a=ice-options:")):
            continue
        elif not line.startswith("a="):
            raise BadInput(f"unexpected line in trickle-ice-sdpfrag: {line[:60]!r}")
    return Trickle(ufrag, pwd, tuple(candidates), end, dropped)


def check_no_restart(trickle: Trickle, ufrag: str | None, pwd: str | None) -> None:
    """ICE restart (new credentials in a PATCH) is not supported: 422 (RFC 9725 §4.3.2)."""
    if (trickle.ufrag is not None and trickle.ufrag != ufrag) or (
        trickle.pwd is not None and trickle.pwd != pwd
    ):
        raise Unprocessable("ICE restart is not supported; start a new session")
