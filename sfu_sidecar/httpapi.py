"""HTTP edge shared by every route: error mapping, request log, CORS, auth and body limits."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote_plus

from aiohttp import web
from aiohttp.typedefs import Middleware

from sfu_sidecar import logs
from sfu_sidecar.config import Settings
from sfu_sidecar.cors import ALLOW_ORIGIN, REQUEST_METHOD, CorsPolicy
from sfu_sidecar.exceptions import (
    AuthError,
    BadInput,
    Forbidden,
    PayloadTooLarge,
    RemoteError,
    SidecarError,
    UnsupportedMediaType,
)
from sfu_sidecar.limits import is_loopback
from sfu_sidecar.metrics import Metrics

log = logs.get("http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

METRICS_KEY = web.AppKey("metrics", Metrics)
CORS_KEY = web.AppKey("cors", CorsPolicy)


def json_error(status: int, reason: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": reason}, status=status, headers=headers)


def _route_label(request: web.Request) -> str:
    info = request.match_info
    route = info.route if info is not None else None
    resource = route.resource if route is not None else None
    # The canonical template, not the path: keeps Prometheus label cardinality bounded.
    return resource.canonical if resource is not None else "unmatched"


CLIENT_HEADER = "Sidecar-Client"
PROXY_KEY_HEADER = "Sidecar-Proxy-Key"


def forwarded_middleware(key: str) -> Middleware:
    """Requests a trusted proxy (the ``serve --workers`` supervisor) forwarded: with the
    proxy's key, the client address it names replaces its own, so limits and the
    this-host-only rule see the real client. Without the key both headers are ignored."""

    @web.middleware
    async def forwarded(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get(PROXY_KEY_HEADER)
        client = request.headers.get(CLIENT_HEADER)
        if given is not None and client and hmac.compare_digest(given.encode(), key.encode()):
            request = request.clone(remote=client)
        return await handler(request)

    return forwarded


@web.middleware
async def edge_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map errors to JSON, log every request once, count it. No traceback reaches a client."""
    started = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except SidecarError as exc:
        status = exc.status
        if status >= 500 and not isinstance(exc, RemoteError):  # a 503 at capacity is no fault
            log.error("request failed: %s", exc.reason)
        return json_error(status, exc.reason, exc.headers)
    except web.HTTPException as exc:
        status = exc.status
        if status < 400:
            raise
        reason = exc.reason if status != 404 else f"no route for {request.method} {request.path}"
        headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
        return json_error(status, reason, headers)
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return json_error(500, "internal error")
    finally:
        elapsed = time.perf_counter() - started
        route = _route_label(request)
        metrics = request.app.get(METRICS_KEY)
        if metrics is not None:
            metrics.http_requests.labels(route, str(status)).inc()
            metrics.http_duration.labels(route).observe(elapsed)
        log.info(
            "%s %s %d %.1fms", request.method, logged_target(request), status, elapsed * 1000,
            extra={"status": status, "duration_ms": round(elapsed * 1000, 3),
                   "remote": request.remote},
        )


# Query parameters whose values are never logged: the viewer page takes ?token=, and other
# clients name their secrets much the same way.
_SECRET_PARAMETER_PARTS = ("token", "secret", "password", "passwd", "credential", "auth", "key",
                           "sig")


def _secret_parameter(name: str) -> bool:
    lowered = name.lower()
    return any(part in lowered for part in _SECRET_PARAMETER_PARTS)


def logged_target(request: web.Request) -> str:
    """The request's path and query for the log, every secret-looking value masked.

    The query stays percent-encoded as sent, so no value can break a log line.
    """
    raw = request.rel_url.raw_query_string
    if not raw:
        return request.path
    parts = []
    for pair in raw.split("&"):
        name, eq, _ = pair.partition("=")
        parts.append(f"{name}=***" if eq and _secret_parameter(unquote_plus(name)) else pair)
    return f"{request.path}?{'&'.join(parts)}"


def install_cors(app: web.Application, policy: CorsPolicy) -> None:
    """Apply ``policy`` to every route of ``app``: preflights, WebSocket handshakes, responses.

    Put :func:`cors_middleware` after :func:`edge_middleware` so preflights are logged and
    counted and a refusal becomes a JSON error like any other.
    """
    app[CORS_KEY] = policy
    app.on_response_prepare.append(_add_cors_headers)


@web.middleware
async def cors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer preflights without calling the route; refuse cross-origin writing WebSockets."""
    policy = request.app.get(CORS_KEY)
    origin = request.headers.get("Origin")
    if policy is None or origin is None:
        return await handler(request)
    requested = request.headers.get(REQUEST_METHOD)
    if request.method == "OPTIONS" and requested is not None:
        # Answered here, never by the route: a preflight must not create or reveal anything,
        # and its response headers are invisible to scripts anyway.
        headers = policy.preflight_headers(origin, requested.strip(), request.path)
        if headers is None:
            raise Forbidden(
                f"origin {origin} may not {requested} {request.path}: "
                "it is not in the cors_origins setting"
            )
        return web.Response(status=204, headers=headers)
    if request.headers.get("Upgrade", "").lower() == "websocket" and not (
        policy.websocket_allowed(origin, request.headers.get("Host"), request.path)
    ):
        raise Forbidden(
            f"origin {origin} may not open {request.path}: it is not in the cors_origins setting"
        )
    return await handler(request)


async def _add_cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    policy = request.app.get(CORS_KEY)
    if policy is None or ALLOW_ORIGIN in response.headers:
        return  # a preflight answer already carries its own
    for name, value in policy.response_headers(
        request.headers.get("Origin"), request.method
    ).items():
        if name == "Vary" and "Vary" in response.headers:
            value = f"{response.headers['Vary']}, {value}"
        response.headers[name] = value


def require_bearer(request: web.Request, token: str | None, what: str) -> None:
    """Raise AuthError unless ``Authorization: Bearer <token>`` matches (constant time)."""
    if token is None:
        return
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise AuthError(f"{what} needs Authorization: Bearer <token>")
    if not tokens_match(given.strip(), token):
        raise AuthError(f"wrong token for {what}")


def tokens_match(given: str, expected: str) -> bool:
    """Compare a secret in constant time, its length included: digests of equal size are
    compared, so neither a prefix nor the length of the expected token shows in the timing."""
    return hmac.compare_digest(
        hashlib.sha256(given.encode("utf-8", "surrogateescape")).digest(),
        hashlib.sha256(expected.encode("utf-8", "surrogateescape")).digest(),
    )


# Headers a proxy adds naming the client it forwards: a request carrying one came from
# elsewhere, whatever the address of the connection it arrived on.
_FORWARDING_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Real-IP")


def from_this_host(request: web.Request) -> bool:
    """Whether the request came from this host itself: over loopback and not via a proxy."""
    if any(name in request.headers for name in _FORWARDING_HEADERS):
        return False
    return is_loopback(request.remote)


def ingest_allowed(request: web.Request, settings: Settings) -> bool:
    """Whether a request may publish or ingest without a token: only when no publish_token is
    set, and then from this host, or from anywhere with open_ingest."""
    return settings.publish_token is None and (settings.open_ingest or from_this_host(request))


def require_publish(request: web.Request, settings: Settings, what: str) -> None:
    """Authorise a publishing or ingest request (WHIP, captions, GPU reports).

    With publish_token set, its Bearer token. Without one, only requests from this host, unless
    open_ingest opens them to everyone: a service reachable from a network publishes nothing
    by default that anyone on that network could inject.
    """
    if settings.publish_token is not None:
        require_bearer(request, settings.publish_token, what)
        return
    if not ingest_allowed(request, settings):
        raise Forbidden(
            f"{what} from another host needs a token: set publish_token (and send it as "
            "Authorization: Bearer), or set open_ingest to accept it from anyone"
        )


def require_content_type(request: web.Request, *accepted: str) -> str:
    ctype = request.content_type.lower()
    if ctype not in accepted:
        raise UnsupportedMediaType(
            f"Content-Type {ctype or '(none)'} not accepted; use {' or '.join(accepted)}"
        )
    return ctype


async def read_body(request: web.Request, limit: int, setting: str = "max_body_bytes") -> bytes:
    """Read the whole body, refusing more than ``limit`` bytes without buffering them all.

    ``setting`` names the limit in the refusal, so the client's operator knows what to raise.
    """
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise UnsupportedMediaType(f"Content-Encoding {encoding[:40]} not accepted; send the "
                                   "body uncompressed")
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(
            f"body of {request.content_length} bytes exceeds {limit} (setting {setting})"
        )
    chunks = []
    size = 0
    async for chunk in request.content.iter_chunked(65536):
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"body exceeds {limit} bytes (setting {setting})")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: web.Request, limit: int) -> Any:
    """A JSON body (``application/json``, at most ``limit`` bytes), parsed; BadInput with the
    parser's reason when it is not JSON."""
    require_content_type(request, "application/json")
    body = await read_body(request, limit)
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise BadInput(f"body is not JSON: {exc}") from None


def json_ok(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(data, status=status, headers=headers)
