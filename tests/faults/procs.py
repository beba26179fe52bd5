"""What the fault tests share: peers in their own processes, and reading the service's state
(``/api/streams``, ``/metrics``, ``/proc``) from outside, as an operator would."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT, ServerProcess, free_port, sidecar_command


class PeerProcess:
    """``tests/faults/peer_process.py`` as a child; its stdout is drained by a thread so the
    pipe never fills, and its log goes to ``log``."""

    def __init__(self, role: str, base: str, stream: str, log: Path, *,
                 sync: bool = False, reliable: bool = False) -> None:
        self.log = log
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.last: dict[str, Any] = {}
        with log.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.faults.peer_process", role, base, stream,
                 *(["--sync"] if sync else []), *(["--reliable"] if reliable else [])],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=err,
            )
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.put(json.loads(raw))

    async def wait_event(self, event: str, limit_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise AssertionError(
                        f"peer exited with {self.proc.returncode}:\n{self.log.read_text()}"
                    ) from None
                await asyncio.sleep(0.05)
                continue
            self.last = line
            if line["event"] == event:
                return line
        raise AssertionError(f"peer sent no {event!r} within {limit_s} s:\n{self.log.read_text()}")

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to DELETE, close DTLS or abort SCTP."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a stopped process cannot die of SIGKILL
            self.proc.kill()
            self.proc.wait(timeout=10)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


async def aget_json(url: str) -> Any:
    # urllib in a thread: the test's event loop keeps serving its own aiortc peers meanwhile.
    return await asyncio.to_thread(get_json, url)


def stream_status(base: str, stream: str) -> dict[str, Any] | None:
    """``/api/streams/{stream}``, or None when the relay has no such stream (404)."""
    try:
        status: dict[str, Any] = get_json(f"{base}/api/streams/{stream}")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise
    return status


def metrics(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics`` by (name, sorted labels)."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return out


def metric(base: str, name: str, **labels: str) -> float:
    """One sample of ``/metrics`` (0 when absent: a counter nobody bumped yet)."""
    return metrics(base).get((name, tuple(sorted(labels.items()))), 0.0)


class MountNamespace:
    """A private mount namespace held open by a sleeping process, so file systems mounted in
    it outlive the service processes started inside it (``exec_prefix``)."""

    def __init__(self) -> None:
        self.holder = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sleep", "infinity"]
        )
        self.pid = self.holder.pid
        deadline = time.monotonic() + 5
        while os.readlink(f"/proc/{self.pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt"):
            assert time.monotonic() < deadline, "unshare did not enter a new mount namespace"
            time.sleep(0.01)

    @property
    def exec_prefix(self) -> list[str]:
        return ["nsenter", "-t", str(self.pid), "-m", "--"]

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.exec_prefix, *cmd], capture_output=True, text=True,
                              check=check, timeout=30)

    def close(self) -> None:
        self.holder.kill()
        self.holder.wait(timeout=10)


class PrefixedServer(ServerProcess):
    """``ServerProcess`` started behind ``prefix`` (e.g. ``nsenter`` into a namespace, which
    execs the service in place: the child's pid is the service's). Output goes to ``log``
    rather than a pipe, since a storage fault makes the service log on every refused write."""

    def __init__(self, prefix: list[str], args: list[str], log: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = {k: v for k, v in os.environ.items() if not k.startswith("SFU_SIDECAR_")}
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*prefix, *sidecar_command(), "serve", "--host", "127.0.0.1",
                 "--port", str(self.port), *args],
                env=env, stdout=out, stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.log.read_text()
