"""``sfu-sidecar captions check FILE``: validate a WebVTT file, print what a browser sees."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sfu_sidecar.captions.webvtt import InvalidWebVTT, parse


def check_file(path: Path) -> int:
    """Print ``{"cues": [...], "regions": [...]}`` (VTTCue / VTTRegion attribute names) on stdout.

    Exit status 0 for a WebVTT file, 1 with a one-line reason on stderr when the file cannot be
    read or is not WebVTT. Cues the algorithm skips (bad timings) are not errors, as in a browser,
    and neither are numbers past a double's range: a setting that overflows is skipped and a
    time that overflows is printed as ``"Infinity"``, as the algorithm says.
    """
    try:
        data = path.read_bytes()
    except (OSError, ValueError) as exc:  # ValueError: a name with a NUL in it
        print(f"sfu-sidecar: {path}: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        return 1
    try:
        result = parse(data)
    except InvalidWebVTT as exc:
        print(f"sfu-sidecar: {path}: not a WebVTT file: {exc.reason}", file=sys.stderr)
        return 1
    doc = {
        "cues": [cue.to_vttcue() for cue in result.cues],
        "regions": [region.to_vttregion() for region in result.regions],
    }
    json.dump(doc, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0
