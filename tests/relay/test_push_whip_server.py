"""A push to a WHIP server nobody here wrote: simple-whip-server (Debian's package, Meetecho's
WHIP server) publishing into a Janus VideoRoom, watched by a subscriber of the room.

The whole exchange runs in ``tests.relay.whip_server_push_probe``, in a network namespace of its
own, and reports its figures as JSON: the push connects, Janus's subscriber decodes the pushed
video, the push notices the server's death and reconnects by itself once it is back, and its
deletion ends the session on the server.
"""

from __future__ import annotations

from typing import Any

import pytest

from sfu_sidecar.relay.hooks import ABS_CAPTURE_TIME
from sfu_sidecar.relay.push import RETRY_MAX_S
from tests.conftest import NOT_RUN, ROOT, SIMPLE_WHIP_SERVER, partial_run
from tests.support import probe as probes

SECONDS = 4
CONNECT_LIMIT_S = 15  # ICE and DTLS with Janus on a loaded machine

pytestmark = [pytest.mark.netns, pytest.mark.needs("janus", "node", str(SIMPLE_WHIP_SERVER)),
              pytest.mark.timeout(240)]


def probe() -> dict[str, Any]:
    if not (ROOT / "node_modules" / "express").is_dir():
        reason = (f"node_modules/express is missing: run `npm ci --no-audit --no-fund` in {ROOT} "
                  "to install simple-whip-server's pinned modules")
        if partial_run():
            pytest.skip(NOT_RUN + reason)
        pytest.fail(reason, pytrace=False)
    result = probes.run_probe("tests.relay.whip_server_push_probe", SECONDS, timeout=220)
    probes.show(result, omit=("push_connected", "push_after_watch", "push_reconnected"))
    return result


def test_a_push_to_simple_whip_server_reaches_janus_and_survives_the_server_restarting() -> None:
    result = probe()
    assert result["create_status"] == 200 and result["push_post_status"] == 201
    assert result["push_connect_s"] <= CONNECT_LIMIT_S
    assert result["endpoint_enabled"], "the server saw no session for the push"

    # The room's subscriber watches the push's publisher: 30 fps video, decoded.
    first = result["first_watch"]
    assert first["display"] == "sidecar push"
    assert first["frames_decoded"] >= SECONDS * 15, first
    session = result["push_after_watch"]["session"]
    assert {t["kind"] for t in session["tracks"]} == {"audio", "video"}
    for track in session["tracks"]:
        assert track["packets_sent"] > 0 and track["send_errors"] == 0, track
        # The status says whether the far end took abs-capture-time; Janus offers its
        # subscribers the extensions it handles, so the two agree.
        assert track["abs_capture_time"] == (ABS_CAPTURE_TIME in first["extensions"]), track
    assert session["clock"] is None  # no sidecar clock to join on this server

    # The server is killed: the push sees its session end, retries while the server is away
    # and reconnects once it is back, with nothing done to it from outside.
    assert "retrying" in result["push_states_while_away"], result["push_states_while_away"]
    assert result["recreate_status"] == 200
    assert result["push_reconnect_s"] <= RETRY_MAX_S + CONNECT_LIMIT_S
    back = result["push_reconnected"]
    assert back["attempts"] >= 2 and back["last_error"] is not None, back
    second = result["second_watch"]
    assert second["frames_decoded"] >= SECONDS * 15, second

    # Deleting the push ends its session on the server (its DELETE reached the resource).
    assert result["push_delete_status"] in (200, 204)
    assert result["endpoint_released_s"] <= 2.0
