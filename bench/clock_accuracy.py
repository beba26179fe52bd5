"""House clock accuracy against a real ptp4l master, beside ptp4l's own slave; browser join error.

    python bench/clock_accuracy.py [--seconds 60] [--offset-ns 5000000] [--joins 20]

Needs root (network namespaces), linuxptp, iproute2, chrony and chromium. Takes the machine's
bench lock (/tmp/sfu-sidecar-bench.lock) for the whole run and the browser lock for the browser
part. The master (``ptp4l -S``, Sync at 8 Hz) looks N ns ahead of the shared kernel clock
(``--egressLatency N --ingressLatency -N``), so every slave's true answer is exactly N:

- product, house clock: ``offset_ns`` of the fused clock (house - host) at each PTP sample;
- product, raw PTP: its per-Sync offsetFromMaster (before the servo);
- ptp4l ``--free_running 1`` slave on the same veth, same run: its per-Sync master_offset,
  read through ``pmc`` (TIME_STATUS_NP) at 20 Hz.

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


class PmcPoller:
    """Reads ptp4l's per-Sync offset through its management socket: one interactive ``pmc``
    asked for TIME_STATUS_NP at 20 Hz, deduplicated by ingress time (8 Hz Sync), so ptp4l gets
    as many samples as the product rather than its once-a-second log line."""

    def __init__(self, uds: Path) -> None:
        import threading

        self.samples: list[tuple[float, int]] = []  # (monotonic s, master_offset ns)
        self.proc = subprocess.Popen(
            ["pmc", "-u", "-b", "0", "-s", str(uds)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._writer = threading.Thread(target=self._write, daemon=True)
        self._reader.start()
        self._writer.start()

    def _write(self) -> None:
        assert self.proc.stdin is not None
        while not self._stop.wait(0.05):
            try:
                self.proc.stdin.write("GET TIME_STATUS_NP\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                return

    def _read(self) -> None:
        assert self.proc.stdout is not None
        offset = None
        last_ingress = None
        for line in self.proc.stdout:
            parts = line.split()
            if len(parts) == 2 and parts[0] == "master_offset":
                offset = int(parts[1])
            elif len(parts) == 2 and parts[0] == "ingress_time" and offset is not None:
                ingress = int(parts[1])
                if ingress != last_ingress and ingress != 0:
                    last_ingress = ingress
                    self.samples.append((time.monotonic(), offset))
                offset = None

    def close(self) -> None:
        self._stop.set()
        self._writer.join(2)
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        PtpNetStop(self.proc)
        self._reader.join(2)


def PtpNetStop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def run_ptp(seconds: float, offset_ns: int, work: Path) -> dict[str, list[float]]:
    from tests.interop.ptpnet import PtpNet

    net = PtpNet(work)
    pmc = None
    try:
        net.start_master(offset_ns, log_sync_interval=-3)
        ref = net.start_free_running_slave()
        time.sleep(0.5)
        pmc = PmcPoller(work / f"refslave.{net.tag}.sock")
        out = subprocess.run(
            [*net.exec_prefix(net.ns_slave), sys.executable, __file__, "--probe",
             net.if_slave, str(seconds)],
            capture_output=True, text=True, timeout=seconds + 90, check=False,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        )
        pmc.close()
        PtpNet.stop(ref)
        if out.returncode != 0:
            raise SystemExit(f"probe failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    finally:
        if pmc is not None:
            pmc.close()
        net.close()
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    start = next(r["start_mono"] for r in rows if "start_mono" in r)
    end = next(r["end_mono"] for r in rows if "end_mono" in r)
    house = [r["house"] - offset_ns for r in rows if "house" in r]
    raw = [r["raw"] - offset_ns for r in rows if "raw" in r]
    unlocked = sum(1 for r in rows if "state" in r and r["state"] != "locked")
    # ptp4l's master_offset = slave - master = -N when exact.
    ptp4l = [-off - offset_ns for t, off in pmc.samples if start <= t <= end]
    if unlocked:
        print(f"warning: {unlocked} product samples taken while not locked", file=sys.stderr)
    return {"house": house, "raw": raw, "ptp4l": ptp4l}


def run_browser(joins: int, work: Path) -> list[float]:
    from playwright.sync_api import sync_playwright

    from tests.interop.conftest import ThreadedApp, free_udp_pair
    from tests.interop.ptpnet import Chrony
    from tests.support.chromium import ARGS as CHROMIUM_ARGS
    from tests.support.chromium import BROWSER_LOCK, CHROMIUM

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
                    errors.append(int(r) - app.status()["offset_ns"])
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
    parser.add_argument("--no-browser", action="store_true", help="PTP part only")
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
        browser = [] if args.no_browser else run_browser(args.joins, work / "browser")
    rows: list[tuple[str, list[float], float]] = [
        ("product house clock |offset_ns - N|", ptp["house"], 1e3),
        ("product raw PTP measurement", ptp["raw"], 1e3),
        ("ptp4l -S --free_running 1 (same run)", ptp["ptp4l"], 1e3),
        (f"browser clock join ({args.joins} joins)", browser, 1e3),
    ]
    print(f"\nclock accuracy: {args.seconds:.0f} s at 8 Hz Sync, N = {args.offset_ns} ns, "
          f"master ptp4l -S on veth in namespaces")
    print(f"| {'measure':<40} | {'n':>5} | {'median |err| µs':>15} | {'p99 |err| µs':>12} "
          f"| {'median err µs':>13} |")
    print(f"|{'-' * 42}|{'-' * 7}|{'-' * 17}|{'-' * 14}|{'-' * 15}|")
    for name, values, unit in rows:
        if not values:
            print(f"| {name:<40} | {0:>5} | {'-':>15} | {'-':>12} | {'-':>13} |")
            continue
        mags = [abs(v) for v in values]
        print(f"| {name:<40} | {len(values):>5} | {statistics.median(mags) / unit:>15.2f} | "
              f"{percentile(mags, 0.99) / unit:>12.2f} | "
              f"{statistics.median(values) / unit:>+13.2f} |")
    house_med = statistics.median([abs(v) for v in ptp["house"]]) if ptp["house"] else 0.0
    ptp4l_med = statistics.median([abs(v) for v in ptp["ptp4l"]]) if ptp["ptp4l"] else 0.0
    ratio = house_med / ptp4l_med if ptp4l_med else float("nan")
    print(f"\nproduct house clock / ptp4l median ratio: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
