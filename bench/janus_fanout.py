"""Relay fan-out beside Janus: the product and Janus's VideoRoom, with and without event loops,
under the same publisher and viewers, in one run.

    flock /tmp/sfu-sidecar-bench.lock .venv/bin/python bench/janus_fanout.py --pin

Needs root: the benchmark runs itself again in a network namespace of its own, where a veth
(``jtap0``, 127.0.0.2) carries every ICE pair, because Janus's libnice ignores ``lo``; the
product's pairs use the same address, so both servers see the same path.

For each server and each N (fresh server per point, the servers taking turns): one publisher
(aiortc, 640x360 30 fps VP8 pinned at 1.5 Mbit/s, and Opus), N viewers in up to four processes
that count RTP without decoding, a warm-up, then a window over which the server's CPU time (all
its threads, from /proc) and what every viewer received are measured. Printed: a table of CPU
(% of one core), video fps and audio packets/s per viewer, loss; per server, the cost per added
viewer (least-squares slope of CPU against N) and at N=1; and the product's ratios to
``janus-el2``. With ``--pin`` the server has CPU 0 to itself and the load the other CPUs.

Servers: ``janus`` (the image's configuration), ``janus-el2`` (the same with
``event_loops = 2``: Janus's media loops shared by all handles instead of a thread per handle),
``relay`` (``sfu-sidecar serve`` with its defaults: house clock, sync channel per viewer,
abs-capture-time in house time, rebuilt sender reports, the probe and speech meter).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import processes  # noqa: E402  (after the path insert)
from bench.rtpload import (  # noqa: E402
    BITRATE,
    client_pc,
    count_rtp,
    count_window,
    media_kinds,
    source_pc,
    whep_view,
    whip_publish,
)
from tests.support import janus  # noqa: E402

SERVERS = ("janus", "janus-el2", "relay")
ADDRESSES = (janus.ADDRESS,)
RELAY_PORT = 18080
WARMUP_S = 5.0
VIEWER_PROCESSES = 4


# --- publisher and viewers, each in a process of its own ---------------------------------------


def run_publisher(server: str) -> None:
    """Publishes until stdin closes; prints ``ready FEED`` (Janus's publisher id, or 0)."""
    import aiohttp
    from aiortc import RTCSessionDescription

    async def main() -> None:
        pc = source_pc(ADDRESSES)
        feed = 0
        async with aiohttp.ClientSession() as http:
            if server == "relay":
                await whip_publish(http, f"http://127.0.0.1:{RELAY_PORT}/whip/bench", pc)
            else:
                api = janus.JanusHttp(http, f"http://127.0.0.1:{janus.HTTP_PORT}/janus")
                _, feed, answer = await janus.publish_in_videoroom(api, pc)
                await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
            print(f"ready {feed}", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await pc.close()

    asyncio.run(main())


async def _janus_viewer(http: Any, feed: int) -> tuple[Any, Any]:
    """A VideoRoom subscriber: Janus offers, the viewer answers and starts."""
    from aiortc import RTCSessionDescription

    from sfu_sidecar.relay import aiortc_adapter

    api = janus.JanusHttp(http, f"http://127.0.0.1:{janus.HTTP_PORT}/janus")
    await api.create()
    handle = await api.attach("janus.plugin.videoroom")
    await api.message(handle, {"request": "join", "ptype": "subscriber", "room": janus.ROOM,
                               "streams": [{"feed": feed}]})
    offer = str((await api.event())["jsep"]["sdp"])
    pc = client_pc()
    aiortc_adapter.install_ice(pc, ADDRESSES, None)
    await pc.setRemoteDescription(RTCSessionDescription(offer, "offer"))
    await pc.setLocalDescription(await pc.createAnswer())
    counter = count_rtp(pc, media_kinds(offer))
    await api.message(handle, {"request": "start"},
                      jsep={"type": "answer", "sdp": pc.localDescription.sdp, "trickle": False})
    return pc, counter


def run_viewers(server: str, feed: int, count: int, start_at: float, seconds: float) -> None:
    """``count`` viewers; prints each one's figures over the window as one JSON line."""
    import aiohttp

    async def main() -> None:
        async with aiohttp.ClientSession() as http:
            relay = f"http://127.0.0.1:{RELAY_PORT}/whep/bench"
            peers = [await (whep_view(http, relay, ADDRESSES) if server == "relay"
                            else _janus_viewer(http, feed)) for _ in range(count)]
            out = await count_window([c for _, c in peers], start_at, seconds)
            print(json.dumps(out), flush=True)
            await asyncio.gather(*(pc.close() for pc, _ in peers))

    asyncio.run(main())


# --- servers -----------------------------------------------------------------------------------


def start_server(server: str, workdir: Path) -> subprocess.Popen[bytes]:
    log = (workdir / f"{server}.log").open("wb")
    if server == "relay":
        command = [sys.executable, "-m", "sfu_sidecar", "serve", "--host", "127.0.0.1",
                   "--port", str(RELAY_PORT), "--data-dir", str(workdir / "data"),
                   "--ice-addresses", ",".join(ADDRESSES), "--publisher-timeout-s", "600"]
        return processes.spawn(command, "server", stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    janus.write_config(workdir, janus.HTTP_PORT)
    main = workdir / "janus.jcfg"
    # Sessions live for the whole point (no keepalives are sent); event loops when asked for.
    extra = "\tsession_timeout = 0\n" + ("\tevent_loops = 2\n" if server == "janus-el2" else "")
    main.write_text(main.read_text().replace("general: {\n", "general: {\n" + extra, 1))
    return processes.spawn(["janus", f"--config={main}", f"--configs-folder={workdir}"],
                           "server", stdout=log, stderr=subprocess.STDOUT)


def wait_ready(server: str, proc: subprocess.Popen[bytes]) -> None:
    if server != "relay":
        janus.wait_info(janus.HTTP_PORT, proc)
        return
    import urllib.request

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{RELAY_PORT}/healthz", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("serve never answered /healthz")


# --- one point ---------------------------------------------------------------------------------


def _role(*args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(  # a load process: publisher or viewers
        [sys.executable, __file__, *args], cwd=ROOT, text=True, stdin=stdin,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        preexec_fn=(lambda: os.sched_setaffinity(0, processes.CPUS["load"]))
        if "load" in processes.CPUS else None,
    )


def measure(server: str, n: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"janus-fanout-{server}-") as tmp:
        workdir = Path(tmp)
        proc = start_server(server, workdir)
        publisher = None
        try:
            wait_ready(server, proc)
            publisher = _role("publisher", server, stdin=subprocess.PIPE)
            assert publisher.stdout is not None
            ready = publisher.stdout.readline().split()
            if ready[:1] != ["ready"]:
                raise RuntimeError(f"{server}: the publisher did not connect")
            feed = ready[1]
            procs_n = min(n, VIEWER_PROCESSES)
            share = [n // procs_n + (i < n % procs_n) for i in range(procs_n)]
            start_at = time.time() + WARMUP_S + 0.4 * n  # joins, then the warm-up
            viewers = [_role("viewers", server, feed, str(k), str(start_at), str(seconds))
                       for k in share]
            time.sleep(max(0.0, start_at - time.time()))
            cpu0, wall0 = processes.cpu_seconds(proc.pid), time.monotonic()
            time.sleep(seconds)
            cpu = (processes.cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - wall0)
            per_viewer: list[dict[str, Any]] = []
            for v in viewers:
                out, _ = v.communicate(timeout=60 + n)
                per_viewer.extend(json.loads(out.strip().splitlines()[-1]))
            if len(per_viewer) != n:
                raise RuntimeError(f"{server}: {len(per_viewer)} of {n} viewers reported")
        except BaseException:
            print(f"--- {server}.log (end)\n" + (workdir / f"{server}.log").read_text(
                errors="replace")[-3000:], file=sys.stderr)
            raise
        finally:
            if publisher is not None and publisher.stdin is not None:
                publisher.stdin.close()
                try:
                    publisher.wait(10)
                except subprocess.TimeoutExpired:
                    publisher.kill()
            janus.stop_process(proc)
    lost = sum(v["lost"] for v in per_viewer)
    expected = sum(v["expected"] for v in per_viewer)
    return {
        "server": server, "n": n, "cpu_pct": 100 * cpu,
        "fps": statistics.mean(v["fps"] for v in per_viewer),
        "fps_min": min(v["fps"] for v in per_viewer),
        "audio_pps": statistics.mean(v["audio_pps"] for v in per_viewer),
        "loss_pct": 100 * lost / expected if expected else 100.0,
    }


# --- the run -----------------------------------------------------------------------------------


def slope(rows: list[dict[str, Any]]) -> float:
    """CPU per added viewer (% of a core), least squares over the points."""
    if len(rows) < 2:
        return float("nan")
    fit = statistics.linear_regression([r["n"] for r in rows], [r["cpu_pct"] for r in rows])
    return float(fit.slope)


def fmt(r: dict[str, Any]) -> str:
    return (f"| {r['server']:<9} | {r['n']:>3} | {r['cpu_pct']:6.2f} | {r['fps']:5.1f} "
            f"({r['fps_min']:4.1f}) | {r['audio_pps']:5.1f} | {r['loss_pct']:6.2f} |")


def report(rows: list[dict[str, Any]], servers: list[str], seconds: float) -> None:
    print(f"janus_fanout: {os.cpu_count()} CPUs, source 640x360 30 fps VP8 @ "
          f"{BITRATE / 1e6:.1f} Mbit/s + Opus, {WARMUP_S:.0f} s warm-up, {seconds:.0f} s window"
          + (", server pinned to CPU 0" if processes.CPUS else ""))
    print("| server    |   N |  CPU % | fps (min)    | aud/s | loss % |")
    print("|-----------|-----|--------|--------------|-------|--------|")
    for r in sorted(rows, key=lambda r: (servers.index(r["server"]), r["n"])):
        print(fmt(r))
    costs: dict[str, tuple[float, float]] = {}
    for server in servers:
        mine = sorted((r for r in rows if r["server"] == server), key=lambda r: r["n"])
        costs[server] = (slope(mine), mine[0]["cpu_pct"] if mine else float("nan"))
        print(f"{server}: per added viewer {costs[server][0]:.3f} % of a core; "
              f"at N={mine[0]['n'] if mine else '-'} {costs[server][1]:.2f} %")
    if "relay" in costs and "janus-el2" in costs:
        (rs, r1), (js, j1) = costs["relay"], costs["janus-el2"]
        print(f"relay / janus-el2 per added viewer: {rs / js:.2f}x; "
              f"at the first N: relay {r1 - j1:+.2f} % of a core over janus-el2")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", nargs="?", default="run")
    parser.add_argument("args", nargs="*")
    parser.add_argument("--counts", default="1,8,16,32")
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--pin", action="store_true",
                        help="the server on CPU 0, publisher and viewers on the other CPUs")
    ns = parser.parse_args()
    if ns.pin and (os.cpu_count() or 1) > 1:
        processes.CPUS["server"] = {0}
        processes.CPUS["load"] = set(range(1, os.cpu_count() or 2))
    if ns.role == "publisher":
        run_publisher(ns.args[0])
        return 0
    if ns.role == "viewers":
        run_viewers(ns.args[0], int(ns.args[1]), int(ns.args[2]), float(ns.args[3]),
                    float(ns.args[4]))
        return 0
    if os.geteuid() != 0:
        print("janus_fanout: needs root (a network namespace with Janus's veth)", file=sys.stderr)
        return 2
    if not os.environ.get(processes.NETNS_MARK):
        with processes.locks(processes.BENCH_LOCK):
            return processes.rerun_in_loopback_namespace()
    janus.setup_namespace()
    servers = [s for s in ns.servers.split(",") if s]
    unknown = sorted(set(servers) - set(SERVERS))
    if unknown:
        print(f"janus_fanout: unknown servers {unknown}; known: {', '.join(SERVERS)}",
              file=sys.stderr)
        return 2
    rows = []
    for n in [int(c) for c in ns.counts.split(",")]:
        for server in servers:  # the servers take turns, so drift in the machine hits all
            rows.append(measure(server, n, ns.seconds))
            print(fmt(rows[-1]), file=sys.stderr, flush=True)
    report(rows, servers, ns.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
