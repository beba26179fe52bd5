"""Stored cues on the stream timeline, and the rules that validate what producers send.

Times are integer milliseconds of stream time (WebVTT carries milliseconds, 6.3 step 13), so
a cue converted once at ingest never drifts by float rounding afterwards.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sfu_sidecar.captions import webvtt
from sfu_sidecar.captions import words as cue_words
from sfu_sidecar.captions.events import Cue, CueRetract
from sfu_sidecar.exceptions import BadInput, PayloadTooLarge, Unprocessable
from sfu_sidecar.streamname import RULE, is_stream_name

MAX_CUES_PER_REQUEST = 500
MAX_TEXT_CHARS = 2000
# A cue of MAX_TEXT_CHARS holds about 400 words; each adds a 14-character timestamp tag.
MAX_WORDS_PER_CUE = 500
# A caption longer than an hour is a producer bug, and it would be repeated in 1800 chunks.
MAX_CUE_MS = 3_600_000
# Ten years of stream time: anything later is a unit mistake (ns or ms sent as seconds).
MAX_STREAM_MS = 10 * 366 * 86_400_000
# House-time cues more than a day away from now are absurd (a wrong clock or wrong unit).
MAX_HOUSE_SKEW_NS = 86_400 * 10**9

LANG_RE = re.compile(r"[A-Za-z]{1,8}(?:-[A-Za-z0-9]{1,8}){0,4}")
CUE_ID_RE = re.compile(r"[A-Za-z0-9._~:@+-]{1,128}")
TIMEBASES = ("house_ns", "stream_s")
# Ids the service makes for cues sent without one; producers may not use the prefix.
GENERATED_ID_PREFIX = "auto-"


@dataclass(frozen=True, slots=True)
class StoredCue:
    """One cue as stored. ``deleted`` marks a retraction (kept so feeds can report it)."""

    stream: str
    lang: str
    id: str
    start_ms: int
    end_ms: int
    text: str
    final: bool
    seq: int
    settings: str = ""
    deleted: bool = False
    fixed: bool = False  # its author's times are never moved by caption alignment
    shift_ms: int = 0  # moved this far onto the voice by caption alignment (start - author's)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.stream, self.lang, self.id)

    @property
    def start(self) -> float:
        return webvtt.seconds_from_ms(self.start_ms)

    @property
    def end(self) -> float:
        return webvtt.seconds_from_ms(self.end_ms)

    def cue_event(self) -> Cue:
        """The live event of this cue as it now stands (its text, times, finality, settings)."""
        return Cue(self.stream, self.lang, self.id, self.start, self.end, self.text, self.final,
                   self.settings, self.fixed, self.shift_ms)

    def event(self) -> Cue | CueRetract:
        """The live event this record causes: the cue, or its retraction."""
        if self.deleted:
            return CueRetract(self.stream, self.lang, self.id)
        return self.cue_event()

    def same_content(self, other: StoredCue) -> bool:
        return (
            self.start_ms, self.end_ms, self.text, self.final, self.settings, self.deleted,
            self.fixed, self.shift_ms,
        ) == (other.start_ms, other.end_ms, other.text, other.final, other.settings, other.deleted,
              other.fixed, other.shift_ms)

    def to_webvtt(self) -> webvtt.VttCue:
        settings = webvtt.parse_cue_settings(self.settings, ()) if self.settings else {}
        return webvtt.VttCue(self.id, self.start, self.end, self.text, **settings)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id, "lang": self.lang, "start": self.start, "end": self.end,
            "text": self.text, "final": self.final, "seq": self.seq,
        }
        if self.settings:
            out["settings"] = self.settings
        if self.fixed:
            out["fixed"] = True
        if self.shift_ms:
            # Moved onto the voice: the author's own times stay readable.
            out["aligned_ms"] = self.shift_ms
            out["author_start"] = webvtt.seconds_from_ms(self.start_ms - self.shift_ms)
            out["author_end"] = webvtt.seconds_from_ms(self.end_ms - self.shift_ms)
        if self.deleted:
            out["retracted"] = True
        else:
            timed = _feed_words(self.text, self.start_ms)
            if timed:
                out["words"] = [{"start": s, "text": w} for s, w in timed]
        return out


@functools.lru_cache(maxsize=8192)
def _feed_words(text: str, start_ms: int) -> tuple[tuple[float, str], ...]:
    """The ``words`` of a cue in the change feed: read back from its text once, as a feed is
    read again and again (catch-ups, pollers) while a cue's text rarely changes."""
    return tuple((webvtt.seconds_from_ms(ms), w) for ms, w in cue_words.words_of(text, start_ms))


@dataclass(frozen=True, slots=True)
class CueInput:
    """A validated cue from a producer, times still in the request's timebase.

    ``start``/``end`` are house ns (int) or stream milliseconds (int) depending on the batch.
    """

    id: str | None
    start: int
    end: int
    text: str
    final: bool
    settings: str = ""
    fixed: bool = False
    shift_ms: int = 0  # only from an upstream relay's cue, never from a producer
    # When each word is said: (start, word), start in the batch's timebase like the cue's.
    words: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True, slots=True)
class IngestBatch:
    lang: str
    timebase: str
    cues: tuple[CueInput, ...]


def check_stream(stream: str) -> str:
    if not is_stream_name(stream):
        raise BadInput(f"stream names are {RULE}")
    return stream


def check_lang(lang: Any) -> str:
    if not isinstance(lang, str) or len(lang) > 35 or LANG_RE.fullmatch(lang) is None:
        raise Unprocessable("lang must be a BCP 47 language tag such as 'en' or 'pt-BR'")
    return str(lang)


def check_cue_id(cue_id: Any, where: str = "id", *, generated_ok: bool = False) -> str:
    if not isinstance(cue_id, str) or CUE_ID_RE.fullmatch(cue_id) is None:
        raise Unprocessable(f"{where}: cue ids are 1-128 characters of A-Z a-z 0-9 . _ ~ : @ + -")
    if not generated_ok and cue_id.startswith(GENERATED_ID_PREFIX):
        raise Unprocessable(f"{where}: ids starting with {GENERATED_ID_PREFIX!r} are reserved")
    return str(cue_id)


def normalize_text(text: str) -> str:
    # Producers send CRLF as often as LF; the file format has only LF after parsing (6.1 step 1).
    return text.replace("\r\n", "\n").replace("\r", "\n")


def check_text(text: Any, where: str) -> str:
    if not isinstance(text, str):
        raise Unprocessable(f"{where}.text must be a string")
    return _checked_text(normalize_text(text), where)


def _checked_text(text: str, where: str) -> str:
    if not text.strip():
        raise Unprocessable(f"{where}.text is empty")
    if len(text) > MAX_TEXT_CHARS:
        raise PayloadTooLarge(f"{where}.text is over {MAX_TEXT_CHARS} characters")
    reason = webvtt.check_cue_text(text)
    if reason is not None:
        raise Unprocessable(f"{where}: {reason}")
    return text


def _time(value: Any, timebase: str, where: str) -> int:
    """A cue time as int: house ns, or stream ms rounded to the millisecond."""
    if isinstance(value, bool):
        raise Unprocessable(f"{where} must be a number")
    if timebase == "house_ns":
        if not isinstance(value, int):
            raise Unprocessable(f"{where} must be an integer (house time in ns)")
        return value
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise Unprocessable(f"{where} must be a finite number of seconds")
    if value < 0 or value * 1000 > MAX_STREAM_MS:
        raise Unprocessable(f"{where} = {value} s is outside the stream timeline (0 .. 10 years)")
    return round(value * 1000)


def parse_json_batch(doc: Any, max_cues: int = MAX_CUES_PER_REQUEST) -> IngestBatch:
    """Validate a JSON/msgpack ingest body: ``{"timebase", "lang", "cues": [...]}``.

    ``max_cues`` is the service's ``max_cues_per_request`` setting.
    """
    if not isinstance(doc, Mapping):
        raise Unprocessable("body must be a JSON object with timebase, lang and cues")
    timebase = doc.get("timebase")
    if timebase not in TIMEBASES:
        raise Unprocessable(f"timebase must be one of {', '.join(TIMEBASES)}, got {timebase!r}")
    lang = check_lang(doc.get("lang"))
    raw_cues = doc.get("cues")
    if not isinstance(raw_cues, list) or not raw_cues:
        raise Unprocessable("cues must be a non-empty list")
    if len(raw_cues) > max_cues:
        raise PayloadTooLarge(
            f"{len(raw_cues)} cues in one request; at most {max_cues} "
            "(setting max_cues_per_request)"
        )
    cues = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_cues):
        where = f"cues[{i}]"
        if not isinstance(raw, Mapping):
            raise Unprocessable(f"{where} must be an object")
        unknown = set(raw) - {"id", "start", "end", "text", "final", "settings", "fixed",
                              "words"}
        if unknown:
            raise Unprocessable(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        cue_id = None if raw.get("id") is None else check_cue_id(raw["id"], f"{where}.id")
        if cue_id is not None:
            if cue_id in seen:
                raise Unprocessable(f"{where}: id {cue_id!r} appears twice in one request")
            seen.add(cue_id)
        if "start" not in raw or "end" not in raw:
            raise Unprocessable(f"{where} needs start and end")
        start = _time(raw["start"], timebase, f"{where}.start")
        end = _time(raw["end"], timebase, f"{where}.end")
        final = raw.get("final", True)
        if not isinstance(final, bool):
            raise Unprocessable(f"{where}.final must be true or false")
        settings = check_settings(raw.get("settings", ""), f"{where}.settings")
        fixed = raw.get("fixed", False)
        if not isinstance(fixed, bool):
            raise Unprocessable(f"{where}.fixed must be true or false")
        words = _words(raw.get("words"), timebase, start, end, where)
        text = raw.get("text")
        if text is None and words:
            text = " ".join(w for _, w in words)  # the words alone make the text
        if words and isinstance(text, str) and cue_words.tags(text):
            raise Unprocessable(f"{where}: the text has timestamp tags already; send words "
                                "or tags, not both")
        cues.append(CueInput(cue_id, start, end, check_text(text, where), final,
                             settings, fixed, words=words))
        _check_interval(cues[-1], timebase, where)
    return IngestBatch(lang, timebase, tuple(cues))


def _words(raw: Any, timebase: str, start: int, end: int,
           where: str) -> tuple[tuple[int, str], ...]:
    """A cue's ``words``: ``[{"start", "text"[, "end"]}, ...]`` in the batch's timebase, each
    inside the cue, in order, none overlapping the next. ``end`` is checked but not kept:
    WebVTT times when each word starts, and a word lasts until the next."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        raise Unprocessable(f"{where}.words must be a non-empty list of {{start, text}}")
    if len(raw) > MAX_WORDS_PER_CUE:
        raise PayloadTooLarge(f"{where}: {len(raw)} words in one cue; at most "
                              f"{MAX_WORDS_PER_CUE}")
    out: list[tuple[int, str]] = []
    last_end: int | None = None
    for i, item in enumerate(raw):
        at = f"{where}.words[{i}]"
        if not isinstance(item, Mapping) or set(item) - {"start", "end", "text"}:
            raise Unprocessable(f"{at} must be an object of start, text and an optional end")
        text = item.get("text")
        if not isinstance(text, str) or not text.strip() or len(text) > MAX_TEXT_CHARS:
            raise Unprocessable(f"{at}.text must be a non-empty string")
        if "start" not in item:
            raise Unprocessable(f"{at} needs start")
        w_start = _time(item["start"], timebase, f"{at}.start")
        if not start <= w_start < end:
            raise Unprocessable(f"{at} starts outside its cue (at {item['start']}, the cue is "
                                f"[{_show(start, timebase)}, {_show(end, timebase)}))")
        if out and w_start <= out[-1][0]:
            raise Unprocessable(f"{at} starts at or before the word before it: words are in "
                                "the order they are said, each after the last")
        if last_end is not None and w_start < last_end:
            raise Unprocessable(f"{at} starts before the word before it ends (overlapping)")
        last_end = None
        if item.get("end") is not None:
            w_end = _time(item["end"], timebase, f"{at}.end")
            if not w_start < w_end <= end:
                raise Unprocessable(f"{at}.end must be after its start and not after the "
                                    "cue's end")
            last_end = w_end
        out.append((w_start, normalize_text(text).strip()))
    return tuple(out)


def _show(t: int, timebase: str) -> str:
    return str(t) if timebase == "house_ns" else f"{t / 1000:g} s"


def parse_interrupt(doc: Any) -> tuple[int, str]:
    """A barge-in body, ``{"at": T, "timebase": "house_ns" (default) | "stream_s"}``: the
    time the speaker was cut off, as (house ns or stream ms, timebase)."""
    if not isinstance(doc, Mapping):
        raise Unprocessable("body must be a JSON object with at (and timebase)")
    unknown = set(doc) - {"at", "timebase", "lang", "op", "ref"}  # the last three: WebSocket
    if unknown:
        raise Unprocessable(f"unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    timebase = doc.get("timebase", "house_ns")
    if timebase not in TIMEBASES:
        raise Unprocessable(f"timebase must be one of {', '.join(TIMEBASES)}, got {timebase!r}")
    if "at" not in doc:
        raise Unprocessable("at is required: when the speaker was cut off")
    return _time(doc["at"], timebase, "at"), timebase


def _check_interval(cue: CueInput, timebase: str, where: str) -> None:
    scale = 1_000_000 if timebase == "house_ns" else 1
    if cue.end <= cue.start:
        raise Unprocessable(f"{where}: end must be after start (zero-length cues are never shown)")
    if cue.end - cue.start > MAX_CUE_MS * scale:
        raise Unprocessable(f"{where}: a cue may last at most {MAX_CUE_MS // 1000} s")


def parse_vtt_batch(body: bytes, lang: Any, max_cues: int = MAX_CUES_PER_REQUEST) -> IngestBatch:
    """A ``text/vtt`` body: cue times are stream time; cue identifiers become cue ids."""
    lang = check_lang(lang)
    try:
        result = webvtt.parse(body)
    except webvtt.InvalidWebVTT as exc:
        raise Unprocessable(f"not a WebVTT file: {exc.reason}") from None
    if not result.cues:
        raise Unprocessable("the WebVTT file has no valid cues")
    if len(result.cues) > max_cues:
        raise PayloadTooLarge(
            f"{len(result.cues)} cues in one request; at most {max_cues} "
            "(setting max_cues_per_request)"
        )
    cues = []
    seen: set[str] = set()
    for i, cue in enumerate(result.cues):
        where = f"cue {i + 1} ({cue.id or 'no id'})"
        cue_id = check_cue_id(cue.id, where) if cue.id else None
        if cue_id is not None:
            if cue_id in seen:
                raise Unprocessable(f"{where}: id appears twice")
            seen.add(cue_id)
        start = _time(cue.start, "stream_s", f"{where} start")
        end = _time(cue.end, "stream_s", f"{where} end")
        # Regions are not stored, so a cue keeps its other settings but not its region.
        settings = webvtt.format_settings(
            webvtt.VttCue("", 0, 0, "", **{**_settings_of(cue), "region": None})
        )
        item = CueInput(cue_id, start, end, check_text(cue.text, where), True, settings)
        _check_interval(item, "stream_s", where)
        cues.append(item)
    return IngestBatch(lang, "stream_s", tuple(cues))


MAX_SETTINGS_CHARS = 200
# The Cue field each cue setting a producer may name sets (regions are not stored).
_SETTING_FIELDS = {"vertical": "vertical", "line": "line", "position": "position",
                   "size": "size", "align": "align"}


def check_settings(value: Any, where: str) -> str:
    """WebVTT cue settings given in JSON, as stored: each one must be a setting WebVTT knows
    with a value it accepts (a file's parser skips bad ones silently; an API says why)."""
    if not isinstance(value, str):
        raise Unprocessable(f"{where} must be a string of WebVTT cue settings")
    if len(value) > MAX_SETTINGS_CHARS:
        raise Unprocessable(f"{where} is longer than {MAX_SETTINGS_CHARS} characters")
    unset = object()
    for token in value.split():
        name = token.partition(":")[0]
        field_name = _SETTING_FIELDS.get(name)
        if field_name is None:
            raise Unprocessable(
                f"{where}: {token!r} is not a cue setting here "
                f"({', '.join(_SETTING_FIELDS)})"
            )
        if webvtt.parse_cue_settings(token, (), {field_name: unset})[field_name] is unset:
            raise Unprocessable(f"{where}: {token!r} has a value WebVTT does not accept")
    return normalize_settings(value)


def normalize_settings(settings: str) -> str:
    """A cue settings list as this node would store it: parsed as WebVTT does (unknown or bad
    settings dropped, no region) and written back with only non-default values."""
    if not settings:
        return ""
    parsed = webvtt.parse_cue_settings(settings, ())
    return webvtt.format_settings(webvtt.VttCue("", 0, 0, "", **{**parsed, "region": None}))


def _settings_of(cue: webvtt.VttCue) -> dict[str, Any]:
    return {
        "vertical": cue.vertical, "snap_to_lines": cue.snap_to_lines, "line": cue.line,
        "line_align": cue.line_align, "position": cue.position,
        "position_align": cue.position_align, "size": cue.size, "align": cue.align,
    }


@dataclass(frozen=True, slots=True)
class IngestResult:
    cue: StoredCue
    # "new", "updated", "unchanged", "stale" (interim after final: ignored), "interrupted"
    # (a revision of a cue a barge-in retracted or cut: ignored)
    result: str

    def to_json(self) -> dict[str, object]:
        out = self.cue.to_json()
        out["result"] = self.result
        return out


@dataclass(frozen=True, slots=True)
class Interruption:
    """What a barge-in did: the cues it retracted and the cues it cut short."""

    stream: str
    lang: str
    at_ms: int | None  # None: the stream had no caption yet
    retracted: tuple[str, ...]
    cut: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {"stream": self.stream, "lang": self.lang,
                "at": None if self.at_ms is None else webvtt.seconds_from_ms(self.at_ms),
                "retracted": list(self.retracted), "cut": list(self.cut)}
