"""Chromium for the browser tests: the one place that launches it.

One browser at a time runs on this machine (2 cores): every launch first takes a machine-wide
lock, so tests in separate processes (probes, ``flake-check`` runs beside the suite) queue
instead of starving each other's media of CPU. The lock wait is kept on the returned browser's
launch record, for probes that report it.
"""

from __future__ import annotations

import fcntl
import shutil
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from playwright.async_api import Browser as AsyncBrowser
    from playwright.sync_api import Browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
BROWSER_LOCK = Path("/tmp/sfu-sidecar-browser.lock")

ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--allow-loopback-in-peer-connection",
    "--disable-features=WebRtcHideLocalIpsWithMdns",
    "--autoplay-policy=no-user-gesture-required",
]


@dataclass
class Launch:
    """How long the launch waited for the machine's browser lock."""

    lock_wait_s: float = 0.0


def _options(args: Sequence[str] | None, ignore_default_args: Sequence[str] | None,
             env: Mapping[str, str] | None) -> dict[str, object]:
    options: dict[str, object] = {"executable_path": CHROMIUM, "headless": True,
                                  "args": list(ARGS if args is None else args)}
    if ignore_default_args is not None:
        options["ignore_default_args"] = list(ignore_default_args)
    if env is not None:
        options["env"] = dict(env)
    return options


def _lock_file() -> IO[str]:
    BROWSER_LOCK.touch(exist_ok=True)
    return BROWSER_LOCK.open("w")


@contextmanager
def _locked(launch: Launch) -> Iterator[None]:
    with _lock_file() as lock:
        waited = time.monotonic()
        fcntl.flock(lock, fcntl.LOCK_EX)
        launch.lock_wait_s = round(time.monotonic() - waited, 1)
        yield


@contextmanager
def browser(*, args: Sequence[str] | None = None,
            ignore_default_args: Sequence[str] | None = None,
            env: Mapping[str, str] | None = None,
            launch: Launch | None = None) -> Iterator[Browser]:
    """A headless Chromium (playwright's sync API) under the machine's browser lock, with the
    suite's flags (fake camera and microphone, loopback ICE, autoplay) unless ``args`` replaces
    them; closed, and the lock released, on exit."""
    from playwright.sync_api import sync_playwright

    with _locked(launch or Launch()), sync_playwright() as pw:
        b = pw.chromium.launch(**_options(args, ignore_default_args, env))  # type: ignore[arg-type]
        try:
            yield b
        finally:
            b.close()


@asynccontextmanager
async def async_browser(*, args: Sequence[str] | None = None,
                        launch: Launch | None = None) -> AsyncIterator[AsyncBrowser]:
    """The same for playwright's async API; the lock is awaited in a thread so the caller's
    event loop (a service, peers) keeps running while it waits."""
    import asyncio

    from playwright.async_api import async_playwright

    launch = launch or Launch()
    with _lock_file() as lock:
        waited = time.monotonic()
        await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)
        launch.lock_wait_s = round(time.monotonic() - waited, 1)
        async with async_playwright() as pw:
            b = await pw.chromium.launch(**_options(args, None, None))  # type: ignore[arg-type]
            try:
                yield b
            finally:
                await b.close()


def forward_console(page: Any) -> None:
    """The page's console and uncaught errors go to stderr, which a failing test shows."""
    import sys

    page.on("console", lambda m: print("page:", m.type, m.text, file=sys.stderr))
    page.on("pageerror", lambda e: print("page error:", e, file=sys.stderr))
