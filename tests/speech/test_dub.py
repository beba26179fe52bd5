"""The dub lag meter: dub utterances matched to the source utterances they dub, one to one and
in order, with utterances missing, added, joined and split; the dub_lag alert on its figure."""

from __future__ import annotations

import random

import pytest

from sfu_sidecar.probe.alerts import SPEECH_RULES, Alerts
from sfu_sidecar.speech.dub import DubLag, DubLagMeter, Outcome
from sfu_sidecar.speech.segments import SpeechSegment
from tests.support.speechtiming import HANGOVER_NS, MS, S, lagged, replay, sentences


def dubbed(source: list[SpeechSegment], lag_ms: float, rng: random.Random, *,
           jitter_ms: float = 3.0) -> list[SpeechSegment]:
    """A dub of each source utterance ``lag_ms`` behind, 0.8-1.25 times as long (a
    translation), never running into its next utterance."""
    starts = [start for start, _ in lagged(source, round(lag_ms * MS), rng,
                                           jitter_ns=round(jitter_ms * MS))]
    out = []
    for i, (seg, start) in enumerate(zip(source, starts, strict=True)):
        end = start + round((seg.offset_ns - seg.onset_ns) * rng.uniform(0.8, 1.25))
        if i + 1 < len(starts):
            end = min(end, starts[i + 1] - 200 * MS)
        out.append(SpeechSegment(start, max(end, start + 300 * MS)))
    return out


def live(meter: DubLagMeter, source: list[SpeechSegment],
         dub: list[SpeechSegment]) -> list[DubLag]:
    arrivals = [(seg.offset_ns + HANGOVER_NS, lambda seg=seg: meter.add_dub(seg))
                for seg in dub]
    return replay(source, meter.add_source, arrivals,
                  lambda t, o: meter.settle(t, source_open_onset_ns=o))


def jittered(segments: list[SpeechSegment], rng: random.Random) -> list[SpeechSegment]:
    """The source as a detector finds it: onsets a few ms off the truth."""
    return [SpeechSegment(s.onset_ns + round(rng.gauss(0, 3 * MS)), s.offset_ns)
            for s in segments]


@pytest.mark.parametrize("lag_ms", [300, 0, 120, 800, -200])
def test_a_dub_behind_its_source_reports_its_lag(lag_ms: int) -> None:
    rng = random.Random(lag_ms)
    truth = sentences(rng, 100)
    source = jittered(truth, rng)
    meter = DubLagMeter()
    results = live(meter, source, dubbed(truth, lag_ms, rng))
    assert [r.source_onset_ns for r in results] == [s.onset_ns for s in source]
    report = meter.report()
    assert report.median_ms is not None and abs(report.median_ms - lag_ms) <= 5
    assert report.recent_median_ms is not None and abs(report.recent_median_ms - lag_ms) <= 20
    assert (report.matched, report.unmatched_dub, report.unmatched_source,
            report.inside_source) == (100, 0, 0, 0)
    assert report.drift_ms_per_min is not None and abs(report.drift_ms_per_min) < 1.0


def test_missing_and_extra_utterances_cost_only_themselves() -> None:
    rng = random.Random(1)
    source = sentences(rng, 120, pause_s=(0.8, 1.5))
    dub = dubbed(source, 300, rng)
    skipped = {7, 8, 30, 61, 90}  # left undubbed
    extra = [SpeechSegment(s.offset_ns + 350 * MS, s.offset_ns + 600 * MS)
             for i, s in enumerate(source) if i % 20 == 10]  # a filler in the source's pause
    dub = sorted([d for i, d in enumerate(dub) if i not in skipped] + extra,
                 key=lambda d: d.onset_ns)
    meter = DubLagMeter()
    results = live(meter, source, dub)
    matched = [r for r in results if r.outcome is Outcome.MATCHED]
    assert all(r.lag_ns is not None and abs(r.lag_ns - 300 * MS) < 20 * MS for r in matched)
    report = meter.report()
    assert (report.matched, report.unmatched_source) == (120 - len(skipped), len(skipped))
    assert report.unmatched_dub + report.inside_source == len(extra)
    assert report.median_ms is not None and abs(report.median_ms - 300) <= 5


def test_joined_and_split_utterances() -> None:
    source = [SpeechSegment((10 + 4 * k) * S, (12 + 4 * k) * S) for k in range(12)]
    dub = []
    for k in range(0, 12, 3):
        # Source k and k+1 dubbed as one utterance; source k+2 dubbed in two.
        a, b, c = source[k:k + 3]
        dub.append(SpeechSegment(a.onset_ns + 300 * MS, b.offset_ns + 300 * MS))
        dub.append(SpeechSegment(c.onset_ns + 300 * MS, c.onset_ns + 1_100 * MS))
        dub.append(SpeechSegment(c.onset_ns + 1_400 * MS, c.offset_ns + 300 * MS))
    meter = DubLagMeter()
    results = live(meter, source, dub)
    assert [r.outcome for r in results] == [
        Outcome.MATCHED, Outcome.MATCHED, Outcome.INSIDE] * 4
    report = meter.report()
    assert (report.matched, report.inside_source, report.unmatched_source,
            report.unmatched_dub) == (8, 4, 0, 0)
    assert report.median_ms == pytest.approx(300.0)


def test_a_drifting_dub() -> None:
    rng = random.Random(2)
    source = sentences(rng, 200)
    t0 = source[0].onset_ns
    dub = [SpeechSegment(start, end) for start, end in lagged(
        source, lambda onset: 250 * MS + round(30 * MS * (onset - t0) / (60 * S)), rng)]
    meter = DubLagMeter()
    live(meter, source, dub)
    report = meter.report()
    assert report.matched == 200
    assert report.drift_ms_per_min is not None and abs(report.drift_ms_per_min - 30) <= 2


def test_a_segment_seen_twice_is_one_utterance() -> None:
    meter = DubLagMeter()
    for k in range(3):
        meter.add_source(SpeechSegment((10 + 3 * k) * S, (11 + 3 * k) * S))
        meter.add_dub(SpeechSegment((10 + 3 * k) * S + 300 * MS, (11 + 3 * k) * S))
        meter.add_dub(SpeechSegment((10 + 3 * k) * S + 300 * MS, (11 + 3 * k) * S))
    assert [r.lag_ns for r in meter.settle(30 * S)] == [300 * MS] * 3
    meter.add_dub(SpeechSegment(10 * S + 300 * MS, 11 * S))
    assert meter.settle(31 * S) == []
    assert meter.report().matched == 3


def test_memory_is_bounded_by_keep() -> None:
    rng = random.Random(3)
    source = sentences(rng, 300, length_s=(0.8, 1.2), pause_s=(0.3, 0.5))
    meter = DubLagMeter(keep=10)
    live(meter, source, dubbed(source, 300, rng))
    report = meter.report()
    assert report.matched == 300 and len(report.lags) == 10
    assert len(meter._aligner.onsets) <= 2 * 10 + 16


def dub_alert_events(lags_ms: list[float]) -> list[tuple[int, str]]:
    """Feed the meter one utterance at a time and the alert its recent median after each;
    (utterance index, state) of each alert event."""
    rng = random.Random(4)
    source = sentences(rng, len(lags_ms))
    meter = DubLagMeter()
    alerts = Alerts(SPEECH_RULES)
    events = []
    for i, (seg, lag) in enumerate(zip(source, lags_ms, strict=True)):
        onset = seg.onset_ns + round((lag + rng.gauss(0, 3)) * MS)
        meter.add_source(seg)
        meter.add_dub(SpeechSegment(onset, seg.offset_ns + round(lag * MS)))
        settled = meter.settle(onset + 11 * S)
        assert [r.outcome for r in settled] == [Outcome.MATCHED]
        event = alerts.update("dub_lag", "live/dub-fr", meter.report().recent_median_ms,
                              onset + 11 * S)
        if event is not None:
            events.append((i, event.state))
    return events


def test_dub_lag_alert_raises_within_two_utterances_of_a_300_ms_lag() -> None:
    assert dub_alert_events([20.0] * 6 + [300.0] * 6) == [(7, "raised")]
    # Behind from the start: raised on the second utterance.
    assert dub_alert_events([300.0] * 4) == [(1, "raised")]


def test_dub_lag_alert_does_not_flap() -> None:
    # One stray utterance raises nothing; one good one among late ones clears nothing.
    assert dub_alert_events([20.0] * 5 + [480.0] + [20.0] * 5) == []
    assert dub_alert_events([350.0] * 5 + [20.0] + [350.0] * 5) == [(1, "raised")]
    # Hovering between the lines after raising holds it; two good utterances clear it.
    assert dub_alert_events([320.0] * 3 + [250.0, 290.0] * 4 + [100.0] * 3) == [
        (1, "raised"), (12, "cleared")]
