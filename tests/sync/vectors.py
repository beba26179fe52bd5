"""The sync wire vectors: JSON form of messages, and the generator of ``proto/vectors/sync_*.json``.

The JSON form is the one both codecs' tests compare against: snake_case field names as in
``proto/sync.md``, source names as strings, and every 64-bit quantity (``capture_ns`` and all
integer control fields) as a decimal string, because JSON numbers lose precision past 2**53 in
JavaScript.

Regenerate with ``.venv/bin/python -m tests.sync.vectors``; the tests then check both codecs
against the files, so a change to the format shows up as a diff of the vectors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sfu_sidecar.sync import control, wire
from sfu_sidecar.sync.wire import (
    AnchorRecord,
    Batch,
    ClockReport,
    ClockReq,
    ClockResp,
    ControlMessage,
    ControlRecord,
    Cue,
    CueRetract,
    Epoch,
    FrameRecord,
    PublisherState,
    Source,
    Telemetry,
    UnknownControl,
)

VECTOR_DIR = Path(__file__).resolve().parents[2] / "proto" / "vectors"
VALID_FILE = VECTOR_DIR / "sync_messages.json"
MALFORMED_FILE = VECTOR_DIR / "sync_malformed.json"
PREDICT_FILE = VECTOR_DIR / "sync_predict.json"

_SOURCE_NAMES = {s: s.name.lower() for s in Source}
_SOURCES = {v: k for k, v in _SOURCE_NAMES.items()}


def control_to_json(msg: wire.Control) -> dict[str, Any]:
    # Only the schema's integer fields become strings; an unknown type's map stays as sent.
    schema = {name: kind for name, kind, _ in control._SCHEMAS.get(msg.type, [])}
    return {k: str(v) if schema.get(k) is int else v for k, v in wire.control_to_map(msg).items()}


def control_from_json(obj: dict[str, Any]) -> wire.Control:
    schema = {name: kind for name, kind, _ in control._SCHEMAS.get(obj["type"], [])}
    return wire.control_from_map(
        {k: int(v) if schema.get(k) is int else v for k, v in obj.items()}
    )


def record_to_json(rec: wire.Record) -> dict[str, Any]:
    if isinstance(rec, AnchorRecord):
        return {
            "type": "anchor", "track": rec.track, "generation": rec.generation,
            "source": _SOURCE_NAMES[rec.source], "clock_rate": rec.clock_rate,
            "rtp_ts": rec.rtp_ts, "capture_ns": str(rec.capture_ns), "drift_ppb": rec.drift_ppb,
            "mid": rec.mid, "audio": rec.audio, "reset": rec.reset, "estimated": rec.estimated,
        }
    if isinstance(rec, FrameRecord):
        return {
            "type": "frame", "track": rec.track, "generation": rec.generation,
            "source": _SOURCE_NAMES[rec.source], "rtp_delta": rec.rtp_delta,
            "residual_ns": rec.residual_ns, "keyframe": rec.keyframe, "audio": rec.audio,
        }
    return {"type": "control", "message": control_to_json(rec.message)}


def record_from_json(obj: dict[str, Any]) -> wire.Record:
    if obj["type"] == "anchor":
        return AnchorRecord(
            track=obj["track"], generation=obj["generation"], source=_SOURCES[obj["source"]],
            clock_rate=obj["clock_rate"], rtp_ts=obj["rtp_ts"], capture_ns=int(obj["capture_ns"]),
            drift_ppb=obj["drift_ppb"], mid=obj["mid"], audio=obj["audio"], reset=obj["reset"],
            estimated=obj["estimated"],
        )
    if obj["type"] == "frame":
        return FrameRecord(
            track=obj["track"], generation=obj["generation"], source=_SOURCES[obj["source"]],
            rtp_delta=obj["rtp_delta"], residual_ns=obj["residual_ns"], keyframe=obj["keyframe"],
            audio=obj["audio"],
        )
    return ControlRecord(control_from_json(obj["message"]))


def message_to_json(msg: wire.Message) -> dict[str, Any]:
    if isinstance(msg, Batch):
        records = [record_to_json(r) for r in msg.records]
        return {"kind": "batch", "seq": msg.seq, "records": records}
    return {"kind": "control", "message": control_to_json(msg.message)}


def message_from_json(obj: dict[str, Any]) -> wire.Message:
    if obj["kind"] == "batch":
        return Batch(obj["seq"], tuple(record_from_json(r) for r in obj["records"]))
    return ControlMessage(control_from_json(obj["message"]))


def derived_frames(batch: Batch) -> list[dict[str, Any]]:
    """Absolute RTP timestamp and capture time of each frame, resolved against the anchor of
    the same (track, generation) in the batch: both codecs must compute the same numbers."""
    anchors = {(r.track, r.generation): r for r in batch.records if isinstance(r, AnchorRecord)}
    out = []
    for r in batch.records:
        if isinstance(r, FrameRecord):
            a = anchors[(r.track, r.generation)]
            out.append({"rtp_ts": r.rtp_ts(a), "capture_ns": str(r.capture_ns(a))})
    return out


# 2026-11-30T08:00:00Z in house ns, plus change, so the low digits are exercised.
T0 = 1_796_025_600_000_000_000 + 123_456_789


def _valid() -> list[tuple[str, wire.Message]]:
    video = AnchorRecord(
        0, 3, Source.SENDER_REPORT, 90_000, 0xFFFF_F000, T0, drift_ppb=-25, mid="0"
    )
    audio = AnchorRecord(
        1, 0, Source.ABS_CAPTURE_TIME, 48_000, 960_000, T0 + 5_000_000, drift_ppb=40, mid="1",
        audio=True, estimated=True,
    )
    frames = [
        FrameRecord.against(video, 0xFFFF_F000 + 3000 * i, T0 + 33_333_333 * i + 700 * i,
                            Source.SENDER_REPORT, keyframe=i == 0)
        for i in range(3)
    ]
    wrapped = FrameRecord.against(video, (0xFFFF_F000 + 9000) & 0xFFFF_FFFF, T0 + 100_000_000,
                                  Source.ARRIVAL)
    before = FrameRecord.against(video, 0xFFFF_F000 - 3000, T0 - 33_333_333, Source.SENDER_REPORT)
    aframes = [
        FrameRecord.against(audio, 960_000 + 960 * i, T0 + 5_000_000 + 20_000_000 * i - 3,
                            Source.ABS_CAPTURE_TIME, audio=True)
        for i in range(2)
    ]
    recs = [f for f in [*frames, wrapped, before, *aframes] if f is not None]
    assert len(recs) == 7
    reset = AnchorRecord(0, 4, Source.ARRIVAL, 90_000, 12345, T0 + 7_000_000_000, mid="video-0",
                         reset=True)
    return [
        ("empty batch", Batch(0)),
        ("anchors and frames, video wraps 2**32", Batch(65535, (video, audio, *recs))),
        ("reset anchor, max generation", Batch(1, (reset, AnchorRecord(
            2, 15, Source.SENDER_REPORT, 48_000, 0, 0, drift_ppb=-100_000_000)))),
        ("batch with control records", Batch(9, (
            video,
            ControlRecord(Epoch("demo", T0)),
            ControlRecord(Cue("demo", "en", "c-17", 12.5, 14.25, "Grüße, world", True)),
            ControlRecord(CueRetract("demo", "en", "c-16")),
        ))),
        ("control epoch", ControlMessage(Epoch("demo", T0))),
        ("control cue interim, integral times", ControlMessage(
            Cue("demo", "de", "7", 3.0, 4.0, "", False))),
        ("control cue with settings", ControlMessage(
            Cue("demo", "en", "c-18", 20.0, 21.5, "top left", True, "line:0 align:start"))),
        ("control cue retract", ControlMessage(CueRetract("demo", "en", "c-16"))),
        ("control clock_req", ControlMessage(ClockReq(T0))),
        ("control clock_resp", ControlMessage(ClockResp(T0, T0 + 150_000, T0 + 190_000))),
        ("control clock_report, negative",
         ControlMessage(ClockReport(-2_500_000, 40_000, 900_000))),
        ("control telemetry", ControlMessage(Telemetry("demo", T0, 150, 149, 0))),
        ("control publisher gone", ControlMessage(PublisherState("demo", False))),
        ("control unknown type kept", ControlMessage(UnknownControl("future", {"x": 1}))),
    ]


def _malformed(valid: list[tuple[str, bytes]]) -> list[tuple[str, bytes, str]]:
    batch = dict(valid)["anchors and frames, video wraps 2**32"]
    ctl = dict(valid)["control epoch"]
    return [
        ("empty message", b"", "truncated"),
        ("version only", b"\x01", "truncated"),
        ("batch header cut", bytes.fromhex("0101ff"), "truncated"),
        ("bad version 0", b"\x00" + batch[1:], "bad_version"),
        ("bad version 2", b"\x02" + batch[1:], "bad_version"),
        ("unknown message kind", bytes.fromhex("0107"), "unknown_type"),
        ("unknown record type", bytes.fromhex("010100000109"), "unknown_type"),
        ("count larger than records", bytes.fromhex("0101000002") + batch[5:5 + 26],
         "truncated"),
        ("frame cut short", bytes.fromhex("010100000102000000"), "truncated"),
        ("trailing garbage after batch", batch + b"\x00", "trailing_bytes"),
        ("trailing garbage after control", ctl + b"\xc0", "trailing_bytes"),
        ("reserved source code 3", bytes.fromhex("0101000001" "020003" "00000000" "00000000"),
         "bad_field"),
        ("zero clock rate", bytes.fromhex("0101000001" "01000001" "00000000" "00000000"
                                          "0000000000000000" "00000000" "00"), "bad_field"),
        ("generation over 15", bytes.fromhex("0101000001" "01001001" "00015f90" "00000000"
                                             "0000000000000000" "00000000" "00"), "bad_field"),
        ("mid not utf-8", bytes.fromhex("0101000001" "01000001" "00015f90" "00000000"
                                        "0000000000000000" "00000000" "01ff"), "bad_field"),
        ("control not a map", bytes.fromhex("0102") + b"\x93\x01\x02\x03", "bad_control"),
        ("control without type", bytes.fromhex("0102") + b"\x81\xa1t\x01", "bad_control"),
        ("control epoch_ns is a string",
         bytes.fromhex("0102") + b"\x83\xa4type\xa5epoch\xa6stream\xa1s\xa8epoch_ns\xa15",
         "bad_control"),
        ("control cue without text",
         bytes.fromhex("0102") + b"\x82\xa4type\xa3cue\xa6stream\xa1s", "bad_control"),
        ("control msgpack cut", ctl[:-3], "truncated"),
        ("control record length past end", bytes.fromhex("0101000001" "030010" "80"),
         "truncated"),
        ("control record bad msgpack", bytes.fromhex("0101000001" "030001" "c1"), "bad_control"),
    ]


def build() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    valid = [(name, msg.serialize()) for name, msg in _valid()]
    out = []
    for (name, msg), (_, raw) in zip(_valid(), valid, strict=True):
        entry: dict[str, Any] = {"name": name, "hex": raw.hex(), "message": message_to_json(msg)}
        if isinstance(msg, Batch) and any(isinstance(r, FrameRecord) for r in msg.records):
            entry["frames"] = derived_frames(msg)
        out.append(entry)
    bad = [{"name": n, "hex": raw.hex(), "error": kind} for n, raw, kind in _malformed(valid)]
    return out, bad


def build_predict() -> list[dict[str, Any]]:
    """Anchor interpolation at random and extreme points (negative deltas, wraps, extreme
    drift and clock rates), so the two codecs' rounding is checked beyond the frame vectors."""
    import random

    rng = random.Random(5)
    cases = []
    for i in range(60):
        rate = rng.choice([90_000, 48_000, 8_000, 1, 0xFFFF_FFFF]) if i % 3 else 90_000
        anchor = AnchorRecord(
            0, 0, Source.SENDER_REPORT, rate, rng.randrange(1 << 32),
            rng.choice([0, T0, (1 << 64) - 1, rng.randrange(1 << 64)]),
            drift_ppb=rng.choice([0, -1, 1, -100_000_000, 100_000_000,
                                  rng.randrange(-50_000, 50_000)]),
        )
        rtp_ts = rng.choice([anchor.rtp_ts, anchor.rtp_ts ^ 0x8000_0000, rng.randrange(1 << 32),
                             (anchor.rtp_ts - rng.randrange(1, 10_000)) & 0xFFFF_FFFF])
        cases.append({
            "clock_rate": rate, "anchor_rtp_ts": anchor.rtp_ts,
            "capture_ns": str(anchor.capture_ns), "drift_ppb": anchor.drift_ppb,
            "rtp_ts": rtp_ts, "expected_ns": str(anchor.capture_of(rtp_ts)),
        })
    return cases


def main() -> None:
    valid, bad = build()
    PREDICT_FILE.write_text(json.dumps({"note": "Generated by tests/sync/vectors.py; "
                                        "proto/sync.md \"Arithmetic\".",
                                        "vectors": build_predict()}, indent=1) + "\n")
    note = "Generated by tests/sync/vectors.py; spec in proto/sync.md."
    VALID_FILE.write_text(json.dumps({"note": note, "vectors": valid}, indent=1,
                                     ensure_ascii=False) + "\n")
    MALFORMED_FILE.write_text(json.dumps({"note": note, "vectors": bad}, indent=1) + "\n")


if __name__ == "__main__":
    main()
