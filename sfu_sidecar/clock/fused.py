"""The house clock: one software timeline fused from PTP, NTP and the local clock. Pure.

House time is a linear function of the local clock (CLOCK_REALTIME), re-anchored whenever the
servo changes its frequency, so it is continuous by construction::

    house(L) = H0 + (L - L0) * (1 + freq_ppb / 1e9)

Rules this module keeps: preference PTP > NTP > local; when the tracked source is lost, the
next live source at once (a live reference beats a free-running oscillator), or holdover on the
learned frequency when none is left; the first lock after start may step house time once, after
that every correction is a slew of at most ``max_slew_ppm``; house time as returned by
:meth:`FusedClock.now` never decreases.

Status never flatters: while house time is farther from the tracked source than that source's
own error it is ``slewing`` (with the remaining offset and the time to close it at the slew
limit), and the reported error is never smaller than the last measured distance to the source.

It never reads a clock: every method takes the local reading (``local_ns``) and a monotonic
reading (``mono_ns``) as arguments.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sfu_sidecar.clock.servo import PiServo

SYSTEM = "system"
PTP = "ptp"
NTP = "ntp"

ACQUIRING = "acquiring"
LOCKED = "locked"
SLEWING = "slewing"  # tracking a source, still converging onto it
HOLDOVER = "holdover"
FREERUN = "freerun"

NS_PER_S = 1_000_000_000
# A source whose last sample is older than this counts as lost (PTP at 8 Hz misses ~16 Syncs;
# the SNTP adapter polls every second or two).
DEFAULT_TIMEOUTS_NS = {PTP: 2 * NS_PER_S, NTP: 8 * NS_PER_S}
DEFAULT_HOLDOVER_NS = 10 * NS_PER_S
# Holdover uncertainty growth: a free-running, temperature-uncompensated crystal stays within
# ~1 ppm of its learned frequency over minutes, i.e. 1 us of error per second.
HOLDOVER_DRIFT_PPB = 1000.0
RESIDUAL_WINDOW = 16
# Below this distance to the source house time counts as on it whatever the source claims: the
# servo's own noise on a loaded host (NTP on loopback measured ~10-40 us) must not flap the state.
CONVERGED_FLOOR_NS = 100_000
# Back from locked to slewing only for a distance this many times the bound (>= 1 ms): a jump of
# the source, not measurement noise.
RESLEW_FACTOR = 10


@dataclass
class SourceState:
    name: str
    last_mono_ns: int | None = None
    last_local_ns: int | None = None
    offset_ns: int | None = None  # reference - local at the last sample
    error_ns: int = 0  # the source's own uncertainty of that sample
    samples: int = 0
    lost: bool = False

    def alive(self, mono_ns: int, timeout_ns: int) -> bool:
        return (not self.lost and self.last_mono_ns is not None
                and mono_ns - self.last_mono_ns <= timeout_ns)


@dataclass
class Change:
    """A state or source change, for the log line."""

    old_state: str
    old_source: str
    new_state: str
    new_source: str
    reason: str


@dataclass
class FusedClock:
    """House time from ordered sources. ``sources`` lists the configured ones, best first."""

    sources: tuple[str, ...]
    max_slew_ppm: float
    start_mono_ns: int
    holdover_ns: int = DEFAULT_HOLDOVER_NS
    # With PTP configured, NTP is not locked to in the first seconds after start, so a PTP
    # master that is merely slower to answer does not cost a long slew after an NTP step.
    ptp_grace_ns: int = 3 * NS_PER_S
    timeouts_ns: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_TIMEOUTS_NS))
    state: str = ACQUIRING
    source: str = SYSTEM
    stepped: bool = False
    steps: int = 0

    def __post_init__(self) -> None:
        if not self.sources:
            self.state = FREERUN
        self._states = {name: SourceState(name) for name in self.sources}
        self.servo = PiServo(max_ppb=self.max_slew_ppm * 1000.0)
        self._l0 = 0
        self._h0 = 0
        self._latest_local = 0
        self._freq_ppb = 0.0
        self._last_out: int | None = None
        self._last_servo_local: int | None = None
        self._holdover_since: int | None = None
        self._holdover_error_ns = 0
        self._residuals: deque[float] = deque(maxlen=RESIDUAL_WINDOW)
        # House minus the tracked source at its latest sample (None: no sample since the lock).
        self._distance_ns: int | None = None

    # -- the timeline -------------------------------------------------------------------------

    def peek(self, local_ns: int) -> int:
        """House time at local reading ``local_ns`` on the current line (no monotonic guard)."""
        span = local_ns - self._l0
        return self._h0 + span + round(span * self._freq_ppb / 1e9)

    def now(self, local_ns: int) -> int:
        """House time for a fresh local reading; never less than any value returned before."""
        self._latest_local = max(self._latest_local, local_ns)
        value = self.peek(local_ns)
        if self._last_out is not None and value < self._last_out:
            value = self._last_out
        self._last_out = value
        return value

    @property
    def freq_ppb(self) -> float:
        return self._freq_ppb

    def _set_freq(self, local_ns: int, freq_ppb: float) -> None:
        # Re-anchor at the latest local reading seen, never at an older sample time: a new rate
        # applied from a past anchor would move house time already handed out (an NTP sample
        # can be seconds old when it is the least-delay one of its window).
        anchor = max(local_ns, self._latest_local)
        self._h0 = self.peek(anchor)
        self._l0 = anchor
        self._freq_ppb = freq_ppb

    def _step(self, local_ns: int, house_ns: int) -> None:
        self._h0 = house_ns
        self._l0 = local_ns
        self.stepped = True
        self.steps += 1

    # -- inputs -------------------------------------------------------------------------------

    def sample(self, source: str, local_ns: int, mono_ns: int, offset_ns: int,
               error_ns: int = 0) -> list[Change]:
        """A measurement: at local reading ``local_ns`` the source's time was
        ``local_ns + offset_ns``, known to within ``error_ns``."""
        st = self._states[source]
        self._latest_local = max(self._latest_local, local_ns)
        st.last_mono_ns = mono_ns
        st.last_local_ns = local_ns
        st.offset_ns = offset_ns
        st.error_ns = error_ns
        st.samples += 1
        st.lost = False
        changes = self.update(mono_ns, local_ns)
        if self.tracking and self.source == source:
            changes += self._track(local_ns, offset_ns)
        return changes

    @property
    def tracking(self) -> bool:
        """Steered by a source: locked on it or slewing toward it."""
        return self.state in (LOCKED, SLEWING)

    def lost(self, source: str, mono_ns: int, local_ns: int) -> list[Change]:
        """The adapter knows a source is gone (PTP: no master left after announce timeout)."""
        self._states[source].lost = True
        return self.update(mono_ns, local_ns)

    def _track(self, local_ns: int, offset_ns: int) -> list[Change]:
        ref = local_ns + offset_ns
        if not self.stepped:
            # The first lock after start: one step onto the source, then slew only.
            self._step(local_ns, ref)
            self._last_servo_local = local_ns
            self._distance_ns = 0
            return self._converged_check()
        error = self.peek(local_ns) - ref
        self._distance_ns = error
        dt = ((local_ns - self._last_servo_local) / 1e9
              if self._last_servo_local is not None else 1.0)
        if dt <= 0:
            # Reordered or duplicate sample: the line only moves forward.
            return self._converged_check()
        self._residuals.append(float(error))
        self._last_servo_local = local_ns
        far = abs(error) > self._bound()
        self._set_freq(local_ns, self.servo.feed(error, dt, slew=far))
        return self._converged_check()

    def _bound(self) -> int:
        """Distance to the tracked source within which house time counts as on it."""
        return max(self._states[self.source].error_ns, CONVERGED_FLOOR_NS)

    def _converged_check(self) -> list[Change]:
        """Locked once within the source's own error; slewing while farther (with hysteresis)."""
        if self._distance_ns is None:
            return []
        bound = self._bound()
        distance = abs(self._distance_ns)
        old = self.state
        if self.state == SLEWING and distance <= bound:
            self.state = LOCKED
        elif self.state == LOCKED and distance > RESLEW_FACTOR * bound:
            self.state = SLEWING
        if self.state == old:
            return []
        why = (f"within {bound} ns of {self.source}" if self.state == LOCKED
               else f"{distance} ns from {self.source}")
        return [Change(old, self.source, self.state, self.source, why)]

    # -- state machine ------------------------------------------------------------------------

    def _best_alive(self, mono_ns: int) -> str | None:
        for name in self.sources:
            if self._states[name].alive(mono_ns, self.timeouts_ns.get(name, NS_PER_S)):
                return name
        return None

    def _rank(self, name: str) -> int:
        return self.sources.index(name) if name in self.sources else len(self.sources)

    def update(self, mono_ns: int, local_ns: int) -> list[Change]:
        """Re-evaluate which source to follow; call on every sample and at least once a second."""
        self._latest_local = max(self._latest_local, local_ns)
        old_state, old_source = self.state, self.source
        best = self._best_alive(mono_ns)
        reason = ""
        if (best == NTP and PTP in self.sources and not self.stepped
                and mono_ns - self.start_mono_ns < self.ptp_grace_ns):
            best = None  # still waiting for PTP before the one allowed step
        if self.tracking:
            if best is None:
                self._enter_holdover(mono_ns, local_ns)
                reason = f"{self.source} lost"
            elif self._rank(best) > self._rank(self.source):
                reason = f"{self.source} lost, {best} available"
                self._lock(best)
            elif self._rank(best) < self._rank(self.source):
                self._lock(best)
                reason = f"{best} preferred"
        elif self.state == HOLDOVER:
            assert self._holdover_since is not None
            expired = mono_ns - self._holdover_since >= self.holdover_ns
            if best is not None and (expired or self._rank(best) <= self._rank(self.source)):
                self._lock(best)
                reason = "holdover ended" if expired else f"{best} back"
            elif expired:
                self.state, self.source = FREERUN, SYSTEM
                reason = "holdover expired, no source"
        elif best is not None:  # ACQUIRING or FREERUN
            self._lock(best)
            reason = f"{best} available"
        if (self.state, self.source) == (old_state, old_source):
            return []
        return [Change(old_state, old_source, self.state, self.source, reason)]

    def _lock(self, source: str) -> None:
        # Converging until a sample says house time is on the new source (the first lock after
        # start steps onto it and is locked at its first sample).
        self.state, self.source = SLEWING, source
        self._holdover_since = None
        self._residuals.clear()
        self._distance_ns = None
        # A new reference: measure dt afresh so the first sample is not weighed by the gap.
        self._last_servo_local = None
        st = self._states[source]
        if st.offset_ns is not None:
            # Steer from the newest sample the source already gave instead of waiting for the
            # next one (an NTP poll can be many seconds away). Its offset to the local clock
            # stands for now: the two drift apart by ppm, microseconds over such an age.
            self._track(self._latest_local, st.offset_ns)

    def _enter_holdover(self, mono_ns: int, local_ns: int) -> None:
        self.state = HOLDOVER
        self._holdover_since = mono_ns
        self._holdover_error_ns = self.error_ns(mono_ns) or 0
        self._set_freq(local_ns, self.servo.holdover())

    # -- reporting ----------------------------------------------------------------------------

    def error_ns(self, mono_ns: int) -> int | None:
        """Estimated uncertainty of house time against the tracked reference (None: unknown,
        house time is not tied to any reference). Never less than the last measured distance
        to the source plus the source's own error."""
        if self.tracking:
            st = self._states[self.source]
            rms = (math.sqrt(sum(e * e for e in self._residuals) / len(self._residuals))
                   if self._residuals else 0.0)
            distance = abs(self._distance_ns) if self._distance_ns is not None else 0
            return max(int(rms), distance) + st.error_ns
        if self.state == HOLDOVER and self._holdover_since is not None:
            held_s = (mono_ns - self._holdover_since) / 1e9
            return self._holdover_error_ns + int(held_s * HOLDOVER_DRIFT_PPB)
        return None

    def source_state(self, name: str) -> SourceState | None:
        return self._states.get(name)

    def convergence(self) -> tuple[int | None, float | None]:
        """(house minus the tracked source at its last sample, seconds to close that distance
        at the slew limit while slewing); (None, None) when no source is tracked."""
        if not self.tracking or self._distance_ns is None:
            return None, None
        eta = None
        if self.state == SLEWING:
            eta = abs(self._distance_ns) / (self.max_slew_ppm * 1000.0)
        return self._distance_ns, eta

    def status(self, local_ns: int, mono_ns: int) -> dict[str, Any]:
        house = self.now(local_ns)
        remaining, eta = self.convergence()
        return {
            "source": self.source,
            "state": self.state,
            "now_ns": house,
            "offset_ns": house - local_ns,
            "freq_ppb": round(self._freq_ppb, 3),
            "error_ns": self.error_ns(mono_ns),
            # House time minus the tracked source (last sample), and while slewing the seconds
            # left to close it at clock_max_slew_ppm.
            "remaining_ns": remaining,
            "converge_s": None if eta is None else round(eta, 3),
            "stepped": self.stepped,
        }
