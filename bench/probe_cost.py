"""Sync probe cost: per publisher packet next to the relay's forwarding, and the dashboard push.

    flock /tmp/sfu-sidecar-bench.lock .venv/bin/python bench/probe_cost.py

1. Per packet, in process. The relay's forwarding of one publisher packet is what the product
   does with it: SRTP-decrypt it (pylibsrtp, as aiortc does before the relay sees it), then what
   ``PublisherSession._on_rtp`` does: parse, receive statistics and NACK bookkeeping, the
   publisher-level hook (the sync component's capture-time mapping, as deployed), one rewritten
   copy per viewer, each SRTP-encrypted and handed to a real UDP socket. aiortc's ICE/DTLS
   receive path and the event loop are left out, so the real relay costs more per packet and the
   probe's share is smaller than shown. The same synthetic 30 fps VP8 (5 packets per frame,
   abs-capture-time) + 50/s Opus stream runs through it without and with the probe, alternated,
   and the probe's own work is also timed alone on the same packets; its one-second tick (alert
   evaluation and the dashboard snapshot, which reads the fits) is shared out over the packets
   of that second.
2. The dashboard push: the whole app serving 4 streams with 10 reporting viewers each; 0 and then
   20 dashboards (aiohttp WebSocket clients in another process) receive one snapshot per tick.
   The server's CPU time per tick is compared between the two.

Prints a table; the relay figures depend on the number of viewers, so four viewer counts run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VIDEO_FPS = 30
VIDEO_PACKETS = 5
AUDIO_PER_S = 50
ABS_ID = 3
MS = 1_000_000
S = 1_000_000_000


SRTP_KEY = bytes(range(30))  # AES_CM_128_HMAC_SHA1_80 master key and salt


def protect_all(packets: list[tuple[str, bytes, int]]) -> list[tuple[str, bytes, int]]:
    """The packets as the publisher sends them: SRTP-encrypted."""
    from pylibsrtp import Policy, Session

    tx = Session(policy=Policy(key=SRTP_KEY, ssrc_type=Policy.SSRC_ANY_OUTBOUND))
    return [(kind, tx.protect(data), arrival) for kind, data, arrival in packets]


def make_packets(seconds: float, t0: int) -> list[tuple[str, bytes, int]]:
    """(kind, wire bytes, arrival ns) in arrival order, with a little arrival jitter."""
    from sfu_sidecar.relay.packet import build_rtp
    from sfu_sidecar.sync.abscapture import build_abs_capture_time

    out: list[tuple[int, str, bytes]] = []
    frames = int(seconds * VIDEO_FPS)
    seq = 0
    for f in range(frames):
        capture = t0 + f * S // VIDEO_FPS
        for p in range(VIDEO_PACKETS):
            # VP8 descriptor with S=1 on a frame's first packet; a keyframe every 2 s.
            head = bytes([0x10, 0x00 if f % 60 == 0 else 0x01]) if p == 0 else b"\x00\x00"
            data = build_rtp(96, seq & 0xFFFF, (f * 3000) & 0xFFFFFFFF, 0x1111, p == 4,
                             head + bytes(1100), ((ABS_ID, build_abs_capture_time(capture)),))
            seq += 1
            out.append((capture + 8 * MS + p * 200_000 + (f % 7) * MS, "video", data))
    for a in range(int(seconds * AUDIO_PER_S)):
        capture = t0 + a * S // AUDIO_PER_S
        data = build_rtp(111, a & 0xFFFF, (a * 960) & 0xFFFFFFFF, 0x2222, False, bytes(120),
                         ((ABS_ID, build_abs_capture_time(capture)),))
        out.append((capture + 3 * MS + (a % 5) * 200_000, "audio", data))
    out.sort(key=lambda x: x[0])
    return [(kind, data, arrival) for arrival, kind, data in out]


class Pipeline:
    """The relay's per-packet path for one stream, with the product's publisher hooks."""

    def __init__(self, viewers: int, with_probe: bool, sink: tuple[str, int]) -> None:
        from sfu_sidecar.config import load_settings
        from sfu_sidecar.metrics import Metrics
        from sfu_sidecar.probe.service import ProbeService
        from sfu_sidecar.relay import RelayService
        from sfu_sidecar.relay.forwarder import OutputConfig, TrackForwarder, ViewerOutput
        from sfu_sidecar.relay.hooks import ABS_CAPTURE_TIME
        from sfu_sidecar.syncchannel.service import SyncService

        settings = load_settings({"data_dir": tempfile.mkdtemp(prefix="sfu-bench-")})
        metrics = Metrics()
        relay = RelayService(settings, metrics)
        self.sync = SyncService(relay, metrics, now_ns=time.time_ns)
        self.probe = ProbeService(settings, relay, metrics, now_ns=time.time_ns, sync=self.sync)
        relay.streams.get_or_create("bench")
        self.observers: list[Any] = [self.sync] + ([self.probe] if with_probe else [])
        self.forwarders: dict[int, Any] = {}
        for pt, kind, codec, rate in ((96, "video", "vp8", 90000), (111, "audio", "opus", 48000)):
            fw = TrackForwarder(kind, codec, rate)
            fw.set_source({ABS_ID: ABS_CAPTURE_TIME}, codec, rate)
            for v in range(viewers):
                config = OutputConfig(ssrc=(1000 if kind == "video" else 2000) + v,
                                      payload_type=pt,
                                      extension_ids={ABS_CAPTURE_TIME: ABS_ID})
                out = ViewerOutput(f"viewer{v}", kind, config, seq_base=v * 100,
                                   ts_base=v * 1000)
                fw.add_output(out)
            self.forwarders[pt] = fw
        from pylibsrtp import Policy, Session

        from sfu_sidecar.relay.upstream import NackGenerator, ReceiveStatistics

        self.rx = Session(policy=Policy(key=SRTP_KEY, ssrc_type=Policy.SSRC_ANY_INBOUND))
        # One SRTP session per viewer transport, as each viewer has its own DTLS keys.
        self.tx = [Session(policy=Policy(key=SRTP_KEY, ssrc_type=Policy.SSRC_ANY_OUTBOUND))
                   for _ in range(viewers)]
        self.stats = {96: ReceiveStatistics(90000), 111: ReceiveStatistics(48000)}
        self.nack = NackGenerator()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sink = sink
        self.joined = False

    def hook(self, info: Any) -> Any:
        written: dict[str, bytes] = {}
        for observer in self.observers:
            values = observer.publisher_packet("bench", "publisher", info)
            if values:
                written.update(values)
        return written

    def forward(self, data: bytes, arrival_ns: int) -> None:
        from sfu_sidecar.relay.packet import RtpPacket

        pkt = RtpPacket.parse(self.rx.unprotect(data))
        self.stats[pkt.payload_type].add(pkt.sequence_number, pkt.timestamp, arrival_ns)
        if pkt.payload_type == 96:
            self.nack.add(pkt.sequence_number, arrival_ns)
        fw = self.forwarders[pkt.payload_type]
        copies, observations = fw.push(pkt, arrival_ns, arrival_ns, self.hook)
        for i, (_output, out) in enumerate(copies):
            self.sock.sendto(self.tx[i].protect(out), self.sink)
        if observations is not None:
            observations.deliver()

    def join(self) -> None:
        # The synthetic publisher joined the house clock, as the demo's does: capture times
        # are exact, and the probe fits them on the house basis.
        self.sync.publishers["bench"].sync.join(0)
        self.joined = True


def run_relay(packets: list[tuple[str, bytes, int]], viewers: int, with_probe: bool,
              sink: tuple[str, int]) -> tuple[float, float]:
    """ns per packet of the whole path, and of the probe's ticks shared out per packet."""
    pipe = Pipeline(viewers, with_probe, sink)
    _, first, arrival = packets[0]
    pipe.forward(first, arrival)
    pipe.join()
    tick_ns = 0
    next_tick = arrival + S
    started = time.perf_counter_ns()
    for _kind, data, arrival in packets[1:]:
        pipe.forward(data, arrival)
        if with_probe and arrival >= next_tick:
            t = time.perf_counter_ns()
            pipe.probe.tick(arrival)
            tick_ns += time.perf_counter_ns() - t
            next_tick += S
    elapsed = time.perf_counter_ns() - started - tick_ns
    n = len(packets) - 1
    return elapsed / n, tick_ns / n


def run_probe_alone(packets: list[tuple[str, bytes, int]]) -> float:
    """ns per packet of ProbeService.publisher_packet alone, on the PacketInfo the relay makes."""
    from sfu_sidecar.config import load_settings
    from sfu_sidecar.metrics import Metrics
    from sfu_sidecar.probe.service import ProbeService
    from sfu_sidecar.relay import RelayService
    from sfu_sidecar.relay.hooks import ABS_CAPTURE_TIME, PacketInfo
    from sfu_sidecar.relay.packet import RtpPacket

    settings = load_settings({"data_dir": tempfile.mkdtemp(prefix="sfu-bench-")})
    metrics = Metrics()
    relay = RelayService(settings, metrics)
    probe = ProbeService(settings, relay, metrics, now_ns=time.time_ns)
    infos = []
    for kind, data, arrival in packets:
        p = RtpPacket.parse(data)
        infos.append(PacketInfo(kind, p.ssrc, p.sequence_number, p.timestamp, p.marker, False,
                                arrival, 90000 if kind == "video" else 48000,
                                {ABS_CAPTURE_TIME: p.extensions[0][1]}))
    hook = probe.publisher_packet
    started = time.perf_counter_ns()
    for info in infos:
        hook("bench", "publisher", info)
    return (time.perf_counter_ns() - started) / len(infos)


def packet_table(seconds: float, rounds: int) -> list[dict[str, Any]]:
    sink_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink_sock.bind(("127.0.0.1", 0))
    sink_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)  # full soon: drops
    sink = sink_sock.getsockname()
    plain = make_packets(seconds, time.time_ns())
    packets = protect_all(plain)
    rows = []
    for viewers in (1, 2, 4, 8):
        base, withp, ticks, alone = [], [], [], []
        for _ in range(rounds):
            base.append(run_relay(packets, viewers, False, sink)[0])
            total, tick = run_relay(packets, viewers, True, sink)
            withp.append(total)
            ticks.append(tick)
            alone.append(run_probe_alone(plain))
        # The best round of each: on a shared machine the least disturbed one is the cost.
        relay_ns = min(base)
        probe_ns = min(alone) + min(ticks)
        rows.append({
            "viewers": viewers, "packets": len(packets), "relay_ns": relay_ns,
            "probe_ns": min(alone), "tick_ns": min(ticks),
            "overhead_pct": 100 * probe_ns / relay_ns,
            "difference_pct": 100 * (min(withp) + min(ticks) - relay_ns) / relay_ns,
        })
    sink_sock.close()
    return rows


# --- dashboard push -----------------------------------------------------------------------------


def run_dashboards(port: int, count: int, seconds: float) -> None:
    """Client process: ``count`` dashboards for ``seconds``; prints messages and bytes received."""
    import aiohttp

    async def one(http: aiohttp.ClientSession, totals: list[int]) -> None:
        async with http.ws_connect(f"http://127.0.0.1:{port}/api/dashboard/ws",
                                   max_msg_size=1 << 24) as ws:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                try:
                    msg = await ws.receive(timeout=max(0.01, deadline - time.monotonic()))
                except TimeoutError:
                    break
                if msg.type != aiohttp.WSMsgType.TEXT:
                    break
                totals[0] += 1
                totals[1] += len(msg.data)

    async def main() -> None:
        totals = [0, 0]
        async with aiohttp.ClientSession() as http:
            await asyncio.gather(*(one(http, totals) for _ in range(count)))
        print(json.dumps({"messages": totals[0], "bytes": totals[1]}))

    asyncio.run(main())


async def dashboard_push(ticks: int, tick_s: float) -> list[dict[str, Any]]:
    from aiohttp import web

    from sfu_sidecar.app import SERVICES_KEY, build_app
    from sfu_sidecar.config import load_settings
    from sfu_sidecar.relay.hooks import PacketInfo
    from sfu_sidecar.sync.wire import Playout

    settings = load_settings({"data_dir": tempfile.mkdtemp(prefix="sfu-bench-")})
    app = build_app(settings)
    probe = app[SERVICES_KEY].components.probe
    assert probe is not None
    probe.tick_s = None  # ticks are driven and timed here
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    # Four busy streams: 40 s of media each (fits full), ten viewers reporting playout.
    t0 = time.time_ns() - 40 * S
    for s in range(4):
        name = f"stream{s}"
        probe.relay.streams.get_or_create(name)
        for i in range(40 * VIDEO_FPS):
            probe.publisher_packet(name, "pub", PacketInfo(
                "video", 7, i, i * 3000, True, False, t0 + i * S // VIDEO_FPS + (i % 5) * MS,
                90000, {}))
        for i in range(40 * AUDIO_PER_S):
            probe.publisher_packet(name, "pub", PacketInfo(
                "audio", 8, i, i * 960, True, False, t0 + i * S // AUDIO_PER_S, 48000, {}))
        for v in range(10):
            probe.on_playout(name, f"{name}-v{v}", Playout(
                stream=name, t_ns=0, frames=60, av_skew_ms=v - 5.0, captions=1,
                caption_error_ms=8.0 + v, resyncs=0))

    rows = []
    for dashboards in (0, 20):
        client = None
        if dashboards:
            client = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--dashboards", str(port), str(dashboards),
                str(ticks * tick_s + 3), stdout=asyncio.subprocess.PIPE)
            for _ in range(200):
                if len(probe.hub.dashboards) == dashboards:
                    break
                await asyncio.sleep(0.02)
        tick_cpu, loop_cpu, sizes = [], [], []
        for _ in range(ticks):
            c0 = time.process_time_ns()
            text_len = len(json.dumps(probe.tick(time.time_ns()), separators=(",", ":")))
            c1 = time.process_time_ns()
            await asyncio.sleep(tick_s)  # the sends, and everything else the app does
            c2 = time.process_time_ns()
            tick_cpu.append(c1 - c0)
            loop_cpu.append(c2 - c0)
            sizes.append(text_len)
        received = None
        if client is not None:
            out, _ = await asyncio.wait_for(client.communicate(), 60)
            received = json.loads(out.decode().strip().splitlines()[-1])
        rows.append({"dashboards": dashboards, "tick_us": statistics.median(tick_cpu) / 1e3,
                     "per_tick_us": statistics.median(loop_cpu) / 1e3,
                     "bytes": statistics.median(sizes), "received": received,
                     "pushes": probe.hub.pushes, "skipped": probe.hub.skipped})
    await runner.cleanup()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="media per packet run")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ticks", type=int, default=30)
    parser.add_argument("--dashboards", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dashboards:
        port, count, seconds = args.dashboards
        run_dashboards(int(port), int(count), float(seconds))
        return 0
    os.environ.setdefault("PYTHONHASHSEED", "0")
    rows = packet_table(args.seconds, args.rounds)
    print(f"\nPer publisher packet ({rows[0]['packets']} packets: {VIDEO_FPS} fps VP8 x "
          f"{VIDEO_PACKETS} + {AUDIO_PER_S}/s Opus; best of {args.rounds} rounds)\n")
    print("| viewers | relay ns/pkt | probe ns/pkt | probe tick ns/pkt | probe / relay "
          "| relay+probe - relay |")
    print("|--------:|-------------:|-------------:|------------------:|--------------:"
          "|--------------------:|")
    for r in rows:
        print(f"| {r['viewers']:7d} | {r['relay_ns']:12.0f} | {r['probe_ns']:12.0f} "
              f"| {r['tick_ns']:17.1f} | {r['overhead_pct']:12.1f} % "
              f"| {r['difference_pct']:18.1f} % |")
    push = asyncio.run(dashboard_push(args.ticks, 0.1))
    print(f"\nDashboard push (4 streams, 10 viewers each; {args.ticks} ticks; server CPU)\n")
    print("| dashboards | tick (build + serialise + queue) µs | CPU per tick µs | tick bytes "
          "| received |")
    print("|-----------:|-----------------------------------:|----------------:|-----------:"
          "|---------:|")
    for r in push:
        got = r["received"]["messages"] if r["received"] else 0
        print(f"| {r['dashboards']:10d} | {r['tick_us']:34.0f} | {r['per_tick_us']:15.0f} "
              f"| {r['bytes']:10.0f} | {got:8d} |")
    if len(push) == 2:
        extra = push[1]["per_tick_us"] - push[0]["per_tick_us"]
        print(f"\n20 dashboards add {extra:.0f} µs of server CPU per tick "
              f"({extra / 20:.0f} µs per dashboard; {extra / 1e4:.2f} % of a core at one tick "
              "a second)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
