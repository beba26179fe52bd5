"""An RTP tap fed by a real SFU: Janus's VideoRoom ``rtp_forward`` of an aiortc publisher.

The whole exchange runs in ``tests.relay.janus_tap_probe``, in a network namespace of its own
(Janus, the service, the publisher and a WHEP viewer), and reports its figures as JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import ROOT

SECONDS = 10

pytestmark = [pytest.mark.netns, pytest.mark.needs("janus"), pytest.mark.timeout(240)]


def probe() -> dict[str, Any]:
    proc = subprocess.run(
        ["unshare", "-n", sys.executable, "-m", "tests.relay.janus_tap_probe", str(SECONDS)],
        cwd=ROOT, capture_output=True, text=True, timeout=200,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(json.dumps({k: v for k, v in result.items() if k != "rtp_forward"}))
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
