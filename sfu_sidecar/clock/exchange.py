"""Clock join: the four-timestamp exchange that lets a peer follow house time. Pure.

Spec and test vectors: ``proto/clock.md``, ``proto/vectors/clock_exchange.json``. Messages are
maps with a ``type`` field, carried as JSON text or msgpack binary (WebSocket ``/api/clock/ws``)
and on the sync DataChannel:

- ``{"type": "clock_req", "t1": int}``: client, t1 = its send time on its own clock;
- ``{"type": "clock_resp", "t1": int, "t2": int, "t3": int}``: server, t2/t3 = house time at
  receive and send, t1 echoed;
- ``{"type": "clock_report", "offset_ns": int, "error_ns": int, "rtt_ns": int}``: client, what
  it concluded.

The client side keeps a sliding window of samples and trusts the one with the least round trip
(its queueing delay, and so its possible asymmetry, is smallest; the same reasoning as the
RFC 5905 §10 clock filter). The true offset lies within rtt/2 of that sample's offset whatever
the path asymmetry, so rtt/2 is the reported uncertainty.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack

from sfu_sidecar.exceptions import BadInput

CLOCK_REQ = "clock_req"
CLOCK_RESP = "clock_resp"
CLOCK_REPORT = "clock_report"
DEFAULT_WINDOW = 16
# Timestamps are signed 64-bit ns on the wire (msgpack int64; JSON integers).
_INT64 = (-(1 << 63), (1 << 63) - 1)


class ExchangeError(BadInput):
    """A clock-join message that is malformed or of an unknown type."""


# The one definition of the clock-join messages: the sync DataChannel's wire format
# (sfu_sidecar/sync/wire.py) carries these same classes as control messages.
@dataclass(frozen=True, slots=True)
class ClockReq:
    t1: int
    type: ClassVar[str] = CLOCK_REQ

    def to_map(self) -> dict[str, Any]:
        return {"type": CLOCK_REQ, "t1": self.t1}


@dataclass(frozen=True, slots=True)
class ClockResp:
    t1: int
    t2: int
    t3: int
    type: ClassVar[str] = CLOCK_RESP

    def to_map(self) -> dict[str, Any]:
        return {"type": CLOCK_RESP, "t1": self.t1, "t2": self.t2, "t3": self.t3}


@dataclass(frozen=True, slots=True)
class ClockReport:
    offset_ns: int
    error_ns: int
    rtt_ns: int
    type: ClassVar[str] = CLOCK_REPORT

    def to_map(self) -> dict[str, Any]:
        return {"type": CLOCK_REPORT, "offset_ns": self.offset_ns, "error_ns": self.error_ns,
                "rtt_ns": self.rtt_ns}


ClockMessage = ClockReq | ClockResp | ClockReport

_FIELDS: dict[str, tuple[type[ClockMessage], tuple[str, ...]]] = {
    CLOCK_REQ: (ClockReq, ("t1",)),
    CLOCK_RESP: (ClockResp, ("t1", "t2", "t3")),
    CLOCK_REPORT: (ClockReport, ("offset_ns", "error_ns", "rtt_ns")),
}


def from_map(obj: Any) -> ClockMessage:
    """Validate a decoded map. Unknown extra keys are ignored (forward compatibility)."""
    if not isinstance(obj, dict):
        raise ExchangeError("clock message must be a map")
    kind = obj.get("type")
    spec = _FIELDS.get(kind) if isinstance(kind, str) else None
    if spec is None:
        raise ExchangeError(f"unknown clock message type {kind!r}")
    cls, names = spec
    values = []
    for name in names:
        value = obj.get(name)
        # bool is an int subclass in Python; a JSON true is not a timestamp.
        if not isinstance(value, int) or isinstance(value, bool):
            raise ExchangeError(f"{kind}.{name} must be an integer")
        if not _INT64[0] <= value <= _INT64[1]:
            raise ExchangeError(f"{kind}.{name} out of int64 range")
        values.append(value)
    return cls(*values)


def decode_json(text: str) -> ClockMessage:
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise ExchangeError(f"not JSON: {exc}") from None
    except RecursionError:
        raise ExchangeError("JSON nested too deeply") from None
    return from_map(obj)


def decode_msgpack(data: bytes) -> ClockMessage:
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ExchangeError(f"not msgpack: {exc}") from None
    return from_map(obj)


def encode_json(msg: ClockMessage) -> str:
    return json.dumps(msg.to_map(), separators=(",", ":"))


def encode_msgpack(msg: ClockMessage) -> bytes:
    return bytes(msgpack.packb(msg.to_map(), use_bin_type=True))


def respond(req: ClockReq, t2: int, t3: int) -> ClockResp:
    """Server side: ``t2`` house time when the request arrived, ``t3`` just before sending."""
    return ClockResp(req.t1, t2, t3)


@dataclass(frozen=True)
class Sample:
    """One exchange. offset = house - client = ((t2 - t1) + (t3 - t4)) / 2;
    rtt = (t4 - t1) - (t3 - t2) (server processing time excluded)."""

    t1: int
    t2: int
    t3: int
    t4: int

    @property
    def offset_ns(self) -> int:
        return ((self.t2 - self.t1) + (self.t3 - self.t4)) // 2

    @property
    def rtt_ns(self) -> int:
        return (self.t4 - self.t1) - (self.t3 - self.t2)


class ClockJoin:
    """Client side: a sliding window of samples and the estimate from the least-RTT one."""

    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        self.samples: deque[Sample] = deque(maxlen=window)
        self.rejected = 0

    def request(self, t1: int) -> ClockReq:
        return ClockReq(t1)

    def response(self, resp: ClockResp, t4: int) -> Sample | None:
        """Add the sample for ``resp`` received at ``t4`` (client clock); None if unusable."""
        sample = Sample(resp.t1, resp.t2, resp.t3, t4)
        if sample.rtt_ns < 0 or resp.t3 < resp.t2 or t4 < resp.t1:
            self.rejected += 1  # impossible timestamps: a clock stepped or a reply was forged
            return None
        self.samples.append(sample)
        return sample

    def best(self) -> Sample | None:
        return min(self.samples, key=lambda s: s.rtt_ns, default=None)

    def report(self) -> ClockReport | None:
        best = self.best()
        if best is None:
            return None
        # ceil(rtt / 2): the offset of the best sample is off by at most half its round trip.
        return ClockReport(best.offset_ns, (best.rtt_ns + 1) // 2, best.rtt_ns)
