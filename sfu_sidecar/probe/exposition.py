"""The probe's Prometheus metrics: bounded labels, read at scrape time from the probe's state.

Labels are ``stream`` (at most ``STREAM_LABELS`` distinct names; later streams share the
``OVERFLOW`` label until a named one ends), ``kind`` (audio/video) and small fixed sets (alert
name, discontinuity cause, bad-input kind, GPU device index). Never a viewer id, a packet value
or a renderer's free-form name. Units are base units (seconds, bytes, ratios).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from sfu_sidecar.metrics import NAMESPACE, Metrics
from sfu_sidecar.probe.alerts import Alerts
from sfu_sidecar.probe.gpu import GpuSample, Renderers
from sfu_sidecar.probe.stats import BucketCounts, Cause
from sfu_sidecar.probe.streams import StreamProbe
from sfu_sidecar.relay.hooks import RelayView
from sfu_sidecar.speech.service import SpeechService

STREAM_LABELS = 32
# No stream can be called this: stream names have no spaces or parentheses.
OVERFLOW = "(other)"
SERVICE_WIDE = ""  # the stream label of alerts about the clock or a GPU
# Caption languages exported per stream (the first ones in name order): a producer that posts
# in many languages cannot grow the series without bound.
LANGUAGE_LABELS = 8

# Buckets around the thresholds the alerts and grades use (seconds).
AV_SKEW_BUCKETS = (-0.25, -0.125, -0.045, -0.015, 0.0, 0.015, 0.045, 0.125, 0.25)
CAPTION_ERROR_BUCKETS = (-0.1, -0.05, -0.033, -0.017, 0.0, 0.017, 0.033, 0.05, 0.1, 0.25, 0.5)


class StreamLabels:
    """Stream name -> label value, at most ``limit`` distinct names at a time."""

    def __init__(self, limit: int = STREAM_LABELS) -> None:
        self.limit = limit
        self._labels: dict[str, str] = {}
        self._named = 0

    def __call__(self, stream: str) -> str:
        label = self._labels.get(stream)
        if label is None:
            label = stream if self._named < self.limit else OVERFLOW
            self._named += label != OVERFLOW
            self._labels[stream] = label
        return label

    def peek(self, stream: str) -> str:
        """The label of a stream the probe follows; others count as overflow."""
        return self._labels.get(stream, OVERFLOW)

    def release(self, stream: str) -> str | None:
        """The stream ended; returns the label it had, to drop its series."""
        label = self._labels.pop(stream, None)
        if label is not None and label != OVERFLOW:
            self._named -= 1
        return label


class ProbeHistograms:
    """Histograms observed as viewers' reports arrive."""

    def __init__(self, metrics: Metrics) -> None:
        self.av_skew = metrics.histogram(
            "probe_viewer_av_skew_seconds",
            "A/V skew viewers play (audio capture minus video capture; positive: audio leads)",
            AV_SKEW_BUCKETS, ("stream",))
        self.caption_error = metrics.histogram(
            "probe_viewer_caption_error_seconds",
            "Capture time of the first frame showing a caption minus the caption's start",
            CAPTION_ERROR_BUCKETS, ("stream",))

    def drop(self, label: str) -> None:
        """Remove the series of a stream label that is no longer in use."""
        for hist in (self.av_skew, self.caption_error):
            with contextlib.suppress(KeyError):  # never observed under that label
                hist.remove(label)


class ProbeState(Protocol):
    """What the collector reads of the probe (``ProbeService`` is one)."""

    @property
    def relay(self) -> RelayView: ...
    @property
    def streams(self) -> Mapping[str, StreamProbe]: ...
    @property
    def labels(self) -> StreamLabels: ...
    @property
    def bad_inputs(self) -> Mapping[str, int]: ...
    @property
    def alerts(self) -> Alerts: ...
    @property
    def gpu_sample(self) -> GpuSample: ...
    @property
    def renderers(self) -> Renderers: ...
    @property
    def speech(self) -> SpeechService | None: ...


class ProbeCollector(Collector):
    """Everything else, computed from the probe's and relay's state when scraped."""

    def __init__(self, probe: ProbeState) -> None:
        self.probe = probe

    def collect(self) -> Iterator[Metric]:
        p = self.probe
        label = p.labels.peek

        def counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
            return CounterMetricFamily(f"{NAMESPACE}_{name}", doc, labels=labels)

        def gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{NAMESPACE}_{name}", doc, labels=labels)

        # Relay counters the relay's own collector does not export.
        bytes_in = counter("stream_bytes_received", "RTP payload bytes from publishers",
                           ["stream", "kind"])
        bytes_out = counter("stream_bytes_sent", "RTP payload bytes sent to viewers",
                            ["stream", "kind"])
        nacks_in = counter("stream_nacks_received", "NACK messages received from viewers",
                           ["stream", "kind"])
        nacks_out = counter("stream_nacks_sent", "packets NACKed to publishers",
                            ["stream", "kind"])
        plis_in = counter("stream_keyframe_requests_received",
                          "PLI/FIR received from viewers", ["stream", "kind"])
        relay: dict[tuple[str, str], list[int]] = {}
        for name in p.relay.stream_names():
            stream = p.relay.stream(name)
            for kind, t in (stream.traffic() if stream is not None else {}).items():
                row = relay.setdefault((label(name), kind), [0, 0, 0, 0, 0])
                row[0] += t.octets_in
                row[1] += t.octets_out
                row[2] += t.nacks_received
                row[3] += t.nacks_sent
                row[4] += t.keyframe_requests
        for key, row in sorted(relay.items()):
            for family, value in zip((bytes_in, bytes_out, nacks_in, nacks_out, plis_in), row,
                                     strict=True):
                family.add_metric(list(key), value)
        yield from (bytes_in, bytes_out, nacks_in, nacks_out, plis_in)

        disc = counter("probe_discontinuities", "Capture-time discontinuities by cause",
                       ["stream", "kind", "cause"])
        jitter = gauge("probe_jitter_seconds", "RFC 3550 interarrival jitter of publisher tracks",
                       ["stream", "kind"])
        frame_rms = gauge("probe_frame_jitter_seconds",
                          "Frame-interval jitter (RMS over the last 64 frames)",
                          ["stream", "kind"])
        kurt = gauge("probe_frame_gap_kurtosis",
                     "Excess kurtosis of the last 32 frame arrival gaps", ["stream", "kind"])
        drift = gauge("probe_publisher_clock_rate_error_ppm",
                      "Publisher capture clock rate against the house clock", ["stream", "kind"])
        viewers_rr = gauge("probe_viewer_jitter_seconds",
                           "Largest RFC 3550 jitter viewers report", ["stream", "kind"])
        resyncs = counter("probe_viewer_resyncs", "Sync timelines restarted, reported by viewers",
                          ["stream"])
        deviation = HistogramMetricFamily(
            f"{NAMESPACE}_probe_frame_interval_deviation_seconds",
            "Frame arrival gap minus the gap its RTP timestamps announce, absolute",
            labels=["stream", "kind"])
        totals: dict[tuple[str, str, str], int] = {}
        levels: dict[tuple[str, str], list[float | None]] = {}
        resync_totals: dict[str, int] = {}
        deviations: dict[tuple[str, str], BucketCounts] = {}
        for name, sp in list(p.streams.items()):
            lbl = label(name)
            resync_totals[lbl] = resync_totals.get(lbl, 0) + sp.resyncs
            for kind, counts in sp.deviation.items():
                deviations.setdefault((lbl, kind), BucketCounts()).add(counts)
            for kind, track in sp.track_stats.items():
                for cause in Cause:
                    key3 = (lbl, kind, cause.value)
                    totals[key3] = totals.get(key3, 0) + track.discontinuities[cause]
                if lbl == OVERFLOW:
                    continue  # levels of several streams do not add up
                model = track.fit.model()
                rms = track.frame_jitter_rms_ms
                kurtosis = track.kurtosis
                rr = [v.rr_jitter_ms[kind] for v in sp.viewers.values() if kind in v.rr_jitter_ms]
                levels[(lbl, kind)] = [
                    track.jitter.jitter_ms / 1000, None if rms is None else rms / 1000,
                    kurtosis, None if model is None else model.rate_error_ppm,
                    max(rr) / 1000 if rr else None,
                ]
        for key3, n in sorted(totals.items()):
            disc.add_metric(list(key3), n)
        for key2, values in sorted(levels.items()):
            for gauge_family, level in zip((jitter, frame_rms, kurt, drift, viewers_rr), values,
                                           strict=True):
                if level is not None:
                    gauge_family.add_metric(list(key2), level)
        for lbl, n in sorted(resync_totals.items()):
            resyncs.add_metric([lbl], n)
        for key2, counts in sorted(deviations.items()):
            deviation.add_metric(list(key2), counts.buckets(), counts.total)
        yield from (deviation, disc, jitter, frame_rms, kurt, drift, viewers_rr, resyncs)

        bad = counter("probe_bad_inputs", "Refused GPU reports and playout reports, by kind",
                      ["kind"])
        for kind, n in sorted(p.bad_inputs.items()):
            bad.add_metric([kind], n)
        yield bad

        yield self._alerts()
        yield from self._gpu()
        if p.speech is not None:
            yield from self._speech(p.speech)

    def _speech(self, speech: SpeechService) -> Iterator[Metric]:
        p = self.probe

        def gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{NAMESPACE}_{name}", doc, labels=labels)

        def counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
            return CounterMetricFamily(f"{NAMESPACE}_{name}", doc, labels=labels)

        segments = counter("speech_segments", "Speech segments heard in publishers' audio",
                           ["stream"])
        refused = counter("speech_packets_refused",
                          "Audio payloads the Opus decoder refused (not listened to)", ["stream"])
        median = gauge("caption_lag_median_seconds",
                       "Caption start minus the onset of the speech it captions, median "
                       "(positive: the caption comes after the voice)", ["stream", "language"])
        recent = gauge("caption_lag_recent_seconds",
                       "Caption lag, median of the last 10 matched cues (the alerts' input)",
                       ["stream", "language"])
        p95 = gauge("caption_lag_abs_p95_seconds", "Caption lag, 95th percentile of |lag|",
                    ["stream", "language"])
        drift = gauge("caption_lag_drift_ratio",
                      "Change of caption lag per unit of stream time (robust fit)",
                      ["stream", "language"])
        cues = counter("caption_lag_cues", "Final cues judged against the speech, by outcome",
                       ["stream", "language", "outcome"])
        for name, ss in sorted(speech.streams.items()):
            if name not in p.streams:
                continue  # only streams with a label (the probe follows every publisher)
            lbl = p.labels.peek(name)
            if lbl == OVERFLOW:
                continue  # figures of several streams do not add up
            segments.add_metric([lbl], ss.segments_heard)
            refused.add_metric([lbl], ss.refused_packets)
            for lang, r in sorted(speech.reports(name).items())[:LANGUAGE_LABELS]:
                for family, value in ((median, r.median_ms), (recent, r.recent_median_ms),
                                      (p95, r.p95_ms)):
                    if value is not None:
                        family.add_metric([lbl, lang], value / 1000)
                if r.drift_ms_per_min is not None:
                    drift.add_metric([lbl, lang], r.drift_ms_per_min / 60_000)
                for outcome, n in (("matched", r.matched), ("unmatched", r.unmatched_cues),
                                   ("inside_speech", r.inside_speech)):
                    cues.add_metric([lbl, lang, outcome], n)
        yield from (segments, refused, median, recent, p95, drift, cues)

    def _alerts(self) -> GaugeMetricFamily:
        p = self.probe
        family = GaugeMetricFamily(
            f"{NAMESPACE}_alert_active",
            "1 while the named alert is raised for the stream (stream=\"\": clock and GPU)",
            labels=["alert", "stream"])
        active: set[tuple[str, str]] = set()
        for a in p.alerts.active():
            subject = str(a["subject"])
            lbl = p.labels.peek(subject) if subject in p.streams else SERVICE_WIDE
            active.add((str(a["alert"]), lbl))
        labels = sorted({p.labels.peek(s) for s in p.streams} | {SERVICE_WIDE})
        for name in p.alerts.rules:
            for lbl in labels:
                family.add_metric([name, lbl], 1.0 if (name, lbl) in active else 0.0)
        return family

    def _gpu(self) -> Iterator[Metric]:
        p = self.probe
        sample = p.gpu_sample
        available = GaugeMetricFamily(f"{NAMESPACE}_gpu_available",
                                      "1 when NVML answers and sees a GPU")
        available.add_metric([], 1.0 if sample.available else 0.0)
        total = GaugeMetricFamily(f"{NAMESPACE}_gpu_memory_total_bytes", "GPU memory",
                                  labels=["device"])
        used = GaugeMetricFamily(f"{NAMESPACE}_gpu_memory_used_bytes", "GPU memory in use",
                                 labels=["device"])
        util = GaugeMetricFamily(f"{NAMESPACE}_gpu_utilization_ratio",
                                 "Share of the last sample period a kernel ran",
                                 labels=["device"])
        for d in sample.devices:
            total.add_metric([str(d.index)], d.total_bytes)
            used.add_metric([str(d.index)], d.used_bytes)
            if d.utilization_pct is not None:
                util.add_metric([str(d.index)], d.utilization_pct / 100)
        frag = GaugeMetricFamily(f"{NAMESPACE}_gpu_fragmentation_ratio",
                                 "Largest allocator fragmentation index of the stream's renderers",
                                 labels=["stream"])
        reserved = GaugeMetricFamily(f"{NAMESPACE}_gpu_allocator_reserved_bytes",
                                     "Memory the stream's renderers' allocators hold",
                                     labels=["stream"])
        allocated = GaugeMetricFamily(f"{NAMESPACE}_gpu_allocator_allocated_bytes",
                                      "Memory the stream's renderers have allocated",
                                      labels=["stream"])
        per: dict[str, list[float]] = {}
        for state in p.renderers:
            rep = state.report
            lbl = p.labels.peek(rep.stream) if rep.stream is not None else SERVICE_WIDE
            row = per.setdefault(lbl, [0.0, 0.0, 0.0])
            row[0] = max(row[0], rep.fragmentation)
            row[1] += rep.reserved_bytes
            row[2] += rep.allocated_bytes
        for lbl, (f, r, a) in sorted(per.items()):
            frag.add_metric([lbl], f)
            reserved.add_metric([lbl], r)
            allocated.add_metric([lbl], a)
        yield from (available, total, used, util, frag, reserved, allocated)
