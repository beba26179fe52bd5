"""The ports the service listens on: plain HTTP, HTTPS, or both.

With ``tls_cert`` and ``tls_key`` the service speaks HTTPS on ``port``, or on ``https_port``
beside plain HTTP on ``port``. The certificate is watched and a rotated one served to new
connections without a restart (:mod:`sfu_sidecar.tls`). A plain-HTTP request that reaches an
HTTPS port fails its handshake and is closed, logged at debug level only (it is the client's
mistake, and a scanner could flood the log with it).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from sfu_sidecar.config import Settings
from sfu_sidecar.metrics import NAMESPACE
from sfu_sidecar.tls import Certificate, CertificateReloader


@dataclass
class Listeners:
    """The sites of one runner, and the certificate watch when there is one."""

    urls: list[str] = field(default_factory=list)
    reloader: CertificateReloader | None = None
    _watch: asyncio.Task[None] | None = None

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)


def _url(scheme: str, host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"


def _expiry_metrics(registry: CollectorRegistry) -> tuple[Gauge, Counter, Counter]:
    return (
        Gauge("tls_certificate_expiry_timestamp_seconds",
              "When the certificate served over HTTPS expires (Unix time)",
              namespace=NAMESPACE, registry=registry),
        Counter("tls_certificate_reloads", "Rotated certificates loaded without a restart",
                namespace=NAMESPACE, registry=registry),
        Counter("tls_certificate_refused",
                "Changed certificate or key files that did not load (the pair in use stayed)",
                namespace=NAMESPACE, registry=registry),
    )


async def start(runner: web.AppRunner, settings: Settings, *, shutdown_timeout: float = 60.0,
                registry: CollectorRegistry | None = None) -> Listeners:
    """Start the runner's sites as the settings ask. Certificate problems were refused at
    start-up (``cli.prepare`` loads the pair); a pair that stops loading later (files removed)
    raises here as :class:`~sfu_sidecar.exceptions.ConfigError`."""
    out = Listeners()
    plain_port: int | None = settings.port
    if settings.tls_cert is not None and settings.tls_key is not None:
        expiry = reloads = refused = None
        if registry is not None:
            expiry, reloads, refused = _expiry_metrics(registry)

        def changed(certificate: Certificate) -> None:
            if expiry is not None and reloads is not None:
                expiry.set(certificate.not_after.timestamp())
                reloads.inc()

        reloader = CertificateReloader(settings.tls_cert, settings.tls_key, now_s=time.time(),
                                       on_change=changed)
        if expiry is not None:
            expiry.set(reloader.certificate.not_after.timestamp())
        if refused is not None:
            reloader.on_refused = refused.inc
        https_port = settings.https_port or settings.port
        if settings.https_port is None:
            plain_port = None
        await web.TCPSite(runner, settings.host, https_port, ssl_context=reloader.context,
                          shutdown_timeout=shutdown_timeout).start()
        out.urls.append(_url("https", settings.host, https_port))
        out.reloader = reloader
    if plain_port is not None:
        await web.TCPSite(runner, settings.host, plain_port,
                          shutdown_timeout=shutdown_timeout).start()
        out.urls.insert(0, _url("http", settings.host, plain_port))
    # Watched once every site listens: a site that fails to start leaves no task behind.
    if out.reloader is not None:
        out._watch = asyncio.create_task(out.reloader.watch(), name="tls-certificate-watch")
    return out


def install_hsts(app: web.Application, max_age_s: int) -> None:
    """Send ``Strict-Transport-Security`` with every response over HTTPS (RFC 6797 7.2: never
    over plain HTTP, where an attacker could forge it)."""
    if max_age_s <= 0:
        return
    value = f"max-age={max_age_s}"

    async def add(request: web.Request, response: web.StreamResponse) -> None:
        if request.secure:
            response.headers["Strict-Transport-Security"] = value

    app.on_response_prepare.append(add)
