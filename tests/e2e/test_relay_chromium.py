"""Chromium (fake camera) -> WHIP -> relay -> WHEP -> Chromium: frames render in the viewer."""

from __future__ import annotations

import pytest

from tests.support import probe as probes

pytestmark = [pytest.mark.browser, pytest.mark.netns]


def test_chromium_publisher_to_chromium_viewer_through_the_relay() -> None:
    # Only ``lo`` inside: Chromium can pair nothing but loopback candidates with the relay.
    result = probes.run_probe("tests.e2e.relay_chromium_probe", timeout=100)
    assert result["publish"]["status"] == 201, result
    seen = result["view"]
    assert seen["status"] == 201, result
    assert seen["frames"] >= 30, result
    assert (seen["width"], seen["height"]) == (320, 240), result
    assert seen["framesDecoded"] >= 30
    assert seen.get("audioPackets", 0) > 0
    # Forwarded, not re-encoded: the relay saw the publisher's packets and its keyframes.
    relay = result["relay"]
    assert relay["tracks"]["video"]["codec"] in ("vp8", "h264")
    assert relay["tracks"]["video"]["packets"] > 0
    viewer = relay["viewers"][0]
    assert all(t["packets_sent"] > 0 for t in viewer["tracks"])
