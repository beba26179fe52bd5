"""What the probe holds per stream: its tracks' statistics, its viewers, recent caption errors."""

from __future__ import annotations

from collections import deque

from sfu_sidecar.probe.stats import BucketCounts, TrackStats
from sfu_sidecar.probe.viewers import ViewerStats

CAPTION_ERRORS_KEPT = 200


class StreamProbe:
    """What the probe holds for one stream: its tracks, its viewers, recent caption errors."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.track_stats: dict[str, TrackStats] = {}
        self.viewers: dict[str, ViewerStats] = {}
        self.caption_errors: deque[float] = deque(maxlen=CAPTION_ERRORS_KEPT)
        self.resyncs = 0
        self.deviation: dict[str, BucketCounts] = {}  # kind -> frame deviation histogram
