"""An RTP feed to a real SFU: a sidecar stream sent to a Janus Streaming RTP mountpoint and
watched through Janus by an aiortc viewer.

The whole exchange runs in ``tests.relay.janus_feed_probe``, in a network namespace of its own
(Janus, the service, the publisher, a WHEP viewer for the sidecar's capture times and the
viewer watching through Janus), and reports its figures as JSON. The hop from the sidecar to
Janus is delayed 150 ms for video and 50 ms for audio, so that what Janus's sender reports
say can be told apart from the capture times they would carry if Janus passed them on.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import probe as probes

SECONDS = 10

pytestmark = [pytest.mark.netns, pytest.mark.needs("janus"), pytest.mark.timeout(240)]


def probe() -> dict[str, Any]:
    result = probes.run_probe("tests.relay.janus_feed_probe", SECONDS, timeout=200)
    probes.show(result, omit=("mountpoint", "feed_answer"))
    return result


def test_a_feed_to_a_janus_streaming_mountpoint_reaches_viewers_of_janus() -> None:
    result = probe()
    assert result["janus_candidates"] == ["127.0.0.2"]  # nothing left the namespace's 127/8
    assert result["mountpoint"]["streaming"] == "created"
    # The viewer of the mountpoint decodes the publisher's 30 fps video and its audio.
    assert result["frames_decoded"] >= SECONDS * 15, result["frames_decoded"]
    assert result["audio_frames_decoded"] >= SECONDS * 25, result["audio_frames_decoded"]
    feed = result["feed"]
    assert all(t["packets_sent"] > 0 for t in feed["tracks"])
    for counter in ("rtcp_errors", "not_rtcp", "foreign_packets", "send_errors"):
        assert feed[counter] == 0, (counter, feed)
    # The copies through Janus are the copies the sidecar sent (same payloads).
    assert result["payload_matches"]["video"] >= SECONDS * 15
    assert result["payload_matches"]["audio"] >= SECONDS * 25

    # Janus sends its viewer sender reports of its own: their NTP time is Janus's clock when
    # it forwarded the packet, so it runs late of the capture time by the hop's delay, and
    # the two media's reports are out of step by the difference of their delays.
    delays = result["hop_delay_ms"]
    assert min(result["janus_sender_reports"].values()) >= 3
    for kind in ("video", "audio"):
        offset = result["sr_ntp_minus_capture_ms"][kind]
        assert abs(offset["median"] - delays[kind]) < 20, (kind, offset, delays)
    assert abs(result["sr_av_skew_ms"] - (delays["video"] - delays["audio"])) < 20

    # abs-capture-time does not survive: Janus's offer has no extmap for it, and no packet
    # the viewer receives carries a value that reads as one.
    assert result["abs_capture_time_in_janus_offer"] is False
    assert result["abs_capture_time_seen"] is False
    assert result["delete_status"] == 200
