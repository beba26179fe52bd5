"""Control messages of the ``sync`` channel: msgpack maps with a ``"type"`` (proto/sync.md,
"Control messages"), each a frozen dataclass with a fixed field schema, packed canonically so
the JavaScript codec reproduces the bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

import msgpack

# Clock-join messages are defined once, in the clock package; captions' in the captions package.
from sfu_sidecar.captions.events import Cue, CueRetract, Epoch
from sfu_sidecar.clock.exchange import ClockReport, ClockReq, ClockResp
from sfu_sidecar.sync.wireerror import MAX_MESSAGE, ErrorKind, SyncWireError

# Field schemas: name -> python type. Order is the serialisation order (after "type"), so the
# bytes are canonical and the JS codec reproduces them exactly.
_STR, _INT, _FLOAT, _BOOL = str, int, float, bool


@dataclass(frozen=True, slots=True)
class PublisherState:
    """Whether the stream has a live publisher: sent at join, on every change and repeated,
    so a viewer learns that the publisher left (DELETE, or reaped when it vanished) and when
    another took over."""

    stream: str
    live: bool
    type: ClassVar[str] = "publisher"


@dataclass(frozen=True, slots=True)
class Telemetry:
    """What a viewer reports about its own mapping, a few times a minute."""

    stream: str
    t_ns: int  # viewer's house-time estimate when it sent this
    presented: int  # frames presented since the last report
    mapped: int  # of those, frames that mapped to a capture time
    lost_batches: int  # gaps seen in batch seq since the last report
    type: ClassVar[str] = "telemetry"


@dataclass(frozen=True, slots=True)
class Playout:
    """What a viewer measures of its own playout since its previous report."""

    stream: str
    t_ns: int  # viewer's house-time estimate when it sent this
    frames: int  # frames presented with both their video and audio capture time known
    av_skew_ms: float  # median over those of audio capture - video capture played together
    captions: int  # cues that started showing
    caption_error_ms: float  # mean of (capture time of the first frame showing a cue - start)
    resyncs: int  # sync timelines the page restarted (reset anchors)
    type: ClassVar[str] = "playout"


@dataclass(frozen=True, slots=True)
class UnknownControl:
    """A control map whose ``type`` this version does not know; kept, not refused, so a
    newer peer's additions never cost the records travelling with them."""

    type: str
    fields: Mapping[str, Any] = field(default_factory=dict)


KnownControl = (
    Epoch | Cue | CueRetract | ClockReq | ClockResp | ClockReport | Telemetry | Playout
    | PublisherState
)
Control = KnownControl | UnknownControl

CONTROL_TYPES: dict[str, type[KnownControl]] = {
    cls.type: cls
    for cls in (Epoch, Cue, CueRetract, ClockReq, ClockResp, ClockReport, Telemetry, Playout,
                PublisherState)
}
_I64_MIN, _U64_MAX = -(1 << 63), (1 << 64) - 1


# A field's default, for the optional fields a later version added; required ones have none.
_REQUIRED = object()


def _control_fields(cls: type[KnownControl]) -> list[tuple[str, type, Any]]:
    # Annotations are strings under ``from __future__ import annotations``.
    hints: dict[str, type] = {"str": _STR, "int": _INT, "float": _FLOAT, "bool": _BOOL}
    return [
        (f.name, hints[str(f.type)], _REQUIRED if f.default is MISSING else f.default)
        for f in fields(cls)
    ]


_SCHEMAS: dict[str, list[tuple[str, type, Any]]] = {
    name: _control_fields(cls) for name, cls in CONTROL_TYPES.items()
}


def _check_value(kind: type, value: Any, name: str) -> Any:
    if kind is _FLOAT:
        # An integral float may arrive packed as an int from a JS peer; both mean the same.
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SyncWireError(ErrorKind.BAD_CONTROL, f"{name} must be a number")
        if not math.isfinite(value):
            raise SyncWireError(ErrorKind.BAD_CONTROL, f"{name} must be finite")
        return float(value)
    if kind is _INT:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SyncWireError(ErrorKind.BAD_CONTROL, f"{name} must be an integer")
        if not _I64_MIN <= value <= _U64_MAX:
            raise SyncWireError(ErrorKind.BAD_CONTROL, f"{name} out of 64-bit range")
        return value
    if not isinstance(value, kind):
        raise SyncWireError(ErrorKind.BAD_CONTROL, f"{name} must be {kind.__name__}")
    return value


def control_from_map(obj: Any) -> Control:
    """Validate a decoded msgpack value as a control message. Unknown keys are ignored so
    later versions can add fields."""
    if not isinstance(obj, dict):
        raise SyncWireError(ErrorKind.BAD_CONTROL, "control payload is not a map")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise SyncWireError(ErrorKind.BAD_CONTROL, "control map without a string 'type'")
    schema = _SCHEMAS.get(kind)
    if schema is None:
        return UnknownControl(kind, {k: v for k, v in obj.items() if k != "type"})
    values: dict[str, Any] = {}
    for name, ftype, default in schema:
        if name not in obj:
            if default is _REQUIRED:
                raise SyncWireError(ErrorKind.BAD_CONTROL, f"{kind} without {name!r}")
            continue
        values[name] = _check_value(ftype, obj[name], name)
    return CONTROL_TYPES[kind](**values)


def control_to_map(msg: Control) -> dict[str, Any]:
    if isinstance(msg, UnknownControl):
        return {"type": msg.type, **msg.fields}
    out: dict[str, Any] = {"type": msg.type}
    for name, ftype, default in _SCHEMAS[msg.type]:
        value = getattr(msg, name)
        if default is not _REQUIRED and value == default:
            continue  # an optional field at its default is left out: older peers' bytes
        out[name] = float(value) if ftype is _FLOAT else value
    return out


def pack_control(msg: Control) -> bytes:
    """msgpack bytes of a control map (float64 for floats, str type for text: canonical)."""
    try:
        packed: bytes = msgpack.packb(control_to_map(msg), use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SyncWireError(ErrorKind.BAD_CONTROL, f"cannot pack: {exc}") from None
    return packed


def unpack_control(payload: bytes) -> Control:
    # An Unpacker, not unpackb: it tells an incomplete map (a cut message: "truncated", as
    # for binary records) from bytes that are not msgpack at all.
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=MAX_MESSAGE)
    try:
        unpacker.feed(payload)
        obj = unpacker.unpack()
    except msgpack.OutOfData:
        raise SyncWireError(ErrorKind.TRUNCATED, "msgpack map cut short") from None
    except Exception as exc:  # msgpack raises a zoo of types on bad input; all mean the same
        raise SyncWireError(ErrorKind.BAD_CONTROL, f"bad msgpack: {type(exc).__name__}") from None
    if unpacker.tell() != len(payload):
        raise SyncWireError(ErrorKind.TRAILING_BYTES, "bytes after the msgpack map")
    return control_from_map(obj)
