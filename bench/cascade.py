"""Latency a cascade hop adds: origin -> edge -> edge, side by side with two viewers of one node.

    flock /tmp/sfu-sidecar-bench.lock .venv/bin/python bench/cascade.py

Three real ``sfu-sidecar serve`` processes: the origin, edge 1 (``origin_url`` = the origin)
and edge 2 (``origin_url`` = edge 1), all pinned to CPU 0. A publisher process (the synthetic
broadcaster at 1.5 Mbit/s VP8 + Opus over WHIP with capture stamps, as ``bench/segments.py``
runs it) publishes to the origin. This process (on the other CPU) holds four WHEP viewers that
never decode: two on the origin, one on each edge. Each viewer notes when the last packet of
every video frame (marker bit) reached it, keyed by the frame's abs-capture-time, which every
node writes from the same capture time (the edges joined their upstream's clock), so one frame
is matched across all viewers without guessing.

Rows, over the frames every viewer got:

- ``same node``: second origin viewer minus first, the baseline: what two copies of one frame
  differ by when no hop lies between them (the measurement's own noise and send order);
- ``hop 1``: edge 1 viewer minus first origin viewer (one pull: WHEP out of the origin, SRTP
  decrypt and re-encrypt, and the edge's forwarding);
- ``hop 2``: edge 2 viewer minus edge 1 viewer;
- ``capture to origin viewer``: arrival minus capture time, for scale (encode, pacing and the
  first relay).

Medians and p99 in ms. Takes /tmp/sfu-sidecar-bench.lock (unless ``flock`` already holds it).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import fcntl
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.processes import (  # noqa: E402  (after the path insert)
    BENCH_LOCK,
    CPUS,
    Server,
    free_port,
    holds_bench_lock,
    spawn,
    wait_healthy,
)
from bench.segmentload import whep_offer  # noqa: E402
from bench.segments import SERVER_CPU, TOKEN, _auth, publisher  # noqa: E402

ABS_CAPTURE_TIME = "http://www.webrtc.org/experiments/rtp-hdrext/abs-capture-time"


@contextlib.asynccontextmanager
async def node(workdir: Path, name: str, origin: str | None) -> AsyncIterator[Server]:
    port = free_port()
    log = workdir / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SFU_SIDECAR_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["SFU_SIDECAR_NODE_ID"] = name
    if origin is not None:
        env["SFU_SIDECAR_ORIGIN_URL"] = origin
        env["SFU_SIDECAR_ORIGIN_TOKEN"] = TOKEN
    with log.open("wb") as out:
        proc = spawn(
            [sys.executable, "-m", "sfu_sidecar", "serve", "--host", "127.0.0.1",
             "--port", str(port), "--data-dir", str(workdir / name), "--view-token", TOKEN,
             "--publish-token", TOKEN, "--ice-addresses", "127.0.0.1",
             "--max-cpu-percent", "1000"],
            "server", env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    server = Server(proc, f"http://127.0.0.1:{port}", log)
    try:
        await wait_healthy(server, "/healthz", f"sfu-sidecar serve ({name})")
        yield server
    finally:
        server.stop()


@dataclass
class FrameViewer:
    """A WHEP viewer that notes the arrival of each video frame's last packet by its
    abs-capture-time (house ns of the capture instant)."""

    pc: Any
    location: str
    video_pt: int
    ext_id: int
    arrivals: dict[int, int] = field(default_factory=dict)

    @classmethod
    async def open(cls, base: str) -> FrameViewer:
        from sfu_sidecar.relay import aiortc_adapter, sdp

        for kind in ("audio", "video"):  # aiortc offers only the extensions it was told of
            aiortc_adapter.negotiate_header_extension(kind, ABS_CAPTURE_TIME)
        pc, answer, location = await whep_offer(base)
        video = next(m for m in sdp.parse(answer, what="a").media if m.kind == "video")
        viewer = cls(pc, location, video.primary.payload_type,
                     video.extensions[ABS_CAPTURE_TIME])
        for dtls in aiortc_adapter.dtls_transports(pc):
            aiortc_adapter.on_rtp(dtls, viewer.on_rtp)
        return viewer

    def on_rtp(self, data: bytes, _arrival_ms: int) -> None:
        now = time.time_ns()
        if (data[1] & 0x7F) != self.video_pt or not data[1] & 0x80:
            return
        from sfu_sidecar.relay.packet import RtpPacket
        from sfu_sidecar.sync.abscapture import AbsCaptureTime

        packet = RtpPacket.parse(data)
        raw = dict(packet.extensions).get(self.ext_id)
        if raw is not None:
            self.arrivals[AbsCaptureTime.parse(raw).sender_clock_ns()] = now

    async def close(self) -> None:
        import aiohttp

        with contextlib.suppress(aiohttp.ClientError):
            async with aiohttp.ClientSession() as http, http.delete(
                self.location, headers=_auth()
            ):
                pass
        await self.pc.close()


def matched(reference: dict[int, int], other: dict[int, int]) -> dict[int, int]:
    """``other``'s arrivals keyed by the nearest capture stamp of ``reference`` (within 5 ms)."""
    keys = sorted(reference)
    out = {}
    for stamp, arrival in other.items():
        i = bisect.bisect_left(keys, stamp)
        near = [k for k in keys[max(0, i - 1):i + 1] if abs(k - stamp) <= 5_000_000]
        if near:
            out[min(near, key=lambda k: abs(k - stamp))] = arrival
    return out


def stats_ms(values: list[int]) -> tuple[float, float, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.median(ordered) / 1e6, p99 / 1e6, ordered[-1] / 1e6


async def bench(args: argparse.Namespace) -> None:
    with TemporaryDirectory(prefix="bench-cascade-") as tmp:
        work = Path(tmp)
        async with node(work, "origin", None) as origin, \
                node(work, "edge1", origin.base) as edge1, \
                node(work, "edge2", edge1.base) as edge2, \
                publisher(origin.base, "vp8"):
            viewers = {
                "origin a": await FrameViewer.open(origin.base),
                "origin b": await FrameViewer.open(origin.base),
                "edge 1": await FrameViewer.open(edge1.base),
                "edge 2": await FrameViewer.open(edge2.base),
            }
            try:
                await asyncio.sleep(args.warmup)
                for v in viewers.values():
                    v.arrivals.clear()
                await asyncio.sleep(args.seconds)
            finally:
                for v in viewers.values():
                    await v.close()
    got = {name: len(v.arrivals) for name, v in viewers.items()}
    # Each edge writes the capture time on its own clock (the upstream's plus the measured
    # offset, microseconds here), so a frame is matched to the nearest stamp within 5 ms;
    # frames are 33 ms apart.
    a = viewers["origin a"].arrivals
    b, e1, e2 = (matched(a, viewers[n].arrivals) for n in ("origin b", "edge 1", "edge 2"))
    common = set(a) & set(b) & set(e1) & set(e2)
    rows = [
        ("same node (baseline)", [b[f] - a[f] for f in common]),
        ("hop 1: origin -> edge 1", [e1[f] - a[f] for f in common]),
        ("hop 2: edge 1 -> edge 2", [e2[f] - e1[f] for f in common]),
        ("capture to origin viewer", [a[f] - f for f in common]),
    ]
    print(f"\nframes every viewer got: {len(common)} over {args.seconds:.0f} s "
          f"(per viewer: {got})")
    print("| between | median ms | p99 ms | max ms |")
    print("|---|---:|---:|---:|")
    for name, values in rows:
        med, p99, worst = stats_ms(values)
        print(f"| {name} | {med:.2f} | {p99:.2f} | {worst:.2f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    args = parser.parse_args()
    if (os.cpu_count() or 1) > 1:
        CPUS["server"] = {SERVER_CPU}
        CPUS["load"] = set(range(os.cpu_count() or 2)) - {SERVER_CPU}
        os.sched_setaffinity(0, CPUS["load"])
    with contextlib.ExitStack() as stack:
        if not holds_bench_lock():
            BENCH_LOCK.touch(exist_ok=True)
            lock = stack.enter_context(BENCH_LOCK.open("w"))
            fcntl.flock(lock, fcntl.LOCK_EX)
        asyncio.run(bench(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
