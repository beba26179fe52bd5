"""SNTP codec and client, byte for byte and against a simulated server."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sfu_sidecar.clock.ntp import (
    PACKET_LEN,
    Mode,
    NtpError,
    NtpPacket,
    NtpSample,
    SntpClient,
)
from sfu_sidecar.ntptime import NTP_UNIX_OFFSET_S as NTP_UNIX_DELTA_S
from sfu_sidecar.ntptime import ntp_to_unix_ns, unix_ns_to_ntp

NS = 1_000_000_000
T = 1_764_489_600 * NS + 250_000_000  # 2025-11-30T08:00:00.25Z

# A chronyd reply: LI 0, VN 4, mode 4, stratum 8, poll 6, precision -25, root delay 0,
# root dispersion 0x00000010, refid 127.127.1.1, then four 32.32 timestamps.
REPLY_HEX = (
    "24" "08" "06" "e7" "00000000" "00000010" "7f7f0101"
    "ecb4a0a0" "00000000"
    "ecb4a0a0" "40000000"
    "ecb4a0a0" "40010000"
    "ecb4a0a0" "40020000"
)


def test_packet_both_ways() -> None:
    data = bytes.fromhex(REPLY_HEX)
    pkt = NtpPacket(0, 4, Mode.SERVER, 8, 6, -25, 0, 0x10, bytes([127, 127, 1, 1]),
                    0xECB4A0A0_00000000, 0xECB4A0A0_40000000, 0xECB4A0A0_40010000,
                    0xECB4A0A0_40020000)
    assert NtpPacket.parse(data) == pkt
    assert pkt.serialize() == data
    for cut in range(PACKET_LEN):
        with pytest.raises(NtpError):
            NtpPacket.parse(data[:cut])


def test_timestamp_conversion_and_eras() -> None:
    ntp = unix_ns_to_ntp(T)
    assert ntp >> 32 == (T // NS + NTP_UNIX_DELTA_S) % (1 << 32)
    assert abs(ntp_to_unix_ns(ntp, T) - T) <= 1
    # 2036-02-07 rolls NTP era 0 into era 1 (RFC 5905 §6): still decoded next to "now".
    after_rollover = (2_085_978_496 + 10) * NS
    assert ntp_to_unix_ns(unix_ns_to_ntp(after_rollover), after_rollover) == after_rollover
    assert unix_ns_to_ntp(after_rollover) >> 32 == 10


def _server_reply(request: bytes, server_ns: int, process_ns: int = 30_000,
                  stratum: int = 2, leap: int = 0, mode: int = Mode.SERVER) -> bytes:
    req = NtpPacket.parse(request)
    return NtpPacket(leap, 4, mode, stratum, 4, -20, 0, 0, b"GPS\0", 0, req.transmit,
                     unix_ns_to_ntp(server_ns), unix_ns_to_ntp(server_ns + process_ns)).serialize()


def test_offset_and_delay_per_rfc5905() -> None:
    sample = NtpSample.from_timestamps(t1=1_000, t2=251_000_400, t3=251_000_500, t4=1_900,
                                       stratum=1)
    # offset = ((T2 - T1) + (T3 - T4)) / 2, delay = (T4 - T1) - (T3 - T2)
    assert sample.offset_ns == 250_999_000
    assert sample.delay_ns == 800


def test_client_against_simulated_server_picks_least_delay() -> None:
    client = SntpClient()
    server_ahead = 250_000_000
    # Symmetric path of d/2 each way; the least-delay exchange is the most accurate one.
    delays = [900_000, 150_000, 2_000_000, 400_000]
    local = T
    for d in delays:
        req = client.request(local)
        reply = _server_reply(req, local + d // 2 + server_ahead)
        local += d + 30_000
        client.response(reply, local)
        local += NS
    best = client.best()
    assert best is not None
    assert best.delay_ns == pytest.approx(150_000, abs=2)
    assert best.offset_ns == pytest.approx(server_ahead, abs=2)


def test_an_aged_sample_gives_way_to_a_fresh_one_by_error_bound() -> None:
    """Selection by delay / 2 + 15 ppm of age (RFC 5905 §10): a 100 us round trip 20 s old
    (error 50 + 300 us) loses to a fresh 300 us one (150 us)."""
    old = NtpSample(local_ns=T, offset_ns=1_000, delay_ns=100_000, stratum=1)
    fresh = NtpSample(local_ns=T + 20 * NS, offset_ns=2_000, delay_ns=300_000, stratum=1)
    client = SntpClient()
    client.samples.extend([old, fresh])
    assert client.best() is old  # least delay alone
    assert client.best(T + 20 * NS) is fresh
    assert old.error_ns(T + 20 * NS) == 50_000 + 300_000
    assert client.best(T + NS) is old  # at 1 s of age the old one is still the better


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"stratum": 0}, "kiss"), ({"stratum": 16}, "stratum"), ({"leap": 3}, "LI=3"),
     ({"mode": 3}, "mode")],
)
def test_bad_replies_refused(kwargs: dict[str, int], match: str) -> None:
    client = SntpClient()
    req = client.request(T)
    with pytest.raises(NtpError, match=match):
        client.response(_server_reply(req, T, **kwargs), T + 100_000)
    assert client.rejected == 1 and client.best() is None


def test_unsolicited_and_duplicate_replies_refused() -> None:
    client = SntpClient()
    req = client.request(T)
    reply = _server_reply(req, T + 10)
    client.response(reply, T + 100_000)
    with pytest.raises(NtpError, match="origin"):
        client.response(reply, T + 200_000)  # replayed
    other = SntpClient().request(T + 5)
    with pytest.raises(NtpError, match="origin"):
        client.response(_server_reply(other, T), T + 100_000)


@given(st.integers(0, 4_000_000_000 * NS), st.integers(-(60 * 365 * 86400) * NS,
                                                       (60 * 365 * 86400) * NS))
def test_ntp_timestamps_round_trip_within_68_years(unix_ns: int, skew_ns: int) -> None:
    # RFC 5905 §6: decoding needs a reference within 68 years; 60 years away still decodes.
    assert abs(ntp_to_unix_ns(unix_ns_to_ntp(unix_ns), unix_ns + skew_ns) - unix_ns) <= 1
