"""HTTP edge shared by every route: error mapping, request log, CORS, auth and body limits."""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from sfu_sidecar import logs
from sfu_sidecar.cors import ALLOW_ORIGIN, REQUEST_METHOD, CorsPolicy
from sfu_sidecar.exceptions import (
    AuthError,
    Forbidden,
    PayloadTooLarge,
    SidecarError,
    UnsupportedMediaType,
)
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
        if status >= 500:
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
            "%s %s %d %.1fms", request.method, request.path, status, elapsed * 1000,
            extra={"status": status, "duration_ms": round(elapsed * 1000, 3),
                   "remote": request.remote},
        )


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
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise AuthError(f"wrong token for {what}")


def require_content_type(request: web.Request, *accepted: str) -> str:
    ctype = request.content_type.lower()
    if ctype not in accepted:
        raise UnsupportedMediaType(
            f"Content-Type {ctype or '(none)'} not accepted; use {' or '.join(accepted)}"
        )
    return ctype


async def read_body(request: web.Request, limit: int) -> bytes:
    """Read the whole body, refusing more than ``limit`` bytes without buffering them all."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise UnsupportedMediaType(f"Content-Encoding {encoding[:40]} not accepted; send the "
                                   "body uncompressed")
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"body of {request.content_length} bytes exceeds {limit}")
    chunks = []
    size = 0
    async for chunk in request.content.iter_chunked(65536):
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"body exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def json_ok(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(data, status=status, headers=headers)
