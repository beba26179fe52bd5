"""The sync codec against the shared vectors, cut byte by byte, and under generated input."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sfu_sidecar.exceptions import BadInput
from sfu_sidecar.sync import wire
from sfu_sidecar.sync.wire import (
    AnchorRecord,
    Batch,
    ControlMessage,
    ControlRecord,
    Cue,
    Epoch,
    FrameRecord,
    Source,
    SyncWireError,
    parse_message,
)
from tests.sync import vectors

VALID: list[dict[str, Any]] = json.loads(vectors.VALID_FILE.read_text())["vectors"]
MALFORMED: list[dict[str, Any]] = json.loads(vectors.MALFORMED_FILE.read_text())["vectors"]


def test_vector_files_are_what_the_generator_writes() -> None:
    # A hand edit of the JSON, or a codec change without regenerating, fails here.
    valid, bad = vectors.build()
    assert valid == VALID
    assert bad == MALFORMED
    assert vectors.build_predict() == json.loads(vectors.PREDICT_FILE.read_text())["vectors"]


def test_predict_vectors_by_an_independent_formula() -> None:
    # Rational arithmetic, rounded half up: the spec's formula, not the codec's code.
    from fractions import Fraction

    for v in json.loads(vectors.PREDICT_FILE.read_text())["vectors"]:
        d = wire.signed32(v["rtp_ts"] - v["anchor_rtp_ts"])
        exact = Fraction(d * (10**9 + v["drift_ppb"]), v["clock_rate"])
        rounded = (exact + Fraction(1, 2)).__floor__()
        assert int(v["capture_ns"]) + rounded == int(v["expected_ns"]), v


@pytest.mark.parametrize("vec", VALID, ids=[v["name"] for v in VALID])
def test_parse_vector(vec: dict[str, Any]) -> None:
    msg = parse_message(bytes.fromhex(vec["hex"]))
    assert vectors.message_to_json(msg) == vec["message"]
    if "frames" in vec:
        assert isinstance(msg, Batch)
        assert vectors.derived_frames(msg) == vec["frames"]


@pytest.mark.parametrize("vec", VALID, ids=[v["name"] for v in VALID])
def test_serialize_vector(vec: dict[str, Any]) -> None:
    assert vectors.message_from_json(vec["message"]).serialize().hex() == vec["hex"]


@pytest.mark.parametrize("vec", MALFORMED, ids=[v["name"] for v in MALFORMED])
def test_malformed_vector(vec: dict[str, Any]) -> None:
    with pytest.raises(SyncWireError) as info:
        parse_message(bytes.fromhex(vec["hex"]))
    assert info.value.kind == vec["error"]
    assert isinstance(info.value, BadInput) and info.value.status == 400


@pytest.mark.parametrize("vec", VALID, ids=[v["name"] for v in VALID])
def test_every_strict_prefix_is_truncated(vec: dict[str, Any]) -> None:
    raw = bytes.fromhex(vec["hex"])
    for cut in range(len(raw)):
        with pytest.raises(SyncWireError) as info:
            parse_message(raw[:cut])
        assert info.value.kind == "truncated", (cut, info.value)


def test_frame_layout_by_hand() -> None:
    # type 2, track 1, flags: source arrival (2) | keyframe (4) | audio (8) | generation 5 << 4
    frame = FrameRecord(1, 5, Source.ARRIVAL, rtp_delta=-3000, residual_ns=1_000_000,
                        keyframe=True, audio=True)
    assert frame.serialize() == bytes([2, 1, 0x5E]) + (-3000).to_bytes(4, "big", signed=True) + \
        (1_000_000).to_bytes(4, "big", signed=True)
    assert wire.FrameRecord.size == 11


def test_anchor_predicts_across_the_wrap_with_drift() -> None:
    a = AnchorRecord(0, 0, Source.SENDER_REPORT, 90_000, 0xFFFF_FFFF - 899, 10**18, drift_ppb=1000)
    # 1800 ticks later the 32-bit timestamp has wrapped; 20 ms at +1 ppm is 20 ms + 20 ns.
    assert a.capture_of(900) == 10**18 + 20_000_020
    assert a.capture_of(0xFFFF_FFFF - 899 - 90_000) == 10**18 - 1_000_001_000


def test_frame_too_far_from_anchor_is_refused() -> None:
    a = AnchorRecord(0, 0, Source.ARRIVAL, 90_000, 0, 10**18)
    assert FrameRecord.against(a, 90_000, 10**18 + 1_000_000_000, Source.ARRIVAL) is not None
    assert FrameRecord.against(a, 90_000, 10**18 + 4_000_000_000, Source.ARRIVAL) is None


def test_bad_fields_refused_at_construction() -> None:
    with pytest.raises(SyncWireError):
        AnchorRecord(0, 16, Source.ARRIVAL, 90_000, 0, 0)
    with pytest.raises(SyncWireError):
        FrameRecord(0, 0, Source.ARRIVAL, 1 << 31, 0)
    with pytest.raises(SyncWireError):
        Batch(0, tuple(FrameRecord(0, 0, Source.ARRIVAL, 0, 0) for _ in range(256)))


def test_float_fields_accept_integers_from_js_peers() -> None:
    import msgpack

    raw = b"\x01\x02" + msgpack.packb({"type": "cue", "stream": "s", "lang": "en", "id": "1",
                                       "start": 3, "end": 4, "text": "", "final": False,
                                       "extra": [1, 2]})
    msg = parse_message(raw)
    assert msg == ControlMessage(Cue("s", "en", "1", 3.0, 4.0, "", False))


def test_cue_settings_are_optional_both_ways() -> None:
    """A cue without settings is the bytes an older peer sends and reads; one with settings
    names them, and an older peer (which ignores unknown keys) still gets the cue."""
    import msgpack

    plain = ControlMessage(Cue("s", "en", "1", 3.0, 4.0, "hi", True)).serialize()
    assert "settings" not in msgpack.unpackb(plain[2:])
    placed = ControlMessage(Cue("s", "en", "1", 3.0, 4.0, "hi", True, "line:0")).serialize()
    assert msgpack.unpackb(placed[2:])["settings"] == "line:0"
    assert parse_message(placed) == ControlMessage(Cue("s", "en", "1", 3.0, 4.0, "hi", True,
                                                       "line:0"))
    bad = b"\x01\x02" + msgpack.packb({"type": "cue", "stream": "s", "lang": "en", "id": "1",
                                        "start": 3, "end": 4, "text": "", "final": False,
                                        "settings": 5})
    with pytest.raises(SyncWireError, match="settings must be str"):
        parse_message(bad)


# --- generated input ------------------------------------------------------------------------

u8 = st.integers(0, 255)
i32 = st.integers(-(1 << 31), (1 << 31) - 1)
sources = st.sampled_from(list(Source))
anchors = st.builds(
    AnchorRecord, track=u8, generation=st.integers(0, 15), source=sources,
    clock_rate=st.integers(1, 0xFFFF_FFFF), rtp_ts=st.integers(0, 0xFFFF_FFFF),
    capture_ns=st.integers(0, (1 << 64) - 1), drift_ppb=st.integers(-100_000_000, 100_000_000),
    mid=st.text(max_size=20), audio=st.booleans(), reset=st.booleans(), estimated=st.booleans(),
)
frames = st.builds(
    FrameRecord, track=u8, generation=st.integers(0, 15), source=sources, rtp_delta=i32,
    residual_ns=i32, keyframe=st.booleans(), audio=st.booleans(),
)
finite = st.floats(allow_nan=False, allow_infinity=False)
controls = st.one_of(
    st.builds(Epoch, stream=st.text(), epoch_ns=st.integers(0, (1 << 64) - 1)),
    st.builds(Cue, stream=st.text(), lang=st.text(), id=st.text(), start=finite, end=finite,
              text=st.text(), final=st.booleans(), settings=st.text()),
    st.builds(wire.ClockReport, offset_ns=st.integers(-(1 << 63), (1 << 63) - 1),
              error_ns=st.integers(0, 1 << 40), rtt_ns=st.integers(0, 1 << 40)),
)
records = st.one_of(anchors, frames, st.builds(ControlRecord, controls))
batches = st.builds(Batch, seq=st.integers(0, 0xFFFF),
                    records=st.lists(records, max_size=20).map(tuple))


@settings(max_examples=300, deadline=None)
@given(batches)
def test_batch_round_trip(batch: Batch) -> None:
    raw = batch.serialize()
    assert parse_message(raw) == batch
    assert parse_message(raw).serialize() == raw


@settings(max_examples=200, deadline=None)
@given(controls)
def test_control_round_trip(msg: wire.Control) -> None:
    raw = ControlMessage(msg).serialize()
    assert parse_message(raw) == ControlMessage(msg)


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    for prefix in (b"", b"\x01\x01", b"\x01\x02", b"\x01\x01\x00\x00\x03"):
        with contextlib.suppress(SyncWireError):
            parse_message(prefix + data)


@settings(max_examples=300, deadline=None)
@given(batches, st.data())
def test_flipped_byte_never_crashes(batch: Batch, data: st.DataObject) -> None:
    raw = bytearray(batch.serialize())
    pos = data.draw(st.integers(0, len(raw) - 1))
    raw[pos] ^= data.draw(st.integers(1, 255))
    with contextlib.suppress(SyncWireError):
        parse_message(bytes(raw))
