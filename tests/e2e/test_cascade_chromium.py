"""Push into, and pull from, Chromium's WebRTC stack (tests/e2e/cascade_chromium_probe.py).

Push: Chromium as the WHIP endpoint a stream is forwarded to. Each presented frame's
abs-capture-time, as Chromium reports it, is the frame's true capture time (to Chromium's whole
milliseconds): the relay writes house time into the pushed packets. The push's DELETE reaches
the endpoint.

Pull: Chromium as a WHEP server that is not a sidecar (no house clock to join). The edge serves
its camera to an aiortc viewer and says honestly where its capture times come from: estimated,
from what Chromium sends.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.harness import judge_pixels
from tests.support import probe as probes

pytestmark = [pytest.mark.browser, pytest.mark.netns, pytest.mark.timeout(150)]

NTP_EPOCH_UNIX_MS = 2_208_988_800_000  # 1900-01-01 to 1970-01-01


def run_probe(mode: str) -> dict[str, Any]:
    return probes.run_probe("tests.e2e.cascade_chromium_probe", mode, timeout=120)


def test_push_to_chromium_carries_capture_times_in_house_time() -> None:
    result = run_probe("push")
    assert result["create"] == 201, result
    assert result["offer_has_abs_capture_time"]
    push = result["push"]
    assert push["state"] == "connected" and push["attempts"] == 1, push
    # Chromium is no sidecar: it never answers the clock join, and the push says so.
    assert push["session"]["clock"] is None, push
    assert result["stats"]["channel"] == "sync"
    truth = {int(n): ns for n, ns in result["capture_log"].items()}
    frames = result["frames"]
    assert len(frames) >= 60, len(frames)
    # The synchronization source describes the last frame received; it speaks for the
    # presented one when their RTP timestamps agree. Chromium reports whole milliseconds.
    reported = [(f["n"], round((f["captureTimestamp"] - NTP_EPOCH_UNIX_MS) * 1_000_000))
                for f in frames if f["captureTimestamp"] is not None and f["srcRtp"] == f["rtp"]]
    judged = judge_pixels(reported, truth, 1_000_001)
    assert len(reported) >= 20, (len(reported), len(frames))
    errors = sorted(judged.errors)
    print(f"\npush to Chromium: {len(frames)} frames, abs-capture-time error median "
          f"{errors[len(errors) // 2] / 1e6:.2f} ms, max {errors[-1] / 1e6:.2f} ms over "
          f"{len(errors)}")
    judged.check(tolerance_ns=1_000_001)
    assert result["delete"] == 200
    assert result["bridge_deletes"] == 1


def test_pull_from_a_chromium_whep_server_maps_what_it_sends() -> None:
    result = run_probe("pull")
    assert result["offer"]
    assert result["frames"] == 30 and result["sizes"] == [[320, 240]], result
    publisher = result["publisher"]
    assert publisher["upstream"].endswith("/whep/cam")
    assert publisher["clock"] is None  # nothing to join: not a sidecar
    assert result["stats"]["out_video"] > 0
    video = [a for a in result["anchors"] if not a["audio"]]
    assert video and all(a["estimated"] for a in video), result["anchors"]
    assert result["records"] >= 25
    tracks = result["sync"][0]["tracks"]
    assert tracks["video"]["estimated"] is True, tracks
    assert tracks["video"]["source"] in ("abs_capture_time", "sender_report", "arrival"), tracks
    print(f"\npull from Chromium: video capture times from {tracks['video']['source']}, "
          "flagged estimated")
