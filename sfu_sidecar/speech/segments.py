"""A stretch of speech on the house clock, as the detector found it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SpeechSegment:
    onset_ns: int   # house-clock capture time of the first sample of speech
    offset_ns: int  # capture time just after the last sample of speech
