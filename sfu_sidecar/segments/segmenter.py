"""One stream's live segments: frames in (with stream times), init and media segments out
(VP8 or VP9 + Opus in WebM, H.264 + Opus in fragmented MP4).

A segment opens on a video keyframe and closes at the first keyframe after it has lasted the
target duration; when the target passes without one, the publisher is asked for a keyframe
(``request_keyframe``, throttled by the relay). Audio frames join the open segment. Nothing is
kept before the first keyframe, and a segment that grows past :data:`MAX_OPEN_BYTES` without a
keyframe to close it is dropped (the next keyframe starts a new one), so memory per stream is
bounded by the window plus one open segment.

Stream time is capture time on the house clock minus the stream epoch, so a frame's pts in the
container and a caption's time are on one timeline.

A segment is muxed in parts as it grows: every ``part_us`` of video the frames since the last
part become one more WebM cluster or MP4 fragment (moof + mdat), and the closed segment is its
parts concatenated. So the open segment can be served while it is made (chunked transfer, for
low latency), and the bytes a reader got that way are exactly the closed segment's. Audio
captured after the video frame that cuts a part waits for the next part: each part then holds
every track up to one time, and audio that overtakes its keyframe on the wire still reaches
the keyframe's segment.

Where that timeline really breaks (video capture times jumping ahead by more than
:data:`DISCONTINUITY_US`: the publisher gone and back, or its clock stepping), the open segment
closes at its last frame and the next one, opened on the next keyframe, is marked as a
discontinuity, which the HLS playlist states and the product's player resyncs on. Every segment
also carries a media sequence number (RFC 8216 4.3.3.2) and discontinuity sequence number
(4.3.3.3), counted from the segmenter's start.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sfu_sidecar.segments.depacketize import Frame, avc_codec_string, nal_units
from sfu_sidecar.segments.mux import MuxError, Sample, TrackSpec, mux_mp4, mux_webm

__all__ = ["MAX_OPEN_BYTES", "OpenSegment", "Segment", "StreamSegmenter"]

MAX_OPEN_BYTES = 32 * 1024 * 1024
KEYFRAME_RETRY_US = 500_000  # the relay's own throttle interval for keyframe requests
# A jump of video capture times past this is a break in the timeline, not a late frame.
DISCONTINUITY_US = 800_000
VIDEO, AUDIO = 0, 1
# An Opus packet (RFC 6716 3.1: TOC 0xFC, CELT fullband 20 ms, stereo, one frame) that only
# ever reaches a muxer, never a player: the init segment is muxed with it.
SILENT_OPUS = b"\xfc\xff\xfe"


@dataclass(frozen=True, slots=True)
class Segment:
    """A closed segment: immutable once made; ``number`` is its start in stream ms,
    ``sequence`` its media sequence number and ``discontinuity_sequence`` the number of
    discontinuities up to and including it; ``init`` counts init segments, so a segment names
    the one it needs."""

    number: int
    start_us: int
    duration_us: int
    keyframe: bool
    data: bytes
    sequence: int = 0
    discontinuity: bool = False
    discontinuity_sequence: int = 0
    init: int = 0


@dataclass(frozen=True, slots=True)
class OpenSegment:
    """The segment being made: ``parts`` muxed so far (none yet right after its keyframe;
    their concatenation is a prefix of the closed segment's bytes), the init version it
    needs."""

    number: int
    start_us: int
    discontinuity: bool
    parts: tuple[bytes, ...]
    init: int


@dataclass
class _Open:
    start_us: int
    discontinuity: bool = False
    samples: list[Sample] = field(default_factory=list)  # not in a part yet
    size: int = 0  # bytes of every frame added, parts included: the memory bound
    asked_us: int | None = None  # stream time of the last keyframe request
    parts: list[bytes] = field(default_factory=list)
    part_start_us: int = 0
    failed: bool = False  # a part was refused by the muxer: the segment cannot close whole


class StreamSegmenter:
    """Segments for one stream: its video (``video_codec``, vp8, vp9 or h264) and optionally
    Opus."""

    def __init__(
        self,
        stream: str,
        *,
        target_us: int,
        window: int,
        request_keyframe: Callable[[], Any],
        log: logging.Logger,
        part_us: int | None = None,
    ) -> None:
        self.stream = stream
        self.target_us = target_us
        self.part_us = part_us  # None: one part, the segment muxed whole when it closes
        # Called after a part is made and after the open segment closes or is dropped, so an
        # adapter can wake readers of the open segment (the core itself never waits).
        self.on_change: Callable[[], None] = lambda: None
        self.segments: deque[Segment] = deque(maxlen=window)
        self.init: bytes | None = None
        self.video_codec = "vp8"
        self.video: TrackSpec | None = None
        self._video_string: str | None = None
        self.audio: TrackSpec | None = None
        self.dropped = 0  # frames not muxed: out of order, before the epoch, oversize segment
        self.mux_errors = 0
        self.discontinuities = 0
        self.inits = 0  # init segments made; a new one follows a change of track parameters
        self._sequence = 0
        self._break = False  # the next segment starts after a break in the timeline
        self._last_video_step_us = 0
        self._asked_gap_us: int | None = None
        self._open: _Open | None = None
        self._last_pts: dict[int, int] = {}
        self._request_keyframe = request_keyframe
        self._log = log

    @property
    def container(self) -> str:
        return "mp4" if self.video_codec == "h264" else "webm"

    @property
    def codecs(self) -> list[str]:
        """RFC 6381 codec strings of the tracks, once the first keyframe fixed them."""
        if self._video_string is None:
            return []
        return [self._video_string] + (["opus"] if self.audio is not None else [])

    @property
    def extensions(self) -> tuple[str, str]:
        """File name extensions of the init and media segments."""
        return ("mp4", "m4s") if self.container == "mp4" else ("webm", "webm")

    def add_audio_track(self, codec: str, sample_rate: int, channels: int) -> None:
        """The stream has audio. Known late (its first packet after the first keyframe), the
        segments start over: the init segment and the open segment have video only."""
        if self.audio is not None:
            return
        self.audio = TrackSpec("audio", codec, sample_rate=sample_rate, channels=channels)
        if self.init is None and self._open is None:
            return
        self._log.info("stream %s: audio joined, new init segment", self.stream)
        self.init = None
        self.segments.clear()
        self._break = True  # a player appends the new init segment before the next one
        if self._open is not None:
            self.dropped += len(self._open.samples)
            self._open = None
            self.on_change()

    def push(self, kind: str, frame: Frame, stream_us: int) -> None:
        """One complete frame of ``kind`` at ``stream_us`` (its capture time in stream time)."""
        track = VIDEO if kind == "video" else AUDIO
        last = self._last_pts.get(track)
        if stream_us < 0 or (last is not None and stream_us <= last):
            # Muxers need rising timestamps per track; a frame captured before the epoch has
            # no place on the stream timeline.
            self.dropped += 1
            return
        if track == VIDEO:
            self._video(frame, stream_us)
        elif self._open is not None:
            self._add(Sample(AUDIO, stream_us, frame.data, True))

    def _video(self, frame: Frame, stream_us: int) -> None:
        if self.video is None:
            if not frame.keyframe or not frame.width:
                self.dropped += 1
                return
            self.video = TrackSpec("video", self.video_codec, frame.width, frame.height)
            self._video_string = self._codec_string(frame)
        last = self._last_pts.get(VIDEO)
        if last is not None and stream_us - last > DISCONTINUITY_US:
            self._timeline_break(last, stream_us)
        elif last is not None:
            self._last_video_step_us = stream_us - last
        current = self._open
        resized = frame.keyframe and frame.width and (
            (frame.width, frame.height) != (self.video.width, self.video.height))
        if resized or (frame.keyframe and (
                current is None or stream_us - current.start_us >= self.target_us)):
            carried: list[Sample] = []
            if current is not None:
                # Audio captured after the keyframe can arrive before it (video takes longer
                # to encode and send): it belongs to the new segment. Left in the old one, it
                # would put a block after the next cluster's first in time, which MSE refuses.
                carried = [s for s in current.samples if s.pts_us >= stream_us]
                if carried:
                    current.samples = [s for s in current.samples if s.pts_us < stream_us]
                self._close(current, stream_us)
            if resized:
                self._resize(frame)
            self._open = current = _Open(stream_us, self._break, part_start_us=stream_us)
            self._break = False
            self._check_init(current, Sample(VIDEO, stream_us, frame.data, True))
            for sample in carried:
                current.samples.append(sample)
                current.size += len(sample.data)
        if current is None:
            self.dropped += 1
            self._last_pts[VIDEO] = stream_us  # a gap is measured from the frames that came
            self._ask_keyframe_once(stream_us)
            return
        if (not frame.keyframe and stream_us - current.start_us >= self.target_us
                and (current.asked_us is None
                     or stream_us - current.asked_us >= KEYFRAME_RETRY_US)):
            # Asked again while none comes: a request can be throttled or lost on the way.
            current.asked_us = stream_us
            self._request_keyframe()
        if self.part_us is not None and stream_us - current.part_start_us >= self.part_us:
            self._cut(current, stream_us)
            current.part_start_us = stream_us
        self._add(Sample(VIDEO, stream_us, frame.data, frame.keyframe))

    def _timeline_break(self, last_us: int, stream_us: int) -> None:
        """Video jumped ahead past :data:`DISCONTINUITY_US`: the open segment ends one frame
        after its last one (not at the far side of the gap), and the next starts anew."""
        self._log.info("stream %s: timeline break of %.3f s, discontinuity", self.stream,
                       (stream_us - last_us) / 1e6)
        current = self._open
        if current is not None:
            self._open = None
            self._close(current, last_us + max(self._last_video_step_us, 1000))
        self._break = True
        self._asked_gap_us = None

    def _ask_keyframe_once(self, stream_us: int) -> None:
        """Waiting for a keyframe with no open segment (after a break): ask, throttled."""
        asked = self._asked_gap_us
        if asked is None or stream_us - asked >= KEYFRAME_RETRY_US:
            self._asked_gap_us = stream_us
            self._request_keyframe()

    def _resize(self, frame: Frame) -> None:
        """New dimensions (a publisher's resolution change): the old init segment no longer
        describes the track, so the segments start over with a new one."""
        assert self.video is not None
        self._log.info("stream %s: video %dx%d -> %dx%d, new init segment", self.stream,
                       self.video.width, self.video.height, frame.width, frame.height)
        self.video = TrackSpec("video", self.video_codec, frame.width, frame.height)
        self._video_string = self._codec_string(frame)
        self.init = None
        self.segments.clear()
        self._break = True  # a player appends the new init segment before the next one

    def _add(self, sample: Sample) -> None:
        current = self._open
        assert current is not None
        current.samples.append(sample)
        current.size += len(sample.data)
        self._last_pts[sample.track] = sample.pts_us
        if current.size > MAX_OPEN_BYTES:
            self._log.warning("stream %s: no keyframe for %d bytes, segment dropped",
                              self.stream, current.size)
            self.dropped += len(current.samples)
            self._open = None
            self.on_change()

    def _codec_string(self, frame: Frame) -> str:
        """RFC 6381 codec string of the video track, from its first keyframe."""
        if self.video_codec == "h264":
            sps = next(n for n in nal_units(frame.data) if n and n[0] & 0x1F == 7)
            return avc_codec_string(sps)
        return self.video_codec

    def _tracks(self) -> list[TrackSpec]:
        assert self.video is not None
        return [self.video] + ([self.audio] if self.audio is not None else [])

    def _mux(self, current: _Open, samples: list[Sample], what: str) -> tuple[bytes, bytes] | None:
        """(header, body) of ``samples``; None when the muxer refused them, which fails the
        open segment (it can no longer close whole)."""
        mux = mux_mp4 if self.container == "mp4" else mux_webm
        try:
            return mux(self._tracks(), samples)
        except MuxError as e:
            self.mux_errors += 1
            current.failed = True
            self._log.warning("stream %s: %s not muxed: %s", self.stream, what, e)
            return None

    def _cut(self, current: _Open, until_us: int | None) -> None:
        """The open segment's frames captured before ``until_us`` (all when None) become its
        next part; a part that cannot be muxed fails the segment."""
        if until_us is None:
            take, keep = current.samples, []
        else:
            take = [s for s in current.samples if s.pts_us < until_us]
            keep = [s for s in current.samples if s.pts_us >= until_us]
        current.samples = keep
        if self.audio is None:
            take = [s for s in take if s.track == VIDEO]
        if current.failed or not take:
            return
        muxed = self._mux(current, take, "segment")
        if muxed is None:
            return
        current.parts.append(muxed[1])
        if self._open is current:
            self.on_change()

    def _check_init(self, current: _Open, keyframe: Sample) -> None:
        """Checks the init segment against the keyframe that opens ``current``: a new one is
        made when its parameters changed. Done as the segment opens, so the open segment
        names its init from the start."""
        # Muxed from the keyframe and one audio packet, not from the segment's frames: a
        # header depends on which tracks have samples (the MP4 muxer leaves out the sample
        # entry of a track without one), and a segment without audio (a pause in it) must not
        # change the init segment. Parts after the first start mid-GOP, so their headers lack
        # the parameter sets anyway.
        probe = [keyframe]
        if self.audio is not None:
            probe.append(Sample(AUDIO, keyframe.pts_us, SILENT_OPUS, True))
        muxed = self._mux(current, probe, "init segment")
        if muxed is None:
            return
        header = muxed[0]
        if header == self.init:
            return
        if self.init is not None:
            # Same tracks, other parameters (a new publisher's encoder, say): the old init
            # no longer describes the segments, and only the newest is served, so the
            # segments made for the old one go with it.
            self._log.info("stream %s: codec parameters changed, new init segment",
                           self.stream)
            self.segments.clear()
            current.discontinuity = True
        self.init = header
        self.inits += 1

    def _close(self, current: _Open, end_us: int) -> None:
        self._cut(current, None)
        if current.failed or not current.parts:
            self.on_change()  # a reader of the open segment learns it will not close
            return
        if current.discontinuity:
            self.discontinuities += 1
        # Numbered by start in stream milliseconds, not by count: a segmenter started again
        # (after an idle stop or a restart; the epoch is durable) never reuses a number for
        # other bytes, which immutable caching of closed segments relies on. Segments last at
        # least the target duration, so the numbers are distinct and rising.
        self.segments.append(Segment(
            current.start_us // 1000, current.start_us, end_us - current.start_us, True,
            b"".join(current.parts), self._sequence, current.discontinuity,
            self.discontinuities, self.inits,
        ))
        self._sequence += 1
        self.on_change()

    def find(self, number: int) -> Segment | None:
        for segment in self.segments:
            if segment.number == number:
                return segment
        return None

    def open_segment(self) -> OpenSegment | None:
        """The segment being made (from its keyframe on; it may have no part yet)."""
        current = self._open
        if current is None or current.failed:
            return None
        return OpenSegment(current.start_us // 1000, current.start_us, current.discontinuity,
                           tuple(current.parts), self.inits)

    def init_url(self) -> str:
        """The init segment's URL relative to the media folder; versioned, so a player (or
        cache) holding an older one fetches the new one after a change."""
        return f"init.{self.extensions[0]}?v={self.inits}"

    def index(self) -> dict[str, Any]:
        media_ext = self.extensions[1]
        current = self.open_segment()
        return {
            "stream": self.stream,
            "container": self.container,
            "codecs": self.codecs,
            "init": self.init_url() if self.init is not None else None,
            "target_duration_s": self.target_us / 1e6,
            "part_duration_s": None if self.part_us is None else self.part_us / 1e6,
            # The segment being made: its URL streams its parts as they are made and ends
            # when it closes (then it is listed in "segments" with the same number and bytes).
            "open": None if current is None else {
                "number": current.number,
                "start_s": current.start_us / 1e6,
                "discontinuity": current.discontinuity,
                "init": current.init,
                "parts": len(current.parts),
                "url": f"{current.number}.{media_ext}",
            },
            "segments": [
                {
                    "number": s.number,
                    "sequence": s.sequence,
                    "start_s": s.start_us / 1e6,
                    "duration_s": s.duration_us / 1e6,
                    "keyframe": s.keyframe,
                    "discontinuity": s.discontinuity,
                    "init": s.init,
                    "url": f"{s.number}.{media_ext}",
                }
                for s in self.segments
            ],
        }
