"""Limit cores with time as an argument, and the socket adapter's counting and logging."""

from __future__ import annotations

import logging

import pytest

from sfu_sidecar.limits import (
    LOG_EVERY_S,
    ClientSessions,
    CpuLoad,
    MessageGate,
    MessageLimiter,
    RateLimits,
    TokenBucket,
    Verdict,
    client_key,
    is_loopback,
    retry_after,
)
from sfu_sidecar.metrics import Metrics


def test_bucket_starts_full_refills_at_its_rate_and_never_overfills() -> None:
    bucket = TokenBucket(rate=2.0, burst=4.0, now=0.0)
    assert all(bucket.take(0.0) for _ in range(4))
    assert not bucket.take(0.0)
    assert bucket.wait_s(0.0) == pytest.approx(0.5)
    assert bucket.take(0.5)
    assert not bucket.take(0.5)
    bucket.take(100.0, 4)  # a long quiet spell fills it to the burst, not beyond
    assert not bucket.take(100.0)


def test_bucket_takes_all_or_nothing_and_knows_what_never_fits() -> None:
    bucket = TokenBucket(rate=1.0, burst=3.0, now=0.0)
    assert not bucket.take(0.0, 5)
    assert bucket.tokens == 3.0  # a refused take leaves the tokens
    assert bucket.wait_s(0.0, 5) == float("inf")
    assert retry_after(float("inf")) == "3600"
    assert retry_after(0.01) == "1" and retry_after(2.2) == "3"


def test_rate_limits_are_per_key_and_answer_the_wait() -> None:
    limits = RateLimits(rate=10.0, burst=20.0)
    assert limits.take("a", 20, 0.0) == 0.0
    assert limits.take("a", 5, 0.0) == pytest.approx(0.5)
    assert limits.take("b", 20, 0.0) == 0.0  # another stream has its own budget
    assert limits.take("a", 5, 0.5) == 0.0


def test_gate_drops_over_the_rate_and_forgives_a_burst() -> None:
    gate = MessageGate(rate=10.0, now=0.0)  # bursts up to 20
    verdicts = [gate.admit(0.0).verdict for _ in range(25)]
    assert verdicts.count(Verdict.ACCEPT) == 20
    assert verdicts[20:] == [Verdict.DROP] * 5
    assert gate.dropped == 5
    # After a quiet second the burst is forgotten: drops start a new streak.
    assert gate.admit(2.0).accepted
    assert all(gate.admit(2.0).verdict is not Verdict.CLOSE for _ in range(40))


def test_gate_closes_a_peer_that_keeps_over_its_rate() -> None:
    gate = MessageGate(rate=10.0, now=0.0)
    t, verdicts = 0.0, []
    while t < 10.0:  # twice the rate, steadily
        verdicts.append(gate.admit(t).verdict)
        t += 0.05
    first_close = verdicts.index(Verdict.CLOSE)
    # 10 msg/s over the rate; closed once more than 5 s of allowance (50) was dropped.
    assert verdicts[:first_close].count(Verdict.DROP) == 50
    assert verdicts[:20] == [Verdict.ACCEPT] * 20  # the first second rides on the burst


def test_gate_asks_for_one_log_line_a_minute() -> None:
    gate = MessageGate(rate=1.0, now=0.0)  # bursts up to 2
    first = [gate.admit(0.0) for _ in range(3)][-1]
    assert first.verdict is Verdict.DROP and first.log_drops == 1
    for t in (10.0, 20.0, 30.0, 40.0, 50.0):
        assert not any(gate.admit(t).log_drops for _ in range(5))  # 2 pass, 3 dropped quietly
    at_a_minute = [gate.admit(LOG_EVERY_S) for _ in range(3)][-1]
    assert at_a_minute.log_drops == 5 * 3 + 1  # the drops in between, in one line


def test_limiter_counts_drops_and_logs_each_peer_at_most_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    metrics = Metrics()
    logger = logging.getLogger("sfu_sidecar.test_limits")
    limiter = MessageLimiter("clock_ws", 1.0, metrics.messages_dropped, logger,
                             clock=lambda: now[0])
    a, b = limiter.gate("peer-a"), limiter.gate("peer-b")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        results = [a() for _ in range(12)] + [b() for _ in range(3)]
        now[0] = 30.0
        results += [a() for _ in range(5)]
    dropped = sum(1 for r in results if not r.accepted)
    assert dropped == 10 + 1 + 3
    text = metrics.render().decode()
    assert f'sfu_sidecar_messages_dropped_total{{channel="clock_ws"}} {dropped:.1f}' in text
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "peer-a" in lines[0] and "peer-b" in lines[1]


@pytest.mark.parametrize(("remote", "key"), [
    ("192.0.2.7", "192.0.2.7"),
    ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),
    ("::ffff:192.0.2.7", "192.0.2.7"),
    (None, "unknown"),
    ("not-an-address", "not-an-address"),
])
def test_client_key_groups_an_ipv6_subscriber_by_its_64(remote: str | None, key: str) -> None:
    assert client_key(remote) == key


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("localhost", True), ("0.0.0.0", False), ("::", False), ("", False), (None, False),
    ("192.0.2.1", False), ("example.com", False),
])
def test_is_loopback(host: str | None, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_client_sessions_count_pending_and_live_until_they_end() -> None:
    sessions = ClientSessions()
    alive = {"s1": True, "s2": True}
    sessions.reserve("a")
    sessions.reserve("a")
    assert sessions.count("a") == 2 and sessions.count("b") == 0
    sessions.bind("a", "s1", lambda: alive["s1"])
    sessions.release("a")  # the second failed to negotiate
    assert sessions.count("a") == 1
    sessions.reserve("a")
    sessions.bind("a", "s2", lambda: alive["s2"])
    assert sessions.count("a") == 2
    alive["s1"] = False
    assert sessions.count("a") == 1


def test_cpu_load_is_the_smoothed_share_of_one_core() -> None:
    load = CpuLoad(window_s=2.0)
    assert load.observe(10.0, 100.0) is None  # one sample measures nothing
    assert load.observe(10.1, 101.0) == pytest.approx(0.1)  # 0.1 s of CPU in 1 s
    # A keyframe burst: a quarter second at a full core barely moves the share ...
    share = load.observe(10.35, 101.25)
    assert share is not None and share < 0.3
    # ... a sustained full core takes it past any sane limit within a few seconds.
    cpu, now = 10.35, 101.25
    for _ in range(12):
        cpu, now = cpu + 0.25, now + 0.25
        share = load.observe(cpu, now)
    assert share is not None and share > 0.75
    # Two threads busy at once count as more than one core; a clock that did not move, or
    # CPU time that went backwards, change nothing and break nothing.
    assert load.observe(cpu, now) == share
    assert load.observe(cpu - 1.0, now + 0.25) is not None
