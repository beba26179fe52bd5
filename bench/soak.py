"""Soak: the real service under a steady, mixed load for ten minutes, watched for leaks.

    flock /tmp/sfu-sidecar-bench.lock .venv/bin/python bench/soak.py [--seconds 600]

Processes, all over loopback:

* the service, ``sfu-sidecar serve`` (its log kept in a file);
* a broadcaster: the demo's synthetic source over WHIP with a clock join on its DataChannel,
  captions at 2 cues/s over HTTP (one per second in each of two languages) and a WebSocket
  clock join every 10 s;
* 8 WHEP viewers that count every RTP packet they receive (never decoding);
* a fuzzer: mutated requests to every route at 20/s (``tests/fuzz/http_targets``'s request
  shapes, from a fixed random seed), every answer checked below 500.

Every 10 s the service's RSS, open fds and asyncio tasks (its ``/metrics``) are sampled. After
a warm-up of 60 s, the run passes when RSS grows by at most ``--rss-mib`` (20), fds and tasks by
at most 5, the log holds no ERROR or traceback line, no answer was 5xx, and the packets the
viewers counted match the relay's forwarded counter over the same window within 0.5 %.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STREAM = "demo"
VIEWERS = 8
SAMPLE_S = 10.0
WARMUP_S = 60.0


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def metrics(base: str) -> dict[str, float]:
    """``/metrics`` as {sample name with labels: value}."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def forwarded(m: dict[str, float]) -> float:
    return sum(v for k, v in m.items()
               if k.startswith("sfu_sidecar_relay_packets_forwarded_total")
               and f'stream="{STREAM}"' in k)


def proc_sample(pid: int) -> tuple[int, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kib = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return rss_kib * 1024, len(os.listdir(f"/proc/{pid}/fd"))


# --- roles run in their own processes ---------------------------------------------------------


def run_broadcaster(base: str, seconds: float) -> None:
    import aiohttp

    from sfu_sidecar.client.clock import join_clock
    from sfu_sidecar.demo import Broadcaster

    async def main() -> None:
        house = await join_clock(base)
        broadcaster = Broadcaster(base, None, house.now_ns)
        task = asyncio.create_task(broadcaster.run())  # video, audio, 1 cue/s in English
        posted = refused = joins = 0
        end = time.monotonic() + seconds
        async with aiohttp.ClientSession() as http:
            n = 0
            while time.monotonic() < end:
                await asyncio.sleep(1.0)
                start = house.now_ns() + 2_000_000_000
                body = {"timebase": "house_ns", "lang": "de", "cues": [
                    {"id": f"de-{n}", "start": start, "end": start + 900_000_000,
                     "text": f"Zeile {n}"}]}
                async with http.post(f"{base}/api/streams/{STREAM}/captions",
                                     json=body) as resp:
                    posted += 1
                    refused += resp.status >= 300
                n += 1
                if n % 10 == 0:
                    await join_clock(base)
                    joins += 1
                if task.done():
                    raise RuntimeError(f"broadcaster stopped: {task.exception()!r}")
        task.cancel()
        await broadcaster.close()
        print(json.dumps({"posted": posted, "refused": refused, "clock_joins": joins}),
              flush=True)

    asyncio.run(main())


def run_fuzzer(base: str, seconds: float, rate: float) -> None:
    from aiohttp import web

    from sfu_sidecar.app import build_app
    from sfu_sidecar.config import load_settings
    from tests.fuzz import http_targets as h

    with tempfile.TemporaryDirectory() as tmp:
        app: web.Application = build_app(load_settings({"data_dir": tmp}))
        routes = [r for r in app.router.routes() if r.method != "*"]
    client = h.Client(int(base.rsplit(":", 1)[1]))
    rng = random.Random(7)
    sent = bad = 0
    statuses: dict[str, int] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        data = rng.randbytes(rng.randrange(4, 200))
        p = h.Provider(data)
        route = p.pick(routes)
        info = route.resource.get_info() if route.resource is not None else {}
        template = str(info.get("formatter") or info.get("path") or info.get("prefix", "/"))
        method = route.method if p.byte() % 4 else p.pick(h.METHODS)
        path = h._fill(template, p)
        if "prefix" in info:
            path = template.rstrip("/") + "/" + h.quote(p.text(), safe="/")
        # Never end the sessions the soak watches, nor publish on its stream.
        path = path.replace(f"/{STREAM}", "/fuzz")
        headers = {"Content-Type": p.pick(h.CONTENT_TYPES)}
        body = b"" if method == "HEAD" else p.rest()
        try:
            status, answer, content = client.request(method, path, body, headers)
            h.check_answer(status, answer, content, f"{method} {path}")
            statuses[str(status)] = statuses.get(str(status), 0) + 1
        except AssertionError as exc:
            bad += 1
            print(f"bad answer: {exc}", file=sys.stderr, flush=True)
        sent += 1
        time.sleep(1.0 / rate)
    print(json.dumps({"sent": sent, "bad": bad, "statuses": statuses}), flush=True)


# --- the run ----------------------------------------------------------------------------------


def sub(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_ready(base: str, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the service did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", nargs="?", default="run")
    parser.add_argument("args", nargs="*")
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--rss-mib", type=float, default=20.0)
    parser.add_argument("--fuzz-rate", type=float, default=20.0)
    ns = parser.parse_args()
    if ns.role == "broadcaster":
        run_broadcaster(ns.args[0], float(ns.args[1]))
        return 0
    if ns.role == "fuzzer":
        run_fuzzer(ns.args[0], float(ns.args[1]), float(ns.args[2]))
        return 0
    if ns.seconds < WARMUP_S + 3 * SAMPLE_S:
        parser.error(f"--seconds must be at least {WARMUP_S + 3 * SAMPLE_S:g}")

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    tmp = tempfile.TemporaryDirectory(prefix="soak-")
    log_path = Path(tmp.name, "service.log")
    with log_path.open("w") as log_file:
        server = subprocess.Popen(
            [str(Path(sys.executable).with_name("sfu-sidecar")), "serve", "--port", str(port),
             "--data-dir", str(Path(tmp.name, "data")), "--ice-addresses", "127.0.0.1"],
            cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT, text=True)
    procs: list[subprocess.Popen[str]] = []
    try:
        wait_ready(base)
        run_s = ns.seconds
        procs.append(sub("broadcaster", base, str(run_s + 20)))
        time.sleep(3.0)
        start_at = time.time() + WARMUP_S
        viewers = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "relay_fanout.py"), "viewers",
             f"{base}/whep/{STREAM}", str(VIEWERS), str(start_at), str(run_s - WARMUP_S)],
            cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append(viewers)
        procs.append(sub("fuzzer", base, str(run_s), str(ns.fuzz_rate)))
        samples: list[dict[str, Any]] = []
        window_end = start_at + (run_s - WARMUP_S)
        time.sleep(max(0.0, start_at - time.time()))
        at_start = forwarded(metrics(base))
        next_sample = time.time()
        while time.time() < window_end:
            time.sleep(max(0.0, min(next_sample, window_end) - time.time()))
            if time.time() >= window_end:
                break
            next_sample += SAMPLE_S
            rss, fds = proc_sample(server.pid)
            m = metrics(base)
            samples.append({"t": round(time.time() - start_at + WARMUP_S), "rss_mib": rss / 2**20,
                            "fds": fds, "tasks": m.get("sfu_sidecar_asyncio_tasks"),
                            "viewers": m.get(f'sfu_sidecar_relay_viewers{{stream="{STREAM}"}}')})
            print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
        # The viewers stop counting at window_end on the same clock: read the relay's total now.
        at_end = forwarded(metrics(base))
        rss, fds = proc_sample(server.pid)
        m = metrics(base)
        samples.append({"t": round(time.time() - start_at + WARMUP_S), "rss_mib": rss / 2**20,
                        "fds": fds, "tasks": m.get("sfu_sidecar_asyncio_tasks"),
                        "viewers": m.get(f'sfu_sidecar_relay_viewers{{stream="{STREAM}"}}')})
        viewer_out, _ = viewers.communicate(timeout=120)
        outs = {}
        for name, p in (("broadcaster", procs[0]), ("fuzzer", procs[2])):
            out, err = p.communicate(timeout=120)
            outs[name] = json.loads(out.strip().splitlines()[-1]) if out.strip() else {
                "error": err[-2000:]}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.terminate()
        server.wait(timeout=30)
    counted = json.loads(viewer_out.strip().splitlines()[-1])
    received = sum(c["expected"] - c["lost"] for c in counted)
    relay_sent = at_end - at_start
    log_text = log_path.read_text()
    errors = [line for line in log_text.splitlines()
              if re.search(r"\bERROR\b|\bCRITICAL\b|Traceback", line)]
    first, last = samples[0], samples[-1]
    growth = {key: last[key] - first[key] for key in ("rss_mib", "fds", "tasks")
              if first[key] is not None and last[key] is not None}
    peak = {key: max(s[key] for s in samples) - first[key] for key in ("rss_mib", "fds", "tasks")
            if first[key] is not None}
    match = abs(received - relay_sent) / max(relay_sent, 1.0)
    print(f"soak: {ns.seconds:.0f} s, {VIEWERS} viewers, warm-up {WARMUP_S:.0f} s, "
          f"{os.cpu_count()} CPUs")
    print("| measure | after warm-up | at end | growth | peak growth | bound |")
    print("|---|---|---|---|---|---|")
    bounds = {"rss_mib": ns.rss_mib, "fds": 5, "tasks": 5}
    for key, label in (("rss_mib", "RSS MiB"), ("fds", "open fds"), ("tasks", "asyncio tasks")):
        if key in growth:
            print(f"| {label} | {first[key]:.1f} | {last[key]:.1f} | {growth[key]:+.1f} | "
                  f"{peak[key]:+.1f} | {bounds[key]:g} |")
    print(f"| packets viewers counted / relay forwarded | {received:.0f} | {relay_sent:.0f} | "
          f"{100 * match:.3f} % apart | | 0.5 % |")
    print(f"broadcaster: {outs['broadcaster']}")
    print(f"fuzzer: {outs['fuzzer']}")
    print(f"log: {len(log_text.splitlines())} lines, {len(errors)} ERROR/traceback lines")
    if errors:
        kept = Path(tempfile.gettempdir(), "sfu-sidecar-soak.log")
        kept.write_text(log_text)
        print(f"  the whole log: {kept}")
    for line in errors[:10]:
        print("  " + line)
    ok = (all(growth.get(k, 0) <= b for k, b in bounds.items()) and not errors
          and match <= 0.005 and outs["fuzzer"].get("bad", 1) == 0
          and outs["broadcaster"].get("refused", 1) == 0)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
