"""Peers join the house clock over /api/clock/ws: the Python client and headless Chromium.

House time follows a real chronyd serving host time + 250 ms, so a peer on this host must find
an offset of ~+250 ms, the same offset /api/clock reports.
"""

from __future__ import annotations

from typing import Any

import pytest

from sfu_sidecar.client.clock import join_clock
from tests.interop.conftest import ThreadedApp, run_in_thread


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
def test_python_client_finds_the_house_offset(ntp_house: ThreadedApp, encoding: str) -> None:
    clock = run_in_thread(join_clock(ntp_house.base, samples=16, encoding=encoding))
    status = ntp_house.status()
    assert clock.samples == 16
    assert 0 <= clock.error_ns < 2_000_000
    # Same host clock on both ends: the join must land on the service's own offset.
    assert abs(clock.offset_ns - status["offset_ns"]) <= clock.error_ns + 200_000, (clock, status)
    assert abs(clock.now_ns() - ntp_house.status()["now_ns"]) < 50_000_000


@pytest.mark.browser
def test_chromium_joins_the_house_clock(ntp_house: ThreadedApp, browser: Any) -> None:
    page = browser.new_page()
    try:
        page.goto(ntp_house.base + "/healthz")
        result = page.evaluate(
            """async (url) => {
                const m = await import('/js/clocksync.js');
                const r = await m.joinClock(url, { samples: 16, intervalMs: 20 });
                return { offset: r.offsetNs.toString(), error: r.errorNs.toString(),
                         rtt: r.rttNs.toString(), samples: r.samples };
            }""",
            ntp_house.base.replace("http", "ws") + "/api/clock/ws",
        )
    finally:
        page.close()
    status = ntp_house.status()
    offset, error = int(result["offset"]), int(result["error"])
    assert result["samples"] == 16
    assert 0 <= error < 5_000_000
    # Chromium's clock (timeOrigin + now, coarsened to 100 us) is the host clock too.
    assert abs(offset - status["offset_ns"]) <= error + 1_000_000, (result, status)
