"""The fused house clock against simulated sources and a simulated, drifting local clock."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import pytest

from sfu_sidecar.clock.fused import (
    ACQUIRING,
    FREERUN,
    HOLDOVER,
    LOCKED,
    NTP,
    PTP,
    SLEWING,
    SYSTEM,
    FusedClock,
)

NS = 1_000_000_000
T0 = 1_700_000_000 * NS


@dataclass
class World:
    """True time advances in steps; the local clock runs ``local_ppb`` fast plus an offset."""

    local_ppb: float = 0.0
    local_offset_ns: int = 0
    true_ns: int = T0
    mono_ns: int = 10 * NS

    def local(self) -> int:
        return (self.true_ns + self.local_offset_ns
                + round((self.true_ns - T0) * self.local_ppb / 1e9))

    def advance(self, ns: int) -> None:
        self.true_ns += ns
        self.mono_ns += ns


def feed(clock: FusedClock, world: World, source: str, ref_offset_ns: int, seconds: float,
         rate_hz: float, *, noise_ns: int = 0, seed: int = 0,
         watch: list[tuple[int, int]] | None = None) -> None:
    """``source`` reports true + ``ref_offset_ns`` (plus white noise) at ``rate_hz``."""
    rng = random.Random(seed)
    step = int(NS / rate_hz)
    for _ in range(int(seconds * rate_hz)):
        world.advance(step)
        local = world.local()
        ref = world.true_ns + ref_offset_ns + (rng.randint(-noise_ns, noise_ns) if noise_ns else 0)
        clock.sample(source, local, world.mono_ns, ref - local)
        if watch is not None:
            watch.append((local, clock.now(local)))


def house_error(clock: FusedClock, world: World, ref_offset_ns: int) -> int:
    return clock.peek(world.local()) - (world.true_ns + ref_offset_ns)


def test_no_sources_is_freerun_on_the_local_clock() -> None:
    clock = FusedClock((), 500, 0)
    assert clock.state == FREERUN and clock.source == SYSTEM
    assert clock.now(T0) == T0


def test_first_lock_steps_once_then_tracks_a_fast_local_clock() -> None:
    world = World(local_ppb=50_000.0, local_offset_ns=-3_000_000)
    clock = FusedClock((PTP,), 500, world.mono_ns)
    assert clock.state == ACQUIRING
    feed(clock, world, PTP, 5_000_000, 60, 8, noise_ns=500)
    assert (clock.state, clock.source, clock.steps) == (LOCKED, PTP, 1)
    assert abs(house_error(clock, world, 5_000_000)) < 500
    # The servo learned the oscillator: house runs 50 ppm slower than the local clock. The
    # integral holds it; the output adds the proportional reaction to the 500 ns noise.
    assert -clock.servo.integral_ppb == pytest.approx(-50_000 / 1.00005, rel=0.01)
    assert clock.freq_ppb == pytest.approx(-50_000, abs=2_000)
    assert 0 <= clock.error_ns(world.mono_ns) < 2_000


def test_noise_is_filtered() -> None:
    world = World()
    clock = FusedClock((PTP,), 500, world.mono_ns)
    feed(clock, world, PTP, 0, 30, 8, noise_ns=2_000, seed=5)
    errors = []
    for i in range(200):
        feed(clock, world, PTP, 0, 1 / 8, 8, noise_ns=2_000, seed=100 + i)
        errors.append(abs(house_error(clock, world, 0)))
    errors.sort()
    assert errors[len(errors) // 2] < 1_000  # half the +-2 us uniform input noise or better


def test_failover_to_a_disagreeing_source_slews_at_once_and_says_so() -> None:
    """PTP and NTP 42.317 ms apart: when PTP goes, house time is steered toward NTP from the
    first sample, reported as slewing with an honest error until it is on NTP."""
    world = World(local_ppb=-20_000.0)
    clock = FusedClock((PTP, NTP), 500, world.mono_ns)
    feed(clock, world, PTP, 5_000_000, 10, 8)
    assert (clock.state, clock.source) == (LOCKED, PTP)
    start_mono = world.mono_ns
    watch: list[tuple[int, int]] = []
    ntp_offset = 5_000_000 + 42_317_000
    rows = []
    step = NS // 2
    locked_at = None
    for _ in range(2 * 150):
        world.advance(step)
        local = world.local()
        clock.sample(NTP, local, world.mono_ns, world.true_ns + ntp_offset - local, 30_000)
        watch.append((local, clock.now(local)))
        st = clock.status(local, world.mono_ns)
        true = abs(house_error(clock, world, ntp_offset))
        rows.append((st, true))
        if locked_at is None and st["state"] == LOCKED and st["source"] == NTP:
            locked_at = (world.mono_ns - start_mono) / NS
    # PTP silent for its 2 s timeout -> NTP at once, no holdover while a source is alive.
    first_ntp = next(st for st, _ in rows if st["source"] == NTP)
    assert first_ntp["state"] == SLEWING
    assert first_ntp["remaining_ns"] == pytest.approx(-42_317_000, abs=50_000)
    assert first_ntp["converge_s"] == pytest.approx(42.317 / 0.5, rel=0.01)
    for st, true in rows:
        if st["source"] == NTP:
            # The error bound is never smaller than the real distance to the source.
            assert st["error_ns"] >= true, (st, true)
        if st["state"] == SLEWING:
            assert abs(st["remaining_ns"]) > 100_000
    # Reaches NTP within offset / max slew + 10 s (from PTP's last sample), then stays locked.
    assert locked_at is not None and locked_at <= 42.317 / 0.5 + 10, locked_at
    assert rows[-1][0]["state"] == LOCKED and rows[-1][1] < 100_000
    assert clock.steps == 1  # no second step: it slewed
    for (l1, h1), (l2, h2) in itertools.pairwise(watch):
        assert h2 >= h1
        # house - local changes by at most max_slew per local ns (plus rounding).
        assert abs((h2 - l2) - (h1 - l1)) <= (l2 - l1) * 500e-6 + 2

    # PTP back: preferred at once, the same honest slew the other way.
    start_mono = world.mono_ns
    locked_at = None
    for _ in range(8 * 100):
        world.advance(NS // 8)
        local = world.local()
        clock.sample(PTP, local, world.mono_ns, world.true_ns + 5_000_000 - local)
        st = clock.status(local, world.mono_ns)
        assert st["source"] == PTP
        assert st["error_ns"] >= abs(house_error(clock, world, 5_000_000))
        if locked_at is None and st["state"] == LOCKED:
            locked_at = (world.mono_ns - start_mono) / NS
    assert locked_at is not None and locked_at <= 42.317 / 0.5 + 10, locked_at
    assert abs(house_error(clock, world, 5_000_000)) < 10_000
    assert clock.steps == 1


def test_a_jump_of_the_tracked_source_is_reported_as_slewing() -> None:
    world = World()
    clock = FusedClock((NTP,), 500, world.mono_ns)
    feed(clock, world, NTP, 0, 5, 1)
    assert clock.state == LOCKED
    feed(clock, world, NTP, 3_000_000, 1, 1)  # the server's time jumps by 3 ms
    assert clock.state == SLEWING
    assert clock.error_ns(world.mono_ns) >= 3_000_000 - 500_000
    feed(clock, world, NTP, 3_000_000, 20, 1)
    assert clock.state == LOCKED


def test_noise_below_the_bound_does_not_flap_the_state() -> None:
    world = World()
    clock = FusedClock((NTP,), 500, world.mono_ns)
    states = []
    rng = random.Random(3)
    for _ in range(300):
        world.advance(NS)
        local = world.local()
        clock.sample(NTP, local, world.mono_ns,
                     world.true_ns + rng.randint(-80_000, 80_000) - local, 40_000)
        states.append(clock.state)
    assert states[5:] == [LOCKED] * len(states[5:])


def test_holdover_keeps_the_learned_frequency_then_freeruns() -> None:
    world = World(local_ppb=30_000.0)
    clock = FusedClock((PTP,), 500, world.mono_ns, holdover_ns=5 * NS)
    feed(clock, world, PTP, 0, 60, 8)
    learned = clock.freq_ppb
    changes = clock.lost(PTP, world.mono_ns, world.local())
    assert [(c.new_state, c.new_source) for c in changes] == [(HOLDOVER, PTP)]
    assert clock.freq_ppb == pytest.approx(learned, rel=0.01)
    world.advance(4 * NS)
    clock.update(world.mono_ns, world.local())
    assert clock.state == HOLDOVER
    # 4 s on the learned frequency: the 30 ppm oscillator error does not show up.
    assert abs(house_error(clock, world, 0)) < 20_000
    assert clock.error_ns(world.mono_ns) >= 4_000
    world.advance(2 * NS)
    clock.update(world.mono_ns, world.local())
    assert (clock.state, clock.source) == (FREERUN, SYSTEM)


def test_ptp_back_during_holdover_resumes_without_waiting() -> None:
    world = World()
    clock = FusedClock((PTP, NTP), 500, world.mono_ns)
    feed(clock, world, PTP, 1_000, 5, 8)
    world.advance(3 * NS)
    clock.update(world.mono_ns, world.local())
    assert clock.state == HOLDOVER
    feed(clock, world, PTP, 1_000, 1, 8)
    assert (clock.state, clock.source) == (LOCKED, PTP)


def test_ptp_preferred_over_ntp_and_grace_period() -> None:
    world = World()
    clock = FusedClock((PTP, NTP), 500, world.mono_ns)
    feed(clock, world, NTP, 2_000_000, 1, 2)
    assert clock.state == ACQUIRING  # waiting for PTP before the one allowed step
    feed(clock, world, NTP, 2_000_000, 3, 2)
    assert (clock.state, clock.source) == (LOCKED, NTP)
    assert abs(house_error(clock, world, 2_000_000)) < 1_000
    feed(clock, world, PTP, 2_050_000, 0.5, 8)
    assert (clock.state, clock.source) == (LOCKED, PTP)
    assert clock.steps == 1


def test_now_never_decreases_even_if_the_host_clock_steps_back() -> None:
    world = World()
    clock = FusedClock((PTP,), 500, world.mono_ns)
    feed(clock, world, PTP, 0, 2, 8)
    before = clock.now(world.local())
    world.local_offset_ns -= NS  # someone set the host clock back by 1 s
    world.advance(NS // 8)
    assert clock.now(world.local()) == before
    world.local_offset_ns += NS
    world.advance(NS // 8)
    assert clock.now(world.local()) > before


def test_status_fields() -> None:
    world = World()
    clock = FusedClock((PTP,), 500, world.mono_ns)
    feed(clock, world, PTP, 7_000, 5, 8)
    st = clock.status(world.local(), world.mono_ns)
    assert st["source"] == PTP and st["state"] == LOCKED
    assert abs(st["offset_ns"] - 7_000) < 100
    assert isinstance(st["now_ns"], int) and isinstance(st["error_ns"], int)


def test_an_old_sample_never_moves_time_already_handed_out() -> None:
    """A least-delay NTP sample can be seconds old; the rate change it causes applies from now
    on, not from its timestamp (that would jump house time by age x rate change)."""
    world = World()
    clock = FusedClock((NTP,), 10_000, world.mono_ns)
    feed(clock, world, NTP, 0, 3, 1)
    world.advance(5 * NS)
    before = clock.now(world.local())
    old_local = world.local() - 4 * NS
    # The old sample says house is 20 ms behind: the servo answers with a steep rate.
    clock.sample(NTP, old_local, world.mono_ns, 20_000_000 + (world.true_ns - 4 * NS) - old_local)
    assert abs(clock.freq_ppb) > 1_000_000  # > 0.1 %: 4 s of it, backdated, would be > 4 ms
    world.advance(NS // 1000)
    after = clock.now(world.local())
    assert abs((after - before) - NS // 1000) <= NS // 1000 * 0.01 + 1
