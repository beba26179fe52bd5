"""GPU memory telemetry: NVML device samples and renderers' own allocator reports.

NVML (``pynvml``, the ``gpu`` extra) sees each device's memory totals, utilisation and the memory
each process holds, but not how the memory inside a process is carved up: PyTorch's caching
allocator keeps freed blocks reserved, and a reserve split into small blocks cannot serve a large
allocation, which then stalls on ``cudaMalloc`` retries or fails out of memory while NVML still
shows free memory. So renderers report their allocator (``POST /api/gpu/report``, see
``sfu_sidecar/client/gpu_report.py``) and the fragmentation index is computed here:
``1 - largest_free_block / (reserved - allocated)``: 0 when the free reserve is one block, near
1 when it is dust.

NVML is reached only through :func:`import_nvml`, the seam tests replace. Without ``pynvml``,
without a driver or without a GPU, :meth:`NvmlSampler.sample` says ``unavailable`` with the
reason and nothing fails.
"""

from __future__ import annotations

import contextlib
import math
import re
import statistics
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sfu_sidecar.exceptions import BadInput
from sfu_sidecar.streamname import RULE, is_stream_name

S = 1_000_000_000
# NVML initialisation is retried this often after it failed (a driver loaded later).
NVML_RETRY_NS = 60 * S
RENDERER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:~-]{0,63}")
MAX_RENDERERS = 64
HISTORY = 120  # reports kept per renderer
FRAGMENTATION_SPIKE = 0.68  # where the gpu_fragmentation alert is raised
SPIKE_RISE = 0.2  # or this far above the renderer's median
MIN_CORRELATION_POINTS = 8
MAX_BYTES = 1 << 62  # far beyond any device; larger values are mistakes, not memory


def import_nvml() -> Any:
    """The ``pynvml`` module (nvidia-ml-py). Raises ImportError when it is not installed."""
    import pynvml

    return pynvml


# --- NVML -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcessMemory:
    pid: int
    used_bytes: int | None  # None where the driver does not say (e.g. inside containers)


@dataclass(frozen=True, slots=True)
class DeviceSample:
    index: int
    name: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    utilization_pct: float | None
    memory_utilization_pct: float | None
    processes: tuple[ProcessMemory, ...]

    @property
    def used_pct(self) -> float:
        return 100.0 * self.used_bytes / self.total_bytes if self.total_bytes else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "index": self.index, "name": self.name, "total_bytes": self.total_bytes,
            "used_bytes": self.used_bytes, "free_bytes": self.free_bytes,
            "used_pct": round(self.used_pct, 2), "utilization_pct": self.utilization_pct,
            "memory_utilization_pct": self.memory_utilization_pct,
            "processes": [{"pid": p.pid, "used_bytes": p.used_bytes} for p in self.processes],
        }


@dataclass(frozen=True, slots=True)
class GpuSample:
    t_ns: int
    available: bool
    reason: str | None
    devices: tuple[DeviceSample, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {"t_ns": self.t_ns, "available": self.available, "reason": self.reason,
                "devices": [d.as_dict() for d in self.devices]}


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlSampler:
    """Samples every device NVML sees. Blocking calls (a few ms): run it off the event loop."""

    def __init__(self, loader: Any = import_nvml) -> None:
        self._loader = loader
        self._nvml: Any = None
        self._ready = False
        self._reason: str | None = "not sampled yet"
        self._next_try_ns: int | None = None

    def _init(self, now_ns: int) -> bool:
        if self._ready:
            return True
        if self._next_try_ns is not None and now_ns < self._next_try_ns:
            return False
        self._next_try_ns = now_ns + NVML_RETRY_NS
        try:
            nvml = self._loader()
        except ImportError:
            self._reason = "pynvml is not installed (pip install 'sfu-sidecar[gpu]')"
            return False
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            self._reason = f"NVML: {_text(exc) or type(exc).__name__}"
            return False
        self._nvml, self._ready, self._reason = nvml, True, None
        return True

    def sample(self, now_ns: int) -> GpuSample:
        if not self._init(now_ns):
            return GpuSample(now_ns, False, self._reason)
        nvml = self._nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
            devices = tuple(self._device(nvml, i) for i in range(count))
        except Exception as exc:  # the driver went away (GPU fell off the bus, reset)
            self.close()
            self._reason = f"NVML: {_text(exc) or type(exc).__name__}"
            return GpuSample(now_ns, False, self._reason)
        if not devices:
            return GpuSample(now_ns, False, "NVML sees no GPU")
        return GpuSample(now_ns, True, None, devices)

    @staticmethod
    def _device(nvml: Any, index: int) -> DeviceSample:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            gpu_pct: float | None = float(rates.gpu)
            mem_pct: float | None = float(rates.memory)
        except Exception:  # NVMLError_NotSupported on some boards and in MIG mode
            gpu_pct = mem_pct = None
        try:
            procs = tuple(
                ProcessMemory(int(p.pid), None if p.usedGpuMemory is None
                              else int(p.usedGpuMemory))
                for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            )
        except Exception:
            procs = ()
        return DeviceSample(
            index=index, name=_text(nvml.nvmlDeviceGetName(handle)),
            total_bytes=int(memory.total), used_bytes=int(memory.used),
            free_bytes=int(memory.free), utilization_pct=gpu_pct,
            memory_utilization_pct=mem_pct, processes=procs,
        )

    def close(self) -> None:
        if self._ready:
            # Shutting down a library that already failed leaves nothing to handle.
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
        self._ready = False


# --- renderer allocator reports ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AllocatorReport:
    """One renderer's caching-allocator state (fields of ``torch.cuda.memory_stats()``)."""

    renderer: str
    stream: str | None
    device: int | None
    reserved_bytes: int
    allocated_bytes: int
    largest_free_block_bytes: int
    inactive_split_bytes: int
    alloc_retries: int
    ooms: int

    @classmethod
    def parse(cls, obj: Any) -> AllocatorReport:
        """Validate a decoded JSON body; BadInput names the first fault."""
        if not isinstance(obj, dict):
            raise BadInput("report must be a JSON object")
        renderer = obj.get("renderer")
        if not isinstance(renderer, str) or not RENDERER_NAME.fullmatch(renderer):
            raise BadInput("renderer must be 1-64 characters of A-Z a-z 0-9 _ . : ~ -")
        stream = obj.get("stream")
        if stream is not None and not is_stream_name(stream):
            raise BadInput(f"stream must be a stream name ({RULE})")
        device = obj.get("device")
        if device is not None:
            device = _count(obj, "device", 1 << 16)
        values = {name: _count(obj, name, MAX_BYTES) for name in (
            "reserved_bytes", "allocated_bytes", "largest_free_block_bytes",
            "inactive_split_bytes", "alloc_retries", "ooms")}
        free = values["reserved_bytes"] - values["allocated_bytes"]
        if free < 0:
            raise BadInput("allocated_bytes exceeds reserved_bytes")
        if values["largest_free_block_bytes"] > free:
            raise BadInput("largest_free_block_bytes exceeds reserved_bytes - allocated_bytes")
        return cls(renderer=renderer, stream=stream, device=device, **values)

    @property
    def free_reserved_bytes(self) -> int:
        return self.reserved_bytes - self.allocated_bytes

    @property
    def fragmentation(self) -> float:
        """``1 - largest_free_block / (reserved - allocated)``; 0 with nothing free."""
        free = self.free_reserved_bytes
        return 1.0 - self.largest_free_block_bytes / free if free > 0 else 0.0

    @property
    def reserved_ratio(self) -> float | None:
        """reserved / allocated: how much the cache holds per byte in use."""
        return self.reserved_bytes / self.allocated_bytes if self.allocated_bytes else None


def _count(obj: dict[str, Any], name: str, limit: int) -> int:
    value = obj.get(name)
    if value is None:
        raise BadInput(f"report without {name}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(f"{name} must be an integer")
    if not 0 <= value <= limit:
        raise BadInput(f"{name} must be between 0 and {limit}")
    return value


@dataclass(frozen=True, slots=True)
class _Point:
    t_ns: int
    fragmentation: float
    jitter_ms: float | None  # the renderer's stream frame jitter (RMS) when it reported
    spike: bool


def pearson(xs: list[float], ys: list[float]) -> float | None:
    """Pearson's r, or None with too few points or a constant series."""
    if len(xs) < MIN_CORRELATION_POINTS:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    syy = math.fsum((y - my) ** 2 for y in ys)
    if sxx <= 1e-18 or syy <= 1e-18:
        return None
    return math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / math.sqrt(
        sxx * syy)


class RendererState:
    """The latest report of one renderer and a short history of its fragmentation."""

    def __init__(self, report: AllocatorReport) -> None:
        self.report = report
        self.history: deque[_Point] = deque(maxlen=HISTORY)
        self.reports = 0

    def add(self, report: AllocatorReport, now_ns: int, jitter_ms: float | None) -> None:
        frag = report.fragmentation
        past = [p.fragmentation for p in self.history]
        baseline = statistics.median(past) if past else frag
        spike = frag >= FRAGMENTATION_SPIKE or frag - baseline >= SPIKE_RISE
        self.report = report
        self.reports += 1
        self.history.append(_Point(now_ns, frag, jitter_ms, spike))

    def correlation(self) -> dict[str, object]:
        """How the stream's frame jitter moved with this renderer's fragmentation."""
        pts = [(p.fragmentation, p.jitter_ms, p.spike) for p in self.history
               if p.jitter_ms is not None]
        r = pearson([f for f, _, _ in pts], [j for _, j, _ in pts])
        return {
            "points": len(pts),
            "pearson_r": None if r is None else round(r, 3),
            "spikes": sum(p.spike for p in self.history),
            "jitter_ms_at_spikes": _median([j for _, j, spike in pts if spike]),
            "jitter_ms_otherwise": _median([j for _, j, spike in pts if not spike]),
        }

    def as_dict(self) -> dict[str, object]:
        rep = self.report
        ratio = rep.reserved_ratio
        return {
            "renderer": rep.renderer, "stream": rep.stream, "device": rep.device,
            "reserved_bytes": rep.reserved_bytes, "allocated_bytes": rep.allocated_bytes,
            "free_reserved_bytes": rep.free_reserved_bytes,
            "largest_free_block_bytes": rep.largest_free_block_bytes,
            "inactive_split_bytes": rep.inactive_split_bytes,
            "alloc_retries": rep.alloc_retries, "ooms": rep.ooms,
            "fragmentation": round(rep.fragmentation, 4),
            "reserved_ratio": None if ratio is None else round(ratio, 4),
            "reports": self.reports,
            "last_report_ns": self.history[-1].t_ns if self.history else None,
            "history": [[p.t_ns, round(p.fragmentation, 4)] for p in self.history],
            "correlation": self.correlation(),
        }


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


class Renderers:
    """Every renderer that reported, at most MAX_RENDERERS (the longest silent one goes)."""

    def __init__(self, limit: int = MAX_RENDERERS) -> None:
        self.limit = limit
        self.states: OrderedDict[str, RendererState] = OrderedDict()

    def add(self, report: AllocatorReport, now_ns: int,
            jitter_ms: float | None) -> RendererState:
        state = self.states.pop(report.renderer, None)
        if state is None:
            state = RendererState(report)
            while len(self.states) >= self.limit:
                self.states.popitem(last=False)
        self.states[report.renderer] = state  # most recent last
        state.add(report, now_ns, jitter_ms)
        return state

    def __iter__(self) -> Iterator[RendererState]:
        return iter(self.states.values())
