"""WebVTT: the W3C parsing algorithm (incremental) and a serializer it reads back identically.

Section numbers refer to "WebVTT: The Web Video Text Tracks Format" (W3C CR, 2019-04-04):
6.1 file parsing and block collection, 6.2 region settings, 6.3 cue timings and settings.

The parser is a pure state machine: :meth:`WebVTTParser.feed` takes bytes or text in any chunking
and returns the blocks (cues, regions, style sheets) completed so far; :meth:`WebVTTParser.close`
ends the input. Because the algorithm only ever looks at whole lines (a line ends at LF, or at
the end of input), feeding chunks gives exactly the blocks that parsing the whole file gives.

Cue times are float seconds computed exactly as a browser computes them (6.3 "collect a WebVTT
timestamp", step 19: ``h*60*60 + m*60 + s + ms/1000``), so JSON output matches ``VTTCue``.

The file's parts are in ``model``, timestamps and settings in ``timings``, the parser in
``parser`` and the serializer in ``writer``; this package names them all.
"""

from __future__ import annotations

from sfu_sidecar.captions.webvtt.model import (
    ALIGN_VALUES,
    ARROW,
    LINE_ALIGN_VALUES,
    MAX_REGION_LINES,
    POSITION_ALIGN_VALUES,
    SIGNATURE,
    VERTICAL_VALUES,
    Block,
    InvalidWebVTT,
    ParseResult,
    Region,
    Style,
    VttCue,
    js_number,
)
from sfu_sidecar.captions.webvtt.parser import (
    WebVTTParser,
    parse,
)
from sfu_sidecar.captions.webvtt.timings import (
    collect_timestamp,
    parse_cue_settings,
    parse_percentage,
    parse_region_settings,
    parse_timings_and_settings,
)
from sfu_sidecar.captions.webvtt.writer import (
    check_cue_id,
    check_cue_text,
    format_number,
    format_settings,
    format_timestamp,
    seconds_from_ms,
    serialize,
    serialize_cue,
    serialize_region,
)

__all__ = [
    "ALIGN_VALUES",
    "ARROW",
    "LINE_ALIGN_VALUES",
    "MAX_REGION_LINES",
    "POSITION_ALIGN_VALUES",
    "SIGNATURE",
    "VERTICAL_VALUES",
    "Block",
    "InvalidWebVTT",
    "ParseResult",
    "Region",
    "Style",
    "VttCue",
    "WebVTTParser",
    "check_cue_id",
    "check_cue_text",
    "collect_timestamp",
    "format_number",
    "format_settings",
    "format_timestamp",
    "js_number",
    "parse",
    "parse_cue_settings",
    "parse_percentage",
    "parse_region_settings",
    "parse_timings_and_settings",
    "seconds_from_ms",
    "serialize",
    "serialize_cue",
    "serialize_region",
]
