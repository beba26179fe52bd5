"""Logging for the ``sfu_sidecar.*`` logger tree: text for people, JSON lines for collectors."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

ROOT = "sfu_sidecar"

# Attributes every LogRecord has; anything else was passed through ``extra=`` and is data.
_STANDARD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line; ``extra=`` fields become keys."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = {
            k: v for k, v in vars(record).items()
            if k not in _STANDARD_ATTRS and not k.startswith("_")
        }
        if extras:
            line += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        return line


class ClientFaultFilter(logging.Filter):
    """aiohttp logs a request its parser refuses (a control byte in a header, a torn request
    line) as an ERROR with a traceback, then answers 400 itself. The fault is the client's, so
    it becomes one INFO line: a stranger cannot fill the log with tracebacks, and ERROR lines
    stay for faults of ours."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            reason = " ".join(str(exc).split())[:200]
            record.msg, record.args = "%s: refused as malformed (%s)", (record.getMessage(), reason)
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info = record.exc_text = None
        return record.levelno >= logging.getLogger(ROOT).getEffectiveLevel()


def configure(level: str, fmt: str) -> None:
    """Install one stderr handler on the ``sfu_sidecar`` tree (idempotent)."""
    logger = logging.getLogger(ROOT)
    for handler in list(logger.handlers):
        if getattr(handler, "_sfu_sidecar", False):
            logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler._sfu_sidecar = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
    # aiohttp's server logs through its own logger; its lines go to the same handler.
    server = logging.getLogger("aiohttp.server")
    for old in list(server.handlers):
        if getattr(old, "_sfu_sidecar", False):
            server.removeHandler(old)
    for old_filter in list(server.filters):
        if isinstance(old_filter, ClientFaultFilter):
            server.removeFilter(old_filter)
    server.addHandler(handler)
    server.addFilter(ClientFaultFilter())
    server.setLevel(max(logging.INFO, logger.level))
    server.propagate = False
    # aiortc/aioice are chatty at INFO; their warnings still matter.
    for noisy in ("aiortc", "aioice"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def get(name: str) -> logging.Logger:
    return logging.getLogger(f"{ROOT}.{name}")
