"""Speech heard through the relay and captions measured against it, end to end in one process:
the product's WHIP client publishes espeak-ng sentences (four voices, different lengths and
pauses; clean, and with pink noise 10 dB below the speech) with abs-capture-time and a clock
join; a caption producer posts the same sentences in six languages, each early or late by its
own amount. The sync route, /metrics and the alerts must report each language's lag as
injected, within the accuracy the product promises: ±20 ms at the median and ±40 ms at p95 of
the per-cue error (in the noise ±40 ms and ±100 ms). Then the failure shapes: silence, speech cut
off by the publisher leaving, payloads the decoder refuses."""

from __future__ import annotations

import asyncio
import random
import socket
import statistics
import struct
import subprocess
import time
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from sfu_sidecar.app import SERVICES_KEY, build_app
from sfu_sidecar.captions.events import Cue
from sfu_sidecar.client.whip import publish
from sfu_sidecar.config import load_settings
from sfu_sidecar.probe.service import ProbeService
from sfu_sidecar.synthetic import PcmAudioTrack, Timeline
from tests.conftest import IN_PROCESS
from tests.relay.peers import LOOPBACK, view, wait_for
from tests.relay.test_cascade import Node
from tests.relay.test_tap import running
from tests.support import speech
from tests.syncchannel.test_service import collect

pytestmark = [pytest.mark.needs("espeak-ng")]

STREAM = "talk"
# Lag injected per caption language (caption start minus the voice's onset).
OFFSETS_MS = {"en": -500, "de": -300, "fr": -100, "es": 0, "it": 150, "pt": 400}
MEDIAN_MS = 20.0
P95_MS = 40.0
# Measured here: median 18.6 ms late, p95 71 ms (the first /h/ or /s/ of a sentence drowns).
NOISY_MEDIAN_MS = 40.0
NOISY_P95_MS = 100.0


def talk() -> speech.Speech:
    """Two sentences of each voice, alternating, with pauses of 0.6-1.4 s."""
    parts = [(voice, 160, speech.sentences_for(voice)[i])
             for i in range(2) for voice in speech.VOICES]
    return speech.compose(parts, (0.8, 1.3, 0.6, 1.1, 1.4))


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[str, ProbeService]]:
    settings = load_settings({"ice_addresses": "127.0.0.1", "data_dir": str(tmp_path),
                              **IN_PROCESS})
    app = build_app(settings)
    probe = app[SERVICES_KEY].components.probe
    assert probe is not None
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server()
    try:
        yield f"http://127.0.0.1:{srv.port}", probe
    finally:
        await srv.close()


async def _post_cues(http: aiohttp.ClientSession, base: str, lang: str, truth: speech.Speech,
                     start_ns: int, offset_ms: int) -> None:
    shift = offset_ms * 1_000_000
    cues = [{"id": f"s{i}", "start": onset + shift, "end": offset + shift, "text": text}
            for i, (onset, offset, text) in enumerate(zip(
                truth.onset_ns(start_ns), truth.offset_ns(start_ns), truth.texts, strict=True))]
    async with http.post(f"{base}/api/streams/{STREAM}/captions",
                         json={"timebase": "house_ns", "lang": lang, "cues": cues}) as r:
        assert r.status in (200, 201), await r.text()


async def _sync(http: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async with http.get(f"{base}/api/streams/{STREAM}/sync") as r:
        assert r.status == 200, await r.text()
        body: dict[str, Any] = await r.json()
        return body


# Clean speech, and speech with pink noise 10 dB below it (quiet first sounds drown: onsets
# come later, so the p95 the product holds there is wider).
@pytest.mark.needs("promtool")
@pytest.mark.parametrize(("noise", "median_ms", "p95_ms"),
                         [(None, MEDIAN_MS, P95_MS), ("pink", NOISY_MEDIAN_MS, NOISY_P95_MS)],
                         ids=["clean", "pink-10dB"])
async def test_each_languages_caption_lag_is_measured_against_the_voice(
    server: tuple[str, ProbeService], noise: str | None, median_ms: float, p95_ms: float,
) -> None:
    base, probe = server
    truth = talk() if noise is None else speech.mix(talk(), noise, 10.0)
    sentences = len(truth.onsets)
    # The speech starts a moment after the publisher connects, so its first onset is heard.
    timeline = Timeline(time.time_ns() + 1_500_000_000, time.monotonic() + 1.5)
    publisher = await publish(f"{base}/whip/{STREAM}", [PcmAudioTrack(timeline, truth.pcm)],
                              capture_start_ns=timeline.start_house_ns, ice_addresses=LOOPBACK)
    try:
        assert await publisher.joined() is not None
        async with aiohttp.ClientSession() as http:
            for lang, offset_ms in OFFSETS_MS.items():
                await _post_cues(http, base, lang, truth, timeline.start_house_ns, offset_ms)
            body: dict[str, Any] = {}

            async def all_settled() -> bool:
                nonlocal body
                body = await _sync(http, base)
                lag = body["caption_lag"]
                return set(lag) == set(OFFSETS_MS) and all(
                    r["matched"] + r["unmatched_cues"] + r["inside_speech"] >= sentences
                    for r in lag.values())

            deadline = time.monotonic() + truth.pcm.size / speech.RATE + 30
            while not await all_settled():
                assert time.monotonic() < deadline, body
                await asyncio.sleep(0.5)
            probe.tick(probe.now_ns())
            async with http.get(f"{base}/metrics") as r:
                metrics = await r.text()
            alerts = (await _sync(http, base))["alerts"]
    finally:
        await publisher.close()

    heard = body["speech"]
    assert heard["state"] == "listening" and not heard["estimated"], heard
    assert heard["segments_heard"] == sentences, heard
    assert heard["refused_packets"] == 0
    errors, missed, false = speech.score(
        truth, timeline.start_house_ns,
        [_Segment(on, off) for on, off in heard["segments"]])
    print(f"{noise or 'clean'}: onsets through the relay: |error| median "
          f"{statistics.median(map(abs, errors)):.1f} ms, worst {max(map(abs, errors)):.1f} ms; "
          f"missed {missed}, false {false}")
    assert (missed, false) == (0, 0)

    for lang, offset_ms in OFFSETS_MS.items():
        report = body["caption_lag"][lang]
        per_cue = [lag for _, lag in report["lags"]]
        cue_errors = sorted(abs(lag - offset_ms) for lag in per_cue)
        p95 = cue_errors[min(len(cue_errors) - 1, round(0.95 * (len(cue_errors) - 1)))]
        print(f"{lang}: injected {offset_ms:+d} ms, measured median {report['median_ms']:+.1f} "
              f"ms, p95 of |error| {p95:.1f} ms, {report['matched']} matched")
        assert report["matched"] == sentences, report
        assert (report["unmatched_cues"], report["unmatched_speech"]) == (0, 0), report
        assert abs(report["median_ms"] - offset_ms) <= median_ms, report
        assert p95 <= p95_ms, (lang, per_cue)
        assert f'caption_lag_median_seconds{{language="{lang}",stream="{STREAM}"}}' in metrics
    # Every family the caption lag adds passes Prometheus's own check.
    proc = await asyncio.to_thread(subprocess.run, ["promtool", "check", "metrics"],
                                   input=metrics, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc

    # Each alert names the stream's worst language: 500 ms early is past both levels.
    raised = {a["alert"]: a for a in alerts}
    assert set(raised) >= {"caption_lag", "caption_lag_bt1359"}, alerts
    for name in ("caption_lag", "caption_lag_bt1359"):
        assert raised[name]["detail"] == "language en", raised[name]
        assert abs(raised[name]["value"] - OFFSETS_MS["en"]) <= median_ms, raised[name]


async def test_silence_then_speech_cut_off_by_the_publisher_leaving(
    server: tuple[str, ProbeService],
) -> None:
    """Two seconds of silence (a cue posted over it has no speech to caption), then a sentence
    the publisher leaves in the middle of: the segment ends where the audio did, the state
    says the publisher ended, and no alert comes of one cue."""
    base, probe = server
    voice = speech.VOICES[0]
    said = speech.compose([(voice, 160, speech.sentences_for(voice)[2])], (1.0,), lead_s=2.0)
    onset, offset = said.onset_ns()[0], said.offset_ns()[0]
    cut_s = (onset + (offset - onset) // 2) / 1e9  # halfway through the sentence
    timeline = Timeline(time.time_ns() + 1_000_000_000, time.monotonic() + 1.0)
    publisher = await publish(f"{base}/whip/{STREAM}", [PcmAudioTrack(timeline, said.pcm)],
                              capture_start_ns=timeline.start_house_ns, ice_addresses=LOOPBACK)
    start = timeline.start_house_ns
    async with aiohttp.ClientSession() as http:
        # A viewer keeps the stream (and its figures) after the publisher leaves.
        viewer = await view(http, base, STREAM, kinds=("audio",))
        try:
            assert await publisher.joined() is not None
            cues = [{"id": "quiet", "start": start + 300_000_000, "end": start + 1_200_000_000,
                     "text": "(silence)"},
                    {"id": "cut", "start": start + onset, "end": start + offset, "text": "cut"}]
            async with http.post(f"{base}/api/streams/{STREAM}/captions",
                                 json={"timebase": "house_ns", "lang": "en", "cues": cues}) as r:
                assert r.status in (200, 201), await r.text()
            await asyncio.sleep(max(0.0, timeline.start_monotonic + cut_s - time.monotonic()))
        finally:
            await publisher.close()
        try:
            await wait_for(lambda: probe.speech is not None and STREAM in probe.speech.streams
                           and probe.speech.streams[STREAM].state == "publisher ended", 10,
                           "the speech state to say the publisher ended")
            body = await _sync(http, base)
        finally:
            await viewer.close()
    heard = body["speech"]
    print(f"segments {heard['segments']} (truth onset {start + onset}, cut at about "
          f"{start + round(cut_s * 1e9)})")
    assert heard["segments_heard"] == 1, heard
    (seg_onset, seg_offset), = heard["segments"]
    assert abs(seg_onset - (start + onset)) <= 20_000_000, heard
    # It ends where the audio stopped: after the onset, no later than the sentence would have.
    assert start + onset < seg_offset < start + offset, heard
    lag = body["caption_lag"]["en"]
    assert (lag["matched"], lag["unmatched_cues"]) == (1, 1), lag
    assert lag["recent_median_ms"] is None, lag  # one cue is no trend
    probe.tick(probe.now_ns())
    assert not [a for a in (await _alerts(base)) if a["alert"].startswith("caption_lag")]


async def test_payloads_the_decoder_refuses_are_counted_and_say_why(
    server: tuple[str, ProbeService],
) -> None:
    """An RTP tap declared Opus that carries something else: every payload is refused and
    counted, the state says why there is no figure, and nothing else stops."""
    base, _ = server
    async with aiohttp.ClientSession() as http:
        tap_body = {"stream": STREAM, "source": "127.0.0.1",
                    "media": [{"kind": "audio", "codec": "opus", "payload_type": 111}]}
        async with http.post(f"{base}/api/taps", json=tap_body) as r:
            assert r.status == 201, await r.text()
            tap = await r.json()
        port = tap["media"][0]["rtp_port"]
        rng = random.Random(7)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            for n in range(60):
                # Opus TOC bytes of a reserved configuration and random bodies: libopus
                # refuses each (a payload of 1-2 bytes would be DTX, not refused).
                payload = bytes([0xFF, 0xFF]) + rng.randbytes(rng.randint(3, 60))
                header = bytes([0x80, 111]) + n.to_bytes(2, "big") + (n * 960).to_bytes(4, "big")
                sender.sendto(header + (0xABCD).to_bytes(4, "big") + payload,
                              ("127.0.0.1", port))
                await asyncio.sleep(0.02)
        body: dict[str, Any] = {}

        async def refused() -> bool:
            nonlocal body
            body = await _sync(http, base)
            return int(body["speech"].get("refused_packets", 0)) >= 50

        deadline = time.monotonic() + 10
        while not await refused():
            assert time.monotonic() < deadline, body
            await asyncio.sleep(0.3)
        async with http.get(f"{base}/healthz") as r:
            assert r.status == 200
    heard = body["speech"]
    print(f"speech state: {heard['state']}: {heard['reason']}")
    assert heard["state"] == "no audio" and "refused" in heard["reason"], heard
    assert heard["segments_heard"] == 0 and heard["decoded_packets"] == 0, heard


NTP_TO_UNIX_S = 2_208_988_800
# What the meter promises against a sender nobody here wrote: each language's median within
# 20 ms of the truth, every cue within 40 ms.
MEDIAN_MS, CUE_MS = 20.0, 40.0


class _Forwarder(asyncio.DatagramProtocol):
    """Passes a sender's datagrams on to ``target`` untouched, noting when the first came."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.first: tuple[int, bytes] | None = None  # (arrival house ns, datagram)
        self.transport: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.first is None:
            self.first = (time.time_ns(), data)
        self.transport.sendto(data, self.target)

    def sender_report(self) -> tuple[int, int] | None:
        """(NTP time as Unix ns, RTP timestamp) of the first RTCP sender report seen."""
        if self.first is None or len(self.first[1]) < 20 or self.first[1][1] != 200:
            return None
        seconds, fraction, rtp = struct.unpack("!IIII", self.first[1][8:24])[:3]
        return (seconds - NTP_TO_UNIX_S) * 1_000_000_000 + fraction * 1_000_000_000 // 2**32, rtp


@pytest.mark.needs("ffmpeg")
async def test_ffmpeg_speech_into_an_rtp_tap_is_heard_and_its_captions_measured(
    server: tuple[str, ProbeService], tmp_path: Path,
) -> None:
    """A sender nobody here wrote: ffmpeg sends the espeak-ng sentences (Ogg Opus it encoded
    with libopus) as RTP with its own sender reports into an RTP tap. The truth the captions
    (three languages) are placed against is ffmpeg's own: its first sender report (sent with
    its first packet) maps RTP time to its wall clock, and sample k of the speech has the RTP
    time of the first packet less that packet's pts (ffprobe) plus k."""
    base, _ = server
    offsets = {"en": -400, "de": 0, "fr": 150}
    # Speech after 5.5 s of silence: ffmpeg's first sender report (5 s) maps every sentence.
    said = speech.compose([(v, 160, speech.sentences_for(v)[i]) for i in range(2)
                           for v in speech.VOICES[:2]], (0.9, 1.3, 0.7), lead_s=5.5,
                           tail_s=4.0)
    wav, ogg = tmp_path / "talk.wav", tmp_path / "talk.ogg"
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(speech.RATE)
        w.writeframes(said.pcm.tobytes())
    await asyncio.to_thread(subprocess.run, [
        "ffmpeg", "-nostdin", "-loglevel", "error", "-i", str(wav), "-c:a", "libopus",
        "-application", "voip", "-frame_duration", "20", "-b:a", "32k", str(ogg)],
        check=True, timeout=60)
    probe_out = await asyncio.to_thread(subprocess.run, [
        "ffprobe", "-v", "error", "-select_streams", "a:0", "-show_entries", "packet=pts",
        "-read_intervals", "%+#1", "-of", "csv=p=0", str(ogg)],
        check=True, timeout=30, capture_output=True, text=True)
    # The first packet starts before sample 0 by libopus's pre-skip: its pts is negative.
    first_pts = int(probe_out.stdout.split()[0].rstrip(","))
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as http:
        # ffmpeg's reports are on this host's clock, which is the service's house clock here.
        tap_body = {"stream": STREAM, "source": "127.0.0.1", "sender_clock": "house",
                    "media": [{"kind": "audio", "codec": "opus", "payload_type": 111}]}
        async with http.post(f"{base}/api/taps", json=tap_body) as r:
            assert r.status == 201, await r.text()
            tap = await r.json()
        assert tap["sender_clock"] == "house"
        ports = tap["media"][0]
        rtp, forward = await loop.create_datagram_endpoint(
            lambda: _Forwarder(("127.0.0.1", ports["rtp_port"])), local_addr=("127.0.0.1", 0))
        rtcp, reports = await loop.create_datagram_endpoint(
            lambda: _Forwarder(("127.0.0.1", ports["rtcp_port"])), local_addr=("127.0.0.1", 0))
        rtp_port = rtp.get_extra_info("sockname")[1]
        rtcp_port = rtcp.get_extra_info("sockname")[1]
        cmd = ["ffmpeg", "-nostdin", "-loglevel", "error", "-re", "-i", str(ogg), "-c", "copy",
               "-payload_type", "111", "-f", "rtp",
               f"rtp://127.0.0.1:{rtp_port}?rtcpport={rtcp_port}&pkt_size=1200"]
        log = tmp_path / "ffmpeg.log"
        body: dict[str, Any] = {}
        try:
            with running(cmd, log):
                # Its first report goes out with its first packet, on another socket: either
                # may come first.
                await wait_for(lambda: reports.sender_report() is not None
                               and forward.first is not None, 10,
                               "ffmpeg's first sender report and packet")
                assert forward.first is not None
                sr = reports.sender_report()
                assert sr is not None
                first_ts = int.from_bytes(forward.first[1][4:8], "big")
                zero_ts = (first_ts - first_pts) & 0xFFFFFFFF  # RTP time of sample 0
                elapsed = ((sr[1] - zero_ts + 2**31) % 2**32) - 2**31
                start_ns = sr[0] - elapsed * 1_000_000_000 // speech.RATE
                for lang, offset_ms in offsets.items():
                    await _post_cues(http, base, lang, said, start_ns, offset_ms)
                deadline = time.monotonic() + said.pcm.size / speech.RATE + 30
                while True:
                    body = await _sync(http, base)
                    lag = body["caption_lag"]
                    if set(lag) == set(offsets) and all(
                            r["matched"] + r["unmatched_cues"] + r["inside_speech"]
                            >= len(said.onsets) for r in lag.values()):
                        break
                    assert time.monotonic() < deadline, (body, log.read_text())
                    await asyncio.sleep(0.5)
        finally:
            rtp.close()
            rtcp.close()
    heard = body["speech"]
    errors, missed, false = speech.score(said, start_ns,
                                         [_Segment(on, off) for on, off in heard["segments"]])
    print(f"ffmpeg (first pts {first_pts}): onsets against its sender report: errors "
          f"{[round(e, 1) for e in errors]} ms; missed {missed}, false {false}; "
          f"estimated {heard['estimated']}")
    assert (missed, false) == (0, 0), heard
    assert not heard["estimated"], heard  # mapped by ffmpeg's sender reports
    # The relay keeps ffmpeg's first report, which may come before its first packet, so the
    # second (5 s) maps every sentence. The rest of the error is libopus's lookahead: ffmpeg's
    # RTP time already allows for it (its first packet's pts is the pre-skip before sample 0),
    # where a WebRTC sender's does not, so the relay's allowance puts onsets 6.5 ms early.
    medians = {lang: body["caption_lag"][lang]["median_ms"] for lang in offsets}
    for lang, offset_ms in offsets.items():
        report = body["caption_lag"][lang]
        print(f"ffmpeg {lang}: injected {offset_ms:+d} ms, measured median "
              f"{report['median_ms']:+.1f} ms, per cue {[round(x) for _, x in report['lags']]}")
        assert report["matched"] == len(said.onsets), report
        assert abs(report["median_ms"] - offset_ms) <= MEDIAN_MS, report
        assert abs((medians[lang] - medians["de"]) - (offset_ms - offsets["de"])) <= 2.0
        assert all(abs(lag - offset_ms) <= CUE_MS for _, lag in report["lags"]), report


async def test_a_cascade_edge_hears_the_origins_speech_and_measures_its_captions(
    tmp_path: Path,
) -> None:
    """An edge relaying the origin's stream listens to the relayed audio on the origin's clock,
    and the captions posted at the origin (mirrored to the edge) are measured there too."""
    origin = Node(tmp_path / "origin", node_id="origin")
    edge = Node(tmp_path / "edge", node_id="edge", origin_url=origin.base)
    origin.start()
    edge.start()
    said = speech.compose([(v, 160, speech.sentences_for(v)[i]) for i in range(2)
                           for v in speech.VOICES[:2]], (0.9, 1.3, 0.7), lead_s=1.0, tail_s=4.0)
    offsets = {"en": -300, "de": 200}
    try:
        timeline = Timeline(time.time_ns() + 2_000_000_000, time.monotonic() + 2.0)
        publisher = await publish(f"{origin.base}/whip/{STREAM}",
                                  [PcmAudioTrack(timeline, said.pcm)],
                                  capture_start_ns=timeline.start_house_ns,
                                  ice_addresses=LOOPBACK)
        async with aiohttp.ClientSession() as http:
            viewer = await view(http, edge.base, STREAM, kinds=("audio",))  # the edge pulls
            try:
                assert await publisher.joined() is not None
                for lang, offset_ms in offsets.items():
                    await _post_cues(http, origin.base, lang, said, timeline.start_house_ns,
                                     offset_ms)
                deadline = time.monotonic() + said.pcm.size / speech.RATE + 30
                body: dict[str, Any] = {}
                while True:
                    body = await _sync(http, edge.base)
                    lag = body["caption_lag"]
                    if set(lag) == set(offsets) and all(
                            r["matched"] + r["unmatched_cues"] + r["inside_speech"]
                            >= len(said.onsets) for r in lag.values()):
                        break
                    assert time.monotonic() < deadline, (body, edge.log())
                    await asyncio.sleep(0.5)
            finally:
                await viewer.close()
                await publisher.close()
    finally:
        edge.stop()
        origin.stop()
    heard = body["speech"]
    errors, missed, false = speech.score(said, timeline.start_house_ns,
                                         [_Segment(on, off) for on, off in heard["segments"]])
    print(f"edge: onsets |error| {[round(abs(e), 1) for e in errors]} ms; "
          f"estimated {heard['estimated']}")
    assert (missed, false) == (0, 0) and not heard["estimated"], heard
    for lang, offset_ms in offsets.items():
        report = body["caption_lag"][lang]
        print(f"edge {lang}: injected {offset_ms:+d} ms, measured median "
              f"{report['median_ms']:+.1f} ms")
        assert report["matched"] == len(said.onsets), report
        assert abs(report["median_ms"] - offset_ms) <= MEDIAN_MS, report


SNAP_EARLY_MS = -300
SNAP_WITHIN_MS = 40.0


async def test_snap_moves_early_captions_onto_the_voice_for_viewers_and_keeps_fixed_ones(
    server: tuple[str, ProbeService],
) -> None:
    """With caption_align snap on the stream, captions posted 300 ms early are moved onto the
    speech they caption: stored with the shift and the author's times, pushed to a viewer's
    sync channel as they move; the cue marked fixed stays where its author put it, and the lag
    reported stays the author's."""
    base, probe = server
    assert probe.speech is not None and probe.speech.captions is not None
    captions = probe.speech.captions
    said = speech.compose([(v, 160, speech.sentences_for(v)[i]) for i in range(2)
                           for v in speech.VOICES[:2]], (0.9, 1.3, 0.7), lead_s=1.0, tail_s=4.0)
    fixed_id = "s1"
    async with aiohttp.ClientSession() as http:
        async with http.put(f"{base}/api/streams/{STREAM}/caption-align",
                            json={"mode": "snap"}) as r:
            assert r.status == 200, await r.text()
        async with http.put(f"{base}/api/streams/{STREAM}/caption-align",
                            json={"mode": "move"}) as r:
            assert r.status == 400 and "snap" in (await r.json())["error"]
        timeline = Timeline(time.time_ns() + 1_500_000_000, time.monotonic() + 1.5)
        start = timeline.start_house_ns
        publisher = await publish(f"{base}/whip/{STREAM}", [PcmAudioTrack(timeline, said.pcm)],
                                  capture_start_ns=start, ice_addresses=LOOPBACK)
        viewer = await view(http, base, STREAM, kinds=("audio",), data_channel="sync")
        records = collect(viewer)
        shift = SNAP_EARLY_MS * 1_000_000
        cues = [{"id": f"s{i}", "start": on + shift, "end": off + shift, "text": text,
                 **({"fixed": True} if f"s{i}" == fixed_id else {})}
                for i, (on, off, text) in enumerate(zip(said.onset_ns(start), said.offset_ns(start),
                                                        said.texts, strict=True))]
        try:
            assert await publisher.joined() is not None
            async with http.post(f"{base}/api/streams/{STREAM}/captions",
                                 json={"timebase": "house_ns", "lang": "en", "cues": cues}) as r:
                assert r.status in (200, 201), await r.text()
            deadline = time.monotonic() + said.pcm.size / speech.RATE + 30
            body: dict[str, Any] = {}
            while True:
                body = await _sync(http, base)
                align = body["caption_align"]
                if align["snapped"] + align["not_snapped"] >= len(cues):
                    break
                assert time.monotonic() < deadline, body
                await asyncio.sleep(0.5)
            async with http.get(f"{base}/api/streams/{STREAM}/captions") as r:
                feed = {c["id"]: c for c in (await r.json())["cues"]}
            await wait_for(lambda: sum(1 for c in records.controls if isinstance(c, Cue)
                                       and c.shift_ms) == len(cues) - 1, 5,
                           "the moved cues on the viewer's sync channel")
        finally:
            await viewer.close()
            await publisher.close()
    epoch = captions.epoch(STREAM)
    assert epoch is not None
    epoch_s = (start - epoch) / 1e9
    errors = []
    for i, onset in enumerate(said.onset_ns(start)):
        got = feed[f"s{i}"]
        true_start_s = (onset - start) / 1e9 + epoch_s
        if got["id"] == fixed_id:
            assert "aligned_ms" not in got and got["fixed"] is True, got
            assert abs(got["start"] - (true_start_s + SNAP_EARLY_MS / 1000)) <= 0.001, got
            continue
        errors.append((got["start"] - true_start_s) * 1000)
        assert abs(got["author_start"] - (true_start_s + SNAP_EARLY_MS / 1000)) <= 0.001, got
        assert abs(got["aligned_ms"] + SNAP_EARLY_MS) <= SNAP_WITHIN_MS, got
        assert abs((got["end"] - got["start"]) - (got["author_end"] - got["author_start"])) < 0.002
    print(f"snapped cues start {[round(e, 1) for e in errors]} ms from their onsets; "
          f"align {body['caption_align']}")
    assert all(abs(e) <= SNAP_WITHIN_MS for e in errors), errors
    assert (body["caption_align"]["snapped"], body["caption_align"]["not_snapped"]) == (
        len(cues) - 1, 1)
    # What the meter reports is the producer's lag, not the corrected one.
    assert abs(body["caption_lag"]["en"]["median_ms"] - SNAP_EARLY_MS) <= MEDIAN_MS


DUB_LATE_MS = 300
DUB_LATE_UTTERANCES = 4


async def test_a_dub_300_ms_behind_its_source_raises_its_alert_and_clears_once_fixed(
    server: tuple[str, ProbeService],
) -> None:
    """A dub stream declared to follow a source stream speaks the same sentences, the first
    four 300 ms after the source and the rest on time: each utterance's lag is reported within
    20 ms, dub_lag is raised while the dub is late and cleared once it is on time again."""
    base, _ = server
    parts = [(voice, 170, speech.sentences_for(voice)[i])
             for i in range(2) for voice in speech.VOICES]
    pauses = [1.0, 1.2, 0.9, 1.3, 1.0, 1.1, 0.9]
    source = speech.compose(parts, pauses)
    late_s = DUB_LATE_MS / 1000
    # The same sentences, the first ones moved later, then back on the source's time.
    dub_pauses = list(pauses)
    dub_pauses[DUB_LATE_UTTERANCES - 1] -= late_s
    dub = speech.compose(parts, dub_pauses, lead_s=0.5 + late_s)
    truth = [(d - s) / 1e6 for d, s in zip(dub.onset_ns(), source.onset_ns(), strict=True)]
    assert [round(t) for t in truth] == ([DUB_LATE_MS] * DUB_LATE_UTTERANCES
                                         + [0] * (len(parts) - DUB_LATE_UTTERANCES))
    async with aiohttp.ClientSession() as http:
        async with http.put(f"{base}/api/streams/talk-de/dub", json={"source": STREAM}) as r:
            assert r.status == 200, await r.text()
        async with http.put(f"{base}/api/streams/talk-de/dub", json={"source": "talk-de"}) as r:
            assert r.status == 400 and "itself" in (await r.json())["error"]
        async with http.get(f"{base}/api/streams/{STREAM}/dub") as r:
            assert r.status == 404
        timeline = Timeline(time.time_ns() + 1_500_000_000, time.monotonic() + 1.5)
        sessions = [await publish(f"{base}/whip/{name}", [PcmAudioTrack(timeline, said.pcm)],
                                  capture_start_ns=timeline.start_house_ns,
                                  ice_addresses=LOOPBACK)
                    for name, said in ((STREAM, source), ("talk-de", dub))]
        raised_at: int | None = None  # utterances matched when the alert was first seen
        cleared = False
        report: dict[str, Any] = {}
        try:
            deadline = time.monotonic() + source.pcm.size / speech.RATE + 30
            while True:
                report = (await _sync_of(http, base, "talk-de"))["dub"]
                active = {a["alert"] for a in await _alerts(base)}
                if "dub_lag" in active and raised_at is None:
                    raised_at = report["matched"]
                cleared = raised_at is not None and "dub_lag" not in active
                if report["matched"] >= len(parts) and cleared:
                    break
                assert time.monotonic() < deadline, (report, raised_at, active)
                await asyncio.sleep(0.25)
        finally:
            for session in sessions:
                await session.close()
    lags = [lag for _, lag in report["lags"]]
    print(f"dub lags {[round(x, 1) for x in lags]} (truth {[round(t) for t in truth]}); "
          f"dub_lag raised with {raised_at} utterances matched, cleared after "
          f"{report['matched']}")
    assert len(lags) == len(parts), report
    assert all(abs(lag - t) <= MEDIAN_MS for lag, t in zip(lags, truth, strict=True)), lags
    assert raised_at is not None and raised_at <= 2, raised_at  # on the second late one
    assert (report["unmatched_dub"], report["unmatched_source"]) == (0, 0), report
    events = [(e["alert"], e["state"]) for e in await _recent(base) if e["subject"] == "talk-de"]
    assert events == [("dub_lag", "raised"), ("dub_lag", "cleared")], events


async def _sync_of(http: aiohttp.ClientSession, base: str, stream: str) -> dict[str, Any]:
    async with http.get(f"{base}/api/streams/{stream}/sync") as r:
        assert r.status == 200, await r.text()
        body: dict[str, Any] = await r.json()
        return body


async def _recent(base: str) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(f"{base}/api/alerts") as r:
        body: dict[str, Any] = await r.json()
        return list(body["recent"])


async def _alerts(base: str) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(f"{base}/api/alerts") as r:
        body: dict[str, Any] = await r.json()
        return list(body["active"])


class _Segment:
    def __init__(self, onset_ns: int, offset_ns: int) -> None:
        self.onset_ns = onset_ns
        self.offset_ns = offset_ns
