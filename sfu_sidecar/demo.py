"""The demo: the service plus a synthetic broadcaster with scripted, synced captions.

The broadcaster publishes a flash/beep pattern over WHIP to the service it runs beside, and posts
one caption per second whose start is the house capture time of that second's flash, so a viewer
sees each caption appear with its flash and hears the beep with it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from fractions import Fraction

import aiohttp

from sfu_sidecar import app, logs
from sfu_sidecar.client.whip import WhipSession, publish
from sfu_sidecar.config import Settings
from sfu_sidecar.exceptions import SidecarError
from sfu_sidecar.synthetic import BeepAudioTrack, FlashVideoTrack, Timeline

log = logs.get("demo")

STREAM = "demo"
LANG = "en"
SCRIPT = (
    "Hello, I am a synthetic presenter.",
    "Every caption starts with a flash",
    "and the flash comes with a beep.",
    "Captions follow capture time,",
    "not arrival time.",
    "So they stay on the lips.",
)
LOOKAHEAD_S = 2  # captions are posted this far ahead, as TTS word timings would be


def caption_for_second(timeline: Timeline, second: int) -> dict[str, object]:
    start = timeline.start_house_ns + second * 1_000_000_000
    return {
        "id": f"line-{second}",
        "start": start,
        "end": start + 950_000_000,
        "text": f"{SCRIPT[second % len(SCRIPT)]} [{second}]",
        "final": True,
    }


class Broadcaster:
    """Publishes the synthetic source and its captions to one stream of a running service."""

    def __init__(self, base_url: str, token: str | None, now_ns: Callable[[], int]) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.now_ns = now_ns
        self.session: WhipSession | None = None

    async def run(self) -> None:
        timeline = Timeline.starting_now(self.now_ns)
        tracks = [BeepAudioTrack(timeline), FlashVideoTrack(timeline)]
        self.session = await publish(
            f"{self.base_url}/whip/{STREAM}", list(tracks), token=self.token,
            capture_start_ns=timeline.start_house_ns, clock_ns=self.now_ns,
            ice_addresses=("127.0.0.1",),
        )
        log.info("broadcaster publishing to stream %r", STREAM)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        async with aiohttp.ClientSession(headers=headers) as http:
            second = 0
            while True:
                # Post the caption for `second` LOOKAHEAD_S ahead of its flash.
                await timeline.sleep_until(Fraction(max(second - LOOKAHEAD_S, 0)))
                body = {"timebase": "house_ns", "lang": LANG,
                        "cues": [caption_for_second(timeline, second)]}
                async with http.post(
                    f"{self.base_url}/api/streams/{STREAM}/captions", json=body
                ) as resp:
                    if resp.status >= 300:
                        log.warning("caption post answered %d: %s", resp.status,
                                    (await resp.text()).strip())
                second += 1

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


async def _demo(settings: Settings) -> None:
    ready = asyncio.Event()
    application = app.build_app(settings)
    server = asyncio.create_task(app.serve(settings, ready=ready, app=application))
    await ready.wait()
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    # The broadcaster stamps capture times on the house clock it runs beside.
    broadcaster = Broadcaster(f"http://{host}:{settings.port}", settings.publish_token,
                              app.house_clock(application))
    task = asyncio.create_task(broadcaster.run())
    log.info("demo running: open http://%s:%d/ to watch stream %r", host, settings.port, STREAM)
    done, _ = await asyncio.wait({server, task}, return_when=asyncio.FIRST_COMPLETED)
    if task in done and task.exception() is not None:
        exc = task.exception()
        reason = exc.reason if isinstance(exc, SidecarError) else repr(exc)
        log.error("broadcaster stopped: %s (the service keeps running)", reason)
        await server
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    await broadcaster.close()


def run_demo(settings: Settings) -> int:
    app.install_event_loop_policy()
    asyncio.run(_demo(settings))
    return 0
