"""The PyTorch renderer helper, with a stand-in for ``torch`` at its seam, against the service."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.error
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from sfu_sidecar.app import build_app
from sfu_sidecar.client.gpu_report import allocator_report, post_report
from sfu_sidecar.config import load_settings

MIB = 1 << 20


class FakeCuda:
    """``torch.cuda``'s memory_stats / memory_snapshot as a renderer on device 1 would see."""

    def __init__(self) -> None:
        self.devices_asked: list[int] = []

    def current_device(self) -> int:
        return 1

    def memory_stats(self, device: int) -> dict[str, int]:
        self.devices_asked.append(device)
        return {
            "reserved_bytes.all.current": 800 * MIB,
            "allocated_bytes.all.current": 500 * MIB,
            "inactive_split_bytes.all.current": 120 * MIB,
            "num_alloc_retries": 3,
            "num_ooms": 1,
        }

    def memory_snapshot(self) -> list[dict[str, Any]]:
        return [
            {"device": 1, "blocks": [
                {"size": 500 * MIB, "state": "active_allocated"},
                {"size": 100 * MIB, "state": "inactive"},
                {"size": 60 * MIB, "state": "inactive"},
            ]},
            {"device": 1, "blocks": [{"size": 140 * MIB, "state": "inactive"}]},
            # Another device's free block must not count.
            {"device": 0, "blocks": [{"size": 900 * MIB, "state": "inactive"}]},
        ]


def fake_torch() -> SimpleNamespace:
    return SimpleNamespace(cuda=FakeCuda())


def test_report_reads_the_caching_allocator() -> None:
    torch = fake_torch()
    report = allocator_report("avatar", stream="live", torch=torch)
    assert torch.cuda.devices_asked == [1]
    assert report == {
        "renderer": "avatar", "stream": "live", "device": 1,
        "reserved_bytes": 800 * MIB, "allocated_bytes": 500 * MIB,
        "largest_free_block_bytes": 140 * MIB, "inactive_split_bytes": 120 * MIB,
        "alloc_retries": 3, "ooms": 1,
    }


@pytest.mark.system
def test_torch_is_imported_only_when_asked() -> None:
    probe = ("import sys, sfu_sidecar.client.gpu_report; "
             "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == "False"
    real = sys.modules.get("torch")
    sys.modules["torch"] = None  # type: ignore[assignment]  # makes importing torch fail
    try:
        with pytest.raises(ImportError):
            allocator_report("avatar")
    finally:
        if real is None:
            del sys.modules["torch"]
        else:
            sys.modules["torch"] = real


@pytest.fixture
async def base(tmp_path: Path) -> AsyncIterator[str]:
    settings = load_settings({"data_dir": str(tmp_path), "publish_token": "t0k"})
    server = TestServer(build_app(settings), host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


async def test_posted_report_comes_back_with_its_fragmentation(base: str) -> None:
    report = allocator_report("avatar", stream="live", torch=fake_torch())
    answer = await asyncio.to_thread(post_report, base, report, "t0k")
    # 300 MiB free in the reserve, the largest piece 140 MiB.
    assert answer["fragmentation"] == round(1 - 140 / 300, 4)
    assert answer["reserved_ratio"] == round(800 / 500, 4)
    assert answer["ooms"] == 1 and answer["stream"] == "live"
    with pytest.raises(urllib.error.HTTPError) as err:
        await asyncio.to_thread(post_report, base, report, "wrong")
    assert err.value.code == 401
