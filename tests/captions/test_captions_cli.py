"""``sfu-sidecar captions check``: JSON output with VTTCue names, exit codes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sfu_sidecar.cli import main
from tests.conftest import sidecar_command


def run_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*sidecar_command(), "captions", "check", str(path)],
        capture_output=True, text=True, timeout=60,
    )


@pytest.mark.system
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


@pytest.mark.system
def test_invalid_file_exits_1_with_one_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.vtt"
    f.write_text("WEBVTTX\n\n00:00.000 --> 00:01.000\nx\n")
    result = run_check(f)
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a WebVTT file" in lines[0]


@pytest.mark.system
def test_missing_file_exits_1(tmp_path: Path) -> None:
    result = run_check(tmp_path / "none.vtt")
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.system
def test_signature_only_file_is_valid_and_empty(tmp_path: Path) -> None:
    f = tmp_path / "empty.vtt"
    f.write_text("WEBVTT")
    result = run_check(f)
    assert result.returncode == 0
    assert json.loads(result.stdout) == {"cues": [], "regions": []}


@pytest.mark.system
def test_numbers_past_a_double_give_the_browser_result_not_a_traceback(tmp_path: Path) -> None:
    """`line:` with a number too large for a double is skipped (HTML float parsing fails on
    it, as in Chromium); hours past a double's range make the time Infinity."""
    f = tmp_path / "big.vtt"
    f.write_text(
        "WEBVTT\n\n"
        f"a\n00:00.000 --> 00:01.000 line:{'1' * 400}\nx\n\n"
        f"b\n00:00.000 --> 00:01.000 line:4 line:1e400 size:{'9' * 400}%\nx\n\n"
        f"c\n{'9' * 5000}:00:00.000 --> 00:02.000\nx\n"
    )
    result = run_check(f)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    cues = json.loads(result.stdout, parse_constant=strict_json)["cues"]
    assert [(c["id"], c["line"], c["size"]) for c in cues] == [
        ("a", "auto", 100), ("b", 4, 100), ("c", "auto", 100)
    ]
    assert (cues[2]["startTime"], cues[2]["endTime"]) == ("Infinity", 2)


def strict_json(name: str) -> None:
    raise AssertionError(f"{name} is not JSON")


def test_a_nul_in_the_file_name_exits_1_with_a_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["captions", "check", "a\x00b.vtt"]) == 1
    err = capsys.readouterr().err
    assert "null" in err and "Traceback" not in err
