"""Timing truth with peers the project did not write: publisher timelines and clock failover.

    python bench/timing_truth.py [--seconds 60] [--kinds gstreamer,chromium,...] [--no-failover]
                                 [--max-slew-ppm 500]

Needs root (network namespaces) and the packages scripts/test installs. Takes the bench lock.

Publishers (each in a loopback-only namespace, ``tests/interop/publisher_probe.py``): the product
relays one publisher to an aiortc viewer reading the ``sync`` channel. Per kind and track: the
capture-time source, frames whose capture time went backwards, the rate of capture time against
the viewer's clock (ppm off 1 s/s), and where the true capture instant is known the p95 error to
it and the A/V skew. The baseline for each figure is its ideal: 0 backwards, 0 ppm, 0 ms.

Failover (a real ``ptp4l -S`` master at host + 3 ms and a chronyd at host + 45.317 ms,
``--max-slew-ppm`` the product's slew limit, default the product's default): seconds from
losing PTP until house time is locked on NTP, and from PTP's return until locked on PTP again,
against the ideal, ``distance / max slew``; the worst margin of the reported error over the
real distance to the tracked source (negative would be a lie); steps after the first lock.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BENCH_LOCK = Path("/tmp/sfu-sidecar-bench.lock")
KINDS = ("gstreamer", "chromium", "chromium-act", "chromium-canvas", "aiortc", "aiortc-join")
PTP_NS = 3_000_000
NTP_OFFSET_S = 0.045_317


@contextlib.contextmanager
def flocked(path: Path) -> Iterator[None]:
    path.touch(exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def run_probe(kind: str, seconds: float) -> dict[str, Any]:
    script = (f"ip link set lo up && exec {sys.executable} -m tests.interop.publisher_probe "
              f"{kind} {seconds} 3")
    proc = subprocess.run(["unshare", "-n", "sh", "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=seconds + 180)
    if proc.returncode != 0:
        return {"kind": kind, "error": (proc.stdout + proc.stderr)[-500:]}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def fmt(value: Any, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def publisher_table(results: list[dict[str, Any]]) -> None:
    """One row per track. ``slewed``: frames the product placed later than a better line put
    them, so that capture time never ran backwards (the whole run, start-up included).
    ``send lag p10``: where the publisher's sent packets are recorded, how late after capture
    it sends a frame (10th percentile); a sender that stamps reports at send time is that late,
    and no receiver maps its frames closer than that."""
    print("| publisher    | track | source (share)          | frames | backwards | slewed "
          "| rate ppm | p95 err ms | median err ms | send lag p10 ms | A/V skew ms |")
    print("|--------------|-------|-------------------------|-------:|----------:|-------:"
          "|---------:|-----------:|--------------:|----------------:|------------:|")
    for r in results:
        if "error" in r:
            print(f"| {r['kind']:<12} | failed: {r['error'][-200:]!r}")
            continue
        tracks = (r.get("publishers") or [{}])[0].get("tracks", {})
        for media in ("video", "audio"):
            f = r[media]
            total = max(1, f["frames"])
            src = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in f["sources"].items())
            skew = r.get("av_skew_ms") if media == "video" else None
            slewed = tracks.get(media, {}).get("frames_slewed")
            lag = r.get("send_lag_ms", {}).get(media, {}).get("p10")
            print(f"| {r['kind']:<12} | {media:<5} | {src:<23} | {f['frames']:>6} "
                  f"| {f['backwards']:>9} | {fmt(slewed, 'd'):>6} "
                  f"| {fmt(f['rate_ppm'], '+8.1f'):>8} "
                  f"| {fmt(f.get('abs_err_p95_ms'), '.2f'):>10} "
                  f"| {fmt(f.get('err_median_ms'), '+.2f'):>13} | {fmt(lag, '.2f'):>15} "
                  f"| {fmt(skew, '+.2f'):>11} |")


def run_failover(max_slew_ppm: float, work: Path) -> list[dict[str, Any]]:
    from tests.interop.conftest import ClockServer, free_udp_pair
    from tests.interop.ptpnet import Chrony, PtpNet

    net = PtpNet(work)
    chrony: Chrony | None = None
    server: ClockServer | None = None
    rows: list[dict[str, Any]] = []
    try:
        master = net.start_master(PTP_NS)
        chrony_dir = work / "chrony"
        chrony_dir.mkdir()
        chrony_dir.chmod(0o777)
        chrony = Chrony(chrony_dir, free_udp_pair(), NTP_OFFSET_S,
                        net.exec_prefix(net.ns_slave))
        server = ClockServer(net.exec_prefix(net.ns_slave), work,
                             ["--ptp-interface", net.if_slave, "--ntp-servers",
                              f"127.0.0.1:{chrony.port}",
                              "--clock-max-slew-ppm", str(max_slew_ppm)], 10.0, 16.0)
        wait(server, lambda s: s["source"] == "ptp" and s["state"] == "locked", 30)
        time.sleep(3)
        apart = round(NTP_OFFSET_S * 1e9) - PTP_NS
        ideal = apart / (max_slew_ppm * 1e3)
        steps0 = server.status().get("stepped")
        PtpNet.stop(master)
        rows.append(measure(server, "PTP lost -> NTP", "ntp", round(NTP_OFFSET_S * 1e9),
                            ideal, ideal + 120))
        net.start_master(PTP_NS)
        wait(server, lambda s: s["source"] == "ptp", 60)
        rows.append(measure(server, "PTP back -> PTP", "ptp", PTP_NS, ideal, ideal + 120))
        for row in rows:
            row["stepped_before"] = steps0
    finally:
        if server is not None:
            server.close()
        if chrony is not None:
            chrony.close()
        net.close()
    return rows


def wait(server: Any, pred: Any, limit_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        st: dict[str, Any] = server.status()
        if pred(st):
            return st
        time.sleep(0.1)
    raise SystemExit(f"timed out; last {server.status()}")


def measure(server: Any, what: str, source: str, source_offset_ns: int, ideal_s: float,
            limit_s: float) -> dict[str, Any]:
    start = time.monotonic()
    margin = None
    first_state = None
    locked_after = None
    while time.monotonic() - start < limit_s:
        st = server.status()
        if st["source"] == source and st["state"] in ("locked", "slewing"):
            first_state = first_state or st["state"]
            m = st["error_ns"] - abs(st["offset_ns"] - source_offset_ns)
            margin = m if margin is None else min(margin, m)
            if st["state"] == "locked" and locked_after is None:
                locked_after = time.monotonic() - start
        if locked_after is not None and time.monotonic() - start > locked_after + 3:
            break
        time.sleep(0.1)
    return {"what": what, "ideal_s": ideal_s, "locked_s": locked_after,
            "first_state": first_state, "min_error_margin_us": (margin or 0) / 1e3}


def failover_table(rows: list[dict[str, Any]], max_slew_ppm: float) -> None:
    print(f"\nclock failover, PTP and NTP {(NTP_OFFSET_S * 1e9 - PTP_NS) / 1e6:.3f} ms apart, "
          f"max slew {max_slew_ppm:g} ppm")
    print("| event            | first state | ideal s | locked after s | over ideal s "
          "| min(error - distance) µs |")
    print("|------------------|-------------|--------:|---------------:|-------------:"
          "|-------------------------:|")
    for r in rows:
        over = None if r["locked_s"] is None else r["locked_s"] - r["ideal_s"]
        print(f"| {r['what']:<16} | {r['first_state'] or 'n/a':<11} | {r['ideal_s']:7.1f} "
              f"| {fmt(r['locked_s'], '14.1f')} | {fmt(over, '+12.1f')} "
              f"| {r['min_error_margin_us']:24.1f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--no-failover", action="store_true")
    ap.add_argument("--max-slew-ppm", type=float, default=500.0)
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        ap.error(f"unknown kinds {sorted(unknown)}; choose from {', '.join(KINDS)}")
    with flocked(BENCH_LOCK):
        results = [run_probe(kind, args.seconds) for kind in kinds]
        print(f"publisher timelines over {args.seconds:g} s (first 3 s excluded)")
        publisher_table(results)
        if not args.no_failover:
            with tempfile.TemporaryDirectory(prefix="failover") as tmp:
                failover_table(run_failover(args.max_slew_ppm, Path(tmp)), args.max_slew_ppm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
