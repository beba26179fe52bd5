"""The WebVTT file's parts: cues, regions, style sheets, and the values their settings take."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sfu_sidecar.exceptions import Unprocessable

SIGNATURE = "WEBVTT"
ARROW = "-->"

# "ASCII whitespace" of the HTML standard; Python's str.split() would also split on U+00A0 and
# other Unicode spaces, which the spec's "split a string on spaces" does not.
ASCII_WS = "\t\n\x0c\r "
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
