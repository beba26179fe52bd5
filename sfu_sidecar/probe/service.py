"""The sync probe as a component: relay hooks in; statistics, alerts, metrics and pushes out.

Per publisher packet (the relay's publisher-level hook, after the sync component mapped it) one
:class:`~sfu_sidecar.probe.stats.TrackStats` update; per frame a histogram observation and, when
the sync component knows the frame's capture time on the house clock exactly, a point for the
publisher clock fit. Viewers' receiver reports arrive through the relay's report hook, their
playout and clock-join reports on their ``sync`` channel (the probe listens beside the sync
component). Once a second :meth:`ProbeService.tick` evaluates the alerts and pushes one snapshot
to every open dashboard; NVML is sampled every two seconds off the event loop.

Routes: ``GET /api/streams/{stream}/sync``, ``GET /api/alerts``, ``GET /api/gpu``,
``POST /api/gpu/report`` (publish token), ``GET /api/dashboard/ws`` and ``GET /dashboard``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sfu_sidecar import __version__, logs
from sfu_sidecar.clock.service import ClockService
from sfu_sidecar.config import Settings
from sfu_sidecar.exceptions import BadInput
from sfu_sidecar.limits import MessageLimiter
from sfu_sidecar.metrics import Metrics
from sfu_sidecar.probe import gpu, views
from sfu_sidecar.probe.alerts import (
    DISCONTINUITY_HOLD_NS,
    RULES,
    SPEECH_RULES,
    AlertEvent,
    Alerts,
    clock_alert_values,
    histogram_counts,
    most_out_of_band,
    viewers_over_bound,
)
from sfu_sidecar.probe.dashboard import MAX_MESSAGE_BYTES, DashboardHub
from sfu_sidecar.probe.exposition import ProbeCollector, ProbeHistograms, StreamLabels
from sfu_sidecar.probe.gpu import AllocatorReport, GpuSample, NvmlSampler, Renderers
from sfu_sidecar.probe.stats import BucketCounts, TrackStats, capture_skew_ms, round_or_none
from sfu_sidecar.probe.streams import StreamProbe
from sfu_sidecar.probe.viewers import ViewerStats, viewer_summary
from sfu_sidecar.relay.hooks import (
    DataChannel,
    PacketInfo,
    RelayObserver,
    RelayView,
    ReportBlock,
    ViewerHandle,
)
from sfu_sidecar.speech.service import SpeechService
from sfu_sidecar.sync.wire import ClockReport, ControlMessage, Playout, SyncWireError, parse_message
from sfu_sidecar.syncchannel.service import SyncService
from sfu_sidecar.tasks import Tasks

log = logs.get("probe")

TICK_S = 1.0
GPU_INTERVAL_S = 2.0
HOUSE_BASIS = "house"
CHANNEL_LABEL = "sync"
# A viewer's last playout report counts for lip sync this long; a renderer's report for
# fragmentation alerts this long.
VIEWER_STALE_NS = 30_000_000_000
RENDERER_STALE_NS = 60_000_000_000
CAPTION_ERROR_EDGES_MS = (-100.0, -50.0, -33.0, -17.0, 0.0, 17.0, 33.0, 50.0, 100.0, 250.0)
VIEWER_LIST_MAX = 100
# A playout report is a person's browser talking: values past these are garbage, not playout.
MAX_REPORT_COUNT = 1_000_000
MAX_SKEW_MS = 60_000.0
MAX_CAPTION_ERROR_MS = 3_600_000.0
PUBLISHER_RULES = ("frame_jitter", "bursty_delivery")
CAPTION_LAG_RULES = ("caption_lag", "caption_lag_bt1359")
SPEECH_RULE_NAMES = (*CAPTION_LAG_RULES, "dub_lag")
PUBLISHER_STALE_NS = 5_000_000_000
DEFAULT_CLOCK_RATES = {"audio": 48000, "video": 90000}


class ProbeService(RelayObserver):
    """Component: timing statistics, alerts, GPU telemetry and the operator dashboard."""

    name = "probe"

    def __init__(
        self,
        settings: Settings,
        relay: RelayView,
        metrics: Metrics,
        *,
        now_ns: Callable[[], int],
        sync: SyncService | None = None,
        clock: ClockService | None = None,
        speech: SpeechService | None = None,
        nvml_loader: Callable[[], Any] = gpu.import_nvml,
    ) -> None:
        self.settings = settings
        self.relay = relay
        self.now_ns = now_ns
        self.sync = sync
        self.clock = clock
        self.speech = speech
        self.streams: dict[str, StreamProbe] = {}
        self.labels = StreamLabels()
        # The caption lag alerts exist where something measures caption lag.
        self.alerts = Alerts(RULES if speech is None else {
            **RULES, **{name: SPEECH_RULES[name] for name in SPEECH_RULE_NAMES}})
        self.renderers = Renderers()
        self.nvml = NvmlSampler(nvml_loader)
        self.gpu_sample = GpuSample(now_ns(), False, "not sampled yet")
        self.bad_inputs: dict[str, int] = {}
        self.histograms = ProbeHistograms(metrics)
        metrics.registry.register(ProbeCollector(self))
        self.hub = DashboardHub(
            self._hello,
            limiter=MessageLimiter("dashboard_ws", settings.ws_messages_per_s,
                                   metrics.messages_dropped, log),
            max_message_bytes=min(MAX_MESSAGE_BYTES, settings.ws_max_message_bytes),
        )
        # Seconds between automatic ticks; None leaves ticking to the owner (tests, benchmarks).
        self.tick_s: float | None = TICK_S
        self._events: list[AlertEvent] = []
        self._tasks = Tasks("probe", log)

    # --- component ------------------------------------------------------------------------

    async def start(self) -> None:
        self.relay.add_observer(self)
        if self.tick_s is not None:
            self._tasks.start("tick", self._tick_loop(self.tick_s))
        self._tasks.start("gpu", self._gpu_loop())

    async def stop(self) -> None:
        await self._tasks.stop()
        await self.hub.close()
        self.nvml.close()

    # --- relay hooks ------------------------------------------------------------------------

    def _stream(self, name: str) -> StreamProbe:
        sp = self.streams.get(name)
        if sp is None:
            sp = self.streams[name] = StreamProbe(name)
            self.labels(name)
        return sp

    def publisher_packet(
        self, stream: str, publisher_id: str, packet: PacketInfo
    ) -> Mapping[str, bytes] | None:
        # Per packet: keep this path to a lookup and one statistics update.
        sp = self.streams.get(stream)
        if sp is None:
            sp = self._stream(stream)
        track = sp.track_stats.get(packet.kind)
        if track is None or track.clock_rate != packet.clock_rate:
            track = sp.track_stats[packet.kind] = TrackStats(packet.kind, packet.clock_rate)
        if track.on_packet(publisher_id, packet.ssrc, packet.sequence_number, packet.timestamp,
                           packet.arrival_ns):
            self._frame(sp, track, packet)
        return None

    def _frame(self, sp: StreamProbe, track: TrackStats, packet: PacketInfo) -> None:
        deviation = track.last_deviation_ms
        if deviation is not None:
            counts = sp.deviation.get(packet.kind)
            if counts is None:
                counts = sp.deviation[packet.kind] = BucketCounts()
            counts.observe(abs(deviation) / 1000.0)
        if track.candidate:
            track.on_frame_capture(packet.arrival_ns, self._house_capture(sp.name, packet),
                                   HOUSE_BASIS)

    def _house_capture(self, stream: str, packet: PacketInfo) -> int | None:
        """The frame's capture time on the house clock when the sync component knows it exactly
        (the publisher joined the house clock); None when it is estimated or unknown."""
        if self.sync is None:
            return None
        pub = self.sync.publishers.get(stream)
        last = pub.last.get(packet.kind) if pub is not None else None
        if last is None or last[0] != packet.ssrc or last[1] != packet.sequence_number:
            return None
        capture = last[2]
        return None if capture.estimated else capture.capture_ns

    def viewer_connected(self, viewer: ViewerHandle) -> None:
        self._viewer(viewer.stream_name, viewer.id)

    def viewer_closed(self, viewer: ViewerHandle) -> None:
        sp = self.streams.get(viewer.stream_name)
        if sp is not None:
            sp.viewers.pop(viewer.id, None)

    def _viewer(self, stream: str, viewer_id: str) -> ViewerStats:
        sp = self._stream(stream)
        vs = sp.viewers.get(viewer_id)
        if vs is None:
            vs = sp.viewers[viewer_id] = ViewerStats(stream)
        return vs

    def viewer_receiver_report(
        self, viewer: ViewerHandle, kind: str, report: ReportBlock
    ) -> None:
        output = viewer.outputs.get(kind)
        rate = output.clock_rate if output is not None else None
        if rate is None:
            rate = DEFAULT_CLOCK_RATES.get(kind)
        if rate:
            self._viewer(viewer.stream_name, viewer.id).on_receiver_report(
                kind, report.jitter, rate, report.fraction_lost)

    def viewer_data_channel(self, viewer: ViewerHandle, channel: DataChannel) -> None:
        if channel.label != CHANNEL_LABEL:
            return
        stream, viewer_id = viewer.stream_name, viewer.id
        channel.on_message(lambda data: self._viewer_message(stream, viewer_id, data))

    def _viewer_message(self, stream: str, viewer_id: str, data: Any) -> None:
        if isinstance(data, str):
            data = data.encode()
        try:
            message = parse_message(data)
        except SyncWireError:
            return  # the sync component counts and logs undecodable messages
        if not isinstance(message, ControlMessage):
            return
        control = message.message
        if isinstance(control, Playout):
            self.on_playout(stream, viewer_id, control)
        elif isinstance(control, ClockReport):
            self._viewer(stream, viewer_id).on_clock_report(control.error_ns)

    def on_playout(self, stream: str, viewer_id: str, report: Playout) -> bool:
        """One viewer's playout report; False (and counted) when it is not believable."""
        counts = (report.frames, report.captions, report.resyncs)
        if (report.stream != stream or not all(0 <= n <= MAX_REPORT_COUNT for n in counts)
                or abs(report.av_skew_ms) > MAX_SKEW_MS
                or abs(report.caption_error_ms) > MAX_CAPTION_ERROR_MS):
            self.bad_input("playout")
            log.info("playout report from viewer %s refused: %s", viewer_id[:8], report)
            return False
        sp = self._stream(stream)
        self._viewer(stream, viewer_id).on_playout(report, self.now_ns())
        sp.resyncs += report.resyncs
        label = self.labels.peek(stream)
        if report.frames > 0:
            self.histograms.av_skew.labels(label).observe(report.av_skew_ms / 1000.0)
        if report.captions > 0:
            self.histograms.caption_error.labels(label).observe(report.caption_error_ms / 1000)
            sp.caption_errors.append(report.caption_error_ms)
        return True

    def bad_input(self, kind: str) -> None:
        self.bad_inputs[kind] = self.bad_inputs.get(kind, 0) + 1

    # --- alerts -----------------------------------------------------------------------------

    def _update(self, name: str, subject: str, value: float | None, now_ns: int,
                detail: str = "") -> None:
        event = self.alerts.update(name, subject, value, now_ns, detail)
        if event is not None:
            self._emit(event)

    def _emit(self, event: AlertEvent) -> None:
        self._events.append(event)
        rule = self.alerts.rules[event.alert]
        extra = {"alert": event.alert, "subject": event.subject, "value": event.value}
        if event.state == "raised":
            log.warning("alert %s raised for %s: %s (now %.3f%s)", event.alert, event.subject,
                        event.summary, event.value, rule.unit, extra=extra)
        else:
            log.info("alert %s cleared for %s (now %.3f%s)", event.alert, event.subject,
                     event.value, rule.unit, extra=extra)

    def _stream_alerts(self, name: str, sp: StreamProbe, now: int) -> None:
        video = sp.track_stats.get("video")
        if video is not None and now - video.last_frame_ns < PUBLISHER_STALE_NS:
            self._update("frame_jitter", name, video.frame_jitter_rms_ms, now)
            self._update("bursty_delivery", name, video.kurtosis, now)
        else:  # no video coming: its figures describe the past, not a fault now
            for event in self.alerts.forget([name], now, PUBLISHER_RULES):
                self._emit(event)
        recent = max((t.last_discontinuity.arrival_ns for t in sp.track_stats.values()
                      if t.last_discontinuity is not None), default=None)
        fresh = recent is not None and now - recent < DISCONTINUITY_HOLD_NS
        self._update("discontinuity", name, 1.0 if fresh else 0.0, now)
        skews = [v.av_skew_ms for v in sp.viewers.values() if v.av_skew_ms is not None
                 and v.last_report_ns is not None and now - v.last_report_ns < VIEWER_STALE_NS]
        for rule_name in ("lip_sync_atsc", "lip_sync_detectable"):
            rule = self.alerts.rules[rule_name]
            worst = most_out_of_band(skews, rule)
            outside = sum(1 for s in skews if rule.bad(s))
            self._update(rule_name, name, worst, now,
                         f"{outside} of {len(skews)} reporting viewers outside")
        if self.speech is not None:
            self._caption_lag_alerts(name, self.speech, now)

    def _caption_lag_alerts(self, name: str, speech: SpeechService, now: int) -> None:
        """Each caption lag alert on the stream's worst language (median of its last cues)."""
        lags = {lang: r.recent_median_ms for lang, r in speech.reports(name).items()
                if r.recent_median_ms is not None}
        for rule_name in CAPTION_LAG_RULES:
            rule = self.alerts.rules[rule_name]
            worst = most_out_of_band(lags.values(), rule)
            langs = [lang for lang, v in lags.items() if v == worst]
            self._update(rule_name, name, worst, now,
                         f"language {langs[0]}" if langs else "")
        dub = speech.dub_report(name)
        if dub is not None:
            source, report = dub
            self._update("dub_lag", name, report.recent_median_ms, now, f"dub of {source}")

    def channel_backlogs(self) -> list[tuple[str, int, int]]:
        """(stream, bytes waiting, bound) of every viewer's sync channel."""
        if self.sync is None:
            return []
        rows = []
        for entry in list(self.sync.viewers.values()):
            channel = entry.channel
            rows.append((entry.session.stream_name,
                         channel.buffered_amount if channel is not None else 0,
                         entry.sync.batcher.max_buffered_bytes))
        return rows

    def backlog_alerts(self, now: int, rows: Iterable[tuple[str, int, int]]) -> None:
        """The viewer_backlog alert of each stream from :meth:`channel_backlogs` rows."""
        over = viewers_over_bound(rows)
        for name in self.streams:
            n = over.get(name, 0)
            self._update("viewer_backlog", name, 1.0 if n else 0.0, now,
                         f"{n} viewers over their bound" if n else "")

    def _clock_alerts(self, now: int) -> dict[str, Any] | None:
        if self.clock is None:
            return None
        status = self.clock.status()
        sources = list(self.clock.fused.sources)
        for name, value in clock_alert_values(status["state"], sources).items():
            self._update(name, "clock", value, now, f"sources: {', '.join(sources) or 'none'}")
        return {"source": status["source"], "state": status["state"],
                "offset_ns": status["offset_ns"], "error_ns": status["error_ns"],
                "sources": sources}

    def _gpu_alerts(self, sample: GpuSample, now: int) -> None:
        for d in sample.devices:
            self._update("gpu_memory", f"gpu{d.index}", d.used_pct, now, d.name)
        for state in self.renderers:
            last = state.history[-1].t_ns if state.history else 0
            if now - last > RENDERER_STALE_NS:
                for event in self.alerts.forget([state.report.renderer], now):
                    self._emit(event)

    # --- periodic ---------------------------------------------------------------------------

    def tick(self, now: int) -> dict[str, Any]:
        """Evaluate every alert and push one snapshot to the dashboards; returns it."""
        clock = self._clock_alerts(now)
        relayed = set(self.relay.stream_names())
        for name, sp in list(self.streams.items()):
            if name not in relayed and not sp.viewers:
                self._forget(name, now)
                continue
            self._stream_alerts(name, sp, now)
        self.backlog_alerts(now, self.channel_backlogs())
        self._gpu_alerts(self.gpu_sample, now)
        snapshot = self.snapshot(now, clock)
        self.hub.publish(snapshot)
        return snapshot

    def _forget(self, name: str, now: int) -> None:
        del self.streams[name]
        for event in self.alerts.forget([name], now):
            self._emit(event)
        label = self.labels.release(name)
        if label is not None and label not in {self.labels.peek(s) for s in self.streams}:
            self.histograms.drop(label)

    async def _tick_loop(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.tick(self.now_ns())
            except Exception:
                log.exception("probe tick failed")

    async def sample_gpu(self) -> GpuSample:
        sample = await asyncio.to_thread(self.nvml.sample, self.now_ns())
        if sample.available != self.gpu_sample.available or (
                sample.reason != self.gpu_sample.reason):
            log.info("GPU telemetry: %s", "available" if sample.available
                     else f"unavailable: {sample.reason}")
        self.gpu_sample = sample
        self._gpu_alerts(sample, sample.t_ns)
        return sample

    async def _gpu_loop(self) -> None:
        while True:
            try:
                await self.sample_gpu()
            except Exception:
                log.exception("GPU sample failed")
            await asyncio.sleep(GPU_INTERVAL_S)

    # --- views ------------------------------------------------------------------------------

    def _hello(self) -> dict[str, Any]:
        return {"version": __version__, "tick_s": TICK_S, "rules": self.alerts.catalogue(),
                "caption_error_edges_ms": list(CAPTION_ERROR_EDGES_MS)}

    def _publisher_skew(self, sp: StreamProbe, now: int) -> float | None:
        audio, video = sp.track_stats.get("audio"), sp.track_stats.get("video")
        if audio is None or video is None:
            return None
        return round_or_none(capture_skew_ms(audio.fit.model(), video.fit.model(), now))

    def _bitrates(self, name: str) -> dict[str, int]:
        relayed = self.relay.stream(name)
        if relayed is None or relayed.publisher is None:
            return {}
        return {kind: round(bps) for kind, bps in relayed.publisher.bitrates_bps().items()}

    def snapshot(self, now: int, clock: dict[str, Any] | None = None) -> dict[str, Any]:
        """One dashboard tick: every stream's figures, the clock, the GPUs, the alerts."""
        events, self._events = self._events, []
        streams = {}
        for name, sp in self.streams.items():
            relayed = self.relay.stream(name)
            tracks = {kind: views.track_figures(t) for kind, t in sp.track_stats.items()}
            summary = viewer_summary(sp.viewers.values())
            rr = summary["rr_jitter_ms"]
            assert isinstance(rr, dict)
            streams[name] = {
                "publisher": relayed is not None and relayed.publisher is not None,
                "viewers": relayed.viewer_count if relayed is not None else len(sp.viewers),
                "bitrate_bps": self._bitrates(name),
                "tracks": tracks,
                "publisher_av_skew_ms": self._publisher_skew(sp, now),
                "viewer_av_skew_ms": summary["av_skew_ms"],
                "viewer_av_skew_worst_ms": summary["av_skew_worst_ms"],
                "viewer_jitter_ms": {k: v["max"] for k, v in rr.items() if v is not None},
                "caption_error_ms": summary["caption_error_ms"],
                "caption_error_counts": histogram_counts(sp.caption_errors,
                                                         CAPTION_ERROR_EDGES_MS),
                "clock_error_ms": summary["clock_error_ms"],
                "resyncs": sp.resyncs,
                "caption_lag_ms": views.caption_lag_figures(self.speech, name),
                "dub_lag_ms": views.dub_lag_figures(self.speech, name),
            }
        return {
            "type": "tick",
            "t_ns": now,
            "streams": streams,
            "clock": clock,
            "gpu": views.gpu_figures(self.gpu_sample, self.renderers),
            "alerts": self.alerts.active(),
            "events": [e.as_dict() for e in events],
        }

    def stream_status(self, name: str, now: int) -> dict[str, Any]:
        """``GET /api/streams/{stream}/sync``: every statistic per track, and the viewers."""
        sp = self.streams.get(name) or StreamProbe(name)
        relayed = self.relay.stream(name)
        publisher = relayed.publisher if relayed is not None else None
        bitrates = self._bitrates(name)
        tracks = {kind: {**t.summary(), "bitrate_bps": bitrates.get(kind)}
                  for kind, t in sp.track_stats.items()}
        viewers = list(sp.viewers.items())
        return {
            "stream": name,
            "t_ns": now,
            "publisher": None if publisher is None else {"id": publisher.id,
                                                         "state": publisher.state},
            "tracks": tracks,
            "publisher_av_skew_ms": self._publisher_skew(sp, now),
            "viewers": viewer_summary(v for _, v in viewers),
            "viewer_list": [{"id": vid, **v.summary()} for vid, v in viewers[:VIEWER_LIST_MAX]],
            "caption_error_ms_recent": [round(e, 3) for e in sp.caption_errors],
            **views.speech_status(self.speech, name),
            "alerts": [a for a in self.alerts.active() if a["subject"] == name],
        }

    def gpu_report(self, obj: object) -> dict[str, Any]:
        """Take a renderer's allocator report (``POST /api/gpu/report``); its state as JSON."""
        try:
            report = AllocatorReport.parse(obj)
        except BadInput:
            self.bad_input("gpu_report")
            raise
        now = self.now_ns()
        sp = self.streams.get(report.stream) if report.stream is not None else None
        video = sp.track_stats.get("video") if sp is not None else None
        state = self.renderers.add(report, now,
                                   video.frame_jitter_rms_ms if video is not None else None)
        self._update("gpu_fragmentation", report.renderer, report.fragmentation, now,
                     f"stream {report.stream}" if report.stream else "")
        answer = state.as_dict()
        del answer["history"]
        return answer

