"""Conformance of the WebVTT parser with the W3C algorithm (section 6), whole and chunked."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sfu_sidecar.captions.webvtt import (
    InvalidWebVTT,
    ParseResult,
    Region,
    Style,
    VttCue,
    WebVTTParser,
    collect_timestamp,
    format_timestamp,
    parse,
    seconds_from_ms,
    serialize,
)

H = "WEBVTT\n\n"


def cue_dicts(result: ParseResult) -> list[dict[str, Any]]:
    return [c.to_vttcue() for c in result.cues]


def only(source: str | bytes, **expected: Any) -> dict[str, Any]:
    """The one cue in ``source``; every given VTTCue attribute must match."""
    cues = cue_dicts(parse(source))
    assert len(cues) == 1, cues
    for key, value in expected.items():
        assert cues[0][key] == value, (key, cues[0])
    return cues[0]


def parse_chunked(data: bytes, cuts: list[int]) -> ParseResult:
    parser = WebVTTParser()
    result = ParseResult()
    last = 0
    for cut in sorted(set(cuts)):
        result.add(parser.feed(data[last:cut]))
        last = cut
    result.add(parser.feed(data[last:]))
    result.add(parser.close())
    return result


# --- signature (6.1 steps 4-10) -------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["", "WEBVT", "WEBVTX", "webvtt\n", "WEBVTTX\n", "WEBVTT-\n", " WEBVTT\n", "\n\nWEBVTT\n",
     "WEBVTT\u00a0\n", "\ufeff\ufeffWEBVTT\n"],
)
def test_bad_signature_is_rejected(text: str) -> None:
    with pytest.raises(InvalidWebVTT):
        parse(text)
    with pytest.raises(InvalidWebVTT):
        parse(text.encode())


@pytest.mark.parametrize(
    "text", ["WEBVTT", "WEBVTT\n", "WEBVTT \n", "WEBVTT\tfoo\n", "WEBVTT - title\n",
             "WEBVTT\r\n", "WEBVTT\r", "\ufeffWEBVTT\n", "WEBVTT header text"],
)
def test_good_signature_without_cues(text: str) -> None:
    assert parse(text).cues == []


def test_bom_is_stripped_from_bytes_once() -> None:
    only(b"\xef\xbb\xbfWEBVTT\n\n00:00.000 --> 00:01.000\nx", text="x")


def test_bad_signature_fails_before_the_file_ends() -> None:
    parser = WebVTTParser()
    with pytest.raises(InvalidWebVTT):
        parser.feed(b"WEBVTTX")  # known bad at the 7th character, before any line break


# --- line terminators and NUL (6.1 step 1) ------------------------------------------------------


@pytest.mark.parametrize("nl", ["\n", "\r\n", "\r"])
def test_line_terminators(nl: str) -> None:
    text = nl.join(["WEBVTT", "", "id", "00:00.000 --> 00:01.000", "a", "b", "", ""])
    only(text, id="id", text="a\nb")


def test_mixed_terminators_and_cr_cr_is_two_lines() -> None:
    # CR CR is two line breaks, i.e. a blank line that ends the cue.
    result = parse("WEBVTT\r\n\r\n00:00.000 --> 00:01.000\ra\r\rb\n00:02.000 --> 00:03.000\nc")
    assert [c.text for c in result.cues] == ["a", "c"]


def test_nul_becomes_replacement_character() -> None:
    only("WEBVTT\n\n00:00.000 --> 00:01.000\na\x00b", text="a\ufffdb")


def test_invalid_utf8_becomes_replacement_character() -> None:
    only(b"WEBVTT\n\n00:00.000 --> 00:01.000\na\xffb", text="a\ufffdb")


# --- header and blocks (6.1 steps 11-14, "collect a WebVTT block") ------------------------


def test_header_lines_are_not_cues() -> None:
    result = parse("WEBVTT\nKind: captions\nLanguage: en\n\n00:00.000 --> 00:01.000\nx\n")
    assert [c.text for c in result.cues] == ["x"]


def test_cue_right_after_signature_line_without_blank_line() -> None:
    # The arrow ends the header block and the line is read again as a block (11.4 "otherwise").
    only("WEBVTT\n00:00.000 --> 00:01.000\nx\n", text="x")


def test_cue_after_header_line_without_blank_line() -> None:
    only("WEBVTT\nKind: captions\n00:00.000 --> 00:01.000\nx\n", text="x")


def test_identifier_and_empty_identifier() -> None:
    result = parse(H + "intro\n00:00.000 --> 00:01.000\na\n\n00:01.000 --> 00:02.000\nb\n")
    assert [(c.id, c.text) for c in result.cues] == [("intro", "a"), ("", "b")]


def test_identifier_may_contain_anything_but_arrow() -> None:
    only(H + " spaced id: <b>&amp;\n00:00.000 --> 00:01.000\nx", id=" spaced id: <b>&amp;")


def test_three_line_block_without_arrow_on_line_two_is_skipped() -> None:
    result = parse(H + "a\nb\n00:00.000 --> 00:01.000\nx\n")
    # Line 3 has an arrow but line count is 3: the block "a\nb" ends there and line 3 starts a cue.
    assert [(c.id, c.text) for c in result.cues] == [("", "x")]


def test_arrow_inside_cue_text_ends_the_cue() -> None:
    result = parse(H + "00:00.000 --> 00:01.000\na\n00:02.000 --> 00:03.000\nb\n")
    assert [(c.start, c.text) for c in result.cues] == [(0, "a"), (2, "b")]


def test_arrow_on_second_line_after_arrow_starts_new_block() -> None:
    result = parse(H + "00:00.000 --> 00:01.000\n00:02.000 --> 00:03.000\nb\n")
    assert [(c.start, c.text) for c in result.cues] == [(0, ""), (2, "b")]


def test_text_with_arrow_that_is_not_timing_drops_rest() -> None:
    result = parse(H + "00:00.000 --> 00:01.000\na\nx --> y\nlost\n\n00:05.000 --> 00:06.000\nz")
    assert [c.text for c in result.cues] == ["a", "z"]


def test_invalid_timing_skips_the_block() -> None:
    result = parse(H + "00:00.000 --> 00:0x.000\nskipped\n\n00:01.000 --> 00:02.000\nkept\n")
    assert [c.text for c in result.cues] == ["kept"]


def test_failed_timing_on_line_one_then_good_timing_on_line_two() -> None:
    # Line 1 sets seen arrow; line 2's arrow then breaks and is re-read as a new block.
    result = parse(H + "bad --> timing\n00:01.000 --> 00:02.000\nkept\n")
    assert [(c.id, c.text) for c in result.cues] == [("", "kept")]


def test_note_blocks_are_ignored() -> None:
    result = parse(H + "NOTE a comment\nspanning lines\n\nNOTE\n\n00:00.000 --> 00:01.000\nx\n")
    assert [c.text for c in result.cues] == ["x"]


def test_note_with_arrow_on_line_two_is_a_cue_named_note() -> None:
    only(H + "NOTE\n00:00.000 --> 00:01.000\nx\n", id="NOTE", text="x")


def test_blank_lines_between_blocks_and_trailing_text() -> None:
    result = parse(H + "\n\n\n00:00.000 --> 00:01.000\nx\n\n\n\n00:01.000 --> 00:02.000\ny")
    assert [c.text for c in result.cues] == ["x", "y"]


def test_cue_with_empty_text() -> None:
    only(H + "00:00.000 --> 00:01.000\n\n", text="")
    only(H + "00:00.000 --> 00:01.000", text="")


def test_end_before_start_is_kept_as_a_browser_does() -> None:
    only(H + "00:02.000 --> 00:01.000\nx", startTime=2, endTime=1)


def test_style_block_before_cues() -> None:
    result = parse(H + "STYLE\n::cue { color: red }\n.x { }\n\n00:00.000 --> 00:01.000\nx\n")
    assert result.styles == [Style("::cue { color: red }\n.x { }")]
    assert len(result.cues) == 1


def test_style_keyword_with_trailing_whitespace_and_not_after_cues() -> None:
    result = parse(
        H + "STYLE \t\n::cue {}\n\n00:00.000 --> 00:01.000\nx\n\nSTYLE\n::cue(b) {}\n"
    )
    assert result.styles == [Style("::cue {}")]
    assert parse(H + "STYLEX\n::cue {}\n").styles == []


def test_style_block_ends_at_arrow() -> None:
    result = parse(H + "STYLE\na\n00:00.000 --> 00:01.000\nx\n")
    assert result.styles == [Style("a")]
    assert [c.text for c in result.cues] == ["x"]


def test_style_in_header_is_not_a_style() -> None:
    assert parse("WEBVTT\nSTYLE\n::cue {}\n").styles == []


# --- regions (6.2) -----------------------------------------------------------------------------


def test_region_defaults_and_settings() -> None:
    result = parse(
        H + "REGION\nid:fred width:40% lines:3 regionanchor:0%,100% viewportanchor:10%,90% "
        "scroll:up\n\nREGION\n\n00:00.000 --> 00:01.000 region:fred\nx\n"
    )
    assert result.regions[0] == Region("fred", 40.0, 3, (0.0, 100.0), (10.0, 90.0), "up")
    assert len(result.regions) == 1  # "REGION" with no settings line: buffer was never a region
    assert result.cues[0].region == "fred"


def test_region_settings_ignored_when_invalid() -> None:
    result = parse(
        H + "REGION\nid:r width:101% lines:-1 regionanchor:5% viewportanchor:x,y scroll:down "
        "junk :x y: width:.5%\n"
    )
    assert result.regions == [Region("r")]


def test_region_lines_digits_only_and_later_setting_wins() -> None:
    result = parse(H + "REGION\nlines:07 id:a id:b width:12.5%\n")
    assert result.regions == [Region("b", 12.5, 7)]
    assert result.regions[0].to_vttregion()["width"] == 12.5


def test_region_after_a_cue_is_ignored() -> None:
    result = parse(H + "00:00.000 --> 00:01.000\nx\n\nREGION\nid:late\n")
    assert result.regions == []


def test_unknown_region_and_last_region_wins() -> None:
    text = H + "REGION\nid:a lines:1\n\nREGION\nid:a lines:2\n\n00:00.000 --> 00:01.000 region:b\nx"
    assert parse(text).cues[0].region is None
    text2 = text.replace("region:b", "region:a")
    assert parse(text2).cues[0].region == "a"


@pytest.mark.parametrize(
    ("settings", "region"),
    [
        ("region:r", "r"),
        ("region:r vertical:rl", None),
        ("vertical:rl region:r", "r"),  # settings apply in order (6.3 step 2)
        ("region:r line:0", None),
        ("region:r size:50%", None),
        ("region:r size:100%", "r"),
        ("region:r vertical:xx", "r"),
        ("region:r position:10%", "r"),
    ],
)
def test_settings_that_take_a_cue_out_of_its_region(settings: str, region: str | None) -> None:
    text = H + f"REGION\nid:r\n\n00:00.000 --> 00:01.000 {settings}\nx"
    assert parse(text).cues[0].region == region


# --- timestamps (6.3 "collect a WebVTT timestamp") --------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("00:00.000", 0.0),
        ("01:02.003", 62.003),
        ("59:59.999", 3599.999),
        ("00:00:00.000", 0.0),
        ("01:00:00.000", 3600.0),
        ("1:00:00.000", 3600.0),
        ("100:00:00.001", 360000.001),
        ("60:00:00.000", 216000.0),  # three-part with 60 first: hours
        ("00:01:02.500", 62.5),
    ],
)
def test_timestamps_valid(text: str, seconds: float) -> None:
    got = collect_timestamp(text, 0)
    assert got is not None
    assert math.isclose(got[0], seconds, abs_tol=1e-9)
    assert got[1] == len(text)


@pytest.mark.parametrize(
    "text",
    [
        "0:00.000",  # one-digit first part means hours, then a third part is needed
        "60:00.000",  # first part > 59 means hours
        "00:60.000",
        "00:00:60.000",
        "00:60:00.000",
        "00:00.00",
        "00:00.0000",
        "00:00,000",
        "00:0.000",
        "000:00.000",
        "00:00",
        ":00.000",
        "a0:00.000",
        "00:00:00:00.000",
        "-00:00.000",
        "\u0661\u0662:00.000",  # Arabic-Indic digits are not ASCII digits
    ],
)
def test_timestamps_invalid(text: str) -> None:
    assert collect_timestamp(text, 0) is None
    assert parse(H + f"{text} --> 99:00:00.000\nx").cues == []


@pytest.mark.parametrize(
    "line",
    [
        "00:00.000-->00:01.000",
        "  \t00:00.000 \t --> \t00:01.000 \t ",
        "00:00.000 -->\x0c00:01.000",
    ],
)
def test_timing_line_whitespace(line: str) -> None:
    only(H + line + "\nx", startTime=0, endTime=1)


@pytest.mark.parametrize(
    "line",
    ["00:00.000 - -> 00:01.000", "00:00.000 -> 00:01.000", "00:00.000 ==> 00:01.000",
     "00:00.000\u00a0--> 00:01.000", "00:00.000 --> x 00:01.000"],
)
def test_timing_line_invalid(line: str) -> None:
    assert parse(H + line + "\nx").cues == []


def test_settings_glued_to_end_time_are_read() -> None:
    # Step 11-12 of 6.3: the remainder after the end timestamp is the settings string.
    only(H + "00:00.000 --> 00:01.000align:start\nx", align="start")


# --- cue settings (6.3 "parse the WebVTT cue settings") -----------------------------------------


DEFAULTS = {
    "vertical": "", "snapToLines": True, "line": "auto", "lineAlign": "start",
    "position": "auto", "positionAlign": "auto", "size": 100, "align": "center", "region": None,
}


def settings_of(s: str) -> dict[str, Any]:
    cue = only(H + f"00:00.000 --> 00:01.000 {s}\nx")
    return {k: cue[k] for k in DEFAULTS if cue[k] != DEFAULTS[k]}


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ("", {}),
        ("vertical:rl", {"vertical": "rl"}),
        ("vertical:lr", {"vertical": "lr"}),
        ("vertical:RL", {}),
        ("vertical:rl vertical:xx", {"vertical": "rl"}),
        ("line:0", {"line": 0}),
        ("line:-1", {"line": -1}),
        ("line:12", {"line": 12}),
        ("line:1.5", {"line": 1.5}),
        ("line:-0", {"line": 0}),  # HTML float parsing has no negative zero
        ("line:50%", {"line": 50, "snapToLines": False}),
        ("line:12.25%", {"line": 12.25, "snapToLines": False}),
        ("line:101%", {}),
        ("line:-5%", {}),
        ("line:1-", {}),
        ("line:--1", {}),
        ("line:1.", {}),
        ("line:.5", {}),
        ("line:1.2.3", {}),
        ("line:1e3", {}),
        ("line:+1", {}),
        ("line:auto", {}),
        ("line:0,center", {"line": 0, "lineAlign": "center"}),
        ("line:0,end", {"line": 0, "lineAlign": "end"}),
        ("line:0,start", {"line": 0}),
        ("line:0,middle", {}),  # a bad alignment drops the whole setting
        ("line:0,", {}),
        ("line:10%,center line:3", {"line": 3, "lineAlign": "center"}),
        ("position:0%", {"position": 0}),
        ("position:100%", {"position": 100}),
        ("position:33.5%", {"position": 33.5}),
        ("position:50", {}),
        ("position:101%", {}),
        ("position:10%,line-left", {"position": 10, "positionAlign": "line-left"}),
        ("position:10%,center", {"position": 10, "positionAlign": "center"}),
        ("position:10%,line-right", {"position": 10, "positionAlign": "line-right"}),
        ("position:10%,start", {}),
        ("position:10%,auto", {}),
        ("size:50%", {"size": 50}),
        ("size:0%", {"size": 0}),
        ("size:100.5%", {}),
        ("size:50", {}),
        ("align:start", {"align": "start"}),
        ("align:end", {"align": "end"}),
        ("align:left", {"align": "left"}),
        ("align:right", {"align": "right"}),
        ("align:middle", {}),
        ("align:Start", {}),
        ("line:1 position:20% size:30% align:end vertical:lr",
         {"line": 1, "position": 20, "size": 30, "align": "end", "vertical": "lr"}),
        (":start align: align:start:x foo:bar align:end", {"align": "end"}),
        ("align:start\u00a0line:1", {}),  # U+00A0 is no separator: one token, value invalid
        ("region:none", {}),
    ],
)
def test_cue_settings(settings: str, expected: dict[str, Any]) -> None:
    assert settings_of(settings) == expected


def test_defaults_are_the_browser_defaults() -> None:
    cue = only(H + "00:00.000 --> 00:01.000\nx")
    assert {k: cue[k] for k in DEFAULTS} == DEFAULTS


# --- incremental parsing -----------------------------------------------------------------

CORPUS = [
    H + "1\n00:00.000 --> 00:01.000 line:0 align:start\nhello\nworld\n\n"
    "2\n00:01.500 --> 00:00:03.250\n<v Bob>hi</v>\n",
    "\ufeffWEBVTT - title\r\nKind: captions\r\n\r\nREGION\r\nid:r width:50%\r\n\r\n"
    "STYLE\r\n::cue { }\r\n\r\nNOTE x\r\n\r\n00:00.000 --> 00:01.000 region:r\r\na\x00b\r\n",
    "WEBVTT\n00:00.000 --> 00:01.000\na\n00:02.000 --> 00:03.000\nb\rc\r\rd",
    "WEBVTT\r\rx\r00:01.000 --> 00:02.000\r\r\r\r01:00:00.000 --> 01:00:01.000 size:10%\rend",
    H + "bad --> x\n00:01.000 --> 00:02.000\nkept\n\nx\ny\n00:03.000 --> 00:04.000\nz\n",
    "WEBVTT\n\n00:00.000 --> 00:01.000\n\u00e9\u00e8\u4e2d\U0001f600 text\n",
]


@pytest.mark.parametrize("text", CORPUS)
def test_byte_by_byte_equals_whole(text: str) -> None:
    data = text.encode()
    whole = parse(data)
    assert parse_chunked(data, list(range(1, len(data)))) == whole
    parser = WebVTTParser()
    stepwise = ParseResult()
    for ch in text:
        stepwise.add(parser.feed(ch))
    stepwise.add(parser.close())
    assert stepwise == whole


@settings(max_examples=300, deadline=None)
@given(
    index=st.integers(0, len(CORPUS) - 1),
    cuts=st.lists(st.integers(0, 400), max_size=30),
)
def test_random_chunks_equal_whole(index: int, cuts: list[int]) -> None:
    data = CORPUS[index].encode()
    assert parse_chunked(data, [c for c in cuts if c <= len(data)]) == parse(data)


# Arbitrary line soup from WebVTT-ish fragments: every rule's trigger appears somewhere.
FRAGMENTS = [
    "WEBVTT", "", "", "00:00.000 --> 00:01.000", "00:01.000 --> 00:00:02.500 line:10%",
    "-->", "NOTE", "STYLE", "REGION", "id:r lines:2", "text", "a --> b", "\x00", "  ",
    "00:00.000 --> 00:01.000 region:r", "x\ry", "\ufeff",
]


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(st.sampled_from(FRAGMENTS), max_size=25),
    nl=st.sampled_from(["\n", "\r\n", "\r"]),
    cuts=st.lists(st.integers(0, 600), max_size=20),
    final_nl=st.booleans(),
)
def test_random_documents_chunked_equal_whole(
    lines: list[str], nl: str, cuts: list[int], final_nl: bool
) -> None:
    data = ("WEBVTT" + nl + nl.join(lines) + (nl if final_nl else "")).encode()
    whole = parse(data)
    assert parse_chunked(data, [c for c in cuts if c <= len(data)]) == whole


def test_feed_after_close_is_an_error() -> None:
    parser = WebVTTParser()
    parser.feed("WEBVTT\n")
    parser.close()
    with pytest.raises(ValueError):
        parser.feed("x")


def test_blocks_are_returned_as_soon_as_complete() -> None:
    parser = WebVTTParser()
    assert parser.feed(H + "00:00.000 --> 00:01.000\nhello\n") == []
    got = parser.feed("\n")  # the blank line ends the cue: live ingest sees it now
    assert [c.text for c in got if isinstance(c, VttCue)] == ["hello"]


# --- serializer ---------------------------------------------------------------------------------


def test_seconds_from_ms_is_the_parsed_double() -> None:
    for ms in (0, 1, 999, 1922, 59_999, 3_600_001, 123_456_789):
        text = H + f"{format_timestamp(ms / 1000)} --> 999:00:00.000\nx"
        assert parse(text).cues[0].start == seconds_from_ms(ms)


def test_format_timestamp() -> None:
    assert format_timestamp(0) == "00:00:00.000"
    assert format_timestamp(3661.5) == "01:01:01.500"
    assert format_timestamp(360000.001) == "100:00:00.001"
    with pytest.raises(ValueError):
        format_timestamp(-1)


def test_serializer_refuses_what_a_file_cannot_carry() -> None:
    with pytest.raises(ValueError):
        serialize([VttCue("", 0, 1, "a\n\nb")])
    with pytest.raises(ValueError):
        serialize([VttCue("", 0, 1, "a --> b")])
    with pytest.raises(ValueError):
        serialize([VttCue("a-->b", 0, 1, "x")])


@pytest.mark.parametrize("text", CORPUS)
def test_corpus_round_trips(text: str) -> None:
    first = parse(text)
    again = parse(serialize(first.cues, regions=first.regions, styles=first.styles))
    assert again == first


_text_line = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\x00"),
    min_size=1, max_size=12,
).filter(lambda s: "-->" not in s)
_ms = st.integers(0, 400 * 3600 * 1000)
_pct = st.one_of(st.integers(0, 100).map(float), st.floats(0, 100, allow_nan=False))


@st.composite
def cues(draw: st.DrawFn) -> VttCue:
    line_kind = draw(st.sampled_from(["auto", "lines", "pct"]))
    line: float | None = None
    snap = True
    if line_kind == "lines":
        line = float(draw(st.integers(-50, 50)))
    elif line_kind == "pct":
        line, snap = draw(_pct), False
    position = draw(st.one_of(st.none(), _pct))
    return VttCue(
        id=draw(st.one_of(st.just(""), _text_line)),
        start=seconds_from_ms(draw(_ms)),
        end=seconds_from_ms(draw(_ms)),
        text="\n".join(draw(st.lists(_text_line, max_size=3))),
        vertical=draw(st.sampled_from(["", "rl", "lr"])),
        snap_to_lines=snap,
        line=line,
        line_align=draw(st.sampled_from(["start", "center", "end"])) if line is not None
        else "start",
        position=position,
        position_align=draw(st.sampled_from(["auto", "line-left", "center", "line-right"]))
        if position is not None else "auto",
        size=draw(_pct),
        align=draw(st.sampled_from(["start", "center", "end", "left", "right"])),
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(cues(), max_size=6))
def test_serializer_round_trip(items: list[VttCue]) -> None:
    # A cue id that is whitespace-free text is safe; ids starting a block like "NOTE" still
    # parse as ids because the timing line follows on line two.
    assert parse(serialize(items)).cues == items


BYTES_CORPUS = [
    b"WEBVTT\n\n00:00.000 --> 00:01.000\nbad \xff\xfe utf-8 \xe2\x82 cut \xf0\x9f\x98\x80 ok\n",
    b"\xef\xbb\xbfWEBVTT\r\n\r\n00:00.000 --> 00:01.000\r\n\xc3\xa9\xc3\r\n\xe4\xb8",
]


@pytest.mark.parametrize("data", BYTES_CORPUS)
def test_invalid_utf8_byte_by_byte_equals_whole(data: bytes) -> None:
    whole = parse(data)
    assert "\ufffd" in whole.cues[0].text
    assert parse_chunked(data, list(range(1, len(data)))) == whole


# --- numbers past a double's range (found in the field: `line:` + 400 digits crashed) ---------

BIG = "1" * 400  # far past the largest double (about 1.8e308)
# The smallest integer that rounds to 2^1024 (half an ulp above the largest double), and the
# integer just below it, which rounds to the largest double.
OVERFLOWS = str(2**1024 - 2**970)
LARGEST = str(2**1024 - 2**970 - 1)


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (f"line:{BIG}", {}),
        (f"line:-{BIG}", {}),
        (f"line:{BIG}.5", {}),
        (f"line:{BIG},end", {}),  # the alignment goes with the number it came with
        (f"line:7 line:{BIG}", {"line": 7}),  # an error skips the setting: the last good wins
        (f"line:{OVERFLOWS}", {}),
        (f"line:{LARGEST}", {"line": 1.7976931348623157e308}),
        (f"line:-{LARGEST}", {"line": -1.7976931348623157e308}),
        (f"line:0.{BIG}", {"line": 0.1111111111111111}),
        ("line:1e400", {}),
        (f"line:{BIG}%", {}),
        (f"position:{BIG}%", {}),
        (f"size:{BIG}%", {}),
        (f"position:50.{'0' * 5000}1%", {"position": 50}),
        (f"size:{'0' * 5000}7%", {"size": 7}),
    ],
)
def test_huge_numbers_in_cue_settings(settings: str, expected: dict[str, Any]) -> None:
    """HTML float parsing makes a value that rounds to 2^1024 an error, which skips the
    setting (6.3 "line" step 3 substep 6)."""
    assert settings_of(settings) == expected


@pytest.mark.parametrize(
    ("timing", "start", "end"),
    [
        (f"{'9' * 400}:00:00.000 --> {'9' * 400}:00:01.000", math.inf, math.inf),
        (f"{'9' * 5000}:00:00.000 --> 00:01.000", math.inf, 1.0),  # past int()'s digit limit
        (f"{'0' * 5000}1:00:00.000 --> {'0' * 5000}2:00:00.000", 3600.0, 7200.0),
        ("4294967296:00:00.000 --> 4294967296:00:01.000", 15461882265600.0, 15461882265601.0),
        (f"{'9' * 305}:00:00.000 --> 00:01.000", math.inf, 1.0),  # hours * 3600 overflows
        (f"{'9' * 304}:00:00.000 --> 00:01.000", float(int("9" * 304) * 3600), 1.0),
    ],
)
def test_huge_hours_make_infinite_times(timing: str, start: float, end: float) -> None:
    """6.3 puts no bound on the hours; a sum past the largest double is +Infinity, kept as the
    algorithm keeps every time it collects (an end before its start included)."""
    cue = parse(H + timing + "\nx").cues[0]
    assert (cue.start, cue.end) == (start, end)
    out = cue.to_vttcue()
    # JSON has no infinity: written the way JavaScript prints the number.
    assert out["startTime"] == ("Infinity" if math.isinf(start) else js(start))
    json.dumps(out, allow_nan=False)


def js(value: float) -> float | int:
    return int(value) if value == int(value) and abs(value) < 2**53 else value


@pytest.mark.parametrize(
    ("lines", "expected"),
    [("9" * 5000, 2**32 - 1), ("4294967296", 2**32 - 1), ("4294967295", 2**32 - 1),
     ("0" * 5000 + "5", 5), ("0", 0)],
)
def test_region_lines_saturate_at_unsigned_long(lines: str, expected: int) -> None:
    """VTTRegion.lines is an unsigned long; Chromium's parser saturates larger numbers."""
    region = parse(H + f"REGION\nid:r lines:{lines}\n").regions[0]
    assert region.lines == expected
    json.dumps(region.to_vttregion(), allow_nan=False)


_NUMBER_TEXT = st.one_of(
    st.sampled_from([BIG, OVERFLOWS, LARGEST, "9" * 5000, "0" * 5000 + "1", "1e400", "-0",
                     "0.5", ".5", "5.", "1.2.3", "-", "", "4294967296", "NaN", "Infinity"]),
    st.from_regex(r"-?[0-9]{1,400}(\.[0-9]{1,400})?", fullmatch=True),
)


@st.composite
def numeric_files(draw: st.DrawFn) -> str:
    """WebVTT files with generated text in every numeric slot of timings and settings."""
    n = _NUMBER_TEXT
    blocks = [
        f"REGION\nid:r width:{draw(n)}% lines:{draw(n)} regionanchor:{draw(n)}%,{draw(n)}% "
        f"viewportanchor:{draw(n)}%,{draw(n)}% scroll:up"
    ]
    for _ in range(draw(st.integers(1, 4))):
        hours = draw(st.one_of(st.just(""), n.map(lambda t: t.lstrip("-") + ":")))
        timing = f"{hours}{draw(n)}:{draw(n)}.{draw(n)} --> {draw(n)}:00:00.000"
        settings = " ".join(draw(st.lists(st.sampled_from(
            [f"line:{draw(n)}", f"line:{draw(n)}%", f"line:{draw(n)},end", f"position:{draw(n)}%",
             f"size:{draw(n)}%", "region:r", "align:start"]), max_size=4)))
        blocks.append(f"{timing} {settings}\ntext")
    return H + "\n\n".join(blocks) + "\n"


@settings(max_examples=200, deadline=None)
@given(numeric_files(), st.lists(st.integers(0, 20000), max_size=8))
def test_numeric_junk_parses_to_json_safe_cues(text: str, cuts: list[int]) -> None:
    """Whatever the numbers, the parser returns cues (never raises), every attribute is valid
    JSON, and chunked input gives the same result."""
    result = parse(text)
    for cue in result.cues:
        out = cue.to_vttcue()
        json.dumps(out, allow_nan=False)
        assert out["line"] == "auto" or math.isfinite(out["line"])
        assert math.isfinite(cue.position or 0) and 0 <= cue.size <= 100
    for region in result.regions:
        json.dumps(region.to_vttregion(), allow_nan=False)
        assert 0 <= region.lines <= 2**32 - 1
    data = text.encode()
    assert parse_chunked(data, [c for c in cuts if c <= len(data)]) == result


def chromium_cues(browser: Any, text: str) -> list[dict[str, Any]]:
    """The cues Chromium's own WebVTT parser makes of ``text`` (a <track> on a page)."""
    page = browser.new_page()
    try:
        page.route("http://vtt.test/t.vtt", lambda route: route.fulfill(
            status=200, body=text.encode(), headers={"Content-Type": "text/vtt"}))
        page.route("http://vtt.test/", lambda route: route.fulfill(
            status=200, body=b"<video></video>", headers={"Content-Type": "text/html"}))
        page.goto("http://vtt.test/")
        cues: list[dict[str, Any]] = page.evaluate(
            """() => new Promise((resolve, reject) => {
                const track = document.createElement('track');
                track.kind = 'subtitles';
                track.src = 'http://vtt.test/t.vtt';
                track.default = true;
                track.onload = () => resolve(Array.from(track.track.cues).map(c => ({
                    id: c.id, startTime: String(c.startTime), endTime: String(c.endTime),
                    line: String(c.line), snapToLines: c.snapToLines,
                    position: String(c.position), size: String(c.size), align: c.align,
                })));
                track.onerror = () => reject(new Error('track failed to load'));
                document.querySelector('video').appendChild(track);
            })"""
        )
        return cues
    finally:
        page.close()


def test_huge_numbers_match_chromium(browser: Any) -> None:
    """The overflow cases above, parsed by Chromium's VTTCue parser: same attributes.

    Times are compared only where Chromium can hold them: it keeps media time in integer
    microseconds, so it reports Infinity from about 2.56e9 hours on, where the algorithm (and
    this parser) still has a finite time. Past the range of a double both say Infinity.
    """
    settings_cases = [
        f"line:{BIG}", f"line:-{BIG}", f"line:{BIG}.5", f"line:7 line:{BIG}",
        f"line:{OVERFLOWS}", f"line:{LARGEST}", f"line:-{LARGEST}", f"line:0.{BIG}", "line:1e400",
        f"line:{BIG}%", f"position:{BIG}%", f"size:{BIG}%", f"position:50.{'0' * 5000}1%",
        f"size:{'0' * 5000}7%", "line:-0", "line:12.5",
    ]
    blocks = [f"c{i}\n00:00.000 --> 00:01.000 {s}\nx" for i, s in enumerate(settings_cases)]
    blocks.append(f"inf\n{'9' * 400}:00:00.000 --> {'9' * 5000}:00:00.000\nx")
    blocks.append(f"zeros\n{'0' * 5000}1:00:00.000 --> 1000000:00:00.000\nx")
    text = H + "\n\n".join(blocks) + "\n"
    ours = {c.id: c.to_vttcue() for c in parse(text).cues}
    theirs = {c["id"]: c for c in chromium_cues(browser, text)}
    assert set(theirs) == set(ours)

    def number(value: Any) -> Any:
        return value if value == "auto" else float(value)

    for cue_id, cue in ours.items():
        chromium = theirs[cue_id]
        for key in ("startTime", "endTime", "line", "position", "size"):
            assert number(chromium[key]) == number(cue[key]), (cue_id, key, chromium, cue)
        assert chromium["snapToLines"] == cue["snapToLines"], (cue_id, chromium, cue)
        assert chromium["align"] == cue["align"], (cue_id, chromium, cue)
