from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from pathlib import Path

import pytest

from sfu_sidecar.cli import build_parser, main
from sfu_sidecar.config import env_name, flag_name, setting_fields
from tests.support.certs import TestCA


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


def test_https_settings_that_cannot_work_exit_2_with_the_reason_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ca = TestCA()
    cert, key = ca.issue("a").write(tmp_path, "a")
    _, other_key = ca.issue("b").write(tmp_path, "b")
    now = datetime.now(UTC)
    expired, expired_key = ca.issue("a", not_before=now - timedelta(days=9),
                                    not_after=now - timedelta(days=2)).write(tmp_path, "old")
    cases = {
        f"tls_cert {tmp_path / 'none.pem'}: no such file":
            ["--tls-cert", str(tmp_path / "none.pem"), "--tls-key", str(key)],
        f"tls_key {other_key}: does not match the certificate {cert}":
            ["--tls-cert", str(cert), "--tls-key", str(other_key)],
        f"tls_cert {expired}: expired on":
            ["--tls-cert", str(expired), "--tls-key", str(expired_key)],
        "tls_cert and tls_key are given together": ["--tls-cert", str(cert)],
        "https_port needs tls_cert and tls_key": ["--https-port", "8443"],
        "https_port must differ from port": ["--tls-cert", str(cert), "--tls-key", str(key),
                                             "--port", "8443", "--https-port", "8443"],
    }
    for reason, args in cases.items():
        # data_dir under tmp_path: a start that went too far would leave a folder behind.
        assert main(["serve", "--data-dir", str(tmp_path / "data"), *args]) == 2, args
        err = capsys.readouterr().err
        assert reason in err, (args, err)
        assert "Traceback" not in err
    assert not (tmp_path / "data").exists()
