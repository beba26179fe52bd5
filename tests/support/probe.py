"""Probes: a test's scenario run as its own process, reporting one JSON object.

A probe runs where a pytest process cannot (in a fresh network namespace with only loopback, with
a browser whose sync API must own the main thread) and prints its result as the last line of its
standard output. A test runs it here and gets that object back, or fails with what the probe said
on its way down.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def last_json_line(stdout: str, what: str) -> dict[str, Any]:
    """The JSON object on the last non-empty line of ``stdout``."""
    lines = stdout.strip().splitlines()
    if not lines:
        raise AssertionError(f"{what} printed no result")
    result = json.loads(lines[-1])
    if not isinstance(result, dict):
        raise AssertionError(f"{what} printed {lines[-1][:200]!r}, not a JSON object")
    return result


def run_probe(module: str, *args: object, timeout: float, netns: bool = True) -> dict[str, Any]:
    """Run ``python -m module args`` and return the object it prints last.

    With ``netns`` the probe runs in a network namespace of its own whose only interface is a
    loopback brought up for it: nothing it opens can clash with another test's ports or reach
    beyond the machine, and a WebRTC peer in it can pair only loopback candidates.
    """
    command = [sys.executable, "-m", module, *(str(a) for a in args)]
    if netns:
        command = ["unshare", "-n", "sh", "-c", "ip link set lo up && exec " + shlex.join(command)]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{module} exited with {proc.returncode}\n--- stdout (end)\n{proc.stdout[-2000:]}"
        f"\n--- stderr (end)\n{proc.stderr[-4000:]}")
    return last_json_line(proc.stdout, module)


def show(result: dict[str, Any], omit: Iterable[str] = ()) -> None:
    """Print a result's figures for the run's log (``-s`` or a failure shows them), leaving
    out bulky per-frame records."""
    left_out = set(omit)
    print(json.dumps({k: v for k, v in result.items() if k not in left_out}))
