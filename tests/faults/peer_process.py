"""A real aiortc publisher or viewer in its own process, so a test can SIGKILL or SIGSTOP it.

``python -m tests.faults.peer_process publish BASE STREAM``
``python -m tests.faults.peer_process view BASE STREAM [--sync [--reliable]]``

It prints one JSON line when its peer connection is up (``{"event": "connected", ...}``) and
then one a second with what it has sent or received, and runs until it is killed. The peers
are the relay tests' own (``tests/relay/peers.py``); only the process boundary is new, because
a peer that dies with its process is the fault under test: no DELETE, no DTLS close alert,
no SCTP ABORT, its sockets simply gone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import aiohttp

from tests.relay.peers import PatternVideo, Peer, ToneAudio, publish, view, wait_for


def say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


async def run(role: str, base: str, stream: str, sync: bool, reliable: bool) -> None:
    async with aiohttp.ClientSession() as http:
        peer: Peer
        if role == "publish":
            peer = await publish(http, base, stream, video=PatternVideo(fps=30),
                                 audio=ToneAudio())
        else:
            peer = await view(http, base, stream, data_channel="sync" if sync else False,
                              decode=False, reliable=reliable)
        await wait_for(lambda: peer.pc.connectionState == "connected", 20, "connected")
        say(event="connected", location=peer.location)
        while True:
            await asyncio.sleep(1.0)
            say(event="stats", sent=len(peer.sent), received=len(peer.received))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("publish", "view"))
    parser.add_argument("base")
    parser.add_argument("stream")
    parser.add_argument("--sync", action="store_true", help="offer the sync DataChannel")
    parser.add_argument("--reliable", action="store_true",
                        help="open the sync channel ordered and reliable")
    args = parser.parse_args()
    asyncio.run(run(args.role, args.base, args.stream, args.sync, args.reliable))


if __name__ == "__main__":
    main()
