"""GPU telemetry: NVML missing, NVML without a driver (the real error), a fake NVML for values,
and renderer allocator reports."""

from __future__ import annotations

import ctypes
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from sfu_sidecar.exceptions import BadInput
from sfu_sidecar.probe import gpu
from sfu_sidecar.probe.gpu import (
    NVML_RETRY_NS,
    AllocatorReport,
    NvmlSampler,
    Renderers,
    pearson,
)

GIB = 1 << 30


def test_without_pynvml_the_sample_says_why() -> None:
    real = sys.modules.get("pynvml")
    sys.modules["pynvml"] = None  # type: ignore[assignment]  # makes `import pynvml` fail
    try:
        sample = NvmlSampler().sample(0)
    finally:
        if real is None:
            del sys.modules["pynvml"]
        else:
            sys.modules["pynvml"] = real
    assert sample.available is False
    assert sample.reason == "pynvml is not installed (pip install 'sfu-sidecar[gpu]')"
    assert sample.as_dict() == {"t_ns": 0, "available": False, "reason": sample.reason,
                                "devices": []}


def _driver_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_pynvml_without_a_driver_reports_nvmls_own_error() -> None:
    import pynvml

    sample = NvmlSampler().sample(0)
    if _driver_present():
        # A machine with the NVIDIA driver: NVML answers or says why it cannot.
        assert sample.available or (sample.reason or "").startswith("NVML")
        return
    # What nvidia-ml-py raises when the driver's library is absent.
    with pytest.raises(pynvml.NVMLError_LibraryNotFound) as err:
        pynvml.nvmlInit()
    assert err.value.value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    assert sample.available is False
    assert sample.reason == f"NVML: {err.value}"
    assert sample.reason == "NVML: NVML Shared Library Not Found"


class FakeNvmlError(Exception):
    pass


class FakeNvml:
    """The slice of pynvml the sampler calls, with made-up devices."""

    NVMLError = FakeNvmlError

    def __init__(self, devices: list[dict[str, Any]], init_error: str | None = None) -> None:
        self.devices = devices
        self.init_error = init_error
        self.inits = 0
        self.shutdowns = 0
        self.count_error: str | None = None

    def nvmlInit(self) -> None:
        self.inits += 1
        if self.init_error:
            raise FakeNvmlError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        if self.count_error:
            raise FakeNvmlError(self.count_error)
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> dict[str, Any]:
        return self.devices[i]

    def nvmlDeviceGetName(self, h: dict[str, Any]) -> bytes:
        return bytes(h["name"], "ascii")  # older bindings return bytes

    def nvmlDeviceGetMemoryInfo(self, h: dict[str, Any]) -> SimpleNamespace:
        return SimpleNamespace(total=h["total"], used=h["used"], free=h["total"] - h["used"])

    def nvmlDeviceGetUtilizationRates(self, h: dict[str, Any]) -> SimpleNamespace:
        if h.get("util") is None:
            raise FakeNvmlError("Not Supported")
        return SimpleNamespace(gpu=h["util"][0], memory=h["util"][1])

    def nvmlDeviceGetComputeRunningProcesses(self, h: dict[str, Any]) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in h["procs"]]


def two_devices() -> list[dict[str, Any]]:
    return [
        {"name": "NVIDIA H200", "total": 141 * GIB, "used": 134 * GIB, "util": (87, 40),
         "procs": [(4242, 120 * GIB), (4343, None)]},
        {"name": "NVIDIA H200", "total": 141 * GIB, "used": 2 * GIB, "util": None, "procs": []},
    ]


def test_fake_nvml_values_come_through_the_seam() -> None:
    fake = FakeNvml(two_devices())
    sample = NvmlSampler(loader=lambda: fake).sample(5)
    assert sample.available and sample.reason is None
    d0, d1 = sample.devices
    assert d0.name == "NVIDIA H200"
    assert (d0.total_bytes, d0.used_bytes, d0.free_bytes) == (141 * GIB, 134 * GIB, 7 * GIB)
    assert d0.used_pct == pytest.approx(100 * 134 / 141)
    assert (d0.utilization_pct, d0.memory_utilization_pct) == (87.0, 40.0)
    assert [(p.pid, p.used_bytes) for p in d0.processes] == [(4242, 120 * GIB), (4343, None)]
    assert d1.utilization_pct is None  # not supported on that board: the rest still reads
    assert sample.as_dict()["devices"][0]["processes"][1] == {  # type: ignore[index]
        "pid": 4343, "used_bytes": None}
    assert fake.inits == 1


def test_nvml_init_failure_is_retried_later_and_a_lost_driver_is_reported() -> None:
    fake = FakeNvml(two_devices(), init_error="Driver Not Loaded")
    sampler = NvmlSampler(loader=lambda: fake)
    assert sampler.sample(0).reason == "NVML: Driver Not Loaded"
    fake.init_error = None
    assert sampler.sample(NVML_RETRY_NS - 1).available is False  # not retried yet
    assert fake.inits == 1
    assert sampler.sample(NVML_RETRY_NS).available is True
    fake.count_error = "GPU is lost"
    lost = sampler.sample(NVML_RETRY_NS + 1)
    assert (lost.available, lost.reason) == (False, "NVML: GPU is lost")
    assert fake.shutdowns == 1
    fake.devices = []
    fake.count_error = None
    assert sampler.sample(3 * NVML_RETRY_NS).reason == "NVML sees no GPU"


def report(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "renderer": "avatar-1", "stream": "live", "device": 0,
        "reserved_bytes": 10 * GIB, "allocated_bytes": 6 * GIB,
        "largest_free_block_bytes": 1 * GIB, "inactive_split_bytes": 3 * GIB,
        "alloc_retries": 2, "ooms": 0,
    }
    body.update(overrides)
    return body


def test_fragmentation_index_and_reserved_ratio() -> None:
    rep = AllocatorReport.parse(report())
    # 4 GiB free in the reserve, the largest piece 1 GiB: 1 - 1/4.
    assert rep.free_reserved_bytes == 4 * GIB
    assert rep.fragmentation == pytest.approx(0.75)
    assert rep.reserved_ratio == pytest.approx(10 / 6)
    whole = AllocatorReport.parse(report(largest_free_block_bytes=4 * GIB))
    assert whole.fragmentation == 0.0
    full = AllocatorReport.parse(report(allocated_bytes=10 * GIB, largest_free_block_bytes=0))
    assert full.fragmentation == 0.0
    empty = AllocatorReport.parse(report(reserved_bytes=0, allocated_bytes=0,
                                         largest_free_block_bytes=0, stream=None))
    assert empty.reserved_ratio is None and empty.stream is None


@pytest.mark.parametrize(("body", "reason"), [
    ([], "report must be a JSON object"),
    (report(renderer=""), "renderer must be"),
    (report(renderer="a b"), "renderer must be"),
    (report(stream="no/slash"), "stream must be"),
    (report(reserved_bytes=None), "report without reserved_bytes"),
    (report(ooms=True), "ooms must be an integer"),
    (report(ooms=1.5), "ooms must be an integer"),
    (report(alloc_retries=-1), "alloc_retries must be between 0"),
    (report(reserved_bytes=1 << 70), "reserved_bytes must be between 0"),
    (report(allocated_bytes=11 * GIB), "allocated_bytes exceeds reserved_bytes"),
    (report(largest_free_block_bytes=5 * GIB), "largest_free_block_bytes exceeds"),
    (report(device="0"), "device must be an integer"),
])
def test_bad_reports_are_refused_with_the_reason(body: Any, reason: str) -> None:
    with pytest.raises(BadInput) as err:
        AllocatorReport.parse(body)
    assert reason in err.value.reason


def test_renderer_history_spikes_and_correlation_with_jitter() -> None:
    renderers = Renderers()
    # Fragmentation 0.41, 0.45, ... 0.77 and the stream's frame jitter 5, 8, ... 32 ms with
    # it: r = 1. Spikes: 0.69, 0.73, 0.77 (at or above 0.68; no step rises 0.2 above the
    # median before them), with jitter 26, 29, 32; the rest had 5..23 (median 14).
    for i in range(10):
        largest = round(4 * GIB * (1 - (0.41 + 0.04 * i)))
        renderers.add(AllocatorReport.parse(report(largest_free_block_bytes=largest)),
                      i * 10**9, 5.0 + 3.0 * i)
    state = renderers.states["avatar-1"]
    info = state.as_dict()
    assert info["reports"] == 10
    assert [round(f, 3) for _, f in info["history"]] == [  # type: ignore[attr-defined]
        round(0.41 + 0.04 * i, 3) for i in range(10)]
    corr = info["correlation"]
    assert corr["pearson_r"] == pytest.approx(1.0)  # type: ignore[index]
    assert corr["spikes"] == 3  # type: ignore[index]
    assert corr["jitter_ms_at_spikes"] == pytest.approx(29.0)  # type: ignore[index]
    assert corr["jitter_ms_otherwise"] == pytest.approx(14.0)  # type: ignore[index]


def test_a_sudden_rise_is_a_spike_below_the_alert_line() -> None:
    renderers = Renderers()
    for _ in range(5):
        renderers.add(AllocatorReport.parse(report(largest_free_block_bytes=4 * GIB)), 0, None)
    state = renderers.add(AllocatorReport.parse(report(largest_free_block_bytes=3 * GIB)), 1,
                          None)
    assert state.history[-1].fragmentation == pytest.approx(0.25)
    assert state.history[-1].spike  # 0.25 above a median of 0
    assert state.correlation()["pearson_r"] is None  # no jitter known


def test_renderers_are_bounded_and_the_longest_silent_goes() -> None:
    renderers = Renderers(limit=3)
    for name in ("a", "b", "c"):
        renderers.add(AllocatorReport.parse(report(renderer=name)), 0, None)
    renderers.add(AllocatorReport.parse(report(renderer="a")), 1, None)  # a reports again
    renderers.add(AllocatorReport.parse(report(renderer="d")), 2, None)
    assert [s.report.renderer for s in renderers] == ["c", "a", "d"]


def test_pearson_reference_values() -> None:
    xs = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert pearson(xs, [2 * x for x in xs]) == pytest.approx(1.0)
    assert pearson(xs, [-x for x in xs]) == pytest.approx(-1.0)
    assert pearson(xs, [1.0] * 8) is None
    assert pearson(xs[:7], xs[:7]) is None
    # x = 1..8 against 1, 0, 1, 0...: sxy = -2, sxx = 42, syy = 2.
    assert pearson(xs, [1.0, 0.0] * 4) == pytest.approx(-2 / (42 * 2) ** 0.5)


def test_import_seam_is_the_real_module_by_default() -> None:
    import pynvml

    assert gpu.import_nvml() is pynvml
