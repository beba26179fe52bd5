"""HTTP edge shared by every route: error mapping, request log, auth and body limits."""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from sfu_sidecar import logs
from sfu_sidecar.exceptions import AuthError, PayloadTooLarge, SidecarError, UnsupportedMediaType
from sfu_sidecar.metrics import Metrics

log = logs.get("http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

METRICS_KEY = web.AppKey("metrics", Metrics)


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
