"""Every route of the real app answers any request with a status below 500, and every 4xx with
a JSON ``{"error": reason}``: path segments, query parameters, headers and bodies generated
against the app's own route table, so a route added later is covered without touching this file.

The app is the real one (``build_app`` with all components, a SQLite caption store in
``tmp_path``), seeded with captions on stream ``live`` and a WHEP viewer session so requests
reach past the not-found answers. ``FUZZ_EXAMPLES`` sets the examples per route (default 40)
for a longer local run.

Two answers come from below the routes and are accepted as they are: aiohttp's parser refuses
a request line past 8190 bytes (400, text), and a file response answers a failed If-Match or
an unsatisfiable Range on a file that exists (412/416, empty body). The edge cases that used to
escape as 500s are pinned by the tests at the end of this file.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgpack
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from yarl import URL

from sfu_sidecar.app import build_app
from sfu_sidecar.config import load_settings
from tests.conftest import IN_PROCESS
from tests.relay.test_offer_check import make_offer, mutated_offers

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "40"))
TOKEN = "s3cret"
ORIGIN = "https://app.example"
MAX_BODY = 16384


def app_settings(data_dir: Path) -> Any:
    return load_settings({
        "data_dir": str(data_dir), "publish_token": TOKEN, "ice_addresses": "127.0.0.1",
        "cors_origins": ORIGIN, "max_body_bytes": str(MAX_BODY), **IN_PROCESS,
    })


def _route_table() -> list[web.AbstractRoute]:
    """The app's routes, read from an app that is built but never started."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        app = build_app(app_settings(Path(tmp)))
        return list(app.router.routes())


ROUTES = _route_table()


def route_id(route: web.AbstractRoute) -> str:
    resource = route.resource
    return f"{route.method} {resource.canonical if resource is not None else '?'}"


@dataclass
class Live:
    """The running app and what the seeding created on it."""

    client: TestClient[web.Request, web.Application]
    known: dict[str, list[str]] = field(default_factory=dict)  # placeholder -> good values
    offers: dict[str, str] = field(default_factory=dict)


@pytest.fixture
async def live(tmp_path: Path) -> AsyncIterator[Live]:
    app = build_app(app_settings(tmp_path / "data"))
    async with TestClient(TestServer(app)) as client:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        cues = [{"id": f"c{i}", "start": i, "end": i + 1.5, "text": f"cue {i}"} for i in range(5)]
        resp = await client.post("/api/streams/live/captions", headers=auth,
                                 json={"timebase": "stream_s", "lang": "en", "cues": cues})
        assert resp.status == 200, await resp.text()
        view = await make_offer("recvonly")
        resp = await client.post("/whep/live", data=view,
                                 headers={"Content-Type": "application/sdp"})
        assert resp.status == 201, await resp.text()
        session = resp.headers["Location"].rsplit("/", 1)[1]
        yield Live(
            client,
            known={"stream": ["live", "cam"], "lang": ["en", "de"], "cue_id": ["c1", "c9"],
                   "session": [session, "0" * 32], "n": ["0", "1", "999999999999"],
                   "page": ["index", "viewer", "nope"]},
            offers={"whip": await make_offer("sendonly"), "whep": view},
        )


# --- request parts ---------------------------------------------------------------------------

NUMBERS = st.sampled_from([
    "0", "-0", "1", "-1", "0.5", "1e308", "1e309", "-1e309", "1e-400", "inf", "-inf", "Infinity",
    "nan", "NaN", "9" * 30, "9" * 5000, "1_000", " 5 ", "0x10", "1.5e3", "9223372036854775808",
    "18446744073709551616", "316224000", "316224001", "", "١٢", "1,5",
])
TEXT = st.text(max_size=30)
SEGMENTS = st.one_of(
    NUMBERS, TEXT.filter(lambda s: "/" not in s),
    st.sampled_from(["", ".", "..", "x" * 250, "é", "\u202e", "%", "{x}", "a b", "~"]),
)
# Sent as written: percent-encodings the client would otherwise escape again.
RAW_SEGMENTS = st.sampled_from(["%2e%2e", "%2F", "%00", "%ff", "%zz", "%C3%A9", "..%2f..%2f"])
HEADER_TEXT = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
    max_size=40,
)
CONTENT_TYPES = st.sampled_from([
    "application/json", "application/sdp", "text/vtt", "application/trickle-ice-sdpfrag",
    "application/msgpack", "text/plain", "", "application/json; charset=latin-1",
    "text/vtt; charset=utf-16", "multipart/form-data; boundary=x", "application/json;;;",
    "*/*", "application/x-www-form-urlencoded", "APPLICATION/JSON",
])
AUTHORIZATION = st.one_of(st.sampled_from([
    f"Bearer {TOKEN}", "Bearer", "Bearer ", "Bearer  x", "Basic czNjcmV0", f"bearer {TOKEN}",
    f"Bearer {TOKEN}x", "",
]), HEADER_TEXT)


@st.composite
def headers(draw: st.DrawFn) -> dict[str, str]:
    out: dict[str, str] = {}
    if draw(st.booleans()):
        out["Content-Type"] = draw(st.one_of(CONTENT_TYPES, HEADER_TEXT))
    if draw(st.integers(0, 3)):
        out["Authorization"] = draw(AUTHORIZATION)
    optional = {
        "If-Match": st.one_of(st.sampled_from(["*", '"x"', 'W/"x"']), HEADER_TEXT),
        "Origin": st.one_of(st.sampled_from([ORIGIN, "null", "http://evil.example"]),
                            HEADER_TEXT),
        "Access-Control-Request-Method": st.sampled_from(["POST", "PATCH", "DELETE", "GET", ""]),
        "Access-Control-Request-Headers": HEADER_TEXT,
        "Accept": st.one_of(st.sampled_from(["application/json", "*/*", "text/vtt"]),
                            HEADER_TEXT),
        "Content-Encoding": st.sampled_from(["identity", "x", "gzip", "br", "deflate"]),
        "Range": st.sampled_from(["bytes=0-1", "bytes=99999999999999999999-", "bytes=x"]),
        "If-None-Match": HEADER_TEXT,
        "If-Modified-Since": st.one_of(st.just("Sun, 06 Nov 1994 08:49:37 GMT"), HEADER_TEXT),
        "X-Forwarded-For": HEADER_TEXT,
    }
    for name, values in optional.items():
        if draw(st.integers(0, 5)) == 0:
            out[name] = draw(values)
    return out


JSON_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=2**64),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
)
JSON_ANY = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12,
)


@st.composite
def caption_docs(draw: st.DrawFn) -> Any:
    """Caption ingest documents with a wrong value somewhere, so validation runs deep."""
    def field_value(good: st.SearchStrategy[Any]) -> Any:
        return draw(st.one_of(good, JSON_ANY) if draw(st.integers(0, 3)) else JSON_ANY)

    cue = {
        "id": field_value(st.sampled_from(["c1", "c2", "auto-1", "x" * 200])),
        "start": field_value(st.sampled_from([0, 1.5, -1, 1e308, 2**63, 10**30, 316224000])),
        "end": field_value(st.sampled_from([2, 3.25, 1e308, 2**64, 316224001])),
        "text": field_value(st.sampled_from(["hi", "", "a\n\nb", "-->", "x" * 3000])),
        "final": field_value(st.booleans()),
    }
    return {
        "timebase": field_value(st.sampled_from(["stream_s", "house_ns"])),
        "lang": field_value(st.sampled_from(["en", "pt-BR", "x" * 40])),
        "cues": [dict(cue) for _ in range(draw(st.integers(0, 3)))],
    }


def _msgpackable(doc: Any) -> Any:
    """``doc`` with integers msgpack cannot carry (64 bits) as text."""
    if isinstance(doc, dict):
        return {k: _msgpackable(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_msgpackable(v) for v in doc]
    if isinstance(doc, int) and not isinstance(doc, bool) and not -(2**63) <= doc < 2**64:
        return str(doc)
    return doc


def _json_bytes(doc: Any) -> bytes:
    return json.dumps(doc).encode()


VTT_BODIES = st.sampled_from([
    b"WEBVTT\n\n00:00.000 --> 00:01.000 line:" + b"1" * 400 + b"\nx\n",
    b"WEBVTT\n\n" + b"9" * 5000 + b":00:00.000 --> 00:01.000\nx\n",
    b"WEBVTT\n\nc1\n00:00.000 --> 00:01.000\nx\n\nc1\n00:02.000 --> 00:03.000\ny\n",
    b"WEBVTT\n\n00:05.000 --> 00:01.000\nbackwards\n",
    b"WEBVTTX\n", b"", b"WEBVTT\n\n" + b"00:00.000 --> 00:01.000\nx\n\n" * 600,
])


@st.composite
def bodies(draw: st.DrawFn, offers: dict[str, str]) -> bytes | None:
    kind = draw(st.sampled_from(
        ["none", "json", "captions", "deep", "bigint", "msgpack", "vtt", "sdp", "trickle",
         "bytes", "huge"]))
    if kind == "none":
        return None
    if kind == "json":
        return _json_bytes(draw(JSON_ANY))
    if kind == "captions":
        return _json_bytes(draw(caption_docs()))
    if kind == "deep":
        depth = draw(st.sampled_from([100, 2000, 100_000]))
        return b"[" * depth + b"]" * depth
    if kind == "bigint":
        return draw(st.sampled_from([b"1" * 5000, b'{"cues": [' + b"9" * 5000 + b"]}", b"1e309",
                                     b'{"timebase": "stream_s", "lang": "en", "cues": '
                                     b'[{"start": 1e309, "end": -1e309, "text": "x"}]}']))
    if kind == "msgpack":
        return bytes(msgpack.packb(_msgpackable(draw(caption_docs())), use_bin_type=True))
    if kind == "vtt":
        return draw(st.one_of(VTT_BODIES, st.binary(max_size=100).map(lambda b: b"WEBVTT\n" + b)))
    if kind == "sdp":
        which = draw(st.sampled_from(sorted(offers)))
        return draw(mutated_offers(offers[which])).encode()
    if kind == "trickle":
        lines = draw(st.lists(st.sampled_from([
            "a=ice-ufrag:x", "a=ice-pwd:y", "m=audio 9 RTP/AVP 0", "a=mid:0",
            "a=candidate:1 1 udp 2130706431 127.0.0.1 5000 typ host",
            "a=candidate:1 1 udp 99999999999999999999 127.0.0.1 99999 typ host",
            "a=candidate:x", "a=candidate:1 1 udp 1 x.local 5000 typ host",
            "a=candidate:1 x udp 1 ::1 5000 typ host", "a=end-of-candidates", "junk", "",
        ]), max_size=6))
        return "\r\n".join(lines).encode()
    if kind == "huge":
        return b"x" * (MAX_BODY + 1)
    return draw(st.binary(max_size=200))


@dataclass
class Request:
    method: str
    url: URL
    headers: dict[str, str]
    body: bytes | None


def _placeholders(resource: web.AbstractResource) -> list[tuple[str, str]]:
    """(name, regex) of each ``{name}`` in a dynamic resource's pattern."""
    info = resource.get_info()
    pattern: re.Pattern[str] = info["pattern"]
    out = []
    for m in re.finditer(r"\(\?P<(\w+)>", pattern.pattern):
        depth, i = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(pattern.pattern[i], 0)
            i += 1
        out.append((m.group(1), pattern.pattern[m.end(): i - 1]))
    return out


@st.composite
def requests(draw: st.DrawFn, route: web.AbstractRoute, live: Live) -> Request:
    resource = route.resource
    assert resource is not None
    info = resource.get_info()
    if "formatter" in info:
        path = info["formatter"]
        for name, regex in _placeholders(resource):
            choice = draw(st.integers(0, 3))
            if choice == 0 and name in live.known:
                value = quote(draw(st.sampled_from(live.known[name])), safe="")
            elif choice == 1:
                value = quote(draw(st.from_regex(regex, fullmatch=True).filter(
                    lambda v: v.encode("utf-8", "ignore").decode() == v)), safe="")
            elif choice == 2:
                value = draw(RAW_SEGMENTS)
            else:
                value = quote(draw(SEGMENTS), safe="")
            path = path.replace("{" + name + "}", value)
    elif "directory" in info:
        files = sorted(p.name for p in Path(info["directory"]).iterdir())
        name = draw(st.one_of(st.sampled_from(files or ["x"]), RAW_SEGMENTS,
                              SEGMENTS.map(lambda s: quote(s, safe=""))))

        path = f"{info['prefix']}/{name}"
    else:
        path = info["path"]
    method = route.method
    if method == "*" or draw(st.integers(0, 9)) == 0:
        method = draw(st.sampled_from(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE",
                                       "OPTIONS"]))
    query = draw(st.one_of(
        st.dictionaries(
            st.sampled_from(["start", "end", "since", "limit", "lang", "token", "stream", "n"]),
            st.one_of(NUMBERS, TEXT), max_size=3,
        ).map(lambda q: "&".join(f"{quote(k)}={quote(v, safe='')}" for k, v in q.items())),
        st.sampled_from(["start=%ff&end=%zz", "start=1&start=2&end=3", ";;;", "=", "&&",
                         "start=1e308&end=1e309", "since=" + "9" * 5000, "lang=%00"]),
    ))
    target = path + (f"?{query}" if query else "")
    # aiohttp's HTTP parser answers a request line past 8190 bytes itself (400 text/plain,
    # before any route): that is the server's limit, not a route's answer.
    assume(len(target) < 8000)
    url = URL(target, encoded=True)
    return Request(method, url, draw(headers()), draw(bodies(live.offers)))


async def send(live: Live, req: Request) -> tuple[int, str, str]:
    async with live.client.request(
        req.method, req.url, headers=req.headers, data=req.body, allow_redirects=False,
    ) as resp:
        if resp.content_type == "text/event-stream" and resp.status < 400:
            # The live caption push: an answer that lasts while the client listens. Its status
            # and type are the answer; the events are tested in tests/captions/test_live.py.
            return resp.status, resp.content_type, ""
        text = await resp.text(errors="replace")
        if resp.status == 201 and "Location" in resp.headers:
            # A session some mutated offer created: end it, so the next example starts clean.
            async with live.client.delete(resp.headers["Location"]):
                pass
        return resp.status, resp.content_type, text


# Status codes a file response (static folders, the HTML pages) answers by itself for a file
# that exists, with an empty body: a failed If-Match, an unsatisfiable Range.
FILE_RESPONSE_REFUSALS = (412, 416)


def assert_answer(req: Request, status: int, content_type: str, text: str) -> None:
    assert status < 500, (req, status, text)
    if status < 400:
        return
    if (content_type == "application/octet-stream" and text == ""
            and status in FILE_RESPONSE_REFUSALS and req.method in ("GET", "HEAD")):
        event(f"file response {status}")
        return
    assert content_type == "application/json", (req, status, content_type, text)
    if req.method != "HEAD":
        body = json.loads(text)
        assert isinstance(body, dict) and set(body) == {"error"}, (req, body)
        assert isinstance(body["error"], str) and body["error"].strip(), (req, body)


@pytest.mark.parametrize("route", ROUTES, ids=[route_id(r) for r in ROUTES])
@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much])
@given(data=st.data())
async def test_route_never_answers_5xx(
    live: Live, route: web.AbstractRoute, data: st.DataObject
) -> None:
    req = data.draw(requests(route, live), label="request")
    status, content_type, text = await send(live, req)
    event(f"status {status}")
    assert_answer(req, status, content_type, text)


def test_every_route_is_fuzzed() -> None:
    """The parametrization above is the live route table: nothing is left out by hand."""
    assert len(ROUTES) >= 30
    assert {route_id(r) for r in ROUTES} >= {
        "POST /whip/{stream}", "GET /captions/{stream}/{lang}.vtt", "GET /api/clock",
        "POST /api/streams/{stream}/captions",
    }


# --- found cases, kept as plain regressions --------------------------------------------------


async def get(live: Live, path: str, **kw: Any) -> tuple[int, Any]:
    async with live.client.get(URL(path, encoded=True), **kw) as resp:
        assert resp.content_type == "application/json", await resp.text()
        return resp.status, await resp.json()


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("start=1e308&end=1e309", "start must be a number from 0 to 316224000"),
        ("start=0&end=1e309", "end must be a number from 0 to 316224000"),
        ("start=0&end=inf", "end must be a number"),
        ("start=nan&end=1", "start must be a number"),
        ("start=-1&end=1", "start must be a number from 0"),
        ("start=x&end=1", "start='x' is not a number"),
        ("end=1", "query parameter start (stream seconds) is required"),
    ],
)
async def test_window_times_out_of_range_are_400(live: Live, query: str, reason: str) -> None:
    """``start=1e308`` used to overflow (1e308 s * 1000 is infinite) into a 500."""
    status, body = await get(live, f"/captions/live/en.vtt?{query}")
    assert status == 400 and reason in body["error"]


async def test_window_at_the_end_of_the_timeline_still_answers(live: Live) -> None:
    async with live.client.get("/captions/live/en.vtt?start=316223999&end=316224000") as resp:
        assert resp.status == 200
        assert (await resp.text()).startswith("WEBVTT")


async def test_feed_cursor_past_int_digit_limit_is_400(live: Live) -> None:
    status, body = await get(live, "/api/streams/live/captions?since=" + "9" * 5000)
    assert status == 400 and "is not an integer" in body["error"]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"timebase": "stream_s", "lang": "en", "cues": [' + b"9" * 5000 + b"]}",
         "malformed JSON: Exceeds the limit"),  # int()'s digit limit inside json.loads
        (b"[" * 5000 + b"]" * 5000, "malformed JSON: nested too deeply"),
    ],
)
async def test_json_bodies_json_cannot_hold_are_400(live: Live, body: bytes, reason: str) -> None:
    async with live.client.post(
        "/api/streams/live/captions", data=body,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    ) as resp:
        assert resp.status == 400
        assert reason in (await resp.json())["error"]


# --- WebSocket routes: messages instead of bodies --------------------------------------------

WS_ROUTES = [r for r in ROUTES if r.method == "GET" and r.resource is not None
             and r.resource.canonical.endswith("/ws")]
WS_TEXT = st.one_of(
    st.builds(lambda doc: json.dumps(doc), st.one_of(JSON_ANY, caption_docs())),
    st.text(max_size=60),
    st.sampled_from(["1" * 5000, "1e309", "NaN", '{"op": "retract"}', '{"op": "x", "ref": 1}',
                     '{"type": "ping", "t1": ' + "9" * 30 + "}", "[" * 400 + "]" * 400]),
)
WS_BINARY = st.one_of(
    st.builds(lambda doc: bytes(msgpack.packb(_msgpackable(doc), use_bin_type=True)),
              st.one_of(JSON_ANY, caption_docs())),
    st.binary(max_size=60),
)


def ws_path(route: web.AbstractRoute, live: Live) -> str:
    assert route.resource is not None
    path = route.resource.canonical
    for name, values in live.known.items():
        path = path.replace("{" + name + "}", values[0])
    return path


@pytest.mark.parametrize("route", WS_ROUTES, ids=[route_id(r) for r in WS_ROUTES])
@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(messages=st.lists(st.one_of(WS_TEXT, WS_BINARY), min_size=1, max_size=3))
async def test_websocket_never_fails_on_a_message(
    live: Live, route: web.AbstractRoute, messages: list[str | bytes]
) -> None:
    """Whatever a client sends, the server answers, ignores it or closes with a reason
    (1007 bad data, 1009 too big); never 1011 (internal error) or a torn connection."""
    ws = await live.client.ws_connect(
        ws_path(route, live), headers={"Authorization": f"Bearer {TOKEN}", "Origin": ORIGIN})
    for message in messages:
        if ws.closed:
            break
        if isinstance(message, str):
            await ws.send_str(message)
        else:
            await ws.send_bytes(message)
    await ws.close()
    event(f"close code {ws.close_code}")
    assert ws.close_code in (1000, 1007, 1008, 1009), ws.close_code


async def test_caption_websocket_answers_every_message_without_a_5xx(live: Live) -> None:
    messages: list[str | bytes] = [
        "1" * 5000, "[" * 4000 + "]" * 4000, "junk", '{"op": "retract", "lang": "en"}',
        bytes(msgpack.packb({"timebase": "stream_s", "lang": "en",
                             "cues": [{"start": 1e308, "end": float("inf"), "text": "x"}]})),
        b"\xc1", bytes(msgpack.packb([[[]]] * 10)),
    ]
    ws = await live.client.ws_connect(
        "/api/streams/live/captions/ws", headers={"Authorization": f"Bearer {TOKEN}"})
    for message in messages:
        if isinstance(message, str):
            await ws.send_str(message)
            reply = json.loads((await ws.receive(timeout=10)).data)
        else:
            await ws.send_bytes(message)
            reply = msgpack.unpackb((await ws.receive(timeout=10)).data)
        assert reply["ok"] is False and 400 <= reply["status"] < 500 and reply["error"], reply
    await ws.close()


# --- the HTTP edge: cases that once escaped the routes as 500s or bodies without a reason ----


async def test_edge_compressed_body_is_a_json_415(live: Live) -> None:
    """Bodies are taken as sent; a compressed one is refused with the reason, not decoded."""
    async with live.client.post(
        "/api/streams/live/captions", data=b"not gzip",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json",
                 "Content-Encoding": "gzip"},
    ) as resp:
        assert resp.status == 415 and resp.content_type == "application/json"
        assert "Content-Encoding" in (await resp.json())["error"]


async def test_edge_content_encoding_never_reaches_a_decoder(live: Live) -> None:
    """``br`` (no Brotli here) and bad deflate are never decoded, so never refused as text."""
    for encoding in ("br", "deflate"):
        async with live.client.get(
            "/healthz", data=b"x", headers={"Content-Encoding": encoding}
        ) as resp:
            assert resp.status < 500 and resp.content_type == "application/json"


@pytest.mark.parametrize("path", ["/js/" + "x" * 300 + ".js", "/" + "x" * 300 + ".html"])
async def test_edge_overlong_file_name(live: Live, path: str) -> None:
    """Names are checked before the file system is asked (ENAMETOOLONG was a 500)."""
    async with live.client.get(path) as resp:
        assert resp.status == 404 and resp.content_type == "application/json"


async def test_edge_missing_static_file(live: Live) -> None:
    """A missing static file is the JSON 404, like every other route's."""
    async with live.client.get("/js/no-such-file.js") as resp:
        assert resp.status == 404 and resp.content_type == "application/json"


@pytest.mark.parametrize("kind", ["whip", "whep"])
async def test_edge_ice_ufrag_with_a_control_character_is_400(live: Live, kind: str) -> None:
    """The offer's ufrag names the ICE session in the answer's ETag; a control character in it
    made aiohttp drop the connection while writing the headers, with no answer at all."""
    offer = re.sub(r"^a=ice-ufrag:(.*)$", "a=ice-ufrag:\\1\x01", live.offers[kind],
                   flags=re.MULTILINE)
    assert "\x01" in offer
    async with live.client.post(
        f"/{kind}/live", data=offer.encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/sdp"},
    ) as resp:
        assert resp.status == 400 and resp.content_type == "application/json"
        assert "ice-char" in (await resp.json())["error"]


async def test_edge_direction_with_trailing_whitespace_is_negotiated(live: Live) -> None:
    """The offer is checked line by line, stripped; aiortc must read the same lines, or a
    direction with a trailing tab reaches createAnswer as no direction (it answered 500)."""
    offer = re.sub(r"^a=(sendonly)$", "a=\\1\t", live.offers["whip"], flags=re.MULTILINE)
    assert "sendonly\t" in offer
    async with live.client.post(
        "/whip/padded", data=offer.encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/sdp"},
    ) as resp:
        assert resp.status == 201, await resp.text()
        assert "a=recvonly" in await resp.text()
        location = resp.headers["Location"]
    async with live.client.delete(location, headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
        assert resp.status < 300


async def test_clock_websocket_deep_json_closes_with_1007(live: Live) -> None:
    """Nesting deep enough to exhaust recursion, small enough for the 4096-byte frame limit:
    the socket is closed with 1007 and a reason, not torn by an exception."""
    ws = await live.client.ws_connect("/api/clock/ws")
    await ws.send_str("[" * 2000 + "]" * 2000)
    await ws.close()
    assert ws.close_code == 1007
