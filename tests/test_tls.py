"""The certificate pair: what loads, what is refused and why, and rotation of the files."""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from pathlib import Path

import pytest

from sfu_sidecar.exceptions import ConfigError
from sfu_sidecar.tls import CertificateReloader, load_context
from tests.support.certs import TestCA, key_pem

pytestmark = pytest.mark.unit  # files and contexts in process, no sockets

NOW = time.time()


@pytest.fixture(scope="module")
def ca() -> TestCA:
    return TestCA()


def refused(cert: Path, key: Path, now_s: float = NOW) -> str:
    with pytest.raises(ConfigError) as err:
        load_context(cert, key, now_s=now_s)
    return err.value.reason


def test_a_pair_loads_and_is_described(ca: TestCA, tmp_path: Path) -> None:
    issued = ca.issue("media.example", "10.0.0.5")
    cert, key = issued.write(tmp_path)
    context, certificate = load_context(cert, key, now_s=NOW)
    assert certificate.subject == "CN=media.example"
    assert certificate.sha256 == issued.sha256
    assert "media.example" in certificate.describe()
    assert context.minimum_version.name == "TLSv1_2"


def test_missing_files_name_the_setting_and_the_path(ca: TestCA, tmp_path: Path) -> None:
    cert, key = ca.issue("a").write(tmp_path)
    assert refused(tmp_path / "nope.pem", key) == f"tls_cert {tmp_path / 'nope.pem'}: no such file"
    assert refused(cert, tmp_path / "nope.key") == f"tls_key {tmp_path / 'nope.key'}: no such file"
    assert "is a folder" in refused(tmp_path, key)


def test_a_file_that_is_not_a_certificate(ca: TestCA, tmp_path: Path) -> None:
    _, key = ca.issue("a").write(tmp_path)
    # The key given as the certificate: a common slip.
    assert "not a PEM certificate" in refused(key, key)
    garbage = tmp_path / "garbage.pem"
    garbage.write_bytes(b"\x00\x01 not pem at all")
    assert "not a PEM certificate" in refused(garbage, key)


def test_a_key_of_another_certificate(ca: TestCA, tmp_path: Path) -> None:
    cert, _ = ca.issue("a").write(tmp_path, "a")
    _, other_key = ca.issue("b").write(tmp_path, "b")
    assert refused(cert, other_key) == f"tls_key {other_key}: does not match the certificate {cert}"


def test_a_key_that_is_not_a_key(ca: TestCA, tmp_path: Path) -> None:
    cert, key = ca.issue("a").write(tmp_path)
    key.write_bytes(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    assert refused(cert, key).startswith(f"tls_key {key}: not a usable PEM private key")


def test_an_encrypted_key_is_refused_without_asking_for_a_pass_phrase(
        ca: TestCA, tmp_path: Path) -> None:
    issued = ca.issue("a")
    cert, key = issued.write(tmp_path)
    key.write_bytes(key_pem(issued.key, password=b"secret"))
    assert "encrypted with a pass phrase" in refused(cert, key)


def test_expired_and_not_yet_valid_certificates(ca: TestCA, tmp_path: Path) -> None:
    now = dt.datetime.fromtimestamp(NOW, dt.UTC)
    old = ca.issue("a", not_before=now - dt.timedelta(days=10),
                   not_after=now - dt.timedelta(days=1))
    cert, key = old.write(tmp_path, "old")
    assert "expired on" in refused(cert, key)
    future = ca.issue("a", not_before=now + dt.timedelta(days=1))
    cert, key = future.write(tmp_path, "future")
    assert "not valid until" in refused(cert, key)
    # The same pair is fine at a time inside its validity (time is passed in).
    load_context(cert, key, now_s=NOW + 2 * 86400)


def bump(path: Path, data: bytes) -> None:
    """Replace a file's content and make its change visible however coarse the clock is."""
    path.write_bytes(data)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_rotation_serves_the_new_pair_and_a_bad_pair_keeps_the_old(
        ca: TestCA, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    first, second = ca.issue("a"), ca.issue("a")
    cert, key = first.write(tmp_path)
    changes = []
    reloader = CertificateReloader(cert, key, now_s=NOW, on_change=changes.append)
    assert reloader.certificate.sha256 == first.sha256
    assert not reloader.check(NOW)  # nothing changed

    # Half a rotation: the new certificate is there, its key not yet.
    bump(cert, second.cert_pem)
    with caplog.at_level(logging.WARNING, "sfu_sidecar.tls"):
        assert not reloader.check(NOW)
        assert not reloader.check(NOW)  # told once per version of the files
    assert reloader.certificate.sha256 == first.sha256
    assert reloader.refused == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "does not match" in warnings[0], warnings

    bump(key, second.key_pem)
    assert reloader.check(NOW)
    assert reloader.certificate.sha256 == second.sha256
    assert [c.sha256 for c in changes] == [second.sha256]
    assert reloader.reloads == 1

