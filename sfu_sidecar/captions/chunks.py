"""The stream timeline cut into WebVTT chunks, window queries and the HLS subtitle playlist.

Pure: every function takes ``now`` (stream milliseconds) as an argument.

Chunk n covers stream time [n*D, (n+1)*D). It holds every cue *displayed* in that interval
(start < (n+1)*D and end > n*D) with its full display times, so a cue crossing a boundary is in
every chunk it touches, always with the same id and times; a player merging chunks by id or by
(start, end, text) sees it once.

Chunk states, from the live edge ``now``:
* future: n*D > now (404 with Retry-After);
* live: n*D <= now < (n+1)*D + grace (may still change; ``Cache-Control: no-cache``);
* closed: (n+1)*D + grace <= now (frozen when first served; ``immutable``).
The grace lets final ASR results for the chunk's end arrive before it freezes.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from enum import Enum

from sfu_sidecar.captions import webvtt
from sfu_sidecar.captions.model import MAX_CUE_MS, StoredCue

# Late cue changes within this time after a chunk's end still reach it before it freezes.
CLOSE_GRACE_MS = 3000
MPEG_TS_HZ = 90_000
MPEG_TS_WRAP = 1 << 33  # PTS is a 33-bit field (ISO/IEC 13818-1 2.4.3.7)
EPOCH_HEADER = "X-STREAM-EPOCH-NS"


class ChunkState(Enum):
    FUTURE = "future"
    LIVE = "live"
    CLOSED = "closed"


def chunk_state(n: int, chunk_ms: int, now_ms: int, grace_ms: int = CLOSE_GRACE_MS) -> ChunkState:
    if n * chunk_ms > now_ms:
        return ChunkState.FUTURE
    if (n + 1) * chunk_ms + grace_ms <= now_ms:
        return ChunkState.CLOSED
    return ChunkState.LIVE


def chunks_touched(start_ms: int, end_ms: int, chunk_ms: int) -> range:
    """Indices of the chunks a cue displayed in [start, end) appears in."""
    return range(start_ms // chunk_ms, (end_ms - 1) // chunk_ms + 1)


def timestamp_map(local_ms: int) -> str:
    """RFC 8216 3.5 ``X-TIMESTAMP-MAP``: cue time ``local_ms`` is media time ``local_ms``.

    Media timestamps are stream time (the live remux writes them so), so the map is the
    identity, stated at the chunk start and wrapped to 33 bits like an MPEG-2 PTS.
    """
    mpegts = (local_ms * (MPEG_TS_HZ // 1000)) % MPEG_TS_WRAP
    local = webvtt.format_timestamp(webvtt.seconds_from_ms(local_ms))
    return f"X-TIMESTAMP-MAP=MPEGTS:{mpegts},LOCAL:{local}"


class Track:
    """The live (not retracted) cues of one stream and language, ordered by start time."""

    def __init__(self) -> None:
        self._order: list[tuple[int, str]] = []  # (start_ms, id), sorted
        self._cues: dict[str, StoredCue] = {}

    def __len__(self) -> int:
        return len(self._cues)

    def get(self, cue_id: str) -> StoredCue | None:
        return self._cues.get(cue_id)

    def put(self, cue: StoredCue) -> None:
        self.remove(cue.id)
        if cue.deleted:
            return
        bisect.insort(self._order, (cue.start_ms, cue.id))
        self._cues[cue.id] = cue

    def remove(self, cue_id: str) -> StoredCue | None:
        old = self._cues.pop(cue_id, None)
        if old is not None:
            i = bisect.bisect_left(self._order, (old.start_ms, old.id))
            del self._order[i]
        return old

    def between(self, start_ms: int, end_ms: int) -> list[StoredCue]:
        """Cues displayed at some time in [start_ms, end_ms), ordered by (start, id)."""
        # A cue lasts at most MAX_CUE_MS, so only starts in [start - MAX_CUE_MS, end) can reach.
        lo = bisect.bisect_left(self._order, (start_ms - MAX_CUE_MS, ""))
        hi = bisect.bisect_left(self._order, (end_ms, ""))
        out = []
        for _, cue_id in self._order[lo:hi]:
            cue = self._cues[cue_id]
            if cue.end_ms > start_ms:
                out.append(cue)
        return out

    def __iter__(self) -> Iterator[StoredCue]:
        return (self._cues[i] for _, i in self._order)

    def purge_before(self, end_ms: int) -> int:
        gone = [c.id for c in self._cues.values() if c.end_ms < end_ms]
        for cue_id in gone:
            self.remove(cue_id)
        return len(gone)


def render(cues: Iterable[StoredCue], local_ms: int, epoch_ns: int) -> bytes:
    """A WebVTT document: timestamp map at ``local_ms`` and the epoch as header lines."""
    header = [timestamp_map(local_ms), f"{EPOCH_HEADER}={epoch_ns}"]
    return webvtt.serialize((c.to_webvtt() for c in cues), header=header).encode()


def render_chunk(track: Track, n: int, chunk_ms: int, epoch_ns: int) -> bytes:
    start = n * chunk_ms
    return render(track.between(start, start + chunk_ms), start, epoch_ns)


def program_date_time(epoch_ns: int, stream_ms: int) -> str:
    """RFC 8216 4.3.2.6 date-time (ISO 8601 with milliseconds) of a stream time."""
    return house_date_time(epoch_ns + stream_ms * 1_000_000)


def house_date_time(house_ns: int) -> str:
    """RFC 8216 4.3.2.6 date-time of a house time in ns, cut to the millisecond (UTC)."""
    dt = datetime.fromtimestamp(house_ns // 1_000_000_000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{(house_ns // 1_000_000) % 1000:03d}Z"


def last_closed_chunk(now_ms: int, chunk_ms: int, grace_ms: int = CLOSE_GRACE_MS) -> int:
    """Highest n with (n+1)*D + grace <= now (may be negative: none closed yet)."""
    return (now_ms - grace_ms) // chunk_ms - 1


def playlist(
    *,
    now_ms: int,
    chunk_ms: int,
    window: int,
    epoch_ns: int,
    first_n: int = 0,
    grace_ms: int = CLOSE_GRACE_MS,
) -> str | None:
    """RFC 8216 live media playlist of the last ``window`` closed chunks, or None if none yet.

    Only closed chunks are listed: a client fetches each listed segment once (RFC 8216 6.3.5),
    so a segment must not change after it appears.
    """
    last = last_closed_chunk(now_ms, chunk_ms, grace_ms)
    first = max(first_n, last - window + 1)
    if last < first:
        return None
    seconds = chunk_ms / 1000
    lines = [
        "#EXTM3U",
        "#EXT-X-VERSION:3",  # decimal EXTINF durations need version 3 (RFC 8216 7)
        # 4.3.3.1: every EXTINF rounded to an integer must be <= the target duration.
        f"#EXT-X-TARGETDURATION:{math.ceil(seconds)}",
        f"#EXT-X-MEDIA-SEQUENCE:{first}",
        f"#EXT-X-PROGRAM-DATE-TIME:{program_date_time(epoch_ns, first * chunk_ms)}",
    ]
    for n in range(first, last + 1):
        lines.append(f"#EXTINF:{seconds:.3f},")
        lines.append(f"chunk-{n}.vtt")
    return "\n".join(lines) + "\n"
