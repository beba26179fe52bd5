from __future__ import annotations

import json
import logging

import pytest

from sfu_sidecar import logs


def test_json_lines_carry_extra_fields(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("info", "json")
    logs.get("unit").info("hello %s", "world", extra={"stream": "s1"})
    logs.get("unit").debug("below threshold")
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["msg"] == "hello world"
    assert record["logger"] == "sfu_sidecar.unit"
    assert record["level"] == "info"
    assert record["stream"] == "s1"


def test_text_lines(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("debug", "text")
    logs.get("unit").warning("careful", extra={"peer": "p1"})
    line = capsys.readouterr().err.strip()
    assert "WARNING" in line and "sfu_sidecar.unit: careful" in line and "peer=p1" in line
    logging.getLogger(logs.ROOT).handlers.clear()
