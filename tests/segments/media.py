"""Helpers for segment tests: read a concatenated init + segments file back with ffprobe."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any


def ffprobe(path: Path) -> dict[str, Any]:
    """``ffprobe -show_packets -show_streams -of json`` of ``path``."""
    exe = shutil.which("ffprobe")
    assert exe is not None, "ffprobe is needed (apt-get install ffmpeg)"
    out = subprocess.run(
        [exe, "-v", "error", "-show_packets", "-show_streams", "-of", "json", str(path)],
        check=True, capture_output=True, timeout=60,
    )
    parsed: dict[str, Any] = json.loads(out.stdout)
    return parsed


def packets_by_kind(probe: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [p for p in probe["packets"] if p["codec_type"] == kind]


def first_video_packet_per_range(
    probe: dict[str, Any], ranges: list[tuple[int, int]]
) -> list[dict[str, Any] | None]:
    """For each byte range [start, end) of the file, the first video packet stored in it."""
    video = packets_by_kind(probe, "video")
    out: list[dict[str, Any] | None] = []
    for start, end in ranges:
        inside = [p for p in video if start <= int(p["pos"]) < end]
        out.append(min(inside, key=lambda p: int(p["pos"])) if inside else None)
    return out
