"""How far a dub is behind its source, utterance by utterance. Pure.

A dub (a translated voice on another track or stream) follows a source voice. The speech
detector runs on both; their segments go into a :class:`DubLagMeter`, which matches each dub
utterance to the source utterance it dubs (``align.py``: the offset most utterances share, then
one to one in order, so a missing or an extra utterance on either side costs only itself) and
reports the lag of each dub onset to its source onset.

A translation joins and splits sentences: a dub utterance spanning two source utterances is
matched to the first and covers the second (which is then not unmatched); the second half of a
source utterance dubbed in two is *inside* its source, with no lag of its own.

The alert rule fed by these figures is ``dub_lag`` in ``probe/alerts.py`` (``SPEECH_RULES``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sfu_sidecar.speech.align import MATCH_WINDOW_NS, TOLERANCE_NS, Aligner, Outcome, figures
from sfu_sidecar.speech.segments import SpeechSegment

__all__ = ["DubLag", "DubLagMeter", "DubReport", "Outcome"]

DUB = "dub"
# The alert input is the median of the last 3 utterances: the fewest that two lagging ones carry
# while one stray one cannot (probe/alerts.py, dub_lag).
RECENT_UTTERANCES = 3
DUB_COMPANY = 1


@dataclass(frozen=True, slots=True)
class DubLag:
    """What one settled dub utterance was matched to (``source_onset_ns``: for ``inside
    speech``, the onset of the source utterance it starts inside)."""

    dub_onset_ns: int
    source_onset_ns: int | None
    lag_ns: int | None  # None: not matched
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class DubReport:
    """The dub's lag behind its source.

    ``matched`` dub utterances have a lag; ``unmatched_dub`` had no source utterance to follow
    (an extra utterance); ``inside_source`` start inside a source utterance an earlier one was
    matched to (a sentence dubbed in two); ``unmatched_source`` source utterances no dub
    utterance matched or covers for half their length (a sentence left undubbed). Counts are
    cumulative; the figures are over the last ``keep`` matches, ``recent_median_ms`` over the
    last ``recent`` (the alert input), None below two.
    """

    matched: int
    unmatched_dub: int
    unmatched_source: int
    inside_source: int
    median_ms: float | None
    p95_ms: float | None  # p95 of |lag|
    recent_median_ms: float | None
    drift_ms_per_min: float | None  # Theil-Sen slope of lag against dub onset; None below 5
    lags: list[tuple[int, float]]  # (dub_onset_ns, lag_ms), the last `keep`, for a plot


class DubLagMeter:
    """One dub against its source: source and dub speech segments in, lags out."""

    def __init__(self, *, match_window_ns: int = MATCH_WINDOW_NS, keep: int = 500,
                 recent: int = RECENT_UTTERANCES, tolerance_ns: int = TOLERANCE_NS) -> None:
        if recent < 1:
            raise ValueError("recent must be at least 1")
        self.match_window_ns = match_window_ns
        self.keep = keep
        self.recent = recent
        # A dub utterance is matched once one other is near (not two, as captions wait for):
        # a dub's lag is well inside the window, and the alert must be able to raise on the
        # second late utterance.
        self._aligner = Aligner(window_ns=match_window_ns, tolerance_ns=tolerance_ns, keep=keep,
                                company=DUB_COMPANY)

    def add_source(self, segment: SpeechSegment) -> None:
        self._aligner.add_leader(segment)

    def add_dub(self, segment: SpeechSegment) -> None:
        # Keyed by onset: a segment seen twice (two nodes relaying one dub) is one utterance.
        self._aligner.add(DUB, str(segment.onset_ns), segment.onset_ns, segment.offset_ns,
                          fixed=True)

    def settle(self, heard_until_ns: int, *, source_open_onset_ns: int | None = None,
               final: bool = False) -> list[DubLag]:
        """Match every dub utterance with ``onset + match_window <= heard_until_ns``, both
        tracks having been analysed up to ``heard_until_ns``; the new matches, in order.
        ``source_open_onset_ns``: the onset of source speech still going on then. An utterance
        with fewer than two others within 20 s waits for company, or four match windows,
        unless ``final`` (the audio has ended)."""
        out = []
        for _, f in self._aligner.settle(heard_until_ns, source_open_onset_ns, final=final):
            assert f.outcome is not None
            out.append(DubLag(f.start_ns, f.onset_ns, f.lag_ns, f.outcome))
        return out

    def report(self) -> DubReport:
        track = self._aligner.tracks.get(DUB)
        if track is None:
            return DubReport(0, 0, 0, 0, None, None, None, None, [])
        fig = figures(track.matched(), recent=self.recent, keep=self.keep)
        return DubReport(
            matched=track.counts[Outcome.MATCHED],
            unmatched_dub=track.counts[Outcome.UNMATCHED],
            unmatched_source=track.counts["leaders"],
            inside_source=track.counts[Outcome.INSIDE],
            median_ms=fig.median_ms,
            p95_ms=fig.p95_ms,
            recent_median_ms=fig.recent_median_ms,
            drift_ms_per_min=fig.drift_ms_per_min,
            lags=fig.lags,
        )
