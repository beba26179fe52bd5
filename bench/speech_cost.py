"""What listening for speech costs: per audio track, beside the relay's own per-stream cost.

    flock /tmp/sfu-sidecar-bench.lock .venv/bin/python bench/speech_cost.py

1. In process, on real Opus packets (espeak-ng sentences with pauses, encoded as a WebRTC
   publisher does, 20 ms frames): the speech service's whole path per packet (queue, decode,
   voice activity detection, onset refinement, segment matching), as % of one core at real
   time. The best of several rounds: the least disturbed one is the cost.
2. The whole product in its own process (``build_app``, as deployed), one publisher process
   sending 30 fps VP8 + the same speech as Opus over WHIP, and 0 or 4 WHEP viewer processes
   that count packets without decoding: the server's CPU with ``speech_detect`` off and on,
   alternated round by round. The median difference is what listening costs in place; the
   per-viewer cost (the 4-viewer minus the 0-viewer CPU, divided by 4) must not move.

Prints one table; machines are noisy, so compare the ratios and medians, not single rows.
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

FANOUT = ROOT / "bench" / "relay_fanout.py"  # its viewer processes count without decoding
LOOPBACK = ("127.0.0.1",)
S = 1_000_000_000


def talk() -> Any:
    from tests.support import speech

    parts = [(voice, 160, speech.sentences_for(voice)[i]) for i in range(3)
             for voice in speech.VOICES]
    return speech.compose(parts, (0.8, 1.3, 0.6, 1.1, 1.4))


# --- 1. in process ----------------------------------------------------------------------------


def in_process(rounds: int) -> dict[str, float]:
    """% of one core per audio track for the speech service's work, best of ``rounds``."""
    from sfu_sidecar.relay.hooks import PacketInfo
    from sfu_sidecar.speech.decode import OpusDecoder
    from sfu_sidecar.speech.detector import SpeechDetector
    from sfu_sidecar.speech.lag import CaptionLagMeter
    from sfu_sidecar.speech.vad import make_vad
    from tests.support import speech

    truth = talk()
    payloads = speech.opus_packets(truth.pcm)
    audio_s = len(payloads) * 0.02
    t0 = time.time_ns()
    infos = [PacketInfo("audio", 1, i & 0xFFFF, (i * 960) & 0xFFFFFFFF, False, False,
                        t0 + i * 20_000_000, 48000, {}, p) for i, p in enumerate(payloads)]
    best = {"decode": float("inf"), "total": float("inf")}
    for _ in range(rounds):
        decoder = OpusDecoder()
        started = time.process_time()
        for info in infos:
            decoder.decode(info.payload)
        best["decode"] = min(best["decode"], time.process_time() - started)
        decoder = OpusDecoder()
        detector = SpeechDetector(48000, make_vad(48000))
        meter = CaptionLagMeter()
        started = time.process_time()
        for n, info in enumerate(infos):
            pcm = decoder.decode(info.payload)
            if pcm is not None and len(pcm):
                for segment in detector.push(pcm, info.arrival_ns - decoder.delay_ns):
                    meter.add_speech(segment)
            if n % 10 == 9:  # the service settles once a tick (10 packets at 0.2 s)
                until = detector.heard_until_ns
                if until is not None:
                    meter.settle(until, open_onset_ns=detector.open_onset_ns)
        best["total"] = min(best["total"], time.process_time() - started)
    return {"audio_s": audio_s, "decode_pct": 100 * best["decode"] / audio_s,
            "total_pct": 100 * best["total"] / audio_s}


# --- 2. the whole product -----------------------------------------------------------------------


def run_server(port: int, speech_detect: str) -> None:
    from aiohttp import web

    from sfu_sidecar.app import build_app
    from sfu_sidecar.config import load_settings

    settings = load_settings({"ice_addresses": "127.0.0.1", "publisher_timeout_s": "600",
                              "speech_detect": speech_detect,
                              "data_dir": tempfile.mkdtemp(prefix="sfu-sidecar-bench-")})
    mark = [time.process_time(), time.monotonic()]

    async def stats(request: web.Request) -> web.Response:
        now_cpu, now_wall = time.process_time(), time.monotonic()
        cpu = (now_cpu - mark[0]) / max(now_wall - mark[1], 1e-9)
        mark[:] = [now_cpu, now_wall]
        return web.json_response({"cpu": cpu})

    app = build_app(settings)
    app.router.add_get("/bench/stats", stats)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def run_publisher(url: str) -> None:
    from sfu_sidecar.client.whip import publish
    from sfu_sidecar.synthetic import FlashVideoTrack, PcmAudioTrack, Timeline

    truth = talk()

    async def main() -> None:
        timeline = Timeline.starting_now(time.time_ns)
        session = await publish(url, [PcmAudioTrack(timeline, truth.pcm, loop=True),
                                      FlashVideoTrack(timeline)],
                                capture_start_ns=timeline.start_house_ns,
                                ice_addresses=LOOPBACK)
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await session.close()

    asyncio.run(main())


def _sub(*args: str, script: Path = Path(__file__),
         stdin: int | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(script), *args], cwd=ROOT, text=True,
                            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def _get(url: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        data: dict[str, Any] = json.load(resp)
        return data


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def whole(speech_detect: str, viewers: int, seconds: float) -> float:
    """The server's CPU (% of one core) over ``seconds`` with one publisher and ``viewers``."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    server = _sub("server", str(port), speech_detect)
    publisher = None
    try:
        for _ in range(100):
            try:
                _get(base + "/bench/stats")
                break
            except OSError:
                time.sleep(0.1)
        publisher = _sub("publisher", base + "/whip/bench", stdin=subprocess.PIPE)
        assert publisher.stdout is not None
        assert publisher.stdout.readline().strip() == "ready"
        start_at = time.time() + 4.0
        watchers = ([_sub("viewers", base + "/whep/bench", str(viewers), str(start_at),
                          str(seconds), script=FANOUT)] if viewers else [])
        time.sleep(max(0.0, start_at - time.time()))
        _get(base + "/bench/stats")  # opens the window
        time.sleep(seconds)
        cpu = _get(base + "/bench/stats")["cpu"] * 100
        for w in watchers:
            w.communicate(timeout=60)
        return float(cpu)
    finally:
        if publisher is not None and publisher.stdin is not None:
            publisher.stdin.close()
            try:
                publisher.wait(5)
            except subprocess.TimeoutExpired:
                publisher.kill()
        server.terminate()
        try:
            server.wait(5)
        except subprocess.TimeoutExpired:
            server.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", nargs="?", default="run")
    parser.add_argument("args", nargs="*")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    ns = parser.parse_args()
    if ns.role == "server":
        run_server(int(ns.args[0]), ns.args[1])
        return 0
    if ns.role == "publisher":
        run_publisher(ns.args[0])
        return 0
    started = time.monotonic()
    alone = in_process(ns.rounds)
    cpu: dict[tuple[str, int], list[float]] = {}
    for _ in range(ns.rounds):
        for viewers in (0, 4):
            for detect in ("false", "true"):
                cpu.setdefault((detect, viewers), []).append(whole(detect, viewers, ns.seconds))
    med = {k: statistics.median(v) for k, v in cpu.items()}
    print(f"speech_cost: {os.cpu_count()} CPUs, {time.monotonic() - started:.0f} s; in process "
          f"{alone['audio_s']:.0f} s of espeak-ng speech, best of {ns.rounds}; whole server "
          f"{ns.seconds:.0f} s per point, {ns.rounds} alternated rounds, medians")
    print("| what | % of one core |")
    print("|---|---|")
    print(f"| Opus decode alone, per audio track (in process) | {alone['decode_pct']:.2f} |")
    print(f"| speech service per audio track: decode + VAD + onsets + matching (in process) "
          f"| {alone['total_pct']:.2f} |")
    for viewers in (0, 4):
        off, on = med[("false", viewers)], med[("true", viewers)]
        print(f"| whole server, 1 stream (VP8 + Opus), {viewers} viewers: speech_detect off / on"
              f" | {off:.1f} / {on:.1f} (difference {on - off:+.1f}, ratio {on / off:.3f}) |")
    for detect in ("false", "true"):
        per_viewer = (med[(detect, 4)] - med[(detect, 0)]) / 4
        print(f"| per viewer, speech_detect {'on' if detect == 'true' else 'off'} "
              f"| {per_viewer:.2f} |")
    print("rounds (off0, on0, off4, on4): " + json.dumps(
        {f"{d}/{v}": [round(x, 1) for x in xs] for (d, v), xs in cpu.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
