"""Receiver-side bookkeeping towards the publisher: report fields and NACK decisions."""

from __future__ import annotations

from sfu_sidecar.relay.upstream import (
    NACK_MAX_TRIES,
    NACK_RETRY_NS,
    NackGenerator,
    ReceiveStatistics,
)

MS = 1_000_000


def test_statistics_count_loss_and_wrap() -> None:
    stats = ReceiveStatistics(90000)
    seqs = [65530, 65531, 65533, 65534, 65535, 0, 1, 3]  # 65532 and 2 missing
    for i, seq in enumerate(seqs):
        stats.add(seq, 3000 * i, 33 * MS * i)
    r = stats.report()
    assert r.highest_sequence == 65536 + 3
    assert r.packets_lost == 2
    assert r.fraction_lost == (2 << 8) // 10
    # Next interval: nothing lost.
    stats.add(4, 3000 * 8, 33 * MS * 8)
    assert stats.report().fraction_lost == 0


def test_jitter_follows_rfc3550() -> None:
    stats = ReceiveStatistics(90000)
    # Packets 3000 ticks (33.3 ms) apart whose arrival gaps alternate 23.3 and 43.3 ms.
    t = 0
    for i in range(200):
        t += (33_333_333 + (10 * MS if i % 2 else -10 * MS))
        stats.add(i, 3000 * i, t)
    jitter = stats.report().jitter
    # |D| is 10 ms = 900 ticks every time, and J += (|D| - J) / 16 converges on it.
    assert 850 < jitter <= 900


def test_nack_generator_reports_gaps_retries_and_gives_up() -> None:
    gen = NackGenerator()
    assert gen.add(100, 0) == []
    assert gen.add(103, 0) == [101, 102]
    assert gen.due(NACK_RETRY_NS - 1) == []
    assert gen.due(NACK_RETRY_NS) == [101, 102]
    assert gen.add(101, NACK_RETRY_NS) == []
    assert gen.recovered == 1
    now = NACK_RETRY_NS
    repeats = 0
    for _ in range(NACK_MAX_TRIES + 2):
        now += NACK_RETRY_NS
        repeats += gen.due(now) == [102]
    assert repeats == NACK_MAX_TRIES - 2  # two tries were already spent
    assert gen.missing == 0


def test_nack_generator_wraps_and_ignores_restarts() -> None:
    gen = NackGenerator()
    gen.add(65534, 0)
    assert gen.add(1, 0) == [65535, 0]
    assert gen.add(30000, 0) == []  # a jump this large is a restart, not loss
    assert gen.missing == 0
