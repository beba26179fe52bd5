"""The serializer: WebVTT the parser reads back to the same cues, regions and times."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal

from sfu_sidecar.captions.webvtt.model import ARROW, SIGNATURE, Region, Style, VttCue

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
