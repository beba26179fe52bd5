"""6.3 and 6.2: timestamps, percentages, cue timings and settings, region settings (pure)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from sfu_sidecar.captions.webvtt.model import (
    ALIGN_VALUES,
    ARROW,
    ASCII_WS,
    LINE_ALIGN_VALUES,
    MAX_REGION_LINES,
    Region,
)

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


# --- 6.3 timestamps, percentages, settings ---------------------------------------------------


def _skip_ws(s: str, pos: int) -> int:
    while pos < len(s) and s[pos] in ASCII_WS:
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
