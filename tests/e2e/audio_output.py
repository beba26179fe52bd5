"""What a browser page actually plays out, heard from the outside: a private PulseAudio server
with a null sink, Chromium sending its audio output there, and ``parec`` recording the sink's
monitor. Unlike an analyser on the page's own stream (``captureStream()`` ignores the element's
``muted``; an element source node gives silence for a WebRTC ``srcObject`` in Chromium), this
is the sound a viewer's speakers would get, for WebRTC and MSE playback alike.

Chromium must be launched with ``env`` and without Playwright's default ``--mute-audio``
(``ignore_default_args=MUTE_AUDIO``).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
import time
from array import array
from pathlib import Path
from types import TracebackType

RATE = 48000
MUTE_AUDIO = ["--mute-audio"]
# A 10 ms window whose peak passes this (of full scale 32767) holds sound: the synthetic beep
# peaks near 12400 after Opus and Chromium's mixing; silence is exactly 0 on a null sink.
SOUND_PEAK = 2000
WINDOW_S = 0.010


class AudioOutput:
    """A PulseAudio null sink recorded from the moment it starts until ``close``."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="sfu-sidecar-pulse-"))
        self.socket = self.dir / "pulse.sock"
        self.env = {"PULSE_SERVER": f"unix:{self.socket}", "HOME": str(self.dir),
                    "XDG_RUNTIME_DIR": str(self.dir)}
        self.server = subprocess.Popen(
            ["pulseaudio", "-n", "--daemonize=no", "--exit-idle-time=-1", "--system=no",
             "--use-pid-file=no", "--disallow-exit",
             "-L", f"module-native-protocol-unix socket={self.socket} auth-anonymous=1",
             "-L", f"module-null-sink sink_name=out rate={RATE}"],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_for_server()
        # 20 ms of recording latency: each chunk's arrival time dates its samples to ~20 ms.
        self.recorder = subprocess.Popen(
            ["parec", "-d", "out.monitor", "--format=s16le", f"--rate={RATE}", "--channels=1",
             "--raw", "--latency-msec=20"],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.chunks: list[tuple[int, bytes]] = []  # (wall-clock ns at arrival, samples)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _wait_for_server(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise RuntimeError(f"pulseaudio exited with {self.server.returncode}")
            probe = subprocess.run(["pactl", "info"], env=self.env, capture_output=True)
            if probe.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError("pulseaudio did not start")

    def _read(self) -> None:
        assert self.recorder.stdout is not None
        while True:
            chunk = self.recorder.stdout.read1(65536)
            if not chunk:
                return
            self.chunks.append((time.time_ns(), chunk))

    def windows(self, start_ns: int, end_ns: int) -> list[tuple[int, int]]:
        """(wall-clock ns, peak) of every 10 ms window recorded between the two instants.

        Samples are dated by their count from the recording's start, not by when their chunk
        reached this process: a reader starved of CPU gets chunks late, never early, so the
        start is the earliest that every chunk's arrival allows (the arrivals' lower envelope)
        and the null sink's clock, which never stops, counts from there."""
        chunks = list(self.chunks)
        data = b"".join(chunk for _, chunk in chunks)
        samples = array("h", data[: len(data) - len(data) % 2])
        start_of_recording = None
        received = 0
        for arrived_ns, chunk in chunks:
            received += len(chunk) // 2
            candidate = arrived_ns - received * 1_000_000_000 // RATE
            if start_of_recording is None or candidate < start_of_recording:
                start_of_recording = candidate
        out: list[tuple[int, int]] = []
        if start_of_recording is None:
            return out
        per = int(RATE * WINDOW_S)
        for i in range(0, len(samples) - per + 1, per):
            at = start_of_recording + i * 1_000_000_000 // RATE
            if start_ns <= at < end_ns:
                window = samples[i:i + per]
                out.append((at, max(abs(min(window)), max(window))))
        return out

    def onsets(self, start_ns: int, end_ns: int, gap_s: float = 0.3) -> list[int]:
        """Wall-clock ns where sound starts after at least ``gap_s`` of silence."""
        found: list[int] = []
        last_sound: int | None = None
        for at, peak in self.windows(start_ns, end_ns):
            if peak < SOUND_PEAK:
                continue
            if last_sound is None or at - last_sound >= gap_s * 1e9:
                found.append(at)
            last_sound = at
        return found

    def loudest(self, start_ns: int, end_ns: int) -> int:
        return max((peak for _, peak in self.windows(start_ns, end_ns)), default=0)

    def close(self) -> None:
        for proc in (self.recorder, self.server):
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> AudioOutput:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()
