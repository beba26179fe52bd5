"""The viewer page in Chromium maps presented frames to their true capture time.

``requestVideoFrameCallback`` gives each presented frame's ``rtpTimestamp``; the page maps it to
a capture time through the relay's ``sync`` records. The synthetic publisher knows every frame's
true capture time and the page reads the frame number off the pixels, so the two are compared
frame by frame.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.harness import in_stored_cue, judge_pixels
from tests.support import probe as probes

pytestmark = [pytest.mark.browser, pytest.mark.netns]

TOLERANCE_NS = 1_000_000
CLOCK_BOUND_LIMIT_NS = 20_000_000
CUE_TEXT = "caption on capture time"
NTP_EPOCH_UNIX_MS = 2_208_988_800_000  # 1900-01-01 to 1970-01-01


def test_presented_frames_map_to_their_true_capture_time() -> None:
    check_viewer_page(run_probe())


@pytest.mark.timeout(150)
def test_on_an_edge_frames_and_captions_keep_the_origins_capture_times() -> None:
    # The publisher and the cue go to the origin; the page views on an edge that pulls the
    # stream over WHEP (origin_url): the same exactness, one hop away.
    check_viewer_page(run_probe("--cascade"))


def run_probe(*args: str) -> dict[str, Any]:
    return probes.run_probe("tests.e2e.sync_viewer_probe", *args, timeout=120)


def check_viewer_page(result: dict[str, Any]) -> None:
    assert result["joined"], "the publisher did not join the house clock"
    frames = result["frames"]
    truth = {int(n): ns for n, ns in result["capture_log"].items()}
    assert len(frames) >= 60, result["stats"]
    mapped = [f for f in frames if f["capture"] is not None]
    share = len(mapped) / len(frames)
    judged = judge_pixels(((f["n"], int(f["capture"])) for f in mapped), truth, TOLERANCE_NS)
    errors = sorted(judged.errors)
    print(f"\nChromium viewer: {len(frames)} presented, {share:.1%} mapped, "
          f"|error| median {errors[len(errors) // 2] / 1e3:.1f} us, max {errors[-1] / 1e3:.1f} us")
    assert share >= 0.95
    judged.check(tolerance_ns=TOLERANCE_NS)
    # The relay writes abs-capture-time in house time into every packet; Chromium reports it
    # in getSynchronizationSources() as whole milliseconds since the NTP epoch (1900).
    sources = [x for x in result["sources"] if x["mapped"] is not None]
    assert len(sources) >= 60
    for x in sources:
        reported_unix_ms = x["captureTimestamp"] - NTP_EPOCH_UNIX_MS
        assert abs(reported_unix_ms - int(x["mapped"]) / 1e6) <= 1.0, x

    # The page reports its own mapping back over the channel (telemetry in /api/sync).
    viewer = result["sync_status"]["viewers"][0]
    telemetry = viewer["telemetry"]
    assert telemetry is not None and telemetry["stream"] == "e2e"
    assert telemetry["presented"] >= len(frames) * 0.9
    assert telemetry["mapped"] >= telemetry["presented"] * 0.95
    # ... and joined the house clock over it. Page and relay read the same host clock, so the
    # true offset is zero: the reported bound must contain it. The bound is half the best round
    # trip of the join, a few milliseconds on a loaded machine, so it is held to a sane size too.
    report = viewer["clock_report"]
    assert report is not None, viewer
    assert abs(report["offset_ns"]) <= report["error_ns"], report
    assert report["error_ns"] <= CLOCK_BOUND_LIMIT_NS, report
    print(f"sync traffic to the page: {viewer['messages_per_s']} messages/s, "
          f"{viewer['bytes_per_s']} bytes/s")

    # The caption shows exactly on the frames captured in its interval, and on no other.
    cue = result["cue"]
    assert cue["status"] in (200, 201)
    inside = [f for f in mapped if cue["start"] <= int(f["capture"]) < cue["end"]]
    assert len(inside) >= 30  # 1.5 s of 30 fps video, most of it presented
    for f in mapped:
        shown = in_stored_cue(int(f["capture"]), cue["start"], cue["end"])
        if shown is not None:
            assert f["caption"] == (CUE_TEXT if shown else ""), (f, cue)
    # ... where its settings (line:0 align:start) put it, on the first line at the start side;
    # on an edge too, which got the cue from the origin over its sync channel.
    for f in inside:
        assert f["placement"] == [{"line": 0, "snapToLines": True, "align": "start"}], f
