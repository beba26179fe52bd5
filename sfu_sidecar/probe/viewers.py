"""What viewers report about their playout, per viewer and summed up per stream. Pure.

Per viewer, :class:`ViewerStats` keeps the RFC 3550 jitter and loss of its receiver reports per
track, and from its playout and clock reports (proto/sync.md) the A/V skew it is playing, its
caption timing error and its clock-join error.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from sfu_sidecar.probe.stats import MS, grade, round_or_none
from sfu_sidecar.sync.wire import Playout


class ViewerStats:
    """What one viewer's reports say about its playout."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.rr_jitter_ms: dict[str, float] = {}
        self.rr_fraction_lost: dict[str, float] = {}
        self.av_skew_ms: float | None = None
        self.caption_error_ms: float | None = None
        self.clock_error_ms: float | None = None
        self.resyncs = 0
        self.reports = 0
        self.last_report_ns: int | None = None

    def on_receiver_report(
        self, kind: str, jitter_ticks: int, clock_rate: int, fraction_lost: int
    ) -> None:
        self.rr_jitter_ms[kind] = jitter_ticks * 1000.0 / clock_rate
        self.rr_fraction_lost[kind] = fraction_lost / 256.0

    def on_playout(self, report: Playout, now_ns: int) -> None:
        self.reports += 1
        self.last_report_ns = now_ns
        self.resyncs += report.resyncs
        if report.frames > 0:
            self.av_skew_ms = report.av_skew_ms
        if report.captions > 0:
            self.caption_error_ms = report.caption_error_ms

    def on_clock_report(self, error_ns: int) -> None:
        self.clock_error_ms = error_ns / MS

    def summary(self) -> dict[str, object]:
        return {
            "rr_jitter_ms": {k: round(v, 3) for k, v in self.rr_jitter_ms.items()},
            "rr_jitter_grade": {k: grade(v) for k, v in self.rr_jitter_ms.items()},
            "fraction_lost": dict(self.rr_fraction_lost),
            "av_skew_ms": round_or_none(self.av_skew_ms),
            "caption_error_ms": round_or_none(self.caption_error_ms),
            "clock_error_ms": round_or_none(self.clock_error_ms),
            "resyncs": self.resyncs,
            "reports": self.reports,
        }


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)}


def worst_skew_ms(values: Iterable[float]) -> float | None:
    """The skew farthest from zero, with its sign (the viewer in the worst lip sync)."""
    return max(values, key=abs, default=None)


def viewer_summary(viewers: Iterable[ViewerStats]) -> dict[str, object]:
    """Across one stream's viewers: counts, and median/min/max of each reported figure."""
    vs = list(viewers)
    if not vs:
        return {"viewers": 0, "reporting": 0, "rr_jitter_ms": {}, "rr_jitter_grade": None,
                "av_skew_ms": None, "av_skew_worst_ms": None, "caption_error_ms": None,
                "clock_error_ms": None, "resyncs": 0}
    kinds = sorted({k for v in vs for k in v.rr_jitter_ms})
    skews = [v.av_skew_ms for v in vs if v.av_skew_ms is not None]
    worst_rr = max((x for v in vs for x in v.rr_jitter_ms.values()), default=None)
    return {
        "viewers": len(vs),
        "reporting": sum(1 for v in vs if v.reports),
        "rr_jitter_ms": {k: _spread([v.rr_jitter_ms[k] for v in vs if k in v.rr_jitter_ms])
                         for k in kinds},
        "rr_jitter_grade": grade(worst_rr),
        "av_skew_ms": _spread(skews),
        "av_skew_worst_ms": round_or_none(worst_skew_ms(skews)),
        "caption_error_ms": _spread([v.caption_error_ms for v in vs
                                     if v.caption_error_ms is not None]),
        "clock_error_ms": _spread([v.clock_error_ms for v in vs if v.clock_error_ms is not None]),
        "resyncs": sum(v.resyncs for v in vs),
    }
