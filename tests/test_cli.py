from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import pytest

from sfu_sidecar.cli import build_parser, main
from sfu_sidecar.config import env_name, flag_name, setting_fields


def test_serve_help_documents_every_setting(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["serve", "--help"])
    assert info.value.code == 0
    # argparse wraps lines; compare with whitespace collapsed.
    text = " ".join(capsys.readouterr().out.split())
    for f in setting_fields():
        assert flag_name(f.name) in text
        assert env_name(f.name) in text


def test_config_error_exits_2_with_a_clear_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--ice-port-range", "5000-4000"]) == 2
    err = capsys.readouterr().err
    assert "--ice-port-range 5000-4000: low end above high end" in err
    assert "Traceback" not in err


@pytest.mark.system
def test_python_dash_m_runs_the_cli() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sfu_sidecar", "--version"], capture_output=True, text=True,
        check=True,
    )
    # --version says the installed distribution's version, the one /healthz reports.
    assert out.stdout == f"sfu-sidecar {version('sfu-sidecar')}\n"
