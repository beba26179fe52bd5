"""Cross-origin access (the Fetch standard's CORS protocol) for every route, decided in one place.

Two kinds of request, told apart by method:

* Reads (``GET``, ``HEAD``) return public data: captions, stream and clock status, health,
  metrics. Any origin may read them, answered with ``Access-Control-Allow-Origin: *`` so shared
  caches can keep one copy for every page.
* Everything else (WHIP/WHEP ``POST``/``PATCH``/``DELETE``/``OPTIONS``, caption ingest and
  retraction) carries a token or changes state. Only the origins in ``cors_origins`` may do it
  from a browser; no origin may when the setting is unset.

Credentials are Bearer tokens in ``Authorization``, never cookies, so no response carries
``Access-Control-Allow-Credentials`` and ``*`` stays a valid answer.

WebSockets are outside CORS: a browser opens one to any origin and only sends ``Origin`` along.
So the server itself refuses a cross-origin handshake to a WebSocket that writes.

The policy here is pure (strings in, headers out); ``httpapi.py`` applies it to requests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

ALLOW_ORIGIN = "Access-Control-Allow-Origin"
REQUEST_METHOD = "Access-Control-Request-Method"

READ_METHODS = frozenset({"GET", "HEAD"})
# Request headers a client sets: the token, the body's media type, and If-Match with the
# session's ETag on a WHIP/WHEP PATCH (RFC 9725).
ALLOW_HEADERS = ("Authorization", "Content-Type", "If-Match")
# Response headers a script must read; the CORS-safelisted ones (Content-Type, Cache-Control...)
# are readable anyway. Location, Link, ETag, Accept-Patch: WHIP/WHEP sessions (RFC 9725);
# Retry-After: future caption chunks; X-Stream-Epoch-Ns: stream time zero of caption files.
EXPOSE_HEADERS = ("Location", "Link", "ETag", "Accept-Patch", "Retry-After", "X-Stream-Epoch-Ns")
# Chromium caches a preflight for at most 2 h, Firefox 24 h; 10 min bounds how long a browser
# keeps using an origin after it is removed from the settings.
MAX_AGE_S = 600

_WHIP_WHEP = re.compile(r"^/wh[ie]p/")
_CAPTION_API = re.compile(r"^/api/streams/[^/]+/captions(/|$)")
# WebSockets any origin may open: the clock join stores nothing and tells only the time; the
# dashboard push is read-only and carries what the GET routes already show to any origin.
_OPEN_WEBSOCKETS = frozenset({"/api/clock/ws", "/api/dashboard/ws"})


def allowed_methods(path: str) -> str:
    """The methods a cross-origin page may use on ``path``, for a preflight answer."""
    if _WHIP_WHEP.match(path):
        return "POST, PATCH, DELETE, OPTIONS"
    if _CAPTION_API.match(path):
        return "GET, POST, DELETE, OPTIONS"
    return "GET, HEAD, OPTIONS"


@dataclass(frozen=True)
class CorsPolicy:
    """Which origins may write, from ``Settings.cors_origins``: ``()``, ``("*",)`` or a list."""

    origins: tuple[str, ...] = ()

    @property
    def any_origin(self) -> bool:
        return self.origins == ("*",)

    def allow_origin(self, origin: str | None, method: str) -> str | None:
        """``Access-Control-Allow-Origin`` for a request with ``method``; None refuses it."""
        if method.upper() in READ_METHODS or self.any_origin:
            return "*"
        if origin is not None and origin in self.origins:
            return origin
        return None

    def response_headers(self, origin: str | None, method: str) -> dict[str, str]:
        """CORS headers for an actual (non-preflight) response."""
        headers: dict[str, str] = {}
        allowed = self.allow_origin(origin, method)
        if allowed is not None:
            headers[ALLOW_ORIGIN] = allowed
            headers["Access-Control-Expose-Headers"] = ", ".join(EXPOSE_HEADERS)
        if self._varies(method):
            headers["Vary"] = "Origin"
        return headers

    def preflight_headers(self, origin: str, method: str, path: str) -> dict[str, str] | None:
        """Headers of a successful preflight for ``method`` on ``path``; None refuses it."""
        allowed = self.allow_origin(origin, method)
        if allowed is None:
            return None
        headers = {
            ALLOW_ORIGIN: allowed,
            "Access-Control-Allow-Methods": allowed_methods(path),
            "Access-Control-Allow-Headers": ", ".join(ALLOW_HEADERS),
            "Access-Control-Max-Age": str(MAX_AGE_S),
        }
        if self._varies(method):
            headers["Vary"] = "Origin"
        return headers

    def websocket_allowed(self, origin: str | None, host: str | None, path: str) -> bool:
        """Whether a WebSocket handshake from ``origin`` to ``host`` may open ``path``."""
        if origin is None or self.any_origin or path in _OPEN_WEBSOCKETS:
            return True  # no Origin: not a browser, which CORS does not restrain anyway
        if origin in self.origins:
            return True
        # Same origin: the page was served by this host. The scheme is left out so that a
        # TLS-terminating proxy in front (https page, plain http here) still counts as same.
        return host is not None and urlsplit(origin).netloc.lower() == host.lower()

    def _varies(self, method: str) -> bool:
        # Only a list makes the answer depend on Origin; "*" and reads answer every origin alike.
        return bool(self.origins) and not self.any_origin and method.upper() not in READ_METHODS
