"""An RTP tap fed by a real SFU: Janus's VideoRoom ``rtp_forward`` of an aiortc publisher.

The whole exchange runs in ``tests.relay.janus_tap_probe``, in a network namespace of its own
(Janus, the service, the publisher and a WHEP viewer), and reports its figures as JSON.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.harness import in_stored_cue
from tests.support import probe as probes

SECONDS = 10
FRAME_NS = 33_333_333  # the publisher's 30 fps

pytestmark = [pytest.mark.netns, pytest.mark.needs("janus"), pytest.mark.timeout(240)]


def probe(viewer: str = "aiortc", seconds: int = SECONDS) -> dict[str, Any]:
    result = probes.run_probe("tests.relay.janus_tap_probe", seconds, viewer, timeout=200)
    probes.show(result, omit=("rtp_forward", "frames", "capture_log", "cues"))
    return result


def test_janus_videoroom_rtp_forward_feeds_a_tap_that_whep_viewers_watch() -> None:
    result = probe()
    assert result["janus_candidates"] == ["127.0.0.2"]  # nothing left the namespace's 127/8
    forwarders = result["rtp_forward"]["forwarders"]
    assert sorted(f["type"] for f in forwarders) == ["audio", "video"]
    # A viewer decodes the publisher's 30 fps video through Janus and the tap.
    assert result["frames_decoded"] >= SECONDS * 15, result["frames_decoded"]
    tap = result["tap"]
    video, audio = tap["tracks"]
    assert video["packets"] > 0 and audio["packets"] >= SECONDS * 30  # Opus: 50 packets/s
    # Janus names its feedback socket with a bare RTP header; the viewer's keyframe request
    # went there, and Janus asked its publisher for one.
    (video_forwarder,) = [f for f in forwarders if f["type"] == "video"]
    assert tap["feedback_to"][0] == f"127.0.0.1:{video_forwarder['local_rtcp_port']}"
    assert video["keyframe_requests_sent"] >= 1
    for counter in ("parse_errors", "rtcp_errors", "unknown_payload", "foreign_packets",
                    "oversize_packets"):
        assert tap[counter] == 0, (counter, tap)
    # Janus sends no sender reports on a forward: capture times come from arrival.
    assert {t["source"] for t in result["sync"]["tracks"].values()} == {"arrival"}
    assert result["delete_status"] == 200


@pytest.mark.browser
def test_janus_forward_watched_in_chromium_shows_captions_on_their_frames() -> None:
    """The product's viewer page on a tapped Janus stream for 30 s. Janus sends no sender
    reports, so capture times are estimated from arrival; the publisher draws each frame's
    number, whose true capture instant it logged. Every cue must show from the first presented
    frame captured in its interval, within one frame interval of its start, and media must
    arrive without loss."""
    seconds = 30
    result = probe("chromium", seconds)
    # A page that did not start on its first load is loaded once more; say so, and why.
    print(f"page loads: {result['page_loads']}", result.get("page_errors_first_load", ""))
    frames = result["frames"]
    truth = {int(n): ns for n, ns in result["capture_log"].items()}
    assert len(frames) >= 20 * seconds, result["page_stats"]  # 30 fps, most presented
    mapped = [f for f in frames if f["capture"] is not None and f["n"] in truth]
    assert len(mapped) >= 0.95 * len(frames)
    # Capture times come from arrival, and the status says they are estimates.
    tracks = result["sync"]["tracks"].values()
    assert {(t["source"], t["estimated"]) for t in tracks} == {("arrival", True)}
    # The estimate is late by Janus's and the tap's delay, far less than a frame.
    late = sorted(int(f["capture"]) - truth[f["n"]] for f in mapped)
    assert 0 <= late[len(late) // 2] <= FRAME_NS / 2, late[len(late) // 2]
    assert late[int(0.95 * (len(late) - 1))] <= FRAME_NS, late[-10:]
    # Each cue shows on the page's frames mapped into its interval and on no others, and its
    # first frame was truly captured within a frame interval of the cue's start.
    assert result["cue_status"] in (200, 201)
    errors = []
    for cue in result["cues"]:
        # Frames within the store's rounding of a boundary may go either way.
        clear = [f for f in mapped
                 if in_stored_cue(int(f["capture"]), cue["start"], cue["end"]) is not None]
        showing = [f for f in clear if f["caption"] == cue["text"]]
        inside = [f for f in clear if in_stored_cue(int(f["capture"]), cue["start"], cue["end"])]
        assert showing == inside and len(showing) >= 30, (cue, len(showing), len(inside))
        first = next(f for f in mapped if f["caption"] == cue["text"])
        errors.append(abs(truth[first["n"]] - cue["start"]))
    errors.sort()
    print(f"caption error to true capture: {len(errors)} cues, "
          f"max {errors[-1] / 1e6:.1f} ms; capture estimate late by "
          f"median {late[len(late) // 2] / 1e6:.2f} ms")
    assert len(errors) >= 8 and errors[int(0.95 * (len(errors) - 1))] <= FRAME_NS, errors
    # Loopback all the way: nothing lost between publisher, Janus, the tap and the page.
    rtp = result["rtp_stats"]
    assert rtp["video"]["received"] > 0 and rtp["audio"]["received"] >= 40 * seconds, rtp
    assert rtp["video"]["lost"] == 0 and rtp["audio"]["lost"] == 0, rtp
    assert result["delete_status"] == 200
