"""Fixtures shared by the whole suite: free ports, a server subprocess, one headless Chromium."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import chromium
from tests.support.chromium import CHROMIUM

# Every test's tier (unit, integration, system) and the guard that keeps unit tests pure.
pytest_plugins = ["tests.support.tiers", "tests.support.lanes"]

ROOT = Path(__file__).resolve().parent.parent
# simple-whip-server, a WHIP server on Janus: Debian's package installed, or unpacked into
# .cache by scripts/test where the package cannot be installed (it depends on Debian's nodejs,
# which conflicts with NodeSource's); its node modules are pinned in package.json.
SIMPLE_WHIP_SERVER = next(
    (p for p in (ROOT / ".cache/simple-whip-server/usr/share/simple-whip-server/src/server.js",
                 Path("/usr/share/simple-whip-server/src/server.js")) if p.exists()),
    ROOT / ".cache/simple-whip-server/usr/share/simple-whip-server/src/server.js",
)



# Debian package of each tool the suite drives, for the message that names what to install.
TOOL_PACKAGES = {
    "chromium": "chromium", "ptp4l": "linuxptp", "pmc": "linuxptp", "chronyd": "chrony",
    "ffmpeg": "ffmpeg", "ffprobe": "ffmpeg", "ip": "iproute2", "unshare": "util-linux",
    "node": "nodejs", "npm": "npm", "gst-launch-1.0": "gstreamer1.0-tools",
    "promtool": "prometheus", "nsenter": "util-linux", "findmnt": "util-linux",
    "mount": "mount", "mkfs.ext4": "e2fsprogs", "e2fsck": "e2fsprogs", "janus": "janus",
    "turnserver": "coturn", "redis-server": "redis-server", "pulseaudio": "pulseaudio",
    "parec": "pulseaudio-utils", "pactl": "pulseaudio-utils", "server.js": "simple-whip-server",
    "certutil": "libnss3-tools", "podman": "podman", "runc": "runc", "debootstrap": "debootstrap",
}
NOT_RUN = "NOT RUN: "


def partial_run() -> bool:
    """``scripts/test`` without root or apt: unmet requirements skip (reported as NOT RUN and
    failing the run's exit status) instead of failing each test."""
    return os.environ.get("SFU_SIDECAR_TESTS_PARTIAL") == "1"


def require(*tools: str, root: bool = False) -> None:
    """The one policy for what a test needs from the machine: missing -> the test fails with
    the package to install, or, in a partial run, is skipped as NOT RUN and counted."""
    reasons = []
    if root and os.geteuid() != 0:
        reasons.append("needs root (network namespaces)")
    missing = [t for t in tools if shutil.which(t) is None and not Path(t).exists()]
    if missing:
        pkgs = sorted({TOOL_PACKAGES.get(Path(t).name, Path(t).name) for t in missing})
        reasons.append(f"missing {', '.join(missing)} (apt-get install {' '.join(pkgs)})")
    if not reasons:
        return
    if partial_run():
        pytest.skip(NOT_RUN + "; ".join(reasons))
    pytest.fail("; ".join(reasons), pytrace=False)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("browser") is not None:
        require(CHROMIUM)
    if item.get_closest_marker("netns") is not None:
        require("ip", "unshare", root=True)
    for mark in item.iter_markers("needs"):
        require(*mark.args)


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    not_run = [r for r in terminalreporter.stats.get("skipped", [])
               if NOT_RUN in str(getattr(r, "longrepr", ""))]
    if not_run:
        terminalreporter.write_line(
            f"{len(not_run)} tests NOT RUN for missing requirements (see the skip reasons above); "
            "this run is incomplete", red=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    stats = getattr(reporter, "stats", {}) if reporter is not None else {}
    if exitstatus == 0 and any(NOT_RUN in str(getattr(r, "longrepr", ""))
                               for r in stats.get("skipped", [])):
        session.exitstatus = 3  # an incomplete run is never reported as a pass


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Settings for a service run inside a test process beside its own clients (aiortc peers encoding
# video, fuzzers): the process's CPU share is then mostly the clients', so the overload refusal
# is left out there and tested on its own (tests/relay/test_routes.py).
IN_PROCESS: dict[str, str] = {"max_cpu_percent": "1000"}


def sidecar_command() -> list[str]:
    exe = Path(sys.executable).with_name("sfu-sidecar")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "sfu_sidecar"]


class ServerProcess:
    """``sfu-sidecar serve`` as a real subprocess on a free port."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None,
                 port: int | None = None) -> None:
        self.port = port or free_port()
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


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """One headless Chromium for a module's tests, held under the machine-wide browser lock.

    Per module, not per session: the lock is released between modules for the probes of other
    processes, and Playwright's event loop (below) ends with the module."""
    require(CHROMIUM)
    with chromium.browser() as b:
        yield b


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run tests that use the ``browser`` fixture last.

    Playwright's sync API leaves its event loop marked as running in the main thread for as long
    as the browser lives, so an asyncio test scheduled between two browser tests of a module
    fails with "cannot be called from a running event loop". Order within each group is kept.
    """
    uses = [item for item in items if "browser" in getattr(item, "fixturenames", ())]
    if uses:
        rest = [item for item in items if "browser" not in getattr(item, "fixturenames", ())]
        items[:] = rest + uses
