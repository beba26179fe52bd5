"""Runs the browser modules' pure-logic tests (``node --test tests/web/js/``) under pytest, so
one test command covers the JavaScript codecs against the same ``proto/`` vectors too."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import ROOT


@pytest.mark.needs("node")
def test_node_tests_pass() -> None:
    node = shutil.which("node")
    assert node is not None
    proc = subprocess.run(
        [node, "--test", "tests/web/js/"], cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # A run that finds no test files also exits 0; insist the codec tests actually ran.
    assert "# fail 0" in proc.stdout
    passed = int(proc.stdout.split("# pass ")[1].split()[0])
    assert passed >= 40, proc.stdout[-2000:]
