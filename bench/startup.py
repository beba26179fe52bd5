"""Start-up time: process spawn -> first ``200`` from ``/healthz``.

The product (``sfu-sidecar serve``: house clock, caption store, relay with its aiortc check, sync)
against a baseline of a bare aiohttp app answering ``/healthz``, alternated in one run so both
see the same machine. Prints medians and the ratio.

    .venv/bin/python bench/startup.py [--runs 7]
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

BASELINE = """
import sys
from aiohttp import web
async def healthz(request):
    return web.json_response({"status": "ok"})
app = web.Application()
app.router.add_get("/healthz", healthz)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def time_to_healthz(cmd: list[str], port: int, limit_s: float = 20.0) -> float:
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while time.perf_counter() - started < limit_s:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                    if r.status == 200:
                        return time.perf_counter() - started
            except OSError:
                time.sleep(0.01)
        raise TimeoutError(f"{cmd[0]} did not answer /healthz within {limit_s} s")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    exe = Path(sys.executable).with_name("sfu-sidecar")
    product_cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "sfu_sidecar"]
    product, baseline = [], []
    for _ in range(args.runs):
        data = tempfile.mkdtemp(prefix="sfu-sidecar-startup-")
        port = free_port()
        product.append(time_to_healthz(
            [*product_cmd, "serve", "--host", "127.0.0.1", "--port", str(port),
             "--data-dir", data], port))
        shutil.rmtree(data, ignore_errors=True)
        port = free_port()
        baseline.append(time_to_healthz([sys.executable, "-c", BASELINE, str(port)], port))
    p, b = statistics.median(product), statistics.median(baseline)
    print(f"startup: spawn -> /healthz 200, {args.runs} runs each, alternated")
    print("| server                 | median s | min s | max s |")
    print("|------------------------|---------:|------:|------:|")
    print(f"| sfu-sidecar serve      | {p:8.3f} | {min(product):5.3f} | {max(product):5.3f} |")
    print(f"| bare aiohttp /healthz  | {b:8.3f} | {min(baseline):5.3f} | {max(baseline):5.3f} |")
    print(f"ratio product/baseline: {p / b:.2f}x")


if __name__ == "__main__":
    main()
