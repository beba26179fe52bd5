"""Shape checks on a WHIP/WHEP SDP offer, before aiortc sees any of it.

aiortc parses and negotiates what it is given on the assumption that the offer is well formed.
Some malformed offers it parses without complaint and then fails on deep inside negotiation: a
media section without a direction attribute makes ``createAnswer`` look up ``None`` in its
direction table, an ``m=`` line of an unknown kind is answered as if it were a data channel
that does not exist, a BUNDLE group naming a mid no section has leaves the bundled sections
without a transport. Those are the other side's faults, so they are refused here with a reason
(400), checked on the text line by line, never by asking aiortc.

What is checked (RFC 8866 for the syntax, RFC 8829 for what a JSEP offer always carries):

* size: at most ``max_lines`` lines (:data:`MAX_LINES` unless the service's setting says
  otherwise) of at most :data:`MAX_LINE_CHARS` characters;
* syntax: ``v=0`` first, then only ``<letter>=<value>`` lines; a connection line is
  ``c=IN IP4|IP6 <address>`` (RFC 8866 5.7), the only form aiortc reads;
* m-lines: 1 to :data:`MAX_MEDIA_SECTIONS` of them, each ``m=<kind> <port> <proto> <fmt>...``
  with kind audio, video or application (at most one application), a port 0-65535 and, for
  audio and video, payload types 0-127 outside the RTCP-conflict range 72-76 (RFC 5761 4);
* per section: one ``a=mid``, unique in the offer; for audio and video exactly one direction
  attribute, at least one ``a=rtpmap`` (codecs present), each for a payload type the m-line
  lists, and well-formed ``a=rtpmap``, ``a=fmtp``, ``a=rtcp-fb``, ``a=extmap``, ``a=ssrc`` and
  ``a=ssrc-group`` lines;
* candidates: ``a=candidate`` lines have the RFC 8839 5.1 fields (foundation, component,
  transport, priority, address, port, ``typ`` and a type) with numbers where numbers belong,
  ``rport`` included;
* BUNDLE: every mid a ``a=group:BUNDLE`` names belongs to an m-line;
* transport: ICE credentials (ice-chars, at most 256), ``a=setup`` and a DTLS fingerprint with
  a hash this server can verify, in the section or at session level.

Lines are read stripped of surrounding whitespace, and the offer :func:`validate_offer` returns
is those lines: what is handed on to aiortc is exactly what was checked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sfu_sidecar.exceptions import BadInput

# A browser's offer with audio, video, a data channel, RTX and a dozen codecs is a few hundred
# lines; this leaves room for many candidates and none for a flood.
MAX_LINES = 2000
# The longest lines of real offers (fmtp, candidates, ssrc msid) are a few hundred characters.
MAX_LINE_CHARS = 4096
# One audio, one video and one data channel are served; a few more are refused by the
# per-kind check with a better reason, anything beyond this is refused here.
MAX_MEDIA_SECTIONS = 16
MAX_MID_CHARS = 64
# RFC 8839 5.4: ice-ufrag is 4-256 ice-chars and ice-pwd 22-256; only the upper bound is
# enforced, so a peer with short credentials still connects. The characters are enforced: the
# ufrag names the ICE session in the answer's ETag header, which aiohttp refuses to write with a
# control character in it, dropping the connection unanswered.
MAX_ICE_CHARS = 256

KINDS = ("audio", "video", "application")
DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")
SETUP_VALUES = ("actpass", "active", "passive")
# RFC 5761 4: under rtcp-mux, payload types 72-76 read as RTCP packet types 200-204.
RTCP_CONFLICT_PTS = range(72, 77)
# Fingerprint hashes the DTLS layer verifies, with their digest sizes in bytes.
FINGERPRINT_BYTES = {"sha-256": 32, "sha-384": 48, "sha-512": 64}
# fmtp parameters the SDP parser reads as integers.
INT_FMTP_PARAMETERS = frozenset(
    ("apt", "max-fr", "max-fs", "maxplaybackrate", "minptime", "stereo", "useinbandfec")
)

_LINE = re.compile(r"[a-z]=")
_M_LINE = re.compile(r"m=(\S+) ([0-9]{1,5})(?:/[0-9]{1,5})? ([A-Z/]+)((?: \S+)+)")
_UINT = re.compile(r"[0-9]{1,10}")
_RTPMAP = re.compile(r"([0-9]{1,3}) ([^/\s]+)/([0-9]{1,9})(?:/([0-9]{1,3}))?")
_FMTP = re.compile(r"([0-9]{1,3}) (\S.*)")
_RTCP_FB = re.compile(r"(\*|[0-9]{1,3}) \S+(?: \S.*)?")
_EXTMAP = re.compile(r"([0-9]{1,3})(?:/(?:sendrecv|sendonly|recvonly|inactive))? (\S+)")
_SSRC = re.compile(r"([0-9]{1,10}) ([^:\s]+)(?::.*)?")
_FINGERPRINT = re.compile(r"(\S+) ((?:[0-9A-Fa-f]{2})(?::[0-9A-Fa-f]{2})*)")
_MID = re.compile(r"\S+")
_ICE_CHARS = re.compile(r"[A-Za-z0-9+/]+")
_CONNECTION = re.compile(r"IN IP[46] [^ ]+")
_CANDIDATE = re.compile(r"\S{1,32} [0-9]{1,3} \S+ [0-9]{1,10} \S+ [0-9]{1,5} typ \S+((?: \S+)*)")


@dataclass
class _Section:
    """One ``m=`` section (or the session part) as raw attribute lines."""

    index: int
    kind: str = ""
    fmts: tuple[str, ...] = ()
    attributes: list[tuple[str, str | None]] = field(default_factory=list)

    def values(self, name: str) -> list[str | None]:
        return [value for attr, value in self.attributes if attr == name]

    def where(self) -> str:
        return f"m-line {self.index} ({self.kind})"


def validate_offer(text: str, max_lines: int = MAX_LINES) -> str:
    """Raise :class:`BadInput` with a reason unless ``text`` is an offer aiortc can take; return
    the offer as checked, which is what must be handed on.

    The lines are checked stripped of surrounding whitespace, which aiortc keeps: to it
    ``a=sendonly`` with a trailing tab is an unknown attribute, leaving the section without a
    direction. So the offer returned is the checked lines, stripped, blank ones dropped, joined
    with CRLF: aiortc reads exactly what passed here. ``max_lines`` is the service's
    ``max_sdp_lines`` setting.
    """
    lines = text.splitlines()
    if len(lines) > max_lines:
        raise BadInput(f"offer has {len(lines)} lines; at most {max_lines} are accepted "
                       "(setting max_sdp_lines)")
    session = _Section(-1)
    sections: list[_Section] = []
    seen_version = False
    checked: list[str] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if len(line) > MAX_LINE_CHARS:
            raise BadInput(f"offer line {number} is over {MAX_LINE_CHARS} characters")
        if not line:
            continue
        checked.append(line)
        if not seen_version:
            if line != "v=0":
                raise BadInput("offer must start with v=0")
            seen_version = True
            continue
        if _LINE.match(line) is None:
            raise BadInput(f"offer line {number} is not <type>=<value>: {line[:60]!r}")
        if line.startswith("c=") and _CONNECTION.fullmatch(line[2:]) is None:
            raise BadInput(f"offer line {number} is not c=IN IP4|IP6 <address>: {line[:60]!r}")
        if line.startswith("a=candidate:"):
            _check_candidate(number, line)
        if line.startswith("m="):
            if len(sections) == MAX_MEDIA_SECTIONS:
                raise BadInput(f"offer has more than {MAX_MEDIA_SECTIONS} m-lines")
            sections.append(_media_section(len(sections), line))
        elif line.startswith("a="):
            name, colon, value = line[2:].partition(":")
            (sections[-1] if sections else session).attributes.append(
                (name, value if colon else None)
            )
    if not seen_version:
        raise BadInput("offer must start with v=0")
    if not sections:
        raise BadInput("offer has no audio or video m-line")
    if sum(1 for s in sections if s.kind == "application") > 1:
        raise BadInput("offer has more than one application m-line; one data channel is served")
    mids: set[str] = set()
    for section in sections:
        mid = _check_section(section, session)
        if mid in mids:
            raise BadInput(f"{section.where()} repeats a=mid:{mid}")
        mids.add(mid)
    for group in session.values("group"):
        semantic, *items = (group or "").split() or [""]
        # aiortc moves every bundled section onto the first mid's transport; a mid that names
        # no section leaves them with no transport at all.
        unknown = [item for item in items if item not in mids]
        if semantic == "BUNDLE" and unknown:
            raise BadInput(f"a=group:BUNDLE names mid {unknown[0][:20]} that no m-line has")
    return "\r\n".join(checked) + "\r\n"


def _check_candidate(number: int, line: str) -> None:
    m = _CANDIDATE.fullmatch(line[len("a=candidate:") :])
    extensions = m.group(1).split() if m else []
    ports = [value for name, value in zip(extensions[::2], extensions[1::2], strict=False)
             if name == "rport"]
    if m is None or not all(_UINT.fullmatch(p) for p in ports):
        raise BadInput(f"offer line {number} is not a=candidate:<foundation> <component> "
                       f"<transport> <priority> <address> <port> typ <type>: {line[:80]!r}")


def _media_section(index: int, line: str) -> _Section:
    m = _M_LINE.fullmatch(line)
    if m is None:
        raise BadInput(f"m-line {index} is not m=<kind> <port> <proto> <formats>: {line[:60]!r}")
    kind, port, fmts = m.group(1), int(m.group(2)), tuple(m.group(4).split())
    section = _Section(index, kind, fmts)
    if kind not in KINDS:
        raise BadInput(f"{section.where()}: only audio, video and application m-lines are served")
    if port > 65535:
        raise BadInput(f"{section.where()}: port {port} is not 0-65535")
    if kind != "application":
        for fmt in fmts:
            if not _UINT.fullmatch(fmt) or int(fmt) > 127 or int(fmt) in RTCP_CONFLICT_PTS:
                raise BadInput(
                    f"{section.where()}: payload type {fmt[:20]!r} is not 0-127 "
                    "(72-76 excluded)"
                )
    return section


def _one(section: _Section, session: _Section, name: str) -> str:
    """The section's value of ``name``, else the session's; refuse a missing or empty one."""
    values = section.values(name) or session.values(name)
    value = values[-1] if values else None
    if not value:
        raise BadInput(f"{section.where()} has no a={name}")
    return value


def _check_section(section: _Section, session: _Section) -> str:
    """Check one m-section's attributes; return its mid."""
    mids = section.values("mid")
    if len(mids) != 1 or not mids[0] or _MID.fullmatch(mids[0]) is None:
        raise BadInput(f"{section.where()} needs exactly one a=mid with a non-empty token")
    mid = mids[0]
    if len(mid) > MAX_MID_CHARS:
        raise BadInput(f"{section.where()}: a=mid is over {MAX_MID_CHARS} characters")
    for name in ("ice-ufrag", "ice-pwd"):
        value = _one(section, session, name)
        if len(value) > MAX_ICE_CHARS:
            raise BadInput(f"{section.where()}: a={name} is over {MAX_ICE_CHARS} characters")
        check_ice_chars(section.where(), name, value)
    setup = _one(section, session, "setup")
    if setup not in SETUP_VALUES:
        raise BadInput(f"{section.where()}: a=setup:{setup[:20]} is not one of "
                       f"{', '.join(SETUP_VALUES)}")
    _check_fingerprints(section, session)
    if section.kind != "application":
        _check_rtp(section)
    return mid


def check_ice_chars(where: str, name: str, value: str) -> None:
    """BadInput unless an ICE ufrag or password is made of RFC 8839 ice-chars only."""
    if _ICE_CHARS.fullmatch(value) is None:
        raise BadInput(f"{where}: a={name} may hold only letters, digits, '+' and '/' "
                       "(RFC 8839 ice-char)")


def _check_fingerprints(section: _Section, session: _Section) -> None:
    values = section.values("fingerprint") or session.values("fingerprint")
    usable = 0
    for value in values:
        m = _FINGERPRINT.fullmatch(value or "")
        if m is None:
            raise BadInput(f"{section.where()}: a=fingerprint is not <hash> <hex:hex:...>")
        size = FINGERPRINT_BYTES.get(m.group(1).lower())
        if size is not None:
            if (len(m.group(2)) + 1) // 3 != size:
                raise BadInput(f"{section.where()}: {m.group(1)} fingerprint is not {size} bytes")
            usable += 1
    if not usable:
        raise BadInput(
            f"{section.where()} has no DTLS fingerprint this server can verify "
            f"({', '.join(FINGERPRINT_BYTES)})"
        )


def _check_rtp(section: _Section) -> None:
    where = section.where()
    directions = [attr for attr, _ in section.attributes if attr in DIRECTIONS]
    if len(directions) != 1:
        raise BadInput(
            f"{where} needs exactly one direction attribute (a={', a='.join(DIRECTIONS)}); "
            f"found {len(directions)}"
        )
    listed = {str(int(f)) for f in section.fmts}
    mapped: set[str] = set()
    for attr, value in section.attributes:
        text = value or ""
        if attr == "rtpmap":
            m = _RTPMAP.fullmatch(text)
            if m is None or int(m.group(3)) == 0 or m.group(4) == "0":
                raise BadInput(f"{where}: a=rtpmap:{text[:40]} is not <pt> <name>/<rate>[/<ch>]")
            pt = str(int(m.group(1)))
            if pt not in listed:
                raise BadInput(f"{where}: a=rtpmap for payload type {pt}, which the m-line "
                               "does not list")
            mapped.add(pt)
        elif attr == "fmtp":
            m = _FMTP.fullmatch(text)
            if m is None:
                raise BadInput(f"{where}: a=fmtp:{text[:40]} is not <pt> <parameters>")
            _check_fmtp_parameters(where, m.group(2))
        elif attr == "rtcp-fb" and _RTCP_FB.fullmatch(text) is None:
            raise BadInput(f"{where}: a=rtcp-fb:{text[:40]} is not <pt|*> <type> [<parameter>]")
        elif attr == "extmap":
            m = _EXTMAP.fullmatch(text)
            # RFC 8285 5: ids 1-14 (one-byte header) and 1-255 (two-byte header).
            if m is None or not 1 <= int(m.group(1)) <= 255:
                raise BadInput(f"{where}: a=extmap:{text[:40]} is not <1-255> <uri>")
        elif attr == "ssrc":
            m = _SSRC.fullmatch(text)
            if m is None or int(m.group(1)) >= 2**32:
                raise BadInput(f"{where}: a=ssrc:{text[:40]} is not <32-bit ssrc> <attribute>")
        elif attr == "ssrc-group":
            items = text.split()[1:]
            if not items or any(
                _UINT.fullmatch(i) is None or int(i) >= 2**32 for i in items
            ):
                raise BadInput(f"{where}: a=ssrc-group:{text[:40]} is not <semantic> <ssrc>...")
    for attr, value in section.attributes:
        if attr == "fmtp":
            pt = str(int((value or "").split(" ", 1)[0]))
            if pt not in mapped:
                raise BadInput(f"{where}: a=fmtp for payload type {pt} that has no a=rtpmap")
    if not mapped:
        raise BadInput(f"{where} offers no codec: no a=rtpmap for its payload types")


def _check_fmtp_parameters(where: str, text: str) -> None:
    for param in text.split(";"):
        name, eq, value = param.partition("=")
        if eq and name in INT_FMTP_PARAMETERS and _UINT.fullmatch(value) is None:
            raise BadInput(f"{where}: fmtp parameter {name}={value[:20]!r} is not an integer")
