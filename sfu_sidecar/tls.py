"""HTTPS: the operator's certificate and key, checked before start-up and reloaded when they change.

A browser gives camera and microphone only to a secure context, so the publisher page works
from another machine only over HTTPS; tokens and captions cross the network in the clear
otherwise. The service serves TLS itself (``tls_cert`` and ``tls_key``, PEM files), on its port
or on ``https_port`` beside plain HTTP.

Certificates are rotated without a restart: :class:`CertificateReloader` watches both files and,
when they change and the new pair loads, hands new connections the new pair; connections already
open keep theirs. A pair that does not load (half written, a key for another certificate) is
refused with a warning and the pair in use stays. The switch happens inside the handshake (the
server-name callback runs for every ClientHello, with or without SNI), so the listening socket
never closes.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from sfu_sidecar import logs
from sfu_sidecar.exceptions import ConfigError

log = logs.get("tls")

RELOAD_CHECK_S = 2.0  # how often the files are looked at; a rotation is seen within this


@dataclass(frozen=True)
class Certificate:
    """What the logs and status say about the certificate served."""

    subject: str
    not_after: datetime
    sha256: str  # of the leaf, as browsers show it

    def describe(self) -> str:
        return (f"{self.subject}, valid until {self.not_after:%Y-%m-%d %H:%M} UTC, "
                f"SHA-256 {self.sha256[:16]}…")


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{what} {path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path}: is a folder, not a PEM file") from None
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot be read: {exc.strerror or exc}") from None


def _no_password() -> bytes:
    # Without this, OpenSSL would ask for the pass phrase of an encrypted key on the terminal.
    raise ValueError("encrypted")


def load_context(cert: Path, key: Path, *, now_s: float) -> tuple[ssl.SSLContext, Certificate]:
    """A server context for the pair, or :class:`ConfigError` saying what is wrong with it.

    ``now_s`` (Unix time) is when the validity period is checked: a certificate that has
    expired or is not yet valid is refused, since every browser would refuse it anyway.
    """
    pem = _read(cert, "tls_cert")
    _read(key, "tls_key")
    try:
        leaf = x509.load_pem_x509_certificate(pem)
    except ValueError:
        raise ConfigError(f"tls_cert {cert}: not a PEM certificate "
                          "(expected -----BEGIN CERTIFICATE-----)") from None
    now = datetime.fromtimestamp(now_s, UTC)
    if now > leaf.not_valid_after_utc:
        raise ConfigError(f"tls_cert {cert}: expired on {leaf.not_valid_after_utc:%Y-%m-%d %H:%M} "
                          "UTC")
    if now < leaf.not_valid_before_utc:
        raise ConfigError(f"tls_cert {cert}: not valid until "
                          f"{leaf.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key, password=_no_password)
    except ValueError:
        raise ConfigError(f"tls_key {key}: encrypted with a pass phrase; give the key "
                          "unencrypted (readable only by the service's user)") from None
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise ConfigError(f"tls_key {key}: does not match the certificate {cert}") from None
        raise ConfigError(f"tls_key {key}: not a usable PEM private key for {cert} "
                          f"({exc.reason or exc})") from None
    except OSError as exc:  # a file replaced or removed between the reads and the load
        raise ConfigError(f"tls_cert {cert} / tls_key {key}: cannot be read: "
                          f"{exc.strerror or exc}") from None
    context.set_alpn_protocols(["http/1.1"])
    fingerprint = hashlib.sha256(leaf.public_bytes(Encoding.DER)).hexdigest()
    return context, Certificate(leaf.subject.rfc4514_string(), leaf.not_valid_after_utc,
                                fingerprint)


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class CertificateReloader:
    """The pair in use, and a watch on its files.

    :attr:`context` is the context to listen with. Its server-name callback gives every new
    connection the latest pair that loaded; :meth:`check` looks at the files.
    """

    def __init__(self, cert: Path, key: Path, *, now_s: float,
                 on_change: Callable[[Certificate], None] | None = None) -> None:
        self.cert, self.key = cert, key
        # Stamped before loading: files replaced meanwhile are seen as changed at the next check.
        self._stamps = (_stamp(cert), _stamp(key))
        self.context, self.certificate = load_context(cert, key, now_s=now_s)
        self.context.sni_callback = self._pick
        self._current = self.context
        self._refused: tuple[object, ...] | None = None
        self.reloads = 0
        self.refused = 0
        self._on_change = on_change
        self.on_refused: Callable[[], None] | None = None

    def _pick(self, sock: ssl.SSLObject | ssl.SSLSocket, _name: str | None,
              _context: ssl.SSLContext) -> None:
        if sock.context is not self._current:
            sock.context = self._current

    def check(self, now_s: float) -> bool:
        """Load the pair again if either file changed; True when a new pair is now served."""
        stamps = (_stamp(self.cert), _stamp(self.key))
        if stamps == self._stamps:
            return False
        try:
            context, certificate = load_context(self.cert, self.key, now_s=now_s)
        except ConfigError as exc:
            if stamps != self._refused:  # once per version of the files, not every check
                self._refused = stamps
                self.refused += 1
                if self.on_refused is not None:
                    self.on_refused()
                log.warning("new certificate not loaded, still serving %s: %s",
                            self.certificate.describe(), exc.reason)
            return False
        self._stamps, self._refused = stamps, None
        self._current, self.certificate = context, certificate
        self.reloads += 1
        log.info("certificate reloaded: %s", certificate.describe())
        if self._on_change is not None:
            self._on_change(certificate)
        return True

    async def watch(self, clock: Callable[[], float] = time.time) -> None:
        """Check the files every :data:`RELOAD_CHECK_S` until cancelled."""
        while True:
            await asyncio.sleep(RELOAD_CHECK_S)
            try:
                self.check(clock())
            except Exception:  # the pair in use keeps serving; the watch must not end
                log.exception("checking the certificate files failed; still serving %s",
                              self.certificate.describe())
