"""Word timings as WebVTT cue timestamp tags: found as the cue text tokenizer finds them,
placed before their words, moved with their cue, cut at a barge-in."""

from __future__ import annotations

import pytest

from sfu_sidecar.captions import webvtt, words
from sfu_sidecar.captions.words import Tag, WordTimingError


def test_tags_are_found_as_the_tokenizer_finds_them() -> None:
    text = "a <00:01.200>b <b>c</b> <1:00:00.001>d <00:1.2>e <12:34>f &lt;00:02.000> <00:03.000"
    found = words.tags(text)
    assert [t.ms for t in found] == [1200, 3_600_001, 3000]  # bad names are ignored
    assert text[found[0].begin:found[0].end] == "<00:01.200>"
    assert found[-1].end == len(text)  # a tag the text ends inside runs to its end


def test_words_get_a_tag_each_after_the_cues_start() -> None:
    text = "Hello, big world."
    tagged = words.tag(text, [(1000, "Hello,"), (1400, "big"), (1800, "world.")], 1000, 3000)
    assert tagged == "Hello, <00:00:01.400>big <00:00:01.800>world."
    assert words.words_of(tagged, 1000) == [(1000, "Hello,"), (1400, "big"), (1800, "world.")]
    # A file with it is valid WebVTT and keeps the text as it was written.
    parsed = webvtt.parse(webvtt.serialize([webvtt.VttCue("c", 1.0, 3.0, tagged)]))
    assert [c.text for c in parsed.cues] == [tagged]
    assert [(t.ms) for t in words.tags(parsed.cues[0].text)] == [1400, 1800]


def test_words_rounded_together_share_a_tag_and_none_lands_on_the_cues_end() -> None:
    tagged = words.tag("a b c d", [(900, "a"), (1200, "b"), (1200, "c"), (2000, "d")], 1000,
                       2000)
    assert tagged == "a <00:00:01.200>b c d"


def test_words_are_matched_as_written_or_escaped_and_in_order() -> None:
    assert words.tag("AT&amp;T <i>rocks</i>", [(0, "AT&T"), (500, "rocks")], 0, 1000) \
        == "AT&amp;T <i><00:00:00.500>rocks</i>"
    with pytest.raises(WordTimingError, match=r"words\[1\] 'one'"):
        words.tag("one two", [(0, "two"), (500, "one")], 0, 1000)
    with pytest.raises(WordTimingError, match="not in the cue's text"):
        words.tag("one two", [(0, "three")], 0, 1000)


def test_shift_moves_every_tag_with_the_cue() -> None:
    tagged = "a <00:00:01.400>b <00:00:01.800>c"
    assert words.shift(tagged, 300) == "a <00:00:01.700>b <00:00:02.100>c"
    assert words.shift(tagged, -1500) == "a <00:00:00.000>b <00:00:00.300>c"
    assert words.shift("plain", 300) == "plain"


def test_cut_keeps_the_words_said_before_the_instant() -> None:
    tagged = "a <00:00:01.400>b <00:00:01.800>c"
    assert words.cut(tagged, 1800) == "a <00:00:01.400>b"
    assert words.cut(tagged, 1799) == "a <00:00:01.400>b"
    assert words.cut(tagged, 1401) == "a <00:00:01.400>b"
    assert words.cut(tagged, 1400) == "a"
    assert words.cut(tagged, 5000) == tagged
    assert words.cut("<00:00:02.000>late", 1500) == ""
    assert words.cut("no tags", 1) == "no tags"


def test_words_of_reads_what_a_viewer_reads() -> None:
    tagged = "<v Ann>Hi &amp; <00:00:02.000>bye&nbsp;now</v>\nline <00:00:03.000>two"
    assert words.words_of(tagged, 1000) == [
        (1000, "Hi"), (1000, "&"), (2000, "bye\u00a0now"), (2000, "line"), (3000, "two"),
    ]
    assert words.words_of("no tags here", 0) == []


def test_tag_positions_round_trip() -> None:
    tagged = words.tag("x y", [(0, "x"), (250, "y")], 0, 1000)
    (t,) = words.tags(tagged)
    assert t == Tag(250, 2, 2 + len("<00:00:00.250>"))
