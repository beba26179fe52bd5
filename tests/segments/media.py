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


def cluster_block_times(data: bytes) -> list[list[int]]:
    """Per Matroska Cluster in ``data``, its blocks' stored timecodes (cluster timecode plus
    the block's signed 16-bit offset) in byte order, as an MSE parser reads them."""

    def vint(pos: int, keep_marker: bool) -> tuple[int, int]:
        length = 9 - data[pos].bit_length()
        value = int.from_bytes(data[pos:pos + length], "big")
        return (value if keep_marker else value & ((1 << (7 * length)) - 1)), pos + length

    clusters = []
    pos = 0
    while pos < len(data):
        element, pos = vint(pos, True)
        size, pos = vint(pos, False)
        end = pos + size
        if element == 0x1F43B675:
            timecode, times, child = 0, [], pos
            while child < end:
                child_id, start = vint(child, True)
                child_size, start = vint(start, False)
                if child_id == 0xE7:
                    timecode = int.from_bytes(data[start:start + child_size], "big")
                elif child_id == 0xA3:
                    _, at = vint(start, False)  # track number
                    times.append(timecode + int.from_bytes(data[at:at + 2], "big", signed=True))
                child = start + child_size
            clusters.append(times)
        pos = end
    return clusters
