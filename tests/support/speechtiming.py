"""Speech timing without audio, for the lag meters' tests: sentences on the house clock as a
speech detector reports them, what follows them (cues, a dub) at a known lag, and a replay that
delivers both as a live stream would.

The timing follows read news: sentences of 0.8-4 s, pauses of 0.3-1.5 s, followers jittered
by a few milliseconds. A detector closes a segment a hangover after its speech ends, and a cue
arrives some time after the words it shows were spoken.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TypeVar

from sfu_sidecar.speech.segments import SpeechSegment

S = 1_000_000_000
MS = 1_000_000
HANGOVER_NS = 300 * MS  # a detector's segment closes this long after the speech ends
STEP_NS = 200 * MS  # how often a live service settles

T = TypeVar("T")


def sentences(rng: random.Random, n: int, *, start_ns: int = 10 * S,
              length_s: tuple[float, float] = (0.8, 4.0),
              pause_s: tuple[float, float] = (0.3, 1.5)) -> list[SpeechSegment]:
    out = []
    t = start_ns
    for _ in range(n):
        length = round(rng.uniform(*length_s) * S)
        out.append(SpeechSegment(t, t + length))
        t += length + round(rng.uniform(*pause_s) * S)
    return out


def lagged(segments: Sequence[SpeechSegment], lag_ns: int | Callable[[int], int],
           rng: random.Random, *, jitter_ns: int = 3 * MS) -> list[tuple[int, int]]:
    """(start, end) of one follower per segment, ``lag_ns`` (or ``lag_ns(onset)``) after it,
    with a normal jitter."""
    out = []
    for seg in segments:
        lag = lag_ns(seg.onset_ns) if callable(lag_ns) else lag_ns
        lag += round(rng.gauss(0, jitter_ns))
        out.append((seg.onset_ns + lag, seg.offset_ns + lag))
    return out


def replay(
    segments: Sequence[SpeechSegment],
    add_speech: Callable[[SpeechSegment], None],
    arrivals: Sequence[tuple[int, Callable[[], None]]],
    settle: Callable[[int, int | None], list[T]],
    *,
    until_ns: int | None = None,
) -> list[T]:
    """Deliver the segments when a detector would close them and the ``arrivals`` (time, what
    to do) at their times, settling every STEP_NS with the onset of the speech still open;
    everything settled, in order."""
    events = sorted([(s.offset_ns + HANGOVER_NS, i, s) for i, s in enumerate(segments)],
                    key=lambda e: e[0])
    calls = sorted(arrivals, key=lambda a: a[0])
    end = until_ns if until_ns is not None else max(
        [s.offset_ns for s in segments] + [t for t, _ in arrivals]) + 10 * S
    t = min([s.onset_ns for s in segments] + [t for t, _ in arrivals])
    out: list[T] = []
    k = c = 0
    while t <= end:
        while k < len(events) and events[k][0] <= t:
            add_speech(events[k][2])
            k += 1
        while c < len(calls) and calls[c][0] <= t:
            calls[c][1]()
            c += 1
        # The speech a detector has not closed yet at t.
        open_onset = next((s.onset_ns for _, _, s in events[k:] if s.onset_ns < t), None)
        out.extend(settle(t, open_onset))
        t += STEP_NS
    return out
