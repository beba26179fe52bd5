"""The house clock on NTP alone, against a real chronyd on loopback."""

from __future__ import annotations

from typing import Any

from tests.interop.conftest import ThreadedApp, free_udp_pair


def test_ntp_lock_skips_a_silent_server(chrony_factory: Any) -> None:
    chrony = chrony_factory(0.25)
    silent = free_udp_pair()  # nothing listens there
    app = ThreadedApp(["--ntp-servers", f"127.0.0.1:{silent},127.0.0.1:{chrony.port}"])
    try:
        st = app.wait(lambda s: s["source"] == "ntp" and s["state"] == "locked"
                      and abs(s["offset_ns"] - 250_000_000) < 2_000_000, 20,
                      "NTP lock at +250 ms")
        assert st["ntp"]["server"] == f"127.0.0.1:{chrony.port}"
        assert st["ntp"]["stratum"] == 9  # chronyd following a `local stratum 8` server
        assert 0 < st["ntp"]["delay_ns"] < 20_000_000
        assert st["stepped"] is True  # the one step allowed after start
        assert st["ptp"] is None and st["sdp"] == []
        assert st["error_ns"] is not None and st["error_ns"] < 10_000_000
    finally:
        app.close()
