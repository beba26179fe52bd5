"""Word-timed captions as the viewer page in Chromium shows them, frame by frame.

One service and one TTS presenter (``sfu_sidecar.client.presenter``) in this process: the
presenter speaks three sentences and posts each with espeak-ng's word times. The viewer page
(WebRTC) records, for every presented frame, the frame's capture stream time, currentTime and
the text of each caption cue the browser has active then (read after the page placed its cues
for that frame). Prints one JSON line for tests/e2e/test_words_chromium.py: those records and
the service's own cues. Run inside a network namespace with only ``lo`` (the test does).
"""

from __future__ import annotations

import json
import time
from typing import Any

from sfu_sidecar.client.presenter import Said
from tests.e2e.harness import PresenterApp
from tests.support import chromium

STREAM = "anchor"
SENTENCES = ("Good evening, and welcome to the late news.",
             "Tonight we look at the weather across the whole country.",
             "First, the north will see rain and strong winds.")


class Service(PresenterApp):
    async def speak(self) -> list[Said]:
        assert self.presenter is not None
        return [await self.presenter.say(text) for text in SENTENCES]


RECORDER_JS = """() => {
  const video = document.querySelector("video");
  window.wordFrames = [];
  window.sfuViewer.frameListeners.push((record) => {
    if (record.streamS === null || window.wordFrames.length >= 4000) return;
    const t = video.currentTime;
    const active = [];
    for (const track of video.textTracks) {
      for (const cue of track.cues ?? []) {
        if (cue.startTime <= t && t < cue.endTime) active.push([cue.id, cue.text]);
      }
    }
    window.wordFrames.push([record.streamS, t, active]);
  });
}"""


def main() -> None:
    service = Service(STREAM)
    service.thread.start()
    if not service.ready.wait(30):
        raise SystemExit("service did not start")
    result: dict[str, Any] = {}
    try:
        with chromium.browser() as browser:
            page = browser.new_page()
            page.goto(f"{service.base}/?stream={STREAM}")
            page.wait_for_function("() => window.sfuViewer?.controls.snapshot().state === 'live'",
                                   timeout=30_000, polling=100)
            page.evaluate(RECORDER_JS)
            said = service.call(service.speak())
            until = max(s.end_ns for s in said) + 1_500_000_000
            while time.time_ns() < until:
                time.sleep(0.2)
            result["frames"] = page.evaluate("() => window.wordFrames")
            result["feed"] = service.call(service.feed())
            result["said"] = [[s.cue_id, s.onset_ns, s.end_ns] for s in said]
    finally:
        service.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
