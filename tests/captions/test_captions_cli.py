"""``sfu-sidecar captions check``: JSON output with VTTCue names, exit codes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import sidecar_command


def run_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*sidecar_command(), "captions", "check", str(path)],
        capture_output=True, text=True, timeout=60,
    )


def test_valid_file_prints_browser_values(tmp_path: Path) -> None:
    f = tmp_path / "a.vtt"
    f.write_bytes(
        b"\xef\xbb\xbfWEBVTT\r\n\r\nREGION\r\nid:r width:50% lines:2 scroll:up\r\n\r\n"
        b"one\r\n00:01.000 --> 00:02.500 region:r align:left\r\nHi <b>there</b>\r\n\r\n"
        b"00:00:03.000 --> 00:00:04.000 line:-2 position:10%,line-left size:80%\r\nx\r\n"
        b"\r\nskipped --> bad\r\nnot a cue\r\n"
    )
    result = run_check(f)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["regions"] == [{
        "id": "r", "width": 50, "lines": 2, "regionAnchorX": 0, "regionAnchorY": 100,
        "viewportAnchorX": 0, "viewportAnchorY": 100, "scroll": "up",
    }]
    assert doc["cues"] == [
        {"id": "one", "startTime": 1, "endTime": 2.5, "text": "Hi <b>there</b>",
         "vertical": "", "snapToLines": True, "line": "auto", "lineAlign": "start",
         "position": "auto", "positionAlign": "auto", "size": 100, "align": "left",
         "region": "r"},
        {"id": "", "startTime": 3, "endTime": 4, "text": "x", "vertical": "",
         "snapToLines": True, "line": -2, "lineAlign": "start", "position": 10,
         "positionAlign": "line-left", "size": 80, "align": "center", "region": None},
    ]


def test_invalid_file_exits_1_with_one_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.vtt"
    f.write_text("WEBVTTX\n\n00:00.000 --> 00:01.000\nx\n")
    result = run_check(f)
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a WebVTT file" in lines[0]


def test_missing_file_exits_1(tmp_path: Path) -> None:
    result = run_check(tmp_path / "none.vtt")
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1


def test_signature_only_file_is_valid_and_empty(tmp_path: Path) -> None:
    f = tmp_path / "empty.vtt"
    f.write_text("WEBVTT")
    result = run_check(f)
    assert result.returncode == 0
    assert json.loads(result.stdout) == {"cues": [], "regions": []}
