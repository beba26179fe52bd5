"""RTP wire view: parse(bytes) == packet, serialize(packet) == bytes, and refusals."""

from __future__ import annotations

import pytest

from sfu_sidecar.relay.packet import (
    RtpPacket,
    RtpParseError,
    build_extensions,
    build_nack_fci,
    is_keyframe_start,
    parse_extensions,
    parse_nack_fci,
    seq_newer,
    unwrap_rtx,
    wrap_rtx,
)

# V=2 X=1 CC=0 | M=1 PT=96 | seq 0x1234 | ts 0xDEADBEEF | ssrc 0x01020304
# one-byte extensions: id 1 len 1 "0", id 3 len 3 00 01 02, one padding byte
WIRE = bytes.fromhex(
    "90e01234deadbeef01020304"
    "bede0002" "1030" "32000102" "00"
    "00"
    "cafe"
)
PACKET = RtpPacket(
    payload_type=96, sequence_number=0x1234, timestamp=0xDEADBEEF, ssrc=0x01020304,
    marker=True, payload=b"\xca\xfe", extensions=((1, b"0"), (3, b"\x00\x01\x02")),
)


def test_parse_and_serialize_are_inverse() -> None:
    assert RtpPacket.parse(WIRE) == PACKET
    again = PACKET.serialize()
    assert RtpPacket.parse(again) == PACKET
    # Our own encoding pads the extension block to a word with zero bytes only.
    assert again == bytes.fromhex("90e01234deadbeef01020304bede00021030320001020000cafe")


def test_csrcs_and_padding() -> None:
    wire = bytes.fromhex("a2600001000000020000000300000004000000050a0b0c000003")
    pkt = RtpPacket.parse(wire)
    assert pkt.csrcs == (4, 5)
    assert pkt.payload == b"\x0a\x0b\x0c"  # the 3 padding bytes are gone
    assert RtpPacket.parse(pkt.serialize()) == pkt


def test_two_byte_extensions_when_one_byte_cannot_hold_them() -> None:
    exts = ((20, b"x" * 3), (2, b""), (3, b"y" * 17))
    block = build_extensions(exts)
    assert block[:2] == b"\x10\x00"
    assert parse_extensions(0x1000, block[4:]) == exts
    assert parse_extensions(0xBEDE, bytes.fromhex("10 41 f0 99".replace(" ", ""))) == (
        (1, b"A"),
    )  # id 15 stops parsing


def test_unknown_extension_profile_is_dropped() -> None:
    assert parse_extensions(0xABCD, b"\x01\x02\x03\x04") == ()


def test_every_truncation_is_refused_not_crashed() -> None:
    for end in range(len(WIRE) - 2):  # the last two bytes are payload, so cutting them parses
        try:
            RtpPacket.parse(WIRE[:end])
        except RtpParseError:
            continue
        raise AssertionError(f"parsed a packet cut at {end} bytes")


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        (bytes.fromhex("40600001000000020000000300"), "version"),
        (bytes.fromhex("a0600001000000020000000300"), "padding"),
        (bytes.fromhex("a06000010000000200000003ff"), "padding"),
    ],
)
def test_malformed_headers(wire: bytes, reason: str) -> None:
    with pytest.raises(RtpParseError, match=reason):
        RtpPacket.parse(wire)


def test_rtx_round_trip() -> None:
    assert wrap_rtx(0xBEEF, b"payload") == b"\xbe\xefpayload"
    assert unwrap_rtx(b"\xbe\xefpayload") == (0xBEEF, b"payload")
    with pytest.raises(RtpParseError):
        unwrap_rtx(b"\x01")


def test_vp8_keyframe_detection() -> None:
    # S=1 PID=0, no X; payload header P=0 -> keyframe
    assert is_keyframe_start("vp8", bytes([0x10, 0x00, 0x00, 0x00]))
    # same, P=1 -> interframe
    assert not is_keyframe_start("vp8", bytes([0x10, 0x01]))
    # continuation packet (S=0)
    assert not is_keyframe_start("vp8", bytes([0x00, 0x00]))
    # X with I (15-bit picture id), L and T/K bytes before the payload header
    assert is_keyframe_start("vp8", bytes([0x90, 0xE0, 0x80, 0x01, 0x05, 0x20, 0x00]))
    assert not is_keyframe_start("vp8", bytes([0x90, 0xE0, 0x80, 0x01, 0x05, 0x20, 0x01]))
    assert not is_keyframe_start("vp8", bytes([0x90, 0x80]))  # truncated descriptor
    assert not is_keyframe_start("vp8", b"")


def test_h264_keyframe_detection() -> None:
    assert is_keyframe_start("h264", bytes([0x65, 0x88]))  # IDR slice
    assert is_keyframe_start("h264", bytes([0x67, 0x42]))  # SPS
    assert not is_keyframe_start("h264", bytes([0x41, 0x9A]))  # non-IDR slice
    # STAP-A with SPS (2 bytes) then PPS
    assert is_keyframe_start("h264", bytes([0x78, 0x00, 0x02, 0x67, 0x42, 0x00, 0x01, 0x68]))
    assert not is_keyframe_start("h264", bytes([0x78, 0x00, 0x01, 0x41]))
    # FU-A start of an IDR vs. a middle fragment
    assert is_keyframe_start("h264", bytes([0x7C, 0x85, 0x00]))
    assert not is_keyframe_start("h264", bytes([0x7C, 0x05, 0x00]))
    assert not is_keyframe_start("opus", bytes([0x65]))


def test_nack_fci_wraps_at_2_16() -> None:
    lost = [65534, 65535, 0, 3, 40]
    fci = build_nack_fci(lost)
    assert fci == bytes.fromhex("fffe0013" "00280000")
    assert parse_nack_fci(fci) == lost
    assert parse_nack_fci(b"") == []


def test_sequence_order_across_wrap() -> None:
    assert seq_newer(1, 65535)
    assert not seq_newer(65535, 1)
    assert not seq_newer(7, 7)
