"""The session state table: every session moves only as it allows, and ends once."""

from __future__ import annotations

import pytest

from sfu_sidecar.relay.sessionstate import TRANSITIONS, Lifecycle, SessionState, peer_state

S = SessionState


def test_a_peer_connects_drops_and_comes_back() -> None:
    life = Lifecycle()
    assert (life.state, life.connected_once) == (S.NEW, False)
    for state in (S.CONNECTING, S.CONNECTED, S.DISCONNECTED, S.CONNECTED):
        assert life.move(state), state
    assert life.connected_once and life.state is S.CONNECTED
    assert not life.move(S.CONNECTED)  # staying put is no move


def test_a_tap_goes_from_waiting_straight_to_receiving() -> None:
    life = Lifecycle()
    assert life.move(S.CONNECTED) and life.connected_once


def test_nothing_leaves_closed_and_the_first_reason_stays() -> None:
    life = Lifecycle()
    life.move(S.CONNECTING)
    assert life.end("connect_timeout") and life.closed.is_set()
    assert not life.end("deleted")
    assert life.ended_reason == "connect_timeout"
    for state in S:
        assert not life.move(state)  # a late aiortc event cannot revive it
    assert life.state is S.CLOSED and not life.connected_once


def test_closing_goes_through_end_only() -> None:
    life = Lifecycle()
    assert not life.move(S.CLOSED) and not life.closed.is_set()


@pytest.mark.parametrize("start", list(S))
def test_every_state_can_end_but_closed(start: SessionState) -> None:
    assert (S.CLOSED in TRANSITIONS[start]) == (start is not S.CLOSED)


def test_peer_connection_states() -> None:
    assert [peer_state(s) for s in ("new", "connecting", "connected", "disconnected")] == [
        S.NEW, S.CONNECTING, S.CONNECTED, S.DISCONNECTED]
    assert peer_state("failed") is None and peer_state("closed") is None
