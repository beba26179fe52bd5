"""The one exception root of the product.

::

    SidecarError
    ├── LocalError                 our side: configuration, a broken invariant
    │   ├── ConfigError            a setting is missing, malformed or contradicts another
    │   ├── StorageUnavailable     durable storage takes no writes now (503, Retry-After)
    │   └── TtsError               text-to-speech refused: no such voice, bad rate
    │       └── TtsUnavailable     no espeak-ng library or voice data on this host
    └── RemoteError                the other side sent something we refuse
        ├── BadInput               malformed or unacceptable input (HTTP 400 and kin)
        │   ├── UnsupportedMediaType   wrong Content-Type (415)
        │   ├── PayloadTooLarge        body over a configured limit (413)
        │   └── NotAcceptable          nothing we can forward was offered (406)
        ├── AuthError              missing or wrong credentials (401)
        ├── Forbidden              the caller may not do this at all, e.g. its web origin (403)
        ├── NotFound               no such stream, session or resource (404)
        ├── Conflict               the resource is taken (409)
        └── LimitExceeded          more than a configured limit allows; carries Retry-After
            ├── TooManyRequests        this client or stream is over its limit (429)
            └── AtCapacity             the whole process is at its limit (503)

Every HTTP-facing error carries its status code; the middleware in ``httpapi.py`` is the one
place that turns them into responses, so no traceback reaches a client.
"""

from __future__ import annotations

from collections.abc import Mapping


class SidecarError(Exception):
    """Root of every error the product raises on purpose."""

    status = 500

    def __init__(self, reason: str, *, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.headers: dict[str, str] = dict(headers or {})


class LocalError(SidecarError):
    """A fault on our side: bad configuration or a broken invariant."""


class ConfigError(LocalError):
    """A setting is missing, malformed, or contradicts another."""


class StorageUnavailable(LocalError):
    """Durable storage refuses writes for now: disk full, file system read-only, I/O error.

    Nothing was stored and nothing acknowledged before is lost; the client should retry
    after ``retry_after`` seconds, and the writes succeed again once an operator frees space
    or makes the file system writable.
    """

    status = 503

    def __init__(self, reason: str, *, retry_after: str = "5") -> None:
        super().__init__(reason, headers={"Retry-After": retry_after})


class TtsError(LocalError):
    """Text-to-speech (:mod:`sfu_sidecar.tts`) refused a request: an unknown voice, a bad rate."""


class TtsUnavailable(TtsError):
    """No espeak-ng library with its voice data here: neither the ``espeakng-loader`` wheel
    nor the system's ``libespeak-ng``."""


class RemoteError(SidecarError):
    """A peer or client sent something we refuse."""

    status = 400


class BadInput(RemoteError):
    status = 400


class UnsupportedMediaType(BadInput):
    status = 415


class PayloadTooLarge(BadInput):
    status = 413


class NotAcceptable(BadInput):
    status = 406


class Unprocessable(BadInput):
    status = 422


class AuthError(RemoteError):
    status = 401

    def __init__(self, reason: str, *, headers: Mapping[str, str] | None = None) -> None:
        merged = {"WWW-Authenticate": 'Bearer realm="sfu-sidecar"'}
        merged.update(headers or {})
        super().__init__(reason, headers=merged)


class Forbidden(RemoteError):
    status = 403


class NotFound(RemoteError):
    status = 404


class Conflict(RemoteError):
    status = 409


class LimitExceeded(RemoteError):
    """More than a configured limit allows; the reason names the setting."""

    status = 429

    def __init__(self, reason: str, *, retry_after: str,
                 headers: Mapping[str, str] | None = None) -> None:
        merged = {"Retry-After": retry_after}
        merged.update(headers or {})
        super().__init__(reason, headers=merged)


class TooManyRequests(LimitExceeded):
    status = 429


class AtCapacity(LimitExceeded):
    status = 503


class UpstreamUnavailable(SidecarError):
    """The relay this node pulls a stream from is unreachable or answered nothing usable;
    the viewer may retry after ``retry_after`` seconds."""

    status = 503

    def __init__(self, reason: str, *, retry_after: str = "5") -> None:
        super().__init__(reason, headers={"Retry-After": retry_after})


class LoopDetected(RemoteError):
    """A pull request came back to a node it had passed: serving it would feed a loop."""

    status = 508
