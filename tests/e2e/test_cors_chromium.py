"""A web app on another origin publishes and views with the reference WHIP/WHEP clients.

The clients are the ``whip-whep`` npm package (pinned in package.json), loaded unchanged by a
page that a different port serves, so every request the browser makes to the service is
cross-origin and goes through Chromium's own CORS checks.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import NOT_RUN, ROOT, partial_run
from tests.support import probe as probes

pytestmark = [pytest.mark.browser, pytest.mark.netns]

CLIENTS = ROOT / "node_modules" / "whip-whep"


@pytest.fixture(scope="module")
def probe() -> dict[str, Any]:
    if not (CLIENTS / "whip.js").is_file():
        reason = (
            f"{CLIENTS.relative_to(ROOT)} is missing: run `npm ci --no-audit --no-fund` in "
            f"{ROOT} to install the pinned WHIP/WHEP clients"
        )
        if partial_run():
            pytest.skip(NOT_RUN + reason)
        pytest.fail(reason, pytrace=False)
    # Only ``lo`` inside: Chromium can pair nothing but loopback candidates with the service.
    return probes.run_probe("tests.e2e.cors_chromium_probe", timeout=150)


def _requests(probe: dict[str, Any], server: str, stream: str) -> list[str]:
    return [r for r in probe["requests"][server] if f"/{stream}" in r.split()[1]]


def _deleted(requests: list[str], kind: str, stream: str) -> bool:
    # stop() closes the peer connection before it sends DELETE, so the service may have ended
    # the session on the closed connection already (404); either way DELETE crossed origins.
    return any(
        r in requests for r in (
            f"DELETE /{kind}/{stream}/{{session}} 200", f"DELETE /{kind}/{stream}/{{session}} 404"
        )
    )


def _published_viewed_and_stopped(seen: dict[str, Any]) -> None:
    assert "publishError" not in seen, seen
    assert seen["published"] is True
    assert seen["frames"] >= 30, seen
    assert (seen["width"], seen["height"]) == (320, 240), seen
    assert seen["framesDecoded"] > 10, seen
    assert seen["audioPackets"] > 0, seen
    # While live, read cross-origin: one publisher, one viewer.
    during = seen["during"]
    assert during["publisher"] is not None, during
    assert during["publisher"]["state"] == "connected", during
    assert len(during["viewers"]) == 1, during
    # stop() on both clients ended both sessions: the stream is gone.
    assert seen["stopped"] is True
    assert seen["after"] == {"streams": []}, seen["after"]
    assert seen["refused_preflights"] == 0


def test_listed_origin_publishes_views_and_stops(probe: dict[str, Any]) -> None:
    _published_viewed_and_stopped(probe["open"])
    requests = _requests(probe, "open", "cors-open")
    for kind in ("whip", "whep"):
        # Preflight, offer, trickle (PATCH with If-Match) and stop all crossed origins.
        assert requests.index(f"OPTIONS /{kind}/cors-open 204") < requests.index(
            f"POST /{kind}/cors-open 201"
        ), requests
        assert f"PATCH /{kind}/cors-open/{{session}} 204" in requests, requests
        assert _deleted(requests, kind, "cors-open"), requests


def test_listed_origin_with_tokens(probe: dict[str, Any]) -> None:
    seen = probe["token"]
    # A wrong token is the service's 401, readable by the client (not a CORS failure).
    assert seen["wrongToken"]["message"] == "Request rejected with status 401", seen
    _published_viewed_and_stopped(seen)
    requests = _requests(probe, "token", "cors-token")
    assert requests.count("POST /whip/cors-token 401") == 1, requests
    for kind in ("whip", "whep"):
        assert f"POST /{kind}/cors-token 201" in requests, requests
        assert f"PATCH /{kind}/cors-token/{{session}} 204" in requests, requests
        assert _deleted(requests, kind, "cors-token"), requests


def test_unlisted_origin_is_refused_by_the_browser(probe: dict[str, Any]) -> None:
    seen = probe["refused"]
    assert "published" not in seen, seen
    # Chromium's CORS refusal: the fetch fails as a network error, status unreadable.
    assert seen["publishError"] == {"name": "TypeError", "message": "Failed to fetch"}, seen
    assert seen["after"] == {"streams": []}, seen["after"]
    # The browser's preflight reached the service and was refused there, before any route;
    # the browser then sent nothing else.
    assert seen["refused_preflights"] >= 1, seen
    assert _requests(probe, "open", "cors-refused") == ["OPTIONS /whip/cors-refused 403"]
