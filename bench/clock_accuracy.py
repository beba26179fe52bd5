"""House clock accuracy against a real ptp4l master, beside ptp4l's own slave; browser join error.

    python bench/clock_accuracy.py [--seconds 60] [--offset-ns 5000000] [--joins 20]

Needs root (network namespaces), linuxptp, iproute2, chrony and chromium. Takes the machine's
bench lock (/tmp/sfu-sidecar-bench.lock) for the whole run and the browser lock for the browser
part. The master (``ptp4l -S``, Sync at 8 Hz) looks N ns ahead of the shared kernel clock
(``--egressLatency N --ingressLatency -N``), so every slave's true answer is exactly N:

- product, house clock: ``offset_ns`` of the fused clock (house - host) at each PTP sample;
- product, raw PTP: its per-Sync offsetFromMaster (before the servo);
- ptp4l ``--free_running 1`` slave on the same veth, same run: its per-Sync "master offset".

Then a chronyd serves host + 250 ms, the house clock follows it, and a headless Chromium joins
the clock ``--joins`` times; its error is |browser offset - /api/clock offset_ns| (both clocks
are this host's, so the true difference is zero).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BENCH_LOCK = Path("/tmp/sfu-sidecar-bench.lock")


@contextlib.contextmanager
def flocked(path: Path) -> Iterator[None]:
    path.touch(exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


# --- probe: runs inside the slave namespace ---------------------------------------------------


async def probe(interface: str, seconds: float, settle_s: float) -> None:
    """Run ClockService on ``interface``; print one JSON line per new PTP sample."""
    from sfu_sidecar.clock.service import ClockService
    from sfu_sidecar.config import load_settings
    from sfu_sidecar.metrics import Metrics

    service = ClockService(load_settings({"ptp_interface": interface}), Metrics())
    await service.start()
    try:
        deadline = time.monotonic() + 30
        while not (service.fused.state == "locked" and service.fused.source == "ptp"):
            if time.monotonic() > deadline:
                raise SystemExit("no PTP lock within 30 s")
            await asyncio.sleep(0.05)
        await asyncio.sleep(settle_s)
        start = time.monotonic()
        print(json.dumps({"start_mono": start}), flush=True)
        last = -1
        for _ in range(int(seconds * 200) + 1):  # polled at 200 Hz; Syncs come at 8 Hz
            if time.monotonic() - start >= seconds:
                break
            assert service.slave is not None
            if service.slave.samples != last:
                last = service.slave.samples
                st = service.status()
                print(json.dumps({"house": st["offset_ns"],
                                  "raw": -(service.slave.last_offset_ns or 0),
                                  "state": st["state"]}), flush=True)
            await asyncio.sleep(0.005)
        print(json.dumps({"end_mono": time.monotonic()}), flush=True)
    finally:
        await service.stop()


# --- driver --------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_ptp(seconds: float, offset_ns: int, work: Path) -> dict[str, list[float]]:
    from tests.interop.ptpnet import PtpNet

    net = PtpNet(work)
    try:
        net.start_master(offset_ns, log_sync_interval=-3)
        ref = net.start_free_running_slave()
        out = subprocess.run(
            [*net.exec_prefix(net.ns_slave), sys.executable, __file__, "--probe",
             net.if_slave, str(seconds)],
            capture_output=True, text=True, timeout=seconds + 90, check=False,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        )
        PtpNet.stop(ref)
        if out.returncode != 0:
            raise SystemExit(f"probe failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    finally:
        net.close()
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    start = next(r["start_mono"] for r in rows if "start_mono" in r)
    end = next(r["end_mono"] for r in rows if "end_mono" in r)
    house = [abs(r["house"] - offset_ns) for r in rows if "house" in r]
    raw = [abs(r["raw"] - offset_ns) for r in rows if "raw" in r]
    unlocked = sum(1 for r in rows if "state" in r and r["state"] != "locked")
    # ptp4l[1234.567]: master offset   -5000123 s2 freq ... ; offset = slave - master = -N.
    ptp4l = []
    line_re = re.compile(r"ptp4l\[(\d+\.\d+)\]: master offset\s+(-?\d+)")
    for line in (work / "refslave.log").read_text().splitlines():
        m = line_re.search(line)
        if m and start <= float(m.group(1)) <= end:
            ptp4l.append(abs(-int(m.group(2)) - offset_ns))
    if unlocked:
        print(f"warning: {unlocked} product samples taken while not locked", file=sys.stderr)
    return {"house": house, "raw": raw, "ptp4l": ptp4l}


def run_browser(joins: int, work: Path) -> list[float]:
    from playwright.sync_api import sync_playwright

    from tests.conftest import BROWSER_LOCK, CHROMIUM, CHROMIUM_ARGS
    from tests.interop.conftest import ThreadedApp, free_udp_pair
    from tests.interop.ptpnet import Chrony

    chrony = Chrony(work, free_udp_pair(), 0.25)
    app = None
    errors: list[float] = []
    try:
        app = ThreadedApp(["--ntp-servers", f"127.0.0.1:{chrony.port}"])
        app.wait(lambda s: s["source"] == "ntp" and s["state"] == "locked"
                 and abs(s["offset_ns"] - 250_000_000) < 2_000_000, 30, "NTP lock")
        time.sleep(3)  # let the servo settle on the NTP line
        with flocked(BROWSER_LOCK), sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                         headless=True)
            try:
                page = browser.new_page()
                page.goto(app.base + "/healthz")
                for _ in range(joins):
                    r = page.evaluate(
                        """async (url) => {
                            const m = await import('/js/clocksync.js');
                            const r = await m.joinClock(url, { samples: 16, intervalMs: 20 });
                            return r.offsetNs.toString();
                        }""",
                        app.base.replace("http", "ws") + "/api/clock/ws",
                    )
                    errors.append(abs(int(r) - app.status()["offset_ns"]))
            finally:
                browser.close()
    finally:
        if app is not None:
            app.close()
        chrony.close()
    return errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--offset-ns", type=int, default=5_000_000)
    parser.add_argument("--joins", type=int, default=20)
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after lock")
    parser.add_argument("--probe", nargs=2, metavar=("IFACE", "SECONDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        asyncio.run(probe(args.probe[0], float(args.probe[1]), args.settle))
        return 0
    if args.seconds < 60:
        print("note: the issue asks for >= 60 s", file=sys.stderr)
    with flocked(BENCH_LOCK), tempfile.TemporaryDirectory(prefix="clockbench") as tmp:
        work = Path(tmp)
        (work / "browser").mkdir()
        (work / "browser").chmod(0o777)
        ptp = run_ptp(args.seconds, args.offset_ns, work)
        browser = run_browser(args.joins, work / "browser")
    rows: list[tuple[str, list[float], float]] = [
        ("product house clock |offset_ns - N|", ptp["house"], 1e3),
        ("product raw PTP measurement", ptp["raw"], 1e3),
        ("ptp4l -S --free_running 1 (same run)", ptp["ptp4l"], 1e3),
        (f"browser clock join ({args.joins} joins)", browser, 1e3),
    ]
    print(f"\nclock accuracy: {args.seconds:.0f} s at 8 Hz Sync, N = {args.offset_ns} ns, "
          f"master ptp4l -S on veth in namespaces")
    print(f"| {'measure':<40} | {'n':>5} | {'median µs':>10} | {'p99 µs':>10} |")
    print(f"|{'-' * 42}|{'-' * 7}|{'-' * 12}|{'-' * 12}|")
    for name, values, unit in rows:
        if not values:
            print(f"| {name:<40} | {0:>5} | {'-':>10} | {'-':>10} |")
            continue
        print(f"| {name:<40} | {len(values):>5} | {statistics.median(values) / unit:>10.2f} | "
              f"{percentile(values, 0.99) / unit:>10.2f} |")
    ratio = (statistics.median(ptp["house"]) / statistics.median(ptp["ptp4l"])
             if ptp["house"] and ptp["ptp4l"] and statistics.median(ptp["ptp4l"]) else float("nan"))
    print(f"\nproduct house clock / ptp4l median ratio: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
