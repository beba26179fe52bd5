from __future__ import annotations

import pytest

from sfu_sidecar.cors import (
    ALLOW_HEADERS,
    EXPOSE_HEADERS,
    MAX_AGE_S,
    CorsPolicy,
    allowed_methods,
)

APP = "https://app.example"
OTHER = "https://evil.example"
UNSET = CorsPolicy()
ANY = CorsPolicy(("*",))
LISTED = CorsPolicy((APP, "http://127.0.0.1:3000"))


@pytest.mark.parametrize("policy", [UNSET, ANY, LISTED])
@pytest.mark.parametrize("method", ["GET", "HEAD", "get"])
def test_reads_are_open_to_every_origin_with_a_star(policy: CorsPolicy, method: str) -> None:
    for origin in (APP, OTHER, None):
        headers = policy.response_headers(origin, method)
        assert headers["Access-Control-Allow-Origin"] == "*"
        assert "Vary" not in headers  # the same answer for every origin: one cached copy
        exposed = headers["Access-Control-Expose-Headers"].split(", ")
        assert exposed == list(EXPOSE_HEADERS)
        assert "X-Stream-Epoch-Ns" in exposed and "Retry-After" in exposed


@pytest.mark.parametrize("method", ["POST", "PATCH", "DELETE", "OPTIONS"])
def test_unset_refuses_every_origin_to_write(method: str) -> None:
    assert UNSET.allow_origin(APP, method) is None
    assert UNSET.response_headers(APP, method) == {}
    assert UNSET.preflight_headers(APP, method, "/whip/live") is None


@pytest.mark.parametrize("method", ["POST", "PATCH", "DELETE", "OPTIONS"])
def test_star_lets_every_origin_write_without_echoing_it(method: str) -> None:
    headers = ANY.response_headers(OTHER, method)
    assert headers["Access-Control-Allow-Origin"] == "*"
    assert "Vary" not in headers
    preflight = ANY.preflight_headers(OTHER, method, "/whip/live")
    assert preflight is not None and preflight["Access-Control-Allow-Origin"] == "*"


def test_a_listed_origin_is_echoed_with_vary_and_others_get_nothing() -> None:
    headers = LISTED.response_headers(APP, "POST")
    assert headers["Access-Control-Allow-Origin"] == APP
    assert headers["Vary"] == "Origin"
    assert "Location" in headers["Access-Control-Expose-Headers"]
    assert "Access-Control-Allow-Credentials" not in headers
    refused = LISTED.response_headers(OTHER, "POST")
    assert "Access-Control-Allow-Origin" not in refused
    # The same URL answers differently per origin: caches must key on it.
    assert refused["Vary"] == "Origin"
    assert LISTED.response_headers(None, "DELETE") == {"Vary": "Origin"}
    # Origins compare exactly, as browsers serialize them.
    assert LISTED.allow_origin("https://app.example:8443", "POST") is None
    assert LISTED.allow_origin("http://app.example", "POST") is None


def test_preflight_names_methods_headers_and_max_age() -> None:
    headers = LISTED.preflight_headers(APP, "PATCH", "/whip/live/" + "a" * 32)
    assert headers == {
        "Access-Control-Allow-Origin": APP,
        "Access-Control-Allow-Methods": "POST, PATCH, DELETE, OPTIONS",
        "Access-Control-Allow-Headers": "Authorization, Content-Type, If-Match",
        "Access-Control-Max-Age": str(MAX_AGE_S),
        "Vary": "Origin",
    }
    assert ALLOW_HEADERS == ("Authorization", "Content-Type", "If-Match")
    assert LISTED.preflight_headers(OTHER, "PATCH", "/whip/live") is None
    # A preflight for a read passes for any origin (e.g. a GET that sends Authorization).
    read = LISTED.preflight_headers(OTHER, "GET", "/api/streams")
    assert read is not None and read["Access-Control-Allow-Origin"] == "*"


@pytest.mark.parametrize(
    ("path", "methods"),
    [
        ("/whip/live", "POST, PATCH, DELETE, OPTIONS"),
        ("/whep/live/" + "0" * 32, "POST, PATCH, DELETE, OPTIONS"),
        ("/api/streams/live/captions", "GET, POST, DELETE, OPTIONS"),
        ("/api/streams/live/captions/en/cue-1", "GET, POST, DELETE, OPTIONS"),
        ("/api/streams/live", "GET, HEAD, OPTIONS"),
        ("/api/streams/live/captionsx", "GET, HEAD, OPTIONS"),
        ("/captions/live/en/chunk-3.vtt", "GET, HEAD, OPTIONS"),
        ("/healthz", "GET, HEAD, OPTIONS"),
        ("/whipx", "GET, HEAD, OPTIONS"),
    ],
)
def test_allowed_methods_per_route_family(path: str, methods: str) -> None:
    assert allowed_methods(path) == methods


def test_websocket_handshakes() -> None:
    ingest = "/api/streams/live/captions/ws"
    host = "sidecar.example:8080"
    # Not a browser, or the page came from this very host (any scheme: a TLS proxy in front).
    assert UNSET.websocket_allowed(None, host, ingest)
    assert UNSET.websocket_allowed("http://sidecar.example:8080", host, ingest)
    assert UNSET.websocket_allowed("https://Sidecar.example:8080", host, ingest)
    # Another page: only when listed (or "*").
    assert not UNSET.websocket_allowed(APP, host, ingest)
    assert not UNSET.websocket_allowed("null", host, ingest)
    assert not UNSET.websocket_allowed("http://sidecar.example", host, ingest)
    assert not UNSET.websocket_allowed(APP, None, ingest)
    assert LISTED.websocket_allowed(APP, host, ingest)
    assert not LISTED.websocket_allowed(OTHER, host, ingest)
    assert ANY.websocket_allowed(OTHER, host, ingest)
    # The clock join reads time only: open to every page.
    assert UNSET.websocket_allowed(OTHER, host, "/api/clock/ws")
