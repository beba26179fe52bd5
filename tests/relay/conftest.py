"""An in-process relay on a loopback port, built by the app factory with only the relay in it;
and the whole application on one (``app_base``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from sfu_sidecar.app import SERVICES_KEY, Components, build_app
from sfu_sidecar.config import load_settings
from sfu_sidecar.metrics import Metrics
from sfu_sidecar.relay import RelayService
from tests.conftest import IN_PROCESS


@dataclass
class Relay:
    base: str
    service: RelayService
    http: aiohttp.ClientSession


@pytest.fixture
async def relay_factory() -> AsyncIterator[Callable[..., object]]:
    servers: list[TestServer] = []
    sessions: list[aiohttp.ClientSession] = []

    async def start(**flags: str) -> Relay:
        settings = load_settings({"ice_addresses": "127.0.0.1", **IN_PROCESS, **flags})
        metrics = Metrics()
        service = RelayService(settings, metrics)
        app = build_app(settings, Components(metrics, relay=service))
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        http = aiohttp.ClientSession()
        sessions.append(http)
        return Relay(str(server.make_url("")).rstrip("/"), service, http)

    yield start
    for http in sessions:
        await http.close()
    for server in servers:
        await server.close()


@pytest.fixture
async def relay(relay_factory: Callable[..., object]) -> Relay:
    made = await relay_factory()  # type: ignore[operator]
    assert isinstance(made, Relay)
    return made


@pytest.fixture
async def app_base(tmp_path: Path) -> AsyncIterator[tuple[str, RelayService]]:
    """The whole application (relay, sync, captions, probe) on a loopback port."""
    settings = load_settings({"ice_addresses": "127.0.0.1", "host": "127.0.0.1",
                              "data_dir": str(tmp_path), **IN_PROCESS})
    app = build_app(settings)
    relay = app[SERVICES_KEY].components.relay
    assert relay is not None
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}", relay
    finally:
        await server.close()
