"""Named alerts with hysteresis. Pure: values and times are passed in, events come out.

An alert watches one figure for one subject (a stream, a renderer, the house clock). It is
raised when the figure has stayed on the bad side of its raise threshold for ``raise_after_ns``
and cleared when it has stayed on the good side of a separate, stricter clear threshold for
``clear_after_ns``. Between the two thresholds nothing changes and any pending change is
forgotten, so a figure hovering at a threshold cannot make the alert flap.

Thresholds come from the standards the figures are judged by:

* lip sync: ATSC IS-191 (audio may lead video by at most 15 ms and lag it by at most 45 ms) and
  ITU-R BT.1359 (the detectability limits, +45 / -125 ms); positive skew is audio leading;
* frame jitter: 112 ms RMS of frame-interval deviations;
* burstiness: excess kurtosis of frame gaps above 3.5;
* GPU: fragmentation index 0.68, device memory 95 % used;
* caption lag: the median lag of the last 10 cues to the voice beyond 300 ms, and ITU-R BT.1359
  applied to captions against the voice they caption (a caption after the voice is the picture
  after the sound: +45 ms; before it, -125 ms);
* dub lag: a dub 300 ms off its source.

The speech rules (``SPEECH_RULES``) take per-cue figures: feed the caption meter's
``recent_median_ms`` (``speech/lag.py``) for the subject ``stream/language`` after each settle
that matched a cue, or once a tick, and the dub meter's ``recent_median_ms`` (``speech/dub.py``)
for the dub's subject likewise. The persistence is in the figure (a median over the last cues or
utterances), so these rules hold for no time, and feeding one value many times changes nothing.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

S = 1_000_000_000
RECENT_EVENTS = 200


@dataclass(frozen=True, slots=True)
class Rule:
    """When one alert is raised and cleared.

    Bad: ``value >= high`` or ``value <= low`` (``>`` / ``<`` when not ``inclusive``).
    Good: ``clear_low <= value <= clear_high``, a band strictly inside the bad limits.
    """

    name: str
    summary: str
    high: float = math.inf
    low: float = -math.inf
    clear_high: float = math.inf
    clear_low: float = -math.inf
    raise_after_ns: int = 0
    clear_after_ns: int = 0
    inclusive: bool = True
    unit: str = ""

    def __post_init__(self) -> None:
        if not (self.low < self.clear_low or self.low == self.clear_low == -math.inf):
            raise ValueError(f"{self.name}: clear_low must lie above low")
        if not (self.clear_high < self.high or self.high == self.clear_high == math.inf):
            raise ValueError(f"{self.name}: clear_high must lie below high")

    def bad(self, value: float) -> bool:
        if self.inclusive:
            return value >= self.high or value <= self.low
        return value > self.high or value < self.low

    def good(self, value: float) -> bool:
        return self.clear_low <= value <= self.clear_high

    def limits(self) -> dict[str, float | None]:
        def finite(v: float) -> float | None:
            return v if math.isfinite(v) else None

        return {"high": finite(self.high), "low": finite(self.low),
                "clear_high": finite(self.clear_high), "clear_low": finite(self.clear_low)}


def flag(name: str, summary: str, *, raise_after_s: float = 0.0,
         clear_after_s: float = 0.0) -> Rule:
    """A rule for a yes/no condition, fed as 1.0 (bad) or 0.0 (good)."""
    return Rule(name, summary, high=1.0, clear_high=0.0, raise_after_ns=int(raise_after_s * S),
                clear_after_ns=int(clear_after_s * S))


# How long a discontinuity keeps its alert up after the last one.
DISCONTINUITY_HOLD_NS = 10 * S

RULES: dict[str, Rule] = {r.name: r for r in (
    Rule("frame_jitter", "frame-interval jitter (RMS) at or above 112 ms", high=112.0,
         clear_high=90.0, raise_after_ns=1 * S, clear_after_ns=3 * S, unit="ms"),
    Rule("lip_sync_atsc", "viewer A/V skew outside +15/-45 ms (ATSC IS-191)", high=15.0,
         low=-45.0, clear_high=10.0, clear_low=-40.0, raise_after_ns=2 * S,
         clear_after_ns=5 * S, inclusive=False, unit="ms"),
    Rule("lip_sync_detectable", "viewer A/V skew outside +45/-125 ms (ITU-R BT.1359)",
         high=45.0, low=-125.0, clear_high=40.0, clear_low=-115.0, raise_after_ns=2 * S,
         clear_after_ns=5 * S, inclusive=False, unit="ms"),
    Rule("bursty_delivery", "excess kurtosis of frame gaps above 3.5", high=3.5,
         clear_high=3.0, raise_after_ns=2 * S, clear_after_ns=3 * S, inclusive=False),
    flag("discontinuity", "capture-time discontinuity in the last 10 s"),
    flag("clock_source_lost", "house clock has lost every configured time source",
         raise_after_s=1.0),
    flag("clock_holdover", "house clock in holdover"),
    flag("clock_slewing", "house clock slewing onto its source"),
    Rule("gpu_fragmentation", "GPU allocator fragmentation index at or above 0.68",
         high=0.68, clear_high=0.6, clear_after_ns=5 * S),
    Rule("gpu_memory", "GPU memory at or above 95 % used", high=95.0, clear_high=90.0,
         clear_after_ns=5 * S, unit="%"),
    flag("viewer_backlog", "a viewer's sync DataChannel backlog is over its bound",
         raise_after_s=2.0, clear_after_s=2.0),
)}


# Lags in ms, + when the caption or dub comes after the voice it follows.
SPEECH_RULES: dict[str, Rule] = {r.name: r for r in (
    # The median of 10 cues wanders by about 0.4 of the scatter of single cues: 100 ms between
    # the lines keeps a lag sitting at 300 ms from flapping for cue starts scattered by up to
    # 150 ms. 200 ms is also the caption/media distance at which a viewer's player resyncs.
    Rule("caption_lag", "captions more than 300 ms off the voice (median of the last 10 cues)",
         high=300.0, low=-300.0, clear_high=200.0, clear_low=-200.0, inclusive=False,
         unit="ms"),
    # Cleared 15 ms inside the window: the wander of the median of 10 cues whose starts scatter
    # by 30 ms (a tightly timed caption track, the only kind this level can judge).
    Rule("caption_lag_bt1359",
         "captions outside +45/-125 ms of the voice (ITU-R BT.1359; + is the caption after)",
         high=45.0, low=-125.0, clear_high=30.0, clear_low=-110.0, inclusive=False, unit="ms"),
    # Fed the median of the last 3 utterances: two lagging utterances carry it, so a dub that
    # falls behind raises on its second late utterance, and one stray utterance (or one stray
    # match) neither raises nor clears it. Raised at 280 ms, the 300 ms level less the meter's
    # 20 ms accuracy, so a dub 300 ms behind raises whichever way its measurement errs.
    Rule("dub_lag", "dub 300 ms or more off its source (median of the last 3 utterances)",
         high=280.0, low=-280.0, clear_high=200.0, clear_low=-200.0, unit="ms"),
)}


@dataclass(frozen=True, slots=True)
class AlertEvent:
    alert: str
    subject: str  # stream name, renderer, GPU device or "clock"
    state: str  # "raised" or "cleared"
    value: float
    t_ns: int
    summary: str

    def as_dict(self) -> dict[str, object]:
        return {"alert": self.alert, "subject": self.subject, "state": self.state,
                "value": round(self.value, 3), "t_ns": self.t_ns, "summary": self.summary}


@dataclass(slots=True)
class _State:
    active: bool = False
    pending_since: int | None = None
    since_ns: int = 0  # when it was raised
    value: float = 0.0
    detail: str = ""


class Alerts:
    """The state of every (alert, subject) pair and the events that changed it."""

    def __init__(self, rules: dict[str, Rule] | None = None) -> None:
        self.rules = dict(RULES if rules is None else rules)
        self._states: dict[tuple[str, str], _State] = {}
        self.recent: deque[AlertEvent] = deque(maxlen=RECENT_EVENTS)

    def update(
        self, name: str, subject: str, value: float | None, now_ns: int, detail: str = ""
    ) -> AlertEvent | None:
        """Feed the figure's current value; an event when the alert changes state. A value
        of None (no data) holds the state and forgets any pending change."""
        rule = self.rules[name]
        key = (name, subject)
        st = self._states.get(key)
        if st is None:
            if value is None or not rule.bad(value):
                return None  # nothing to remember for a quiet subject
            st = self._states[key] = _State()
        if value is None:
            st.pending_since = None
            return None
        st.value = value
        if detail:
            st.detail = detail
        moving = rule.good(value) if st.active else rule.bad(value)
        if not moving:
            st.pending_since = None
            if not st.active and not rule.bad(value):
                del self._states[key]
            return None
        if st.pending_since is None:
            st.pending_since = now_ns
        hold = rule.clear_after_ns if st.active else rule.raise_after_ns
        if now_ns - st.pending_since < hold:
            return None
        st.pending_since = None
        st.active = not st.active
        if st.active:
            st.since_ns = now_ns
            state = "raised"
        else:
            del self._states[key]
            state = "cleared"
        event = AlertEvent(name, subject, state, value, now_ns, rule.summary)
        self.recent.append(event)
        return event

    def forget(self, subjects: Iterable[str], now_ns: int,
               names: Iterable[str] | None = None) -> list[AlertEvent]:
        """The subjects are gone (a stream ended, its publisher left): clear their active
        alerts, or only those named."""
        gone = set(subjects)
        only = None if names is None else set(names)
        events = []
        for (name, subject), st in list(self._states.items()):
            if subject in gone and (only is None or name in only):
                del self._states[(name, subject)]
                if st.active:
                    event = AlertEvent(name, subject, "cleared", st.value, now_ns,
                                       self.rules[name].summary)
                    self.recent.append(event)
                    events.append(event)
        return events

    def is_active(self, name: str, subject: str) -> bool:
        st = self._states.get((name, subject))
        return st is not None and st.active

    def active(self) -> list[dict[str, object]]:
        """Active alerts, oldest first."""
        out = [
            {"alert": name, "subject": subject, "since_ns": st.since_ns,
             "value": round(st.value, 3), "summary": self.rules[name].summary,
             "detail": st.detail}
            for (name, subject), st in self._states.items() if st.active
        ]
        out.sort(key=lambda a: (a["since_ns"], a["alert"], a["subject"]))
        return out

    def catalogue(self) -> list[dict[str, object]]:
        return [{"alert": r.name, "summary": r.summary, "unit": r.unit, **r.limits(),
                 "raise_after_s": r.raise_after_ns / S, "clear_after_s": r.clear_after_ns / S}
                for r in self.rules.values()]


def histogram_counts(values: Iterable[float], edges: tuple[float, ...]) -> list[int]:
    """Counts in (-inf, e0), [e0, e1), ... [e_last, inf)."""
    counts = [0] * (len(edges) + 1)
    for v in values:
        i = 0
        while i < len(edges) and v >= edges[i]:
            i += 1
        counts[i] += 1
    return counts


def most_out_of_band(values: Iterable[float], rule: Rule) -> float | None:
    """The value farthest outside the rule's clear band (the worst viewer), or None."""
    def excess(v: float) -> float:
        return max(v - rule.clear_high, rule.clear_low - v)

    return max(values, key=excess, default=None)


def viewers_over_bound(rows: Iterable[tuple[str, int, int]]) -> dict[str, int]:
    """Per stream, the viewers whose channel holds more than its bound (stream, bytes, bound)."""
    over: dict[str, int] = {}
    for stream, waiting, bound in rows:
        if waiting > bound:
            over[stream] = over.get(stream, 0) + 1
    return over


def clock_alert_values(state: str, sources: list[str]) -> dict[str, float]:
    """The clock alerts' inputs from the house clock's state (clock/service.py STATES).

    Free-running with sources configured means every one of them is gone (holdover expired or
    none ever answered); without sources free-running is the configured normal.
    """
    return {
        "clock_source_lost": float(bool(sources) and state == "freerun"),
        "clock_holdover": float(state == "holdover"),
        "clock_slewing": float(state == "slewing"),
    }
