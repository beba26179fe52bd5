"""``sfu-sidecar clock`` as a real subprocess (no HTTP server)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.conftest import sidecar_command

pytestmark = pytest.mark.system  # runs the service or its CLI as a subprocess

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z system/freerun offset=\+0ns "
                  r"freq=\+0\.0ppb error=\?$")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SFU_SIDECAR_")}


def test_prints_count_lines_without_sources() -> None:
    out = subprocess.run([*sidecar_command(), "clock", "--count", "2"], capture_output=True,
                         text=True, timeout=30, env=_env(), check=True)
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and all(LINE.match(line) for line in lines), out.stdout
    assert "house clock started" in out.stderr


def test_bad_interface_exits_2_with_a_reason() -> None:
    out = subprocess.run([*sidecar_command(), "clock", "--count", "1", "--ptp-interface",
                          "nosuch0"], capture_output=True, text=True, timeout=30, env=_env())
    assert out.returncode == 2
    assert "ptp_interface nosuch0" in out.stderr and out.stdout == ""
