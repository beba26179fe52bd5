"""The operator dashboard in Chromium against a live demo stream with injected jitter.

The probe module (run in a network namespace with only ``lo``) publishes the demo stream with
a video source that can stall and burst, opens the viewer page and ``/dashboard``, injects the
stalls until the dashboard shows the frame jitter alert, and stops them until it clears. The
screenshots it takes are kept under the test's tmp_path; the one with the alert up is also
copied to /tmp/dashboard.png to be looked at.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support import probe as probes

pytestmark = [pytest.mark.browser, pytest.mark.netns, pytest.mark.timeout(300)]

SHOWCASE = Path("/tmp/dashboard.png")


def test_dashboard_plots_live_data_and_the_jitter_alert_comes_and_goes(tmp_path: Path) -> None:
    result = probes.run_probe("tests.e2e.dashboard_probe", tmp_path, timeout=240)

    before = result["before"]
    assert before["link"] == "live"
    # Every plot of the stream has data: publisher figures, viewer reports, the clock.
    for plot, series in (("jitter", "RFC 3550 video"), ("jitter", "frame interval (RMS)"),
                         ("jitter", "viewers (max RR)"), ("skew", "publisher capture"),
                         ("skew", "viewers (median)"), ("drift", "video"),
                         ("bursts", "video")):
        assert before["plots"][plot][series] >= 2, (plot, series, before["plots"])
    assert before["clock"]["offset from host"] >= 5
    assert sum(before["captionBars"]) >= 1  # the viewer page reported caption timing
    assert "frame_jitter" not in before["alerts"]

    during = result["during"]
    assert "frame_jitter" in during["alerts"]
    rms = float(during["figures"].split("frame interval RMS ")[1].split(" ms")[0])
    assert rms >= 112.0, during["figures"]

    after = result["after"]
    assert "frame_jitter" not in after["alerts"]
    frame_events = [state for alert, state in after["events"] if alert == "frame_jitter"]
    assert frame_events[:2] == ["cleared", "raised"]  # newest first
    recent = [(e["alert"], e["state"]) for e in result["api_alerts"]["recent"]
              if e["alert"] == "frame_jitter"]
    assert recent == [("frame_jitter", "raised"), ("frame_jitter", "cleared")]
    # More ticks arrived over the one push channel than there were messages before.
    assert after["ticks"] > during["ticks"] > before["ticks"] > 0

    for key in ("screenshot_alert", "screenshot_cleared"):
        shot = Path(result[key])
        assert shot.parent == tmp_path and shot.stat().st_size > 20_000
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    shutil.copyfile(result["screenshot_alert"], SHOWCASE)
    print(f"\ndashboard: plots live after {result['warm_up_s']:.1f} s, jitter alert raised "
          f"{result['raised_after_s']:.1f} s after the stalls began, cleared "
          f"{result['cleared_after_s']:.1f} s after they stopped; screenshot {SHOWCASE}")
