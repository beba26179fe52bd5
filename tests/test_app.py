from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from importlib.metadata import version

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from sfu_sidecar import __version__
from sfu_sidecar.app import Components, build_app
from sfu_sidecar.config import load_settings
from sfu_sidecar.exceptions import Conflict
from sfu_sidecar.metrics import Metrics


class Recorder:
    """A component that records its lifecycle and raises typed errors from a route."""

    def __init__(self, name: str, journal: list[str]) -> None:
        self.name = name
        self.journal = journal

    def add_routes(self, app: web.Application) -> None:
        async def taken(request: web.Request) -> web.Response:
            raise Conflict("stream live is already published")

        async def boom(request: web.Request) -> web.Response:
            raise RuntimeError("secret internal detail")

        app.router.add_get(f"/test/{self.name}/taken", taken)
        app.router.add_get(f"/test/{self.name}/boom", boom)

    async def start(self) -> None:
        self.journal.append(f"start {self.name}")

    async def stop(self) -> None:
        self.journal.append(f"stop {self.name}")


Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def client_and_journal() -> AsyncIterator[tuple[Client, list[str]]]:
    journal: list[str] = []
    recorders = (Recorder("a", journal), Recorder("b", journal))
    app = build_app(load_settings(), Components(Metrics(), extra=recorders))
    for recorder in recorders:
        recorder.add_routes(app)
    async with TestClient(TestServer(app)) as client:
        yield client, journal
    assert journal == ["start a", "start b", "stop b", "stop a"]


async def test_healthz(client_and_journal) -> None:  # type: ignore[no-untyped-def]
    client, _ = client_and_journal
    resp = await client.get("/healthz")
    assert resp.status == 200
    body = await resp.json()
    assert body["status"] == "ok"
    # The installed distribution's version (pyproject.toml's, read back through its metadata).
    assert body["version"] == __version__ == version("sfu-sidecar")
    assert body["uptime_s"] >= 0


async def test_metrics_exposes_process_and_request_metrics(client_and_journal) -> None:  # type: ignore[no-untyped-def]
    client, _ = client_and_journal
    await client.get("/healthz")
    resp = await client.get("/metrics")
    assert resp.status == 200
    assert resp.content_type == "text/plain"
    text = await resp.text()
    assert "process_cpu_seconds_total" in text
    assert 'sfu_sidecar_http_requests_total{route="/healthz",status="200"} 1.0' in text


async def test_unknown_path_is_json_404(client_and_journal) -> None:  # type: ignore[no-untyped-def]
    client, _ = client_and_journal
    resp = await client.get("/no/such/thing")
    assert resp.status == 404
    assert (await resp.json()) == {"error": "no route for GET /no/such/thing"}


async def test_wrong_method_is_json_405(client_and_journal) -> None:  # type: ignore[no-untyped-def]
    client, _ = client_and_journal
    resp = await client.post("/healthz")
    assert resp.status == 405
    assert "error" in await resp.json()
    assert "GET" in resp.headers["Allow"]


async def test_sidecar_errors_map_to_status_and_reason(client_and_journal) -> None:  # type: ignore[no-untyped-def]
    client, _ = client_and_journal
    resp = await client.get("/test/a/taken")
    assert resp.status == 409
    assert (await resp.json()) == {"error": "stream live is already published"}


async def test_unexpected_errors_never_leak_details(client_and_journal) -> None:  # type: ignore[no-untyped-def]
    client, _ = client_and_journal
    resp = await client.get("/test/b/boom")
    assert resp.status == 500
    text = await resp.text()
    assert "secret" not in text and "Traceback" not in text
    assert (await resp.json()) == {"error": "internal error"}


async def test_index_serves_the_web_client(client_and_journal) -> None:  # type: ignore[no-untyped-def]
    client, _ = client_and_journal
    resp = await client.get("/")
    assert resp.status == 200
    assert "<html" in (await resp.text()).lower()


async def test_publish_serves_the_publisher_page_and_its_modules(client_and_journal) -> None:  # type: ignore[no-untyped-def]
    client, _ = client_and_journal
    resp = await client.get("/publish")
    assert resp.status == 200
    page = await resp.text()
    assert '<script type="module" src="/js/publish.js">' in page
    # Every module the page imports, directly or not, is served.
    for module in ("publish.js", "whip.js", "ingest.js", "publishcore.js", "whep.js",
                   "clocksync.js", "msgpack.js"):
        js = await client.get(f"/js/{module}")
        assert js.status == 200, module
    assert (await client.get("/publish/x")).status == 404


@pytest.mark.parametrize(("flags", "expected"), [
    ({}, "accepted only from this host"),
    ({"open_ingest": "true"}, "anyone who reaches port 8080 may publish"),
    ({"publish_token": "tok"}, None),
    ({"host": "127.0.0.1"}, None),
    ({"host": "::1", "open_ingest": "true"}, None),
])
def test_start_up_warns_once_when_publishing_is_closed_or_wide_open(
    flags: dict[str, str], expected: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    from sfu_sidecar import logs
    from sfu_sidecar.app import warn_about_open_doors

    logger = logs.get("app")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)  # whether or not the sfu_sidecar tree propagates to the root
    try:
        with caplog.at_level("WARNING", logger=logger.name):
            warn_about_open_doors(load_settings(flags))
    finally:
        logger.removeHandler(handler)
    lines = [r.getMessage() for r in records]
    if expected is None:
        assert lines == []
    else:
        assert len(lines) == 1 and expected in lines[0]
