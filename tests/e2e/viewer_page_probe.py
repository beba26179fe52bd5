"""The viewer page as a person uses it, in headless Chromium with the browser's ordinary
autoplay policy (sound needs a user gesture) and its audio output recorded outside the browser
(tests/e2e/audio_output.py).

One service and one publisher (the synthetic flash-and-beep source, captions in two languages)
in this process; one browser. WebRTC mode at desktop size: starts muted with the unmute control
shown, one click brings the stream's beeps to the audio output, the keyboard shortcuts, the
fullscreen and caption toggles and the language choice do what they say; the publisher leaves
(the page says the stream is offline) and comes back (playback resumes without a reload). Then
each mode at phone size (390x844) and MSE at desktop size with its own unmute check, a
screenshot of each. Prints one JSON line for tests/e2e/test_viewer_page_chromium.py.
Run inside a network namespace with only ``lo`` (the test does).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.conftest import ROOT
from tests.e2e.audio_output import MUTE_AUDIO, AudioOutput
from tests.e2e.harness import AppThread, Broadcaster
from tests.support import chromium

STREAM = "live"
LANGS = ("en", "de")
CUE_SPAN_S = 120
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
SCREENSHOTS = Path(os.environ.get("SFU_SIDECAR_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "viewer"
# The autoplay policy of desktop Chromium, named rather than left to the headless default
# (which varied between launches here): a document plays sound only after a gesture in it.
ARGS = [*(a for a in chromium.ARGS if not a.startswith("--autoplay-policy")),
        "--autoplay-policy=document-user-activation-required"]
# A live page plays within this of showing its first frame (muted where the browser refuses
# sound): idle, at once for WebRTC and after one part (~0.5 s) for MSE.
PLAYING_WITHIN_S = 8


class Service(AppThread):
    def __init__(self) -> None:
        super().__init__()
        self.broadcaster = Broadcaster(f"{self.base}/whip/{STREAM}")

    async def _start(self) -> None:
        await self.serve()
        await self.broadcaster.publish()
        await self.post_cues()

    async def post_cues(self) -> None:
        """A cue a second in each language, on the publisher's own seconds, for two minutes."""
        start = self.broadcaster.timeline.start_house_ns
        async with aiohttp.ClientSession() as http:
            for lang in LANGS:
                cues = [{"id": f"{lang}-{k}", "start": start + k * 1_000_000_000,
                         "end": start + k * 1_000_000_000 + 900_000_000,
                         "text": f"[{lang}] second {k}"} for k in range(CUE_SPAN_S)]
                async with http.post(f"{self.base}/api/streams/{STREAM}/captions",
                                     json={"timebase": "house_ns", "lang": lang,
                                           "cues": cues}) as resp:
                    assert resp.status < 300, await resp.text()

    async def _stop_peers(self) -> None:
        await self.broadcaster.close()


def wait_for(page: Any, script: str, timeout_s: float) -> float:
    """Seconds until ``script`` (a function expression) returned true in the page."""
    started = time.monotonic()
    page.wait_for_function(script, timeout=timeout_s * 1000, polling=100)
    return time.monotonic() - started


def snapshot(page: Any) -> dict[str, Any]:
    shot: dict[str, Any] = page.evaluate("() => window.sfuViewer.controls.snapshot()")
    return shot


def track_modes(page: Any) -> dict[str, str]:
    modes: dict[str, str] = page.evaluate(
        "() => Object.fromEntries([...document.getElementById('video').textTracks]"
        ".map((t) => [t.language, t.mode]))")
    return modes


def heard(audio: AudioOutput, start_ns: int, end_ns: int) -> dict[str, Any]:
    return {"loudest": audio.loudest(start_ns, end_ns),
            "onsets_ns": audio.onsets(start_ns, end_ns), "from_ns": start_ns, "to_ns": end_ns}


def unmute_check(page: Any, audio: AudioOutput, service: Service, muted_s: float,
                 unmuted_s: float) -> dict[str, Any]:
    """The output while the page plays muted, then after one click on the unmute control.
    ``start_ns``: the publisher's timeline now (a publisher that came back started a new one),
    whose whole seconds its beeps start on."""
    # "Live" comes with the first frame shown; the MSE player then holds that frame until it
    # has buffered its lag behind the live edge (a part, longer on a loaded machine), so the
    # page is judged once it plays, or when it failed to within PLAYING_WITHIN_S.
    started = time.monotonic()
    with contextlib.suppress(PlaywrightTimeout):
        page.wait_for_function("() => !window.sfuViewer.controls.snapshot().paused",
                               timeout=PLAYING_WITHIN_S * 1000, polling=50)
    out: dict[str, Any] = {"playing_after_s": round(time.monotonic() - started, 2),
                           "before": snapshot(page), "unmute_visible": page.is_visible("#unmute"),
                           "start_ns": service.broadcaster.timeline.start_house_ns}
    # Chromium grants sound on its own heuristics too (media engagement of the origin): a page
    # it let play with sound is muted with the mute control first, as a viewer would.
    if not out["before"]["muted"]:
        page.click("#mute")
        out["muted_by_control"] = snapshot(page)["muted"]
        out["unmute_visible"] = page.is_visible("#unmute")
        time.sleep(0.5)  # what the output device already held still plays out
    t0 = time.time_ns()
    time.sleep(muted_s)
    t1 = time.time_ns()
    out["at_click"] = snapshot(page)
    if not page.is_visible("#unmute"):  # the test fails on this; the rest has nothing to show
        return out
    page.click("#unmute")
    clicked = time.time_ns()
    # The page's own latency behind live through the listening, to date each beep against.
    out["picture_latency"] = []
    while time.time_ns() - clicked < unmuted_s * 1e9:
        out["picture_latency"].append((time.time_ns(), snapshot(page)["latencyMs"]))
        time.sleep(0.2)
    out["muted"] = heard(audio, t0, t1)
    out["unmuted"] = heard(audio, clicked, time.time_ns())
    out["after"] = snapshot(page)
    out["unmute_visible_after"] = page.is_visible("#unmute")
    return out


def layout(page: Any) -> dict[str, Any]:
    """Horizontal overflow and every visible control's box, for the phone-size check."""
    found: dict[str, Any] = page.evaluate("""() => ({
      overflow: document.documentElement.scrollWidth - document.documentElement.clientWidth,
      width: document.documentElement.clientWidth,
      controls: [...document.querySelectorAll('.controls button, .controls select, #unmute')]
        .filter((el) => el.offsetParent !== null)
        .map((el) => { const r = el.getBoundingClientRect();
          return {id: el.id, left: r.left, right: r.right, width: r.width, height: r.height,
                  label: el.getAttribute('aria-label') ?? el.textContent.trim()}; }),
    })""")
    return found


def keyboard_and_toggles(page: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    page.focus("body")
    page.keyboard.press("m")
    out["m_once"] = snapshot(page)["muted"]
    page.keyboard.press("m")
    out["m_twice"] = snapshot(page)["muted"]
    page.keyboard.press("c")
    out["c_once"] = {"captions": snapshot(page)["captions"], "modes": track_modes(page)}
    page.keyboard.press("c")
    out["c_twice"] = {"captions": snapshot(page)["captions"], "modes": track_modes(page)}
    page.keyboard.press("k")
    time.sleep(0.3)
    out["k_once"] = snapshot(page)["paused"]
    page.keyboard.press("k")
    time.sleep(0.3)
    out["k_twice"] = snapshot(page)["paused"]
    page.keyboard.press("f")
    time.sleep(0.3)
    out["f_once"] = page.evaluate("() => document.fullscreenElement?.id ?? null")
    page.keyboard.press("f")
    time.sleep(0.3)
    out["f_twice"] = page.evaluate("() => document.fullscreenElement?.id ?? null")
    page.click("#fullscreen")
    time.sleep(0.3)
    out["fullscreen_button"] = page.evaluate("() => document.fullscreenElement?.id ?? null")
    page.click("#fullscreen")
    time.sleep(0.3)
    out["fullscreen_button_again"] = page.evaluate("() => document.fullscreenElement?.id ?? null")
    page.click("#cc")
    out["cc_button"] = {"captions": snapshot(page)["captions"], "modes": track_modes(page),
                        "pressed": page.get_attribute("#cc", "aria-pressed")}
    page.click("#cc")
    out["cc_button_again"] = {"captions": snapshot(page)["captions"], "modes": track_modes(page),
                              "pressed": page.get_attribute("#cc", "aria-pressed")}
    page.select_option("#lang", "de")
    time.sleep(0.3)
    out["language_de"] = {"modes": track_modes(page), "lang": snapshot(page)["lang"]}
    page.select_option("#lang", "en")
    return out


AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"


def accessibility(page: Any) -> list[dict[str, Any]]:
    """axe-core's WCAG 2.1 A/AA and best-practice rules on the page as it stands: the
    violations, each with its impact and the elements it found."""
    page.add_script_tag(path=str(AXE))
    found: list[dict[str, Any]] = page.evaluate("""async () => {
      const r = await axe.run(document, {runOnly: {type: 'tag',
        values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'best-practice']}});
      return r.violations.map((v) => ({id: v.id, impact: v.impact, help: v.help,
        nodes: v.nodes.map((n) => n.target.join(' ')).slice(0, 5)}));
    }""")
    return found


def offline_and_back(page: Any, service: Service, mode: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    page.evaluate("() => { window.sameDocument = true; }")
    service.call(service.broadcaster.leave())
    left = time.monotonic()
    try:
        wait_for(page, "() => window.sfuViewer.controls.snapshot().state === 'offline'", 10)
        out["offline_after_s"] = time.monotonic() - left
    except Exception as err:  # the assertion is the test's: report what the page showed
        out["offline_after_s"] = None
        out["offline_error"] = str(err)[:300]
    out["offline"] = snapshot(page)
    out["overlay_visible"] = page.is_visible("#overlay")
    out["offline_caption_modes"] = track_modes(page)
    page.screenshot(path=str(SCREENSHOTS / f"{mode}-desktop-offline.png"))
    presented = snapshot(page)["frames"]
    service.call(service.broadcaster.come_back())
    back = time.monotonic()
    try:
        wait_for(page, f"() => window.sfuViewer.controls.snapshot().frames > {presented} + 30 "
                 "&& window.sfuViewer.controls.snapshot().state === 'live'", 20)
        out["resumed_after_s"] = time.monotonic() - back
    except Exception as err:
        out["resumed_after_s"] = None
        out["resume_error"] = str(err)[:300]
    out["resumed"] = snapshot(page)
    out["same_document"] = page.evaluate("() => window.sameDocument === true")
    out["overlay_visible_after"] = page.is_visible("#overlay")
    out["caption_modes_after"] = track_modes(page)
    return out


def main() -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    service = Service()
    service.thread.start()
    if not service.ready.wait(30):
        raise SystemExit("service did not start")
    result: dict[str, Any] = {"start_ns": service.broadcaster.timeline.start_house_ns,
                              "screenshots": str(SCREENSHOTS)}
    try:
        with AudioOutput() as audio, chromium.browser(
                args=ARGS, ignore_default_args=MUTE_AUDIO,
                env={**os.environ, **audio.env}) as browser:
            # A fresh context per check: no sound permission earned by an earlier click on
            # this origin, no choices remembered from an earlier page.
            page = browser.new_context(viewport=DESKTOP).new_page()
            page.goto(f"{service.base}/?stream={STREAM}")
            result["webrtc_live_after_s"] = wait_for(
                page, "() => window.sfuViewer?.controls.snapshot().state === 'live' && "
                "window.sfuViewer.controls.snapshot().languages.length === 2", 20)
            result["webrtc_unmute"] = unmute_check(page, audio, service, 2.2, 4.5)
            result["webrtc_latency_text"] = snapshot(page)["latency"]
            result["webrtc_keys"] = keyboard_and_toggles(page)
            page.screenshot(path=str(SCREENSHOTS / "webrtc-desktop.png"))
            page.click("#nerd-stats summary")  # the stats panel open, so it is checked too
            result["axe_viewer_webrtc"] = accessibility(page)
            result["webrtc_offline"] = offline_and_back(page, service, "webrtc")
            page.close()

            for mode, query in (("webrtc", ""), ("mse", "&mode=mse")):
                page = browser.new_context(viewport=PHONE).new_page()
                page.goto(f"{service.base}/?stream={STREAM}{query}")
                wait_for(page, "() => window.sfuViewer?.controls.snapshot().state === 'live'",
                         20)
                result[f"{mode}_phone"] = layout(page)
                page.screenshot(path=str(SCREENSHOTS / f"{mode}-phone.png"))
                page.close()

            page = browser.new_context(viewport=DESKTOP).new_page()
            page.goto(f"{service.base}/?stream={STREAM}&mode=mse")
            result["mse_live_after_s"] = wait_for(
                page, "() => window.sfuViewer?.controls.snapshot().state === 'live' && "
                "window.sfuViewer.controls.snapshot().languages.length === 2", 20)
            result["mse_unmute"] = unmute_check(page, audio, service, 2.2, 4.5)
            result["mse_latency_text"] = snapshot(page)["latency"]
            result["mse_caption_modes"] = track_modes(page)
            page.screenshot(path=str(SCREENSHOTS / "mse-desktop.png"))
            result["axe_viewer_mse"] = accessibility(page)
            result["mse_offline"] = offline_and_back(page, service, "mse")
            page.close()

            page = browser.new_context(viewport=DESKTOP).new_page()
            page.goto(f"{service.base}/publish?stream=axe")
            page.wait_for_load_state("networkidle")
            result["axe_publisher"] = accessibility(page)
            page.screenshot(path=str(SCREENSHOTS / "publisher-desktop.png"))
            page.close()
    finally:
        service.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
