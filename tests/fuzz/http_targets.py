"""Fuzz targets that go through the real HTTP server: every route, and WHIP/WHEP offers.

The app is the real one (``build_app`` with all components, a SQLite caption store in a
temporary directory), served on 127.0.0.1 by aiohttp in a thread of the fuzzing process, and
asked over a plain HTTP/1.1 connection. The contract is what a client may rely on: an answer in
time, below 500, and every 4xx JSON with an ``error`` reason. Two answers come from below the
routes and are accepted as they are (see tests/test_http_inputs.py): aiohttp's own refusal of
an over-long request line or header (400, text) and a file response's 412/416 (empty body).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import tempfile
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from aiohttp import web

from sfu_sidecar.app import build_app
from sfu_sidecar.config import load_settings

TOKEN = "s3cret"
ORIGIN = "https://app.example"
MAX_BODY = 16384
TIMEOUT_S = 10.0
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD")
CONTENT_TYPES = ("application/json", "application/msgpack", "text/vtt", "application/sdp",
                 "application/trickle-ice-sdpfrag", "text/plain", "", "application/json; x=\0")
# The query parameters the routes read, and a few they do not.
PARAMS = ("start", "end", "since", "limit", "lang", "token", "n", "stream", "")
KNOWN_VALUES = ("live", "en", "0", "1", "chunk-0", "de-DE", "index.html", "", "..", "%00")


class Server:
    """The app on a loopback port, served by an event loop on a daemon thread."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory()
        settings = load_settings({
            "data_dir": self._dir.name, "publish_token": TOKEN, "ice_addresses": "127.0.0.1",
            "cors_origins": ORIGIN, "max_body_bytes": str(MAX_BODY),
            # The fuzzer runs in the server's process, so the CPU the server would see is
            # mostly the fuzzer's own: the overload refusal is tested on its own, off here.
            "max_cpu_percent": "1000",
        })
        self.app = build_app(settings)
        self.routes = [r for r in self.app.router.routes() if r.method != "*"]
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.port = 0

        async def start() -> None:
            runner = web.AppRunner(self.app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            server = site._server
            assert isinstance(server, asyncio.Server)
            self.port = server.sockets[0].getsockname()[1]
            ready.set()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.create_task(start())
            self.loop.run_forever()

        threading.Thread(target=serve, name="fuzz-http", daemon=True).start()
        if not ready.wait(30):
            raise RuntimeError("the app did not start")
        self.client = Client(self.port)
        self._seed()

    def _seed(self) -> None:
        doc = {"timebase": "stream_s", "lang": "en", "cues": [
            {"id": f"c{i}", "start": i, "end": i + 0.9, "text": f"cue {i}"} for i in range(5)]}
        status, _, _ = self.request("POST", "/api/streams/live/captions", json.dumps(doc).encode(),
                                    {"Content-Type": "application/json",
                                     "Authorization": f"Bearer {TOKEN}"})
        assert status < 300, status

    def request(self, method: str, path: str, body: bytes,
                headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        return self.client.request(method, path, body, headers)


class Client:
    """One keep-alive HTTP/1.1 connection to a server on 127.0.0.1, reopened when the server
    closes it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: bytes,
                headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        for attempt in (0, 1):
            conn = self._conn or http.client.HTTPConnection("127.0.0.1", self.port,
                                                            timeout=TIMEOUT_S)
            self._conn = conn
            try:
                conn.request(method, path, body=body or None, headers=headers)
                resp = conn.getresponse()
                if (resp.getheader("Content-Type") or "").startswith("text/event-stream"):
                    # The live caption push lasts while the client listens: its status and
                    # type are the answer, and the connection is given up.
                    conn.close()
                    self._conn = None
                    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, b""
                data = resp.read()
                answer = resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
                if resp.will_close:
                    conn.close()
                    self._conn = None
                return answer
            except (ConnectionError, http.client.RemoteDisconnected,
                    http.client.BadStatusLine):
                # The server may close a connection after refusing a request; one retry on a
                # fresh one tells a closed connection from a server that stopped answering.
                conn.close()
                self._conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


_server: Server | None = None


def server() -> Server:
    global _server
    if _server is None:
        _server = Server()
    return _server


@dataclass
class Provider:
    """Decisions taken from the input's bytes, front to back (``atheris`` has its own
    FuzzedDataProvider; this one keeps the targets runnable without it)."""

    data: bytes
    pos: int = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def pick(self, options: tuple[Any, ...] | list[Any]) -> Any:
        return options[self.byte() % len(options)]

    def text(self, limit: int = 24) -> str:
        size = min(self.byte() % (limit + 1), len(self.data) - self.pos)
        raw = self.data[self.pos : self.pos + size]
        self.pos += size
        return raw.decode("utf-8", "replace")

    def header(self, limit: int = 24) -> str:
        """A header value any client can send: Latin-1, no line breaks (control characters
        stay: refusing them is the server's job)."""
        return self.text(limit).encode("latin-1", "replace").decode("latin-1") \
            .replace("\r", " ").replace("\n", " ")

    def rest(self) -> bytes:
        out = self.data[self.pos :]
        self.pos = len(self.data)
        return out


def check_answer(status: int, headers: dict[str, str], body: bytes, what: str) -> None:
    assert status < 500, f"{what}: {status} {body[:300]!r}"
    if 400 <= status < 500 and status not in (412, 416) and not what.startswith("HEAD"):
        ctype = headers.get("content-type", "")
        if status == 400 and ctype.startswith("text/plain"):
            return  # aiohttp's parser refusing the request line or a header
        assert ctype.startswith("application/json"), f"{what}: {status} {ctype} {body[:200]!r}"
        assert isinstance(json.loads(body).get("error"), str), f"{what}: {body[:200]!r}"


def _fill(template: str, p: Provider) -> str:
    out = []
    for part in template.split("/"):
        if part.startswith("{") or "{" in part:
            value = p.pick(KNOWN_VALUES) if p.byte() % 2 else p.text()
            head = part.split("{", 1)[0]
            out.append(head + quote(value, safe=""))
        else:
            out.append(part)
    return "/".join(out)


def http_target(data: bytes) -> None:
    """Any route, any method, path segments, query parameters, headers and body."""
    s = server()
    p = Provider(data)
    route = p.pick(s.routes)
    info = route.resource.get_info() if route.resource is not None else {}
    template = str(info.get("formatter") or info.get("path") or info.get("prefix", "/"))
    method = route.method if p.byte() % 4 else p.pick(METHODS)
    path = _fill(template, p)
    if "prefix" in info:  # a static directory: any file name under it
        path = template.rstrip("/") + "/" + quote(p.text(), safe="/")
    query = "&".join(f"{quote(p.pick(PARAMS) or p.text(8))}={quote(p.text(12))}"
                     for _ in range(p.byte() % 4))
    headers = {"Content-Type": p.pick(CONTENT_TYPES)}
    auth = p.byte() % 3
    if auth:
        headers["Authorization"] = f"Bearer {TOKEN}" if auth == 1 else f"Bearer {p.header(8)}"
    if p.byte() % 2:
        headers["Origin"] = ORIGIN if p.byte() % 2 else "https://other.example"
    body = p.rest()[:MAX_BODY + 64]
    if method == "HEAD":
        body = b""
    target = path + ("?" + query if query else "")
    status, answer, content = s.request(method, target, body, headers)
    check_answer(status, answer, content, f"{method} {target}")


def http_seeds() -> list[bytes]:
    return [bytes([i, 1, 0, 1, 1, 0, 1, 0, 0]) for i in range(len(server().routes))]


def offer_target(data: bytes) -> None:
    """An offer POSTed to WHIP (publish) or WHEP (view), and after two zero bytes a trickle
    fragment PATCHed to the session it made: each refused with a reason or answered; an
    answered session is deleted again, so every input meets the same server."""
    s = server()
    publish = bool(data[:1]) and data[0] & 1 == 1
    offer, _, fragment = data[1:].partition(b"\0\0")
    path = "/whip/fuzz" if publish else "/whep/fuzz"
    headers = {"Content-Type": "application/sdp", "Authorization": f"Bearer {TOKEN}"}
    status, answer, content = s.request("POST", path, offer, headers)
    check_answer(status, answer, content, f"POST {path}")
    if status != 201:
        return
    location = answer.get("location", "")
    assert location.startswith("/"), answer
    if fragment:
        patch = {**headers, "Content-Type": "application/trickle-ice-sdpfrag", "If-Match": "*"}
        status, answer, content = s.request("PATCH", location, fragment, patch)
        check_answer(status, answer, content, f"PATCH {location}")
    status, answer, content = s.request("DELETE", location, b"", headers)
    check_answer(status, answer, content, f"DELETE {location}")


def offer_seeds() -> list[bytes]:
    from tests.fuzz.offers import OFFERS
    from tests.fuzz.targets import trickle_seeds

    ufrag = next(line for line in OFFERS[0].split("\r\n") if line.startswith("a=ice-ufrag:"))
    pwd = next(line for line in OFFERS[0].split("\r\n") if line.startswith("a=ice-pwd:"))
    fragment = trickle_seeds()[0].replace(b"a=ice-ufrag:abcd", ufrag.encode()) \
        .replace(b"a=ice-pwd:0123456789abcdef012345", pwd.encode())
    return [bytes([1]) + OFFERS[0].encode(), bytes([0]) + OFFERS[1].encode(),
            bytes([1]) + OFFERS[0].encode() + b"\0\0" + fragment]


def stop() -> None:
    """Close the server's loop (for the in-process replay in tests)."""
    global _server
    if _server is not None:
        _server.loop.call_soon_threadsafe(_server.loop.stop)
        _server = None
