"""How far each caption is from the voice it captions, per stream and language. Pure.

The speech detector's segments and the stream's final cues, both on the house clock, go into
a :class:`CaptionLagMeter`; :meth:`CaptionLagMeter.settle` matches the cues whose match the audio
heard so far decides, and :meth:`CaptionLagMeter.report` gives each language's figures. The
matching (``align.py``) is by the offset most cues share, then one to one in order, so a
caption track uniformly early or late by up to ``match_window_ns`` is matched cue for cue.

The alert rules fed by these figures are ``caption_lag`` and ``caption_lag_bt1359`` in
``probe/alerts.py`` (``SPEECH_RULES``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sfu_sidecar.speech.align import (
    MATCH_WINDOW_NS,
    TOLERANCE_NS,
    Aligner,
    Follower,
    Outcome,
    figures,
)
from sfu_sidecar.speech.segments import SpeechSegment

__all__ = ["CaptionLagMeter", "CueLag", "LagReport", "Outcome"]


@dataclass(frozen=True, slots=True)
class CueLag:
    """What one settled cue was matched to.

    ``matched``: ``onset_ns`` is the onset of the speech it captions and ``lag_ns`` its start
    less that onset. ``inside speech``: ``onset_ns`` is the onset of the speech it starts
    inside, and it has no lag. ``unmatched``: neither.
    """

    cue_id: str
    language: str
    cue_start_ns: int
    onset_ns: int | None
    lag_ns: int | None  # None: not matched
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class LagReport:
    """One language's caption lag.

    Counts run from the language's first cue (cues forgotten past ``keep`` stay counted):
    ``matched`` cues have a lag; ``unmatched_cues`` had no speech to caption (music, silence,
    or beyond the match window); ``inside_speech`` cues start inside speech an earlier cue was
    matched to (the second and later cues of one long sentence): they are neither matched nor
    unmatched. ``unmatched_speech`` counts speech segments no cue matched or covers for half
    their length (a cue spanning three sentences covers the two it was not matched to).

    The figures are over the last ``keep`` matched cues; ``recent_median_ms`` over the last
    ``recent`` (the alert input), None below two.
    """

    language: str
    matched: int
    unmatched_cues: int
    unmatched_speech: int
    median_ms: float | None
    p95_ms: float | None  # p95 of |lag|
    recent_median_ms: float | None  # median of the last `recent` matched cues (alert input)
    drift_ms_per_min: float | None  # Theil-Sen slope of lag against cue time; None below 5
    lags: list[tuple[int, float]]  # (cue_start_ns, lag_ms), the last `keep`, for a plot
    inside_speech: int


class CaptionLagMeter:
    """Per stream: matches each final cue to the speech it captions and measures the lag of the
    cue's start to that speech's onset (lag > 0: the caption comes after the voice).

    One language's cues are matched independently of another's; the speech is shared. Memory is
    bounded by ``keep``: the last ``keep`` settled cues per language, twice as many speech
    segments; a cue older than what is kept is refused (counted in :meth:`stale`).
    """

    def __init__(self, *, match_window_ns: int = MATCH_WINDOW_NS, keep: int = 500,
                 recent: int = 10, tolerance_ns: int = TOLERANCE_NS) -> None:
        if recent < 1:
            raise ValueError("recent must be at least 1")
        self.match_window_ns = match_window_ns
        self.keep = keep
        self.recent = recent
        self._aligner = Aligner(window_ns=match_window_ns, tolerance_ns=tolerance_ns, keep=keep)

    def add_speech(self, segment: SpeechSegment) -> None:
        """A closed speech segment (any order; normally in order of onset)."""
        self._aligner.add_leader(segment)

    def add_cue(self, cue_id: str, language: str, start_ns: int, end_ns: int, *,
                fixed: bool = False) -> None:
        """A final cue, or a revision of one (same id and language): a revision replaces the
        cue if it is not settled yet, and is matched afresh if it is. The same times again
        change nothing. ``fixed``: the cue's times will not be revised (a caption file, a
        chunk that has frozen): once settled, later versions of it are ignored."""
        self._aligner.add(language, cue_id, start_ns, end_ns, fixed=fixed)

    def remove_cue(self, cue_id: str, language: str | None = None) -> None:
        """The cue was retracted: forgotten, and its match undone. Without a language, the id
        is removed from every language."""
        names = list(self._aligner.tracks) if language is None else [language]
        for name in names:
            self._aligner.remove(name, cue_id)

    def settle(self, heard_until_ns: int, *, open_onset_ns: int | None = None,
               final: bool = False) -> list[CueLag]:
        """Match every cue whose match can no longer change because the audio up to
        ``heard_until_ns`` has been analysed (``start + match_window <= heard_until``); the new
        matches (matched or not), by language and start. A cue revised after it was settled
        comes again with its new match.

        A cue with fewer than two others within 20 s has no offset shared with others to be
        matched by: it waits for company, or for four match windows of audio after its start.
        ``final``: the audio has ended (the publisher left), settle without waiting.

        ``open_onset_ns``: the onset of speech still going on at ``heard_until_ns`` (the
        detector has not closed it). Without it, every speech onset before ``heard_until_ns``
        must have been added, or the cues of a long sentence still being spoken find nothing.
        Speech segments no cue follows are counted once ``2 * match_window`` of audio after
        their onset has been heard.
        """
        return [_cue_lag(name, f) for name, f in
                self._aligner.settle(heard_until_ns, open_onset_ns, final=final)]

    def report(self, language: str) -> LagReport:
        track = self._aligner.tracks.get(language)
        if track is None:
            return LagReport(language, 0, 0, 0, None, None, None, None, [], 0)
        fig = figures(track.matched(), recent=self.recent, keep=self.keep)
        return LagReport(
            language=language,
            matched=track.counts[Outcome.MATCHED],
            unmatched_cues=track.counts[Outcome.UNMATCHED],
            unmatched_speech=track.counts["leaders"],
            median_ms=fig.median_ms,
            p95_ms=fig.p95_ms,
            recent_median_ms=fig.recent_median_ms,
            drift_ms_per_min=fig.drift_ms_per_min,
            lags=fig.lags,
            inside_speech=track.counts[Outcome.INSIDE],
        )

    def languages(self) -> list[str]:
        return sorted(self._aligner.tracks)

    def stale(self, language: str) -> int:
        """Cues refused because they start before what the meter still holds."""
        track = self._aligner.tracks.get(language)
        return 0 if track is None else track.stale


def _cue_lag(language: str, f: Follower) -> CueLag:
    assert f.outcome is not None
    return CueLag(f.key, language, f.start_ns, f.onset_ns, f.lag_ns, f.outcome)
