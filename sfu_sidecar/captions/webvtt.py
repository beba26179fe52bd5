"""WebVTT: the W3C parsing algorithm (incremental) and a serializer it reads back identically.

Section numbers refer to "WebVTT: The Web Video Text Tracks Format" (W3C CR, 2019-04-04):
6.1 file parsing and block collection, 6.2 region settings, 6.3 cue timings and settings.

The parser is a pure state machine: :meth:`WebVTTParser.feed` takes bytes or text in any chunking
and returns the blocks (cues, regions, style sheets) completed so far; :meth:`WebVTTParser.close`
ends the input. Because the algorithm only ever looks at whole lines (a line ends at LF, or at
the end of input), feeding chunks gives exactly the blocks that parsing the whole file gives.

Cue times are float seconds computed exactly as a browser computes them (6.3 "collect a WebVTT
timestamp", step 19: ``h*60*60 + m*60 + s + ms/1000``), so JSON output matches ``VTTCue``.
"""

from __future__ import annotations

import codecs
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from sfu_sidecar.exceptions import Unprocessable

SIGNATURE = "WEBVTT"
ARROW = "-->"

# "ASCII whitespace" of the HTML standard; Python's str.split() would also split on U+00A0 and
# other Unicode spaces, which the spec's "split a string on spaces" does not.
_ASCII_WS = "\t\n\x0c\r "
_SPLIT_WS = re.compile(r"[\t\n\x0c\r ]+")
_DIGITS = re.compile(r"[0-9]+")
# 4.x "WebVTT percentage": one or more ASCII digits, optionally "." and one or more ASCII
# digits, then "%".
_PERCENTAGE = re.compile(r"[0-9]+(?:\.[0-9]+)?%")
# 6.3 "line", non-percentage branch, steps 1-4: an optional leading "-", digits, at most one "."
# with a digit on each side.
_LINE_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")

# Significant digits past which an integer exceeds the largest double (about 1.8e308).
_DOUBLE_DIGITS = 309
MAX_REGION_LINES = 2**32 - 1

VERTICAL_VALUES = ("", "rl", "lr")
LINE_ALIGN_VALUES = ("start", "center", "end")
POSITION_ALIGN_VALUES = ("line-left", "center", "line-right", "auto")
ALIGN_VALUES = ("start", "center", "end", "left", "right")


class InvalidWebVTT(Unprocessable):
    """The input is not a WebVTT file (6.1 steps 4-6: the signature check failed)."""


@dataclass(frozen=True, slots=True)
class Region:
    """A WebVTT region (6.1 "region creation" defaults, 6.2 settings)."""

    id: str = ""
    width: float = 100.0
    lines: int = 3
    region_anchor: tuple[float, float] = (0.0, 100.0)
    viewport_anchor: tuple[float, float] = (0.0, 100.0)
    scroll: str = ""  # "" (none) or "up"

    def to_vttregion(self) -> dict[str, Any]:
        """Attribute names and values of the browser's ``VTTRegion``."""
        return {
            "id": self.id,
            "width": js_number(self.width),
            "lines": self.lines,
            "regionAnchorX": js_number(self.region_anchor[0]),
            "regionAnchorY": js_number(self.region_anchor[1]),
            "viewportAnchorX": js_number(self.viewport_anchor[0]),
            "viewportAnchorY": js_number(self.viewport_anchor[1]),
            "scroll": self.scroll,
        }


@dataclass(frozen=True, slots=True)
class VttCue:
    """A WebVTT cue with the defaults of 6.1 "cue creation". ``None`` is the spec's ``auto``.

    ``text`` is the raw cue text (``VTTCue.text``): markup and escapes stay as written.
    ``region`` is the identifier of the region the cue is attached to, if any.
    """

    id: str
    start: float
    end: float
    text: str
    vertical: str = ""
    snap_to_lines: bool = True
    line: float | None = None
    line_align: str = "start"
    position: float | None = None
    position_align: str = "auto"
    size: float = 100.0
    align: str = "center"
    region: str | None = None

    def to_vttcue(self) -> dict[str, Any]:
        """Attribute names and values of the browser's ``VTTCue`` (``region`` as its id)."""
        return {
            "id": self.id,
            "startTime": js_number(self.start),
            "endTime": js_number(self.end),
            "text": self.text,
            "vertical": self.vertical,
            "snapToLines": self.snap_to_lines,
            "line": "auto" if self.line is None else js_number(self.line),
            "lineAlign": self.line_align,
            "position": "auto" if self.position is None else js_number(self.position),
            "positionAlign": self.position_align,
            "size": js_number(self.size),
            "align": self.align,
            "region": self.region,
        }


@dataclass(frozen=True, slots=True)
class Style:
    """A STYLE block; the CSS text is kept as written (CSS parsing is the browser's job)."""

    css: str


Block = VttCue | Region | Style


@dataclass(slots=True)
class ParseResult:
    cues: list[VttCue] = field(default_factory=list)
    regions: list[Region] = field(default_factory=list)
    styles: list[Style] = field(default_factory=list)

    def add(self, blocks: Iterable[Block]) -> None:
        for block in blocks:
            if isinstance(block, VttCue):
                self.cues.append(block)
            elif isinstance(block, Region):
                self.regions.append(block)
            else:
                self.styles.append(block)


def js_number(value: float) -> float | int | str:
    """A float as JavaScript prints it in JSON: integral values without ".0".

    JSON has no infinity, so a cue time past the largest double (6.3 step 19 overflows) is
    written as JavaScript prints that number: ``"Infinity"``.
    """
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == int(value) and abs(value) < 2**53:
        return int(value)
    return value


# --- 6.3 timestamps, percentages, settings ---------------------------------------------------


def _skip_ws(s: str, pos: int) -> int:
    while pos < len(s) and s[pos] in _ASCII_WS:
        pos += 1
    return pos


def _collect_digits(s: str, pos: int) -> tuple[str, int]:
    m = _DIGITS.match(s, pos)
    if m is None:
        return "", pos
    return m.group(), m.end()


def collect_timestamp(s: str, pos: int) -> tuple[float, int] | None:
    """6.3 "collect a WebVTT timestamp" from ``s`` at ``pos``: (seconds, new pos) or None."""
    hours_first = False
    if pos >= len(s) or not "0" <= s[pos] <= "9":
        return None
    string, pos = _collect_digits(s, pos)
    value1 = _whole_number(string)
    # Step 7: anything but exactly two digits <= 59 in front must be hours.
    if len(string) != 2 or value1 > 59:
        hours_first = True
    if pos >= len(s) or s[pos] != ":":
        return None
    pos += 1
    string, pos = _collect_digits(s, pos)
    if len(string) != 2:
        return None
    value2 = int(string)
    if hours_first or (pos < len(s) and s[pos] == ":"):
        if pos >= len(s) or s[pos] != ":":
            return None
        pos += 1
        string, pos = _collect_digits(s, pos)
        if len(string) != 2:
            return None
        value3 = int(string)
    else:
        value1, value2, value3 = 0, value1, value2
    if pos >= len(s) or s[pos] != ".":
        return None
    pos += 1
    string, pos = _collect_digits(s, pos)
    if len(string) != 3:
        return None
    value4 = int(string)
    if value2 > 59 or value3 > 59:
        return None
    # Same operations in the same order as the spec, so the double equals the browser's. The
    # spec puts no bound on the hours: a sum past the largest double is +Infinity, which is
    # where a double's arithmetic ends up too (float() of so large an int raises instead).
    whole = value1 * 60 * 60 + value2 * 60 + value3
    try:
        seconds = float(whole)
    except OverflowError:
        seconds = math.inf
    return seconds + value4 / 1000, pos


def _whole_number(digits: str) -> int | float:
    """ASCII digits as an integer, or +Infinity when no double could hold it (int() refuses
    strings past a few thousand digits; past 309 significant digits a double is infinite)."""
    significant = digits.lstrip("0")
    if len(significant) > _DOUBLE_DIGITS:
        return math.inf
    return int(significant or "0")


def parse_percentage(s: str) -> float | None:
    """6.2 "parse a percentage string": a number in 0..100, or None."""
    if _PERCENTAGE.fullmatch(s) is None:
        return None
    value = float(s[:-1])
    if value < 0 or value > 100:
        return None
    return value


def _split_setting(token: str) -> tuple[str, str] | None:
    # 6.3 / 6.2 step 2.1: no colon, or the first colon first or last, skips the setting.
    colon = token.find(":")
    if colon <= 0 or colon == len(token) - 1:
        return None
    return token[:colon], token[colon + 1 :]


def _tokens(s: str) -> list[str]:
    return [t for t in _SPLIT_WS.split(s) if t]


def parse_cue_settings(
    settings: str, regions: Sequence[Region], base: dict[str, Any] | None = None
) -> dict[str, Any]:
    """6.3 "parse the WebVTT cue settings": cue field values over the "cue creation" defaults."""
    out: dict[str, Any] = {
        "vertical": "", "snap_to_lines": True, "line": None, "line_align": "start",
        "position": None, "position_align": "auto", "size": 100.0, "align": "center",
        "region": None,
    }
    if base:
        out.update(base)
    for token in _tokens(settings):
        split = _split_setting(token)
        if split is None:
            continue
        name, value = split
        if name == "region":
            found = None
            for region in regions:  # "the last WebVTT region ... whose identifier is value"
                if region.id == value:
                    found = region.id
            out["region"] = found
        elif name == "vertical":
            if value in ("rl", "lr"):
                out["vertical"] = value
            if out["vertical"]:
                out["region"] = None  # "there are no vertical regions"
        elif name == "line":
            linepos, comma, linealign = value.partition(",")
            if not any("0" <= c <= "9" for c in linepos):
                continue
            if linepos.endswith("%"):
                number = parse_percentage(linepos)
                if number is None:
                    continue
            else:
                if _LINE_NUMBER.fullmatch(linepos) is None:
                    continue
                number = float(linepos) + 0.0  # + 0.0: HTML float parsing has no -0
                # HTML "rules for parsing floating-point number values": a value that rounds
                # to +-2^1024 is an error, and an error skips the setting. float() rounds the
                # same way and gives +-inf exactly then (Chromium agrees: 2^1024 - 2^970 is
                # skipped, one less is kept as the largest double).
                if math.isinf(number):
                    continue
            if comma:
                if linealign not in LINE_ALIGN_VALUES:
                    continue
                out["line_align"] = linealign
            out["line"] = number
            out["snap_to_lines"] = not linepos.endswith("%")
            out["region"] = None  # explicitly positioned: drops out of the region
        elif name == "position":
            colpos, comma, colalign = value.partition(",")
            number = parse_percentage(colpos)
            if number is None:
                continue
            if comma:
                if colalign not in ("line-left", "center", "line-right"):
                    continue
                out["position_align"] = colalign
            out["position"] = number
        elif name == "size":
            number = parse_percentage(value)
            if number is None:
                continue
            out["size"] = number
            if number != 100:
                out["region"] = None  # explicitly sized: drops out of the region
        elif name == "align" and value in ALIGN_VALUES:
            out["align"] = value
    return out


def parse_timings_and_settings(
    line: str, regions: Sequence[Region]
) -> tuple[float, float, dict[str, Any]] | None:
    """6.3 "collect WebVTT cue timings and settings": (start, end, settings) or None."""
    pos = _skip_ws(line, 0)
    got = collect_timestamp(line, pos)
    if got is None:
        return None
    start, pos = got
    pos = _skip_ws(line, pos)
    if line[pos : pos + 3] != ARROW:
        return None
    pos = _skip_ws(line, pos + 3)
    got = collect_timestamp(line, pos)
    if got is None:
        return None
    end, pos = got
    return start, end, parse_cue_settings(line[pos:], regions)


def parse_region_settings(text: str) -> Region:
    """6.2 "collect WebVTT region settings"."""
    rid, width, lines = "", 100.0, 3
    anchor, viewport, scroll = (0.0, 100.0), (0.0, 100.0), ""
    for token in _tokens(text):
        split = _split_setting(token)
        if split is None:
            continue
        name, value = split
        if name == "id":
            rid = value
        elif name == "width":
            number = parse_percentage(value)
            if number is not None:
                width = number
        elif name == "lines":
            if _DIGITS.fullmatch(value):
                # VTTRegion.lines is an unsigned long; like Chromium's parser, a larger
                # number saturates at its maximum instead of wrapping around.
                lines = int(min(_whole_number(value), MAX_REGION_LINES))
        elif name in ("regionanchor", "viewportanchor"):
            x_text, comma, y_text = value.partition(",")
            if not comma:
                continue
            x, y = parse_percentage(x_text), parse_percentage(y_text)
            if x is None or y is None:
                continue
            if name == "regionanchor":
                anchor = (x, y)
            else:
                viewport = (x, y)
        elif name == "scroll" and value == "up":
            scroll = "up"
    return Region(rid, width, lines, anchor, viewport, scroll)


# --- 6.1 the parser --------------------------------------------------------------------------


class _BlockState:
    """Variables of 6.1 "collect a WebVTT block" between lines."""

    __slots__ = ("buffer", "cue", "in_header", "line_count", "region", "seen_arrow", "style")

    def __init__(self, in_header: bool) -> None:
        self.in_header = in_header
        self.line_count = 0
        self.buffer = ""
        self.seen_arrow = False
        self.cue: tuple[float, float, dict[str, Any], str] | None = None
        self.style = False
        self.region = False


_SIGNATURE, _AFTER_SIGNATURE, _BETWEEN, _IN_BLOCK, _DONE = range(5)
_CONTINUE, _REPROCESS, _END = range(3)


class WebVTTParser:
    """Incremental WebVTT parser (6.1). Feed bytes or text; get completed blocks back.

    Raises :class:`InvalidWebVTT` as soon as the signature is known to be wrong.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8-sig")(errors="replace")
        self._started = False
        self._skip_lf = False
        self._partial = ""
        self._state = _SIGNATURE
        self._block: _BlockState | None = None
        self._seen_cue = False
        self.regions: list[Region] = []
        self.header: list[str] = []
        self.signature_line = ""

    def feed(self, data: bytes | str) -> list[Block]:
        """Add input; return the blocks it completed, in file order."""
        if isinstance(data, bytes):
            return self._feed_text(self._decoder.decode(data), decoded=True)
        return self._feed_text(data, decoded=False)

    def close(self) -> list[Block]:
        """End of input: finish the last line and block; raise if the signature never came."""
        out = self._feed_text(self._decoder.decode(b"", final=True), decoded=True)
        if self._state == _DONE:
            return out
        line, self._partial = self._partial, ""
        out.extend(self._line(line, eof=True))
        self._state = _DONE
        return out

    # Text preprocessing of 6.1 step 1, carried across chunk boundaries.
    def _feed_text(self, text: str, *, decoded: bool) -> list[Block]:
        if self._state == _DONE and (text or not decoded):
            raise ValueError("feed() after close()")
        if not text:
            return []
        if not self._started:
            self._started = True
            if not decoded:
                # Text input skipped the UTF-8 decode that drops one leading BOM; drop it here.
                text = text.removeprefix("\ufeff")
                if not text:
                    return []
        if self._skip_lf and text[0] == "\n":
            text = text[1:]  # the LF of a CRLF split across chunks
        if not text:
            return []
        self._skip_lf = text[-1] == "\r"
        text = text.replace("\x00", "\ufffd").replace("\r\n", "\n").replace("\r", "\n")
        out: list[Block] = []
        pieces = (self._partial + text).split("\n")
        self._partial = pieces.pop()
        for line in pieces:
            out.extend(self._line(line, eof=False))
        if self._state == _SIGNATURE:
            self._check_signature(self._partial, terminated=False)
        return out

    def _check_signature(self, line: str, *, terminated: bool) -> None:
        # 6.1 steps 4-6, decided as early as the characters seen allow (live ingest rejects a
        # wrong stream at its first bytes).
        if len(line) >= 6 and not line.startswith(SIGNATURE):
            raise InvalidWebVTT(f"file does not start with {SIGNATURE!r}")
        if len(line) >= 7 and line[6] not in " \t":
            raise InvalidWebVTT(
                f"{SIGNATURE!r} must be followed by a space, a tab or a line break"
            )
        if terminated and len(line) < 6:
            raise InvalidWebVTT(f"file does not start with {SIGNATURE!r}")

    def _line(self, line: str, *, eof: bool) -> list[Block]:
        if self._state == _SIGNATURE:
            self._check_signature(line, terminated=True)
            self.signature_line = line
            self._state = _DONE if eof else _AFTER_SIGNATURE
            return []
        if self._state == _AFTER_SIGNATURE:
            # Step 11: a blank line right after the signature means no header block.
            self._state = _BETWEEN
            if line == "":
                return []
            self._block = _BlockState(in_header=True)
            self._state = _IN_BLOCK
        out: list[Block] = []
        while True:
            if self._state == _BETWEEN:
                if line == "":
                    return out  # step 14.5: LFs between blocks
                self._block = _BlockState(in_header=False)
                self._state = _IN_BLOCK
            block = self._block
            assert block is not None
            action = self._block_line(block, line)
            if action == _REPROCESS:
                # "let position be previous position and break": the line starts a new block.
                self._finish_block(block, out)
                continue
            if action == _END or eof:  # an empty line or the end of input ends the block
                self._finish_block(block, out)
            return out

    def _block_line(self, block: _BlockState, line: str) -> int:
        """One iteration of 6.1 "collect a WebVTT block" step 11."""
        block.line_count += 1
        if ARROW in line:
            if not block.in_header and (
                block.line_count == 1 or (block.line_count == 2 and not block.seen_arrow)
            ):
                block.seen_arrow = True
                parsed = parse_timings_and_settings(line, self.regions)
                if parsed is None:
                    block.cue = None
                else:
                    start, end, settings = parsed
                    block.cue = (start, end, settings, block.buffer)
                    block.buffer = ""
                    self._seen_cue = True
                return _CONTINUE
            return _REPROCESS
        if line == "":
            return _END
        if not block.in_header and block.line_count == 2 and not self._seen_cue:
            # Step 11.6.1: "STYLE" / "REGION" alone on the first line (trailing whitespace
            # allowed) makes the block a style sheet or a region, before any cue only.
            for keyword in ("STYLE", "REGION"):
                rest = block.buffer.removeprefix(keyword)
                if rest != block.buffer and all(c in _ASCII_WS for c in rest):
                    block.style = keyword == "STYLE"
                    block.region = keyword == "REGION"
                    block.buffer = ""
                    break
        if block.buffer:
            block.buffer += "\n"
        block.buffer += line
        return _CONTINUE

    def _finish_block(self, block: _BlockState, out: list[Block]) -> None:
        self._block = None
        self._state = _BETWEEN
        if block.in_header:
            self.header.extend(block.buffer.split("\n") if block.buffer else [])
            return
        if block.cue is not None:
            start, end, settings, cue_id = block.cue
            out.append(VttCue(cue_id, start, end, block.buffer, **settings))
        elif block.style:
            out.append(Style(block.buffer))
        elif block.region:
            region = parse_region_settings(block.buffer)
            self.regions.append(region)
            out.append(region)


def parse(data: bytes | str) -> ParseResult:
    """Parse a whole file. Raises :class:`InvalidWebVTT` on a bad signature."""
    parser = WebVTTParser()
    result = ParseResult()
    result.add(parser.feed(data))
    result.add(parser.close())
    return result


# --- serializer ------------------------------------------------------------------------------


def seconds_from_ms(ms: int) -> float:
    """The double a browser computes for a timestamp of ``ms`` milliseconds (6.3 step 19).

    ``ms / 1000`` can differ from it in the last bit (1.922 vs 1 + 922/1000), so every time the
    service hands out goes through here and equals what parsing its own output gives.
    """
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, millis = divmod(rest, 1000)
    return hours * 60 * 60 + minutes * 60 + secs + millis / 1000


def format_timestamp(seconds: float) -> str:
    """``HH:MM:SS.mmm`` (hours always present, at least two digits), rounded to the ms."""
    if seconds < 0:
        raise ValueError("WebVTT timestamps cannot be negative")
    ms = round(seconds * 1000)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}.{ms:03d}"


def format_number(value: float) -> str:
    """Shortest decimal that reads back as the same float, without an exponent."""
    if value == int(value):
        return str(int(value))
    return format(Decimal(repr(value)), "f")


def format_settings(cue: VttCue) -> str:
    """The cue settings list, only non-default values; ``region`` last (6.3 applies settings
    in order and ``line``/``size``/``vertical`` clear the region, so it must come after them)."""
    parts = []
    if cue.vertical:
        parts.append(f"vertical:{cue.vertical}")
    if cue.line is not None:
        pos = format_number(cue.line) + ("" if cue.snap_to_lines else "%")
        align = "" if cue.line_align == "start" else f",{cue.line_align}"
        parts.append(f"line:{pos}{align}")
    if cue.position is not None:
        align = "" if cue.position_align == "auto" else f",{cue.position_align}"
        parts.append(f"position:{format_number(cue.position)}%{align}")
    if cue.size != 100:
        parts.append(f"size:{format_number(cue.size)}%")
    if cue.align != "center":
        parts.append(f"align:{cue.align}")
    if cue.region is not None:
        parts.append(f"region:{cue.region}")
    return " ".join(parts)


def check_cue_text(text: str) -> str | None:
    """Why ``text`` cannot be cue text in a file, or None: a blank line or ``-->`` would end
    the cue early (6.1 step 11.4/11.5)."""
    if "\r" in text or "\x00" in text:
        return "cue text must not contain CR or NUL characters"
    if ARROW in text:
        return "cue text must not contain '-->' (write '--&gt;')"
    if "\n\n" in text or text.startswith("\n") or text.endswith("\n"):
        return "cue text must not contain blank lines"
    return None


def check_cue_id(cue_id: str) -> str | None:
    if "\n" in cue_id or "\r" in cue_id or ARROW in cue_id:
        return "cue id must not contain line breaks or '-->'"
    return None


def serialize_cue(cue: VttCue) -> str:
    settings = format_settings(cue)
    timing = f"{format_timestamp(cue.start)} {ARROW} {format_timestamp(cue.end)}"
    head = f"{cue.id}\n" if cue.id else ""
    return f"{head}{timing}{' ' + settings if settings else ''}\n{cue.text}\n"


def serialize_region(region: Region) -> str:
    parts = []
    if region.id:
        parts.append(f"id:{region.id}")
    parts.append(f"width:{format_number(region.width)}%")
    parts.append(f"lines:{region.lines}")
    ax, ay = region.region_anchor
    parts.append(f"regionanchor:{format_number(ax)}%,{format_number(ay)}%")
    vx, vy = region.viewport_anchor
    parts.append(f"viewportanchor:{format_number(vx)}%,{format_number(vy)}%")
    if region.scroll:
        parts.append(f"scroll:{region.scroll}")
    return "REGION\n" + " ".join(parts) + "\n"


def serialize(
    cues: Iterable[VttCue],
    *,
    regions: Iterable[Region] = (),
    styles: Iterable[Style] = (),
    header: Iterable[str] = (),
) -> str:
    """A WebVTT file. Header lines (e.g. ``X-TIMESTAMP-MAP=...``) go right after the signature.

    Raises ValueError for what no file can carry (text with blank lines or ``-->``).
    """
    parts = [SIGNATURE + "\n"]
    for line in header:
        if not line or "\n" in line or ARROW in line:
            raise ValueError(f"bad header line {line!r}")
        parts.append(line + "\n")
    parts.append("\n")
    for region in regions:
        parts.append(serialize_region(region) + "\n")
    for style in styles:
        parts.append(f"STYLE\n{style.css}\n\n")
    for cue in cues:
        reason = check_cue_text(cue.text) or check_cue_id(cue.id)
        if reason is not None:
            raise ValueError(reason)
        parts.append(serialize_cue(cue) + "\n")
    return "".join(parts)
