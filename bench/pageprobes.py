"""What a latency benchmark runs inside its viewer pages: per presented frame, its display time
on the page's wall clock and its capture time (WebRTC page) or stream time (MSE page), and how
far the page's performance clock is from its Date.now()."""

from __future__ import annotations

from typing import Any

# Per presented frame: its display time on the page's wall clock (ms) and its capture time.
WEBRTC_JS = """
() => {
  window.latFrames = [];
  window.latUnmapped = 0;
  window.sfuViewer.frameListeners.push((record, meta) => {
    if (record.captureNs === null || meta.expectedDisplayTime === undefined) {
      window.latUnmapped++;
      return;
    }
    window.latFrames.push([performance.timeOrigin + meta.expectedDisplayTime,
                           String(record.captureNs)]);
  });
}
"""

# Also the buffer ahead of the playhead at each frame, as sidecarStats.bufferAheadS computes it
# (the buffered live edge - currentTime): read per frame, it is sampled evenly over the segment
# cycle (read once a second it strobes against the ~1 s segments).
MSE_JS = """
() => {
  window.latFrames = [];
  window.latUnmapped = 0;
  window.latAhead = [];
  const player = window.sfuViewer.player;
  player.frameListeners.push((record, meta) => {
    if (meta === undefined || meta.expectedDisplayTime === undefined) {
      window.latUnmapped++;
      return;
    }
    window.latFrames.push([performance.timeOrigin + meta.expectedDisplayTime, record.frameS]);
    const b = player.buffer.buffered;
    if (b.length) window.latAhead.push(b.end(b.length - 1) - player.video.currentTime);
  });
}
"""

# Display times are read on the performance clock and put on the wall clock by timeOrigin;
# Date.now() is the system clock, this host's, which is the house clock here. Their difference
# in the page (ms, Date.now()'s resolution) says whether timeOrigin + now() is house time.
PAGE_CLOCK_JS = "() => performance.timeOrigin + performance.now() - Date.now()"


def page_clock_offset_ms(page: Any) -> float:
    """The page's performance-clock wall time - its Date.now(), in ms; best of five reads
    (a read can straddle a millisecond tick of Date.now())."""
    reads = [float(page.evaluate(PAGE_CLOCK_JS)) for _ in range(5)]
    return min(reads, key=abs)
