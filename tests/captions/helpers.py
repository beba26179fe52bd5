"""Shared pieces of the caption tests: a settable house clock and an app around the service."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from sfu_sidecar.app import Components, build_app
from sfu_sidecar.captions.service import CaptionService
from sfu_sidecar.config import Settings
from sfu_sidecar.metrics import Metrics

T0 = 1_790_000_000 * 10**9  # a house time in 2026
TOKEN = "s3cret"


class Clock:
    """House time the test moves by hand (the service takes ``now_ns`` as a seam)."""

    def __init__(self, t: int = T0) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += round(seconds * 1e9)


@dataclass
class Env:
    client: TestClient[Any, Any]
    service: CaptionService
    clock: Clock
    settings: Settings

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKEN}"}

    async def post(self, stream: str, doc: dict[str, Any], **kw: Any) -> Any:
        resp = await self.client.post(
            f"/api/streams/{stream}/captions", json=doc, headers=self.auth(), **kw
        )
        return resp


async def start_env(data_dir: Path, clock: Clock, **overrides: Any) -> Env:
    settings = Settings(**{"data_dir": data_dir, "publish_token": TOKEN, **overrides})
    metrics = Metrics()
    service = CaptionService(settings, metrics, clock)
    app = build_app(settings, Components(metrics, captions=service))
    client: TestClient[Any, Any] = TestClient(TestServer(app))
    await client.start_server()
    return Env(client, service, clock, settings)
