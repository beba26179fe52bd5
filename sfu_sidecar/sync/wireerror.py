"""What the ``sync`` codec refuses (proto/sync.md): the largest message, and the error it
raises on bytes that do not decode."""

from __future__ import annotations

from sfu_sidecar.exceptions import BadInput

MAX_MESSAGE = 65535  # nothing we send comes near; anything larger from a peer is refused


class ErrorKind:
    TRUNCATED = "truncated"
    BAD_VERSION = "bad_version"
    UNKNOWN_TYPE = "unknown_type"
    TRAILING_BYTES = "trailing_bytes"
    BAD_FIELD = "bad_field"
    BAD_CONTROL = "bad_control"
    TOO_LARGE = "too_large"


class SyncWireError(BadInput):
    """Bytes on the sync channel that do not decode; :attr:`kind` names the fault."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind = kind
