"""The probe component in the whole app: relay hooks, routes, alerts, dashboard push, /metrics.

The end-to-end test runs a real aiortc publisher (the synthetic source, joined to the house
clock) and a real aiortc viewer through the relay; the others drive the probe through the same
hooks the relay calls, with packets and reports whose timing the test chooses.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from sfu_sidecar.app import SERVICES_KEY, build_app
from sfu_sidecar.client.whip import publish
from sfu_sidecar.config import load_settings
from sfu_sidecar.probe.alerts import RULES
from sfu_sidecar.probe.service import (
    SPEECH_RULE_NAMES,
    ProbeService,
    clock_alert_values,
    histogram_counts,
    most_out_of_band,
    viewers_over_bound,
)
from sfu_sidecar.relay.hooks import PacketInfo
from sfu_sidecar.sync.wire import ControlMessage, Playout
from sfu_sidecar.synthetic import BeepAudioTrack, FlashVideoTrack, Timeline
from tests.conftest import IN_PROCESS
from tests.relay.peers import LOOPBACK, view, wait_for

MS = 1_000_000
S = 1_000_000_000
TOKEN = "pub-secret"


class App:
    def __init__(self, base: str, probe: ProbeService, http: aiohttp.ClientSession) -> None:
        self.base = base
        self.probe = probe
        self.http = http

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.http.get(self.base + path) as resp:
            return resp.status, await resp.json()


async def start_app(tmp_path: Path, *, ticking: bool, **flags: str) -> AsyncIterator[App]:
    settings = load_settings({**IN_PROCESS, "ice_addresses": "127.0.0.1", "data_dir": str(tmp_path),
                              "publish_token": TOKEN, **flags})
    application = build_app(settings)
    probe = application[SERVICES_KEY].components.probe
    assert probe is not None
    if not ticking:
        probe.tick_s = None  # the test calls tick() with the times it chooses
    server = TestServer(application, host="127.0.0.1")
    await server.start_server()
    async with aiohttp.ClientSession() as http:
        try:
            yield App(f"http://127.0.0.1:{server.port}", probe, http)
        finally:
            await server.close()


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[App]:
    async for a in start_app(tmp_path, ticking=False):
        yield a


@pytest.fixture
async def ticking_app(tmp_path: Path) -> AsyncIterator[App]:
    async for a in start_app(tmp_path, ticking=True):
        yield a


def packet(kind: str, seq: int, ts: int, arrival_ns: int, ssrc: int = 11) -> PacketInfo:
    rate = 90000 if kind == "video" else 48000
    return PacketInfo(kind, ssrc, seq & 0xFFFF, ts & 0xFFFFFFFF, True, False, arrival_ns, rate, {})


def playout(stream: str = "live", **fields: Any) -> Playout:
    base: dict[str, Any] = {"stream": stream, "t_ns": 0, "frames": 0, "av_skew_ms": 0.0,
                            "captions": 0, "caption_error_ms": 0.0, "resyncs": 0}
    base.update(fields)
    return Playout(**base)


def metric_families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(families: dict[str, Any], name: str, **labels: str) -> float:
    for family in families.values():
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise AssertionError(f"no sample {name} {labels}")


async def test_live_publisher_and_viewer_feed_every_statistic(app: App) -> None:
    timeline = Timeline.starting_now(time.time_ns)
    publisher = await publish(
        f"{app.base}/whip/live", [BeepAudioTrack(timeline), FlashVideoTrack(timeline)],
        token=TOKEN, capture_start_ns=timeline.start_house_ns, ice_addresses=LOOPBACK,
    )
    viewer = await view(app.http, app.base, "live", data_channel="sync")
    try:
        assert await publisher.joined() is not None
        probe = app.probe

        def ready() -> bool:
            sp = probe.streams.get("live")
            if sp is None or set(sp.track_stats) != {"audio", "video"}:
                return False
            models = [t.fit.model() for t in sp.track_stats.values()]
            viewers = list(sp.viewers.values())
            return (all(m is not None and m.basis == "house" for m in models)
                    and bool(viewers) and "video" in viewers[0].rr_jitter_ms)

        await wait_for(ready, 20, "fits on house time and a viewer receiver report")
        await wait_for(lambda: viewer.channel.readyState == "open", 5, "the sync channel")
        viewer.channel.send(ControlMessage(playout(
            t_ns=time.time_ns(), frames=25, av_skew_ms=-12.5, captions=1,
            caption_error_ms=16.0, resyncs=1)).serialize())
        await wait_for(lambda: probe.streams["live"].resyncs == 1, 5, "the playout report")
        # The viewer's sync channel, as the backlog alert sees it: open and nearly empty.
        ((stream, waiting, bound),) = probe.channel_backlogs()
        assert stream == "live" and 0 <= waiting < bound == 16 * 1024

        status, body = await app.get("/api/streams/live/sync")
        assert status == 200
        assert body["publisher"]["state"] == "connected"
        video, audio = body["tracks"]["video"], body["tracks"]["audio"]
        assert video["clock_rate"] == 90000 and audio["clock_rate"] == 48000
        assert video["frames"] > 30 and audio["frames"] > 50
        assert video["jitter"]["grade"] in ("good", "fair", "poor")
        assert video["frame_interval"]["rms_ms"] is not None
        assert video["discontinuities"]["total"] == 0
        assert video["bitrate_bps"] > 0
        # Publisher and relay share this host's clock: no drift beyond a loaded machine's noise,
        # and capture precedes arrival.
        assert video["clock"]["basis"] == "house"
        assert abs(video["clock"]["rate_error_ppm"]) < 2000
        assert video["clock"]["offset_ms"] < 0
        assert body["publisher_av_skew_ms"] is not None
        assert abs(body["publisher_av_skew_ms"]) < 200
        summary = body["viewers"]
        assert summary["viewers"] == 1 and summary["reporting"] == 1
        assert summary["av_skew_ms"] == {"median": -12.5, "min": -12.5, "max": -12.5}
        assert summary["caption_error_ms"]["median"] == 16.0
        assert "video" in summary["rr_jitter_ms"]
        assert body["viewer_list"][0]["resyncs"] == 1
        assert body["caption_error_ms_recent"] == [16.0]

        async with app.http.get(app.base + "/metrics") as resp:
            families = metric_families(await resp.text())
        assert sample(families, "sfu_sidecar_stream_bytes_received_total",
                      stream="live", kind="video") > 0
        assert sample(families, "sfu_sidecar_probe_frame_interval_deviation_seconds_count",
                      stream="live", kind="video") > 30
        assert sample(families, "sfu_sidecar_probe_viewer_av_skew_seconds_count",
                      stream="live") == 1
        assert sample(families, "sfu_sidecar_probe_viewer_av_skew_seconds_bucket",
                      stream="live", le="-0.015") == 0
        assert sample(families, "sfu_sidecar_probe_viewer_av_skew_seconds_bucket",
                      stream="live", le="0.0") == 1
        assert sample(families, "sfu_sidecar_probe_viewer_resyncs_total", stream="live") == 1
        assert sample(families, "sfu_sidecar_probe_viewer_jitter_seconds",
                      stream="live", kind="video") >= 0
    finally:
        await viewer.close()
        await publisher.close()


def start_stream(probe: ProbeService, name: str = "live") -> None:
    probe.relay.streams.get_or_create(name)  # the relay's stream, without sessions


async def test_discontinuity_alert_raises_and_clears(app: App) -> None:
    probe = app.probe
    start_stream(probe)
    t0 = time.time_ns()
    for i in range(10):
        probe.publisher_packet("live", "pub-a", packet("video", i, i * 3000, t0 + i * 33 * MS))
    probe.tick(t0 + S)
    assert not probe.alerts.is_active("discontinuity", "live")
    # The publisher reconnects: a new session, new SSRC, new timestamps.
    probe.publisher_packet("live", "pub-b", packet("video", 500, 77, t0 + 2 * S, ssrc=99))
    tick = probe.tick(t0 + 2 * S)
    assert probe.alerts.is_active("discontinuity", "live")
    assert [(e["alert"], e["state"]) for e in tick["events"]] == [("discontinuity", "raised")]
    assert tick["streams"]["live"]["tracks"]["video"]["discontinuities"] == 1
    tick = probe.tick(t0 + 13 * S)
    assert [(e["alert"], e["state"]) for e in tick["events"]] == [("discontinuity", "cleared")]
    status, body = await app.get("/api/alerts")
    assert status == 200 and body["active"] == []
    assert [(e["alert"], e["state"], e["subject"]) for e in body["recent"]] == [
        ("discontinuity", "raised", "live"), ("discontinuity", "cleared", "live")]
    assert {r["alert"] for r in body["rules"]} == {*RULES, *SPEECH_RULE_NAMES}


async def test_frame_jitter_alert_follows_the_video(app: App) -> None:
    probe = app.probe
    start_stream(probe)
    t0 = time.time_ns()
    # Frame gaps stray +200 and -30 ms from the 33.3 ms the timestamps announce, alternately:
    # RMS sqrt((200**2 + 30**2) / 2) = 143 ms, past the 112 ms line.
    arrival = t0
    for i in range(80):
        arrival += 33_333_333 + (200 * MS if i % 2 else -30 * MS)
        probe.publisher_packet("live", "pub", packet("video", i, i * 3000, arrival))
    rms = probe.streams["live"].track_stats["video"].frame_jitter_rms_ms
    assert rms == pytest.approx(((200**2 + 30**2) / 2) ** 0.5, abs=0.01)
    probe.tick(arrival)
    assert not probe.alerts.is_active("frame_jitter", "live")  # not yet for 1 s
    probe.tick(arrival + S)
    assert probe.alerts.is_active("frame_jitter", "live")
    # The publisher stops: its old figures do not keep the alert up.
    tick = probe.tick(arrival + 6 * S)
    assert not probe.alerts.is_active("frame_jitter", "live")
    assert ("frame_jitter", "cleared") in [(e["alert"], e["state"]) for e in tick["events"]]


async def test_lip_sync_alerts_from_viewer_reports(app: App) -> None:
    probe = app.probe
    start_stream(probe)
    now = time.time_ns()
    assert probe.on_playout("live", "v1", playout(frames=30, av_skew_ms=5.0))
    assert probe.on_playout("live", "v2", playout(frames=30, av_skew_ms=-60.0))
    probe.tick(now)
    probe.tick(now + 2 * S)
    assert probe.alerts.is_active("lip_sync_atsc", "live")  # -60 is past -45
    assert not probe.alerts.is_active("lip_sync_detectable", "live")  # but within -125
    active = next(a for a in probe.alerts.active() if a["alert"] == "lip_sync_atsc")
    assert active["value"] == -60.0 and active["detail"] == "1 of 2 reporting viewers outside"
    # A report for another stream, or with absurd values, is refused and counted.
    assert not probe.on_playout("live", "v1", playout(stream="other", frames=1))
    assert not probe.on_playout("live", "v1", playout(frames=-1))
    assert not probe.on_playout("live", "v1", playout(frames=1, av_skew_ms=1e9))
    assert probe.bad_inputs == {"playout": 3}


async def test_clock_alerts_follow_the_house_clock_state(app: App) -> None:
    probe = app.probe
    assert probe.clock is not None
    now = time.time_ns()
    tick = probe.tick(now)
    # No source configured: free-running is this clock's normal state, not a lost source.
    assert tick["clock"]["state"] == "freerun" and tick["clock"]["sources"] == []
    assert not any(a["subject"] == "clock" for a in probe.alerts.active())


@pytest.mark.parametrize(("state", "sources", "raised"), [
    ("locked", ["ptp"], set()),
    ("acquiring", ["ptp", "ntp"], set()),
    ("slewing", ["ntp"], {"clock_slewing"}),
    ("holdover", ["ptp"], {"clock_holdover"}),
    ("freerun", ["ptp", "ntp"], {"clock_source_lost"}),
    ("freerun", [], set()),
])
def test_clock_states_map_to_their_alerts(state: str, sources: list[str],
                                          raised: set[str]) -> None:
    values = clock_alert_values(state, sources)
    assert set(values) == {"clock_source_lost", "clock_holdover", "clock_slewing"}
    assert {name for name, v in values.items() if RULES[name].bad(v)} == raised


async def test_viewer_backlog_alert_from_channel_backlogs(app: App) -> None:
    probe = app.probe
    start_stream(probe)
    start_stream(probe, "quiet")
    probe.on_playout("live", "v1", playout())
    probe.on_playout("quiet", "v2", playout())
    now = time.time_ns()
    assert probe.channel_backlogs() == []  # no viewer has a sync channel here
    rows = [("live", 40_000, 16_384), ("live", 100, 16_384), ("quiet", 16_384, 16_384)]
    assert viewers_over_bound(rows) == {"live": 1}
    probe.backlog_alerts(now, rows)
    probe.backlog_alerts(now + 2 * S, rows)
    assert probe.alerts.is_active("viewer_backlog", "live")
    assert not probe.alerts.is_active("viewer_backlog", "quiet")  # at the bound, not over
    active = next(a for a in probe.alerts.active() if a["alert"] == "viewer_backlog")
    assert active["detail"] == "1 viewers over their bound"
    probe.backlog_alerts(now + 3 * S, [])
    probe.backlog_alerts(now + 5 * S, [])
    assert not probe.alerts.is_active("viewer_backlog", "live")


GIB = 1 << 30


def gpu_report(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "renderer": "avatar-1", "stream": "live", "reserved_bytes": 10 * GIB,
        "allocated_bytes": 6 * GIB, "largest_free_block_bytes": 1 * GIB,
        "inactive_split_bytes": 3 * GIB, "alloc_retries": 0, "ooms": 0,
    }
    body.update(overrides)
    return body


async def test_gpu_report_route(app: App) -> None:
    url = app.base + "/api/gpu/report"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with app.http.post(url, json=gpu_report()) as resp:
        assert resp.status == 401
    async with app.http.post(url, json=gpu_report(), headers=auth) as resp:
        assert resp.status == 200
        body = await resp.json()
    assert body["fragmentation"] == 0.75 and body["renderer"] == "avatar-1"
    assert body["correlation"]["spikes"] == 1
    assert app.probe.alerts.is_active("gpu_fragmentation", "avatar-1")
    bad = [
        (b"{not json", "application/json", 400, "body is not JSON"),
        (b"\xff\xfe", "application/json", 400, "body is not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "application/json", 400, "body is not JSON"),
        (json.dumps(gpu_report(ooms=-1)).encode(), "application/json", 400, "ooms must be"),
        (json.dumps(gpu_report()).encode(), "text/plain", 415, "Content-Type text/plain"),
        (b"{}" + b" " * 300_000, "application/json", 413, "exceeds"),
    ]
    for data, ctype, status, reason in bad:
        async with app.http.post(url, data=data,
                                 headers={**auth, "Content-Type": ctype}) as resp:
            assert resp.status == status, (data[:20], await resp.text())
            assert reason in (await resp.json())["error"]
    assert app.probe.bad_inputs["gpu_report"] == len(bad)
    status, gpu = await app.get("/api/gpu")
    assert status == 200
    assert gpu["nvml"]["available"] in (True, False)
    assert gpu["renderers"][0]["fragmentation"] == 0.75
    assert gpu["renderers"][0]["history"][0][1] == 0.75


async def test_unknown_stream_is_404_and_bad_names_never_route(app: App) -> None:
    status, body = await app.get("/api/streams/nothere/sync")
    assert status == 404 and body == {"error": "no stream nothere"}
    status, body = await app.get("/api/streams/a%20b/sync")
    assert status == 404 and "error" in body


async def test_dashboard_push_starts_with_history_then_ticks(ticking_app: App) -> None:
    app = ticking_app
    probe = app.probe
    start_stream(probe)
    t0 = time.time_ns()
    for i in range(5):
        probe.publisher_packet("live", "pub", packet("video", i, i * 3600, t0 + i * 40 * MS))
    probe.tick(t0)
    async with app.http.ws_connect(app.base + "/api/dashboard/ws") as ws:
        hello = json.loads((await ws.receive(timeout=5)).data)
        assert hello["type"] == "hello"
        assert {r["alert"] for r in hello["rules"]} == {*RULES, *SPEECH_RULE_NAMES}
        assert hello["history"][-1]["streams"]["live"]["tracks"]["video"]["frame_rms_ms"] == 0.0
        # The component's own one-second tick reaches this dashboard.
        tick = json.loads((await ws.receive(timeout=5)).data)
        assert tick["type"] == "tick" and "live" in tick["streams"]
        assert probe.hub.pushes >= 1
    await wait_for(lambda: not probe.hub.dashboards, 5, "the dashboard to leave")


async def test_gpu_reports_without_a_token_come_only_from_this_host(tmp_path: Path) -> None:
    async for app in start_app(tmp_path, ticking=False, publish_token=""):
        url = app.base + "/api/gpu/report"
        async with app.http.post(url, json=gpu_report(),
                                 headers={"X-Forwarded-For": "203.0.113.9"}) as resp:
            assert resp.status == 403
            assert "publish_token" in (await resp.json())["error"]
        async with app.http.post(url, json=gpu_report()) as resp:
            assert resp.status == 200


async def test_a_dashboard_that_floods_its_socket_is_closed_1008(tmp_path: Path) -> None:
    async for app in start_app(tmp_path, ticking=False, ws_messages_per_s="0.01"):
        async with app.http.ws_connect(app.base + "/api/dashboard/ws") as ws:
            assert json.loads((await ws.receive(timeout=5)).data)["type"] == "hello"
            for _ in range(7):  # one allowed, five dropped, the sixth drop closes
                await ws.send_str("{}")
            msg = await ws.receive(timeout=5)
            assert msg.type == aiohttp.WSMsgType.CLOSE
            assert ws.close_code == 1008
        async with app.http.get(app.base + "/metrics") as resp:
            assert 'messages_dropped_total{channel="dashboard_ws"} 6.0' in await resp.text()


async def test_dashboard_page_and_its_vendored_plot_library_are_served(app: App) -> None:
    async with app.http.get(app.base + "/dashboard") as resp:
        assert resp.status == 200
        assert "text/html" in resp.headers["Content-Type"]
        assert '<script type="module" src="/js/dashboard.js">' in await resp.text()
    async with app.http.get(app.base + "/vendor/uPlot.esm.js") as resp:
        assert resp.status == 200
        text = await resp.text()
    assert "https://github.com/leeoniya/uPlot (v1.6.32)" in text
    assert text.rstrip().endswith("export { uPlot as default };")
    async with app.http.get(app.base + "/vendor/uPlot.LICENSE") as resp:
        assert "The MIT License" in await resp.text()


async def test_streams_are_forgotten_when_the_relay_drops_them(app: App) -> None:
    probe = app.probe
    t0 = time.time_ns()
    probe.publisher_packet("gone", "pub", packet("video", 1, 0, t0))
    probe.publisher_packet("gone", "pub", packet("video", 2, 3000, t0 + 33 * MS))
    assert probe.labels.peek("gone") == "gone"
    probe.tick(t0 + S)  # the relay has no stream "gone"
    assert "gone" not in probe.streams
    assert probe.labels.peek("gone") == "(other)"
    async with app.http.get(app.base + "/metrics") as resp:
        text = await resp.text()
    assert 'stream="gone"' not in text


@pytest.mark.needs("promtool")
async def test_metrics_parse_back_and_pass_promtool(app: App) -> None:
    probe = app.probe
    start_stream(probe)
    t0 = time.time_ns()
    for i in range(40):
        probe.publisher_packet("live", "pub", packet("video", i, i * 3000,
                                                     t0 + i * 33 * MS + (i % 3) * MS))
    probe.on_playout("live", "v1", playout(frames=10, av_skew_ms=20.0, captions=2,
                                           caption_error_ms=-3.0, resyncs=2))
    async with app.http.post(app.base + "/api/gpu/report", json=gpu_report(),
                             headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
        assert resp.status == 200
    probe.tick(t0 + 2 * S)
    async with app.http.get(app.base + "/metrics") as resp:
        text = await resp.text()
    families = metric_families(text)
    assert families["sfu_sidecar_probe_frame_interval_deviation_seconds"].type == "histogram"
    assert sample(families, "sfu_sidecar_probe_frame_interval_deviation_seconds_count",
                  stream="live", kind="video") == 39
    assert sample(families, "sfu_sidecar_probe_viewer_caption_error_seconds_bucket",
                  stream="live", le="0.0") == 1
    assert sample(families, "sfu_sidecar_probe_viewer_av_skew_seconds_bucket",
                  stream="live", le="0.015") == 0
    assert sample(families, "sfu_sidecar_probe_viewer_av_skew_seconds_bucket",
                  stream="live", le="0.045") == 1
    assert sample(families, "sfu_sidecar_probe_viewer_resyncs_total", stream="live") == 2
    assert sample(families, "sfu_sidecar_probe_discontinuities_total", stream="live",
                  kind="video", cause="ssrc_change") == 0
    assert sample(families, "sfu_sidecar_alert_active", alert="gpu_fragmentation",
                  stream="") == 1
    assert sample(families, "sfu_sidecar_alert_active", alert="frame_jitter",
                  stream="live") == 0
    assert sample(families, "sfu_sidecar_gpu_fragmentation_ratio", stream="live") == 0.75
    assert sample(families, "sfu_sidecar_gpu_available") in (0.0, 1.0)
    # Labels stay bounded: no viewer or renderer names, only streams, kinds and fixed sets.
    label_names = {k for f in families.values() for s in f.samples for k in s.labels}
    assert not label_names & {"viewer", "renderer", "pid", "ssrc"}
    assert "v1" not in text and "avatar-1" not in text

    promtool = shutil.which("promtool") or "promtool"
    proc = await asyncio.to_thread(subprocess.run, [promtool, "check", "metrics"], input=text,
                                   capture_output=True, text=True, timeout=30)
    problems = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert problems == [] and proc.returncode == 0, problems


def test_caption_error_bins_and_worst_viewer() -> None:
    edges = (-100.0, -50.0, -33.0, -17.0, 0.0, 17.0, 33.0, 50.0, 100.0, 250.0)
    assert histogram_counts([-200.0, -17.0, 0.0, 16.9, 17.0, 999.0], edges) == [
        1, 0, 0, 0, 1, 2, 1, 0, 0, 0, 1]
    rule = RULES["lip_sync_atsc"]
    # Against the clear band [-40, +10]: +20 is 10 out, -48 only 8.
    assert most_out_of_band([-48.0, 20.0, 0.0], rule) == 20.0
    assert most_out_of_band([], rule) is None
