"""Barge-in as viewers see it: a TTS presenter interrupted at random instants, watched in
Chromium by the viewer page over WebRTC and by the MSE player.

One service and one TTS presenter (``sfu_sidecar.client.presenter``) in this process. The
presenter says short sentences one after another, each posted with espeak-ng's word times, and
is interrupted at a random instant of each (seeded): ``interrupt()`` silences the voice and
calls barge-in at the sample it stopped at. Both pages record, for every presented frame, its
wall-clock time, its capture stream time, the cues active on the showing track, and the text and
end of the latest cues as the page holds them then.

``python -m tests.e2e.bargein_probe COUNT SEED`` prints one JSON line for
tests/e2e/test_bargein_chromium.py: the interruptions (cue id, wall-clock ns of the call, house
ns it cut at), the service's feed afterwards, and each page's frames. Run inside a network
namespace with only ``lo`` (the test does).
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

from tests.e2e.harness import PresenterApp
from tests.support import chromium

STREAM = "anchor"
# Short sentences (about a second of speech each, three words), so that a hundred
# interruptions take two minutes.
SENTENCES = ("Rain moves east.", "Winds pick up.", "Schools open late.", "The match ends.",
             "Snow on the hills.")
# An interruption falls this far inside the speech at least (an instant on a cue's very edge
# is the retraction or untouched case, which the unit tests cover).
MARGIN_NS = 100_000_000
WATCHED = 3  # the latest cues each page reports on every frame

RECORDER_JS = """([mse, kept]) => {
  const video = document.querySelector("video");
  window.cutFrames = [];
  const listeners = mse ? window.sfuViewer.player.frameListeners : window.sfuViewer.frameListeners;
  listeners.push((record) => {
    const streamS = mse ? record.frameS : record.streamS;
    if (streamS === null || streamS === undefined || window.cutFrames.length >= 20000) return;
    const t = video.currentTime;
    const active = [];
    for (const track of video.textTracks) {
      if (track.mode !== "showing") continue;
      for (const cue of track.cues ?? []) {
        if (cue.startTime <= t && t < cue.endTime) active.push([cue.id, cue.text]);
      }
    }
    // What the page holds of the latest cues (its cue book, or the MSE player's cues of the
    // language): their text and end.
    const book = mse ? window.sfuViewer.player.captions.tracks.get("en")?.cues.cues
      : window.sfuViewer.book.cues;
    const watched = [...(book ?? new Map()).values()].sort((a, b) => a.start - b.start)
      .slice(-kept).map((cue) => [cue.id, cue.text, cue.end]);
    window.cutFrames.push([performance.timeOrigin + performance.now(), streamS, active, watched]);
  });
}"""


def main() -> None:
    count, seed = int(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    service = PresenterApp(STREAM)
    service.thread.start()
    if not service.ready.wait(30):
        raise SystemExit("service did not start")
    presenter = service.presenter
    assert presenter is not None
    result: dict[str, Any] = {"cuts": []}
    try:
        with chromium.browser() as browser:
            pages = {"webrtc": browser.new_page(), "mse": browser.new_page()}
            pages["webrtc"].goto(f"{service.base}/?stream={STREAM}")
            pages["mse"].goto(f"{service.base}/?stream={STREAM}&mode=mse")
            # The MSE player needs a closed segment before it plays: speak meanwhile.
            service.call(presenter.say(SENTENCES[0], cue_id="warm-up"))
            for name, page in pages.items():
                live = ("() => window.sfuViewer?.player?.lastFrame != null" if name == "mse"
                        else "() => window.sfuViewer?.controls.snapshot().state === 'live'")
                page.wait_for_function(live, timeout=45_000, polling=100)
                page.evaluate(RECORDER_JS, [name == "mse", WATCHED])
            for i in range(count):
                cue_id = f"b{i}"
                said = service.call(presenter.say(SENTENCES[i % len(SENTENCES)], cue_id=cue_id))
                at = rng.randint(said.onset_ns + MARGIN_NS, said.end_ns - MARGIN_NS)
                while time.time_ns() < at:  # the presenter is on this host's clock
                    time.sleep(min(0.005, max(0.0, (at - time.time_ns()) / 1e9)))
                called_ns = time.time_ns()
                stopped = service.call(presenter.interrupt())
                result["cuts"].append([cue_id, called_ns, stopped])
            time.sleep(2.5)  # the MSE player plays a second or so behind live
            for name, page in pages.items():
                result[name] = page.evaluate("() => window.cutFrames")
            result["feed"] = service.call(service.feed())
    finally:
        service.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
