"""Word-timed captions in Chromium: on every presented frame, the words of the cue on screen
that the frame's capture time has reached are past (``::cue(:past)``) and the rest future, as
the browser itself compares the cue's timestamps with currentTime
(tests/e2e/words_probe.py)."""

from __future__ import annotations

import re

import pytest

from sfu_sidecar.captions import words
from sfu_sidecar.captions.webvtt import collect_timestamp
from tests.support import probe as probes

pytestmark = [pytest.mark.browser, pytest.mark.netns, pytest.mark.needs("espeak-ng"),
              pytest.mark.timeout(180)]

TAG = re.compile(r"<(\d[^>]*)>")


def shown_past(text: str, current_time: float) -> int:
    """Timestamps of a shown cue text the browser counts as past at ``current_time``."""
    times = [collect_timestamp(m.group(1), 0) for m in TAG.finditer(text)]
    return sum(1 for t in times if t is not None and t[0] <= current_time)


def test_the_words_reached_by_the_frame_on_screen_are_past_and_the_rest_future() -> None:
    result = probes.run_probe("tests.e2e.words_probe", timeout=150)
    stored = {c["id"]: c for c in result["feed"]["cues"]}
    said_ids = [cue_id for cue_id, _, _ in result["said"]]
    assert all(len(words.tags(stored[i]["text"])) >= 5 for i in said_ids), stored
    checked = boundary = 0
    reached: dict[str, set[int]] = {i: set() for i in said_ids}
    wrong = []
    for stream_s, current_time, active in result["frames"]:
        for cue_id, text in active:
            if cue_id not in stored:
                continue
            tag_s = [t.ms / 1000 for t in words.tags(stored[cue_id]["text"])]
            if any(abs(s - stream_s) < 1e-6 for s in tag_s):
                boundary += 1  # a frame captured on a word's very millisecond: either is right
                continue
            expected = sum(1 for s in tag_s if s <= stream_s)
            got = shown_past(text, current_time)
            checked += 1
            reached[cue_id].add(got)
            if got != expected:
                wrong.append((cue_id, stream_s, current_time, expected, got, text))
    print(f"{len(result['frames'])} frames, {checked} cue states checked ({boundary} on a "
          f"word's millisecond); words reached per cue: "
          f"{ {i: sorted(r) for i, r in reached.items()} }; wrong: {wrong[:3]}")
    assert checked >= 100, result["frames"][:5]
    assert wrong == []
    # Every cue was seen going through its words, not shown all past or all future.
    for cue_id in said_ids:
        assert len(reached[cue_id]) >= 4, (cue_id, reached[cue_id])
