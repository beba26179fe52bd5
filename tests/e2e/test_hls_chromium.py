"""hls.js (the pinned npm release) in headless Chromium plays the HLS master playlist of a live
H.264 stream with a WebVTT caption rendition, and puts every cue on the media timeline at the
stream time it was ingested with.

hls.js may shift the timeline (it starts media time at the first fragment it loads), so cues
are compared with the media time of the frames: each presented frame's media time (from
``requestVideoFrameCallback``) against its true stream time (capture time, known to the
publisher by the frame number in its pixels, minus the stream epoch) gives the shift, and each
cue's start and end on the text track, less that shift, must be its ingested stream time.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import NOT_RUN, ROOT, partial_run
from tests.e2e.hls_probe import HLS_JS

pytestmark = [pytest.mark.browser]

FRAME_S = 1 / 30  # the synthetic publisher's frame interval: the cue tolerance
PLAYED_S = 10.0


@pytest.fixture(scope="module")
def probe() -> dict[str, Any]:
    if not HLS_JS.is_file():
        reason = (f"{HLS_JS.relative_to(ROOT)} is missing: run `npm ci --no-audit --no-fund` in "
                  f"{ROOT} to install the pinned hls.js")
        if partial_run():
            pytest.skip(NOT_RUN + reason)
        pytest.fail(reason, pytrace=False)
    proc = subprocess.run([sys.executable, "-m", "tests.e2e.hls_probe"],
                          cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_hls_js_plays_the_stream_and_shows_each_cue_at_its_stream_time(
    probe: dict[str, Any]
) -> None:
    pinned = json.loads((ROOT / "package.json").read_text())["devDependencies"]["hls.js"]
    assert probe["hls_version"] == pinned
    assert probe["joined"] and probe["epoch"] is not None
    page = probe["page"]
    assert not [e for e in page["errors"] if e["fatal"]], page["errors"]
    assert page["subtitleTracks"] == [{"lang": "en", "name": "en", "default": True}]

    played = [s["currentTime"] for s in page["samples"]]
    assert max(played) - min(played) >= PLAYED_S, page["samples"]

    # The shift from stream time to hls.js's media time, frame by frame.
    epoch = probe["epoch"]
    truth = {int(n): ns for n, ns in probe["capture_log"].items()}
    frames = [f for f in page["frames"] if f["n"] in truth]
    assert len(frames) >= PLAYED_S * 25, len(page["frames"])
    shifts = [f["mediaTime"] - (truth[f["n"]] - epoch) / 1e9 for f in frames]
    shift = statistics.median(shifts)
    # One shift for the whole run (frames whose number misread are the only outliers).
    assert sum(abs(s - shift) <= 0.001 for s in shifts) >= 0.95 * len(shifts)
    # The fragments hls.js played start where the segments did, on the same shift.
    segments = {int(n): s for n, s in probe["segments"].items()}
    frag_shifts = [f["start"] - segments[int(f["url"].split(".")[0])] for f in page["frags"]]
    assert frag_shifts and max(abs(s - shift) for s in frag_shifts) <= FRAME_S, frag_shifts

    ingested = {c["text"]: c for c in probe["ingested"]}
    assert all(c["status"] == 200 for c in ingested.values())
    cues = page["cues"]
    errors = []
    for cue in cues:
        sent = ingested[cue["text"]]
        assert cue["id"] == sent["id"] and cue["lang"] == "en"
        errors += [cue["start"] - shift - sent["start"], cue["end"] - shift - sent["end"]]
    assert page["mostCopies"] == 1  # a cue in two chunks is shown once
    # Every cue ingested for the stretch of stream time that played reached the text track.
    stream_s = [(truth[f["n"]] - epoch) / 1e9 for f in frames]
    first, last = min(stream_s), max(stream_s)
    due = {t for t, c in ingested.items() if first <= c["start"] < c["end"] <= last}
    assert len(due) >= 4 and due <= {c["text"] for c in cues}, (sorted(due), cues)

    latency = statistics.median(s["latency"] for s in page["samples"] if not s["paused"])
    capture_to_display = statistics.median(f["wallMs"] / 1e3 - truth[f["n"]] / 1e9
                                           for f in frames)
    print(f"\nhls.js {probe['hls_version']}: played {max(played) - min(played):.1f} s, "
          f"{len(frames)} frames, media time = stream time {shift:+.6f} s "
          f"(fragment starts within {max(abs(s - shift) for s in frag_shifts) * 1e3:.3f} ms); "
          f"{len(cues)} cues, |error| of start and end vs stream time: "
          f"max {max(map(abs, errors)) * 1e3:.3f} ms, "
          f"median {statistics.median(map(abs, errors)) * 1e3:.3f} ms; "
          f"hls.js latency {latency:.2f} s (target {page['samples'][-1]['targetLatency']} s), "
          f"capture to display {capture_to_display:.2f} s")
    assert max(map(abs, errors)) <= FRAME_S, errors
    assert 0 < latency < 15 and 0 < capture_to_display < 15
