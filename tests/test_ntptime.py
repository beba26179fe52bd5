"""The NTP timestamp format, one definition for sender reports, abs-capture-time and SNTP."""

from __future__ import annotations

import random

from sfu_sidecar.ntptime import (
    NS,
    middle32,
    ns_to_q32,
    ntp_to_unix_ns,
    q32_to_ns,
    unix_ns_to_ntp,
)

T = 1_796_025_600 * NS + 987_654_321


def test_epochs() -> None:
    assert unix_ns_to_ntp(0) == 2_208_988_800 << 32
    assert ntp_to_unix_ns(2_208_988_800 << 32) == 0
    assert ntp_to_unix_ns((2_208_988_800 << 32) | (1 << 31)) == NS // 2


def test_round_trip_is_exact_to_the_nanosecond() -> None:
    rng = random.Random(5)
    for _ in range(2000):
        ns = rng.randrange(T - 10**17, T + 10**17)
        assert abs(ntp_to_unix_ns(unix_ns_to_ntp(ns)) - ns) <= 1
        assert abs(ntp_to_unix_ns(unix_ns_to_ntp(ns), near_ns=ns) - ns) <= 1


def test_after_the_2036_rollover_both_rules_agree() -> None:
    later = (2_085_978_496 + 3600) * NS  # 2036-02-07T07:28:16Z, era 1
    ntp = unix_ns_to_ntp(later)
    assert ntp >> 32 == 3600 and ntp < 1 << 64
    assert ntp_to_unix_ns(ntp) == later
    assert ntp_to_unix_ns(ntp, near_ns=later - 10 * NS) == later


def test_the_nearest_era_wins_over_the_top_bit_rule() -> None:
    # 2110 is in era 1 with the top bit of its seconds set: RFC 4330's rule alone reads it
    # as 1974 (era 0); a known time nearby picks the right era.
    y2110 = 4_417_977_600 * NS
    ntp = unix_ns_to_ntp(y2110)
    assert ntp_to_unix_ns(ntp, near_ns=y2110 - 3600 * NS) == y2110
    assert ntp_to_unix_ns(ntp) == y2110 - (1 << 32) * NS


def test_q32_and_middle_bits() -> None:
    assert q32_to_ns(ns_to_q32(-1_234_567_890)) == -1_234_567_890
    assert q32_to_ns(1 << 32) == NS
    ntp = unix_ns_to_ntp(T)
    assert middle32(ntp) == (ntp >> 16) & 0xFFFFFFFF
