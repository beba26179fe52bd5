"""HLS playlists of live segments, exact text for a crafted window: a segment longer than the
configured duration (a late keyframe), one closed early at a break in the timeline, the
discontinuity after it, and the window sliding over that discontinuity."""

from __future__ import annotations

import re

import pytest

from sfu_sidecar.segments.hls import (
    bandwidth,
    master_playlist,
    media_playlist,
    subtitle_playlist,
    target_duration,
)
from sfu_sidecar.segments.segmenter import Segment

EPOCH_NS = 1_700_000_000_123_456_789  # 2023-11-14T22:13:20.123456789Z


def _segment(start_us: int, duration_us: int, size: int, sequence: int,
             discontinuity_sequence: int, *, discontinuity: bool = False) -> Segment:
    return Segment(start_us // 1000, start_us, duration_us, True, bytes(size), sequence,
                   discontinuity, discontinuity_sequence, 1)


A = _segment(10_000_400, 1_033_333, 1000, 5, 2)
B = _segment(11_033_733, 1_033_334, 2000, 6, 2)
C = _segment(12_067_067, 466_667, 500, 7, 2)  # closed one frame after its last: a break
D = _segment(14_000_000, 2_400_100, 3000, 8, 3, discontinuity=True)  # late keyframe
E = _segment(16_400_100, 1_000_000, 1000, 9, 3)


def test_media_playlist_of_a_window_with_a_discontinuity() -> None:
    text = media_playlist([A, B, C, D, E], init_url="init.mp4?v=1", epoch_ns=EPOCH_NS)
    assert text == """\
#EXTM3U
#EXT-X-VERSION:7
#EXT-X-TARGETDURATION:2
#EXT-X-MEDIA-SEQUENCE:5
#EXT-X-DISCONTINUITY-SEQUENCE:2
#EXT-X-MAP:URI="init.mp4?v=1"
#EXT-X-PROGRAM-DATE-TIME:2023-11-14T22:13:30.123Z
#EXTINF:1.033,
10000.m4s
#EXT-X-PROGRAM-DATE-TIME:2023-11-14T22:13:31.157Z
#EXTINF:1.033,
11033.m4s
#EXT-X-PROGRAM-DATE-TIME:2023-11-14T22:13:32.190Z
#EXTINF:0.467,
12067.m4s
#EXT-X-DISCONTINUITY
#EXT-X-PROGRAM-DATE-TIME:2023-11-14T22:13:34.123Z
#EXTINF:2.400,
14000.m4s
#EXT-X-PROGRAM-DATE-TIME:2023-11-14T22:13:36.523Z
#EXTINF:1.000,
16400.m4s
"""


def test_subtitle_playlist_is_segmented_as_the_media_with_its_discontinuity() -> None:
    """Each entry is the caption window of its media segment, whole milliseconds around it;
    every tag a player aligns renditions by is the media playlist's."""
    media = media_playlist([A, B, C, D, E], init_url="init.mp4?v=1", epoch_ns=EPOCH_NS)
    text = subtitle_playlist([A, B, C, D, E], stream="cam-1", lang="pt-BR", epoch_ns=EPOCH_NS)
    assert [line for line in text.splitlines() if line.startswith("#")] == [
        line for line in media.splitlines()
        if line.startswith("#") and not line.startswith("#EXT-X-MAP")]
    assert [line for line in text.splitlines() if not line.startswith("#")] == [
        "/captions/cam-1/pt-BR.vtt?start=10.000&end=11.034",
        "/captions/cam-1/pt-BR.vtt?start=11.033&end=12.068",
        "/captions/cam-1/pt-BR.vtt?start=12.067&end=12.534",
        "/captions/cam-1/pt-BR.vtt?start=14.000&end=16.401",
        "/captions/cam-1/pt-BR.vtt?start=16.400&end=17.401",
    ]


def test_each_window_reaches_back_the_grace_but_not_across_the_break() -> None:
    """A window also holds the cues of the grace before its segment (a cue sent that late
    after its start comes in a later window), back to the break its segment follows and no
    further than the first listed segment of its side: cues before the break would be mapped
    with the timing after it."""
    text = subtitle_playlist([A, B, C, D, E], stream="cam-1", lang="en", epoch_ns=EPOCH_NS,
                             lookback_us=1_500_000)
    assert [line for line in text.splitlines() if not line.startswith("#")] == [
        "/captions/cam-1/en.vtt?start=10.000&end=11.034",  # the first listed: nothing before
        "/captions/cam-1/en.vtt?start=10.000&end=12.068",  # back to A's start (< 1.5 s)
        "/captions/cam-1/en.vtt?start=10.567&end=12.534",  # 12.067067 - 1.5 s
        "/captions/cam-1/en.vtt?start=14.000&end=16.401",  # after the break: from its start
        "/captions/cam-1/en.vtt?start=14.900&end=17.401",  # 16.4001 - 1.5 s
    ]
    # The media and subtitle playlists list the same segments under the same numbers.
    media = media_playlist([A, B, C, D, E], init_url="init.mp4?v=1", epoch_ns=EPOCH_NS)
    assert list(_numbered(text).values()) == list(_numbered(media).values())


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5])
def test_the_subtitle_playlist_lists_the_media_windows_from_the_first_segment(
        count: int) -> None:
    """From the stream's first segment on, every subtitle playlist is a valid live playlist
    (RFC 8216 4.3.3: its header, then each segment's EXTINF and URI) of exactly the media
    playlist's segments: a player that joins as the first segment closes finds the captions
    of what it plays, and none of its playlists is ever missing or empty."""
    window = [A, B, C, D, E][:count]
    media = media_playlist(window, init_url="init.mp4?v=1", epoch_ns=EPOCH_NS)
    text = subtitle_playlist(window, stream="cam-1", lang="en", epoch_ns=EPOCH_NS,
                             lookback_us=3_000_000)
    lines = text.splitlines()
    assert lines[:5] == ["#EXTM3U", "#EXT-X-VERSION:7", f"#EXT-X-TARGETDURATION:"
                         f"{target_duration(window)}", "#EXT-X-MEDIA-SEQUENCE:5",
                         "#EXT-X-DISCONTINUITY-SEQUENCE:2"]
    assert [line for line in lines if line.startswith("#")] == [
        line for line in media.splitlines()
        if line.startswith("#") and not line.startswith("#EXT-X-MAP")]
    windows = [line for line in lines if not line.startswith("#")]
    assert len(windows) == count and "#EXT-X-ENDLIST" not in lines
    for uri, segment in zip(windows, window, strict=True):
        start, end = (float(v) for v in re.findall(r"(?:start|end)=([0-9.]+)", uri))
        # Each window covers its segment's stream time, whole milliseconds around it.
        assert start * 1e6 <= segment.start_us
        assert end * 1e6 >= segment.start_us + segment.duration_us


def test_the_window_slides_over_the_discontinuity() -> None:
    # First listed segment carries the tag: the header counts the discontinuities before it.
    text = media_playlist([D, E], init_url="init.mp4?v=1", epoch_ns=EPOCH_NS)
    assert text.splitlines()[:7] == [
        "#EXTM3U", "#EXT-X-VERSION:7", "#EXT-X-TARGETDURATION:2", "#EXT-X-MEDIA-SEQUENCE:8",
        "#EXT-X-DISCONTINUITY-SEQUENCE:2", '#EXT-X-MAP:URI="init.mp4?v=1"',
        "#EXT-X-DISCONTINUITY",
    ]
    assert media_playlist([E], init_url="init.mp4?v=1", epoch_ns=EPOCH_NS) == """\
#EXTM3U
#EXT-X-VERSION:7
#EXT-X-TARGETDURATION:1
#EXT-X-MEDIA-SEQUENCE:9
#EXT-X-DISCONTINUITY-SEQUENCE:3
#EXT-X-MAP:URI="init.mp4?v=1"
#EXT-X-PROGRAM-DATE-TIME:2023-11-14T22:13:36.523Z
#EXTINF:1.000,
16400.m4s
"""


def _numbered(text: str) -> dict[str, tuple[int, int]]:
    """Segment URI -> (media sequence, discontinuity sequence), as RFC 8216 6.3.1/6.3.2 make a
    client count them from the header and the tags."""
    sequence = int(re.search(r"#EXT-X-MEDIA-SEQUENCE:(\d+)", text)[1])  # type: ignore[index]
    disc = int(re.search(r"#EXT-X-DISCONTINUITY-SEQUENCE:(\d+)", text)[1])  # type: ignore[index]
    out = {}
    for line in text.splitlines():
        if line == "#EXT-X-DISCONTINUITY":
            disc += 1
        elif not line.startswith("#"):
            out[line] = (sequence, disc)
            sequence += 1
    return out


@pytest.mark.parametrize("size", [1, 2, 3])
def test_every_window_numbers_each_segment_alike(size: int) -> None:
    """A client refreshing the playlist must see one segment under one media and discontinuity
    sequence number in every playlist that lists it (RFC 8216 6.2.1, 6.2.2)."""
    segments = [A, B, C, D, E]
    seen: dict[str, set[tuple[int, int]]] = {}
    for first in range(len(segments) - size + 1):
        window = segments[first:first + size]
        text = media_playlist(window, init_url="init.mp4?v=1", epoch_ns=EPOCH_NS)
        for uri, numbers in _numbered(text).items():
            seen.setdefault(uri, set()).add(numbers)
    assert seen == {f"{s.number}.m4s": {(s.sequence, s.discontinuity_sequence)}
                    for s in segments}


@pytest.mark.parametrize(("duration_us", "target"), [
    (1_000_000, 1), (1_033_333, 1), (1_499_499, 1), (1_499_500, 2), (2_400_100, 2),
    (2_499_500, 3), (200_000, 1),
])
def test_target_duration_is_the_longest_extinf_as_printed_rounded_to_nearest(
        duration_us: int, target: int) -> None:
    # RFC 8216 4.3.3.1 bounds each EXTINF rounded to the nearest integer, as a player reads it:
    # 1.4995 s prints as 1.500 (rounds to 2), 1.4994995 s as 1.499 (rounds to 1).
    assert target_duration([_segment(0, duration_us, 1, 0, 0)]) == target
    # Not rounded up: 1.033 s segments (30 fps, 1 s setting) have a target of 1, not 2.
    assert target_duration([_segment(0, 1_033_333, 1, 0, 0), _segment(1, 1_033_334, 1, 1, 0),
                            _segment(2, duration_us, 1, 2, 0)]) == max(1, target)


def test_bandwidth_is_the_fastest_segment_and_the_mean() -> None:
    # Bits per second, rounded up: B is 16000 bits in 1.033334 s; all 60000 in 5.933434 s.
    assert bandwidth([A, B, C, D, E]) == (15484, 10113)
    assert bandwidth([E]) == (8000, 8000)


def test_master_playlist_names_the_variant_and_each_caption_language() -> None:
    text = master_playlist([A, B, C, D, E], codecs=["avc1.42e01f", "opus"],
                           resolution=(640, 360), languages=["en", "pt-BR"], frame_rate=30)
    assert text == """\
#EXTM3U
#EXT-X-VERSION:7
#EXT-X-INDEPENDENT-SEGMENTS
#EXT-X-MEDIA:TYPE=SUBTITLES,GROUP-ID="subs",NAME="en",LANGUAGE="en",AUTOSELECT=YES,DEFAULT=YES,\
URI="subtitles-en.m3u8"
#EXT-X-MEDIA:TYPE=SUBTITLES,GROUP-ID="subs",NAME="pt-BR",LANGUAGE="pt-BR",AUTOSELECT=YES,\
DEFAULT=NO,URI="subtitles-pt-BR.m3u8"
#EXT-X-STREAM-INF:BANDWIDTH=15484,AVERAGE-BANDWIDTH=10113,CODECS="avc1.42e01f,opus",\
RESOLUTION=640x360,FRAME-RATE=30.000,SUBTITLES="subs"
media.m3u8
"""


def test_master_playlist_without_captions_or_a_known_frame_rate() -> None:
    text = master_playlist([E], codecs=["avc1.640028"], resolution=(1280, 720),
                           languages=[])
    assert text.splitlines()[2:] == [
        "#EXT-X-INDEPENDENT-SEGMENTS",
        '#EXT-X-STREAM-INF:BANDWIDTH=8000,AVERAGE-BANDWIDTH=8000,CODECS="avc1.640028",'
        "RESOLUTION=1280x720",
        "media.m3u8",
    ]


def test_no_playlist_without_a_segment() -> None:
    with pytest.raises(ValueError):
        media_playlist([], init_url="init.mp4?v=1", epoch_ns=EPOCH_NS)
    with pytest.raises(ValueError):
        master_playlist([], codecs=[], resolution=None, languages=[])
    with pytest.raises(ValueError):
        subtitle_playlist([], stream="s", lang="en", epoch_ns=EPOCH_NS)
