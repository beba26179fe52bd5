"""HTTPS built in: Chromium on another address publishes from ``/publish`` and views, trusting
only a CA the test made, and the certificate is rotated under them with nothing dropped."""

from __future__ import annotations

import pytest

from tests.support import probe as probes

pytestmark = [pytest.mark.browser, pytest.mark.netns, pytest.mark.needs("certutil"),
              pytest.mark.timeout(200)]


def test_publisher_page_over_https_from_another_address_survives_a_certificate_rotation(
) -> None:
    result = probes.run_probe("tests.e2e.https_probe", timeout=180)
    probes.show(result)
    assert result["served_first"]
    before = result["publisher_before"]
    # Camera and microphone are given to a secure context only: https on a non-loopback
    # address, with a certificate Chromium trusts.
    assert before == {"state": "publishing", "error": None, "clock": "joined", "secure": True,
                      "protocol": "https:"}, before
    assert result["viewer_before"]["secure"] and result["viewer_before"]["frames"] > 10

    # New connections get the new certificate within the watch's period (2 s) and the write.
    assert result["rotated_after_s"] <= 5
    # Nothing dropped: the same publisher session, still publishing, the viewer still playing.
    assert result["publisher_after"]["state"] == "publishing", result["publisher_after"]
    assert result["stream_after"] is not None
    assert result["stream_after"]["id"] == result["stream_before"]["id"]
    assert result["viewer_frames_3s_after_rotation"] >= 30, result
    assert result["late_viewer"]["secure"] and result["late_viewer"]["frames"] > 10
    assert any(line.startswith("sfu_sidecar_tls_certificate_reloads_total 1.0")
               for line in result["metrics"]), result["metrics"]
    assert not [line for line in result["service_log"] if "Traceback" in line or "ERROR" in line]
    assert result["service_exit"] == 0
