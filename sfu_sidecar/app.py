"""The application, assembled in one place from :class:`Settings`."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

from sfu_sidecar import __version__, listeners, logs
from sfu_sidecar.captions import routes as caption_routes
from sfu_sidecar.captions.service import CaptionService
from sfu_sidecar.clock import routes as clock_routes
from sfu_sidecar.clock.service import ClockService
from sfu_sidecar.config import Settings
from sfu_sidecar.cors import CorsPolicy
from sfu_sidecar.exceptions import NotFound
from sfu_sidecar.httpapi import (
    METRICS_KEY,
    cors_middleware,
    edge_middleware,
    forwarded_middleware,
    install_cors,
    json_ok,
)
from sfu_sidecar.lifecycle import Component, stop_on_signals
from sfu_sidecar.limits import is_loopback
from sfu_sidecar.listeners import install_hsts
from sfu_sidecar.metrics import Metrics
from sfu_sidecar.probe import routes as probe_routes
from sfu_sidecar.probe.service import ProbeService
from sfu_sidecar.relay import routes as relay_routes
from sfu_sidecar.relay.service import RelayService
from sfu_sidecar.segments import routes as segment_routes
from sfu_sidecar.segments.service import SegmentService
from sfu_sidecar.speech import routes as speech_routes
from sfu_sidecar.speech.service import SpeechService
from sfu_sidecar.syncchannel import routes as sync_routes
from sfu_sidecar.syncchannel.service import SyncService
from sfu_sidecar.webfiles import WEB_DIR

log = logs.get("app")

SHUTDOWN_BUDGET_S = 5.0


@dataclass(frozen=True)
class Components:
    """What the application is made of, by name, and the one metrics registry they share.

    A field left ``None`` is a component this application runs without (tests and single-
    purpose servers assemble only what they need). ``extra`` components, for embedders and
    tests, start after the named ones and register their own routes on the built app.
    """

    metrics: Metrics
    clock: ClockService | None = None
    captions: CaptionService | None = None
    relay: RelayService | None = None
    sync: SyncService | None = None
    probe: ProbeService | None = None
    segments: SegmentService | None = None
    speech: SpeechService | None = None
    extra: tuple[Component, ...] = ()

    def in_start_order(self) -> list[Component]:
        """Named components first, in dependency order, then the extra ones."""
        named: list[Component | None] = [
            self.clock, self.captions, self.relay, self.sync, self.speech, self.probe,
            self.segments,
        ]
        return [c for c in named if c is not None] + list(self.extra)

    def now_ns(self) -> Callable[[], int]:
        """The house-time reader: the clock component's, or the host clock without one."""
        return self.clock.now_ns if self.clock is not None else time.time_ns


@dataclass
class Services:
    """What routes see of the application, through ``app[SERVICES_KEY]``."""

    settings: Settings
    components: Components
    started_monotonic: float

    @property
    def metrics(self) -> Metrics:
        return self.components.metrics

    def uptime_s(self) -> float:
        return time.monotonic() - self.started_monotonic


SERVICES_KEY = web.AppKey("services", Services)


def house_clock(app: web.Application) -> Callable[[], int]:
    """The application's house-time reader (the clock component's, or the host clock)."""
    return app[SERVICES_KEY].components.now_ns()


def build_components(settings: Settings, metrics: Metrics) -> Components:
    """Every component of the full service, wired to the ones it depends on."""
    clock = ClockService(settings, metrics)
    now_ns = clock.now_ns  # house time: every timestamp stored or sent comes from here
    captions = CaptionService(settings, metrics, now_ns)
    relay = RelayService(settings, metrics, now_ns=now_ns, media_clock=clock.sdp_attributes)
    sync = SyncService(relay, metrics, now_ns=now_ns, captions=captions)
    # After sync: the relay calls observers in order, so the probe sees each packet's capture
    # time once sync has mapped it.
    # After sync too, as segments: speech reads each audio packet's capture time from it.
    speech = (SpeechService(settings, relay, sync, captions, now_ns=now_ns)
              if settings.speech_detect else None)
    probe = ProbeService(settings, relay, metrics, now_ns=now_ns, sync=sync, clock=clock,
                         speech=speech)
    # After sync too: segments read each packet's capture time from it.
    segments = SegmentService(settings, relay, sync, captions, now_ns=now_ns)
    return Components(metrics, clock=clock, captions=captions, relay=relay, sync=sync,
                      probe=probe, segments=segments, speech=speech)


def add_component_routes(app: web.Application, components: Components) -> None:
    """Each named component's HTTP routes, in start order (the first match wins). Every
    component's routes are in the ``routes`` module beside it, one ``add_routes(app, service)``
    each; no component registers its own."""
    if components.clock is not None:
        clock_routes.add_routes(app, components.clock)
    if components.captions is not None:
        caption_routes.add_routes(app, components.captions)
    if components.relay is not None:
        relay_routes.add_routes(app, components.relay)
    if components.sync is not None:
        sync_routes.add_routes(app, components.sync)
    if components.probe is not None:
        probe_routes.add_routes(app, components.probe)
    if components.segments is not None:
        segment_routes.add_routes(app, components.segments)
    if components.speech is not None:
        speech_routes.add_routes(app, components.speech)


async def _healthz(request: web.Request) -> web.Response:
    services = request.app[SERVICES_KEY]
    return json_ok(
        {"status": "ok", "version": __version__, "uptime_s": round(services.uptime_s(), 3)}
    )


async def _metrics(request: web.Request) -> web.Response:
    services = request.app[SERVICES_KEY]
    services.metrics.uptime.set(services.uptime_s())
    services.metrics.asyncio_tasks.set(len(asyncio.all_tasks()))
    body = services.metrics.render()
    return web.Response(body=body, headers={"Content-Type": services.metrics.content_type})


async def _index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(WEB_DIR / "index.html")


async def _publish(request: web.Request) -> web.FileResponse:
    return web.FileResponse(WEB_DIR / "publish.html")


# Names the web folder serves: short, plain, no dot segments. Anything else is a JSON 404
# before the file system is asked (a name past 255 bytes would make it raise).
_SEGMENT = r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}"
_WEB_NAME = re.compile(rf"{_SEGMENT}(/{_SEGMENT}){{0,3}}")


def _web_file(relative: str) -> Path:
    if not _WEB_NAME.fullmatch(relative) or ".." in relative:
        raise NotFound(f"no file {relative[:100]!r}")
    path = WEB_DIR / relative
    if not path.is_file():
        raise NotFound(f"no file {relative[:100]!r}")
    return path


async def _page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(_web_file(request.match_info["page"] + ".html"))


def _static(folder: str) -> Callable[[web.Request], Awaitable[web.FileResponse]]:
    async def serve(request: web.Request) -> web.FileResponse:
        return web.FileResponse(_web_file(f"{folder}/{request.match_info['name']}"))

    return serve


def build_app(settings: Settings, components: Components | None = None) -> web.Application:
    """Assemble routes, middleware and component lifetimes. Nothing starts until the app runs.

    Without ``components``, the full service with a new metrics registry.
    """
    if components is None:
        components = build_components(settings, Metrics())
    metrics = components.metrics
    middlewares: list[Middleware] = [edge_middleware, cors_middleware]
    if settings.proxy_key is not None:  # a worker of serve --workers: the supervisor's client
        middlewares.insert(0, forwarded_middleware(settings.proxy_key))
    app = web.Application(
        middlewares=middlewares, client_max_size=settings.max_body_bytes,
        # Bodies are read as sent: no client of this API compresses SDP or cues, and aiohttp's
        # own decompression answers a bad stream with errors no route can turn into a 4xx.
        handler_args={"auto_decompress": False},
    )
    install_cors(app, CorsPolicy(settings.cors_origins))
    install_hsts(app, settings.hsts_max_age_s)
    services = Services(settings, components, time.monotonic())
    app[SERVICES_KEY] = services
    app[METRICS_KEY] = metrics
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/", _index)
    app.router.add_get("/publish", _publish)
    app.router.add_get(r"/{page:[a-z_-]+}.html", _page)
    for folder in ("js", "vendor"):
        if (WEB_DIR / folder).is_dir():
            app.router.add_get(f"/{folder}/{{name:.+}}", _static(folder))
    add_component_routes(app, components)
    in_order = components.in_start_order()

    async def start_components(app: web.Application) -> None:
        for component in in_order:
            log.debug("starting %s", component.name)
            await component.start()

    async def stop_components(app: web.Application) -> None:
        for component in reversed(in_order):
            try:
                await asyncio.wait_for(component.stop(), timeout=SHUTDOWN_BUDGET_S / 2)
            except Exception:
                log.exception("stopping %s failed", component.name)

    app.on_startup.append(start_components)
    app.on_shutdown.append(stop_components)
    return app


def warn_about_open_doors(settings: Settings) -> None:
    """One warning at start-up for a service reachable from a network without publish_token.

    Refusing to start would be wrong (tokens may come with the next deploy, and viewing needs
    none); the requests are refused instead, and the warning says why they will be.
    """
    if settings.publish_token is not None or is_loopback(settings.host):
        return
    if settings.open_ingest:
        log.warning(
            "open_ingest is set and publish_token is not: anyone who reaches port %d may "
            "publish, ingest captions and post GPU reports", settings.port,
        )
    else:
        log.warning(
            "publish_token is not set: publishing, caption ingest and GPU reports are accepted "
            "only from this host (set publish_token, or open_ingest to accept them from anyone)"
        )


def install_event_loop_policy() -> str:
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


async def serve(
    settings: Settings,
    *,
    ready: asyncio.Event | None = None,
    app: web.Application | None = None,
) -> None:
    """Run until SIGINT/SIGTERM, then stop accepting, stop components, and return."""
    if app is None:
        app = build_app(settings)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    stop = stop_on_signals()
    listening = None
    try:
        listening = await listeners.start(
            runner, settings, shutdown_timeout=SHUTDOWN_BUDGET_S / 2,
            registry=app[SERVICES_KEY].components.metrics.registry)
        log.info(
            "listening on %s", ", ".join(listening.urls), extra={"version": __version__},
        )
        if listening.reloader is not None:
            log.info("serving the certificate %s", listening.reloader.certificate.describe())
        warn_about_open_doors(settings)
        if ready is not None:
            ready.set()
        await stop.wait()
        log.info("shutting down")
    finally:
        if listening is not None:
            await listening.close()
        await runner.cleanup()
        log.info("stopped")


def run(settings: Settings) -> int:
    loop_kind = install_event_loop_policy()
    logs.get("app").debug("event loop: %s", loop_kind)
    asyncio.run(serve(settings))
    return 0
