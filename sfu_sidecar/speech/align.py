"""Matching what follows speech (captions, a dub) to the speech it follows, on the house clock.

Pure: speech segments, followers and the time up to which the audio has been analysed come in;
matches and lag figures come out. The caption meter (``lag.py``) and the dub meter (``dub.py``)
are thin wrappers around :class:`Aligner`.

Words used here:

* a *leader* is a stretch of speech that is followed (the voice a caption captions, the source
  utterance a dub dubs), a :class:`SpeechSegment`;
* a *follower* is what follows it (a cue, a dubbed utterance), with a start and an end;
* the *lag* of a matched follower is its start minus its leader's onset (> 0: it comes after).

Every follower ends in one :class:`Outcome`; every leader a follower neither matched nor covers
is counted as unmatched once its followers have all been settled.
"""

from __future__ import annotations

import bisect
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from sfu_sidecar.estimators import theil_sen
from sfu_sidecar.speech.matching import CONTEXT_NS, dominant_offset, monotone_match, recent_median
from sfu_sidecar.speech.segments import SpeechSegment

S = 1_000_000_000
MS = 1_000_000
MINUTE_NS = 60 * S

MATCH_WINDOW_NS = 2_500_000_000
# How far a follower may stray from the common offset of its neighbours and still be matched.
# Sentences start 1.1 s or more apart (0.8 s of speech and a 0.3 s pause at the least), so
# 0.5 s stays under half that gap; live ASR cue starts scatter by about a tenth of that.
TOLERANCE_NS = 500_000_000
# A follower alone has no common offset to be told: it waits for this many others within
# CONTEXT_NS, or for COMPANY_WAIT windows of audio after it (the first cue of a stream 2 s late
# would otherwise take the next sentence's onset, and the cue for that one find it taken).
# Four windows, 10 s, is well past the latency of live ASR cues after their words.
COMPANY = 2
COMPANY_WAIT = 4
DRIFT_MIN_POINTS = 5
# The drift is fitted over the last DRIFT_POINTS matches (about 8 minutes of speech): recent
# enough to follow a change, and Theil-Sen stays about a millisecond at this size.
DRIFT_POINTS = 200
# Followers waiting for their audio, per follower kept: room for a caption file sent whole.
PENDING_PER_KEEP = 8
# A leader covered by a follower's span for at least this share of its length is followed.
COVER_SHARE = 0.5


class Outcome(StrEnum):
    MATCHED = "matched"  # its lag to the onset it follows is measured
    UNMATCHED = "unmatched"  # no speech to follow within the window (music, silence)
    # It starts inside speech that began earlier and was not matched to it: the second or third
    # cue of one long sentence, the second half of a split utterance. It has no lag of its own,
    # is no fault, and the speech it starts in is not unmatched.
    INSIDE = "inside speech"


@dataclass(slots=True)
class Follower:
    key: str
    start_ns: int
    end_ns: int
    fixed: bool = False
    outcome: Outcome | None = None  # None while pending
    onset_ns: int | None = None  # matched: its leader's; inside: that of the speech it is in
    span: tuple[int, int] | None = None  # the speech time it stands for (matched or inside)

    @property
    def lag_ns(self) -> int | None:
        if self.outcome is not Outcome.MATCHED or self.onset_ns is None:
            return None
        return self.start_ns - self.onset_ns


@dataclass(slots=True)
class Track:
    """One sequence of followers (a caption language, a dub) and what it made of the leaders."""

    from_ns: int  # leaders before this are not judged: the track had not begun
    pending: dict[str, Follower] = field(default_factory=dict)
    settled: dict[str, Follower] = field(default_factory=dict)
    claims: dict[int, str] = field(default_factory=dict)  # leader onset -> matched follower
    spans: list[tuple[int, int, str]] = field(default_factory=list)  # sorted by start
    max_span_ns: int = 0
    judged_until_ns: int = 0
    unmatched_onsets: set[int] = field(default_factory=set)  # judged unmatched, still kept
    counts: Counter[str] = field(default_factory=Counter)  # by outcome, and "leaders"
    forgotten_until_ns: int | None = None  # followers up to here were dropped (keep)
    stale: int = 0  # followers refused: older than what is kept to match them against

    def __post_init__(self) -> None:
        self.judged_until_ns = self.from_ns

    def matched(self) -> list[Follower]:
        return sorted((f for f in self.settled.values() if f.outcome is Outcome.MATCHED),
                      key=lambda f: f.start_ns)


@dataclass(frozen=True, slots=True)
class LagFigures:
    median_ms: float | None
    p95_ms: float | None  # of |lag|
    recent_median_ms: float | None
    drift_ms_per_min: float | None
    lags: list[tuple[int, float]]


class Aligner:
    """Leaders shared by any number of tracks of followers.

    The matching, per settled batch and per track:

    1. The common offset around each follower is the mode of the differences between the starts
       of the followers within ``CONTEXT_NS`` of it and every leader onset within the match
       window of each (:func:`dominant_offset`). A caption track late by 1.2 s against
       sentences 2.5 s apart puts one difference per cue at +1.2 s, tightly, and the others
       spread over the varying sentence gaps, so the mode is the offset even where it is near
       half a gap, where the nearest onset is the wrong one for half the cues.
    2. Followers are matched one to one, in order on both sides, to the onsets not yet taken,
       maximising the sum of ``tolerance - |start - offset - onset|`` over the pairs within the
       tolerance and the match window (a dynamic programme over the ordered pairs). Followers
       still pending compete without being committed, so a cue does not take the onset a later
       cue fits better. Only the first of two cues at one onset gets it.
    3. A follower left over is *inside* when its start, less the offset, falls inside a
       leader or within the tolerance before an onset already taken, else *unmatched*.
    4. A matched or inside follower's start and end, less its lag (or the offset), are the
       speech it stands for: a leader that span covers for half its length is followed, so a
       cue spanning three sentences leaves none of them unmatched.

    A leader is judged (unmatched or not) once ``2 * window`` of audio after its onset has been
    heard, and judged again if a late follower takes or covers it. A follower waits for
    company (COMPANY) before its offset is estimated.
    """

    def __init__(self, *, window_ns: int = MATCH_WINDOW_NS, tolerance_ns: int = TOLERANCE_NS,
                 keep: int = 500, company: int = COMPANY) -> None:
        if window_ns <= 0 or tolerance_ns <= 0 or keep < 1 or company < 0:
            raise ValueError("window, tolerance and keep must be positive, company not negative")
        self.company = company
        self.window_ns = window_ns
        self.tolerance_ns = min(tolerance_ns, window_ns)
        self.keep = keep
        self.onsets: list[int] = []  # closed leaders, by onset
        self.offsets: list[int] = []
        self.open_onset_ns: int | None = None  # a leader still going on at the last settle
        self.heard_until_ns: int | None = None
        self.leaders_forgotten_until_ns: int | None = None
        self.tracks: dict[str, Track] = {}

    # --- leaders -----------------------------------------------------------------------------

    def add_leader(self, segment: SpeechSegment) -> None:
        onset, offset = segment.onset_ns, max(segment.offset_ns, segment.onset_ns + 1)
        forgotten = self.leaders_forgotten_until_ns
        if forgotten is not None and onset <= forgotten:
            return
        i = bisect.bisect_left(self.onsets, onset)
        if i < len(self.onsets) and self.onsets[i] == onset:
            self.offsets[i] = offset
        else:
            self.onsets.insert(i, onset)
            self.offsets.insert(i, offset)
        prov = self.open_onset_ns
        if prov is not None and (abs(onset - prov) < self.tolerance_ns or onset <= prov < offset):
            # The speech that was open at the last settle has closed: a match to its provisional
            # onset moves to the onset the detector settled on.
            self.open_onset_ns = None
            if prov != onset:
                for track in self.tracks.values():
                    f = track.settled.get(track.claims.get(prov, ""))
                    if f is not None and onset not in track.claims:
                        self._unsettle(track, f)
                        self._matched(track, f, onset)
                        self._settled(track, f)
        for track in self.tracks.values():
            if track.from_ns <= onset < track.judged_until_ns:
                self._rejudge(track, onset, onset + 1)  # closed after its turn came
        while len(self.onsets) > 2 * self.keep + 16:
            self._forget_leader()

    def _forget_leader(self) -> None:
        onset = self.onsets.pop(0)
        self.leaders_forgotten_until_ns = self.offsets.pop(0)
        for track in self.tracks.values():
            track.claims.pop(onset, None)
            track.unmatched_onsets.discard(onset)

    def _leaders(self) -> tuple[list[int], list[int]]:
        """The closed leaders and the open one, up to the time heard."""
        prov, heard = self.open_onset_ns, self.heard_until_ns
        if prov is None or heard is None:
            return self.onsets, self.offsets
        return [*self.onsets, prov], [*self.offsets, heard]

    # --- followers ---------------------------------------------------------------------------

    def track(self, name: str, start_ns: int) -> Track:
        track = self.tracks.get(name)
        if track is None:
            track = self.tracks[name] = Track(from_ns=start_ns - self.window_ns)
        return track

    def add(self, name: str, key: str, start_ns: int, end_ns: int, *, fixed: bool = False) -> None:
        """A follower, or a new version of one (same key)."""
        track = self.track(name, start_ns)
        end_ns = max(end_ns, start_ns)
        if self._too_old(track, start_ns):
            track.stale += 1
            return
        old = track.settled.get(key)
        if old is not None:
            if (old.start_ns, old.end_ns) == (start_ns, end_ns) or old.fixed:
                return  # a repeat (every node republishes what it relays), or final by fiat
            self._unsettle(track, old)
        track.pending[key] = Follower(key, start_ns, end_ns, fixed)
        if len(track.pending) > PENDING_PER_KEEP * self.keep:
            # Followers nothing settles (no audio is heard): the oldest go, counted as stale.
            oldest = min(track.pending.values(), key=lambda f: f.start_ns)
            del track.pending[oldest.key]
            track.stale += 1

    def remove(self, name: str, key: str) -> None:
        track = self.tracks.get(name)
        if track is None:
            return
        track.pending.pop(key, None)
        old = track.settled.get(key)
        if old is not None:
            self._unsettle(track, old)

    def _too_old(self, track: Track, start_ns: int) -> bool:
        forgotten = self.leaders_forgotten_until_ns
        mine = track.forgotten_until_ns
        return ((mine is not None and start_ns <= mine)
                or (forgotten is not None and start_ns - self.window_ns <= forgotten))

    # --- settling ----------------------------------------------------------------------------

    def settle(self, heard_until_ns: int, open_onset_ns: int | None = None, *,
               final: bool = False) -> list[tuple[str, Follower]]:
        """Settle every follower with ``start + window <= heard_until_ns`` (one with too few
        others near waits COMPANY_WAIT windows, unless ``final``: the audio has ended); (track,
        follower) of each, in order of start within each track."""
        if self.heard_until_ns is None or heard_until_ns > self.heard_until_ns:
            self.heard_until_ns = heard_until_ns
        heard = self.heard_until_ns
        last = self.onsets[-1] if self.onsets else None
        self.open_onset_ns = (open_onset_ns if open_onset_ns is not None and open_onset_ns < heard
                              and (last is None or open_onset_ns > last) else None)
        out: list[tuple[str, Follower]] = []
        for name, track in self.tracks.items():
            ready = [f for f in track.pending.values() if f.start_ns + self.window_ns <= heard]
            if ready and len(ready) <= self.company and not final:
                wait = COMPANY_WAIT * self.window_ns
                ready = [f for f in ready if f.start_ns + wait <= heard
                         or self._company(track, f.start_ns) >= self.company]
            if ready:
                out.extend((name, f) for f in self._match(track, ready))
            until = heard - 2 * self.window_ns
            if until > track.judged_until_ns:
                a = bisect.bisect_left(self.onsets, track.judged_until_ns)
                b = bisect.bisect_left(self.onsets, until)
                track.judged_until_ns = until
                for i in range(a, b):
                    self._judge(track, i)
        return out

    def _company(self, track: Track, start_ns: int) -> int:
        near = 0
        for f in (*track.settled.values(), *track.pending.values()):
            if abs(f.start_ns - start_ns) <= CONTEXT_NS:
                near += 1
                if near > self.company:
                    break
        return near - 1

    def _match(self, track: Track, ready: list[Follower]) -> list[Follower]:
        onsets, offsets = self._leaders()
        w, tol = self.window_ns, self.tolerance_ns
        starts = sorted([f.start_ns for f in track.settled.values()]
                        + [f.start_ns for f in track.pending.values()])
        # Pending followers that could want the same onsets as the ready ones: those starting
        # within two windows of them.
        reach = max(f.start_ns for f in ready) + 2 * w
        contenders = sorted((f for f in track.pending.values() if f.start_ns <= reach),
                            key=lambda f: f.start_ns)
        offset_of = {f.key: dominant_offset(f.start_ns, starts, onsets, w) for f in contenders}
        candidates: list[list[tuple[int, int]]] = []
        for f in contenders:
            expect = f.start_ns - offset_of[f.key]
            lo = bisect.bisect_left(onsets, max(f.start_ns - w, expect - tol + 1))
            hi = bisect.bisect_right(onsets, min(f.start_ns + w, expect + tol - 1))
            candidates.append([(j, tol - abs(expect - onsets[j])) for j in range(lo, hi)
                               if onsets[j] not in track.claims])
        chosen = monotone_match(candidates)
        settled = []
        ready_keys = {f.key for f in ready}
        for f, j in zip(contenders, chosen, strict=True):
            if f.key not in ready_keys:
                continue
            del track.pending[f.key]
            if j is not None:
                self._matched(track, f, onsets[j])
            else:
                shift = offset_of[f.key]
                at = f.start_ns - shift
                # Inside the speech it starts in, or at an onset within tolerance that an
                # earlier follower took (the same cue twice, a cue and its continuation).
                i = bisect.bisect_right(onsets, at + tol) - 1
                if i >= 0 and (onsets[i] > at or at < offsets[i]):
                    f.outcome, f.onset_ns = Outcome.INSIDE, onsets[i]
                    f.span = (at, max(at + 1, f.end_ns - shift))
                else:
                    f.outcome = Outcome.UNMATCHED
            self._settled(track, f)
            settled.append(f)
        self._keep(track)
        return settled

    @staticmethod
    def _matched(track: Track, f: Follower, onset: int) -> None:
        f.outcome, f.onset_ns = Outcome.MATCHED, onset
        f.span = (onset, max(onset + 1, f.end_ns - (f.start_ns - onset)))
        track.claims[onset] = f.key

    def _settled(self, track: Track, f: Follower) -> None:
        assert f.outcome is not None
        track.settled[f.key] = f
        track.counts[f.outcome] += 1
        if f.span is not None:
            lo, hi = f.span
            bisect.insort(track.spans, (lo, hi, f.key))
            track.max_span_ns = max(track.max_span_ns, hi - lo)
            self._rejudge(track, lo, hi)

    def _unsettle(self, track: Track, f: Follower) -> None:
        del track.settled[f.key]
        assert f.outcome is not None
        track.counts[f.outcome] -= 1
        if (f.outcome is Outcome.MATCHED and f.onset_ns is not None
                and track.claims.get(f.onset_ns) == f.key):
            del track.claims[f.onset_ns]
        if f.span is not None:
            lo, hi = f.span
            i = bisect.bisect_left(track.spans, (lo, hi, f.key))
            if i < len(track.spans) and track.spans[i] == (lo, hi, f.key):
                del track.spans[i]
            self._rejudge(track, lo, hi)

    def _keep(self, track: Track) -> None:
        excess = len(track.settled) - self.keep
        if excess <= 0:
            return
        for f in sorted(track.settled.values(), key=lambda f: f.start_ns)[:excess]:
            # Dropped from memory, not from the counts; its claim stays with its leader so a
            # late duplicate cannot take the onset again.
            del track.settled[f.key]
            if f.span is not None:
                i = bisect.bisect_left(track.spans, (*f.span, f.key))
                if i < len(track.spans) and track.spans[i] == (*f.span, f.key):
                    del track.spans[i]
            if track.forgotten_until_ns is None or f.start_ns > track.forgotten_until_ns:
                track.forgotten_until_ns = f.start_ns

    # --- judging leaders ---------------------------------------------------------------------

    def _unfollowed(self, track: Track, i: int) -> bool:
        onset, offset = self.onsets[i], self.offsets[i]
        if onset in track.claims:
            return False
        spans = track.spans
        k = bisect.bisect_left(spans, (offset,)) - 1
        need = COVER_SHARE * (offset - onset)
        while k >= 0 and spans[k][0] >= onset - track.max_span_ns:
            lo, hi, _ = spans[k]
            if min(hi, offset) - max(lo, onset) >= need:
                return False
            k -= 1
        return True

    def _judge(self, track: Track, i: int) -> None:
        onset = self.onsets[i]
        if onset < track.from_ns:
            return
        unfollowed = self._unfollowed(track, i)
        if unfollowed and onset not in track.unmatched_onsets:
            track.unmatched_onsets.add(onset)
            track.counts["leaders"] += 1
        elif not unfollowed and onset in track.unmatched_onsets:
            track.unmatched_onsets.discard(onset)
            track.counts["leaders"] -= 1

    def _rejudge(self, track: Track, lo: int, hi: int) -> None:
        """Judge again the judged leaders overlapping [lo, hi)."""
        i = bisect.bisect_left(self.onsets, hi) - 1
        while i >= 0 and self.offsets[i] > lo:
            if self.onsets[i] < track.judged_until_ns:
                self._judge(track, i)
            i -= 1


def figures(matched: Sequence[Follower], *, recent: int, keep: int) -> LagFigures:
    """Lag figures of matched followers in order of start."""
    pts = [(f.start_ns, f.start_ns - f.onset_ns) for f in matched[-keep:]
           if f.onset_ns is not None]
    if not pts:
        return LagFigures(None, None, None, None, [])
    lags_ms = [lag / MS for _, lag in pts]
    drift = None
    fit = pts[-DRIFT_POINTS:]
    if len(fit) >= DRIFT_MIN_POINTS and fit[-1][0] > fit[0][0]:
        t0 = fit[0][0]
        slope, _ = theil_sen([(t - t0) / MINUTE_NS for t, _ in fit], [lag / MS for _, lag in fit])
        drift = round(slope, 3)
    return LagFigures(
        median_ms=round(statistics.median(lags_ms), 3),
        p95_ms=round(float(np.percentile(np.abs(lags_ms), 95)), 3),
        recent_median_ms=_round(recent_median(lags_ms[-recent:])),
        drift_ms_per_min=drift,
        lags=[(t, round(ms, 3)) for (t, _), ms in zip(pts, lags_ms, strict=True)],
    )


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)
