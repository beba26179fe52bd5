"""MSE soak: one browser watching a live stream through the MSE player for ten minutes, the
server's and the page's memory watched for leaks.

    flock /tmp/sfu-sidecar-bench.lock .venv/bin/python bench/mse_soak.py [--minutes 10]

Processes, all over loopback:

* the service, ``sfu-sidecar serve`` as ``bench/soak.py`` starts it (defaults apart from the
  addresses; ``segment_window`` passed explicitly as its default, so the bound below is the one
  the service runs with), its log in a file;
* the publisher of ``bench/mse_latency.py``: aiortc over WHIP, the synthetic source's 640x360
  30 fps frames in VP8 and its beeps in Opus, capture-stamped, plus one caption cue a second
  (0.8 s long, posted 2 s ahead of its start, on the house clock);
* headless Chromium on ``/?stream=S&mode=mse`` (``--enable-precise-memory-info``, so
  ``performance.memory`` is not rounded to coarse buckets).

From the page's first presented frame the run lasts ``--minutes``. Every second: the segment
count of ``index.json`` and the SourceBuffer's buffered ranges (total length and how far the
oldest reaches behind the playhead). Every 10 s: the server's RSS, the page's
``usedJSHeapSize``, ``sidecarStats`` (``bufferAheadS``, resyncs, seeks) and the frames presented
(a ``frameListeners`` counter), and the Chromium processes' summed RSS. One table row per minute.

PASS when, after a warm-up of ``--warmup-s`` (60):

* the server's RSS grows by at most ``--rss-mib`` (20) MiB, at the end and at its peak;
* ``index.json`` never lists more segments than ``segment_window``;
* the browser's buffered media stays bounded: at most 31 s behind the playhead (the player
  trims back to 20 s once the oldest media is 30 s behind, at its next 250 ms index poll) and
  at most 36 s in all (that plus the live-edge rule's 4 s lag and one segment being appended);
* frames are still presented in the last 10 s;
* the player resynced 0 times (one publisher, no discontinuity: a resync would be a fault), and
  never started over on a new MediaSource (``restarts``, where the player counts them);
* the service's log holds no ERROR line or traceback, and every cue was accepted.

Takes /tmp/sfu-sidecar-bench.lock (unless ``flock`` already holds it for this process) and
/tmp/sfu-sidecar-browser.lock for the whole run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from mse_latency import (
    BENCH_LOCK,
    BROWSER_LOCK,
    ROOT,
    Publisher,
    chromium_args,
    get_json,
    locks,
    start_server,
)

sys.path.insert(0, str(ROOT))

STREAM = "msesoak"
SAMPLE_S = 10.0
FAST_S = 1.0
CUES_PER_S = 1.0
BEHIND_BOUND_S = 31.0
TOTAL_BOUND_S = 36.0

COUNT_FRAMES_JS = """
() => {
  window.soakFrames = 0;
  window.sfuViewer.player.frameListeners.push(() => { window.soakFrames++; });
}
"""

# The SourceBuffer's buffered ranges: their total length and how far the oldest reaches behind
# the playhead.
BUFFERED_JS = """
() => {
  const b = window.sfuViewer.player.buffer;
  const t = document.getElementById('video').currentTime;
  if (!b) return {total: 0, behind: 0, ranges: 0};
  let total = 0;
  for (let i = 0; i < b.buffered.length; i++) total += b.buffered.end(i) - b.buffered.start(i);
  return {total, behind: b.buffered.length ? t - b.buffered.start(0) : 0,
          ranges: b.buffered.length};
}
"""

PAGE_JS = """
() => {
  const s = window.sidecarStats;
  const video = document.getElementById('video');
  let textCues = 0;
  for (const track of video.textTracks) textCues += track.cues ? track.cues.length : 0;
  return {frames: window.soakFrames, heap: performance.memory.usedJSHeapSize,
          ahead: s.bufferAheadS, resyncs: s.resyncs, restarts: s.restarts ?? null,
          lastError: s.lastError ?? null, seeks: s.seeks, segments: s.segments,
          cuesShown: s.cuesShown, captionP95Ms: s.captionErrorP95Ms, textCues,
          paused: video.paused, error: video.error && video.error.message};
}
"""


def rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"VmRSS:\s+(\d+)", status)
    return int(found.group(1)) * 1024 if found else 0


def chromium_rss_bytes() -> int:
    """Summed RSS of the Chromium processes under this one (shared pages count once per
    process, so this overstates the browser's footprint; its growth is what matters)."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        parents[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
        names[int(entry)] = name
    ours = {os.getpid()}
    grew = True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in ours} - ours
        ours |= more
        grew = bool(more)
    total = 0
    for pid in ours:
        if names.get(pid, "").startswith("chrom"):
            try:
                total += rss_bytes(pid)
            except OSError:
                continue
    return total


def mib(value: float) -> float:
    return value / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--warmup-s", type=float, default=60.0)
    parser.add_argument("--rss-mib", type=float, default=20.0)
    ns = parser.parse_args()
    run_s = ns.minutes * 60
    if run_s < ns.warmup_s + 3 * SAMPLE_S:
        parser.error(f"the run must last the warm-up plus {3 * SAMPLE_S:g} s at least")

    from playwright.sync_api import sync_playwright

    from sfu_sidecar.config import load_settings
    from tests.support.chromium import CHROMIUM

    window = load_settings({}).segment_window
    with locks(BENCH_LOCK, BROWSER_LOCK):
        server = start_server("--segment-window", str(window))
        publisher: Publisher | None = None
        samples: list[dict[str, Any]] = []
        fast: list[dict[str, Any]] = []  # (t, segments listed, buffered) every second
        try:
            publisher = Publisher(server.base, STREAM, "vp8", CUES_PER_S)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(
                    executable_path=CHROMIUM,
                    args=[*chromium_args(), "--enable-precise-memory-info"])
                page = browser.new_page()
                page.on("pageerror", lambda e: print("page error:", e, file=sys.stderr))
                page.goto(f"{server.base}/?stream={STREAM}&mode=mse")
                page.wait_for_function("() => window.sfuViewer?.player !== undefined",
                                       timeout=10_000)
                page.evaluate(COUNT_FRAMES_JS)
                page.wait_for_function("() => window.soakFrames > 0", timeout=40_000)
                t0 = time.monotonic()
                next_sample = t0 + SAMPLE_S
                while (now := time.monotonic()) - t0 < run_s:
                    time.sleep(max(0.0, min(FAST_S - (now - t0) % FAST_S, t0 + run_s - now)))
                    t = time.monotonic() - t0
                    listed = len(get_json(
                        f"{server.base}/streams/{STREAM}/media/index.json")["segments"])
                    fast.append({"t": t, "listed": listed, **page.evaluate(BUFFERED_JS)})
                    if time.monotonic() >= next_sample or t >= run_s:
                        next_sample += SAMPLE_S
                        sample = {"t": round(t), "rss_mib": mib(rss_bytes(server.proc.pid)),
                                  "browser_rss_mib": mib(chromium_rss_bytes()),
                                  "listed": listed, **page.evaluate(PAGE_JS)}
                        sample["heap_mib"] = mib(sample.pop("heap"))
                        samples.append(sample)
                        print(json.dumps(sample), file=sys.stderr, flush=True)
                browser.close()
        finally:
            report = publisher.stop() if publisher is not None else {}
            server.stop()
        errors = server.log_errors()
    return verdict(ns, window, samples, fast, report, errors)


def verdict(ns: argparse.Namespace, window: int, samples: list[dict[str, Any]],
            fast: list[dict[str, Any]], publisher: dict[str, Any], errors: list[str]) -> int:
    warm = [s for s in samples if s["t"] >= ns.warmup_s]
    first, last = warm[0], warm[-1]
    print(f"mse_soak: {ns.minutes:g} min from the first presented frame, one MSE viewer, "
          f"warm-up {ns.warmup_s:g} s, {os.cpu_count()} CPUs")
    print()
    print("| t s | server RSS MiB | segments listed (max) | page JS heap MiB | buffered s, total "
          "(max) | behind playhead s (max) | ahead s | fps | resyncs | cues shown | "
          "Chromium RSS MiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    shown = [s for s in samples if s["t"] % 60 == 0 or s is samples[-1]]
    previous: dict[str, Any] | None = None
    for s in shown:
        since = previous["t"] if previous else 0
        span = [f for f in fast if since < f["t"] <= s["t"] + 0.5]
        frames_before = previous["frames"] if previous else 0
        fps = (s["frames"] - frames_before) / max(1, s["t"] - since)
        ahead = "n/a" if s["ahead"] is None else f"{s['ahead']:.2f}"
        print(f"| {s['t']} | {s['rss_mib']:.1f} | {max(f['listed'] for f in span)} | "
              f"{s['heap_mib']:.1f} | {max(f['total'] for f in span):.1f} | "
              f"{max(f['behind'] for f in span):.1f} | {ahead} | {fps:.1f} | {s['resyncs']} | "
              f"{s['cuesShown']} | {s['browser_rss_mib']:.0f} |")
        previous = s
    rss_growth = last["rss_mib"] - first["rss_mib"]
    rss_peak = max(s["rss_mib"] for s in warm) - first["rss_mib"]
    listed_max = max(f["listed"] for f in fast)
    behind_max = max(f["behind"] for f in fast)
    total_max = max(f["total"] for f in fast)
    last_frames = samples[-1]["frames"] - samples[-2]["frames"]
    resyncs = samples[-1]["resyncs"]
    restarts = samples[-1]["restarts"]
    checks = [
        (f"server RSS growth after warm-up: {rss_growth:+.1f} MiB at the end, {rss_peak:+.1f} "
         f"MiB at its peak (bound {ns.rss_mib:g})",
         rss_growth <= ns.rss_mib and rss_peak <= ns.rss_mib),
        (f"segments listed in index.json: at most {listed_max} (segment_window {window})",
         listed_max <= window),
        (f"browser buffered media: at most {behind_max:.1f} s behind the playhead (bound "
         f"{BEHIND_BOUND_S:g}), {total_max:.1f} s in all (bound {TOTAL_BOUND_S:g})",
         behind_max <= BEHIND_BOUND_S and total_max <= TOTAL_BOUND_S),
        (f"frames presented in the last {samples[-1]['t'] - samples[-2]['t']} s: {last_frames}",
         last_frames > 0),
        (f"player resyncs: {resyncs}; restarts on a new MediaSource: "
         f"{'n/a' if restarts is None else restarts}"
         f"{'' if not restarts else ' (last error: ' + str(samples[-1]['lastError']) + ')'}",
         resyncs == 0 and not restarts),
        (f"service log ERROR/traceback lines: {len(errors)}; cues posted/refused: "
         f"{publisher.get('cues_posted')}/{publisher.get('cues_refused')}",
         not errors and publisher.get("cues_refused") == 0),
    ]
    print()
    heap_growth = last["heap_mib"] - first["heap_mib"]
    browser_growth = last["browser_rss_mib"] - first["browser_rss_mib"]
    caption_p95 = last["captionP95Ms"]
    late_p99 = publisher.get("late_ms_p99")
    print(f"page JS heap after warm-up {first['heap_mib']:.1f} MiB, at end {last['heap_mib']:.1f} "
          f"MiB ({heap_growth:+.1f}); Chromium processes' summed RSS {browser_growth:+.0f} MiB; "
          f"VTTCues held at end {last['textCues']}; caption error p95 "
          f"{'n/a' if caption_p95 is None else f'{caption_p95:.1f}'} ms; player seeks "
          f"{last['seeks']}; publisher frames {publisher.get('frames')}, made late against "
          f"their stamps p99 {'n/a' if late_p99 is None else f'{late_p99:.1f}'} ms")
    for text, ok in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {text}")
    for line in errors[:10]:
        print("  service log: " + line)
    passed = all(ok for _, ok in checks)
    print("PASS" if passed else "FAIL")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
