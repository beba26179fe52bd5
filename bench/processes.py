"""What the benchmarks share about processes: free ports, pinning a process to the CPUs of its
role, a process's CPU time from /proc, a server process and its health check, and the lock
that keeps two benchmarks from running at once.

Each benchmark stays one runnable file; this module is imported after the repository root is
put on the path.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

BENCH_LOCK = Path("/tmp/sfu-sidecar-bench.lock")
LOOPBACK = ("127.0.0.1",)
# The CPUs of each role (``server``, ``load``) when a benchmark pins them; empty: unpinned.
CPUS: dict[str, set[int]] = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(command: list[str], role: str, **kwargs: Any) -> subprocess.Popen[bytes]:
    """A child process on the CPUs of its role (``server`` or ``load``)."""

    def pin() -> None:
        if role in CPUS:
            os.sched_setaffinity(0, CPUS[role])

    return subprocess.Popen(command, preexec_fn=pin, **kwargs)


def cpu_seconds(pid: int) -> float:
    """CPU time of a process, all its threads, in seconds.

    The sum of its threads' /proc schedstat run times (nanoseconds) where the kernel keeps
    them: utime + stime from /proc/PID/stat count in 10 ms ticks, 0.25 % of a core over a 4 s
    window, as coarse as the differences measured. A thread that ends inside a window takes
    its share with it; the server's threads live as long as it does."""
    total_ns = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError):
                total_ns += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
        return total_ns / 1e9
    except (FileNotFoundError, IndexError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    base: str
    log: Path | None = None

    def log_count(self, text: str) -> int:
        return self.log.read_text(errors="replace").count(text) if self.log else 0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def wait_healthy(server: Server, path: str, what: str) -> None:
    import aiohttp

    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as http:
        while True:
            if server.proc.poll() is not None:
                tail = server.log.read_text()[-2000:] if server.log else ""
                raise RuntimeError(f"{what} exited with {server.proc.returncode}\n{tail}")
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(server.base + path) as resp:
                    if resp.status < 500:
                        return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start")
            await asyncio.sleep(0.1)


def holds_bench_lock() -> bool:
    """Whether this process inherited a descriptor on the bench lock, as under
    ``flock /tmp/sfu-sidecar-bench.lock CMD`` (locking it again would wait forever)."""
    return inherits(BENCH_LOCK)


# Set in a copy of a benchmark run again in a network namespace of its own (only ``lo``).
NETNS_MARK = "SFU_SIDECAR_BENCH_NETNS"


@contextlib.contextmanager
def locks(*paths: Path) -> Iterator[None]:
    """Holds each lock file in turn (bench, then browser), skipping one that ``flock`` already
    holds for this process (locking it again through a new descriptor would wait forever), and
    all of them in a copy of the script run in a namespace (NETNS_MARK): the parent holds
    them."""
    if os.environ.get(NETNS_MARK):
        yield
        return
    with contextlib.ExitStack() as stack:
        for path in paths:
            if inherits(path):
                continue
            path.touch(exist_ok=True)
            handle: IO[str] = stack.enter_context(path.open("w"))
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def inherits(path: Path) -> bool:
    """Whether this process inherited a descriptor on the lock file ``path`` (as under
    ``flock PATH CMD``: locking it again through a new descriptor would wait forever)."""
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if Path(os.readlink(f"/proc/self/fd/{fd}")) == path:
                return True
    return False


def in_loopback_namespace() -> bool:
    # The interfaces of this process's own network namespace (/sys/class/net would show the
    # namespace sysfs was mounted in).
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def rerun_in_loopback_namespace() -> int:
    """Runs this script again inside a new network namespace with only ``lo`` up (root)."""
    if os.environ.get(NETNS_MARK):
        raise SystemExit("still not in a namespace with only lo after unshare -n")
    command = shlex.join([sys.executable, *sys.argv])
    return subprocess.call(["unshare", "-n", "sh", "-c", f"ip link set lo up && exec {command}"],
                           env={**os.environ, NETNS_MARK: "1"})
