"""The probe's figures as JSON: a track's timing, the GPUs and renderers, a stream's speech
and caption lag (what the dashboard plots each tick and the status routes answer)."""

from __future__ import annotations

from typing import Any

from sfu_sidecar.probe.gpu import GpuSample, Renderers
from sfu_sidecar.probe.stats import TrackStats, round_or_none
from sfu_sidecar.speech.service import NO_AUDIO, SpeechService


def track_figures(t: TrackStats) -> dict[str, Any]:
    """One published track's timing figures for a dashboard tick."""
    m = t.fit.model()
    return {
        "jitter_ms": round_or_none(t.jitter.jitter_ms),
        "frame_rms_ms": round_or_none(t.frame_jitter_rms_ms),
        "frame_p2p_ms": round_or_none(t.frame_jitter_p2p_ms),
        "kurtosis": round_or_none(t.kurtosis),
        "drift_ppm": None if m is None else round_or_none(m.rate_error_ppm),
        "offset_ms": None if m is None else round_or_none(m.offset_ms),
        "basis": None if m is None else m.basis,
        "discontinuities": t.discontinuity_count,
    }


def gpu_figures(sample: GpuSample, renderers: Renderers) -> dict[str, Any]:
    """The GPUs NVML sees and every renderer's last allocator report."""
    return {
        "available": sample.available, "reason": sample.reason,
        "devices": [{"index": d.index, "name": d.name, "used_pct": round(d.used_pct, 2),
                     "used_bytes": d.used_bytes, "total_bytes": d.total_bytes,
                     "utilization_pct": d.utilization_pct} for d in sample.devices],
        "renderers": [
            {"renderer": s.report.renderer, "stream": s.report.stream,
             "fragmentation": round(s.report.fragmentation, 4),
             "reserved_ratio": round_or_none(s.report.reserved_ratio),
             "reserved_bytes": s.report.reserved_bytes,
             "allocated_bytes": s.report.allocated_bytes}
            for s in renderers],
    }


def caption_lag_figures(speech: SpeechService | None,
                        name: str) -> dict[str, dict[str, float | int | None]]:
    """Per language, the figures the dashboard plots and lists each tick."""
    if speech is None:
        return {}
    return {lang: {"recent_median": r.recent_median_ms, "median": r.median_ms,
                   "p95": r.p95_ms, "matched": r.matched}
            for lang, r in speech.reports(name).items()}


def dub_lag_figures(speech: SpeechService | None, name: str) -> dict[str, Any] | None:
    dub = speech.dub_report(name) if speech is not None else None
    if dub is None:
        return None
    source, r = dub
    return {"source": source, "recent_median": r.recent_median_ms, "median": r.median_ms,
            "matched": r.matched}


def speech_status(speech: SpeechService | None, name: str) -> dict[str, Any]:
    """The stream's speech timeline and its captions' lag to the voice, or why there is
    none (``speech.state``)."""
    if speech is None:
        return {"speech": {"state": "off", "reason": "speech_detect is off"},
                "caption_lag": {}, "dub": None}
    status = speech.status(name)
    if status is None:
        return {"speech": {"state": NO_AUDIO, "reason": "no audio packet yet"},
                "caption_lag": {}, "dub": speech.dub_status(name)}
    return status
