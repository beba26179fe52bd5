"""Run chosen tests N times while K other processes keep cores busy, and count each test's
outcomes: a timing assertion must hold on a loaded machine, not only on an idle one.

    scripts/flake-check -n 10 --hogs 1 tests/e2e/test_viewer_page_chromium.py [pytest args]

Every run is a fresh pytest process (its own browser, servers and event loop); each hog is a
busy loop in its own process, ended when the runs are over and in any case after ``--hog-limit``
seconds. Prints a table (test, passed, failed, skipped, slowest run) and exits 1 if any test
failed in any run, 0 otherwise.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def _hog(limit_s: float, parent: int) -> None:
    """Busy until ``limit_s`` has passed or the flake-check that started it is gone."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        for _ in range(100_000):
            pass
        if os.getppid() != parent:
            return


def _outcomes(report: Path) -> dict[str, tuple[str, float]]:
    """test id -> (outcome, seconds) from a JUnit XML report."""
    out: dict[str, tuple[str, float]] = {}
    if not report.exists():
        return out
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped" and outcome == "passed":
                outcome = "skipped"
        out[name] = (outcome, float(case.get("time", "0")))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flake-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--runs", type=int, default=10, help="runs of the tests (10)")
    parser.add_argument("--hogs", type=int, default=1, help="busy processes beside them (1)")
    parser.add_argument("--hog-limit", type=float, default=4 * 3600,
                        help="seconds after which a hog stops by itself (14400)")
    args, pytest_args = parser.parse_known_args(argv)
    if args.runs < 1 or args.hogs < 0:
        parser.error("--runs must be at least 1 and --hogs at least 0")
    if not pytest_args:
        parser.error("name the tests to run (paths or pytest arguments)")
    hogs = [multiprocessing.Process(target=_hog, args=(args.hog_limit, os.getpid()), daemon=True)
            for _ in range(args.hogs)]
    for hog in hogs:
        hog.start()
    # Stopped with SIGTERM, end the hogs too (the finally below runs).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results: dict[str, list[tuple[str, float]]] = defaultdict(list)
    try:
        with tempfile.TemporaryDirectory(prefix="flake-check-") as tmp:
            for run in range(1, args.runs + 1):
                report = Path(tmp) / f"run-{run}.xml"
                started = time.monotonic()
                proc = subprocess.run(
                    [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                     f"--junitxml={report}", *pytest_args], cwd=ROOT)
                found = _outcomes(report)
                if not found:
                    print(f"run {run}: pytest exited {proc.returncode} and reported no test",
                          file=sys.stderr)
                    return 2
                for name, outcome in found.items():
                    results[name].append(outcome)
                failed = sum(o == "failed" for o, _ in found.values())
                print(f"run {run}/{args.runs}: {len(found)} tests, {failed} failed, "
                      f"{time.monotonic() - started:.0f} s, {args.hogs} busy core(s)", flush=True)
    finally:
        for hog in hogs:
            hog.terminate()
    width = max(len(name) for name in results)
    print(f"\n{'test':<{width}}  passed  failed  skipped  slowest s")
    any_failed = False
    for name, runs in sorted(results.items()):
        counts = {k: sum(o == k for o, _ in runs) for k in ("passed", "failed", "skipped")}
        any_failed |= counts["failed"] > 0
        print(f"{name:<{width}}  {counts['passed']:>6}  {counts['failed']:>6}  "
              f"{counts['skipped']:>7}  {max(t for _, t in runs):>9.1f}")
    return 1 if any_failed else 0


if __name__ == "__main__":
    sys.exit(main())
