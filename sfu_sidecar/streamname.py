"""The stream-name rule, defined once for every place a stream is named.

A stream name travels in URL paths (``/whip/{stream}``, ``/captions/{stream}/...``), settings
(``push_targets``), JSON bodies (taps, GPU reports) and the caption store, so it keeps to
characters that need no escaping in any of them (RFC 3986 unreserved) and a bounded length.
"""

from __future__ import annotations

import re
from typing import TypeGuard

PATTERN = r"[A-Za-z0-9_.~-]{1,128}"
RULE = "1-128 characters of A-Z a-z 0-9 _ . ~ -"
STREAM_NAME = re.compile(PATTERN)
# The same rule as an aiohttp route variable.
ROUTE_VARIABLE = "{stream:" + PATTERN + "}"


def is_stream_name(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and STREAM_NAME.fullmatch(value) is not None
