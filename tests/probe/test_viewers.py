"""Viewer reports and their per-stream summary, worked out by hand."""

from __future__ import annotations

from sfu_sidecar.probe.viewers import ViewerStats, viewer_summary, worst_skew_ms
from sfu_sidecar.sync.wire import Playout


def playout(**fields: object) -> Playout:
    base: dict[str, object] = {"stream": "s", "t_ns": 0, "frames": 0, "av_skew_ms": 0.0,
                               "captions": 0, "caption_error_ms": 0.0, "resyncs": 0}
    base.update(fields)
    return Playout(**base)  # type: ignore[arg-type]


def test_viewer_reports_and_their_summary() -> None:
    a, b, c = ViewerStats("s"), ViewerStats("s"), ViewerStats("s")
    a.on_receiver_report("video", 900, 90000, 64)  # 10 ms, a quarter lost
    b.on_receiver_report("video", 4500, 90000, 0)  # 50 ms
    a.on_playout(playout(frames=30, av_skew_ms=12.0, captions=1, caption_error_ms=20.0,
                         resyncs=1), 1)
    # A report without measurements keeps the last ones.
    a.on_playout(playout(resyncs=2), 2)
    b.on_playout(playout(frames=30, av_skew_ms=-80.0), 3)
    c.on_playout(playout(frames=30, av_skew_ms=5.0), 4)
    a.on_clock_report(1_500_000)
    assert a.summary() == {
        "rr_jitter_ms": {"video": 10.0}, "rr_jitter_grade": {"video": "fair"},
        "fraction_lost": {"video": 0.25}, "av_skew_ms": 12.0, "caption_error_ms": 20.0,
        "clock_error_ms": 1.5, "resyncs": 3, "reports": 2,
    }
    summary = viewer_summary([a, b, c])
    assert summary["viewers"] == 3 and summary["reporting"] == 3
    assert summary["rr_jitter_ms"] == {"video": {"median": 30.0, "min": 10.0, "max": 50.0}}
    assert summary["rr_jitter_grade"] == "poor"
    assert summary["av_skew_ms"] == {"median": 5.0, "min": -80.0, "max": 12.0}
    assert summary["av_skew_worst_ms"] == -80.0
    assert summary["caption_error_ms"] == {"median": 20.0, "min": 20.0, "max": 20.0}
    assert summary["clock_error_ms"] == {"median": 1.5, "min": 1.5, "max": 1.5}
    assert summary["resyncs"] == 3
    assert viewer_summary([])["av_skew_ms"] is None


def test_worst_skew_keeps_its_sign() -> None:
    assert worst_skew_ms([12.0, -80.0, 5.0]) == -80.0
    assert worst_skew_ms([]) is None
