"""An in-process relay on a loopback port, built by the app factory with only the relay in it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from sfu_sidecar.app import Components, build_app
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
