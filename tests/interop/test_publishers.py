"""Capture timelines of publishers nobody here wrote, and of the product's own client, over 30 s.

Each case runs ``tests.interop.publisher_probe`` in a loopback-only namespace: the product, one
publisher, and an aiortc viewer reading the ``sync`` channel. For every kind the capture time of
the viewer's frames never goes backwards and advances at 1 s per second within 0.5 %; where the
true capture instant is known it is checked against it.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import probe as probes

# Half a minute of media each, plus start-up and, for Chromium, waiting for the machine's browser
# lock.
pytestmark = [pytest.mark.netns, pytest.mark.timeout(300)]

# 20 s judged after the settle window and the last 5 s: long enough for a rate within 0.5 % to
# mean something (a queue growing by 100 ms over it) and for many sender reports (aiortc sends
# one every 0.5-1.5 s) to each have had their chance to move the timeline.
SECONDS = 30
# Before a publisher's reports are trusted, capture time comes from arrivals: the product needs
# two reports at least 0.5 s apart, and aiortc sends one every 0.5-1.5 s (uniform), none before
# its first packet, so its second report can come 4.5 s in. At 3 s a fresh-clone run found 6
# of 2849 frames still (rightly) from arrival.
SETTLE_S = 5
FRAME_MS_30FPS = 33.4
CHROMIUM_TRUSTED_BY_S = 12


def probe(kind: str, viewer: str = "aiortc", seconds: int = SECONDS) -> dict[str, Any]:
    result = probes.run_probe("tests.interop.publisher_probe", kind, seconds, SETTLE_S, viewer,
                              timeout=seconds + 120)
    probes.show(result)
    return result


def steady_timeline(result: dict[str, Any], video_fps: int = 30) -> None:
    """Media flowed all along (at least half its nominal frame rate: a loaded machine's
    Chromium camera gave 14 of its 20 fps), capture time never ran backwards, and it ran at
    1 s per second of arrival within 0.5 %. The rate is held loosely because it is measured
    against arrival, and a sender that falls behind under load queues its packets: capture
    time then runs slower than arrival by the queue's growth (-1950 ppm in one loaded run,
    with Chromium's own capture stamps); a timeline that jumps back at every report, or runs at
    a report's doubled rate, is far outside."""
    for media, fps in (("video", video_fps), ("audio", 50)):
        fig = result[media]
        assert fig["frames"] >= fps / 2 * (SECONDS - SETTLE_S - 5), (media, fig)
        assert fig["span_s"] >= SECONDS - SETTLE_S - 5, (media, fig)
        assert fig["backwards"] == 0, (media, fig)
        assert abs(fig["rate_ppm"]) <= 5000, (media, fig)


def track_status(result: dict[str, Any], media: str) -> dict[str, Any]:
    (pub,) = result["publishers"]
    status: dict[str, Any] = pub["tracks"][media]
    return status


@pytest.mark.needs("/usr/bin/python3", "gst-launch-1.0")
def test_gstreamer_publisher_sending_only_sender_reports() -> None:
    """webrtcbin (GStreamer 1.22): its reports' RTP time runs at twice its media's rate. The
    product refuses them, says why, and keeps a steady timeline from arrivals."""
    result = probe("gstreamer")
    steady_timeline(result)
    for media in ("video", "audio"):
        assert result[media]["sources"] == {"arrival": result[media]["frames"]}
        status = track_status(result, media)
        assert status["sender_reports_refused"] >= 1
        assert "advances" in status["sender_reports_distrusted"]


@pytest.mark.browser
@pytest.mark.needs("/usr/bin/python3", "gst-launch-1.0")
def test_gstreamer_publisher_on_the_products_viewer_page() -> None:
    """The same publisher watched in Chromium with the product's page: the capture time of every
    presented frame moves forward at 1 s per second of arrival, where it used to jump back by
    seconds at every sender report."""
    seconds = 30
    page = probe("gstreamer", "chromium", seconds)["page"]
    assert page["frames"] >= 25 * (seconds - SETTLE_S - 5), page
    assert page["backwards"] == 0 and page["repeated"] == 0, page
    assert abs(page["rate_ppm"]) <= 1000, page
    advanced = page["stream_s_last"] - page["stream_s_first"]
    assert seconds - SETTLE_S - 3 <= advanced <= seconds - SETTLE_S + 1, page


@pytest.mark.browser
@pytest.mark.parametrize("act", [False, True], ids=["sender-reports", "abs-capture-time"])
def test_chromium_publisher_fake_camera_and_microphone(act: bool) -> None:
    """Chromium's fake camera and microphone, with and without abs-capture-time: the capture
    source is the one negotiated, every frame of a minute is on one steady timeline."""
    result = probe("chromium-act" if act else "chromium")
    assert result["publish"]["act"] is act
    steady_timeline(result, video_fps=20)  # the fake camera's rate
    source = "abs_capture_time" if act else "sender_report"
    for media, fps in (("video", 20), ("audio", 50)):
        fig = result[media]
        # Before the second report vouches for the first, frames map by arrival, and from
        # then on by the negotiated source. Chromium reports audio every ~5 s (RFC 3550's
        # minimum, randomized by 0.5-1.5), so the second report may come 10 s in, and later
        # on a loaded machine: arrival for at most the first 12 s.
        assert set(fig["sources"]) <= {source, "arrival"}, (media, fig)
        arrival_s = fig["sources"].get("arrival", 0) / fps
        assert arrival_s <= CHROMIUM_TRUSTED_BY_S - SETTLE_S, (media, fig)
        assert track_status(result, media)["sender_reports_distrusted"] is None
        print(f"{media}: mapped by arrival for {arrival_s:.1f} s after the settle window, "
              f"then by {source}")


@pytest.mark.browser
def test_chromium_publisher_canvas_against_the_drawn_instant() -> None:
    """Chromium publishing a canvas whose frames carry the instant they were drawn. Chromium
    stamps a canvas frame when it grabs it, up to a frame after it was drawn, so the drawn
    instant is truth only to within a frame interval: every frame is held to one interval and
    the median to half of one (runs measure -4 to -10 ms). How far single frames scatter around
    the median (``err_spread_p95_ms``, 1-15 ms) follows the page's draw timer under load, not
    the product, so it is printed, not bounded."""
    result = probe("chromium-canvas")
    steady_timeline(result)
    video = result["video"]
    assert video["sources"].get("sender_report", 0) == video["frames"], video
    assert video["truth_n"] >= 0.9 * video["frames"]
    assert video["abs_err_p95_ms"] <= FRAME_MS_30FPS, video
    assert abs(video["err_median_ms"]) <= FRAME_MS_30FPS / 2, video


def test_aiortc_publisher_with_sender_reports_only() -> None:
    """aiortc without abs-capture-time or a clock join: its reports use the host clock, so the
    capture instant of every packet is known. Its reports pair a packet's timestamp with the
    time it was sent, so they are late by aiortc's encode and pacing delay, and the product's
    estimate of aiortc's clock offset is late by the least delay its reports arrive with. The
    probe measures both from the packets (``send_lag_ms``, capture to send: p10 about 1 ms on
    an idle machine; ``path_ms``, send to viewer: p10 about 1 ms), because a machine too loaded
    for aiortc's encoder or the product's loop moves them by 100 ms and more, and no receiver
    can map closer than they allow. The product maps within 5 ms of the least of both, audio and
    video on one timeline within 5 ms plus the difference of their lateness."""
    result = probe("aiortc")
    steady_timeline(result)
    lag, path = result["send_lag_ms"], result["path_ms"]
    for media in ("video", "audio"):
        fig = result[media]
        assert fig["sources"] == {"sender_report": fig["frames"]}, fig
        assert fig["truth_n"] == fig["frames"]
        floor = lag[media]["p10"] + path[media]["p10"]
        # Never early by more than a few ms: the reports are late, not early.
        assert -5.0 <= fig["err_median_ms"] <= floor + 5.0, (media, fig, lag, path)
        assert fig["abs_err_p95_ms"] <= lag[media]["p95"] + path[media]["p95"] + 10.0, (
            media, fig, lag, path)
    skew_allowed = 5.0 + abs(lag["audio"]["p50"] - lag["video"]["p50"])
    assert abs(result["av_skew_ms"]) <= skew_allowed, (result, lag)


def test_aiortc_publisher_with_capture_stamps_and_a_clock_join() -> None:
    """The product's own client: abs-capture-time and a clock join give the exact timeline."""
    result = probe("aiortc-join")
    assert result["publish"]["joined"]
    steady_timeline(result)
    video = result["video"]
    assert video["sources"] == {"abs_capture_time": video["frames"]}
    assert video["truth_n"] >= 0.9 * video["frames"]
    assert video["abs_err_p95_ms"] <= 1.0, video
