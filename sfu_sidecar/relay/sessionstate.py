"""The one state every relay session is in, and the moves allowed between states (pure).

Every kind of session (WHIP and WHEP peers, taps, feeds, pulls, pushes) has the same states:

* ``new``: made, negotiating or waiting for its first packet (a tap waiting for its sender);
* ``connecting``: its transport is being set up (ICE and DTLS for a peer);
* ``connected``: media can flow (a tap has media, a feed sends);
* ``disconnected``: a peer's transport is interrupted and may come back (aiortc's state);
* ``closed``: ended, for the reason in ``ended_reason``; nothing leaves this state.

A transport's failure is no state of its own: the session closes with the reason
``disconnected``. A move the table does not allow (an aiortc event after the session ended) is
refused and changes nothing, so a late callback can never revive a closed session.
"""

from __future__ import annotations

import asyncio
from enum import StrEnum


class SessionState(StrEnum):
    NEW = "new"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    DISCONNECTED = "disconnected"
    CLOSED = "closed"


S = SessionState
TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    S.NEW: frozenset({S.CONNECTING, S.CONNECTED, S.CLOSED}),
    S.CONNECTING: frozenset({S.CONNECTED, S.DISCONNECTED, S.CLOSED}),
    S.CONNECTED: frozenset({S.DISCONNECTED, S.CLOSED}),
    S.DISCONNECTED: frozenset({S.CONNECTING, S.CONNECTED, S.CLOSED}),
    S.CLOSED: frozenset(),
}


class Lifecycle:
    """One session's state, whether it ever connected, and why it ended."""

    __slots__ = ("closed", "connected_once", "ended_reason", "state")

    def __init__(self) -> None:
        self.state = SessionState.NEW
        self.connected_once = False
        self.ended_reason: str | None = None
        # Set on the move to CLOSED, for those who wait for the end.
        self.closed = asyncio.Event()

    def move(self, to: SessionState) -> bool:
        """Go to ``to`` if the table allows it (staying put is no move); whether it moved."""
        if to is self.state or to is SessionState.CLOSED or to not in TRANSITIONS[self.state]:
            return False
        self.state = to
        if to is SessionState.CONNECTED:
            self.connected_once = True
        return True

    def end(self, reason: str) -> bool:
        """Close for ``reason``; False when the session had already ended (the first reason
        stays)."""
        if self.state is SessionState.CLOSED:
            return False
        self.state = SessionState.CLOSED
        self.ended_reason = reason
        self.closed.set()
        return True


def peer_state(connection_state: str) -> SessionState | None:
    """A peer connection's state (W3C ``RTCPeerConnectionState``, as aiortc reports it) as a
    session's; None for ``failed`` and ``closed``, where the session ends."""
    if connection_state in ("failed", "closed"):
        return None
    return SessionState(connection_state)
