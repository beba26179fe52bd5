"""The PTP grandmaster vanishes and comes back, with no NTP server to fall back on.

While it is gone the house clock must not claim to be locked: it holds over on the servo's
last frequency, says so, drops the RFC 7273 lines from SDP answers, and its error bound grows
with the time since the last sample. When the master returns, house time converges back onto it
and locks again. (Falling back to NTP while PTP is gone is covered by
tests/interop/test_clock_ptp.py; this is the case where nothing is left to follow.)
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

# The real-network fixtures and the status poller of the interop tests, reused as they are.
from tests.interop.conftest import clock_server_factory, ptpnet  # noqa: F401
from tests.interop.ptpnet import PtpNet
from tests.interop.test_clock_ptp import wait_for

pytestmark = [pytest.mark.netns, pytest.mark.needs("ptp4l"), pytest.mark.timeout(180)]

N_NS = 2_500_000  # the master's time: host + 2.5 ms
HOLDOVER_S = 120.0  # longer than the master stays away: holdover must not expire to freerun


def test_master_gone_holds_over_with_growing_error_and_relocks_when_back(
    ptpnet: PtpNet, clock_server_factory: Any  # noqa: F811
) -> None:
    master = ptpnet.start_master(N_NS)
    server = clock_server_factory(ptpnet.exec_prefix(ptpnet.ns_slave),
                                  ["--ptp-interface", ptpnet.if_slave], holdover_s=HOLDOVER_S)
    locked = wait_for(server, lambda s: s["source"] == "ptp" and s["state"] == "locked"
                      and abs(s["offset_ns"] - N_NS) < 20_000, 30, "PTP lock")
    assert locked["sdp"], locked  # RFC 7273 lines while locked to PTP

    PtpNet.stop(master)
    gone_at = time.monotonic()
    held = wait_for(server, lambda s: s["state"] != "locked", 15, "leaving locked")
    left_s = time.monotonic() - gone_at
    assert held["state"] == "holdover", held
    assert held["sdp"] == [], held  # no reference clock to announce
    # The error bound grows while nothing disciplines the clock.
    errors = []
    for _ in range(4):
        time.sleep(1.0)
        status = server.status()
        assert status["state"] == "holdover", status
        errors.append(status["error_ns"])
    assert all(b > a for a, b in itertools.pairwise(errors)), errors
    assert errors[0] >= held["error_ns"], (held, errors)

    back_master = ptpnet.start_master(N_NS)
    back_at = time.monotonic()
    relocked = wait_for(server, lambda s: s["source"] == "ptp" and s["state"] == "locked"
                        and abs(s["offset_ns"] - N_NS) < 50_000, 60, "PTP lock again")
    back_s = time.monotonic() - back_at
    assert relocked["sdp"], relocked
    assert relocked["error_ns"] < errors[-1], (relocked, errors)
    print(f"left locked {left_s:.1f} s after the master stopped; holdover error "
          f"{held['error_ns']} -> {errors[-1]} ns over 4 s; locked again {back_s:.1f} s after "
          f"it returned (offset {relocked['offset_ns'] - N_NS} ns from the master)")
    PtpNet.stop(back_master)
