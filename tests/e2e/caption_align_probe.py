"""Captions moved onto the voice, as the viewer page in Chromium holds them.

One service (``caption_align=snap``) and one publisher in this process: espeak-ng sentences as
the audio (the flash picture beside them), captions posted 300 ms early, one of them marked
fixed. The viewer page (WebRTC) is opened before the captions are posted and never reloaded;
its cue book (``window.sfuViewer.book``) is read every 100 ms until the service has moved every
cue it will. Prints one JSON line for tests/e2e/test_caption_align_chromium.py: per cue, the
start the page first held and the last one, and the service's own record of the cue.
Run inside a network namespace with only ``lo`` (the test does).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import aiohttp

from sfu_sidecar.client.whip import WhipSession, publish
from sfu_sidecar.synthetic import FlashVideoTrack, PcmAudioTrack, Timeline
from tests.e2e.harness import AppThread
from tests.support import chromium, speech

STREAM = "talk"
EARLY_NS = -300_000_000
FIXED = "s1"


class Service(AppThread):
    def __init__(self) -> None:
        super().__init__()
        self.session: WhipSession | None = None
        self.said = speech.compose([(v, 160, speech.sentences_for(v)[i]) for i in range(2)
                                    for v in speech.VOICES[:2]], (0.9, 1.3, 0.7), lead_s=4.0,
                                   tail_s=4.0)
        self.timeline: Timeline | None = None

    async def _start(self) -> None:
        await self.serve(caption_align="snap")
        self.timeline = Timeline.starting_now(time.time_ns)
        self.session = await publish(
            f"{self.base}/whip/{STREAM}",
            [PcmAudioTrack(self.timeline, self.said.pcm), FlashVideoTrack(self.timeline)],
            capture_start_ns=self.timeline.start_house_ns, ice_addresses=("127.0.0.1",))

    async def post_cues(self) -> list[dict[str, Any]]:
        assert self.timeline is not None
        start = self.timeline.start_house_ns
        cues = [{"id": f"s{i}", "start": on + EARLY_NS, "end": off + EARLY_NS, "text": text,
                 **({"fixed": True} if f"s{i}" == FIXED else {})}
                for i, (on, off, text) in enumerate(zip(
                    self.said.onset_ns(start), self.said.offset_ns(start), self.said.texts,
                    strict=True))]
        async with aiohttp.ClientSession() as http, http.post(
                f"{self.base}/api/streams/{STREAM}/captions",
                json={"timebase": "house_ns", "lang": "en", "cues": cues}) as resp:
            assert resp.status < 300, await resp.text()
        return cues

    async def feed(self) -> dict[str, Any]:
        async with aiohttp.ClientSession() as http, http.get(
                f"{self.base}/api/streams/{STREAM}/captions") as resp:
            body: dict[str, Any] = await resp.json()
            return {c["id"]: c for c in body["cues"]}

    async def _stop_peers(self) -> None:
        if self.session is not None:
            await self.session.close()


BOOK_JS = """() => Object.fromEntries([...window.sfuViewer.book.cues.values()]
    .map((c) => [c.id, c.start]))"""


def main() -> None:
    service = Service()
    service.thread.start()
    if not service.ready.wait(30):
        raise SystemExit("service did not start")
    result: dict[str, Any] = {"fixed": FIXED}
    try:
        with chromium.browser() as browser:
            page = browser.new_page()
            page.goto(f"{service.base}/?stream={STREAM}")
            page.wait_for_function("() => window.sfuViewer?.controls.snapshot().state === 'live'",
                                   timeout=30_000, polling=100)
            cues = service.call(service.post_cues())
            result["posted"] = [c["id"] for c in cues]
            first: dict[str, float] = {}
            last: dict[str, float] = {}
            deadline = time.monotonic() + service.said.pcm.size / speech.RATE + 20
            while time.monotonic() < deadline:
                held = page.evaluate(BOOK_JS)
                for cue_id, start in held.items():
                    first.setdefault(cue_id, start)
                    last[cue_id] = start
                feed = service.call(service.feed())
                moved = [c for c in feed.values() if c.get("aligned_ms")]
                if (len(moved) == len(cues) - 1
                        and all(last.get(c["id"]) == c["start"] for c in moved)):
                    break
                time.sleep(0.1)
            result["page_first"] = first
            result["page_last"] = last
            result["feed"] = service.call(service.feed())
            result["reloads"] = page.evaluate("() => performance.getEntriesByType('navigation')"
                                              ".length")
    finally:
        service.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
