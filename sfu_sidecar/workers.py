"""``serve --workers N``: N relay processes behind one supervisor and one HTTP port.

One relay process is one core (the GIL). The supervisor binds the public address and starts N
ordinary ``serve`` processes on loopback ports of their own (each with its own ``data_dir``
under ``worker-<i>``), and forwards every request to one of them:

- A stream's **home** worker is fixed by its name (a hash over the workers): its WHIP
  publisher, RTP tap, captions, segments and status go there, so everything about one stream
  meets in one process.
- **Viewers** (``POST /whep/...``) are spread round robin over the live workers. A worker asked
  for a stream whose home is another pulls it from there over loopback, as an edge pulls from
  its origin (``relay/pull.py``): capture times, epoch and captions carry over exactly. The
  workers find a stream's home through the supervisor's directory endpoint (setting
  ``directory_url``, on a loopback port of its own). With ``origin_url`` set (the machine is an
  edge), the home worker pulls the stream from there, and its siblings from it.
- A session's later requests (trickle ``PATCH``, ``DELETE``) and a tap's, feed's or push's go
  to the worker that made it (learned from the ``Location`` of its ``201``).
- ``/healthz`` answers for the whole (``503`` while a worker is down), ``/api/workers`` lists
  the workers, ``/api/streams`` merges theirs, ``/metrics`` is every worker's labelled
  ``worker`` with the supervisor's own (``workermetrics.py``), and ``/workers/<i>/<path>``
  reaches worker i directly (its ``/api/sync``). Everything else goes to worker 0.

A worker that exits is started again on the same port (backoff 0.5 s doubling to 5 s). Its
viewers lose their sessions and reconnect like after any server restart; what it published
must be published again. Requests carry the client's address to the worker in a header only the
supervisor can set (a random key per start, setting ``proxy_key``), so per-client limits and
the this-host-only publishing rule see the real client, not the supervisor.

With ``redis_url`` and ``advertise_url`` the machine is one node of a deployment: each worker
lists the streams published on it in the Redis stream directory under the machine's
``advertise_url``, and a stream's home worker that has no publisher finds the machine that has
one there (its siblings still pull from it). Worker node ids are ``<node_id>-worker-<i>``,
unique across machines.

Not here: PTP (each worker would run its own slave on the same ports, so ``ptp_interface`` is
refused with ``--workers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from sfu_sidecar import listeners, logs
from sfu_sidecar.app import install_event_loop_policy
from sfu_sidecar.config import Settings
from sfu_sidecar.exceptions import ConfigError
from sfu_sidecar.httpapi import CLIENT_HEADER, PROXY_KEY_HEADER
from sfu_sidecar.lifecycle import stop_on_signals
from sfu_sidecar.listeners import install_hsts
from sfu_sidecar.workermetrics import SupervisorMetrics, merge
from sfu_sidecar.workerproxy import (
    HOP_BY_HOP,
    free_port,
    json_answer,
    splice_websocket,
    stream_answer,
    stream_in_body,
)

log = logs.get("workers")

RESTART_FIRST_S = 0.5
RESTART_MAX_S = 5.0
READY_TIMEOUT_S = 30.0
# Resources created by POST whose later requests must reach the same worker.
OWNED = ("/whip/", "/whep/", "/api/taps/", "/api/feeds/", "/api/pushes/")


def home_index(stream: str, count: int) -> int:
    """The worker a stream's publisher, captions and segments belong to."""
    digest = hashlib.blake2b(stream.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


@dataclass
class Worker:
    index: int
    port: int
    data_dir: Path
    machine: str  # the node id of the whole (setting node_id, or one made per start)
    proc: asyncio.subprocess.Process | None = None
    restarts: int = 0
    alive: bool = False
    task: asyncio.Task[None] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def node_id(self) -> str:
        # Unique across machines: a pull's path (Sidecar-Via) and the Redis directory name
        # workers of several machines, and "worker-0" of two would look like one node.
        return f"{self.machine}-worker-{self.index}"


@dataclass
class Supervisor:
    settings: Settings
    count: int
    argv: Sequence[str]  # the serve command line, without --workers
    key: str = field(default_factory=lambda: secrets.token_hex(16))
    workers: list[Worker] = field(default_factory=list)
    owners: dict[str, int] = field(default_factory=dict)  # resource path -> worker index
    directory_port: int = 0
    # Room for "-worker-<i>" within the 64 characters a node id may have.
    machine: str = ""
    _next_viewer: int = 0
    metrics: SupervisorMetrics | None = None
    _http: aiohttp.ClientSession | None = None
    _stopping: bool = False
    # Handlers relaying a streamed answer (a live caption push lasts while its client listens):
    # ended at shutdown, which would otherwise wait for them before stopping the workers.
    _streaming: set[asyncio.Task[Any]] = field(default_factory=set)

    async def end_streams(self, _app: web.Application | None = None) -> None:
        for task in list(self._streaming):
            task.cancel()

    # --- processes --------------------------------------------------------------------------

    def _command(self, worker: Worker) -> list[str]:
        return [
            sys.executable, "-m", "sfu_sidecar", "serve", *self.argv,
            "--host", "127.0.0.1", "--port", str(worker.port),
            "--data-dir", str(worker.data_dir), "--node-id", worker.node_id,
            "--directory-url", f"http://127.0.0.1:{self.directory_port}",
            # Other machines reach this one's streams through the supervisor's port: with
            # redis_url, each worker lists the streams published on it under that address
            # (unset, nothing is listed); siblings find each other through the supervisor.
            "--advertise-url", self.settings.advertise_url or "",
            # The supervisor alone speaks HTTPS; its workers are reached over loopback.
            "--tls-cert", "", "--tls-key", "", "--https-port", "", "--hsts-max-age-s", "0",
        ]

    async def _spawn(self, worker: Worker) -> None:
        worker.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "SFU_SIDECAR_PROXY_KEY": self.key}
        worker.proc = await asyncio.create_subprocess_exec(*self._command(worker), env=env)
        await self._wait_ready(worker)

    async def _wait_ready(self, worker: Worker) -> None:
        assert self._http is not None and worker.proc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READY_TIMEOUT_S
        while loop.time() < deadline and worker.proc.returncode is None:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with self._http.get(f"{worker.base}/healthz",
                                          timeout=aiohttp.ClientTimeout(total=1)) as resp:
                    if resp.status == 200:
                        worker.alive = True
                        log.info("worker %d ready on port %d (pid %d)", worker.index,
                                 worker.port, worker.proc.pid)
                        return
            await asyncio.sleep(0.1)
        raise ConfigError(f"worker {worker.index} did not start (exit code "
                          f"{worker.proc.returncode}); see its log lines above")

    async def _watch(self, worker: Worker) -> None:
        delay = RESTART_FIRST_S
        while not self._stopping:
            assert worker.proc is not None
            code = await worker.proc.wait()
            worker.alive = False
            if self._stopping:
                return
            for path in [p for p, i in self.owners.items() if i == worker.index]:
                del self.owners[path]
            log.warning("worker %d exited with %s; starting it again in %.1f s", worker.index,
                        code, delay)
            await asyncio.sleep(delay)
            worker.restarts += 1
            try:
                await self._spawn(worker)
                delay = RESTART_FIRST_S
            except ConfigError as exc:
                log.error("%s", exc.reason)
                delay = min(delay * 2, RESTART_MAX_S)

    async def start(self) -> None:
        self.machine = (self.settings.node_id or uuid.uuid4().hex[:12])[:48]
        self._http = aiohttp.ClientSession(auto_decompress=False)
        self.workers = [
            Worker(i, free_port(), self.settings.data_dir / f"worker-{i}", self.machine)
            for i in range(self.count)
        ]
        await asyncio.gather(*(self._spawn(w) for w in self.workers))
        for worker in self.workers:
            worker.task = asyncio.create_task(self._watch(worker), name=f"worker-{worker.index}")

    async def stop(self) -> None:
        self._stopping = True
        for worker in self.workers:
            if worker.proc is not None and worker.proc.returncode is None:
                worker.proc.terminate()
        for worker in self.workers:
            if worker.proc is not None:
                try:
                    await asyncio.wait_for(worker.proc.wait(), 10)
                except TimeoutError:
                    worker.proc.kill()
            if worker.task is not None:
                worker.task.cancel()
        if self._http is not None:
            await self._http.close()

    # --- routing ----------------------------------------------------------------------------

    def _live(self) -> list[Worker]:
        return [w for w in self.workers if w.alive] or self.workers

    def home(self, stream: str) -> Worker:
        return self.workers[home_index(stream, len(self.workers))]

    def _viewer_worker(self) -> Worker:
        live = self._live()
        worker = live[self._next_viewer % len(live)]
        self._next_viewer += 1
        return worker

    def _owner(self, path: str) -> Worker | None:
        # /whip/<stream>/<session>, /api/taps/<id>: the Location a 201 gave.
        key = "/" + "/".join(path.strip("/").split("/")[:3])
        index = self.owners.get(key)
        return self.workers[index] if index is not None else None

    async def route(self, request: web.Request) -> Worker:
        path = request.path
        parts = path.strip("/").split("/")
        if path.startswith(OWNED) and len(parts) >= 3:
            owner = self._owner(path)
            if owner is None:
                raise web.HTTPNotFound(reason=f"no resource {request.method} {path}")
            return owner
        if parts[0] == "whep" and len(parts) == 2:
            # Only an offer makes a viewer: a browser's OPTIONS before it (ICE servers) must
            # not move the turn, or every browser viewer would land on the same worker.
            return self._viewer_worker() if request.method == "POST" else self.home(parts[1])
        if parts[0] in ("whip", "captions", "streams") and len(parts) >= 2:
            return self.home(parts[1])
        if parts[:2] == ["api", "streams"] and len(parts) >= 3:
            return self.home(parts[2])
        if parts[:2] in (["api", "taps"], ["api", "feeds"], ["api", "pushes"]) \
                and request.method == "POST":
            stream = await stream_in_body(request)
            return self.home(stream) if stream else self.workers[0]
        return self.workers[0]

    # --- proxy ------------------------------------------------------------------------------

    def _headers(self, request: web.Request) -> dict[str, str]:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        headers[PROXY_KEY_HEADER] = self.key
        headers[CLIENT_HEADER] = request.remote or ""
        return headers

    async def forward(self, request: web.Request, worker: Worker,
                      path: str | None = None) -> web.StreamResponse:
        assert self._http is not None
        target = f"{worker.base}{path if path is not None else request.rel_url}"
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await self._forward_websocket(request, worker, target)
        body = await request.read()
        try:
            async with self._http.request(
                request.method, target, headers=self._headers(request), data=body,
                allow_redirects=False,
                # No total: a response without a length (live captions, a segment being made)
                # lasts as long as it streams; a worker silent this long has failed.
                timeout=aiohttp.ClientTimeout(total=None, connect=10, sock_read=60),
            ) as resp:
                headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_BY_HOP}
                status = resp.status
                if resp.content_length is None and request.method != "HEAD" and status == 200:
                    task = asyncio.current_task()
                    assert task is not None
                    self._streaming.add(task)
                    try:
                        return await stream_answer(request, resp, headers)
                    finally:
                        self._streaming.discard(task)
                payload = await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return json_answer(503, f"worker {worker.index} did not answer "
                               f"({type(exc).__name__}); try again", {"Retry-After": "1"})
        if status == 201 and request.method == "POST" and "Location" in headers:
            self.owners[headers["Location"].split("?")[0]] = worker.index
        if (request.method == "DELETE" and status < 300) or status == 404:
            self.owners.pop("/" + "/".join(request.path.strip("/").split("/")[:3]), None)
        return web.Response(status=status, body=payload, headers=headers)

    async def _forward_websocket(self, request: web.Request, worker: Worker,
                                 target: str) -> web.StreamResponse:
        assert self._http is not None
        try:
            # The handshake is the proxy's own on each side: a client's Sec-WebSocket-* headers
            # passed on would have the worker agree to an extension (permessage-deflate) that
            # this end did not negotiate, and every compressed frame would then be refused.
            headers = {k: v for k, v in self._headers(request).items()
                       if not k.lower().startswith("sec-websocket-")}
            upstream = await self._http.ws_connect(
                target.replace("http://", "ws://", 1), headers=headers, max_msg_size=0,
            )
        except (aiohttp.ClientError, OSError) as exc:
            return json_answer(503, f"worker {worker.index} did not answer ({exc})",
                         {"Retry-After": "1"})
        return await splice_websocket(request, upstream)

    # --- the supervisor's own routes --------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._handle(request)
        except web.HTTPException as exc:  # aiohttp's own refusals, e.g. a body over the limit
            return json_answer(exc.status, exc.reason, {})
        except Exception:  # a fault of the supervisor itself: logged, answered, not a 500 page
            log.exception("supervisor failed on %s %s", request.method, request.path)
            return json_answer(502, "the supervisor could not forward this request", {})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        parts = request.path.strip("/").split("/")
        if request.path == "/healthz":
            down = [w.index for w in self.workers if not w.alive]
            if down:
                return json_answer(503, f"workers {down} are down; restarting",
                                   {"Retry-After": "1"})
            return json_answer(200, None, {}, {"status": "ok", "workers": len(self.workers)})
        if request.path == "/api/workers":
            return json_answer(200, None, {}, {"workers": await self._status()})
        if request.path == "/api/streams" and request.method == "GET":
            return await self._merged_streams()
        if request.path == "/metrics" and request.method == "GET":
            return await self._merged_metrics(request)
        if parts[0] == "workers" and len(parts) >= 2:
            try:
                worker = self.workers[int(parts[1])]
            except (ValueError, IndexError):
                return json_answer(404, f"no worker {parts[1][:20]!r}")
            rest = "/" + "/".join(parts[2:])
            query = f"?{request.query_string}" if request.query_string else ""
            return await self.forward(request, worker, rest + query)
        try:
            worker = await self.route(request)
        except web.HTTPNotFound as exc:
            return json_answer(404, exc.reason)
        return await self.forward(request, worker)

    async def _status(self) -> list[dict[str, Any]]:
        out = []
        for w in self.workers:
            viewers = None
            if w.alive:
                doc = await self._get_json(f"{w.base}/api/streams")
                if doc is not None:
                    viewers = sum(len(s.get("viewers") or []) for s in doc.get("streams", []))
            out.append({"index": w.index, "pid": w.proc.pid if w.proc else None,
                        "port": w.port, "alive": w.alive, "restarts": w.restarts,
                        "viewers": viewers})
        return out

    async def _get_json(self, url: str) -> Any:
        assert self._http is not None
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
            async with self._http.get(url, headers={PROXY_KEY_HEADER: self.key},
                                      timeout=aiohttp.ClientTimeout(total=2)) as resp:
                if resp.status == 200:
                    return await resp.json()
        return None

    async def _merged_streams(self) -> web.Response:
        streams = []
        for w in self.workers:
            doc = await self._get_json(f"{w.base}/api/streams") if w.alive else None
            for s in (doc or {}).get("streams", []):
                streams.append({**s, "worker": w.index})
        return json_answer(200, None, {}, {"streams": streams})

    async def _merged_metrics(self, request: web.Request) -> web.Response:
        assert self._http is not None
        if self.metrics is None:
            self.metrics = SupervisorMetrics(len(self.workers))
        self.metrics.observe([w.alive for w in self.workers],
                             [w.restarts for w in self.workers])
        texts = []
        for w in self.workers:
            if not w.alive:
                continue  # its series are absent, and workers_alive says why
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with self._http.get(f"{w.base}/metrics", headers=self._headers(request),
                                          timeout=aiohttp.ClientTimeout(total=5)) as resp:
                    if resp.status == 200:
                        texts.append((w.index, await resp.text()))
        body, unreadable = merge(texts, self.metrics.registry)
        for index in unreadable:
            log.warning("worker %d's /metrics did not parse; left out of /metrics", index)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def directory(self, request: web.Request) -> web.Response:
        """For the workers: the home of a stream (``HttpDirectory`` reads it)."""
        worker = self.home(request.match_info["stream"])
        return json_answer(200, None, {}, {"node": worker.node_id, "url": worker.base})


def check(settings: Settings, count: int) -> None:
    if count < 1:
        raise ConfigError("--workers must be 1 or more")
    if settings.ptp_interface is not None and count > 1:
        raise ConfigError("--workers with ptp_interface: every worker would run its own PTP "
                          "slave on the same ports; run one process per host for PTP")


async def supervise(settings: Settings, count: int, argv: Sequence[str]) -> None:
    supervisor = Supervisor(settings, count, argv)
    directory = web.Application()
    directory.router.add_get("/streams/{stream}", supervisor.directory)
    directory_runner = web.AppRunner(directory, access_log=None)
    await directory_runner.setup()
    supervisor.directory_port = free_port()
    await web.TCPSite(directory_runner, "127.0.0.1", supervisor.directory_port).start()
    public = web.Application(client_max_size=settings.max_body_bytes)
    public.router.add_route("*", "/{tail:.*}", supervisor.handle)
    public.on_shutdown.append(supervisor.end_streams)
    install_hsts(public, settings.hsts_max_age_s)
    runner = web.AppRunner(public, access_log=None, handle_signals=False)
    stop = stop_on_signals()
    await runner.setup()
    listening = None
    try:
        await supervisor.start()
        supervisor.metrics = SupervisorMetrics(count)
        listening = await listeners.start(runner, settings, registry=supervisor.metrics.registry)
        log.info("listening on %s with %d workers", ", ".join(listening.urls), count)
        if listening.reloader is not None:
            log.info("serving the certificate %s", listening.reloader.certificate.describe())
        await stop.wait()
        log.info("shutting down")
    finally:
        if listening is not None:
            await listening.close()
        await runner.cleanup()
        await supervisor.stop()
        await directory_runner.cleanup()
        log.info("stopped")


def run(settings: Settings, count: int, argv: Sequence[str]) -> int:
    check(settings, count)
    install_event_loop_policy()
    asyncio.run(supervise(settings, count, argv))
    return 0
