"""Glass-to-glass latency of the viewer page's paths, MSE (live segments over HTTP, in its two
latency modes) and WebRTC (WHEP), measured in the same Chromium run on the same publisher's
frames.

    flock /tmp/sfu-sidecar-bench.lock .venv/bin/python bench/mse_latency.py

Processes, all over loopback inside a network namespace that has only ``lo`` (the script
re-runs itself under ``unshare -n`` when it is not in one: Chromium's WebRTC picks a loopback
ICE pair reliably only there; root):

* the service, ``sfu-sidecar serve`` (defaults apart from the addresses and
  ``segment_duration_s``), its house clock freerunning on this host's system clock;
* an aiortc publisher over WHIP: the synthetic source's numbered 640x360 30 fps frames (VP8)
  and its beeps (Opus), every packet stamped with its capture time (abs-capture-time) on this
  host's clock, which is the house clock here (checked through ``/api/clock``);
* headless Chromium with two pages open at once on the stream: ``/?stream=S`` (WebRTC) and
  the product's MSE player, in turns ``/?stream=S&mode=mse`` (its default, low latency: the
  segment being made streamed part by part) and ``/?stream=S&mode=mse&latency=segments``
  (whole closed segments).

Latency of a frame = the house time at which it is displayed - its capture time. Display time:
``requestVideoFrameCallback``'s ``expectedDisplayTime`` (performance clock) plus
``performance.timeOrigin``, which puts it on the page's wall clock, this host's clock (checked
in each page against ``Date.now()``, the system clock, before and after each round). Capture
time: WebRTC, the page's own mapping of the frame's RTP timestamp through the relay's ``sync``
records (``record.captureNs``); MSE, the stream epoch from ``index.json`` plus the frame's
stream time as the player gives it (``frameS``: its media time minus the SourceBuffer offset,
which the service writes as capture time minus epoch, to the WebM millisecond).

Both pages run at once rather than one after the other: they present the same frames under the
same machine load, so the difference between them is the path's; measured in turns, a change in
the load of this shared 2-core machine between turns would land in the ratio. The price is two
decoders in one browser; the table gives each page's frame rate to show neither was starved.

A round opens both pages afresh; once both present frames and ``--settle`` seconds have passed
(the MSE player's start-up seeks), frames are recorded for ``--seconds``, with the MSE
player's buffer ahead of the playhead at each. Rounds alternate the MSE page's mode, low
latency first. In ``segments`` mode the latency is set by where in the segment cycle its page
joined and then holds steady (playback runs on the media clock), so one long recording would
show one join; ``--rounds`` (6: three per mode) rounds of 8 s show several. The first round is
a cold join: its page's first request starts the stream's segmenting; the later ones join a
segmenter already running (``segment_idle_s`` is 30 s). All rounds run on one service and
publisher per value of ``--segment-durations`` (default 1 s, the setting's default, then
0.5 s), in the same browser. Prints a markdown table: p50/p90/p99 per path over all recorded
frames, each round's p50, and the ratios MSE / WebRTC (against the WebRTC page of all rounds).
Display times fall on the headless compositor's 60 Hz frame ticks, so latencies come in steps
of about 16.7 ms.

Takes /tmp/sfu-sidecar-bench.lock (unless ``flock`` already holds it for this process, as in the
command above) and /tmp/sfu-sidecar-browser.lock for the whole run.

The ``publisher`` role (``mse_latency.py publisher URL CODEC CUES_PER_S``) is the publisher
process, also used by ``bench/mse_soak.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.pageprobes import MSE_JS, WEBRTC_JS, page_clock_offset_ms  # noqa: E402  (path)
from bench.processes import (  # noqa: E402
    free_port,
    in_loopback_namespace,
    locks,
    rerun_in_loopback_namespace,
)

BENCH_LOCK = Path("/tmp/sfu-sidecar-bench.lock")
BROWSER_LOCK = Path("/tmp/sfu-sidecar-browser.lock")  # the lock tests/support/chromium.py takes
LOOPBACK = ("127.0.0.1",)
STREAM = "latency"
FIRST_FRAME_TIMEOUT_MS = 40_000
# Set for the copy of this script run in a namespace, whose parent holds the locks.


# --- publisher process ------------------------------------------------------------------------


def run_publisher(endpoint: str, codec: str, cues_per_s: float) -> None:
    """Publishes the synthetic source with capture stamps until stdin closes; posts cues at
    ``cues_per_s`` (0: none) on the house clock. Prints "ready", then one JSON line of what it
    did: frames sent, how late frames were made against their capture stamps, cues posted."""
    import asyncio
    import fractions

    import aiohttp
    from av import VideoFrame

    from sfu_sidecar.client.whip import publish
    from sfu_sidecar.synthetic import BeepAudioTrack, FlashVideoTrack, Timeline

    lateness_ms: list[float] = []
    # Frames are asked for only once the connection is up, so the first second or so of them
    # are made late in a burst; lateness counts from this monotonic time on (set when ready).
    count_from = [math.inf]

    class TimedVideoTrack(FlashVideoTrack):
        """The synthetic frames, noting how long after its capture stamp each frame was made:
        a frame the encoder's backlog makes late shows that delay on both paths alike."""

        async def recv(self) -> VideoFrame:
            n = self.frame_index
            frame = await super().recv()
            due = self.timeline.start_monotonic + float(fractions.Fraction(n, self.fps))
            if due >= count_from[0]:
                lateness_ms.append((time.monotonic() - due) * 1000)
            return frame

    base = endpoint.split("/whip/", 1)[0]
    stream = endpoint.rsplit("/", 1)[1]

    async def post_cues(http: aiohttp.ClientSession, done: asyncio.Event) -> tuple[int, int]:
        posted = refused = 0
        while not done.is_set():
            # Starting 2 s from now, so every cue is stored before any frame of its interval
            # is shown; 0.8 s long.
            start = time.time_ns() + 2_000_000_000
            body = {"timebase": "house_ns", "lang": "en", "cues": [
                {"id": f"c{posted}", "start": start, "end": start + 800_000_000,
                 "text": f"cue {posted}"}]}
            try:
                async with http.post(f"{base}/api/streams/{stream}/captions", json=body) as r:
                    refused += r.status >= 300
            except aiohttp.ClientError:
                refused += 1
            posted += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 1.0 / cues_per_s)
        return posted, refused

    async def main() -> None:
        timeline = Timeline.starting_now(time.time_ns)
        video = TimedVideoTrack(timeline)
        session = await publish(
            endpoint, [BeepAudioTrack(timeline), video],
            capture_start_ns=timeline.start_house_ns, ice_addresses=LOOPBACK, video_codec=codec,
        )
        await session.joined()
        print("ready", flush=True)
        count_from[0] = time.monotonic() + 5.0
        done = asyncio.Event()
        async with aiohttp.ClientSession() as http:
            cues = asyncio.create_task(post_cues(http, done)) if cues_per_s > 0 else None
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
            done.set()
            posted, refused = await cues if cues is not None else (0, 0)
        await session.close()
        print(json.dumps({
            "frames": video.frame_index, "cues_posted": posted, "cues_refused": refused,
            "late_ms_p50": percentile(lateness_ms, 50), "late_ms_p99": percentile(lateness_ms, 99),
            "late_ms_max": max(lateness_ms, default=None),
        }), flush=True)

    asyncio.run(main())


# --- shared with bench/mse_soak.py -----------------------------------------------------------


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]



def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


@dataclass
class Server:
    """A running ``sfu-sidecar serve`` with its log in a file."""

    proc: subprocess.Popen[str]
    base: str
    log: Path
    tmp: tempfile.TemporaryDirectory[str]

    def log_errors(self) -> list[str]:
        return [line for line in self.log.read_text(errors="replace").splitlines()
                if " ERROR " in line or "CRITICAL" in line or "Traceback" in line]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_server(*flags: str) -> Server:
    port = free_port()
    tmp = tempfile.TemporaryDirectory(prefix="sfu-sidecar-mse-bench-")
    log = Path(tmp.name, "service.log")
    with log.open("w") as log_file:
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("sfu-sidecar")), "serve", "--host", "127.0.0.1",
             "--port", str(port), "--data-dir", str(Path(tmp.name, "data")),
             "--ice-addresses", "127.0.0.1", *flags],
            cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT, text=True)
    server = Server(proc, f"http://127.0.0.1:{port}", log, tmp)
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(server.base + "/healthz", timeout=2):
                return server
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                server.stop()
                raise RuntimeError(
                    f"the service did not start:\n{log.read_text()[-2000:]}") from None
            time.sleep(0.2)


def check_house_clock(base: str) -> float:
    """The house clock must be this host's system clock (freerun, no offset): the capture
    stamps and the display times are both read on it. Returns house - host in ms (bounded by
    the request's round trip)."""
    t0 = time.time_ns()
    status = get_json(base + "/api/clock")
    t1 = time.time_ns()
    if status["source"] != "system" or status["state"] != "freerun" or status["offset_ns"]:
        raise RuntimeError(f"the house clock is not this host's system clock: {status}")
    if not t0 <= status["now_ns"] <= t1:
        raise RuntimeError(f"house time {status['now_ns']} outside host time [{t0}, {t1}]")
    return float(status["now_ns"] - (t0 + t1) / 2) / 1e6


class Publisher:
    """The publisher process (see :func:`run_publisher`)."""

    def __init__(self, base: str, stream: str, codec: str = "vp8", cues_per_s: float = 0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "publisher",
             f"{base}/whip/{stream}", codec, str(cues_per_s)],
            cwd=ROOT, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.proc.kill()
            _, err = self.proc.communicate()
            raise RuntimeError(f"publisher did not start: {line}{err[-2000:]}")

    def stop(self) -> dict[str, Any]:
        """Ends the session; returns the publisher's report."""
        try:
            out, err = self.proc.communicate(input="", timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return {"error": "publisher did not stop"}
        lines = out.strip().splitlines()
        return json.loads(lines[-1]) if lines else {"error": err[-2000:]}


def chromium_args() -> list[str]:
    from tests.support.chromium import ARGS as CHROMIUM_ARGS

    return list(CHROMIUM_ARGS)


# --- the run ----------------------------------------------------------------------------------

@dataclass
class PathResult:
    latencies_ms: list[float]  # every recorded frame of every round
    round_p50s: list[float]
    frames: int = 0
    unmapped: int = 0
    seconds: float = 0.0


def latencies(frames: list[list[Any]], epoch_ns: int | None) -> list[float]:
    """[display ms, capture] pairs -> latency ms; capture is house ns (as a string: a BigInt in
    the page) or, with the stream epoch given, stream seconds."""
    out = []
    for display_ms, capture in frames:
        if epoch_ns is None:
            capture_ms = int(capture) / 1e6
        else:
            capture_ms = (epoch_ns + capture * 1e9) / 1e6
        out.append(display_ms - capture_ms)
    return out


MSE_MODES = {"low": "", "segments": "&latency=segments"}


def run_round(browser: Any, base: str, seconds: float, settle_s: float,
              phase: dict[str, Any], mode: str) -> None:
    """Both pages opened afresh (the MSE one in latency ``mode``), recorded for ``seconds``;
    adds to ``phase``."""
    pages: list[Any] = []
    try:
        webrtc = browser.new_page()
        mse = browser.new_page()
        pages = [webrtc, mse]
        for page in pages:
            page.on("pageerror", lambda e: print("page error:", e, file=sys.stderr))
        webrtc.goto(f"{base}/?stream={STREAM}")
        mse.goto(f"{base}/?stream={STREAM}&mode=mse{MSE_MODES[mode]}")
        webrtc.wait_for_function("() => window.sfuViewer !== undefined", timeout=10_000)
        mse.wait_for_function("() => window.sfuViewer?.player !== undefined", timeout=10_000)
        webrtc.evaluate(WEBRTC_JS)
        mse.evaluate(MSE_JS)
        for page in pages:
            page.wait_for_function("() => window.latFrames.length > 0",
                                   timeout=FIRST_FRAME_TIMEOUT_MS)
        time.sleep(settle_s)
        phase["page_clock"] += [page_clock_offset_ms(p) for p in pages]
        before = mse.evaluate("() => window.sidecarStats")
        for page in pages:
            page.evaluate("() => { window.latFrames = []; window.latUnmapped = 0; "
                          "window.latAhead = []; }")
        started = time.monotonic()
        time.sleep(seconds)
        grabbed = [p.evaluate("() => [window.latFrames, window.latUnmapped]") for p in pages]
        elapsed = time.monotonic() - started
        phase["ahead"][mode] += mse.evaluate("() => window.latAhead")
        phase["page_clock"] += [page_clock_offset_ms(p) for p in pages]
        after = mse.evaluate("() => window.sidecarStats")
        epoch_ns = get_json(f"{base}/streams/{STREAM}/media/index.json")["epoch_ns"]
        for (frames, unmapped), key, epoch in zip(grabbed, ("webrtc", f"mse_{mode}"),
                                                  (None, epoch_ns), strict=True):
            result: PathResult = phase["results"][key]
            values = latencies(frames, epoch)
            result.latencies_ms += values
            result.round_p50s.append(percentile(values, 50) or math.nan)
            result.frames += len(frames)
            result.unmapped += unmapped
            result.seconds += elapsed
        phase["resyncs"][mode] += after["resyncs"] - before["resyncs"]
        seeks = phase["seeks"][mode]
        for reason, count in after["seeks"].items():
            seeks[reason] = seeks.get(reason, 0) + count - before["seeks"][reason]
    finally:
        for page in pages:
            with contextlib.suppress(Exception):
                page.close()


def run_phase(browser: Any, segment_s: float, rounds: int, seconds: float, settle_s: float,
              codec: str) -> dict[str, Any]:
    """One service with ``segment_duration_s`` = ``segment_s`` and one publisher; ``rounds``
    rounds of both pages."""
    server = start_server("--segment-duration-s", f"{segment_s:g}")
    publisher: Publisher | None = None
    try:
        phase: dict[str, Any] = {
            "segment_s": segment_s, "page_clock": [],
            "ahead": {m: [] for m in MSE_MODES}, "resyncs": dict.fromkeys(MSE_MODES, 0),
            "seeks": {m: {} for m in MSE_MODES},
            "results": {"webrtc": PathResult([], []),
                        **{f"mse_{m}": PathResult([], []) for m in MSE_MODES}},
            "house_minus_host_ms": check_house_clock(server.base),
        }
        publisher = Publisher(server.base, STREAM, codec)
        modes = list(MSE_MODES)
        for i in range(rounds):
            run_round(browser, server.base, seconds, settle_s, phase, modes[i % len(modes)])
        phase["publisher"] = publisher.stop()
        phase["log_errors"] = server.log_errors()
        return phase
    finally:
        if publisher is not None and publisher.proc.poll() is None:
            publisher.stop()
        server.stop()


def fmt(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def print_report(phases: list[dict[str, Any]], rounds: int, seconds: float) -> None:
    print(f"mse_latency: {rounds} rounds of {seconds:g} s per segment duration, both pages at "
          f"once, {os.cpu_count()} CPUs")
    print()
    print("| segments | path | frames (fps) | latency p50 ms | p90 ms | p99 ms | p50 per round "
          "(cold join first), ms | MSE buffer ahead s, median (min to max) |")
    print("|---|---|---|---:|---:|---:|---|---|")
    for phase in phases:
        label = f"{phase['segment_s']:g} s"
        rows = {}
        for key, name in (("webrtc", "WebRTC (WHEP)"), ("mse_low", "MSE, low latency (default)"),
                          ("mse_segments", "MSE, whole segments")):
            r: PathResult = phase["results"][key]
            ps = [percentile(r.latencies_ms, p) for p in (50, 90, 99)]
            rows[key] = ps
            ahead = phase["ahead"].get(key.removeprefix("mse_"), [])
            ahead_text = (f"{statistics.median(ahead):.2f} ({min(ahead):.2f} to {max(ahead):.2f})"
                          if ahead else "")
            per_round = " / ".join(f"{v:.0f}" for v in r.round_p50s)
            print(f"| {label} | {name} | {r.frames} ({r.frames / max(r.seconds, 1e-9):.1f}) | "
                  f"{fmt(ps[0])} | {fmt(ps[1])} | {fmt(ps[2])} | {per_round} | {ahead_text} |")
        for key, name in (("mse_low", "low latency"), ("mse_segments", "whole segments")):
            ratios = [m / w if m is not None and w else None
                      for m, w in zip(rows[key], rows["webrtc"], strict=True)]
            print(f"| {label} | ratio MSE ({name}) / WebRTC | | {fmt(ratios[0], 1)}x | "
                  f"{fmt(ratios[1], 1)}x | {fmt(ratios[2], 1)}x | | |")
    print()
    for phase in phases:
        worst = max(abs(offset) for offset in phase["page_clock"])
        pub = phase["publisher"]
        unmapped = {k: r.unmapped for k, r in phase["results"].items()}
        print(f"{phase['segment_s']:g} s segments: house - host clock "
              f"{phase['house_minus_host_ms']:+.3f} ms; pages' timeOrigin + now() - Date.now() "
              f"within {worst:.2f} ms; frames without a capture time {unmapped}; MSE player while "
              f"recording: resyncs {phase['resyncs']}, seeks {phase['seeks']}; publisher frames "
              f"made late against their stamps p50/p99/max {fmt(pub.get('late_ms_p50'), 1)}/"
              f"{fmt(pub.get('late_ms_p99'), 1)}/{fmt(pub.get('late_ms_max'), 1)} ms; service "
              f"log ERROR lines {len(phase['log_errors'])}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("role", nargs="?", default="run")
    parser.add_argument("args", nargs="*")
    parser.add_argument("--rounds", type=int, default=6,
                        help="per segment duration, each with both pages opened afresh, the MSE "
                             "page's latency mode alternating")
    parser.add_argument("--seconds", type=float, default=8.0, help="recorded per round")
    parser.add_argument("--settle", type=float, default=8.0,
                        help="seconds between both pages presenting frames and recording")
    parser.add_argument("--segment-durations", default="1,0.5",
                        help="comma-separated segment_duration_s values, one run each")
    parser.add_argument("--codec", choices=("vp8", "h264"), default="vp8")
    parser.add_argument("--raw", type=Path, help="write every frame's latency (ms) here as JSON")
    ns = parser.parse_args()
    if ns.role == "publisher":
        run_publisher(ns.args[0], ns.args[1], float(ns.args[2]))
        return 0
    if not in_loopback_namespace():
        with locks(BENCH_LOCK, BROWSER_LOCK):
            return rerun_in_loopback_namespace()
    durations = [float(d) for d in ns.segment_durations.split(",")]
    from playwright.sync_api import sync_playwright

    from tests.support.chromium import CHROMIUM

    phases = []
    with locks(BENCH_LOCK, BROWSER_LOCK), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=chromium_args())
        try:
            for segment_s in durations:
                phases.append(run_phase(browser, segment_s, ns.rounds, ns.seconds, ns.settle,
                                     ns.codec))
        finally:
            browser.close()
    print_report(phases, ns.rounds, ns.seconds)
    if ns.raw is not None:
        ns.raw.write_text(json.dumps([
            {"segment_s": p["segment_s"], "ahead": p["ahead"],
             **{k: r.latencies_ms for k, r in p["results"].items()}} for p in phases]))
    for phase in phases:
        for line in phase["log_errors"][:5]:
            print("  service log: " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
