"""What the browser probes share: a service on an event loop in a thread beside the probe's
synchronous Playwright code, and the page-side reader of the frame numbers the synthetic
publisher draws into its pictures."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["FRAME_NUMBER_JS", "LoopThread"]


class LoopThread:
    """An event loop in a daemon thread: ``_start`` runs on it first (``ready`` is set when it
    is done), then the loop serves until ``stop``. Subclasses start the service, publishers and
    whatever else the probe drives in ``_start`` and end them in ``_stop``."""

    stop_timeout_s = 10.0

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self.ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        raise NotImplementedError

    async def _stop(self) -> None:
        """Nothing to end by default."""

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        """Run ``coro`` on the loop from the probe's thread and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=timeout)

    def stop(self) -> None:
        self.call(self._stop(), timeout=self.stop_timeout_s)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(self.stop_timeout_s)


# Defines window.readFrameNumber(video): the 20-bit number the synthetic source
# (sfu_sidecar/synthetic.py) draws as black and white blocks across the top 24 rows, read off
# the picture on screen; null before the video has a size.
FRAME_NUMBER_JS = """
() => {
  const canvas = document.createElement('canvas');
  const ctx = canvas.getContext('2d', {willReadFrequently: true});
  window.readFrameNumber = (video) => {
    const w = video.videoWidth;
    if (!w) return null;
    canvas.width = w; canvas.height = 24;
    ctx.drawImage(video, 0, 0, w, 24, 0, 0, w, 24);
    const px = ctx.getImageData(0, 0, w, 24).data;
    const block = Math.floor(w / 20);
    let n = 0;
    for (let bit = 0; bit < 20; bit++) {
      const x = bit * block + Math.floor(block / 2);
      n = (n << 1) | (px[(12 * w + x) * 4] > 128 ? 1 : 0);
    }
    return n;
  };
}
"""
