"""The servo that steers house time toward the selected time source.

Why a PI loop and not a Kalman filter: the house clock is a software clock whose frequency we
set exactly (no actuator lag, no quantisation), the reference is one source at a time, and the
noise of every source we use is close to white over the loop's time constant (kernel software
timestamps on PTP, min-delay-filtered SNTP). Under those conditions a critically damped PI
loop is the steady-state Kalman filter for a phase+frequency model, without needing per-source
noise covariances we cannot measure up front; it is also what ptp4l runs (pi.c), so the
product's behaviour can be compared with ptp4l's directly in the benchmark. Its two states map
onto what the house clock needs anyway: the integral is the local oscillator's frequency error
(kept through holdover and across source changes), the proportional term removes phase error.

Gains are per sample, normalised by the sample interval, so one loop serves 8 Hz PTP and 1 Hz
NTP: ``freq = -(kp * e / dt + I)``, ``I += ki * e / dt`` with e in ns and dt in s (ns/s = ppb).
"""

from __future__ import annotations

from dataclasses import dataclass

# Critically damped (zeta = kp / (2 sqrt(ki)) = 1.0). kp 0.2 is a time constant of ~5 samples,
# which leaves ~0.3 of the white measurement noise in house time (sigma * sqrt(kp / 2)).
DEFAULT_KP = 0.2
DEFAULT_KI = 0.01


@dataclass
class PiServo:
    """Phase-locks a software clock. ``max_ppb`` bounds both the output and the integral."""

    max_ppb: float
    kp: float = DEFAULT_KP
    ki: float = DEFAULT_KI
    integral_ppb: float = 0.0
    freq_ppb: float = 0.0
    saturated: bool = False

    def feed(self, error_ns: float, dt_s: float, slew: bool = False) -> float:
        """One measurement: ``error_ns`` = house time - reference (positive: house is ahead).

        ``slew``: the error is far outside the source's noise (a new source, a jump), so the
        whole of it is aimed at the next sample interval (gain 1, bounded by ``max_ppb``) with
        the integral held: the PI loop's ~5-sample time constant would otherwise add tens of
        seconds of exponential tail to a correction the slew limit already paces.

        Returns the new frequency correction of house time against the local clock, in ppb.
        """
        dt_s = max(dt_s, 1e-3)
        rate = error_ns / dt_s
        if slew:
            out = -rate - self.integral_ppb
            self.saturated = abs(out) > self.max_ppb
            self.freq_ppb = max(-self.max_ppb, min(self.max_ppb, out))
            return self.freq_ppb
        integral = self.integral_ppb + self.ki * rate
        out = -(self.kp * rate) - integral
        # Anti-windup: while the output is clamped the integral does not grow further, so the
        # loop does not overshoot for minutes after a large correction at the slew limit.
        if abs(out) > self.max_ppb:
            self.saturated = True
            out = max(-self.max_ppb, min(self.max_ppb, out))
        else:
            self.saturated = False
            self.integral_ppb = max(-self.max_ppb, min(self.max_ppb, integral))
        self.freq_ppb = out
        return out

    def holdover(self) -> float:
        """The frequency to keep when no source answers: the learned oscillator error only."""
        self.freq_ppb = max(-self.max_ppb, min(self.max_ppb, -self.integral_ppb))
        return self.freq_ppb
