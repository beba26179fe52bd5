"""RTCP the relay reads and writes: built bytes parse back to the same values."""

from __future__ import annotations

import pytest

from sfu_sidecar.ntptime import middle32, unix_ns_to_ntp
from sfu_sidecar.relay import rtcp
from sfu_sidecar.relay.hooks import SenderReport
from sfu_sidecar.relay.upstream import ReceptionReport


def test_sender_report_round_trip_keeps_both_halves_of_the_clock_pair() -> None:
    info = SenderReport(0xE1234567_89ABCDEF, 0xDEADBEEF, 1000, 123456)
    data = rtcp.build_sr(0x11223344, info)
    assert data[:4] == bytes.fromhex("80c80006")
    (msg,) = rtcp.parse_compound(data, arrival_ns=42)
    assert msg == rtcp.SenderReportPacket(
        0x11223344, SenderReport(info.ntp_timestamp, info.rtp_timestamp, 1000, 123456, 42), ()
    )


def test_receiver_report_with_negative_cumulative_loss() -> None:
    report = ReceptionReport(fraction_lost=64, packets_lost=-3, highest_sequence=70000,
                             jitter=90)
    data = rtcp.build_rr(7, [(9, report, 0x12345678, 65536)])
    (msg,) = rtcp.parse_compound(data)
    assert msg == rtcp.ReceiverReportPacket(
        7, (rtcp.ReportBlock(9, 64, -3, 70000, 90, 0x12345678, 65536),)
    )


def test_feedback_messages() -> None:
    compound = (
        rtcp.build_nack(1, 2, [65535, 0, 1])
        + rtcp.build_pli(1, 2)
        + rtcp.build_remb(1, 1_500_000, [2, 3])
        + rtcp.build_sdes_cname(1, "cname")
    )
    nack, pli, remb = rtcp.parse_compound(compound)
    assert nack == rtcp.Nack(1, 2, (65535, 0, 1))
    assert pli == rtcp.KeyframeRequest(1, (2,), fir=False)
    assert isinstance(remb, rtcp.Remb) and remb.media_ssrcs == (2, 3)
    # 18-bit mantissa: the exponent costs at most 2^exp - 1 of precision.
    assert 1_500_000 - 8 <= remb.bitrate <= 1_500_000


def test_fir_names_each_ssrc() -> None:
    # PSFB FMT=4: sender, media=0, FCI entries (ssrc, seq nr, reserved)
    data = bytes.fromhex("84ce0004" "00000001" "00000000" "0000000a" "07000000")
    assert rtcp.parse_compound(data) == [rtcp.KeyframeRequest(1, (10,), fir=True)]


def test_torn_datagrams_raise_value_error() -> None:
    data = rtcp.build_sr(1, SenderReport(1, 2, 3, 4))
    with pytest.raises(ValueError):
        rtcp.parse_compound(data[:-4])
    with pytest.raises(ValueError):
        rtcp.parse_compound(b"\x40" + data[1:])
    assert rtcp.parse_compound(data[:3]) == []


def test_ntp_conversions() -> None:
    ntp = unix_ns_to_ntp(1_700_000_000_500_000_000)
    assert ntp >> 32 == 1_700_000_000 + 2_208_988_800
    assert (ntp & 0xFFFFFFFF) == 1 << 31
    assert middle32(ntp) == ((ntp >> 16) & 0xFFFFFFFF)
