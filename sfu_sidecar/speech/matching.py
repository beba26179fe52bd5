"""The matching underneath the aligner, pure: which offset most of a run of followers share
with the speech, which onset each follower takes (in order, each onset once), and the median
of the recent lags.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence

S = 1_000_000_000
# Half-width of the kernel with which the common offset is looked for: wide enough for the
# scatter of cue starts around it, narrow enough that the differences to the neighbouring
# sentences (a second or more away) fall outside.
CLUSTER_NS = 150_000_000
# Followers either side whose differences vote on the common offset: about 16 sentences, over
# which a drift of 30 ms/min moves the offset by 10 ms.
CONTEXT_NS = 20 * S


def dominant_offset(start_ns: int, starts: Sequence[int], onsets: Sequence[int],
                    window_ns: int) -> int:
    """The offset (follower start - leader onset) most followers around ``start_ns`` share.

    ``starts`` and ``onsets`` are sorted. With no leader near, 0; with one follower alone, the
    difference to its nearest onset.
    """
    a = bisect.bisect_left(starts, start_ns - CONTEXT_NS)
    b = bisect.bisect_right(starts, start_ns + CONTEXT_NS)
    diffs: list[tuple[int, int]] = []
    for who in range(a, b):
        s = starts[who]
        lo = bisect.bisect_left(onsets, s - window_ns)
        hi = bisect.bisect_right(onsets, s + window_ns)
        diffs.extend((s - onsets[j], who) for j in range(lo, hi))
    if not diffs:
        return 0
    diffs.sort()
    # Each difference proposes a centre; a follower votes for it with its nearest difference,
    # weighted by a triangular kernel of half-width CLUSTER_NS, so a tight cluster (the true
    # offset, jittered by milliseconds) outvotes a loose one of the same size (differences to
    # neighbouring sentences, spread by their varying gaps).
    best: tuple[float, int] = (0.0, 0)  # (votes, -|centre|)
    centre = 0
    first = 0
    for c, _ in diffs:
        while c - diffs[first][0] >= CLUSTER_NS:
            first += 1
        votes: dict[int, float] = {}
        k = first
        while k < len(diffs) and diffs[k][0] - c < CLUSTER_NS:
            d, who = diffs[k]
            votes[who] = max(votes.get(who, 0.0), 1.0 - abs(d - c) / CLUSTER_NS)
            k += 1
        score = (sum(votes.values()), -abs(c))
        if score > best:
            best, centre = score, c
    # Refined: the median of each follower's difference nearest the centre, within the kernel.
    nearest: dict[int, int] = {}
    for d, who in diffs:
        if abs(d - centre) < CLUSTER_NS and (who not in nearest
                                             or abs(d - centre) < abs(nearest[who] - centre)):
            nearest[who] = d
    return int(statistics.median(nearest.values())) if nearest else centre


def monotone_match(candidates: Sequence[Sequence[tuple[int, int]]]) -> list[int | None]:
    """The one-to-one matching of followers (in order) to leader indices, in order on both
    sides, with the greatest total weight; ``candidates[i]`` holds (leader, weight > 0) of
    follower ``i``. On equal weight the earlier follower gets the leader."""
    n = len(candidates)
    chosen: list[int | None] = [None] * n
    i = 0
    while i < n:
        if not candidates[i]:
            i += 1
            continue
        # A run of followers whose candidate leaders overlap is solved on its own.
        j, top = i, max(c for c, _ in candidates[i])
        while j + 1 < n and (not candidates[j + 1] or min(c for c, _ in candidates[j + 1]) <= top):
            j += 1
            top = max([top, *(c for c, _ in candidates[j])])
        base = min(c for k in range(i, j + 1) for c, _ in candidates[k])
        _match_run(candidates, i, j + 1, base, top + 1 - base, chosen)
        i = j + 1
    return chosen


def _match_run(candidates: Sequence[Sequence[tuple[int, int]]], first: int, end: int,
               base: int, m: int, chosen: list[int | None]) -> None:
    weights = [{c - base: w for c, w in candidates[k]} for k in range(first, end)]
    rows = [[0] * (m + 1)]
    for wk in weights:
        prev, row = rows[-1], [0] * (m + 1)
        for b in range(m):
            best = max(prev[b + 1], row[b])
            w = wk.get(b)
            if w is not None and prev[b] + w > best:
                best = prev[b] + w
            row[b + 1] = best
        rows.append(row)
    a, b = len(weights), m
    while a > 0 and b > 0:
        if rows[a][b] == rows[a - 1][b]:
            a -= 1
        elif rows[a][b] == rows[a][b - 1]:
            b -= 1
        else:
            chosen[first + a - 1] = base + b - 1
            a -= 1
            b -= 1


def recent_median(values: Sequence[float]) -> float | None:
    """The median of an alert's window; with an even count, the middle value nearer zero, so
    one value of a middle pair cannot carry the figure over a line alone. None below two."""
    if len(values) < 2:
        return None
    ordered = sorted(values)
    n = len(ordered)
    if n % 2:
        return ordered[n // 2]
    lo, hi = ordered[n // 2 - 1], ordered[n // 2]
    return lo if abs(lo) <= abs(hi) else hi
