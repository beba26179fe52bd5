"""Viewers of one stream at full rate on one machine: ``serve --workers 1`` beside ``--workers 2``.

    flock /tmp/sfu-sidecar-bench.lock .venv/bin/python bench/workers.py

For N in ``--counts`` (8, 16, 32, 48, 64, 96, 128), each configuration in ``--workers`` (1 and
2) is measured in turn at the same N (1 worker at N, 2 workers at N, then the next N), each
point with a fresh real ``sfu-sidecar serve`` process, a fresh publisher and fresh viewers. The
publisher and the viewer processes are those of ``bench/relay_fanout.py`` (synthetic 640x360
30 fps VP8 pinned at 1.5 Mbit/s + Opus over WHIP; WHEP viewers that decrypt SRTP and count
RTP from the fixed header, never decoding), all posting to the one
``--host/--port``; with ``--workers 2`` the supervisor sends the publisher to one worker and
spreads viewers over both, the other pulling the stream from the first over loopback.

A point is at **full rate** when every viewer got >= 29.5 video frames/s and >= 49 audio
packets/s and no packet was lost over the window (``--seconds``, after ``--warmup``). A
configuration stops after its first point below full rate; its **knee** is the largest N at
full rate. CPU is read from /proc/PID/stat (utime + stime) at the window's start and end for
every process of the server (the supervisor and its workers: the tree under the process
started, cross-checked with ``GET /api/workers`` where the server has it), for the viewer
processes and for the publisher, and /proc/stat gives the whole machine's busy time. With no
``--workers`` flag in this checkout, "1 worker" is a plain ``serve`` (its own pid) and the
2-worker configuration is skipped.

Everything shares this machine's cores, unpinned: pinning the 2-worker server to one core
would defeat the comparison, and on 2 cores nothing is left to pin the load generators to. The
viewers decrypt every packet in Python, so they may run the machine out of CPU before the
server does; each row says which resource was nearest its limit.

Takes /tmp/sfu-sidecar-bench.lock (unless ``flock`` already holds it for this process).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.processes import BENCH_LOCK, free_port, holds_bench_lock  # noqa: E402  (path)
from bench.relay_fanout import BITRATE, _sub  # noqa: E402

STREAM = "bench"
FULL_FPS = 29.5
FULL_AUDIO_PPS = 49.0
TICK = os.sysconf("SC_CLK_TCK")
FOREIGN = 25.0  # % of one core busy outside the benchmark that makes a point measured again
NEAR = 90.0  # % of one core (a process) or of all cores (the machine): "ran out"


# --- /proc ------------------------------------------------------------------------------------


def proc_cpu(pid: int) -> float:
    """utime + stime of a process (all its threads, those ended included), in seconds; 0 for
    a process that is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def machine_busy() -> tuple[float, float, float]:
    """(busy, total, irq + softirq) jiffies of all CPUs since boot, from /proc/stat. Interrupt
    time (loopback packets are mostly received in softirq) is in no process's utime/stime."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])  # guest time is already inside user
    return total - idle, total, values[5] + values[6]


def wait_quiet(limit_s: float, below: float = 15.0) -> float:
    """Wait (up to ``limit_s``) for 2 s in which the machine is under ``below`` % busy, so a
    point does not start while something outside the benchmark (a test run) holds a core;
    returns the last 2 s busy %."""
    deadline = time.monotonic() + limit_s
    while True:
        b0 = machine_busy()
        time.sleep(2.0)
        b1 = machine_busy()
        busy = 100 * (b1[0] - b0[0]) / max(b1[1] - b0[1], 1)
        if busy < below or time.monotonic() > deadline:
            return busy


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [pid], [pid]
    while frontier:
        frontier = [p for p, pp in parent.items() if pp in frontier]
        found += frontier
    return found


# --- the server under test --------------------------------------------------------------------


def supports_workers() -> bool:
    out = subprocess.run([sys.executable, "-m", "sfu_sidecar", "serve", "--help"], cwd=ROOT,
                         capture_output=True, text=True, check=False).stdout
    # The option itself (usage line "[--workers N]"), not the word in other options' help.
    return re.search(r"^\s*--workers[ ,=]", out, re.M) is not None


def _get_json(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = resp.read()
            return resp.status, json.loads(body) if body[:1] in (b"{", b"[") else None
    except urllib.error.HTTPError as exc:
        return exc.code, None


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    base: str
    log: Path
    workers_api: bool = False
    pids: dict[int, str] = field(default_factory=dict)  # pid -> role ("serve", "sup", "w0")

    @classmethod
    def start(cls, workers: int | None, workdir: Path) -> Server:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SFU_SIDECAR_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        command = [
            sys.executable, "-m", "sfu_sidecar", "serve", "--host", "127.0.0.1",
            "--port", str(port), "--data-dir", str(workdir / "data"),
            "--ice-addresses", "127.0.0.1", "--publisher-timeout-s", "600",
            # Admission limits off: the benchmark looks for where delivery breaks, not where
            # the server would have refused the next viewer.
            "--max-cpu-percent", "1000", "--max-viewers", "100000",
            "--max-viewers-per-stream", "100000", "--max-sessions-per-client", "100000",
        ]
        if workers is not None:
            command += ["--workers", str(workers)]
        log = workdir / "serve.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out,
                                    stderr=subprocess.STDOUT)
        server = cls(proc, f"http://127.0.0.1:{port}", log)
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"serve exited with {proc.returncode}\n"
                                   f"{log.read_text(errors='replace')[-2000:]}")
            with contextlib.suppress(OSError):
                if _get_json(server.base + "/healthz")[0] == 200:
                    break
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError("serve did not become healthy in 60 s")
            time.sleep(0.2)
        server.find_pids(workers)
        return server

    def workers(self) -> list[dict[str, Any]] | None:
        with contextlib.suppress(OSError, ValueError):
            status, body = _get_json(self.base + "/api/workers")
            if status == 200 and isinstance(body, dict) and "workers" in body:
                return list(body["workers"])
        return None

    def find_pids(self, workers: int | None) -> None:
        listed = self.workers()
        tree = descendants(self.proc.pid)
        if listed is None:
            if workers not in (None, 1):
                raise RuntimeError("--workers given but GET /api/workers is not there")
            self.pids = {pid: "serve" if pid == self.proc.pid else "child" for pid in tree}
            return
        self.workers_api = True
        self.pids = {pid: "sup" if pid == self.proc.pid else "child" for pid in tree}
        for w in listed:
            if int(w["pid"]) not in self.pids:
                raise RuntimeError(f"worker {w} is not below the supervisor {self.proc.pid}")
            self.pids[int(w["pid"])] = f"w{w['index']}"
        if workers is not None and len(listed) != workers:
            raise RuntimeError(f"asked for {workers} workers, /api/workers lists {len(listed)}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# --- one point --------------------------------------------------------------------------------


@dataclass
class Point:
    config: str
    n: int
    server_cpu: float  # % of one core, all the server's processes summed
    server_parts: dict[str, float]  # role -> % of one core
    viewers_cpu: float  # % of one core, all viewer processes summed
    viewer_proc_max: float  # the busiest viewer process, % of one core
    publisher_cpu: float
    machine: float  # % of all cores busy
    irq_cpu: float  # % of one core in interrupts and softirqs (the loopback network's receive)
    other_cpu: float  # % of one core: the machine's busy time no process above accounts for
    fps_min: float
    fps_mean: float
    audio_min: float
    lost: int
    expected: int
    per_worker: str  # viewers per worker at the window's start, from /api/workers
    restarts: int

    @property
    def loss_pct(self) -> float:
        return 100 * self.lost / self.expected if self.expected else 100.0

    @property
    def full(self) -> bool:
        return (self.fps_min >= FULL_FPS and self.audio_min >= FULL_AUDIO_PPS
                and self.lost == 0 and self.expected > 0)

    def limit(self) -> str:
        """What was at (or near) its limit during the window."""
        out = []
        if self.machine >= NEAR:
            out.append(f"machine {self.machine:.0f} % busy")
            if self.other_cpu >= FOREIGN:
                out.append(f"{self.other_cpu:.0f} % of a core outside this benchmark")
        hot = [role for role, pct in self.server_parts.items() if pct >= NEAR]
        if hot:
            out.append("server core (" + ", ".join(hot) + ")")
        if self.viewer_proc_max >= NEAR:
            out.append("a viewer process")
        if self.restarts:
            out.append(f"{self.restarts} worker restart(s) in the window")
        if not out:  # nothing at its limit: name the nearest
            server = max(self.server_parts.values(), default=0.0)
            out.append(f"none at 90 % (machine {self.machine:.0f} %, busiest server process "
                       f"{server:.0f} %, busiest viewer process {self.viewer_proc_max:.0f} %)")
        return "; ".join(out)


def _cpu_snapshot(pids: list[int]) -> dict[int, float]:
    return {pid: proc_cpu(pid) for pid in pids}


def measure(config: str, workers: int | None, n: int, args: argparse.Namespace) -> Point:
    busy = wait_quiet(args.quiet_wait)
    if busy >= 15.0:
        print(f"machine still {busy:.0f} % busy before {config} worker(s) at N={n} after "
              f"{args.quiet_wait:.0f} s; measuring anyway (see the other % column)",
              file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        server = Server.start(workers, Path(tmp))
        publisher = None
        viewers: list[subprocess.Popen[str]] = []
        try:
            publisher = _sub("publisher", f"{server.base}/whip/{STREAM}", stdin=subprocess.PIPE)
            assert publisher.stdout is not None
            if publisher.stdout.readline().strip() != "ready":
                raise RuntimeError("publisher did not connect\n"
                                   + server.log.read_text(errors="replace")[-2000:])
            time.sleep(2.0)  # first keyframe, bitrate settled
            procs = min(n, max(4, math.ceil(n / args.per_process)))
            share = [n // procs + (i < n % procs) for i in range(procs)]
            start_at = time.time() + args.warmup + args.connect_s * max(share)
            viewers = [
                _sub("viewers", f"{server.base}/whep/{STREAM}", str(k), str(start_at),
                     str(args.seconds))
                for k in share
            ]
            time.sleep(max(0.0, start_at - time.time()))
            server.find_pids(workers)  # a worker restarted since start-up has a new pid
            listed = server.workers() or []
            restarts0 = sum(int(w.get("restarts", 0)) for w in listed)
            per_worker = "/".join(str(w.get("viewers", "?")) for w in listed) or "-"
            load = [publisher.pid, *(v.pid for v in viewers)]
            cpu0, load0, busy0 = _cpu_snapshot(list(server.pids)), _cpu_snapshot(load), \
                machine_busy()
            wall0 = time.monotonic()
            time.sleep(args.seconds)
            cpu1, load1, busy1 = _cpu_snapshot(list(server.pids)), _cpu_snapshot(load), \
                machine_busy()
            wall = time.monotonic() - wall0
            restarts = sum(int(w.get("restarts", 0)) for w in server.workers() or []) \
                - restarts0
            per_viewer: list[dict[str, Any]] = []
            for v in viewers:
                out, _ = v.communicate(timeout=120 + n)
                lines = out.strip().splitlines()
                if v.returncode != 0 or not lines:
                    raise RuntimeError(f"a viewer process failed (rc {v.returncode}); is the "
                                       "server refusing viewers? see " + str(server.log))
                per_viewer.extend(json.loads(lines[-1]))
        finally:
            for v in viewers:
                if v.poll() is None:
                    v.kill()
                    v.wait()
            if publisher is not None and publisher.stdin is not None:
                publisher.stdin.close()
                try:
                    publisher.wait(5)
                except subprocess.TimeoutExpired:
                    publisher.kill()
                    publisher.wait()
            server.stop()
    parts: dict[str, float] = {}
    for pid, role in server.pids.items():
        parts[role] = parts.get(role, 0.0) + 100 * (cpu1[pid] - cpu0[pid]) / wall
    viewer_pcts = [100 * (load1[v.pid] - load0[v.pid]) / wall for v in viewers]
    publisher_pct = 100 * (load1[publisher.pid] - load0[publisher.pid]) / wall
    cores = os.cpu_count() or 1
    machine = 100 * (busy1[0] - busy0[0]) / max(busy1[1] - busy0[1], 1)
    irq = cores * 100 * (busy1[2] - busy0[2]) / max(busy1[1] - busy0[1], 1)
    ours = sum(parts.values()) + sum(viewer_pcts) + publisher_pct + irq
    return Point(
        config=config, n=n,
        server_cpu=sum(parts.values()), server_parts=parts,
        viewers_cpu=sum(viewer_pcts), viewer_proc_max=max(viewer_pcts),
        publisher_cpu=publisher_pct, machine=machine,
        irq_cpu=irq, other_cpu=max(0.0, machine * cores - ours),
        fps_min=min(v["fps"] for v in per_viewer),
        fps_mean=statistics.mean(v["fps"] for v in per_viewer),
        audio_min=min(v["audio_pps"] for v in per_viewer),
        lost=sum(v["lost"] for v in per_viewer),
        expected=sum(v["expected"] for v in per_viewer),
        per_worker=per_worker, restarts=restarts,
    )


# --- report -----------------------------------------------------------------------------------


HEADER = (
    "| workers |   N | server CPU % (per process) | viewers CPU % (busiest proc) "
    "| publisher % | irq % | other % | machine busy % | fps min (mean) | audio/s min | loss % "
    "| full rate | viewers per worker | nearest limit |\n"
    "|---|---:|---|---|---:|---:|---:|---:|---|---:|---:|---|---|---|"
)


def row(p: Point) -> str:
    order = {"serve": 0, "sup": 1, "child": 99}
    parts = " + ".join(
        f"{role} {pct:.0f}"
        for role, pct in sorted(p.server_parts.items(), key=lambda kv: (order.get(kv[0], 2), kv))
        if role != "child" or pct >= 0.5
    )
    return (
        f"| {p.config} | {p.n} | {p.server_cpu:.1f} ({parts}) | "
        f"{p.viewers_cpu:.0f} ({p.viewer_proc_max:.0f}) | {p.publisher_cpu:.0f} | "
        f"{p.irq_cpu:.0f} | {p.other_cpu:.0f} | {p.machine:.0f} | "
        f"{p.fps_min:.1f} ({p.fps_mean:.1f}) | {p.audio_min:.1f} | "
        f"{p.loss_pct:.2f} | {'yes' if p.full else 'no'} | {p.per_worker} | {p.limit()} |"
    )


def slope(points: list[Point]) -> float:
    xs = [p.n for p in points]
    ys = [p.server_cpu for p in points]
    if len(xs) < 2:
        return float("nan")
    mx, my = statistics.mean(xs), statistics.mean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


def summary(config: str, points: list[Point], counts: list[int]) -> str:
    full = [p for p in points if p.full]
    knee = max((p.n for p in full), default=0)
    broke = next((p for p in points if not p.full), None)
    s = slope(full)
    text = f"{config} worker(s): knee {knee} viewers"
    if broke is None:
        text += f" (full rate at every N up to {counts[-1]}: the knee was not reached)"
    else:
        text += (f" (below full rate at {broke.n}: fps min {broke.fps_min:.1f}, audio/s min "
                 f"{broke.audio_min:.1f}, loss {broke.loss_pct:.2f} %; nearest limit: "
                 f"{broke.limit()})")
        if not any(pct >= NEAR for pct in broke.server_parts.values()):
            text += ("; no server process was at a full core there, so this knee is the "
                     "machine's (server + load generators), a lower bound for the server")
    text += (f"; server CPU per viewer {s:.2f} % of a core (slope over the full-rate points)"
             if not math.isnan(s) else "; too few full-rate points for a slope")
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--counts", default="8,16,32,48,64,96,128")
    parser.add_argument("--workers", default="1,2", help="configurations, comma-separated")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured window per point")
    parser.add_argument("--warmup", type=float, default=3.0,
                        help="seconds between the last viewer's expected connection and the "
                             "window")
    parser.add_argument("--connect-s", type=float, default=0.6,
                        help="seconds allowed per viewer connection (each viewer process "
                             "connects its viewers one after another)")
    parser.add_argument("--quiet-wait", type=float, default=180.0,
                        help="before each point, wait up to this many seconds for the machine "
                             "to be under 15 %% busy")
    parser.add_argument("--retries", type=int, default=2,
                        help="measure a point again (up to this many times) when more than "
                             f"{FOREIGN:.0f} %% of a core was busy outside the benchmark")
    parser.add_argument("--per-process", type=int, default=16,
                        help="viewers per viewer process (at least 4 processes)")
    args = parser.parse_args()
    counts = sorted(int(c) for c in args.counts.split(","))
    configs = [int(w) for w in args.workers.split(",")]
    has_flag = supports_workers()
    runnable: dict[str, int | None] = {}
    for w in configs:
        if has_flag:
            runnable[str(w)] = w
        elif w == 1:
            runnable["1"] = None  # a plain serve is one worker
        else:
            print(f"skipping --workers {w}: this checkout's serve has no --workers flag",
                  file=sys.stderr)
    with contextlib.ExitStack() as stack:
        if not holds_bench_lock():
            BENCH_LOCK.touch(exist_ok=True)
            lock = stack.enter_context(BENCH_LOCK.open("w"))
            fcntl.flock(lock, fcntl.LOCK_EX)
        started = time.monotonic()
        results: dict[str, list[Point]] = {c: [] for c in runnable}
        retried: list[str] = []
        print(HEADER, file=sys.stderr, flush=True)
        for n in counts:
            for config, workers in runnable.items():
                done = results[config]
                if done and not done[-1].full:
                    continue  # stopped after its first point below full rate
                for attempt in range(args.retries + 1):
                    point = measure(config, workers, n, args)
                    print(row(point), file=sys.stderr, flush=True)
                    if point.other_cpu < FOREIGN or attempt == args.retries:
                        break
                    retried.append(f"{config} worker(s) at N={n}: {point.other_cpu:.0f} % of a "
                                   "core busy outside the benchmark, measured again")
                    print(retried[-1], file=sys.stderr, flush=True)
                done.append(point)
    flag = ("serve --workers N" if has_flag
            else "plain serve as 1 worker (no --workers flag in this checkout)")
    print(f"\nworkers: {os.cpu_count()} CPUs shared unpinned by the server, the publisher and "
          f"the viewer processes; {flag}; source 640x360 30 fps VP8 @ {BITRATE / 1e6:.1f} "
          f"Mbit/s + Opus; {args.seconds:.0f} s per point after {args.warmup:.0f} s; "
          f"{time.monotonic() - started:.0f} s in all")
    print("CPU columns are % of one core (irq: interrupts and softirqs, where loopback "
          "packets are received; other: the rest of the machine's busy time, outside the "
          "server, publisher and viewers); machine busy is % of all cores.\n")
    print(HEADER)
    for n in counts:
        for config in runnable:
            for p in results[config]:
                if p.n == n:
                    print(row(p))
    print()
    for config in runnable:
        print(summary(config, results[config], counts))
    for line in retried:
        print(f"retried: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
