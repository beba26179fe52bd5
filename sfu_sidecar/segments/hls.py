"""HLS playlists (RFC 8216) of a stream's live fragmented-MP4 segments: the media playlist of
the segmenter's window, a WebVTT subtitle playlist per caption language segmented alike, and
the master playlist that names them.

The subtitle playlists list, for each media segment, the caption window of its stream time
(the caption component's ``/captions/{stream}/{lang}.vtt?start=&end=``), with the media
playlist's sequence numbers, durations, program date-times and discontinuities. A player keeps
a discontinuity counter per playlist and maps each WebVTT segment's ``X-TIMESTAMP-MAP`` with
the media timing of its own discontinuity (RFC 8216 6.3.3: renditions must agree on
discontinuities): across a break in the timeline, where a player closes the gap in its media
time, the cues close it alike. hls.js 1.7.4, given the caption component's chunk playlist
(fixed-length chunks with no discontinuities), showed every cue after a break late by the gap.

A subtitle playlist lists every window the media playlist lists, from the first segment on, so
a player finds the captions of the media it is about to play whatever its latency. A player
fetches each window once, and may fetch the newest as soon as it is listed, before a captioner
has sent every cue for it: so each window also holds the cues displayed in the ``lookback``
(the caption chunks' grace) before its segment, back to the break its segment follows (a cue
there would be mapped with the wrong side's timing). A cue sent up to that late comes in a
later window, with its own times and id, which a player shows once. (Windows listed only once
that grace had passed trailed the media playlist by it: a player that joined as a stream's
segments started plays about a second behind the live edge, so every window was listed after
its frames had played, and hls.js 1.7.4 fetched none, 1.5.20 each too late.)

Pure: every function takes the segments, the epoch and the languages as arguments.

Media time in the segments is stream time, and the caption chunks map cue time to that same
media time (``X-TIMESTAMP-MAP`` is the identity), so a player puts cues on the frames they
were timed against with no further mapping; ``EXT-X-PROGRAM-DATE-TIME`` in both playlists is
the house time of the same stream time (epoch + stream time).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sfu_sidecar.captions.chunks import house_date_time
from sfu_sidecar.segments.segmenter import Segment

__all__ = [
    "CONTENT_TYPE",
    "SUBTITLES_GROUP",
    "bandwidth",
    "extinf_ms",
    "master_playlist",
    "media_playlist",
    "subtitle_playlist",
    "target_duration",
]

CONTENT_TYPE = "application/vnd.apple.mpegurl"
# >= 6: EXT-X-MAP in a playlist that is not I-frames-only (RFC 8216 7).
VERSION = 7
SUBTITLES_GROUP = "subs"


def extinf_ms(segment: Segment) -> int:
    """A segment's EXTINF duration in whole milliseconds (printed with 3 decimals)."""
    return (segment.duration_us + 500) // 1000


def target_duration(segments: Sequence[Segment]) -> int:
    """RFC 8216 4.3.3.1: every EXTINF rounded to the nearest integer must be <= the target
    duration, so the target is the longest EXTINF so rounded (halves up), at least 1. A segment
    lasts until the first keyframe after the configured duration, so one can be longer by
    however late that keyframe was: the target comes from the segments listed, not from the
    setting.

    Not rounded up: a player times its live playlist reloads by the target duration (hls.js
    reloads a playlist it could not use yet, or one that had not changed, after a target
    duration or half of one) and starts a late join three target durations behind the live
    edge. Segments of 1.033 s rounded up to 2 doubled both: a subtitle playlist hls.js parsed
    before its first media playlist (which it drops) was asked for again 2 s later, after the
    first cues of a late join had played."""
    longest_ms = max((extinf_ms(s) for s in segments), default=1000)
    return max(1, (longest_ms + 500) // 1000)


def _playlist(segments: Sequence[Segment], epoch_ns: int, header: list[str],
              uri: Callable[[Segment], str]) -> str:
    """A live playlist of ``segments``: the tags every rendition shares, ``header`` (the
    media playlist's EXT-X-MAP), then each segment's tags and ``uri(segment)``."""
    if not segments:
        raise ValueError("a playlist needs at least one segment")
    first = segments[0]
    # 4.3.3.3: the discontinuity sequence of the first segment is the tag's value plus one if
    # the segment itself carries EXT-X-DISCONTINUITY.
    discontinuity_sequence = first.discontinuity_sequence - (1 if first.discontinuity else 0)
    lines = [
        "#EXTM3U",
        f"#EXT-X-VERSION:{VERSION}",
        f"#EXT-X-TARGETDURATION:{target_duration(segments)}",
        f"#EXT-X-MEDIA-SEQUENCE:{first.sequence}",
        f"#EXT-X-DISCONTINUITY-SEQUENCE:{discontinuity_sequence}",
        *header,
    ]
    for s in segments:
        if s.discontinuity:
            lines.append("#EXT-X-DISCONTINUITY")
        # On every segment, not just the first: across a break in the timeline the house time
        # jumps, and the gap is not in any EXTINF.
        lines.append(f"#EXT-X-PROGRAM-DATE-TIME:{house_date_time(epoch_ns + s.start_us * 1000)}")
        ms = extinf_ms(s)
        lines.append(f"#EXTINF:{ms // 1000}.{ms % 1000:03d},")
        lines.append(uri(s))
    return "\n".join(lines) + "\n"


def media_playlist(
    segments: Sequence[Segment], *, init_url: str, epoch_ns: int, media_ext: str = "m4s"
) -> str:
    """The live media playlist of ``segments`` (closed, in order, all of one init segment).

    The segmenter drops its whole window when a new init segment is made, so every listed
    segment needs the one ``init_url`` names and a single ``EXT-X-MAP`` serves them all.
    """
    return _playlist(segments, epoch_ns, [f'#EXT-X-MAP:URI="{init_url}"'],
                     lambda s: f"{s.number}.{media_ext}")


def _stream_seconds(ms: int) -> str:
    return f"{ms // 1000}.{ms % 1000:03d}"


def subtitle_playlist(segments: Sequence[Segment], *, stream: str, lang: str,
                      epoch_ns: int, lookback_us: int = 0) -> str:
    """The WebVTT subtitle playlist of ``lang`` segmented as the media playlist of
    ``segments``: each entry the caption window of its media segment's stream time, whole
    milliseconds around it, reaching back ``lookback_us`` before it but not past the start of
    its discontinuity (its side of a break, as far as ``segments`` show it). A cue shown in
    two windows is one cue to a player: same id, text and times."""
    # The start of each side of a break, as listed: the first segment of its discontinuity
    # sequence (the window slides, so a side may begin before the first one listed).
    side_start: dict[int, int] = {}
    for s in segments:
        side_start.setdefault(s.discontinuity_sequence, s.start_us)

    def window(s: Segment) -> str:
        start_us = max(s.start_us - lookback_us, side_start[s.discontinuity_sequence])
        start_ms = start_us // 1000
        end_ms = -(-(s.start_us + s.duration_us) // 1000)
        return (f"/captions/{stream}/{lang}.vtt?start={_stream_seconds(start_ms)}"
                f"&end={_stream_seconds(max(end_ms, start_ms + 1))}")

    return _playlist(segments, epoch_ns, [], window)


def bandwidth(segments: Sequence[Segment]) -> tuple[int, int]:
    """(peak, average) segment bit rate in bits/s, RFC 8216 4.3.4.2 BANDWIDTH and
    AVERAGE-BANDWIDTH, measured over ``segments`` (audio and video together; they share the
    segments).

    The peak is defined over contiguous runs of segments lasting 0.5 to 1.5 target durations;
    a run's rate is a duration-weighted mean of its segments' rates, and a single segment lasts
    less than 1.5 target durations (:func:`target_duration`), so the peak is at most the
    fastest segment's rate, which is the one given.
    """
    if not segments:
        raise ValueError("bandwidth needs at least one segment")
    peak = max(-(-len(s.data) * 8_000_000 // max(1, s.duration_us)) for s in segments)
    bits = sum(len(s.data) for s in segments) * 8
    duration_us = max(1, sum(s.duration_us for s in segments))
    return peak, -(-bits * 1_000_000 // duration_us)


def master_playlist(
    segments: Sequence[Segment],
    *,
    codecs: Sequence[str],
    resolution: tuple[int, int] | None,
    languages: Sequence[str],
    frame_rate: float | None = None,
    media_uri: str = "media.m3u8",
    subtitles_uri: str = "subtitles-{lang}.m3u8",
) -> str:
    """The master playlist: one variant (the stream as relayed, no transcoding) with its
    measured bandwidth, RFC 6381 ``codecs`` and ``resolution``, and one subtitle rendition per
    caption language (``subtitles_uri`` with the language), the first the default."""
    peak, average = bandwidth(segments)
    lines = [
        "#EXTM3U",
        f"#EXT-X-VERSION:{VERSION}",
        # 4.3.5.1: every segment starts with a keyframe (the segmenter opens them on one), so
        # a player can start or switch at any segment. Stated here, it applies to every media
        # playlist this one names (and 4.3.5 asks that it not be repeated there).
        "#EXT-X-INDEPENDENT-SEGMENTS",
    ]
    for i, lang in enumerate(languages):
        lines.append(
            f'#EXT-X-MEDIA:TYPE=SUBTITLES,GROUP-ID="{SUBTITLES_GROUP}",NAME="{lang}",'
            f'LANGUAGE="{lang}",AUTOSELECT=YES,DEFAULT={"YES" if i == 0 else "NO"},'
            f'URI="{subtitles_uri.format(lang=lang)}"'
        )
    # Plain WebVTT segments have no RFC 6381 identifier ("wvtt" names WebVTT in ISOBMFF), so
    # CODECS lists the audio and video formats only.
    attributes = [f"BANDWIDTH={peak}", f"AVERAGE-BANDWIDTH={average}",
                  f'CODECS="{",".join(codecs)}"']
    if resolution is not None:
        attributes.append(f"RESOLUTION={resolution[0]}x{resolution[1]}")
    if frame_rate is not None:
        attributes.append(f"FRAME-RATE={frame_rate:.3f}")
    if languages:
        attributes.append(f'SUBTITLES="{SUBTITLES_GROUP}"')
    lines.append(f"#EXT-X-STREAM-INF:{','.join(attributes)}")
    lines.append(media_uri)
    return "\n".join(lines) + "\n"
