"""The house clock against a real ptp4l master and a real chronyd, in network namespaces.

The master runs ``ptp4l -S`` looking N ns ahead of the shared kernel clock; the product runs in
the other namespace on the veth peer. chronyd runs in the product's namespace on its loopback.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from aiortc import RTCPeerConnection

from tests.interop.ptpnet import PtpNet

pytestmark = pytest.mark.netns

N_NS = 3_000_000  # the master's time: host + 3 ms
# chronyd's time: host + 45.317 ms, 42.317 ms from the PTP master (a PTP domain and an NTP server
# never agree; a non-round number so no coincidence of constants can pass the test).
NTP_OFFSET_S = 0.045_317
NTP_OFFSET_NS = round(NTP_OFFSET_S * 1e9)
MAX_SLEW_PPM = 5_000.0  # 0.5 %: the 42 ms change is slewed in ~8.5 s, short enough for CI
# Real distance from a status line is read against chronyd's served time, itself within tens of
# microseconds of host + offset; this is the slack allowed for that reading.
READ_SLACK_NS = 100_000


def wait_for(server: Any, pred: Any, within_s: float, what: str,
             trail: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    deadline = time.monotonic() + within_s
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        last = server.status()
        if trail is not None:
            trail.append(last)
        if pred(last):
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last status {last}; "
                         f"log: {server.log.read_text()[-3000:]}")


def check_trail(trail: list[dict[str, Any]], max_slew_ppm: float) -> float:
    """House time never decreases; house - host changes no faster than the slew limit.
    Returns the steepest observed slew in ppm."""
    steepest = 0.0
    for a, b in itertools.pairwise(trail):
        assert b["now_ns"] >= a["now_ns"], (a, b)
        host_a, host_b = a["now_ns"] - a["offset_ns"], b["now_ns"] - b["offset_ns"]
        span = host_b - host_a
        if span <= 0:
            continue
        slew = abs(b["offset_ns"] - a["offset_ns"]) / span * 1e6
        steepest = max(steepest, slew)
        # 2 us slack: the status read takes the two clock readings a few hundred ns apart.
        assert abs(b["offset_ns"] - a["offset_ns"]) <= span * max_slew_ppm * 1e-6 + 2_000, (a, b)
    return steepest


def viewer_offer() -> str:
    """A WHEP viewer's SDP offer from aiortc, made on a worker thread (see ClockServer)."""

    async def make() -> str:
        pc = RTCPeerConnection()
        pc.addTransceiver("audio", direction="recvonly")
        pc.addTransceiver("video", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        sdp = str(pc.localDescription.sdp)
        await pc.close()
        return sdp

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, make()).result(timeout=30)


def test_ptp_lock_failover_to_disagreeing_ntp_and_back(ptpnet: PtpNet, chrony_factory: Any,
                                                        clock_server_factory: Any) -> None:
    """PTP and NTP 42.317 ms apart. PTP lost: house time is steered to NTP from its first
    sample, says it is slewing (remaining offset, time to converge) and reaches NTP within
    offset / max slew + 10 s, never stepping and never claiming an error below its real distance
    to the source. PTP back: the same the other way."""
    master = ptpnet.start_master(N_NS)
    chrony = chrony_factory(NTP_OFFSET_S, netns=ptpnet.exec_prefix(ptpnet.ns_slave))
    server = clock_server_factory(
        ptpnet.exec_prefix(ptpnet.ns_slave),
        ["--ptp-interface", ptpnet.if_slave, "--ntp-servers", f"127.0.0.1:{chrony.port}",
         "--clock-max-slew-ppm", str(MAX_SLEW_PPM)],
        holdover_s=2.0, ntp_poll_s=16.0,
    )
    locked = wait_for(
        server,
        lambda s: s["source"] == "ptp" and s["state"] == "locked"
        and abs(s["offset_ns"] - N_NS) < 20_000,
        20, "PTP lock",
    )
    ptp = locked["ptp"]
    assert ptp["timestamping"] == "kernel-software"
    assert ptp["grandmaster"] and ptp["domain"] == 0
    assert 0 < ptp["mean_path_delay_ns"] < 1_000_000
    assert ptp["samples"] > 0
    assert ptp["tx_timestamp_misses"] == 0
    assert locked["ntp"]["server"] == f"127.0.0.1:{chrony.port}"
    assert locked["sdp"] == [f"a=ts-refclk:ptp=IEEE1588-2008:{ptp['grandmaster']}:0",
                             "a=mediaclk:direct=0"]

    # While locked, WHEP answers carry the RFC 7273 lines in every media section.
    status, answer = server.post("/whep/refclk", viewer_offer(), "application/sdp")
    assert status == 201, answer
    for section in answer.split("\r\nm=")[1:]:
        if section.startswith(("audio", "video")):
            assert f"a=ts-refclk:ptp=IEEE1588-2008:{ptp['grandmaster']}:0" in section
            assert "a=mediaclk:direct=0" in section

    # Settled: two seconds of samples, the median within 10 us of N (typically ~1 us).
    settled = []
    for _ in range(20):
        time.sleep(0.1)
        settled.append(server.status())
    errors = sorted(abs(s["offset_ns"] - N_NS) for s in settled)
    assert errors[len(errors) // 2] < 10_000, errors
    assert all(s["source"] == "ptp" and s["state"] == "locked" for s in settled)
    # Delay_Req keeps going (~4/s at logMinDelayReqInterval -3 with randomised sends).
    assert settled[-1]["ptp"]["delay_samples"] - locked["ptp"]["delay_samples"] >= 3

    trail: list[dict[str, Any]] = [settled[-1]]
    apart_ns = NTP_OFFSET_NS - N_NS
    budget_s = apart_ns / (MAX_SLEW_PPM * 1e3) + 10

    PtpNet.stop(master)
    lost_at = time.monotonic()
    first = wait_for(server, lambda s: s["source"] == "ntp", 10, "switch to NTP", trail)
    assert first["state"] == "slewing", first
    assert first["sdp"] == []  # RFC 7273 lines only while locked to PTP
    assert first["remaining_ns"] == pytest.approx(-apart_ns, abs=2_000_000), first
    assert first["converge_s"] == pytest.approx(apart_ns / (MAX_SLEW_PPM * 1e3), rel=0.3), first
    final = wait_for(server, lambda s: s["source"] == "ntp" and s["state"] == "locked",
                     budget_s - (time.monotonic() - lost_at), "NTP reached", trail)
    assert abs(final["offset_ns"] - NTP_OFFSET_NS) < 200_000, final
    _honest(trail, "ntp", NTP_OFFSET_NS)
    steepest = check_trail(trail, MAX_SLEW_PPM)
    assert steepest > MAX_SLEW_PPM / 2  # it slewed, at the limit most of the way
    assert final["stepped"] and server.status()["state"] == "locked"

    trail = [server.status()]
    ptpnet.start_master(N_NS)
    back = wait_for(server, lambda s: s["source"] == "ptp", 40, "PTP back", trail)
    back_at = time.monotonic()
    assert back["state"] == "slewing", back
    final = wait_for(server, lambda s: s["source"] == "ptp" and s["state"] == "locked",
                     budget_s - (time.monotonic() - back_at), "PTP reached", trail)
    assert abs(final["offset_ns"] - N_NS) < 50_000, final
    _honest(trail, "ptp", N_NS)
    check_trail(trail, MAX_SLEW_PPM)


def _honest(trail: list[dict[str, Any]], source: str, source_offset_ns: int) -> None:
    """While tracking ``source``, the reported error covers the real distance to it."""
    for s in trail:
        if s["source"] == source and s["state"] in ("locked", "slewing"):
            distance = abs(s["offset_ns"] - source_offset_ns)
            assert s["error_ns"] + READ_SLACK_NS >= distance, s


def test_clock_command_prints_live_ptp_status(ptpnet: PtpNet, tmp_path: Path) -> None:
    ptpnet.start_master(N_NS)
    exe = Path(sys.executable).with_name("sfu-sidecar")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "sfu_sidecar"]
    out = subprocess.run(
        [*ptpnet.exec_prefix(ptpnet.ns_slave), *cmd, "clock", "--count", "6",
         "--ptp-interface", ptpnet.if_slave],
        capture_output=True, text=True, timeout=30, check=True,
    )
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 6, out
    last = lines[-1]
    assert " ptp/locked " in last, out
    offset = int(last.split("offset=")[1].split("ns")[0])
    assert abs(offset - N_NS) < 20_000, last
    assert "ts=kernel-software" in last


def test_best_master_wins_and_failover_slews(ptplan: Any, clock_server_factory: Any) -> None:
    """Two real grandmasters: priority1 100 at +3 ms and 200 at +4 ms. The product follows the
    better one; when it dies the other takes over (after the masters' own BMCA) and house time
    slews the 1 ms over to it instead of stepping."""
    n_best, n_other = 3_000_000, 4_000_000
    best = ptplan.start_master(0, n_best, priority1=100)
    ptplan.start_master(1, n_other, priority1=200)
    server = clock_server_factory(
        ptplan.exec_prefix(ptplan.ns_slave),
        ["--ptp-interface", ptplan.if_slave, "--clock-max-slew-ppm", str(MAX_SLEW_PPM)],
    )
    first = wait_for(server, lambda s: s["state"] == "locked"
                     and abs(s["offset_ns"] - n_best) < 20_000, 20, "lock on the best master")
    gm_best = first["ptp"]["grandmaster"]
    trail: list[dict[str, Any]] = [first]
    PtpNet.stop(best)
    second = wait_for(
        server, lambda s: s["ptp"]["grandmaster"] not in (None, gm_best)
        and s["state"] == "locked" and abs(s["offset_ns"] - n_other) < 20_000,
        # ~3 s on a quiet machine. Under load ptp4l itself can miss a transmit timestamp and
        # sit out its fault reset interval (16 s) before it masters; allow for that.
        45, "failover to the second master", trail)
    assert second["source"] == "ptp"
    assert second["sdp"][0].endswith(f"{second['ptp']['grandmaster']}:0")
    check_trail(trail, MAX_SLEW_PPM)
