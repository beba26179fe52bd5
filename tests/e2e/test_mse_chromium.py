"""The viewer page's MSE mode in Chromium: live segments and caption chunks on one timeline,
in both latency modes: ``low`` (the default: the segment being made streamed part by part, the
captions pushed live) and ``segments`` (whole closed segments).

The probe (mse_probe.py) runs the service, an aiortc publisher whose frames carry their number
in their pixels (and whose true capture time per number it logs) and headless Chromium on
``/?mode=mse``. Half-way the publisher leaves and a new one comes back 1.5 s later with a new
RTP timestamp base: a break in the stream timeline. Per presented frame the page records the
frame number, the stream time the player gives it and the cues active on its text track, so
every figure below is checked against the publisher's own capture times.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest

from tests.support import probe as probes

PROBE_TIMEOUT_S = 300  # includes waiting for the machine-wide browser lock
pytestmark = [pytest.mark.browser, pytest.mark.netns, pytest.mark.timeout(PROBE_TIMEOUT_S + 30)]
FRAME_S = 1 / 30
WATCH_S = 7.0
GAP_S = 1.5
# WebM stores milliseconds: a frame's pts is its capture time within half of one.
PTS_ROUNDING_S = 0.0005
SETTLE_S = 1.0  # a returning publisher's clock join settles within this (its first frames are
# mapped from an estimate, flagged as such)
RESYNC_WINDOW_S = 0.2
DRIFT_S = 0.5
BOUNDARY_S = 3 * FRAME_S


def run_probe(codec: str, latency: str, *args: str) -> dict[str, Any]:
    return probes.run_probe("tests.e2e.mse_probe", "--codec", codec, "--latency", latency,
                            "--watch", WATCH_S, *args, timeout=PROBE_TIMEOUT_S)


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


@pytest.mark.parametrize("latency", ["low", "segments"])
@pytest.mark.parametrize("codec", ["vp8", "h264"])
def test_mse_playback_keeps_captions_on_the_frames_through_a_discontinuity(
    codec: str, latency: str
) -> None:
    result = run_probe(codec, latency, "--gap", str(GAP_S))
    frames = result["frames"]
    stats = result["stats"]
    assert stats["mime"].startswith("video/webm" if codec == "vp8" else "video/mp4")
    assert stats["lowLatency"] == (latency == "low")
    # Every segment of a low-latency run was streamed whole as it was made (none broke off),
    # and the captions came over the live push too.
    assert stats["streamBreaks"] == 0 and stats["liveCaptions"] == "open"
    assert stats["livePushed"] >= 1

    # It plays: frames at about the publisher's rate, the playhead moving on.
    assert len(frames) >= 0.8 * 2 * WATCH_S / FRAME_S, stats
    start, end = result["current_time"]
    assert end - start >= 0.8 * (2 * WATCH_S + GAP_S), result["current_time"]

    # The break, where the frames' stream times jump: the last frame before it and the first
    # after, the first frame played after the player's one resync. Any other jump is one the
    # player made itself and counted: following the live edge after falling behind (a loaded
    # machine stalled H.264 playback after the seek across the break long enough for one), or
    # skipping a hole.
    at = [f["resyncs"] for f in frames].index(1)
    last_before, first_after = frames[at - 1], frames[at]
    assert first_after["frameS"] - last_before["frameS"] > 0.8, (last_before, first_after)
    for a, b in itertools.pairwise(frames):
        if b["frameS"] - a["frameS"] > 0.8 and b is not first_after:
            assert b["seeks"] > a["seeks"], ("an unexplained jump", a, b, stats["seeks"])
            print(f"\nthe player jumped from {a['frameS']:.3f} s to {b['frameS']:.3f} s "
                  f"(seeks {stats['seeks']})")
    back_s = first_after["frameS"]

    # Media time is stream time: each frame's pts (as the player reads it) is the true capture
    # time of the picture on screen minus the epoch. Not checked while a returning publisher
    # settles: its first frames are mapped from an estimate until its clock join (flagged as
    # such), and right after the seek across the break Chromium's H.264 path showed pictures
    # up to two frames off the frame times rVFC reported.
    errors = sorted(pts_error_s(result, f) for f in frames
                    if not back_s <= f["frameS"] < back_s + SETTLE_S)
    print(f"\n{codec}: {len(frames)} frames presented, |pts - capture| median "
          f"{errors[len(errors) // 2] * 1e3:.2f} ms, worst three "
          f"{[round(e * 1e3, 2) for e in errors[-3:]]} ms")
    # One frame in a run may have its number misread off the pixels (the canvas read-back
    # caught mid-update a few times in some forty runs, giving a number seconds away or one
    # never drawn): the second worst frame must be right, and the worst is printed.
    assert errors[-2] <= 0.001

    # Exactly one resync, at the break, for about the time the publisher was away.
    before, after = result["before_gap"], stats
    assert before["resyncs"] == 0, before
    assert after["resyncs"] == 1, after
    correction = after["lastCorrection"]
    assert correction["reason"] == "discontinuity"
    assert GAP_S - 0.3 <= correction["jumpS"] <= GAP_S + 1.0, correction
    assert result["panel"].startswith("1 (discontinuity"), result["panel"]

    check_captions(result, codec, before_s=last_before["frameS"], after_s=back_s)

    # The captions are a real text track of the <video>: the language offered, shown natively.
    assert result["tracks"] == [{"kind": "captions", "language": "en", "mode": "showing",
                                 "cues": result["tracks"][0]["cues"]}]
    assert result["tracks"][0]["cues"] >= 1


@pytest.mark.parametrize("latency", ["low", "segments"])
def test_mse_playback_moves_drifted_media_back_onto_the_caption_timeline(latency: str) -> None:
    """The index (stream time, the captions' timeline) and the bytes' own timestamps disagree
    by 0.5 s from half-way on: one resync moves the media onto the index's timeline."""
    codec = "vp8"
    result = run_probe(codec, latency, "--drift", str(DRIFT_S))
    frames = result["frames"]
    assert result["before_drift"]["resyncs"] == 0
    stats = result["stats"]
    assert stats["resyncs"] == 1, stats
    correction = stats["lastCorrection"]
    assert correction["reason"] == "drift"
    assert abs(correction["correctionS"] - DRIFT_S) <= 0.01, correction
    assert stats["shiftS"] == 0 and abs(stats["offsetS"] - DRIFT_S) <= 0.01

    # Before the resync each frame plays at its capture time; after it, at the index's time for
    # it, 0.5 s later, frame by frame.
    # The resync leaves a hole in the media timeline as long as the drift, which the player
    # skips: the first frame after it is where the index's timeline begins.
    first = next(i for i in range(1, len(frames))
                 if frames[i]["frameS"] - frames[i - 1]["frameS"] > DRIFT_S / 2)
    before = sorted(pts_error_s(result, f) for f in frames[:first])
    # The seek across the hole: the pictures of the first frames after it were read off
    # mid-update a few times (as after a break, above).
    after = sorted(pts_error_s(result, f, DRIFT_S) for f in frames[first:]
                   if f["frameS"] >= frames[first]["frameS"] + SETTLE_S)
    # After it, within 2 ms: the correction is measured off the buffered range's edges, which
    # lie within a millisecond of the segment's first frame (WebM stores milliseconds).
    assert before[-2] <= 0.001 and after[-2] <= 0.002, (before[-3:], after[-3:])
    # Playback went on after it: 2.5 s of media, at least half its frames presented (Chromium
    # short of CPU drops some: 74 of 75 once, beside an install).
    played_s = frames[-1]["frameS"] - frames[first]["frameS"]
    assert played_s >= 2.5 and len(frames) - first >= 0.5 * played_s / FRAME_S, (
        played_s, len(frames) - first)
    print(f"after the resync: {played_s:.2f} s of media played, {len(frames) - first} frames "
          f"presented ({(len(frames) - first) * FRAME_S / played_s:.0%} of them)")
    print(f"\n{codec}: drift resync at {correction['atS']:.2f} s by "
          f"{correction['correctionS'] * 1e3:.1f} ms; {first} frames before, "
          f"{len(frames) - first} after")
    check_captions(result, codec, before_s=frames[first - 1]["frameS"],
                   after_s=frames[first]["frameS"])


def test_mse_playback_starts_over_after_a_segment_the_browser_refuses() -> None:
    """Half-way, one segment reaches the page corrupted (a proxy overwrites its first bytes):
    the SourceBuffer refuses it and the media element is in error. The player starts over on a
    new MediaSource from the segment after it: counted, the reason kept, nothing replayed."""
    result = run_probe("vp8", "low", "--corrupt")
    assert result["before_corrupt"]["restarts"] == 0
    stats = result["stats"]
    corrupted = result["corrupted"].rsplit("/", 1)[-1]
    assert stats["restarts"] == 1, stats
    assert corrupted in stats["lastError"], stats["lastError"]
    assert stats["resyncs"] == 0
    frames = result["frames"]
    bad_s = int(corrupted.split(".")[0]) / 1000  # a segment's number is its start in ms
    after = [f for f in frames if f["frameS"] > bad_s]
    # Playback went on past it: 2 s of media, at least half its frames presented.
    played_s = after[-1]["frameS"] - after[0]["frameS"] if after else 0.0
    assert played_s >= 2.0 and len(after) >= 0.5 * played_s / FRAME_S, (played_s, len(after),
                                                                           stats)
    times = [f["frameS"] for f in frames]
    assert times == sorted(times), "a frame was shown again after the restart"
    errors = sorted(pts_error_s(result, f) for f in after
                    if f["frameS"] >= after[0]["frameS"] + SETTLE_S)
    assert errors[-2] <= 0.001
    print(f"\nrestart after {stats['lastError']!r}: {len(after)} frames after it, "
          f"from {after[0]['frameS'] - bad_s:.2f} s past the refused segment's start")


def pts_error_s(result: dict[str, Any], frame: dict[str, Any], shift_s: float = 0.0) -> float:
    """How far a presented frame's stream time (as the player gives it) is from the true
    capture time of the picture on screen (by the number read off its pixels) minus the epoch,
    plus ``shift_s``; infinite for a number the publisher never drew (a misread)."""
    captured = result["capture_log"].get(str(frame["n"]))
    if captured is None:
        return math.inf
    return abs(frame["frameS"] - (captured - result["epoch_ns"]) / 1e9 - shift_s)


def check_captions(result: dict[str, Any], codec: str, *, before_s: float,
                   after_s: float) -> None:
    """Cues against the frames' stream times (each frame's pts on the player's timeline), up
    to ``before_s`` and from ``after_s`` (a break or a resync) on."""
    epoch = result["epoch_ns"]
    frames = result["frames"]
    # Each cue first shows on the first presented frame captured in its interval. Only cues
    # that start while frames are being captured count (not in a gap, not before playback). A
    # frame's capture time here is its stream time on the player's timeline (its media time
    # less the player's shift), which the callers check against the true capture times. The
    # error printed is the first frame showing the cue less the cue's start, so it includes the
    # frame interval and any frame the browser dropped there (a loaded machine drops some); what
    # is asserted is that no presented frame in the cue's interval went without it before that.
    cues = {c["id"]: c for c in result["cues"]}
    first_shown: dict[str, dict[str, Any]] = {}
    for f in frames:
        for cid in f["cues"]:
            first_shown.setdefault(cid, f)
    timing = []
    missed = []
    for cid, cue in cues.items():
        cue_s = (cue["start"] - epoch) / 1e9
        in_gap = before_s < cue_s <= after_s
        if cue_s <= frames[0]["frameS"] + FRAME_S or in_gap \
                or cue_s > frames[-1]["frameS"] - FRAME_S:
            continue
        assert cid in first_shown, f"{cid} at {cue_s:.3f} s never shown"
        shown_s = first_shown[cid]["frameS"]
        timing.append(shown_s - cue_s)
        missed.append(sum(1 for f in frames if cue_s + PTS_ROUNDING_S <= f["frameS"] < shown_s))
    assert len(timing) >= 4, timing
    worst = p95([abs(t) for t in timing])
    print(f"{codec}: caption error over {len(timing)} cues: p95 |error| {worst * 1e3:.1f} ms, "
          f"all {[round(t * 1e3, 1) for t in timing]} ms; presented frames in a cue's interval "
          f"before it showed: {missed}")
    assert all(t >= -(FRAME_S + PTS_ROUNDING_S) for t in timing), timing  # never early
    assert p95(missed) == 0, (missed, timing)

    # Away from cue boundaries every frame shows exactly the cues captured in its interval;
    # after the break that holds again within 200 ms of media time. Near a boundary the browser
    # may apply a cue's move a frame or two late: quiet runs showed 0 such frames outside one
    # frame interval, the full suite on this 2-core machine up to two frames.
    def wrong(f: dict[str, Any]) -> bool:
        t = f["frameS"]
        near = any(abs(t - (c[k] - epoch) / 1e9) < BOUNDARY_S for c in cues.values()
                   for k in ("start", "end"))
        want = {cid for cid, c in cues.items()
                if (c["start"] - epoch) / 1e9 <= t < (c["end"] - epoch) / 1e9}
        return not near and want != set(f["cues"])

    assert not [f for f in frames if f["frameS"] <= before_s and wrong(f)]
    late = [f for f in frames if f["frameS"] >= after_s + RESYNC_WINDOW_S and wrong(f)]
    assert not late, late[:5]
