"""Word timings inside cue text, as WebVTT cue timestamp tags (``<00:00:01.200>``).

A TTS engine knows when each word is said; WebVTT carries that as timestamp tags in the cue
text, before the word they time (WebVTT 6.4, "cue text parsing rules"; browsers style the text
before and after the playback position with ``::cue(:past)`` and ``::cue(:future)``). Word
times are therefore stored in the cue text itself, in stream time like the cue's own times:
every reader of cue text (chunks, the HLS subtitle rendition, the live push, the change feed,
a cascade edge) carries them unchanged, and the file stays valid WebVTT.

Valid cue text with timestamps needs each timestamp after the cue's start, after the one
before it, and before the cue's end; words are checked against that at ingest. Times here are
integer milliseconds of stream time, as cues are stored.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from sfu_sidecar.captions import webvtt

_ESCAPES = (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"))
_ENTITIES = {"&amp;": "&", "&lt;": "<", "&gt;": ">", "&nbsp;": "\u00a0", "&lrm;": "\u200e",
             "&rlm;": "\u200f"}
_ENTITY_RE = re.compile("|".join(map(re.escape, _ENTITIES)))
_SPACE_RE = re.compile(r"[ \t\n\f]+")
# A tag as the cue text tokenizer reads one: from "<" to ">" or to the end of the text.
_MARKUP_RE = re.compile(r"<([^>]*)>?")
_TIMESTAMP_RE = re.compile(r"(?:([0-9]+):)?([0-9]{2}):([0-9]{2})\.([0-9]{3})")


class WordTimingError(ValueError):
    """Words that cannot be tagged into their cue's text; the message says why."""


@dataclass(frozen=True, slots=True)
class Tag:
    """A timestamp tag found in cue text: its time and where it sits (``text[begin:end]``)."""

    ms: int
    begin: int
    end: int


def escape(word: str) -> str:
    """A word as it appears in cue text (``&``, ``<`` and ``>`` are markup there)."""
    for raw, escaped in _ESCAPES:
        word = word.replace(raw, escaped)
    return word


def format_tag(ms: int) -> str:
    return f"<{webvtt.format_timestamp(ms / 1000)}>"


def timestamp_ms(name: str) -> int | None:
    """Milliseconds of a tag name that is exactly one WebVTT timestamp (6.3, "collect a WebVTT
    timestamp", to the end of the name), else None: ``mm:ss.ttt`` with minutes up to 59, or
    ``h+:mm:ss.ttt``; minutes and seconds up to 59."""
    m = _TIMESTAMP_RE.fullmatch(name)
    if m is None:
        return None
    hours, minutes, seconds, millis = m.groups()
    if int(minutes) > 59 or int(seconds) > 59 or (hours is not None and len(hours) > 15):
        return None
    return ((int(hours or 0) * 60 + int(minutes)) * 60 + int(seconds)) * 1000 + int(millis)


def tags(text: str) -> list[Tag]:
    """The timestamp tags of ``text``, in order, as the cue text tokenizer finds them: every
    tag runs from ``<`` to ``>`` or the end of the text, and one whose name is exactly one
    WebVTT timestamp is a timestamp (others are ignored, as by a browser)."""
    if "<" not in text:
        return []
    out: list[Tag] = []
    for m in _MARKUP_RE.finditer(text):
        name = m.group(1)
        if "0" <= name[:1] <= "9":
            ms = timestamp_ms(name)
            if ms is not None:
                out.append(Tag(ms, m.start(), m.end()))
    return out


def tag(text: str, words: Sequence[tuple[int, str]], start_ms: int, end_ms: int) -> str:
    """``text`` with a timestamp tag before each word of ``words`` (stream ms, word) that
    starts inside the cue [start_ms, end_ms). Each word must appear in the text in order (as
    written, or with ``&<>`` escaped). Words whose times round to one millisecond share the
    first one's tag; a word at or before the cue's start needs none (it is shown from the
    start), and one rounded onto its end none either (a tag there is not valid WebVTT)."""
    out: list[str] = []
    cursor = 0
    last_ms = start_ms
    markup = [(m.start(), m.end()) for m in _MARKUP_RE.finditer(text)] if "<" in text else []
    for i, (ms, word) in enumerate(words):
        found = _find_word(text, word, cursor, markup)
        if found is None:
            raise WordTimingError(
                f"words[{i}] {word[:40]!r} is not in the cue's text after the words before it")
        begin, end = found
        out.append(text[cursor:begin])
        if last_ms < ms < end_ms:
            out.append(format_tag(ms))
            last_ms = ms
        out.append(text[begin:end])
        cursor = end
    out.append(text[cursor:])
    return "".join(out)


def _find_word(text: str, word: str, cursor: int,
               markup: list[tuple[int, int]]) -> tuple[int, int] | None:
    """Where ``word`` is next in ``text`` from ``cursor``, outside ``markup`` (the ``v`` of
    ``<v Anna>`` is no word): as a whole word if it is one there ("a" is not the a of "say"),
    else inside a longer one; as written or with ``&<>`` escaped."""

    def first(pattern: re.Pattern[str]) -> int | None:
        for m in pattern.finditer(text, cursor):
            at = m.start()
            if not any(b <= at < e for b, e in markup):
                return at
        return None

    best: tuple[int, int] | None = None
    for form in dict.fromkeys((escape(word), word)):
        at = first(_whole_word(form))
        if at is None:
            at = first(re.compile(re.escape(form)))
        if at is not None and (best is None or at < best[0]):
            best = (at, at + len(form))
    return best


@functools.lru_cache(maxsize=4096)
def _whole_word(form: str) -> re.Pattern[str]:
    return re.compile(r"(?<!\w)" + re.escape(form) + r"(?!\w)")


def shift(text: str, delta_ms: int) -> str:
    """``text`` with every timestamp tag moved by ``delta_ms`` (a cue moved with its words)."""
    found = tags(text)
    if not found or delta_ms == 0:
        return text
    out: list[str] = []
    cursor = 0
    for t in found:
        out.append(text[cursor:t.begin])
        out.append(format_tag(max(0, t.ms + delta_ms)))
        cursor = t.end
    out.append(text[cursor:])
    return "".join(out)


def cut(text: str, at_ms: int) -> str:
    """The text said before ``at_ms``: everything before the first timestamp tag at or after
    it, trailing space dropped. Empty when the first word is already at or after it."""
    for t in tags(text):
        if t.ms >= at_ms:
            return text[:t.begin].rstrip(" \t\n\f")
    return text


def _plain(markup: str) -> str:
    """Cue text without its tags, entities decoded: what a viewer reads."""
    if "<" not in markup and "&" not in markup:
        return markup
    no_tags = _MARKUP_RE.sub("", markup)
    return _ENTITY_RE.sub(lambda m: _ENTITIES[m.group()], no_tags)


def words_of(text: str, start_ms: int) -> list[tuple[int, str]]:
    """(stream ms, word) of every word a viewer reads in ``text``, each at the time of the
    timestamp tag before it, or the cue's start; empty when the text has no tags."""
    found = tags(text)
    if not found:
        return []
    out: list[tuple[int, str]] = []
    spans = [(start_ms, 0, found[0].begin)]
    spans += [(t.ms, t.end, nxt.begin) for t, nxt in pairwise(found)]
    spans.append((found[-1].ms, found[-1].end, len(text)))
    for ms, begin, end in spans:
        out.extend((ms, w) for w in _SPACE_RE.split(_plain(text[begin:end])) if w)
    return out
