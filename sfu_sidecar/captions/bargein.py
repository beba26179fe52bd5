"""Barge-in, pure: when a speaker is cut off, what becomes of each caption cue.

A cue that starts at or after the instant is retracted; one spanning it ends there, keeping
the words said before it (retracted instead when none were); one that ended before it stays,
and so does a ``fixed`` cue (a chapter title, not speech).
"""

from __future__ import annotations

import dataclasses

from sfu_sidecar.captions import words as cue_words
from sfu_sidecar.captions.model import StoredCue
from sfu_sidecar.exceptions import Unprocessable

# How far ahead of now a barge-in may be dated: a producer's clock may be a little ahead.
INTERRUPT_AHEAD_MS = 5000


def instant_ms(at: int, timebase: str, epoch_ns: int, now_ns: int) -> int:
    """The barge-in instant in stream ms (``at`` in house ns or stream ms as ``timebase``
    says), refused before the epoch or more than INTERRUPT_AHEAD_MS ahead of now."""
    at_ms = (at - epoch_ns + 500_000) // 1_000_000 if timebase == "house_ns" else at
    if at_ms < 0:
        raise Unprocessable(f"at is {-at_ms / 1000:g} s before the stream's epoch")
    ahead_ms = at_ms - (now_ns - epoch_ns) // 1_000_000
    if ahead_ms > INTERRUPT_AHEAD_MS:
        raise Unprocessable(
            f"at is {ahead_ms / 1000:.1f} s after now: a barge-in is sent when it happens "
            f"(at most {INTERRUPT_AHEAD_MS / 1000:g} s ahead, for clocks that differ)")
    return at_ms


def after(cue: StoredCue, at_ms: int) -> StoredCue | None:
    """``cue`` as a barge-in at ``at_ms`` leaves it (a retraction, or cut short), or None when
    it is untouched. The seq is the caller's to assign."""
    if cue.deleted or cue.fixed:
        return None
    text = cue_words.cut(cue.text, at_ms) if cue.start_ms < at_ms < cue.end_ms else ""
    if cue.start_ms >= at_ms or (cue.end_ms > at_ms and not text.strip()):
        return StoredCue(cue.stream, cue.lang, cue.id, cue.start_ms, cue.end_ms, "", cue.final,
                         cue.seq, "", True)
    if cue.end_ms > at_ms:
        return dataclasses.replace(cue, end_ms=at_ms, text=text)
    return None
