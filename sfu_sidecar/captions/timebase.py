"""A caption batch's times onto the stream's timeline: house-time cues checked against now and
converted to stream milliseconds, words' times likewise (pure)."""

from __future__ import annotations

from collections.abc import Sequence

from sfu_sidecar.captions import words as cue_words
from sfu_sidecar.captions.model import MAX_HOUSE_SKEW_NS, CueInput
from sfu_sidecar.exceptions import Unprocessable


def check_house_times(cues: Sequence[CueInput], now_ns: int) -> None:
    """Refuse a batch in house time whose times are far from now (a wrong clock or unit)."""
    for i, cue in enumerate(cues):
        for what, t in (("start", cue.start), ("end", cue.end)):
            if abs(t - now_ns) > MAX_HOUSE_SKEW_NS:
                raise Unprocessable(
                    f"cues[{i}].{what} is {abs(t - now_ns) / 1e9:.0f} s away from house "
                    "time now: wrong clock or unit?"
                )


def stream_interval_ms(cue: CueInput, timebase: str, epoch: int, i: int) -> tuple[int, int]:
    """The cue's (start, end) in stream milliseconds; ``i`` names it in a refusal."""
    if timebase != "house_ns":
        return cue.start, cue.end
    start_ms = (cue.start - epoch + 500_000) // 1_000_000
    end_ms = (cue.end - epoch + 500_000) // 1_000_000
    if end_ms <= 0:
        raise Unprocessable(f"cues[{i}] ends {-end_ms} ms before the stream epoch {epoch}")
    # A cue that began before the stream did (captions posted ahead of the first frame, which
    # then fixed the epoch) is shown from the stream's start.
    start_ms = max(0, start_ms)
    if end_ms <= start_ms:
        raise Unprocessable(f"cues[{i}] is shorter than a millisecond")
    return start_ms, end_ms


def tag_words(cue: CueInput, timebase: str, epoch: int, interval: tuple[int, int],
              i: int) -> str:
    """The cue's text with its words' timestamp tags, in stream time like its own."""
    if timebase == "house_ns":
        timed = [((t - epoch + 500_000) // 1_000_000, w) for t, w in cue.words]
    else:
        timed = list(cue.words)
    try:
        return cue_words.tag(cue.text, timed, *interval)
    except cue_words.WordTimingError as exc:
        raise Unprocessable(f"cues[{i}].{exc}") from None
