"""A test certificate authority and the certificates it issues, made in process (cryptography).

Tests that serve HTTPS make a CA of their own, issue the service a certificate for the names and
addresses they reach it by, and trust that CA alone in their clients (Python's ``ssl``,
Chromium's NSS database): nothing is trusted that the test did not make.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

UTC = dt.UTC


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey, password: bytes | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.NoEncryption() if password is None
        else serialization.BestAvailableEncryption(password))
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             encryption)


@dataclass
class Issued:
    """A certificate (PEM) and its key."""

    cert_pem: bytes
    key: ec.EllipticCurvePrivateKey

    @property
    def key_pem(self) -> bytes:
        return key_pem(self.key)

    @property
    def sha256(self) -> str:
        cert = x509.load_pem_x509_certificate(self.cert_pem)
        return cert.fingerprint(hashes.SHA256()).hex()

    def write(self, folder: Path, name: str = "server") -> tuple[Path, Path]:
        """``name.pem`` (certificate) and ``name.key`` in ``folder``; the paths."""
        cert, key = folder / f"{name}.pem", folder / f"{name}.key"
        cert.write_bytes(self.cert_pem)
        key.write_bytes(self.key_pem)
        return cert, key


class TestCA:
    """A self-signed CA that issues server certificates."""

    __test__ = False  # not a test class, whatever pytest thinks of its name

    def __init__(self, name: str = "sfu-sidecar test CA") -> None:
        self.key = _key()
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name).issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(self.key, hashes.SHA256())
        )

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, *names: str, not_before: dt.datetime | None = None,
              not_after: dt.datetime | None = None, common_name: str | None = None) -> Issued:
        """A server certificate for DNS names and IP addresses (``127.0.0.1``, ``::1``)."""
        key = _key()
        now = dt.datetime.now(UTC)
        alt: list[x509.GeneralName] = []
        for name in names:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                alt.append(x509.DNSName(name))
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                                common_name or (names[0] if names else "x"))])
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject).issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before or now - dt.timedelta(hours=1))
            .not_valid_after(not_after or now + dt.timedelta(days=7))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(self.key, hashes.SHA256())
        )
        # The chain a server sends: its certificate, then the CA's.
        return Issued(cert.public_bytes(serialization.Encoding.PEM) + self.pem, key)
