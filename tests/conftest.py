"""Fixtures shared by the whole suite: free ports, a server subprocess, one headless Chromium."""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# One browser at a time on this machine (2 cores): every browser user takes this lock.
BROWSER_LOCK = Path("/tmp/sfu-sidecar-browser.lock")

CHROMIUM_ARGS = [
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


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sidecar_command() -> list[str]:
    exe = Path(sys.executable).with_name("sfu-sidecar")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "sfu_sidecar"]


class ServerProcess:
    """``sfu-sidecar serve`` as a real subprocess on a free port."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("SFU_SIDECAR_")}
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [*sidecar_command(), "serve", "--host", "127.0.0.1", "--port", str(self.port), *args],
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 10.0) -> float:
        """Seconds until /healthz answered."""
        import urllib.request

        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.proc.poll() is not None:
                out = self.proc.stdout.read().decode() if self.proc.stdout else ""
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{out}")
            try:
                with urllib.request.urlopen(self.base + "/healthz", timeout=0.5) as resp:
                    if resp.status == 200:
                        return time.monotonic() - started
            except OSError:
                time.sleep(0.05)
        raise TimeoutError("server did not answer /healthz")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=8)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def output(self) -> str:
        return self.proc.stdout.read().decode() if self.proc.stdout else ""


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[object]:
    started: list[ServerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> ServerProcess:
        server = ServerProcess(["--data-dir", str(tmp_path / "data"), *args], env)
        started.append(server)
        server.wait_ready()
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    """One headless Chromium for the session, held under a machine-wide lock."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}: install the 'chromium' package")
    from playwright.sync_api import sync_playwright

    BROWSER_LOCK.touch(exist_ok=True)
    with BROWSER_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with sync_playwright() as pw:
            b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                yield b
            finally:
                b.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run tests that use the session ``browser`` last.

    Playwright's sync API leaves its event loop marked as running in the main thread for as long
    as the session browser lives, so any asyncio test scheduled after the first browser test
    fails with "cannot be called from a running event loop". Order within each group is kept.
    """
    uses = [item for item in items if "browser" in getattr(item, "fixturenames", ())]
    if uses:
        rest = [item for item in items if "browser" not in getattr(item, "fixturenames", ())]
        items[:] = rest + uses
